#!/usr/bin/env python3
"""Compare atlas with the transformers goldens of tests/fidelity/models on any
backend, through the atlas tool (what tests/model/test_fidelity.c does for the
cpu backend in-process):

    python3 tools/ref/compare_logits.py --atlas build/tools/atlas --backend cuda

For every model and sequence: max |atlas - transformers| over all logits
(against the float32 upcast for bf16/f16 models), whether the argmax agrees
where transformers' top-2 gap exceeds the difference, and the greedy
continuations token by token. Prints a table; exits 1 if a model fails the
given --tol on logits or its greedy tokens differ where transformers' own
top-2 gap exceeds 2 * tol.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

import numpy as np


def atlas(args, *cmd):
    out = subprocess.run([args.atlas, *cmd, "-o", "backend=" + args.backend,
                          "-o", "log_level=warn", "-o", "kv_memory=64M"],
                         check=True, capture_output=True, text=True)
    return out.stdout


def check_model(args, mdir):
    ref = json.load(open(os.path.join(mdir, "ref", "ref.json")))
    conf = json.load(open(os.path.join(mdir, "config.json")))
    moe = bool(conf.get("num_experts") or conf.get("num_local_experts"))
    tol = args.moe_tol if moe and args.moe_tol is not None else args.tol
    vocab = ref["vocab_size"]
    worst, argmax_bad, ok = 0.0, 0, True
    with tempfile.TemporaryDirectory() as tmp:
        for seq in ref["sequences"]:
            name = seq["logits"].replace(".f32", ".upcast.f32")
            path = os.path.join(mdir, "ref", name)
            if not os.path.exists(path):
                path = os.path.join(mdir, "ref", seq["logits"])
            want = np.fromfile(path, dtype="<f4").reshape(len(seq["ids"]), vocab)
            out = os.path.join(tmp, "l.f32")
            atlas(args, "logits", "--model", mdir, "--tokens",
                  ",".join(map(str, seq["ids"])), "--out", out)
            got = np.fromfile(out, dtype="<f4").reshape(len(seq["ids"]), vocab)
            diff = float(np.abs(got - want).max())
            worst = max(worst, diff)
            top2 = np.sort(want, axis=1)[:, -2:]
            clear = (top2[:, 1] - top2[:, 0]) > 2 * diff
            argmax_bad += int((got.argmax(1) != want.argmax(1))[clear].sum())
    greedy_note = []
    for g in ref["greedy"]:
        ids = atlas(args, "generate", "--model", mdir, "--mode", "raw", "--temperature", "0",
                    "--max-tokens", str(len(g["tokens"])), "--tokens",
                    ",".join(map(str, g["prompt"])), "--ids").split()
        ids = [int(x) for x in ids]
        same = 0
        while same < min(len(ids), len(g["tokens"])) and ids[same] == g["tokens"][same]:
            same += 1
        if same < len(g["tokens"]):
            gap = g["gaps"][same] if same < len(g.get("gaps", [])) else float("inf")
            greedy_note.append("%d/%d (gap %.3g)" % (same, len(g["tokens"]), gap))
            ok &= gap <= 2 * tol
        else:
            greedy_note.append("%d/%d" % (same, len(g["tokens"])))
    ok &= worst <= tol and argmax_bad == 0
    print("%-28s %-9s max-abs %.3g  argmax-mismatch %d  greedy %s  %s" % (
        os.path.basename(mdir), ref["dtype"], worst, argmax_bad, ", ".join(greedy_note),
        "ok" if ok else "FAIL"))
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--atlas", required=True)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--models", default=os.path.join(os.path.dirname(__file__), "..", "..",
                                                     "tests", "fidelity", "models"))
    ap.add_argument("--tol", type=float, default=1e-3)
    ap.add_argument("--moe-tol", type=float, default=None,
                    help="the tolerance of models with experts (default --tol): where a "
                    "token's k-th and (k+1)-th experts nearly tie, low-precision "
                    "arithmetic may route it otherwise")
    args = ap.parse_args()
    dirs = sorted(d for d in glob.glob(os.path.join(args.models, "*"))
                  if os.path.exists(os.path.join(d, "ref", "ref.json")))
    results = [check_model(args, d) for d in dirs]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
