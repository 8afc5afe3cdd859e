#!/usr/bin/env python3
"""kernel_trace.py: where a step's time goes, from kernel_trace.so's CSV.

    python3 dev/prof/kernel_trace.py trace.csv [--group N|largest] [--top K]

(A trace of runtime calls alone, KERNEL_TRACE_HOST_ONLY=1, gets their
durations and the host's time between a step's sync and the next launch.)

A step ends with the engine's sampling: the launch of a sampling kernel
(sample_kernel, greedy_kernel or topk_kernel) and any device-to-host
copies right after it (kept logits; until 2026-12-03 the tokens came back
in such a copy too, now the kernel writes them to pinned host memory).
Steps are grouped by how many
kernels they ran (a batch-64 decode step and a prefill chunk differ), and
the largest group is broken down unless --group picks another count
("largest": the steps of the most kernels, such as a prompt's whole
prefill, which ends with the sampling of its first token):

- the period from one step's first GPU record to the next one's (batch /
  period is the decode rate), split into GPU busy (the union of kernels,
  copies and memsets), idle inside the step, and the gap between steps,
  when the GPU waits for the host to finish the step and lay out the next;
- each kernel's time a step (sum of its launches, median over steps), and
  its own time: from the later of its start and the end of the record
  before it to its end. Under programmatic dependent launch a kernel starts
  while the one before runs and waits, so its own time is what it adds;
- the largest idle gaps inside a step, by the kernel before and after;
- the host's CUDA runtime calls over a step (graph launches, uploads, the
  wait for the tokens).

The first and last 3 steps of the group are left out (warm-up, ramp-down).
"""
import argparse
import bisect
import collections
import statistics
import subprocess
import sys

DTOH = 2  # CUPTI_ACTIVITY_MEMCPY_KIND_DTOH


# The kernels that end a step (kernels/cuda/cuda_sample*.cu).
SAMPLING_KERNELS = ("sample_kernel", "greedy_kernel", "topk_kernel")

def demangle(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True,
                             text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return {n: n for n in names}
    return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}


def short(name, width=64):
    """A kernel's name without its parameter list; long templates cut."""
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
            break
    s = name[:cut]
    if s.startswith("void "):
        s = s[5:]
    return s if len(s) <= width else s[:width - 3] + "..."


def read(path):
    gpu, api = [], []
    with open(path) as f:
        next(f)
        for line in f:
            kind, start, end, stream, grid, block, graph, name = line.rstrip("\n").split(",", 7)
            rec = (int(start), int(end), kind, name, int(grid), int(block))
            (api if kind == "a" else gpu).append(rec)
    gpu.sort()
    api.sort()
    return gpu, api


def split_steps(gpu):
    """Lists of records, each ending with a step's sampling kernel and the
    downloads right after it, if any."""
    steps, cur, sampled = [], [], False
    for rec in gpu:
        dtoh = rec[2] == "m" and rec[3] == "copykind%d" % DTOH
        if sampled and not dtoh:
            steps.append(cur)
            cur, sampled = [], False
        cur.append(rec)
        if rec[2] == "k" and any(k in rec[3] for k in SAMPLING_KERNELS):
            sampled = True
    return steps


def union(recs):
    busy, end = 0, None
    for s, e, *_ in sorted(recs):
        if end is None or s > end:
            busy += e - s
            end = e
        elif e > end:
            busy += e - end
            end = e
    return busy


def host_only(api):
    """A trace of runtime calls alone (KERNEL_TRACE_HOST_ONLY=1): each
    call's median duration, and the host's time from a stream sync's
    return to the next graph launch (its work between two steps)."""
    calls = collections.defaultdict(list)
    for s, e, _, name, *_ in api:
        calls[name].append(e - s)
    print("%-40s %8s %10s %10s" % ("runtime call", "count", "median us", "p90 us"))
    for name, v in sorted(calls.items(), key=lambda kv: -sum(kv[1]))[:12]:
        v = sorted(v)
        print("%-40s %8d %10.1f %10.1f" % (name, len(v), v[len(v) // 2] / 1e3, v[len(v) * 9 // 10] / 1e3))
    between, synced = [], None
    for s, e, _, name, *_ in api:
        if name.startswith("cudaStreamSynchronize"):
            synced = e
        elif name.startswith("cudaGraphLaunch") and synced is not None:
            between.append(s - synced)
            synced = None
    if between:
        between.sort()
        print("sync return -> next graph launch: %d times, median %.1f us, p10 %.1f, p90 %.1f" % (
            len(between), between[len(between) // 2] / 1e3, between[len(between) // 10] / 1e3,
            between[len(between) * 9 // 10] / 1e3))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--group", help="kernels a step: the group to break down, or 'largest'")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--gaps", type=int, default=12, help="idle gaps to list")
    a = ap.parse_args()

    gpu, api = read(a.csv)
    if not gpu:
        return host_only(api)
    steps = split_steps(gpu)
    if not steps:
        sys.exit("no step found (no sampling kernel)")
    groups = collections.defaultdict(list)
    for i, st in enumerate(steps):
        groups[sum(r[2] == "k" for r in st)].append(i)
    print("steps by kernel count: " + ", ".join(
        "%d kernels x %d" % (k, len(v)) for k, v in sorted(groups.items(), key=lambda kv: -len(kv[1]))[:8]))
    if a.group is None:
        key = max(groups, key=lambda k: len(groups[k]))
    elif a.group == "largest":
        key = max(groups)
    elif a.group.isdigit():
        key = int(a.group)
    else:
        sys.exit("--group takes a kernel count or 'largest', not %r" % a.group)
    idx = groups.get(key, [])
    idx = [i for i in idx if 0 < i < len(steps) - 1]
    idx = idx[3:-3] if len(idx) > 12 else idx
    if not idx:
        sys.exit("group %d has too few steps" % key)
    names = demangle(sorted({r[3] for i in idx for r in steps[i] if r[2] == "k"}))

    period, busy, inside, between = [], [], [], []
    per_kernel = collections.defaultdict(list)
    per_kernel_excl = collections.defaultdict(list)
    launches = collections.Counter()
    gap_pairs = collections.defaultdict(list)
    for i in idx:
        st, nxt = steps[i], steps[i + 1]
        first, last = st[0][0], max(r[1] for r in st)
        period.append(nxt[0][0] - first)
        b = union(st)
        busy.append(b)
        inside.append(last - first - b)
        between.append(nxt[0][0] - last)
        sums, excl, end = collections.Counter(), collections.Counter(), None
        for s, e, kind, name, *_ in st:
            label = short(names.get(name, name)) if kind == "k" else {"m": "(copy)", "s": "(memset)"}[kind]
            sums[label] += e - s
            excl[label] += max(0, e - max(s, end if end is not None else s))
            end = e if end is None else max(end, e)
            launches[label] += 1
        for label in set(per_kernel) | set(sums):
            per_kernel[label].append(sums.get(label, 0))
            per_kernel_excl[label].append(excl.get(label, 0))
        end, prev = None, None
        for s, e, kind, name, *_ in st:
            label = short(names.get(name, name), 40) if kind == "k" else kind
            if end is not None and s > end:
                gap_pairs[(prev, label)].append(s - end)
            if end is None or e > end:
                end, prev = e, label

    host = collections.defaultdict(list)
    for i in idx:
        lo, hi = max(r[1] for r in steps[i - 1]), max(r[1] for r in steps[i])
        sums = collections.Counter()
        for s, e, _, name, *_ in api[bisect.bisect_left(api, (lo,)):bisect.bisect_left(api, (hi,))]:
            sums[name] += e - s
        for name in set(host) | set(sums):
            host[name].append(sums.get(name, 0))

    n = len(idx)
    med = lambda v: statistics.median(v) / 1e3
    p = med(period)
    print("group: %d kernels a step, %d steps measured (of %d)" % (key, n, len(groups[key])))
    print("period %.1f us: GPU busy %.1f (%.1f %%), idle inside the step %.1f (%.1f %%), "
          "between steps %.1f (%.1f %%)" % (p, med(busy), 100 * med(busy) / p, med(inside),
                                             100 * med(inside) / p, med(between), 100 * med(between) / p))
    print()
    print("%-66s %8s %9s %9s %6s" % ("kernel", "launches", "us/step", "own us", "%"))
    rows = sorted(per_kernel_excl.items(), key=lambda kv: -statistics.median(kv[1]))
    for label, v in rows[:a.top]:
        print("%-66s %8.1f %9.1f %9.1f %6.1f" % (label, launches[label] / n, med(per_kernel[label]),
                                                 med(v), 100 * med(v) / p))
    rest = sum(med(v) for _, v in rows[a.top:])
    if rest:
        print("%-66s %8s %9s %9.1f %6.1f" % ("(the rest)", "", "", rest, 100 * rest / p))
    print()
    print("largest idle gaps inside a step (total us/step, count/step, before -> after):")
    tot = sorted(gap_pairs.items(), key=lambda kv: -sum(kv[1]))
    for (before, after), v in tot[:a.gaps]:
        print("  %8.1f %6.1f  %s -> %s" % (sum(v) / n / 1e3, len(v) / n, before, after))
    print()
    print("host: CUDA runtime calls from the previous step's end to this one's (us/step):")
    for name, v in sorted(host.items(), key=lambda kv: -statistics.median(kv[1]))[:8]:
        print("  %8.1f  %s" % (med(v), name))


if __name__ == "__main__":
    main()
