#!/bin/sh
# sides: 0 = e291961, 1 = 6f0b879 (lm_head of one k-block at NT = 2), 2 = greedy's four loads asked for together (row_best, working tree)
set -u
out=$OUT
t0=$(date +%s)
P=.ab/nt2c.patch,.ab/unroll.patch
. .devdeps/activate.sh
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $out/gpu.txt
timeout 240 sh tools/gpu-ab.sh $P build > $out/build.txt 2>&1 || { tail -40 $out/build.txt; cd $out && tar czf call3.tgz * && find . -type f ! -name call3.tgz -delete; exit 99; }
echo "build done at $(( $(date +%s) - t0 )) s"
timeout 240 sh tools/gpu-ab.sh $P same > $out/same.txt 2>&1; echo "same rc $? at $(( $(date +%s) - t0 )) s"; grep -vE "^\s*$" $out/same.txt | tail -25
AB_TRACE_SIDES="1 2" AB_TRACE_BENCH="--prompt-tokens 16 --prefill-runs 1 --batch 1 --context 0 --gen-tokens 64" \
  timeout 40 sh tools/gpu-ab.sh $P trace qwen3-0.6b > $out/trace.txt 2>&1; echo "trace rc $? at $(( $(date +%s) - t0 )) s"
left=$(( 400 - ($(date +%s) - t0) ))
AB_BENCH="--prompt-tokens 16 --prefill-runs 1 --batch 1,8 --context 0 --gen-tokens 128" AB_ROUNDS=2 AB_BUDGET=$((left-15)) \
  timeout $left sh tools/gpu-ab.sh $P bench qwen3-0.6b > $out/bench.txt 2>&1; echo "bench rc $? at $(( $(date +%s) - t0 )) s"
cd $out && tar czf call3.tgz * && find . -type f ! -name call3.tgz -delete; ls
