#!/bin/bash
# The hybrid family on the GPU machine (issue: Gated DeltaNet): the delta
# rule's kernel lab, the op cases on cuda against the cpu, the hybrid
# engine checks on cuda, and the benchmark of the hybrid shapes. Through
# the device tool, from the repository root, after the build that
# tools/gpu-check.sh makes:
#
#   tools/gpu-hybrid.sh [ref] [lab] [ops] [engine] [bench]   (default: all)
#
# ref writes the transformers references (tools/ref/make_hybrid_models.py)
# to $OUT/models. Logs go to $OUT.
build=${BUILD:-build-gpu}
out=${OUT:-/tmp}
parts=${*:-ref lab ops engine bench}
failed=0
part() { echo; echo "== $*"; }
has() { [[ " $parts " == *" $1 "* ]]; }

if has ref; then
	part transformers references of the hybrid test models
	python3 tools/ref/make_hybrid_models.py --out "$out/models" >"$out/ref.log" 2>&1 ||
		failed=$((failed + 1))
	tail -25 "$out/ref.log"
fi
if has lab; then
	part the delta rule lab: recurrent and chunked kernels against float64, timed
	nvcc -O3 -std=c++17 -arch=sm_90a -I. dev/cuda/delta_rule_bench.cu -o /tmp/delta_rule_bench &&
		/tmp/delta_rule_bench >"$out/lab.log" 2>&1 || failed=$((failed + 1))
	tail -40 "$out/lab.log"
fi
if has ops; then
	part op cases on cuda against the cpu
	$build/tests/ops/test_ops cuda >"$out/ops.log" 2>&1 || failed=$((failed + 1))
	grep -E "FAIL|fail|mismatch|passed|cases" "$out/ops.log" | tail -30
fi
if has engine; then
	part hybrid engine checks on cuda
	ATLAS_TEST_BACKEND=cuda $build/tests/engine/test_hybrid >"$out/hybrid-cuda.log" 2>&1 ||
		failed=$((failed + 1))
	grep -E '^\[ *(OK|PASSED|FAILED|  ERROR) |drafts|error' "$out/hybrid-cuda.log"
fi
if has bench; then
	for s in qwen3-next-80b-a3b-20l qwen3.5-35b-a3b-32l; do
		part bench $s
		$build/tools/atlas bench --dummy-weights --arch "${s%%-*}" --shape "${s#*-}" \
			-o chunk_size=2048 -o log_level=warn --prompt-tokens 8192 --gen-tokens 32 \
			--batch 1,64 --context 0 --csv-out "$out/bench-$s.csv" ||
			failed=$((failed + 1))
	done
fi
exit $failed
