#!/usr/bin/env python3
"""The decode rows of tools/gpu-ab.sh bench CSVs, side against side.

    python3 tools/ab-medians.py [DIR] [PREFIX]

Reads DIR/PREFIX-SHAPE-SIDE-ROUND.csv (PREFIX "ab" by default: what gpu-ab.sh
writes) and prints, for each shape and batch, the median tokens/s of side 0
and of every other side over the rounds (with their count, min and max) and
the change of each median against side 0's.
"""
import collections
import csv
import glob
import os
import statistics
import sys


def main():
    folder = sys.argv[1] if len(sys.argv) > 1 else "."
    prefix = sys.argv[2] if len(sys.argv) > 2 else "ab"
    rows = collections.defaultdict(list)
    for path in sorted(glob.glob(os.path.join(folder, prefix + "-*.csv"))):
        shape, side, _round = os.path.basename(path)[len(prefix) + 1:-4].rsplit("-", 2)
        with open(path, encoding="utf-8") as f:
            for row in csv.DictReader(f):
                if row.get("test") == "decode" and row.get("tokens_per_s"):
                    rows[(shape, int(row["batch"]), side)].append(float(row["tokens_per_s"]))
    if not rows:
        print(f"ab-medians: no {prefix}-*.csv decode rows in {folder}")
        return 1
    sides = sorted({s for _, _, s in rows} - {"0"})
    for shape, batch in sorted({(s, b) for s, b, _ in rows}):
        a = rows.get((shape, batch, "0"), [])
        if not a:
            continue
        ma = statistics.median(a)
        line = f"{shape:12s} b{batch:<3d} side 0 {ma:9.1f} ({len(a)}: {min(a):.1f}-{max(a):.1f})"
        for side in sides:
            b = rows.get((shape, batch, side), [])
            if b:
                mb = statistics.median(b)
                line += (f"  side {side} {mb:9.1f} ({min(b):.1f}-{max(b):.1f})"
                         f" {100 * (mb / ma - 1):+.1f}%")
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
