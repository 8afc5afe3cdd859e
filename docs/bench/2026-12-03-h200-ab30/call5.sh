#!/bin/sh
# sides: 0 = f884f52, 1 = the engine delivers notifications while the device runs the step (exec_launch / exec_finish)
set -u
out=$OUT
t0=$(date +%s)
P=.ab/notify.patch
. .devdeps/activate.sh
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $out/gpu.txt
timeout 150 sh tools/gpu-ab.sh $P build > $out/build.txt 2>&1 || { tail -40 $out/build.txt; cd $out && tar czf call5.tgz * && find . -type f ! -name call5.tgz -delete; exit 99; }
echo "build done at $(( $(date +%s) - t0 )) s"
AB_BENCH="--prompt-tokens 16 --prefill-runs 1 --batch 1,8,64 --context 0 --gen-tokens 128" AB_ROUNDS=2 AB_BUDGET=160 \
  timeout 180 sh tools/gpu-ab.sh $P bench qwen3-0.6b > $out/bench.txt 2>&1; echo "bench rc $? at $(( $(date +%s) - t0 )) s"
timeout 70 sh tools/gpu-ab.sh $P check > $out/check.txt 2>&1; echo "check rc $? at $(( $(date +%s) - t0 )) s"; cat $out/check.txt
cd $out && tar czf call5.tgz * && find . -type f ! -name call5.tgz -delete; ls
