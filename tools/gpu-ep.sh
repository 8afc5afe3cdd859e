#!/bin/sh
# Expert parallelism on the GPUs of one host, through NCCL: one process a
# GPU (the head, rank 0, on device 0; worker r on device r). Through the
# device tool on a kind with two or more GPUs, from the repository root
# (tools/gpu-check.sh says how to make .devdeps):
#
#   run: sh tools/gpu-ep.sh [check] [bench] [big]     carry: .devdeps
#
# check  tests/engine/test_ep on cuda: ep = 2 (3 and 4 with as many GPUs)
#        bitwise the tokens of ep = 1, four sessions at once, prompt
#        lookup across the ranks; on the dummy test shape, then a worker killed and a worker
#        stopped mid-turn (the head fails the running turns within
#        ep_timeout, stays up and resumes when the worker is back) and a
#        worker refused; then the equality checks on the transformers test
#        models with experts and on the hybrid test shape (EP_MODELS, a
#        list of shapes or model directories, names others).
# bench  atlas bench on the qwen3-30b-a3b dummy shape, decode at batch 1, 8,
#        32 and 64 with ep = 1 and ep = 2 (and 4 with 4 GPUs), with the
#        collectives' time per step (ep-30b-a3b-N.csv).
# big    Qwen3-235B-A22B's layer shape in a number of layers that does not
#        fit one GPU (20 on 80 GB cards, 32 on larger ones) runs with
#        ep = 2 (ep-235b.csv).
# Nothing given: all three. Logs go to $OUT when it is set; the exit
# status is the number of failed parts.
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
cd "$src"
out=${OUT:-/tmp}
build=build-gpu
[ -f .devdeps/activate.sh ] && . .devdeps/activate.sh
# NVLink multicast stays off (it can take a shared host's GPUs down).
export NCCL_NVLS_ENABLE=0
# NCCL's own warnings (a peer gone, an abort) go to the logs.
export NCCL_DEBUG=WARN
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
gpus=$(nvidia-smi -L | wc -l)
[ "$gpus" -ge 2 ] || { echo "gpu-ep: needs two or more GPUs, this host has $gpus"; exit 99; }
git log -1 --format='commit %h %cd' 2>/dev/null || true
failed=0
part() { echo; echo "== $*"; }
[ $# -gt 0 ] || set -- check bench big

part build
[ -d $build ] || meson setup $build -Dcuda=enabled >"$out/setup.log" 2>&1 ||
	{ tail -30 "$out/setup.log"; exit 99; }
ninja -C $build tools/atlas appliance/atlasd tests/engine/test_ep >"$out/build.log" 2>&1 ||
	{ grep -E "error" "$out/build.log" | head -30; exit 99; }
atlasd=$build/appliance/atlasd
atlas=$build/tools/atlas

# A free loopback port for one group.
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# bounded SECONDS LOG CMD...: CMD with its output appended to LOG; if it is
# still running after SECONDS, the host stacks of it and of every atlasd
# worker go to LOG.stacks (cuda-gdb) before they are killed. Fails then.
bounded() {
	limit=$1 log=$2
	shift 2
	"$@" >>"$log" 2>&1 &
	pid=$! t=0
	while kill -0 $pid 2>/dev/null && [ $t -lt "$limit" ]; do sleep 1; t=$((t + 1)); done
	if kill -0 $pid 2>/dev/null; then
		echo "hung after $limit s: $*; stacks in ${log##*/}.stacks"
		for p in $pid $(pgrep -f "atlasd --worker"); do
			echo "=== $p: $(tr '\0' ' ' </proc/$p/cmdline | cut -c1-100)"
			timeout 30 cuda-gdb -p $p -batch -ex "thread apply all bt" 2>&1 |
				grep -E "^#|^Thread" | grep -v " in ?? ("
		done >>"$log.stacks"
		kill -9 $pid $(pgrep -f "atlasd --worker") 2>/dev/null
		wait $pid
		return 1
	fi
	wait $pid
}

check() {
	part "test_ep on cuda, $gpus GPUs: the dummy test shape, faults included"
	export ATLAS_TEST_BACKEND=cuda ATLAS_TEST_GPUS=$gpus
	if ! bounded 150 "$out/ep-check.log" $build/tests/engine/test_ep $atlasd; then
		failed=$((failed + 1))
		grep -E '^\[ *(RUN|OK|FAILED|  ERROR) |^ +[0-9.]+ s  ep|on cuda|aborting' "$out/ep-check.log"
		echo "the models' checks are left out: they would hang the same way"
		return
	fi
	grep -E '^\[ *(PASSED|FAILED|  ERROR|  SKIPPED) |on cuda|epoch .* ended|aborting' "$out/ep-check.log"
	for m in ${EP_MODELS:-tests/fidelity/models/qwen3moe_f32_v4 \
		tests/fidelity/models/qwen3moe_bf16_v5 tests/fidelity/models/qwen3next_f32 \
		tests/fidelity/models/qwen35moe_bf16 qwen3-next-test}; do
		part "test_ep on cuda: ${m##*/}"
		bounded 60 "$out/ep-check.log" $build/tests/engine/test_ep $atlasd $m ||
			failed=$((failed + 1))
		tail -n 200 "$out/ep-check.log" | grep -E '^\[ *(PASSED|FAILED|  ERROR) |on cuda'
	done
}

# bench SHAPE EP CSV [bench options]: atlas bench of a dummy shape with ep
# ranks, workers 1 .. EP-1 started here with the same keys.
bench() {
	shape=$1 ep=$2 csv=$3
	shift 3
	p=$(port)
	keys="load_format=dummy,model=qwen3-$shape,backend=cuda,ep=$ep,ep_address=127.0.0.1:$p"
	keys="$keys,ep_timeout=60,ep_join_timeout=300,max_batch=64,max_sessions=64"
	keys="$keys,chunk_size=2048,context=4096,kv_memory=8G,spec=off,log_level=warn"
	r=1 pids=""
	while [ $r -lt "$ep" ]; do
		$atlasd --worker $r -o "$keys,device=$r" >"$out/worker-$shape-$ep-$r.log" 2>&1 &
		pids="$pids $!"
		r=$((r + 1))
	done
	# atlas takes one key a -o.
	# A rank of 80 GB of dummy weights took over 60 s to load (H200, 2026-11-26,
	# while dummy values were remade after every norm).
	timeout 480 $atlas bench $(echo "$keys,device=0" | sed 's/^/-o /; s/,/ -o /g') \
		--csv-out "$out/$csv" "$@" || failed=$((failed + 1))
	[ -z "$pids" ] || { kill $pids; wait; } 2>/dev/null
}

if echo " $* " | grep -q " check "; then check; fi

if echo " $* " | grep -q " bench "; then
	eps="1 2"
	[ "$gpus" -ge 4 ] && eps="1 2 4"
	for ep in $eps; do
		part "bench qwen3-30b-a3b, ep = $ep"
		bench 30b-a3b $ep ep-30b-a3b-$ep.csv --dummy-weights --shape 30b-a3b \
			--batch 1,8,32,64 --prompt-tokens 2048 --context 0 --gen-tokens 128
	done
fi

if echo " $* " | grep -q " big "; then
	mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0)
	layers=20
	[ "$mem" -gt 100000 ] && layers=32
	# No ep = 1 run: it would load for minutes before its last weights
	# found no room. The report's per-rank weights, twice, against the
	# card's memory say that one GPU does not hold it.
	part "qwen3-235b-a22b-${layers}l with ep = 2 (one card has $mem MiB)"
	bench 235b-a22b-${layers}l 2 ep-235b.csv --dummy-weights --shape 235b-a22b-${layers}l \
		--batch 1,8,64 --prompt-tokens 512 --context 0 --gen-tokens 64
fi
exit $failed
