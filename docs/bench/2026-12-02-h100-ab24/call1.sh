#!/bin/sh
# Call 1: HEAD on the lent GPU: the six target rows, prefill of 8,192 at
# chunk sizes 2,048 / 4,096 / 8,192 interleaved, power samples, the peer's
# prefill rows, the op cases on cuda.
set -u
out=$OUT
. .devdeps/activate.sh
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit,power.max_limit --format=csv > $out/gpu.txt 2>&1
git log -1 --format='commit %h %cd' >> $out/gpu.txt 2>/dev/null
t0=$(date +%s)
(meson setup build-gpu -Dcuda=enabled && ninja -C build-gpu) > $out/build.log 2>&1 || { tail -30 $out/build.log; exit 99; }
echo "build $(( $(date +%s) - t0 )) s"
A=build-gpu/tools/atlas
reasons=clocks_event_reasons.active
nvidia-smi --query-gpu=$reasons --format=csv,noheader >/dev/null 2>&1 || reasons=clocks_throttle_reasons.active
power=power.draw.instant
nvidia-smi --query-gpu=$power --format=csv,noheader,nounits 2>/dev/null | grep -q "^[0-9]" || power=power.draw
nvidia-smi --query-gpu=timestamp,clocks.sm,$power,$reasons --format=csv,noheader,nounits -lms 100 > $out/power.csv 2>/dev/null &
smi=$!
: > $out/marks.txt
for round in 1 2 3; do
  for s in 8b 0.6b; do
    i=0
    for c in 2048 4096 8192; do
      echo "$(date '+%Y/%m/%d %H:%M:%S.%N') start qwen3-$s $i $round" >> $out/marks.txt
      $A bench --dummy-weights --arch qwen3 --shape $s -o chunk_size=$c -o log_level=warn \
        --prompt-tokens 2048,8192 --prefill-runs 2 --batch 1 --context 0 --gen-tokens 16 \
        --csv-out $out/ab-qwen3-$s-$i-$round.csv > $out/log-$s-$c-$round.txt 2>&1 || echo "FAIL $s $c $round"
      echo "$(date '+%Y/%m/%d %H:%M:%S.%N') end qwen3-$s $i $round" >> $out/marks.txt
      i=$((i + 1))
    done
  done
  echo "round $round at $(( $(date +%s) - t0 )) s"
done
for s in 8b 0.6b; do
  echo "$(date '+%Y/%m/%d %H:%M:%S.%N') start decode-$s 0 1" >> $out/marks.txt
  $A bench --dummy-weights --arch qwen3 --shape $s -o chunk_size=2048 -o log_level=warn \
    --prompt-tokens 16 --prefill-runs 1 --context 0 --batch 1,8,64 --gen-tokens 128 \
    --csv-out $out/decode-qwen3-$s.csv > $out/decode-$s.txt 2>&1 || echo "FAIL decode $s"
  echo "$(date '+%Y/%m/%d %H:%M:%S.%N') end decode-$s 0 1" >> $out/marks.txt
done
kill $smi 2>/dev/null
echo "atlas done at $(( $(date +%s) - t0 )) s"
cat $out/decode-8b.txt $out/decode-0.6b.txt
build-gpu/tests/ops/test_ops cuda > $out/ops-cuda.log 2>&1; echo "ops rc $?"; tail -3 $out/ops-cuda.log
echo "ops done at $(( $(date +%s) - t0 )) s"
for s in 0.6b 8b; do
  timeout 150 python3 tools/peer/bench-transformers.py --shape $s --batch '' --prompt-tokens 2048,8192 \
    --csv-out $out/peer-qwen3-$s.csv > $out/peer-$s.txt 2>&1; echo "peer $s rc $? at $(( $(date +%s) - t0 )) s"
  tail -4 $out/peer-$s.txt
done
cd $out && tar czf call1.tgz *.csv *.txt *.log && ls
