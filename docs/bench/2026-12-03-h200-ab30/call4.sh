#!/bin/sh
# sides: 0 = f884f52, 1 = an lm_head of one k-block takes the pending final norm (its 9,496 blocks each norm the row)
set -u
out=$OUT
t0=$(date +%s)
P=.ab/wnorm.patch
. .devdeps/activate.sh
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $out/gpu.txt
timeout 200 sh tools/gpu-ab.sh $P build > $out/build.txt 2>&1 || { tail -40 $out/build.txt; cd $out && tar czf call4.tgz * && find . -type f ! -name call4.tgz -delete; exit 99; }
echo "build done at $(( $(date +%s) - t0 )) s"
AB_TRACE_SIDES="0 1" AB_TRACE_BENCH="--prompt-tokens 16 --prefill-runs 1 --batch 1 --context 0 --gen-tokens 64" \
  timeout 40 sh tools/gpu-ab.sh $P trace qwen3-0.6b > $out/trace.txt 2>&1; echo "trace rc $? at $(( $(date +%s) - t0 )) s"; cat $out/trace.txt
AB_BENCH="--prompt-tokens 16 --prefill-runs 1 --batch 1,8 --context 0 --gen-tokens 128" AB_ROUNDS=2 AB_BUDGET=150 \
  timeout 170 sh tools/gpu-ab.sh $P bench qwen3-0.6b > $out/bench.txt 2>&1; echo "bench rc $? at $(( $(date +%s) - t0 )) s"
timeout 90 sh tools/gpu-ab.sh $P check > $out/check.txt 2>&1; echo "check rc $? at $(( $(date +%s) - t0 )) s"; cat $out/check.txt
cd $out && tar czf call4.tgz * && find . -type f ! -name call4.tgz -delete; ls
