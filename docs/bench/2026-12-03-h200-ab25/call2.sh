#!/bin/sh
# Call 2 (2026-12-03, H200): the grid-barrier lab; the MLP launch with the
# generation barrier (side 1) and with a monotonic count where only blocks
# with down tiles wait (side 2) against HEAD (side 0): same (side 2),
# 0.6B batch-1 rounds, CUPTI traces of sides 0 and 2.
set -u
out=$OUT
t0=$(date +%s)
P=.ab/1.patch,.ab/2.patch
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $out/gpu.txt
timeout 200 sh tools/gpu-ab.sh $P build > $out/build.txt 2>&1 || { tail -40 $out/build.txt; cd $out && tar czf call2.tgz * && find . -type f ! -name call2.tgz -delete; exit 99; }
echo "build done at $(( $(date +%s) - t0 )) s"
nvcc -O3 -std=c++17 -arch=sm_90a -I. dev/cuda/grid_barrier_lab.cu -o /tmp/grid_barrier_lab && timeout 60 /tmp/grid_barrier_lab > $out/lab-grid-barrier.txt 2>&1; cat $out/lab-grid-barrier.txt
echo "lab done at $(( $(date +%s) - t0 )) s"
timeout 240 sh tools/gpu-ab.sh $P same > $out/same.txt 2>&1; echo "same rc $? at $(( $(date +%s) - t0 )) s"; grep -ci "equal" $out/same.txt; grep -i "DIFFERENT\|FAILED\|cases on\|PASSED" $out/same.txt | tail -8
AB_BENCH="--prompt-tokens 16 --prefill-runs 1 --batch 1 --context 0 --gen-tokens 128" AB_ROUNDS=4 AB_BUDGET=150 \
  timeout 180 sh tools/gpu-ab.sh $P bench qwen3-0.6b > $out/bench.txt 2>&1; echo "bench rc $? at $(( $(date +%s) - t0 )) s"
AB_TRACE_SIDES="0 2" AB_TRACE_BENCH="--prompt-tokens 16 --prefill-runs 1 --batch 1 --context 0 --gen-tokens 128" \
  timeout 90 sh tools/gpu-ab.sh $P trace qwen3-0.6b > $out/trace.txt 2>&1; echo "trace rc $? at $(( $(date +%s) - t0 )) s"
cd $out && tar czf call2.tgz * && find . -type f ! -name call2.tgz -delete; ls
