#!/bin/sh
# Next session's first call: the draw in the graph (91f7976..) against
# 8f3d19d: same, op cases (the draw's new), test_spec, test_engine; then
# sampled decode at the sessions' defaults and greedy batch 1, interleaved.
set -u
out=$OUT
t0=$(date +%s)
P=.ab/draw.patch
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $out/gpu.txt
timeout 200 sh tools/gpu-ab.sh $P build > $out/build.txt 2>&1 || { tail -40 $out/build.txt; cd $out && tar czf call1.tgz * && find . -type f ! -name call1.tgz -delete; exit 99; }
echo "build done at $(( $(date +%s) - t0 )) s"
mkdir -p $out/s
OUT=$out/s timeout 240 sh tools/gpu-ab.sh $P same > $out/same.txt 2>&1; echo "same rc $? at $(( $(date +%s) - t0 )) s"; grep -ci "equal" $out/same.txt; grep -i "DIFFERENT\|FAILED\|cases on\|PASSED" $out/same.txt | tail -8
grep -i "FAIL\|draw" $out/s/ops-cuda.log | head -20
rm -f $out/s/*.f32
left=$(( 540 - ($(date +%s) - t0) ))
AB_BENCH="--prompt-tokens 16 --prefill-runs 1 --batch 1,8,64 --context 0 --gen-tokens 128 --temperature 0.7 --top-p 0.9 --top-k 40" AB_ROUNDS=2 AB_BUDGET=$((left-15)) \
  timeout $left sh tools/gpu-ab.sh $P bench qwen3-0.6b qwen3-8b > $out/bench.txt 2>&1; echo "bench rc $? at $(( $(date +%s) - t0 )) s"
cd $out && tar czf call1.tgz * && find . -type f ! -name call1.tgz -delete; ls
