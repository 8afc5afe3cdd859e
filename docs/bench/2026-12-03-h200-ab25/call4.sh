#!/bin/sh
# Call 4 (2026-12-03, H200): DEC_MIN_CHUNK 64 (side 0, HEAD), 128 (side
# 1) and 256 (side 2): same (side 2: other bits expected, the tests must
# pass), then 0.6B decode rounds at contexts 32-160 and 1,024.
set -u
out=$OUT
t0=$(date +%s)
P=.ab/1.patch,.ab/2.patch
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $out/gpu.txt
timeout 200 sh tools/gpu-ab.sh $P build > $out/build.txt 2>&1 || { tail -40 $out/build.txt; cd $out && tar czf call4.tgz * && find . -type f ! -name call4.tgz -delete; exit 99; }
echo "build done at $(( $(date +%s) - t0 )) s"
timeout 200 sh tools/gpu-ab.sh $P same > $out/same.txt 2>&1; echo "same rc $? at $(( $(date +%s) - t0 )) s"; grep -i "DIFFERENT\|FAILED\|cases on\|PASSED" $out/same.txt | tail -12
AB_BENCH="--prompt-tokens 16 --prefill-runs 1 --batch 1,8 --context 1024 --context-batch 1 --gen-tokens 128" AB_ROUNDS=3 AB_BUDGET=200 \
  timeout 230 sh tools/gpu-ab.sh $P bench qwen3-0.6b > $out/bench.txt 2>&1; echo "bench rc $? at $(( $(date +%s) - t0 )) s"
mkdir -p /tmp/abx && tar xzf $out/ab-bench.tgz -C /tmp/abx && python3 tools/ab-medians.py /tmp/abx ab
cd $out && rm -f logits-*.f32 && tar czf call4.tgz * && find . -type f ! -name call4.tgz -delete; ls
