#!/usr/bin/env python3
"""Tokens/s against batch size, from the CSVs of `atlas bench --csv-out` and
tools/peer/bench-transformers.py: one line a CSV (its decode rows at one
context), and dashed the bound of each CSV that has one (atlas bench's
bound_tokens_per_s). Both axes are logarithmic, so that batch 1 and batch
128 read alike. A label may hold '=': the last one ends it.

    python3 tools/plot-bench.py --title "qwen3-8b, H100" --out docs/qwen3-8b.png \\
        atlas=bench-qwen3-8b.csv transformers=peer-qwen3-8b.csv

Needs matplotlib (Debian: python3-matplotlib, for /usr/bin/python3); it
runs wherever the CSVs are, not on the GPU machine.
"""
import argparse
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def decode_rows(path, context):
    """{batch: (tokens/s, bound tokens/s or None)} of the decode rows at
    context (the smallest in the file when None)."""
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["test"] == "decode"]
    if not rows:
        raise ValueError(f"{path}: no decode rows")
    ctx = context if context is not None else min(int(r["context"]) for r in rows)
    out = {}
    for r in rows:
        if int(r["context"]) != ctx:
            continue
        bound = r.get("bound_tokens_per_s") or ""
        out[int(r["batch"])] = (float(r["tokens_per_s"]), float(bound) if bound else None)
    if not out:
        raise ValueError(f"{path}: no decode rows at context {ctx}")
    return ctx, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("series", nargs="+", metavar="LABEL=CSV")
    ap.add_argument("--context", type=int, help="the decode rows' context (default: the "
                    "smallest in each file)")
    ap.add_argument("--title", default="")
    ap.add_argument("--out", required=True, help="the image (PNG, or SVG by its name)")
    args = ap.parse_args()

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    contexts, all_batches = set(), set()
    for i, spec in enumerate(args.series):
        label, sep, path = spec.rpartition("=")
        if not sep:
            ap.error(f"{spec}: expected LABEL=CSV")
        try:
            ctx, rows = decode_rows(path, args.context)
        except (OSError, ValueError, KeyError) as e:
            print(f"plot-bench: {e}", file=sys.stderr)
            return 1
        contexts.add(ctx)
        batches = sorted(rows)
        all_batches.update(batches)
        color = f"C{i}"
        ax.plot(batches, [rows[b][0] for b in batches], marker="o", color=color, label=label)
        bound = [(b, rows[b][1]) for b in batches if rows[b][1]]
        if bound:
            ax.plot([b for b, _ in bound], [v for _, v in bound], linestyle="--",
                    color=color, alpha=0.6, label=f"{label}: bound")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(all_batches))
    ax.set_xticklabels([str(b) for b in sorted(all_batches)])
    ax.minorticks_off()
    ax.set_yscale("log")
    ax.set_xlabel("batch (sequences decoding together)")
    ax.set_ylabel("tokens/s")
    ctx_text = ", ".join(str(c) for c in sorted(contexts))
    ax.set_title(f"{args.title} (decode, context {ctx_text})" if args.title
                 else f"decode, context {ctx_text}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
