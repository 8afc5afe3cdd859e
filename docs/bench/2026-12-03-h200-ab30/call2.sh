#!/bin/sh
# sides: 0 = HEAD e291961, 1 = lm_head (wide rows, T <= 8) at NT = 2, 2 = at NT = 4; plus the gemv lab's tilebp2/4
set -u
out=$OUT
t0=$(date +%s)
P=.ab/nt2.patch,.ab/nt4.patch
. .devdeps/activate.sh
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $out/gpu.txt
timeout 240 sh tools/gpu-ab.sh $P build > $out/build.txt 2>&1 || { tail -40 $out/build.txt; cd $out && tar czf call2.tgz * && find . -type f ! -name call2.tgz -delete; exit 99; }
echo "build done at $(( $(date +%s) - t0 )) s"
timeout 60 nvcc -O3 -std=c++17 -arch=sm_90a -I. dev/cuda/gemv_lab.cu -lcublas -o /tmp/gemv_lab > $out/lab-build.txt 2>&1
timeout 90 /tmp/gemv_lab $out/lab.csv tileb,tilebp,tilebp2,tilebp4 > $out/lab.txt 2>&1; echo "lab rc $? at $(( $(date +%s) - t0 )) s"
grep -E "FAIL|151936|checks" $out/lab.txt
left=$(( 400 - ($(date +%s) - t0) ))
AB_BENCH="--prompt-tokens 16 --prefill-runs 1 --batch 1,8 --context 0 --gen-tokens 128" AB_ROUNDS=2 AB_BUDGET=$((left-15)) \
  timeout $left sh tools/gpu-ab.sh $P bench qwen3-0.6b > $out/bench.txt 2>&1; echo "bench rc $? at $(( $(date +%s) - t0 )) s"
cd $out && tar czf call2.tgz * && find . -type f ! -name call2.tgz -delete; ls
