#!/bin/sh
# Call 3 (2026-12-03, ninth session): the sides of call 2 (552faa0; the
# cluster merge; and the next kernel placed after the rope tasks) on
# Qwen3-8B batch 1 and on batch 4 at a context of 2,048 (a multi-row
# launch of up to 8 splits: the cluster path there too), both shapes.
set -u
out=$OUT
t0=$(date +%s)
P=.ab/1.patch,.ab/2.patch
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $out/gpu.txt
timeout 200 sh tools/gpu-ab.sh $P build > $out/build.txt 2>&1 || { tail -40 $out/build.txt; cd $out && tar czf call3.tgz * && find . -type f ! -name call3.tgz -delete; exit 99; }
echo "build done at $(( $(date +%s) - t0 )) s"
AB_BENCH="--prompt-tokens 16 --prefill-runs 1 --batch 1 --context 2048 --context-batch 4 --gen-tokens 64" AB_ROUNDS=2 AB_BUDGET=280 \
  timeout 310 sh tools/gpu-ab.sh $P bench qwen3-8b qwen3-0.6b > $out/bench.txt 2>&1; echo "bench rc $? at $(( $(date +%s) - t0 )) s"
cd $out && tar czf call3.tgz * && find . -type f ! -name call3.tgz -delete; ls
