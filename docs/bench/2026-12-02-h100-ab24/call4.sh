#!/bin/sh
# Call 4: CUPTI traces of Qwen3-8B's prefill of 8,192 on the H100, in
# chunks of 2,048 and of 8,192 (kernel classes at the power cap), and the
# prefill of 8,192 at the default chunk_size (256) on both shapes.
set -u
out=$OUT
. .devdeps/activate.sh
t0=$(date +%s)
(meson setup build-gpu -Dcuda=enabled && ninja -C build-gpu) > $out/build.log 2>&1 || { tail -30 $out/build.log; exit 99; }
A=build-gpu/tools/atlas
so=/tmp/atlas-kernel-trace.so
cc -O2 -shared -fPIC -I/usr/local/cuda/include dev/prof/kernel_trace.c -L/usr/local/cuda/lib64 -lcupti -o $so
for c in 2048 8192; do
  CUDA_INJECTION64_PATH=$so KERNEL_TRACE_OUT=/tmp/tr-8b-$c.csv $A bench --dummy-weights --arch qwen3 --shape 8b \
    -o chunk_size=$c -o log_level=warn --prompt-tokens 8192 --prefill-runs 2 --batch 1 --context 0 --gen-tokens 4 > $out/trace-bench-8b-$c.txt 2>&1
  python3 dev/prof/kernel_trace.py /tmp/tr-8b-$c.csv --group largest --top 30 > $out/trace-8b-prefill-8k-chunk$c.txt 2>&1
  head -24 $out/trace-8b-prefill-8k-chunk$c.txt
done
echo "trace done at $(( $(date +%s) - t0 )) s"
for s in 8b 0.6b; do
  $A bench --dummy-weights --arch qwen3 --shape $s -o log_level=warn \
    --prompt-tokens 8192 --prefill-runs 2 --batch 1 --context 0 --gen-tokens 4 > $out/default-chunk-$s.txt 2>&1
  cat $out/default-chunk-$s.txt | grep -A1 "^prefill"
done
echo "done at $(( $(date +%s) - t0 )) s"
cd $out && tar czf call4.tgz *.txt && find . -type f ! -name call4.tgz -delete; ls
