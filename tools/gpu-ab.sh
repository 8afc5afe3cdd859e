#!/bin/sh
# Changes measured before and after, on one GPU machine. The working tree
# is the last side; each side before it has one more of the PATCHES
# reversed (PATCHES: files of `git diff` output, comma separated, oldest
# change first). Through the device tool, from the repository root, with
# the patches in an ignored folder:
#
#   git diff A B -- kernels engine tests/ops > .ab/1.patch         (here)
#   git diff B HEAD -- kernels engine tests/ops > .ab/2.patch
#   run: sh tools/gpu-ab.sh .ab/1.patch,.ab/2.patch build    carry: .devdeps .ab
#   run: sh tools/gpu-ab.sh .ab/1.patch,.ab/2.patch same     (the same warm machine)
#   run: sh tools/gpu-ab.sh .ab/1.patch,.ab/2.patch bench SHAPE...
#
# A machine is seldom still warm for a second call, so one call usually
# runs the phases one after another:
#
#   run: P=.ab/1.patch,.ab/2.patch; sh tools/gpu-ab.sh $P build &&
#        { sh tools/gpu-ab.sh $P same; sh tools/gpu-ab.sh $P trace qwen3-8b;
#          AB_BUDGET=420 sh tools/gpu-ab.sh $P bench qwen3-0.6b qwen3-8b; }
#
# build: every side with the CUDA backend, side by side (side 0, all the
#        patches reversed, in $AB_DIR/0; the working tree's own build-gpu
#        is the last side).
# same:  whether the changes keep every result: on each model of AB_MODELS
#        (tests/fidelity/models), the logits of a prompt of 1 token (the
#        one-row paths), 8 (the GEMV) and 40 (cuBLAS), and 32 greedy tokens, compared bit
#        for bit between side 0 and the last side (AB_SIDE: that side) on cuda; the same
#        on random weights of each published shape of AB_SAME_SHAPES (qwen3-0.6b
#        by default: heads of 128 dims, which the test models lack), the 4
#        highest logits of each position of a prompt of 4,096 and 32 greedy
#        tokens after 2,100, in chunks of 2,048, and 64 greedy tokens after
#        100; then the op cases
#        on cuda (test_ops), the speculative decoding invariants
#        (test_spec, the MTP head's forward pass too) and the engine's
#        (test_engine, on each model) of the last side.
# check: those tests alone, without the comparisons (about 60 s): for a
#        change that moves no model's output, such as sampling's kernels.
# bench: atlas bench on each SHAPE (arch-shape, qwen3-0.6b by default) with
#        AB_BENCH's options, every side in turn, AB_ROUNDS times (2: the
#        second round shows the drift of the machine). CSVs
#        ab-SHAPE-SIDE-ROUND.csv, packed into $OUT/ab-bench.tgz (the device
#        tool returns only a few files of a call; tools/ab-medians.py prints
#        their medians side against side). With AB_LAST_EXTRA (options such as
#        "-o cuda_pdl=false"), the last side runs once more with them in
#        each round, as side "Nx" (a change that a key turns off, measured
#        on and off in one build). A round runs every SHAPE on every
#        side, so the rounds interleave all of them; with AB_BUDGET
#        (seconds from the phase's start) rounds go on past AB_ROUNDS
#        while one more, as long as the last, would end within it.
#        Beside the rounds, nvidia-smi samples the SM clock, the power and
#        the throttle reasons every 100 ms (power.csv) and each bench's
#        start and end are written to marks.txt, both in ab-bench.tgz:
#        tools/ab-power.py prints them side against side, over each run's
#        busy samples (whether a side's gain is spread over a power-capped
#        step: Qwen3-8B's prefill is, on an H200).
# trace: a CUPTI trace (dev/prof/kernel_trace.c) of one atlas bench of
#        each SHAPE on each side (AB_TRACE_SIDES: a list of sides, all by
#        default) with AB_TRACE_BENCH's options (a prefill of 8,192 twice
#        and a few decode steps by default): $out/trace-SHAPE-SIDE.txt,
#        the breakdown of the steps of the most kernels (the prefill; the
#        CSVs, packed into $out/ab-trace.tgz, hold the others).
#
# A machine keeps /tmp and ignored build folders between calls while it is
# warm; a cold one needs build again. Exit status: the number of failures.
set -u
patches=${1:?usage: gpu-ab.sh PATCH[,PATCH...] build|same|check|bench|trace [SHAPE...]}
phase=${2:?usage: gpu-ab.sh PATCH[,PATCH...] build|same|check|bench|trace [SHAPE...]}
shift 2
src=$(cd "$(dirname "$0")/.." && pwd)
cd "$src"
out=${OUT:-/tmp}
dir=${AB_DIR:-/tmp/atlas-ab}
models=${AB_MODELS:-qwen3_bf16_mha_untied qwen3_f32_mtp qwen3moe_bf16_v5 llama_f32_gqa_llama3_bias}
bench_opts=${AB_BENCH:---prompt-tokens 2048,8192 --batch 1,8,64 --context 0 --gen-tokens 128}
trace_opts=${AB_TRACE_BENCH:---prompt-tokens 8192 --prefill-runs 2 --batch 1 --context 0 --gen-tokens 16}
[ -f .devdeps/activate.sh ] && . .devdeps/activate.sh
n=$(echo "$patches" | tr ',' '\n' | wc -l)
failed=0

# The source folder of side i (0 .. n).
side_dir() {
	if [ "$1" -eq "$n" ]; then echo "$src"; else echo "$dir/$1"; fi
}

build_side() {
	(cd "$(side_dir "$1")" && { [ -d build-gpu ] || meson setup build-gpu -Dcuda=enabled; } &&
		ninja -C build-gpu) >"$out/build-$1.log" 2>&1 ||
		{ grep -E "error" "$out/build-$1.log" | head -20; return 1; }
}

# The op cases on cuda, test_spec and test_engine (on each model) of the
# working tree's build (the last side).
run_tests() {
	build-gpu/tests/ops/test_ops cuda >"$out/ops-cuda.log" 2>&1 || failed=$((failed + 1))
	grep -E "FAILED|cases on" "$out/ops-cuda.log"
	ATLAS_TEST_BACKEND=cuda build-gpu/tests/engine/test_spec tests/fidelity/models/qwen3_f32_gqa_tied \
		tests/fidelity/models/qwen3_f16_gqa_sharded tests/fidelity/models/qwen3_bf16_mha_untied \
		tests/fidelity/models/qwen3_f32_mtp >"$out/spec-cuda.log" 2>&1 || failed=$((failed + 1))
	grep -E '^\[ *(PASSED|FAILED|  ERROR) ' "$out/spec-cuda.log"
	for m in $models; do
		ATLAS_TEST_BACKEND=cuda build-gpu/tests/engine/test_engine tests/fidelity/models/$m \
			>"$out/engine-cuda-$m.log" 2>&1 || failed=$((failed + 1))
		echo "test_engine $m: $(grep -E '^\[ *(PASSED|FAILED|  ERROR) ' \
			"$out/engine-cuda-$m.log" | tr '\n' ' ')"
	done
}

case $phase in
build)
	nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
	rm -rf "$dir"
	i=0
	while [ $i -lt "$n" ]; do
		mkdir -p "$dir/$i"
		tar cf - --exclude=./build-gpu --exclude=./.ab --exclude=./.train-data . |
			tar xf - -C "$dir/$i"
		# side i: the patches after the i-th reversed, newest first
		for p in $(echo "$patches" | tr ',' '\n' | tail -n $((n - i)) | tac); do
			(cd "$dir/$i" && patch -R -p1 -s) <"$p" ||
				{ echo "gpu-ab: $p does not reverse on side $i"; exit 99; }
		done
		i=$((i + 1))
	done
	pids=
	i=0
	while [ $i -le "$n" ]; do
		build_side $i &
		pids="$pids $!"
		i=$((i + 1))
	done
	for p in $pids; do
		wait "$p" || failed=$((failed + 1))
	done
	ls -l "$dir"/*/build-gpu/tools/atlas build-gpu/tools/atlas
	;;
same)
	one=5
	short=1,2,3,4,5,6,7,8
	long=$(seq -s, 11 50)
	other=${AB_SIDE:-$n}
	for m in $models; do
		d=tests/fidelity/models/$m
		for side in 0 "$other"; do
			b=$(side_dir "$side")/build-gpu
			for seq in one short long; do
				eval ids=\$$seq
				$b/tools/atlas logits --model $d --tokens "$ids" -o backend=cuda \
					-o log_level=warn --out "$out/logits-$m-$seq-$side.f32" ||
					failed=$((failed + 1))
			done
			$b/tools/atlas generate --model $d --mode raw --temperature 0 --max-tokens 32 \
				--tokens 5,6,7 --ids -o backend=cuda -o log_level=warn \
				>"$out/greedy-$m-$side.txt" 2>&1 || failed=$((failed + 1))
		done
		for f in logits-$m-one.f32 logits-$m-short.f32 logits-$m-long.f32 greedy-$m.txt; do
			a=$out/${f%.*}-0.${f##*.}
			b=$out/${f%.*}-$other.${f##*.}
			cmp -s "$a" "$b" && echo "$f: equal" ||
				{ echo "$f: DIFFERENT"; failed=$((failed + 1)); }
		done
	done
	# The test models' heads have 16 or 32 dims; the published shapes' 128
	# take other attention kernels. Random weights of each shape of
	# AB_SAME_SHAPES (the same on every side: their generator is seeded):
	# the 4 highest logits (printed to round trip) of every position of a
	# prompt of 4,096 in chunks of 2,048 (Qwen3-0.6B's chunks go to the
	# wgmma prefill at one and at two CTAs a multiprocessor), 32 greedy
	# tokens after 2,100, and 64 after 100 (decode of a short context: a
	# few splits of the keys, the batch-1 rows of the bench).
	prompt=$(seq -s, 1 4096)
	gen_prompt=$(seq -s, 1 2100)
	short_prompt=$(seq -s, 1 100)
	for shape in ${AB_SAME_SHAPES:-qwen3-0.6b}; do
		for side in 0 "$other"; do
			b=$(side_dir "$side")/build-gpu
			"$b"/tools/atlas logits -o load_format=dummy -o model="$shape" -o backend=cuda \
				-o chunk_size=2048 -o log_level=warn --tokens "$prompt" --top 4 \
				>"$out/top-$shape-$side.txt" 2>&1 || failed=$((failed + 1))
			"$b"/tools/atlas generate -o load_format=dummy -o model="$shape" --mode raw \
				--temperature 0 --max-tokens 32 --tokens "$gen_prompt" --ids \
				-o backend=cuda -o chunk_size=2048 -o log_level=warn \
				>"$out/greedy-$shape-$side.txt" 2>&1 || failed=$((failed + 1))
			"$b"/tools/atlas generate -o load_format=dummy -o model="$shape" --mode raw \
				--temperature 0 --max-tokens 64 --tokens "$short_prompt" --ids \
				-o backend=cuda -o log_level=warn \
				>"$out/greedy-short-$shape-$side.txt" 2>&1 || failed=$((failed + 1))
		done
		for f in top-$shape greedy-$shape greedy-short-$shape; do
			cmp -s "$out/$f-0.txt" "$out/$f-$other.txt" && echo "$f: equal" ||
				{ echo "$f: DIFFERENT"; failed=$((failed + 1)); }
		done
	done
	run_tests
	;;
check)
	run_tests
	;;
bench)
	[ $# -gt 0 ] || set -- qwen3-0.6b
	start=$(date +%s)
	last=0
	round=0
	: >"$out/marks.txt"
	# the reasons' field has two names across drivers
	reasons=clocks_event_reasons.active
	nvidia-smi --query-gpu=$reasons --format=csv,noheader >/dev/null 2>&1 ||
		reasons=clocks_throttle_reasons.active
	# the power of the moment where the driver has it, else its average over
	# about a second
	power=power.draw.instant
	nvidia-smi --query-gpu=$power --format=csv,noheader,nounits 2>/dev/null | grep -q "^[0-9]" ||
		power=power.draw
	nvidia-smi --query-gpu=timestamp,clocks.sm,$power,$reasons \
		--format=csv,noheader,nounits -lms 100 >"$out/power.csv" 2>/dev/null &
	smi=$!
	while :; do
		round=$((round + 1))
		t=$(date +%s)
		[ "$round" -le "${AB_ROUNDS:-2}" ] ||
			[ $((t - start + last)) -le "${AB_BUDGET:-0}" ] || break
		for s in "$@"; do
			i=0
			while [ $i -le "$n" ]; do
				echo
				echo "== $s, side $i, round $round"
				echo "$(date '+%Y/%m/%d %H:%M:%S.%N') start $s $i $round" >>"$out/marks.txt"
				# shellcheck disable=SC2086
				"$(side_dir $i)"/build-gpu/tools/atlas bench --dummy-weights \
					--arch "${s%%-*}" --shape "${s#*-}" -o chunk_size=2048 \
					-o log_level=warn $bench_opts \
					--csv-out "$out/ab-$s-$i-$round.csv" || failed=$((failed + 1))
				echo "$(date '+%Y/%m/%d %H:%M:%S.%N') end $s $i $round" >>"$out/marks.txt"
				i=$((i + 1))
			done
			[ -n "${AB_LAST_EXTRA:-}" ] || continue
			echo
			echo "== $s, side ${n}x ($AB_LAST_EXTRA), round $round"
			echo "$(date '+%Y/%m/%d %H:%M:%S.%N') start $s ${n}x $round" >>"$out/marks.txt"
			# shellcheck disable=SC2086
			build-gpu/tools/atlas bench --dummy-weights --arch "${s%%-*}" \
				--shape "${s#*-}" -o chunk_size=2048 -o log_level=warn $bench_opts \
				$AB_LAST_EXTRA --csv-out "$out/ab-$s-${n}x-$round.csv" ||
				failed=$((failed + 1))
			echo "$(date '+%Y/%m/%d %H:%M:%S.%N') end $s ${n}x $round" >>"$out/marks.txt"
		done
		last=$(($(date +%s) - t))
	done
	# One file for all the CSVs: the device tool brings back only a few
	# files of a call's $OUT, and sides x rounds x shapes are more.
	kill "$smi" 2>/dev/null
	(cd "$out" && tar czf ab-bench.tgz ab-*.csv power.csv marks.txt &&
		rm -f ab-*.csv power.csv marks.txt) || failed=$((failed + 1))
	;;
trace)
	[ $# -gt 0 ] || set -- qwen3-0.6b
	so=/tmp/atlas-kernel-trace.so
	cc -O2 -shared -fPIC -I/usr/local/cuda/include dev/prof/kernel_trace.c \
		-L/usr/local/cuda/lib64 -lcupti -o "$so" || exit 1
	for s in "$@"; do
		for i in ${AB_TRACE_SIDES:-$(seq 0 "$n")}; do
			csv=$out/ab-trace-$s-$i.csv
			# shellcheck disable=SC2086
			CUDA_INJECTION64_PATH=$so KERNEL_TRACE_OUT=$csv \
				"$(side_dir $i)"/build-gpu/tools/atlas bench --dummy-weights \
				--arch "${s%%-*}" --shape "${s#*-}" -o chunk_size=2048 \
				-o log_level=warn $trace_opts >/dev/null || failed=$((failed + 1))
			python3 dev/prof/kernel_trace.py "$csv" --group largest \
				>"$out/trace-$s-$i.txt" || failed=$((failed + 1))
			echo "$s side $i: $(sed -n 3p "$out/trace-$s-$i.txt")"
		done
	done
	(cd "$out" && tar czf ab-trace.tgz ab-trace-*.csv && rm -f ab-trace-*.csv) ||
		failed=$((failed + 1))
	;;
*)
	echo "gpu-ab.sh: unknown phase $phase" >&2
	exit 2
	;;
esac
exit $failed
