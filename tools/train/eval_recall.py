#!/usr/bin/env python3
"""Key-value recall of a model: the needle (one of 4 facts "The code for
<word> is <number>.") at the start, middle or end of held-out text of 1K, 4K,
8K, 16K and 32K tokens (--lengths), then "Question: What is the code for <word>?\\nAnswer: The code
for <word> is"; a trial passes when the greedy continuation's first number is
the needle's.

    # where `tokenizers` is (builds the prompts from the held-out split)
    python3 tools/train/eval_recall.py make --model DIR --data .train-data \\
        --trials 20 --out prompts.jsonl.xz
    # through atlas itself (standard library only)
    python3 tools/train/eval_recall.py atlas --atlas build/tools/atlas --model DIR \\
        --prompts prompts.jsonl.xz --out recall.json [-o backend=cuda ...]
    # through the PyTorch model, as a quick check on the GPU machine
    python3 tools/train/eval_recall.py torch --model DIR --prompts prompts.jsonl.xz

Prints the table (accuracy per length and depth) and writes every trial to --out.
"""
import argparse
import json
import lzma
import os
import re
import subprocess
import sys
import time

LENGTHS = (1024, 4096, 8192, 16384, 32768)
DEPTHS = {"start": 0.0, "middle": 0.5, "end": 1.0}


def make(args):
    import numpy as np
    from tokenizers import Tokenizer
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import data as datamod
    tk = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    with lzma.open(os.path.join(args.data, "val.txt.xz"), "rb") as f:
        docs = f.read().decode().split(datamod.DOC_SEP)
    with lzma.open(os.path.join(args.data, "train.txt.xz"), "rb") as f:
        train_docs = f.read().decode().split(datamod.DOC_SEP)
    # The keys come from the first corpus version's training documents: the
    # train-only sources added later (make_data.py's EXTRA_*) follow them, so
    # every corpus version gives the same prompts.
    with open(os.path.join(args.data, "manifest.json")) as f:
        extra = sum(s["documents"] for s in json.load(f)["sources"] if s.get("train_only"))
    words = datamod.key_words(train_docs[:len(train_docs) - extra][::20])
    eot = tk.token_to_id("<|endoftext|>")
    stream = np.concatenate([np.array(e.ids + [eot], dtype=np.uint16)
                             for e in tk.encode_batch(docs)])
    with lzma.open(args.out, "wt") as f:
        for n in args.lengths:
            for depth, d in DEPTHS.items():
                for trial in range(args.trials):
                    seed = n * 1000 + int(d * 10) * 100 + trial
                    text, value = datamod.kv_prompt(tk, stream, words, seed, n - 16, d)
                    f.write(json.dumps({"length": n, "depth": depth, "trial": trial,
                                        "tokens": len(tk.encode(text).ids), "prompt": text,
                                        "value": value}) + "\n")


def load_prompts(path):
    with lzma.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def first_number(text):
    m = re.search(r"\d+", text)
    return m.group(0) if m else ""


def table(results):
    lines = ["| context | " + " | ".join(DEPTHS) + " | all |",
             "|---|" + "---|" * (len(DEPTHS) + 1)]
    for n in sorted({r["length"] for r in results}):
        cells, tot, ok = [], 0, 0
        for depth in DEPTHS:
            rs = [r for r in results if r["length"] == n and r["depth"] == depth]
            good = sum(r["correct"] for r in rs)
            cells.append(f"{good}/{len(rs)}")
            tot, ok = tot + len(rs), ok + good
        lines.append(f"| {n} | " + " | ".join(cells) + f" | {ok / max(1, tot):.0%} |")
    return "\n".join(lines)


def run_atlas(args):
    prompts = [p for p in load_prompts(args.prompts)
               if (not args.max_length or p["length"] <= args.max_length)
               and (not args.min_length or p["length"] >= args.min_length)
               and p["trial"] < args.trials]
    results = []
    opts = [x for o in args.o for x in ("-o", o)]
    for p in prompts:
        t0 = time.time()
        r = subprocess.run([args.atlas, "generate", "--model", args.model, "--mode", "raw",
                            "--temperature", "0", "--max-tokens", "8",
                            "-o", f"threads={args.threads}", "-o", "log_level=warn"] + opts,
                           input=p["prompt"].encode(), capture_output=True, timeout=600)
        out = r.stdout.decode("utf-8", "replace")
        if r.returncode != 0:
            sys.exit(f"atlas failed: {r.stderr.decode()}")
        results.append({k: p[k] for k in ("length", "depth", "trial", "tokens", "value")} |
                       {"output": out, "correct": first_number(out) == p["value"],
                        "seconds": round(time.time() - t0, 2)})
        print(json.dumps(results[-1]), flush=True)
    backend = next((o.split("=", 1)[1] for o in args.o if o.startswith("backend=")), "cpu")
    finish(args, results, f"atlas ({backend} backend, greedy, raw mode)")


def run_torch(args):
    import torch
    from tokenizers import Tokenizer
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import check_hf
    tk = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    model = check_hf.load_ours(args.model).to(dev)
    results = []
    for p in load_prompts(args.prompts):
        if args.max_length and p["length"] > args.max_length:
            continue
        ids = torch.tensor([tk.encode(p["prompt"]).ids], device=dev)
        with torch.no_grad():
            for _ in range(8):
                nxt = model(ids)[0, -1].argmax()
                ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
        out = tk.decode(ids[0, -8:].tolist())
        results.append({k: p[k] for k in ("length", "depth", "trial", "tokens", "value")} |
                       {"output": out, "correct": first_number(out) == p["value"]})
    finish(args, results, "PyTorch (tools/train model, float32)")


def finish(args, results, how):
    print(f"key-value recall, {how}:\n" + table(results))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"how": how, "table": table(results), "trials": results}, f, indent=1)
            f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--model", required=True)
    m.add_argument("--data", required=True)
    m.add_argument("--trials", type=int, default=20)
    m.add_argument("--out", required=True)
    m.add_argument("--lengths", type=lambda v: [int(x) for x in v.split(",")],
                   default=list(LENGTHS))
    a = sub.add_parser("atlas")
    a.add_argument("--atlas", required=True)
    a.add_argument("--model", required=True)
    a.add_argument("--prompts", required=True)
    a.add_argument("--threads", type=int, default=2)
    a.add_argument("-o", action="append", default=[], metavar="KEY=VALUE",
                   help="a config key for atlas (repeatable)")
    a.add_argument("--max-length", type=int, default=0, help="skip longer prompts")
    a.add_argument("--min-length", type=int, default=0, help="skip shorter prompts")
    a.add_argument("--trials", type=int, default=1000,
                   help="run the first N trials of each length and depth")
    a.add_argument("--out")
    t = sub.add_parser("torch")
    t.add_argument("--model", required=True)
    t.add_argument("--prompts", required=True)
    t.add_argument("--out")
    t.add_argument("--max-length", type=int, default=0, help="skip longer prompts")
    args = ap.parse_args()
    {"make": make, "atlas": run_atlas, "torch": run_torch}[args.cmd](args)


if __name__ == "__main__":
    main()
