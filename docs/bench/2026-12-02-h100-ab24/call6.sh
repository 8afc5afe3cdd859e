#!/bin/sh
# Call 6: the sampler's schedule change: the power lines on both shapes.
set -u
out=$OUT
. .devdeps/activate.sh
(meson setup build-gpu -Dcuda=enabled && ninja -C build-gpu) > $out/build.log 2>&1 || { tail -30 $out/build.log; exit 99; }
for s in 8b 0.6b; do
  build-gpu/tools/atlas bench --dummy-weights --arch qwen3 --shape $s -o log_level=warn \
    --prompt-tokens 8192 --prefill-runs 2 --batch 1 --context 0 --gen-tokens 128 > $out/sampler-$s.txt 2>&1
  grep -A1 -E "^prefill|^decode" $out/sampler-$s.txt
done
cd $out && tar czf call6.tgz sampler-*.txt && find . -type f ! -name call6.tgz -delete
