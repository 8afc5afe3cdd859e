#!/usr/bin/env python3
"""The rows of tools/gpu-ab.sh bench CSVs, side against side.

    python3 tools/ab-medians.py [DIR] [PREFIX] [COLUMN]

Reads DIR/PREFIX-SHAPE-SIDE-ROUND.csv (PREFIX "ab" by default: what gpu-ab.sh
writes) and prints, for each shape and row (decode by batch, "b8"; prefill by
prompt length, "p8192"), the median tokens/s of side 0 and of every other side
over the rounds (with their count, min and max), the change of each median
against side 0's, and the median of the per-round ratios (each side against
side 0 in the same round: interleaved rounds share the machine's drift) with
the middle half of them. COLUMN (tokens_per_s by default) picks another of
the CSVs' columns, such as joules_per_token or percent_power_capped (the GPU's
counters, where atlas bench has them).
"""
import collections
import csv
import glob
import os
import statistics
import sys


def quartiles(v):
    """The median and the middle half of v (sorted copies, no interpolation)."""
    s = sorted(v)
    n = len(s)
    return statistics.median(s), s[n // 4], s[(3 * n - 1) // 4]


def num(v, width=0):
    """v with one decimal, or 4 significant digits below 100 (joules a token)."""
    return f"{v:{width}.1f}" if abs(v) >= 100 else f"{v:{width}.4g}"


def main():
    folder = sys.argv[1] if len(sys.argv) > 1 else "."
    prefix = sys.argv[2] if len(sys.argv) > 2 else "ab"
    column = sys.argv[3] if len(sys.argv) > 3 else "tokens_per_s"
    # (shape, row, side) -> {round: tokens/s}
    rows = collections.defaultdict(dict)
    for path in sorted(glob.glob(os.path.join(folder, prefix + "-*.csv"))):
        shape, side, rnd = os.path.basename(path)[len(prefix) + 1:-4].rsplit("-", 2)
        with open(path, encoding="utf-8") as f:
            for row in csv.DictReader(f):
                if not row.get(column):
                    continue
                if row.get("test") == "decode" and row.get("context") == "32":
                    key = (0, int(row["batch"]))
                elif row.get("test") == "prefill":
                    key = (1, int(row["tokens"]))
                else:
                    continue
                rows[(shape, key, side)][rnd] = float(row[column])
    if not rows:
        print(f"ab-medians: no {prefix}-*.csv rows with {column} in {folder}")
        return 1
    sides = sorted({s for _, _, s in rows} - {"0"})
    for shape, key in sorted({(s, k) for s, k, _ in rows}):
        a = rows.get((shape, key, "0"), {})
        if not a:
            continue
        name = ("b" if key[0] == 0 else "p") + str(key[1])
        ma = statistics.median(a.values())
        line = (f"{shape:12s} {name:6s} side 0 {num(ma, 9)}"
                f" ({len(a)}: {num(min(a.values()))}-{num(max(a.values()))})")
        for side in sides:
            b = rows.get((shape, key, side), {})
            if not b:
                continue
            mb = statistics.median(b.values())
            line += (f"  side {side} {num(mb, 9)} ({num(min(b.values()))}-"
                     f"{num(max(b.values()))}) {100 * (mb / ma - 1):+.1f}%")
            paired = [b[r] / a[r] - 1 for r in b if r in a]
            if paired:
                m, lo, hi = quartiles(paired)
                line += f" [per round {100 * m:+.1f}%, {100 * lo:+.1f}..{100 * hi:+.1f}]"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
