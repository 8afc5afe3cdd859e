#!/bin/sh
# Call 2 (2026-12-03, tenth session): a step whose sampled rows are all
# greedy picks them inside its forward pass and graph (kt_pick: the greedy
# kernel under PDL after lm_head) against 2b7cea9: same, op cases (the
# pick's new), test_spec, test_engine; trace of both; 0.6B batch 1 and 8.
set -u
out=$OUT
t0=$(date +%s)
P=.ab/1.patch
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $out/gpu.txt
timeout 200 sh tools/gpu-ab.sh $P build > $out/build.txt 2>&1 || { tail -40 $out/build.txt; cd $out && tar czf call2.tgz * && find . -type f ! -name call2.tgz -delete; exit 99; }
echo "build done at $(( $(date +%s) - t0 )) s"
timeout 230 sh tools/gpu-ab.sh $P same > $out/same.txt 2>&1; echo "same rc $? at $(( $(date +%s) - t0 )) s"; grep -ci "equal" $out/same.txt; grep -i "DIFFERENT\|FAILED\|cases on\|PASSED" $out/same.txt | tail -8; grep -i "pick" $out/ops-cuda.log
AB_TRACE_SIDES="0 1" AB_TRACE_BENCH="--prompt-tokens 16 --prefill-runs 1 --batch 1 --context 0 --gen-tokens 128" \
  timeout 50 sh tools/gpu-ab.sh $P trace qwen3-0.6b > $out/trace.txt 2>&1; echo "trace rc $? at $(( $(date +%s) - t0 )) s"
left=$(( 470 - ($(date +%s) - t0) ))
AB_BENCH="--prompt-tokens 16 --prefill-runs 1 --batch 1,8 --context 0 --gen-tokens 128" AB_ROUNDS=4 AB_BUDGET=$((left-15)) \
  timeout $left sh tools/gpu-ab.sh $P bench qwen3-0.6b > $out/bench.txt 2>&1; echo "bench rc $? at $(( $(date +%s) - t0 )) s"
cd $out && tar czf call2.tgz * && find . -type f ! -name call2.tgz -delete; ls
