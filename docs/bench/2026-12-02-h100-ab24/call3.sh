#!/bin/sh
# Call 3: the decode target rows on the H100 in interleaved rounds (0.6B
# and 8B at batch 1 and 64), CUPTI traces of the batch-1 decode steps,
# and the peer's batch-1 decode rows in the same call.
set -u
out=$OUT
. .devdeps/activate.sh
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $out/gpu.txt
(meson setup build-gpu -Dcuda=enabled && ninja -C build-gpu) > $out/build.log 2>&1 || { tail -30 $out/build.log; exit 99; }
A=build-gpu/tools/atlas
for round in 1 2 3 4 5 6 7 8; do
  $A bench --dummy-weights --arch qwen3 --shape 0.6b -o chunk_size=2048 -o log_level=warn \
    --prompt-tokens 16 --prefill-runs 1 --context 0 --batch 1 --gen-tokens 128 \
    --csv-out $out/ab-qwen3-0.6b-0-$round.csv > /dev/null 2>&1 || echo "FAIL 0.6b $round"
  if [ $round -le 3 ]; then
    $A bench --dummy-weights --arch qwen3 --shape 0.6b -o chunk_size=2048 -o log_level=warn \
      --prompt-tokens 16 --prefill-runs 1 --context 0 --batch 64 --gen-tokens 128 \
      --csv-out $out/ab-qwen3-0.6b-1-$round.csv > /dev/null 2>&1 || echo "FAIL 0.6b64 $round"
    $A bench --dummy-weights --arch qwen3 --shape 8b -o chunk_size=2048 -o log_level=warn \
      --prompt-tokens 16 --prefill-runs 1 --context 0 --batch 1,64 --gen-tokens 128 \
      --csv-out $out/ab-qwen3-8b-0-$round.csv > /dev/null 2>&1 || echo "FAIL 8b $round"
  fi
done
echo "rounds done at $(( $(date +%s) - t0 )) s"
so=/tmp/atlas-kernel-trace.so
cc -O2 -shared -fPIC -I/usr/local/cuda/include dev/prof/kernel_trace.c -L/usr/local/cuda/lib64 -lcupti -o $so
for s in 0.6b 8b; do
  CUDA_INJECTION64_PATH=$so KERNEL_TRACE_OUT=/tmp/tr-$s.csv $A bench --dummy-weights --arch qwen3 --shape $s \
    -o chunk_size=2048 -o log_level=warn --prompt-tokens 16 --prefill-runs 1 --context 0 --batch 1 --gen-tokens 128 > /dev/null 2>&1
  python3 dev/prof/kernel_trace.py /tmp/tr-$s.csv > $out/trace-$s-b1-decode.txt 2>&1
  head -16 $out/trace-$s-b1-decode.txt
done
echo "trace done at $(( $(date +%s) - t0 )) s"
for s in 0.6b 8b; do
  timeout 120 python3 tools/peer/bench-transformers.py --shape $s --batch 1 --prompt-tokens '' \
    --csv-out $out/peer-decode-qwen3-$s.csv > $out/peer-decode-$s.txt 2>&1; echo "peer $s rc $? at $(( $(date +%s) - t0 )) s"
  tail -2 $out/peer-decode-$s.txt
done
cd $out && tar czf call3.tgz * && find . -type f ! -name call3.tgz -delete; ls
