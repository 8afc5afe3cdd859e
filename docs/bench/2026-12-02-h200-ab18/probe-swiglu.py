#!/usr/bin/env python3
"""o_proj -> normed swiglu -> down at 0.6b b1, from BULK and SWIG stamp lines (one file a process).
Times in us. usage: probe-sw.py FILE..."""
import re, sys, statistics as st
rows = {k: [] for k in ('sw_first_start-op_wait', 'sw_last_start-op_done', 'sw_wait-op_done',
                        'sw_done-sw_wait', 'dn_wait-sw_done', 'dn_done-dn_wait', 'op_done-op_wait',
                        'step_op_wait_to_dn_done')}
for path in sys.argv[1:]:
    ev = []
    for line in open(path):
        m = re.match(r'(BULK|SWIG) l=\d+ K=(\d+)', line)
        if not m:
            continue
        f = dict((n, (int(a), int(b))) for n, a, b in re.findall(r'(start|init|wait|w0|done) (\d+) (\d+)', line.split('|')[0]))
        kind = 'sw' if m.group(1) == 'SWIG' else ('op' if m.group(2) == '2048' else 'dn' if m.group(2) == '3072' else None)
        if kind:
            ev.append((f['wait'][0], kind, f))
    ev.sort(key=lambda e: e[0])
    for i in range(1, len(ev) - 1):
        if ev[i][1] != 'sw' or ev[i - 1][1] != 'op' or ev[i + 1][1] != 'dn':
            continue
        op, sw, dn = ev[i - 1][2], ev[i][2], ev[i + 1][2]
        d = lambda a, b: (a - b) / 1e3
        rows['sw_first_start-op_wait'].append(d(sw['start'][0], op['wait'][0]))
        rows['sw_last_start-op_done'].append(d(sw['start'][1], op['done'][1]))
        rows['sw_wait-op_done'].append(d(sw['wait'][0], op['done'][1]))
        rows['sw_done-sw_wait'].append(d(sw['done'][1], sw['wait'][0]))
        rows['dn_wait-sw_done'].append(d(dn['wait'][0], sw['done'][1]))
        rows['dn_done-dn_wait'].append(d(dn['done'][1], dn['wait'][0]))
        rows['op_done-op_wait'].append(d(op['done'][1], op['wait'][0]))
        rows['step_op_wait_to_dn_done'].append(d(dn['done'][1], op['wait'][0]))
for k, v in rows.items():
    if len(v) > 1:
        q = st.quantiles(v, n=10)
        print(f'{k:26s} n={len(v):4d} median {st.median(v):7.2f}  p10 {q[0]:7.2f}  p90 {q[8]:7.2f}')
