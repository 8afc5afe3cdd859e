#!/bin/sh
# Call 1 (2026-12-03, eleventh session): the bulk GEMV's blocks own tiles
# b, b+G, b+2G, ... (one window of w read by the grid) instead of a
# contiguous run each. Lab (bits against tileb, GB/s) on both sides,
# one run each; bench 0.6B and 8B
# batch 1 and 8.
set -u
out=$OUT
t0=$(date +%s)
P=.ab/1.patch
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $out/gpu.txt
timeout 200 sh tools/gpu-ab.sh $P build > $out/build.txt 2>&1 || { tail -40 $out/build.txt; cd $out && tar czf call1.tgz * && find . -type f ! -name call1.tgz -delete; exit 99; }
echo "build done at $(( $(date +%s) - t0 )) s"
. .devdeps/activate.sh 2>/dev/null
(cd /tmp/atlas-ab/0 && timeout 120 nvcc -O3 -arch=sm_90a -I. dev/cuda/gemv_lab.cu -lcublas -o /tmp/lab0) &
timeout 120 nvcc -O3 -arch=sm_90a -I. dev/cuda/gemv_lab.cu -lcublas -o /tmp/lab1 &
wait
echo "lab built at $(( $(date +%s) - t0 )) s"
for r in 1; do for s in 0 1; do
  timeout 50 /tmp/lab$s $out/lab-$s-$r.csv tileb,tilebp,bulkbp,bulkbpx > $out/lab-$s-$r.txt 2>&1; echo "lab side $s round $r rc $? at $(( $(date +%s) - t0 )) s"; grep FAIL $out/lab-$s-$r.txt | head -5
done; done
left=$(( 560 - ($(date +%s) - t0) ))
AB_BENCH="--prompt-tokens 16 --prefill-runs 1 --batch 1,8 --context 0 --gen-tokens 128" AB_ROUNDS=2 AB_BUDGET=$((left-15)) \
  timeout $left sh tools/gpu-ab.sh $P bench qwen3-0.6b qwen3-8b > $out/bench.txt 2>&1; echo "bench rc $? at $(( $(date +%s) - t0 )) s"
cd $out && tar czf call1.tgz * && find . -type f ! -name call1.tgz -delete; ls
