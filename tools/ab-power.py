#!/usr/bin/env python3
"""The GPU's clock and power during tools/gpu-ab.sh bench runs, side against side.

    python3 tools/ab-power.py [DIR]

Reads DIR/power.csv (nvidia-smi every 100 ms: timestamp, SM clock in MHz,
power in W, the clock event reasons as a bit mask) and DIR/marks.txt (each
bench's start and end: timestamp, "start" or "end", shape, side, round), both
unpacked from ab-bench.tgz. For each shape and side it prints, over the
rounds, the median of each run's busiest stretch: the 90th percentile of its
power samples, the 10th percentile of its SM clock, and the share of its
samples in which the driver held the clock back for power (the software
power cap, bit 0x4, or the hardware power brake, 0x80). A run also loads its
model, so its quiet samples are left out this way rather than averaged in.
Why: a kernel that finishes sooner under a power cap may only move the
watts to the kernels beside it, and the step's time barely changes.
"""
import collections
import datetime
import os
import statistics
import sys

POWER_BITS = 0x4 | 0x80


def stamp(text):
    """Seconds of a 'YYYY/MM/DD HH:MM:SS[.fraction]' timestamp."""
    day, _, frac = text.strip().partition(".")
    t = datetime.datetime.strptime(day, "%Y/%m/%d %H:%M:%S").timestamp()
    return t + (float("0." + frac) if frac else 0.0)


def pct(values, p):
    """The p-th percentile of values (nearest rank)."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def main():
    folder = sys.argv[1] if len(sys.argv) > 1 else "."
    samples = []
    with open(os.path.join(folder, "power.csv"), encoding="utf-8") as f:
        for line in f:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) != 4:
                continue
            try:
                samples.append((stamp(parts[0]), float(parts[1]), float(parts[2]),
                                int(parts[3], 16)))
            except ValueError:
                continue
    runs = {}
    with open(os.path.join(folder, "marks.txt"), encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if len(parts) != 6:
                continue
            key = tuple(parts[3:6])  # shape, side, round
            runs.setdefault(key, [None, None])[parts[2] == "end"] = stamp(
                parts[0] + " " + parts[1])
    # (shape, side) -> [(p90 W, p10 MHz, power-capped share)] a round
    table = collections.defaultdict(list)
    for (shape, side, _), (t0, t1) in sorted(runs.items()):
        if t0 is None or t1 is None:
            continue
        inside = [s for s in samples if t0 <= s[0] <= t1]
        if len(inside) < 3:
            continue
        capped = sum(1 for s in inside if s[3] & POWER_BITS) / len(inside)
        table[(shape, side)].append((pct([s[2] for s in inside], 90),
                                     pct([s[1] for s in inside], 10), capped))
    if not table:
        print(f"ab-power: no bench run with samples in {folder}")
        return 1
    for (shape, side), rows in sorted(table.items()):
        print(f"{shape:12s} side {side:3s} ({len(rows)} runs): "
              f"power p90 {statistics.median(r[0] for r in rows):6.1f} W, "
              f"SM clock p10 {statistics.median(r[1] for r in rows):6.0f} MHz, "
              f"power-capped {100 * statistics.median(r[2] for r in rows):5.1f} % of samples")
    return 0


if __name__ == "__main__":
    sys.exit(main())
