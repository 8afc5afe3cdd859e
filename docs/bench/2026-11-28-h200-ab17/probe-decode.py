#!/usr/bin/env python3
"""Decode-attention stamps of probe-placement.patch (DEC lines: one per CTA of launches W0..W1):
per launch, the last running CTA start and the end against the first CTA past its PDL wait. usage: probe-decode.py FILE..."""
import re,sys,statistics as st
for path in sys.argv[1:]:
    L={}
    for line in open(path):
        m=re.match(r'DEC l=(\d+) cta=\((\d+),(\d+),(\d+)\) grid=\((\d+),(\d+),(\d+)\) smid (\d+) (\w+) start (\d+) wait (\d+) trig (\d+) end (\d+)',line)
        if m:
            L.setdefault(int(m.group(1)),[]).append(dict(kind=m.group(9),start=int(m.group(10)),wait=int(m.group(11)),trig=int(m.group(12)),end=int(m.group(13))))
    late=[];spread=[];dur=[];kinds={}
    for l,c in L.items():
        run=[x for x in c if x['kind']!='skip']
        for x in c: kinds[x['kind']]=kinds.get(x['kind'],0)+1
        w=min(x['wait'] for x in run)
        s0=min(x['start'] for x in c); s1=max(x['start'] for x in run)
        late.append((s1-w)/1e3); spread.append((s1-s0)/1e3); dur.append((max(x['end'] for x in c)-w)/1e3)
    print(path,len(L),'launches; kinds',kinds)
    q=lambda a:' '.join(f'{v:6.2f}' for v in st.quantiles(a,n=10)[::2])
    print(' last running CTA start - first wait (us) deciles 10/30/50/70/90:',q(late))
    print(' last start - first start:',q(spread))
    print(' end - first wait:',q(dur))
    print(' frac with last start after first wait:',sum(1 for v in late if v>0)/len(late))
