#!/bin/sh
# HEAD e291961: check (test_engine on cuda with the new topk_kernel), then greedy/sampled traces of 0.6B b1
set -u
out=$OUT
t0=$(date +%s)
P=.ab/topk.patch
. .devdeps/activate.sh
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $out/gpu.txt
timeout 240 sh -c 'meson setup build-gpu -Dcuda=enabled > /dev/null && ninja -C build-gpu' > $out/build.txt 2>&1 || { tail -30 $out/build.txt; cd $out && tar czf call1.tgz * && find . -type f ! -name call1.tgz -delete; exit 99; }
echo "build done at $(( $(date +%s) - t0 )) s"
timeout 150 sh tools/gpu-ab.sh $P check > $out/check.txt 2>&1; echo "check rc $? at $(( $(date +%s) - t0 )) s"; cat $out/check.txt
AB_TRACE_SIDES=1 AB_TRACE_BENCH="--prompt-tokens 16 --prefill-runs 1 --batch 1 --context 0 --gen-tokens 64" \
  timeout 40 sh tools/gpu-ab.sh $P trace qwen3-0.6b > $out/trace.txt 2>&1; echo "trace rc $? at $(( $(date +%s) - t0 )) s"
mv $out/ab-trace.tgz $out/trace-greedy.tgz
AB_TRACE_SIDES=1 AB_TRACE_BENCH="--prompt-tokens 16 --prefill-runs 1 --batch 8 --context 0 --gen-tokens 64" \
  timeout 40 sh tools/gpu-ab.sh $P trace qwen3-0.6b > $out/trace8.txt 2>&1; echo "trace8 rc $? at $(( $(date +%s) - t0 )) s"
mv $out/ab-trace.tgz $out/trace-greedy-b8.tgz
cd $out && tar czf call1.tgz * && find . -type f ! -name call1.tgz -delete; ls
