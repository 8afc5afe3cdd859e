#!/bin/sh
# Build, then run, the attention lab programs and the wgmma lab (see README.md):
#   sh dev/cuda/attention-lab.sh [build]
# Binaries go to /tmp/atlas-lab (ARCH=90a by default: H100/H200).
set -eu
cd "$(dirname "$0")"
ARCH=${ARCH:-90a}
BIN=${BIN:-/tmp/atlas-lab}
mkdir -p "$BIN"
pids=
for p in wgmma_lab attention_decode attention_prefill; do
	nvcc -O3 -std=c++17 -lineinfo -gencode=arch=compute_$ARCH,code=sm_$ARCH -I../.. \
		-Xcompiler -fopenmp -Xptxas -v $p.cu -o "$BIN/$p" > "$BIN/$p.ptxas.log" 2>&1 &
	pids="$pids $!"
done
for pid in $pids; do
	wait "$pid"
done
[ "${1:-}" = build ] && exit 0
# wgmma_lab first: its layout checks say whether attention_prefill's wgmma
# variants can hold; every program runs, and any failure fails the script.
status=0
for p in wgmma_lab attention_prefill attention_decode; do
	"$BIN/$p" || status=1
done
exit $status
