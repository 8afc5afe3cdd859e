"""Sum kernel times per kernel name from `ncu --csv --page raw --metrics
gpu__time_duration.sum` output (stdin): where a decode step's time goes.
Run the engine with cuda_graphs = false so that each kernel is seen alone:

  ncu --clock-control none --metrics gpu__time_duration.sum --csv --page raw \
      --launch-skip 3000 --launch-count 1500 atlas bench ... | python3 kernel_times.py
"""
import csv
import sys
from collections import defaultdict

rows = [r for r in csv.reader(l for l in sys.stdin if l.startswith('"'))]
head, units, data = rows[0], rows[1], rows[2:]
name_i, time_i = head.index("Kernel Name"), head.index("gpu__time_duration.sum")
scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}[units[time_i]]
total, count = defaultdict(float), defaultdict(int)
for r in data:
    name = r[name_i].split("(")[0].split("<")[0][:60]
    total[name] += float(r[time_i].replace(",", "")) * scale
    count[name] += 1
# One sampling launch per engine step: per-step figures divide by their count.
steps = float(sum(c for n, c in count.items() if n.startswith("sample_kernel")) or 1)
print(f"{steps:.0f} steps")
print(f"{'kernel':60s} {'calls':>6s} {'us/step':>9s}")
for name in sorted(total, key=total.get, reverse=True):
    print(f"{name:60s} {count[name]:6d} {total[name] / steps:9.1f}")
print(f"{'all kernels':60s} {sum(count.values()):6d} {sum(total.values()) / steps:9.1f}")
