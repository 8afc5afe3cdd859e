#!/bin/sh
# call 3: three sides (HEAD; the mask skip everywhere; the skip in prefill only), same, decode bench
t0=$(date +%s)
P=.ab/1.patch,.ab/2.patch
mkdir -p $OUT/r
sh tools/gpu-ab.sh $P build > $OUT/r/build.txt 2>&1; brc=$?
echo "build rc=$brc at $(( $(date +%s) - t0 )) s" >> $OUT/r/times.txt
if [ $brc -eq 0 ]; then
  sh tools/gpu-ab.sh $P same > $OUT/r/same.txt 2>&1
  echo "same rc=$? at $(( $(date +%s) - t0 )) s" >> $OUT/r/times.txt
  b=$(( 390 - ($(date +%s) - t0) ))
  AB_BENCH="--prompt-tokens 16 --prefill-runs 1 --batch 1,8 --context 0 --gen-tokens 128" AB_BUDGET=$b sh tools/gpu-ab.sh $P bench qwen3-0.6b qwen3-8b > $OUT/r/bench.txt 2>&1
  echo "bench rc=$? at $(( $(date +%s) - t0 )) s" >> $OUT/r/times.txt
fi
cd $OUT && mv *.tgz *.txt *.log r/ 2>/dev/null; rm -f *.f32; tar czf all.tgz r && rm -rf r && ls -la $OUT
