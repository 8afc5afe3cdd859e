#!/bin/sh
# Call 5 (2026-12-03, H200): DEC_MIN_CHUNK 64 (side 0) against 256 (side
# 1) on Qwen3-0.6B decode at batch 1-16, short context and 2,048: data
# for a split rule by rows. Bench only (call 4 ran the tests on 256).
set -u
out=$OUT
t0=$(date +%s)
P=.ab/1.patch
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $out/gpu.txt
timeout 120 sh tools/gpu-ab.sh $P build > $out/build.txt 2>&1 || { tail -20 $out/build.txt; exit 99; }
echo "build done at $(( $(date +%s) - t0 )) s"
AB_BENCH="--prompt-tokens 16 --prefill-runs 1 --batch 1,2,4,8,16 --context 2048 --context-batch 1,2,4,8,16 --gen-tokens 64" AB_ROUNDS=2 AB_BUDGET=130 \
  timeout 160 sh tools/gpu-ab.sh $P bench qwen3-0.6b > $out/bench.txt 2>&1; echo "bench rc $? at $(( $(date +%s) - t0 )) s"
cd $out && tar czf call5.tgz * && find . -type f ! -name call5.tgz -delete; ls
