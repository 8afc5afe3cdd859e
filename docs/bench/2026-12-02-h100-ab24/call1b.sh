#!/bin/sh
set -u
out=$OUT
. .devdeps/activate.sh
A=build-gpu/tools/atlas
reasons=clocks_event_reasons.active
nvidia-smi --query-gpu=$reasons --format=csv,noheader >/dev/null 2>&1 || reasons=clocks_throttle_reasons.active
power=power.draw.instant
nvidia-smi --query-gpu=$power --format=csv,noheader,nounits 2>/dev/null | grep -q "^[0-9]" || power=power.draw
nvidia-smi --query-gpu=timestamp,clocks.sm,$power,$reasons --format=csv,noheader,nounits -lms 100 > $out/power.csv 2>/dev/null &
smi=$!
: > $out/marks.txt
for round in 1 2 3 4; do
  for s in 8b; do
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
done
kill $smi
cat $out/log-8b-*-1.txt
cd $out && tar czf call1b.tgz *.csv *.txt && find . -type f ! -name call1b.tgz -delete; ls
