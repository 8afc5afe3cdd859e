#!/bin/sh
# call 1: labs (old/new/variants) beside the build, the wide op case, same, prefill bench
t0=$(date +%s)
P=.ab/1.patch
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $OUT/r/gpu.txt
( for v in old new NOSEEN NOSKIP; do s=$(date +%s); timeout 150 ./.ab/lab-$v > $OUT/r/lab-$v.txt 2>&1; echo "lab-$v rc=$? $(( $(date +%s) - s )) s" >> $OUT/r/times.txt; done ) &
lab=$!
sh tools/gpu-ab.sh $P build > $OUT/r/build.txt 2>&1; brc=$?
echo "build rc=$brc at $(( $(date +%s) - t0 )) s" >> $OUT/r/times.txt
wait $lab
echo "labs done at $(( $(date +%s) - t0 )) s" >> $OUT/r/times.txt
if [ $brc -eq 0 ]; then
  timeout 120 build-gpu/tests/ops/test_ops -v cuda attention > $OUT/r/ops-attention.txt 2>&1
  echo "ops-attention rc=$? at $(( $(date +%s) - t0 )) s" >> $OUT/r/times.txt
  sh tools/gpu-ab.sh $P same > $OUT/r/same.txt 2>&1
  echo "same rc=$? at $(( $(date +%s) - t0 )) s" >> $OUT/r/times.txt
  b=$(( 560 - ($(date +%s) - t0) ))
  AB_BENCH="--prompt-tokens 2048,8192 --prefill-runs 2 --batch 1,64 --context 0 --gen-tokens 32" AB_BUDGET=$b sh tools/gpu-ab.sh $P bench qwen3-8b qwen3-0.6b > $OUT/r/bench.txt 2>&1
  echo "bench rc=$? at $(( $(date +%s) - t0 )) s" >> $OUT/r/times.txt
fi
cd $OUT && mv *.tgz *.txt *.log r/ 2>/dev/null; tar czf all.tgz r && rm -rf r && ls -la $OUT
