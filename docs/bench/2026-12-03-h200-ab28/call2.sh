#!/bin/sh
# Call 2 (2026-12-03, eleventh session): same/op cases/test_spec/test_engine
# of 088d0b9 against the tree (the strided bulk tiles, 3472117, and
# vocabulary-wide products on gemv_kernel with the norm apart); then bench
# of the wide rule alone (AB_DIR /tmp/ab2: 3472117 against the tree).
set -u
out=$OUT
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $out/gpu.txt
mkdir -p $out/s $out/w
timeout 200 sh tools/gpu-ab.sh .ab/1.patch,.ab/2.patch build > $out/build.txt 2>&1 || { tail -40 $out/build.txt; cd $out && tar czf call2.tgz * && find . -type f ! -name call2.tgz -delete; exit 99; }
AB_DIR=/tmp/ab2 timeout 200 sh tools/gpu-ab.sh .ab/2.patch build > $out/build2.txt 2>&1 || { tail -40 $out/build2.txt; cd $out && tar czf call2.tgz * && find . -type f ! -name call2.tgz -delete; exit 99; }
echo "builds done at $(( $(date +%s) - t0 )) s"
OUT=$out/s timeout 240 sh tools/gpu-ab.sh .ab/1.patch,.ab/2.patch same > $out/same.txt 2>&1; echo "same rc $? at $(( $(date +%s) - t0 )) s"; grep -ci "equal" $out/same.txt; grep -i "DIFFERENT\|FAILED\|cases on\|PASSED" $out/same.txt | tail -8
grep -i "65544\|FAIL" $out/s/ops-cuda.log | head; grep -h "greedy beside\|FAILED\|PASSED" $out/s/engine-cuda-*.log | head -8
left=$(( 420 - ($(date +%s) - t0) ))
AB_DIR=/tmp/ab2 AB_BENCH="--prompt-tokens 16 --prefill-runs 1 --batch 1,8 --context 0 --gen-tokens 128" AB_ROUNDS=2 AB_BUDGET=$((left-15)) \
  OUT=$out/w timeout $left sh tools/gpu-ab.sh .ab/2.patch bench qwen3-0.6b qwen3-8b > $out/bench.txt 2>&1; echo "bench rc $? at $(( $(date +%s) - t0 )) s"
cd $out && rm -f s/*.f32 && tar czf call2.tgz * && find . -type f ! -name call2.tgz -delete; ls
