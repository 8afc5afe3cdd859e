#!/bin/sh
# Call 5: chunk_size = 0 (the default) on cuda: what the engine says it
# runs, and the prefill of 8,192 at it, on both shapes.
set -u
out=$OUT
. .devdeps/activate.sh
(meson setup build-gpu -Dcuda=enabled && ninja -C build-gpu) > $out/build.log 2>&1 || { tail -30 $out/build.log; exit 99; }
A=build-gpu/tools/atlas
for s in 8b 0.6b; do
  $A bench --dummy-weights --arch qwen3 --shape $s -o log_level=info \
    --prompt-tokens 8192 --prefill-runs 2 --batch 1 --context 0 --gen-tokens 4 > $out/auto-chunk-$s.txt 2>&1
  grep -E "chunks of|^prefill" -A1 $out/auto-chunk-$s.txt
done
$A config --defaults | grep "^chunk_size"
cd $out && tar czf call5.tgz auto-*.txt && find . -type f ! -name call5.tgz -delete
