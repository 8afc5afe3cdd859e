#!/bin/sh
# The performance table of docs/perf.md: atlas bench with dummy weights of
# real shapes on the GPU. Through the device tool, from the repository root
# (after tools/gpu-check.sh has built build-gpu, or it builds it):
#
#   run: sh tools/gpu-bench.sh [SHAPE...]      carry: .devdeps
#
# SHAPE is an --arch/--shape pair as arch-shape (default: qwen3-0.6b
# qwen3-8b). Each shape prints its table and writes bench-SHAPE.csv to $OUT.
# chunk_size 2048: prompt chunks big enough for the tensor cores; the
# default of 256 suits a CPU.
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
cd "$src"
out=${OUT:-/tmp}
build=build-gpu
[ -f .devdeps/activate.sh ] && . .devdeps/activate.sh
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv,noheader
git log -1 --format='commit %h %cd' 2>/dev/null || true
if [ ! -x $build/tools/atlas ]; then
	meson setup $build -Dcuda=enabled >"$out/setup.log" 2>&1 || { tail -30 "$out/setup.log"; exit 99; }
	ninja -C $build >"$out/build.log" 2>&1 || { grep -E "error" "$out/build.log" | head -30; exit 99; }
fi
[ $# -gt 0 ] || set -- qwen3-0.6b qwen3-8b
failed=0
for s in "$@"; do
	echo
	$build/tools/atlas bench --dummy-weights --arch "${s%%-*}" --shape "${s#*-}" \
		-o chunk_size=2048 -o log_level=warn --csv-out "$out/bench-$s.csv" ||
		failed=$((failed + 1))
done
exit $failed
