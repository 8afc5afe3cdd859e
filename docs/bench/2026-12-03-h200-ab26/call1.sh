#!/bin/sh
# Call 1 (2026-12-03, ninth session): the step's end without copies (the
# sampling kernels write ids and the fault word into mapped pinned memory),
# no gather of the out rows when every row gives logits, and the last norm
# taken by lm_head's bulk GEMV (side 1) against a1cc687 (side 0): same,
# op cases, test_spec, test_engine; 0.6B batch 1 and 8 rounds; traces.
set -u
out=$OUT
t0=$(date +%s)
P=.ab/1.patch
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $out/gpu.txt
timeout 200 sh tools/gpu-ab.sh $P build > $out/build.txt 2>&1 || { tail -40 $out/build.txt; cd $out && tar czf call1.tgz * && find . -type f ! -name call1.tgz -delete; exit 99; }
echo "build done at $(( $(date +%s) - t0 )) s"
timeout 230 sh tools/gpu-ab.sh $P same > $out/same.txt 2>&1; echo "same rc $? at $(( $(date +%s) - t0 )) s"; grep -ci "equal" $out/same.txt; grep -i "DIFFERENT\|FAILED\|cases on\|PASSED" $out/same.txt | tail -8
AB_BENCH="--prompt-tokens 16 --prefill-runs 1 --batch 1,8 --context 0 --gen-tokens 128" AB_ROUNDS=4 AB_BUDGET=150 \
  timeout 175 sh tools/gpu-ab.sh $P bench qwen3-0.6b > $out/bench.txt 2>&1; echo "bench rc $? at $(( $(date +%s) - t0 )) s"
AB_TRACE_BENCH="--prompt-tokens 16 --prefill-runs 1 --batch 1 --context 0 --gen-tokens 128" \
  timeout 80 sh tools/gpu-ab.sh $P trace qwen3-0.6b > $out/trace.txt 2>&1; echo "trace rc $? at $(( $(date +%s) - t0 )) s"
cd $out && tar czf call1.tgz * && find . -type f ! -name call1.tgz -delete; ls
