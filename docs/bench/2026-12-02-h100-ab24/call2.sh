#!/bin/sh
# Call 2: the bench's power sampler on both shapes; a CUPTI trace of
# 0.6B and 8B batch 1; gpu-ab same (random-weight shapes) against the
# tree before the sampler (tools only, so every result must be equal).
set -u
out=$OUT
. .devdeps/activate.sh
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $out/gpu.txt
(meson setup build-gpu -Dcuda=enabled && ninja -C build-gpu) > $out/build.log 2>&1 || { tail -30 $out/build.log; exit 99; }
A=build-gpu/tools/atlas
for s in 8b 0.6b; do
  $A bench --dummy-weights --arch qwen3 --shape $s -o chunk_size=2048 -o log_level=warn \
    --prompt-tokens 2048,8192 --prefill-runs 2 --batch 1,64 --context 0 --gen-tokens 128 \
    --csv-out $out/pw-qwen3-$s.csv > $out/pw-$s.txt 2>&1 || echo "FAIL pw $s"
  cat $out/pw-$s.txt
done
$A bench --dummy-weights --arch qwen3 --shape 8b -o chunk_size=8192 -o log_level=warn \
    --prompt-tokens 8192 --prefill-runs 3 --batch 1 --context 0 --gen-tokens 16 \
    --csv-out $out/pw8k-qwen3-8b.csv > $out/pw8k-8b.txt 2>&1; tail -4 $out/pw8k-8b.txt
echo "power done at $(( $(date +%s) - t0 )) s"
so=/tmp/atlas-kernel-trace.so
cc -O2 -shared -fPIC -I/usr/local/cuda/include dev/prof/kernel_trace.c -L/usr/local/cuda/lib64 -lcupti -o $so
for s in 0.6b 8b; do
  CUDA_INJECTION64_PATH=$so KERNEL_TRACE_OUT=$out/tr-$s.csv $A bench --dummy-weights --arch qwen3 --shape $s \
    -o chunk_size=2048 -o log_level=warn --prompt-tokens 16 --prefill-runs 1 --context 0 --batch 1 --gen-tokens 128 > /dev/null 2>&1
  python3 dev/prof/kernel_trace.py $out/tr-$s.csv --group largest > $out/trace-$s-b1.txt 2>&1
  head -14 $out/trace-$s-b1.txt
done
echo "trace done at $(( $(date +%s) - t0 )) s"
P=.ab/1.patch
sh tools/gpu-ab.sh $P build > $out/ab-build.txt 2>&1 && timeout 240 sh tools/gpu-ab.sh $P same > $out/same.txt 2>&1
echo "same rc $? at $(( $(date +%s) - t0 )) s"; tail -25 $out/same.txt
cd $out && rm -f tr-*.csv && tar czf call2.tgz * && find . -type f ! -name call2.tgz -delete; ls
