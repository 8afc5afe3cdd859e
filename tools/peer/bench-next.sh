#!/bin/sh
# atlas beside llama.cpp on the default model, on this CPU, same threads, in
# one run (tools/peer/README.md):
#   tools/peer/bench-next.sh LLAMA_BIN_DIR [MODEL_DIR] [ATLAS_BIN]
# LLAMA_BIN_DIR holds llama-bench and llama-batched-bench. Converts
# MODEL_DIR (default models/atlas-next) to GGUF bf16 and f32 under
# ${TMPDIR:-/tmp}/atlas-peer, then prints llama-bench (prefill 128 and 1024,
# decode at depth 32 and 4096), llama-batched-bench at batch 1 and 4, and
# atlas bench on the same sizes with cpu_precision bf16 and f32.
set -eu
bin=$1
mdl=${2:-models/atlas-next}
atlas=${3:-build/tools/atlas}
here=$(cd "$(dirname "$0")" && pwd)
t=$(nproc)
out=${TMPDIR:-/tmp}/atlas-peer
mkdir -p "$out"
for ft in bf16 f32; do
	g="$out/$(basename "$mdl")-$ft.gguf"
	[ -f "$g" ] || /usr/bin/python3 "$here/gguf_next.py" "$mdl" "$g" $ft >/dev/null
	echo "== llama.cpp $ft"
	"$bin/llama-bench" -m "$g" -t "$t" -r 3 -p 128,1024 -n 0
	"$bin/llama-bench" -m "$g" -t "$t" -r 3 -p 0 -n 128 -d 32,4096
	"$bin/llama-batched-bench" -m "$g" -t "$t" -c 8192 -npp 32 -ntg 128 -npl 1,4 \
		2>/dev/null | grep -E '^\|'
done
for p in bf16 f32; do
	echo "== atlas cpu_precision=$p"
	"$atlas" bench --model "$mdl" -o threads="$t" -o cpu_precision=$p -o log_level=warn \
		--prompt-tokens 128,1024 --gen-tokens 128 --batch 1,4 --context 4096 \
		--context-batch 1
done
