#!/usr/bin/env python3
"""BULK-only probe stamps (probe2.patch with the DEC window empty): per o_proj (K=2048) and down (K=3072)
launch, the last block's start and the launch's end against its first wait. usage: probe3.py FILE..."""
import re, sys, statistics as st
for K in (2048, 3072):
    late = []; done = []; lateness = []
    for path in sys.argv[1:]:
        for line in open(path):
            if not line.startswith('BULK ') or f' K={K} ' not in line:
                continue
            f = dict((n, (int(a), int(b))) for n, a, b in re.findall(r'(start|init|wait|w0|done) (\d+) (\d+)', line.split('|')[0]))
            w = f['wait'][0]
            if w == 0 or f['start'][0] == 0:
                continue
            late.append((f['start'][1] - w) / 1e3); done.append((f['done'][1] - w) / 1e3)
    if not late:
        continue
    q = lambda a: ' '.join(f'{v:6.2f}' for v in st.quantiles(a, n=10)[::2])
    n_late = sum(1 for v in late if v > -1.2)
    print(f'K={K}: {len(late)} launches; last block start - first wait (us) deciles 10/30/50/70/90: {q(late)}')
    print(f'  done - first wait: {q(done)}; mean {st.mean(done):.2f}')
    print(f'  last block placed later than 1.2 us before the wait: {n_late} of {len(late)}')
    d_l = [d for d, l in zip(done, late) if l > -1.2]; d_e = [d for d, l in zip(done, late) if l <= -1.2]
    if d_l and d_e:
        print(f'  done - wait, median: placed early {st.median(d_e):.2f}, late {st.median(d_l):.2f}')
