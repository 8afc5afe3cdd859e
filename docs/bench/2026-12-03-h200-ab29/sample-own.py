#!/usr/bin/env python3
"""sample-own.py: a decode step's sampling kernel in CUPTI traces of
tools/gpu-ab.sh's trace phase (ab-trace-SHAPE-SIDE.csv): for the steps
of 100 to 200 kernels (Qwen3-0.6B's batch-1 decode steps), by sampling
kernel and grid, the medians of the step's period, the kernel's duration,
its own time (from the later of its start and the end of the record
before it) and its start less the end of that record (below 0: placed
under PDL before the kernel before it ended), leaving out 3 steps at
each end.

    python3 sample-own.py ab-trace-qwen3-0.6b-0.csv ...
"""
import os
import statistics as S
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../dev/prof"))
import kernel_trace as kt  # noqa: E402

for path in sys.argv[1:]:
    gpu, api = kt.read(path)
    steps = kt.split_steps(gpu)
    by = {}
    for i, st in enumerate(steps[:-1]):
        ks = [r for r in st if r[2] == "k"]
        samp = [r for r in ks if any(k in r[3] for k in kt.SAMPLING_KERNELS)]
        if not samp or not 100 <= len(ks) <= 200:
            continue
        s = samp[-1]
        prev = max(r[1] for r in st if r is not s and r[0] <= s[0])
        period = steps[i + 1][0][0] - st[0][0]
        by.setdefault((kt.short(s[3], 24), s[4]), []).append(
            (period / 1e3, (s[1] - s[0]) / 1e3, (s[1] - max(s[0], prev)) / 1e3,
             (s[0] - prev) / 1e3))
    for (name, grid), v in sorted(by.items()):
        v = v[3:-3]
        med = [S.median(x[j] for x in v) for j in range(4)]
        print("%s %s grid %d: %d steps, period %.1f us, kernel %.1f, own %.1f, start - end before %.1f"
              % (os.path.basename(path), name, grid, len(v), *med))
