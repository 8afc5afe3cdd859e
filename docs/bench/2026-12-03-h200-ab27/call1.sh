#!/bin/sh
# Call 1 (2026-12-03, tenth session): the ninth session's code as one build
# (HEAD 2b7cea9, the cluster rule included) against a1cc687: same bits, the
# op cases on cuda (the fault-publication cases new), test_spec and
# test_engine; then batch 1 of both shapes, interleaved.
set -u
out=$OUT
t0=$(date +%s)
P=.ab/1.patch
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $out/gpu.txt
timeout 220 sh tools/gpu-ab.sh $P build > $out/build.txt 2>&1 || { tail -40 $out/build.txt; cd $out && tar czf call1.tgz * && find . -type f ! -name call1.tgz -delete; exit 99; }
echo "build done at $(( $(date +%s) - t0 )) s"
timeout 230 sh tools/gpu-ab.sh $P same > $out/same.txt 2>&1; echo "same rc $? at $(( $(date +%s) - t0 )) s"; tail -15 $out/same.txt; tail -3 $out/ops-cuda.log; grep -ci "device fault before" $out/ops-cuda.log
left=$(( 560 - ($(date +%s) - t0) ))
[ $left -gt 60 ] && { AB_BENCH="--prompt-tokens 16 --prefill-runs 1 --batch 1 --context 0 --gen-tokens 128" AB_ROUNDS=2 AB_BUDGET=$((left-15)) \
  timeout $left sh tools/gpu-ab.sh $P bench qwen3-0.6b qwen3-8b > $out/bench.txt 2>&1; echo "bench rc $? at $(( $(date +%s) - t0 )) s"; }
cd $out && tar czf call1.tgz * && find . -type f ! -name call1.tgz -delete; ls
