#!/bin/sh
# Call 3 (2026-12-03, eleventh session): CUPTI traces of Qwen3-0.6B batch 1
# on 088d0b9 (side 0) and the tree (side 2: strided bulk tiles and the
# wide products on gemv_kernel).
set -u
out=$OUT
t0=$(date +%s)
timeout 110 sh tools/gpu-ab.sh .ab/1.patch,.ab/2.patch build > $out/build.txt 2>&1 || { tail -20 $out/build.txt; cd $out && tar czf call3.tgz * && find . -type f ! -name call3.tgz -delete; exit 99; }
echo "build done at $(( $(date +%s) - t0 )) s"
AB_TRACE_SIDES="0 2" AB_TRACE_BENCH="--prompt-tokens 16 --prefill-runs 1 --batch 1 --context 0 --gen-tokens 128" \
  timeout 60 sh tools/gpu-ab.sh .ab/1.patch,.ab/2.patch trace qwen3-0.6b > $out/trace.txt 2>&1; echo "trace rc $? at $(( $(date +%s) - t0 )) s"
cd $out && rm -f ab-trace.tgz && tar czf call3.tgz * && find . -type f ! -name call3.tgz -delete; ls
