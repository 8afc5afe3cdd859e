#!/bin/sh
# On a machine with an NVIDIA GPU: build with the CUDA backend and check the
# whole engine on it. Through the device tool, from the repository root:
#
#   ../shared/gpu/prep-deps libfuse3-3 libfuse3-dev fuse3 liburing2 liburing-dev \
#       libjansson4 libjansson-dev libonig5 libonig-dev libinih1 libinih-dev \
#       libxxhash0 libxxhash-dev \
#       libutf8proc2 libutf8proc-dev libcmocka0 libcmocka-dev       (here, once)
#   run: sh tools/gpu-check.sh          carry: .devdeps
#
# 1. meson test, every suite: backend = auto picks the GPU wherever a test
#    opens the engine with the defaults (cli, fs/test_atlasd.sh,
#    default_model; the other fs tests pin the cpu backend), and the gpu
#    suite (ops-cuda: tests/ops/test_ops cuda) checks every op case on cuda
#    against the cpu backend;
# 2. the engine invariants (tests/engine: test_engine, test_swap for the
#    KV swap tier, test_persist for kept sessions) with
#    ATLAS_TEST_BACKEND=cuda, on each of the five
#    transformers test models and the one with an MTP head, test_spec
#    (speculative decoding, every drafter) on one,
#    and the scripted family's
#    forward pass (tests/model/test_script.c) on cuda;
# 3. the transformers goldens through the cuda backend (tools/ref/compare_logits.py);
# 4. atlas bench on the default model.
# Logs go to $OUT when it is set. The exit status is the number of failed parts.
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
cd "$src"
out=${OUT:-/tmp}
build=build-gpu
[ -f .devdeps/activate.sh ] && . .devdeps/activate.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
failed=0
part() { echo; echo "== $*"; }

part build
[ -d $build ] || meson setup $build -Dcuda=enabled >"$out/setup.log" 2>&1 || { tail -30 "$out/setup.log"; exit 99; }
ninja -C $build >"$out/build.log" 2>&1 || { grep -E "error" "$out/build.log" | head -30; exit 99; }

part meson test
# The suites whose tests open the GPU run one test at a time: cli-bench
# failed twice beside the others (H100, 2026-11-24) and passed alone six
# times of six and beside a process holding 67 GB; the cause is not found.
meson test -C $build --no-rebuild --num-processes 4 --print-errorlogs --no-suite cli \
	--no-suite fs --no-suite gpu >"$out/test.log" 2>&1 || failed=$((failed + 1))
cp $build/meson-logs/testlog.txt "$out/testlog.txt"
meson test -C $build --no-rebuild --num-processes 1 --print-errorlogs --suite cli --suite fs \
	--suite gpu >>"$out/test.log" 2>&1 || failed=$((failed + 1))
cat $build/meson-logs/testlog.txt >>"$out/testlog.txt"
grep -E "^ *[0-9]+/[0-9]+ " "$out/test.log" | grep -vE " OK | SKIP "
grep -E "^(Ok|Fail|Skipped|Timeout):" "$out/test.log"

part engine invariants on cuda, every fidelity model
for m in tests/fidelity/models/*/; do
	m=${m%/}
	ATLAS_TEST_BACKEND=cuda $build/tests/engine/test_engine "$m" \
		>"$out/engine-cuda-${m##*/}.log" 2>&1 || failed=$((failed + 1))
	echo "${m##*/}: $(grep -E '^\[ *(PASSED|FAILED|  ERROR) ' "$out/engine-cuda-${m##*/}.log" | tr '\n' ' ')"
	ATLAS_TEST_BACKEND=cuda $build/tests/engine/test_swap "$m" \
		>"$out/swap-cuda-${m##*/}.log" 2>&1 || failed=$((failed + 1))
	echo "${m##*/} swap: $(grep -E '^\[ *(PASSED|FAILED|  ERROR) ' "$out/swap-cuda-${m##*/}.log" | tr '\n' ' ')"
	# kv_persist does not keep recurrent states: hybrid models refuse it.
	grep -q linear_attention "$m/config.json" && continue
	ATLAS_TEST_BACKEND=cuda $build/tests/engine/test_persist "$m" \
		>"$out/persist-cuda-${m##*/}.log" 2>&1 || failed=$((failed + 1))
	echo "${m##*/} persist: $(grep -E '^\[ *(PASSED|FAILED|  ERROR) ' "$out/persist-cuda-${m##*/}.log" | tr '\n' ' ')"
done

part speculative decoding on cuda
ATLAS_TEST_BACKEND=cuda $build/tests/engine/test_spec tests/fidelity/models/qwen3_f32_gqa_tied \
	tests/fidelity/models/qwen3_f16_gqa_sharded tests/fidelity/models/qwen3_bf16_mha_untied \
	tests/fidelity/models/qwen3_f32_mtp >"$out/spec-cuda.log" 2>&1 || failed=$((failed + 1))
grep -E '^\[ *(PASSED|FAILED|  ERROR) |accepted|chi-square|decode step|vocab' "$out/spec-cuda.log"

# (test_mtp stays on the cpu: it wants a fresh drafter's drafts bit for bit.)
part hybrid family on cuda: batches, rollback through the recurrent state
ATLAS_TEST_BACKEND=cuda $build/tests/engine/test_hybrid >"$out/hybrid-cuda.log" 2>&1 ||
	failed=$((failed + 1))
grep -E '^\[ *(PASSED|FAILED|  ERROR) |drafts' "$out/hybrid-cuda.log"

part scripted family on cuda
ATLAS_TEST_BACKEND=cuda $build/tests/model/test_model_script tests/fs/script-model \
	>"$out/script-cuda.log" 2>&1 || failed=$((failed + 1))
grep -E '^\[ *(PASSED|FAILED|  ERROR) ' "$out/script-cuda.log"

# The cuda backend multiplies bf16 weights by bf16-rounded activations and
# keeps K and V in bf16: transformers' own bf16 run differs from its float32
# run by up to 0.18 on these models, and the cuda backend measured 0.087 to
# 0.15 with f32 KV (H100, 2026-11-22).
part transformers goldens on cuda
# Models with experts get 2.5: qwen3next_f32 (f32 weights rounded to bf16
# here; its smallest router gap in transformers' run is 0.2 %) differs by
# up to 2.01 with every argmax and greedy token equal (H100, 2026-11-24);
# the same weights rounded to bf16 on the cpu give 0.28.
python3 tools/ref/compare_logits.py --atlas $build/tools/atlas --backend cuda --tol 0.25 \
	--moe-tol 2.5 ||
	failed=$((failed + 1))

part bench: the default model on cuda
$build/tools/atlas bench -o backend=cuda -o log_level=warn --prompt-tokens 128,512,2048 \
	--gen-tokens 64 --batch 1,8,32 --context 4096 --context-batch 1,8 || failed=$((failed + 1))
exit $failed
