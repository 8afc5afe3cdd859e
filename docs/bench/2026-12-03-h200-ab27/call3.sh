#!/bin/sh
# Call 3 (2026-12-03, tenth session): the pick inside the step's graph
# (side 1) against 2b7cea9 (side 0) at batch 1 and 64 of both shapes, the
# rows of issue 14's decode targets, interleaved.
set -u
out=$OUT
t0=$(date +%s)
P=.ab/1.patch
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $out/gpu.txt
timeout 200 sh tools/gpu-ab.sh $P build > $out/build.txt 2>&1 || { tail -40 $out/build.txt; cd $out && tar czf call3.tgz * && find . -type f ! -name call3.tgz -delete; exit 99; }
echo "build done at $(( $(date +%s) - t0 )) s"
left=$(( 370 - ($(date +%s) - t0) ))
AB_BENCH="--prompt-tokens 16 --prefill-runs 1 --batch 1,64 --context 0 --gen-tokens 128" AB_ROUNDS=2 AB_BUDGET=$((left-15)) \
  timeout $left sh tools/gpu-ab.sh $P bench qwen3-0.6b qwen3-8b > $out/bench.txt 2>&1; echo "bench rc $? at $(( $(date +%s) - t0 )) s"
cd $out && tar czf call3.tgz * && find . -type f ! -name call3.tgz -delete; ls
