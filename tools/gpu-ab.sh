#!/bin/sh
# One change before and after, on one GPU machine: the working tree is
# "after", a copy of it with PATCH reversed is "before". Through the device
# tool, from the repository root, with the patch in an ignored folder:
#
#   git diff BASE HEAD -- kernels engine > .ab/change.patch     (here)
#   run: sh tools/gpu-ab.sh .ab/change.patch build   carry: .devdeps .ab
#   run: sh tools/gpu-ab.sh .ab/change.patch same    (the same warm machine)
#   run: sh tools/gpu-ab.sh .ab/change.patch bench SHAPE...
#
# build: both trees with the CUDA backend (build-gpu here, and
#        $AB_BEFORE/build-gpu, /tmp/atlas-before by default), side by side.
# same:  whether the change keeps every result: on each model of AB_MODELS
#        (tests/fidelity/models), the logits of a prompt of 8 tokens (the
#        GEMV path) and of 40 (cuBLAS), and 32 greedy tokens, compared bit
#        for bit between the two builds on cuda; then the op cases on cuda
#        (test_ops) and the speculative decoding invariants (test_spec, the
#        MTP head's forward pass too) of the after build.
# bench: atlas bench on each SHAPE (arch-shape, qwen3-0.6b by default),
#        before, after, before, after: the second round shows the drift of
#        the machine. CSVs to $OUT as ab-SHAPE-{before,after}-{1,2}.csv.
#
# A machine keeps /tmp and ignored build folders between calls while it is
# warm; a cold one needs build again. Exit status: the number of failures.
set -u
patch=${1:?usage: gpu-ab.sh PATCH build|same|bench [SHAPE...]}
phase=${2:?usage: gpu-ab.sh PATCH build|same|bench [SHAPE...]}
shift 2
src=$(cd "$(dirname "$0")/.." && pwd)
cd "$src"
out=${OUT:-/tmp}
before=${AB_BEFORE:-/tmp/atlas-before}
models=${AB_MODELS:-qwen3_bf16_mha_untied qwen3_f32_mtp qwen3moe_bf16_v5 llama_f32_gqa_llama3_bias}
[ -f .devdeps/activate.sh ] && . .devdeps/activate.sh
failed=0

build_tree() {
	(cd "$1" && { [ -d build-gpu ] || meson setup build-gpu -Dcuda=enabled; } &&
		ninja -C build-gpu) >"$out/build-$2.log" 2>&1 ||
		{ grep -E "error" "$out/build-$2.log" | head -20; return 1; }
}

case $phase in
build)
	nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
	rm -rf "$before"
	mkdir -p "$before"
	tar cf - --exclude=./build-gpu --exclude=./.ab --exclude=./.train-data . |
		tar xf - -C "$before"
	(cd "$before" && patch -R -p1 -s) <"$patch" || { echo "gpu-ab: $patch does not reverse"; exit 99; }
	build_tree "$before" before &
	pid=$!
	build_tree . after || failed=$((failed + 1))
	wait $pid || failed=$((failed + 1))
	echo "built: before $(ls "$before"/build-gpu/tools/atlas) after $(ls build-gpu/tools/atlas)"
	;;
same)
	short=1,2,3,4,5,6,7,8
	long=$(seq -s, 11 50)
	for m in $models; do
		d=tests/fidelity/models/$m
		for side in before after; do
			b=build-gpu
			[ $side = before ] && b=$before/build-gpu
			for seq in short long; do
				eval ids=\$$seq
				$b/tools/atlas logits --model $d --tokens "$ids" -o backend=cuda \
					-o log_level=warn --out "$out/logits-$m-$seq-$side.f32" ||
					failed=$((failed + 1))
			done
			$b/tools/atlas generate --model $d --mode raw --temperature 0 --max-tokens 32 \
				--tokens 5,6,7 --ids -o backend=cuda -o log_level=warn \
				>"$out/greedy-$m-$side.txt" 2>&1 || failed=$((failed + 1))
		done
		for f in logits-$m-short logits-$m-long; do
			cmp -s "$out/$f-before.f32" "$out/$f-after.f32" &&
				echo "$f: equal" || { echo "$f: DIFFERENT"; failed=$((failed + 1)); }
		done
		cmp -s "$out/greedy-$m-before.txt" "$out/greedy-$m-after.txt" &&
			echo "greedy-$m: equal" || { echo "greedy-$m: DIFFERENT"; failed=$((failed + 1)); }
	done
	build-gpu/tests/ops/test_ops cuda >"$out/ops-cuda.log" 2>&1 || failed=$((failed + 1))
	tail -n 12 "$out/ops-cuda.log"
	ATLAS_TEST_BACKEND=cuda build-gpu/tests/engine/test_spec tests/fidelity/models/qwen3_f32_mtp \
		tests/fidelity/models/qwen3_bf16_mha_untied >"$out/spec-cuda.log" 2>&1 ||
		failed=$((failed + 1))
	grep -E '^\[ *(PASSED|FAILED|  ERROR) ' "$out/spec-cuda.log"
	;;
bench)
	[ $# -gt 0 ] || set -- qwen3-0.6b
	for s in "$@"; do
		for round in 1 2; do
			for side in before after; do
				b=build-gpu
				[ $side = before ] && b=$before/build-gpu
				echo
				echo "== $s, $side, round $round"
				$b/tools/atlas bench --dummy-weights --arch "${s%%-*}" --shape "${s#*-}" \
					-o chunk_size=2048 -o log_level=warn \
					--csv-out "$out/ab-$s-$side-$round.csv" || failed=$((failed + 1))
			done
		done
	done
	;;
*)
	echo "gpu-ab.sh: unknown phase $phase" >&2
	exit 2
	;;
esac
exit $failed
