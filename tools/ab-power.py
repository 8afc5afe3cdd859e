#!/usr/bin/env python3
"""The GPU's clock and power during tools/gpu-ab.sh bench runs, side against side.

    python3 tools/ab-power.py [DIR]

Reads DIR/power.csv (nvidia-smi every 100 ms: timestamp, SM clock in MHz,
power in W, the clock event reasons as a bit mask) and DIR/marks.txt (each
bench's start and end: timestamp, "start" or "end", shape, side, round), both
unpacked from ab-bench.tgz. A run spends most of its time making its model
at the GPU's idle power; its prefills and decode steps are the last second
or two. So each run counts only its busy samples, those whose power is at
least halfway from the run's least to its most, and for each shape and side
the script prints the medians over the rounds of: the busy samples' count,
their mean power and mean SM clock, their least clock, and the share of
them in which the driver held the clock back for power (the software power
cap, bit 0x4, or the hardware power brake, 0x80). Where the driver lacks
power.draw.instant, the power is power.draw, an average over about a
second: the first busy samples of a run understate it, and the first
samples of a run after a busier one overstate it.
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
    # (shape, side) -> [(busy samples, mean W, mean MHz, least MHz, power-capped share)]
    table = collections.defaultdict(list)
    for (shape, side, _), (t0, t1) in sorted(runs.items()):
        if t0 is None or t1 is None:
            continue
        inside = [s for s in samples if t0 <= s[0] <= t1]
        if len(inside) < 3:
            continue
        least, most = min(s[2] for s in inside), max(s[2] for s in inside)
        busy = [s for s in inside if s[2] >= (least + most) / 2]
        capped = sum(1 for s in busy if s[3] & POWER_BITS) / len(busy)
        table[(shape, side)].append((len(busy), statistics.mean(s[2] for s in busy),
                                     statistics.mean(s[1] for s in busy),
                                     min(s[1] for s in busy), capped))
    if not table:
        print(f"ab-power: no bench run with samples in {folder}")
        return 1
    for (shape, side), rows in sorted(table.items()):
        print(f"{shape:12s} side {side:3s} ({len(rows)} runs): "
              f"{statistics.median(r[0] for r in rows):3.0f} busy samples, "
              f"power {statistics.median(r[1] for r in rows):5.1f} W, "
              f"SM clock {statistics.median(r[2] for r in rows):5.0f} MHz "
              f"(least {statistics.median(r[3] for r in rows):5.0f}), "
              f"power-capped {100 * statistics.median(r[4] for r in rows):5.1f} % of them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
