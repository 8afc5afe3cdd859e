#!/bin/sh
# sides: 0 = 3832961, 1 = topk_kernel: the threshold's maxima sorted in registers, candidates placed by rank, the pick as the block
set -u
out=$OUT
t0=$(date +%s)
P=.ab/topk.patch
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $out/gpu.txt
timeout 150 sh tools/gpu-ab.sh $P build > $out/build.txt 2>&1 || { tail -40 $out/build.txt; cd $out && tar czf call3.tgz * && find . -type f ! -name call3.tgz -delete; exit 99; }
echo "build done at $(( $(date +%s) - t0 )) s"
timeout 80 build-gpu/tests/ops/test_ops cuda > $out/ops-cuda.log 2>&1; echo "ops rc $?"; grep -E "FAILED|FAIL |cases on" $out/ops-cuda.log | head -20
ATLAS_TEST_BACKEND=cuda timeout 40 build-gpu/tests/engine/test_engine tests/fidelity/models/qwen3_bf16_mha_untied > $out/engine.log 2>&1; echo "engine rc $?"; grep -E '^\[ *(PASSED|FAILED|  ERROR) ' $out/engine.log
echo "tests done at $(( $(date +%s) - t0 )) s"
AB_TRACE_BENCH="--prompt-tokens 16 --prefill-runs 1 --batch 1 --context 0 --gen-tokens 48 --temperature 0.7 --top-p 0.9 --top-k 40" \
  timeout 40 sh tools/gpu-ab.sh $P trace qwen3-0.6b > $out/trace.txt 2>&1; echo "trace rc $? at $(( $(date +%s) - t0 )) s"
left=$(( 255 - ($(date +%s) - t0) ))
AB_BENCH="--prompt-tokens 16 --prefill-runs 3 --batch 1,8,64 --context 0 --gen-tokens 128 --temperature 0.7 --top-p 0.9 --top-k 40" AB_ROUNDS=2 AB_BUDGET=$((left-10)) \
  timeout $left sh tools/gpu-ab.sh $P bench qwen3-0.6b > $out/bench.txt 2>&1; echo "bench rc $? at $(( $(date +%s) - t0 )) s"
cd $out && tar czf call3.tgz * && find . -type f ! -name call3.tgz -delete; ls
