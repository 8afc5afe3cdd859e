#!/bin/sh
# Call 1 (2026-12-03, H200): the MLP of one row in one launch (side 1)
# against HEAD (side 0): build, same, decode bench rounds, a trace.
set -u
out=$OUT
t0=$(date +%s)
P=.ab/1.patch
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $out/gpu.txt
timeout 200 sh tools/gpu-ab.sh $P build > $out/build.txt 2>&1 || { tail -40 $out/build.txt; cd $out && tar czf call1.tgz * && find . -type f ! -name call1.tgz -delete; exit 99; }
echo "build done at $(( $(date +%s) - t0 )) s"
. .devdeps/activate.sh
timeout 90 build-gpu/tests/ops/test_ops cuda > $out/ops-smoke.log 2>&1; echo "ops rc $?"; grep -E "MLP|FAILED|cases on" $out/ops-smoke.log | tail -12
echo "ops smoke at $(( $(date +%s) - t0 )) s"
AB_BENCH="--prompt-tokens 16 --prefill-runs 1 --batch 1 --context 0 --gen-tokens 128" AB_ROUNDS=2 \
  timeout 60 sh tools/gpu-ab.sh $P bench qwen3-0.6b > $out/bench-smoke.txt 2>&1; echo "smoke bench rc $?"; tail -5 $out/bench-smoke.txt
timeout 240 sh tools/gpu-ab.sh $P same > $out/same.txt 2>&1; echo "same rc $? at $(( $(date +%s) - t0 )) s"; grep -i "differ\|equal\|fail\|pass" $out/same.txt | tail -25
AB_BENCH="--prompt-tokens 16 --prefill-runs 1 --batch 1,8 --context 0 --gen-tokens 128" AB_ROUNDS=4 AB_BUDGET=170 \
  timeout 200 sh tools/gpu-ab.sh $P bench qwen3-0.6b qwen3-8b > $out/bench.txt 2>&1; echo "bench rc $? at $(( $(date +%s) - t0 )) s"
python3 tools/ab-medians.py $out ab 2>&1 | tail -20
cd $out && tar czf call1.tgz * && find . -type f ! -name call1.tgz -delete; ls
