#!/bin/sh
# The performance table of docs/perf.md: atlas bench with dummy weights of
# real shapes on the GPU. Through the device tool, from the repository root
# (after tools/gpu-check.sh has built build-gpu, or it builds it):
#
#   run: sh tools/gpu-bench.sh [SHAPE...]      carry: .devdeps
#
# SHAPE is an --arch/--shape pair as arch-shape (default: qwen3-0.6b
# qwen3-8b). Each shape prints its table and writes bench-SHAPE.csv to $OUT;
# a dense Qwen3 shape then has its peer measured the same way
# (tools/peer/bench-transformers.py, peer-SHAPE.csv; PEER=0 leaves it out).
# tools/plot-bench.py draws the two and the bound from the CSVs.
# SHAPE `spec` makes the speculative decoding tables instead: verify steps
# of 1..8 drafts beside a decode step for the qwen3-8b and qwen3-0.6b
# shapes at batch 1 and 32 (verify-SHAPE.csv), the qwen3-0.6b shape as the
# draft model of the qwen3-8b one (verify-draft.csv, and decode rows with
# spec draft against off), and prompt lookup on the default model with the
# prompts of tools/spec-prompts. SHAPE `spec-rule` makes the 3 % rule's
# table: decode rows with spec off and auto, twice (the rounds show the
# noise of such short runs).
# chunk_size 2048: prompt chunks big enough for the tensor cores, what
# chunk_size = 0 (the default) picks on a GPU; given here so that the
# tables stay comparable whatever the default.
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
spec() {
	for s in 8b 0.6b; do
		echo
		echo "== verify, qwen3-$s"
		$build/tools/atlas bench --dummy-weights --shape $s -o log_level=warn \
			--verify 1,2,3,4,5,6,7,8 --verify-batch 1,32 --verify-context 512 \
			--csv-out "$out/verify-$s.csv" || failed=$((failed + 1))
	done
	echo
	echo "== draft model qwen3-0.6b for qwen3-8b: its decode step, verify plus k of them"
	$build/tools/atlas bench --dummy-weights --shape 8b -o log_level=warn \
		-o draft_model=qwen3-0.6b --verify 1,2,4,8 --verify-batch 1,32 \
		--verify-context 512 --csv-out "$out/verify-draft.csv" || failed=$((failed + 1))
	echo
	echo "== draft model in the engine (dummy weights: acceptance means nothing; the cost)"
	for m in off draft; do
		$build/tools/atlas bench --dummy-weights --shape 8b -o log_level=warn \
			-o draft_model=qwen3-0.6b -o spec_gate=false -o spec_k=4 --spec $m \
			--prompt-tokens 512 --batch 1,32 --context 0 --gen-tokens 64 \
			|| failed=$((failed + 1))
	done
	echo
	echo "== prompt lookup, the default model"
	$build/tools/atlas bench -o backend=cuda -o log_level=warn --gen-tokens 256 \
		--spec-prompt tools/spec-prompts/list.txt --spec-prompt tools/spec-prompts/edit.txt \
		--spec-prompt tools/spec-prompts/free.txt || failed=$((failed + 1))
}
# The 3 % rule: decode rows with speculation off and auto (the gate as
# shipped) on the default model and the qwen3-8b shape.
spec_rule() {
	for round in 1 2; do
		for m in off auto; do
			echo
			echo "== round $round, spec $m, the default model"
			$build/tools/atlas bench -o backend=cuda -o log_level=warn --spec $m \
				--prompt-tokens 128 --batch 1,8,32 --context 0 --gen-tokens 512 \
				|| failed=$((failed + 1))
			echo "== round $round, spec $m, qwen3-8b"
			$build/tools/atlas bench --dummy-weights --shape 8b -o log_level=warn \
				--spec $m --prompt-tokens 128 --batch 1,32 --context 0 \
				--gen-tokens 128 || failed=$((failed + 1))
		done
	done
}
for s in "$@"; do
	if [ "$s" = spec ]; then
		spec
		continue
	fi
	if [ "$s" = spec-rule ]; then
		spec_rule
		continue
	fi
	echo
	$build/tools/atlas bench --dummy-weights --arch "${s%%-*}" --shape "${s#*-}" \
		-o chunk_size=2048 -o log_level=warn --csv-out "$out/bench-$s.csv" ||
		failed=$((failed + 1))
	# The peer in the same call: transformers on the dense Qwen3 shapes.
	case $s in
	qwen3-0.6b | qwen3-1.7b | qwen3-4b | qwen3-8b)
		[ "${PEER:-1}" = 0 ] && continue
		echo
		echo "== the peer: transformers, $s"
		python3 tools/peer/bench-transformers.py --shape "${s#*-}" \
			--csv-out "$out/peer-$s.csv" || failed=$((failed + 1))
		;;
	esac
done
exit $failed
