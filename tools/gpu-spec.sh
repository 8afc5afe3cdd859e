#!/bin/sh
# The speculative decoding rows of docs/perf.md on the GPU. Through the
# device tool, from the repository root (after tools/gpu-check.sh has built
# build-gpu, or it builds it):
#
#   run: sh tools/gpu-spec.sh          carry: .devdeps
#
# 1. verify steps of 1..8 drafts beside a decode step, qwen3-8b shape with
#    dummy weights, at batch 1 and 32 (the executor alone);
# 2. the same for the qwen3-0.6b shape: the cost side of a draft model;
# 3. prompt lookup on the shipped model: the prompts of tools/spec-prompts
#    answered with speculation off and on.
# CSV goes to $OUT.
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
cd "$src"
out=${OUT:-/tmp}
build=build-gpu
[ -f .devdeps/activate.sh ] && . .devdeps/activate.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
git log -1 --format='commit %h %cd' 2>/dev/null || true
if [ ! -x $build/tools/atlas ]; then
	meson setup $build -Dcuda=enabled >"$out/setup.log" 2>&1 || { tail -30 "$out/setup.log"; exit 99; }
	ninja -C $build >"$out/build.log" 2>&1 || { grep -E "error" "$out/build.log" | head -30; exit 99; }
fi
failed=0
for s in 8b 0.6b; do
	echo
	echo "== verify, qwen3-$s"
	$build/tools/atlas bench --dummy-weights --shape $s -o log_level=warn \
		--verify 1,2,3,4,5,6,7,8 --verify-batch 1,32 --verify-context 512 \
		--csv-out "$out/verify-$s.csv" || failed=$((failed + 1))
done
echo
echo "== prompt lookup, the default model"
$build/tools/atlas bench -o backend=cuda -o log_level=warn --gen-tokens 256 \
	--spec-prompt tools/spec-prompts/list.txt --spec-prompt tools/spec-prompts/edit.txt \
	--spec-prompt tools/spec-prompts/free.txt || failed=$((failed + 1))
exit $failed
