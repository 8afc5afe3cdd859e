#!/bin/sh
# sides: 0 = 8f3d19d, 1 = 3832961 (draw, mapped requests), 2 = requests copied to the device
set -u
out=$OUT
t0=$(date +%s)
P=.ab/draw.patch,.ab/dev.patch
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $out/gpu.txt
timeout 200 sh tools/gpu-ab.sh $P build > $out/build.txt 2>&1 || { tail -40 $out/build.txt; cd $out && tar czf call2.tgz * && find . -type f ! -name call2.tgz -delete; exit 99; }
echo "build done at $(( $(date +%s) - t0 )) s"
mkdir -p $out/s
OUT=$out/s timeout 200 sh tools/gpu-ab.sh $P same > $out/same.txt 2>&1; echo "same rc $? at $(( $(date +%s) - t0 )) s"; grep -ci "equal" $out/same.txt; grep -i "DIFFERENT\|FAILED\|cases on\|PASSED" $out/same.txt | tail -8
rm -f $out/s/*.f32 $out/s/greedy* $out/s/top-*
AB_TRACE_BENCH="--prompt-tokens 16 --prefill-runs 3 --batch 1,8 --context 0 --gen-tokens 64 --temperature 0.7 --top-p 0.9 --top-k 40" \
  timeout 90 sh tools/gpu-ab.sh $P trace qwen3-0.6b > $out/trace.txt 2>&1; echo "trace rc $? at $(( $(date +%s) - t0 )) s"
left=$(( 400 - ($(date +%s) - t0) ))
AB_BENCH="--prompt-tokens 16 --prefill-runs 3 --batch 1,8,64 --context 0 --gen-tokens 128 --temperature 0.7 --top-p 0.9 --top-k 40" AB_ROUNDS=2 AB_BUDGET=$((left-15)) \
  timeout $left sh tools/gpu-ab.sh $P bench qwen3-0.6b > $out/bench.txt 2>&1; echo "bench rc $? at $(( $(date +%s) - t0 )) s"
cd $out && tar czf call2.tgz * && find . -type f ! -name call2.tgz -delete; ls
