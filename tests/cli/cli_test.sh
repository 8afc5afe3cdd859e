#!/bin/sh
# Tests of the atlas command-line tool, run on the built binary:
#
#   cli_test.sh CASE ATLAS      CASE: help usage config tokenize generate logits bench install
#
# Exits 0 (passed), 1 (failed) or 77 (skipped: an input is missing).
set -u
case=$1
atlas=$2
src=${ATLAS_SOURCE_ROOT:?}
build=${ATLAS_BUILD_ROOT:?}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM

fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIP: $*"; exit 77; }

# expect STATUS ARGS...: run atlas ARGS (stdout in $tmp/out, stderr in
# $tmp/err) and check its exit status.
expect() {
	want=$1
	shift
	"$atlas" "$@" >"$tmp/out" 2>"$tmp/err"
	got=$?
	[ "$got" = "$want" ] || fail "atlas $* exited $got, not $want; stderr: $(cat "$tmp/err")"
}

# expect_error STATUS ARGS...: the same, and stderr is one line naming atlas.
expect_error() {
	expect "$@"
	shift
	[ "$(wc -l <"$tmp/err")" = 1 ] || fail "atlas $*: stderr is not one line: $(cat "$tmp/err")"
	grep -q '^atlas[ :]' "$tmp/err" || fail "atlas $*: message does not name atlas: $(cat "$tmp/err")"
}

# A small model directory: the fidelity test models, or the one tools/check.sh makes.
find_model() {
	for dir in "$src"/tests/fidelity/models/*/ "$build/testdata/tiny-qwen3/"; do
		[ -f "$dir/config.json" ] && { echo "${dir%/}"; return 0; }
	done
	return 1
}

vocab_of() {
	sed -n 's/.*"vocab_size": *\([0-9][0-9]*\).*/\1/p' "$1/config.json" | head -n 1
}

# Small KV memory: meson's MALLOC_PERTURB_ would fill the default 1G.
quiet="-o log_level=warn -o threads=1 -o kv_memory=16M"

case_help() {
	for cmd in generate tokenize detokenize logits bench config; do
		expect 0 "$cmd" --help
		grep -q "^usage: atlas $cmd" "$tmp/out" || fail "atlas $cmd --help: no usage line"
		expect 0 "$cmd" -h
	done
	expect 0 --help
	grep -q -- "--version" "$tmp/out" || fail "atlas --help does not name --version"
	for cmd in generate tokenize detokenize logits bench config; do
		grep -q "^  $cmd " "$tmp/out" || fail "atlas --help does not list $cmd"
	done
	expect 0 --version
	[ "$(cat "$tmp/out")" = "atlas $ATLAS_VERSION" ] || fail "atlas --version: $(cat "$tmp/out")"
	expect_error 2 nosuchcommand
	expect 2
}

case_usage() {
	expect_error 2 generate --bogus hi
	expect_error 2 generate --temperature warm hi
	expect_error 2 generate --top-k -3 hi
	expect_error 2 generate --mode banana hi
	expect_error 2 generate --tokens 1,x
	expect_error 2 generate --tokens 1,2 and a prompt
	expect_error 2 generate --tokens ,
	expect_error 2 generate -o threads hi
	expect_error 2 generate -o max_batch=999 hi
	expect_error 2 generate -o nosuchkey=1 hi
	expect_error 2 generate --model
	expect_error 2 tokenize extra
	expect_error 2 tokenize --model
	expect_error 2 detokenize --special
	expect_error 2 logits --tokens 1
	expect_error 2 logits --out "$tmp/l"
	expect_error 2 logits --tokens 1 --prompt x --out "$tmp/l"
	expect_error 2 logits --tokens 1 --top 0
	expect_error 2 bench --batch 0
	expect_error 2 bench --batch 1,x
	expect_error 2 bench --gen-tokens 1
	expect_error 2 bench --prefill-runs 0
	expect_error 2 bench --prefill-runs 2,3
	expect_error 2 bench extra
	expect_error 2 bench --shape 8b
	expect_error 2 bench --dummy-weights --context x
	expect_error 2 bench --temperature warm
	expect_error 2 bench --top-p 0.9
	expect_error 2 bench --top-k 40
	expect_error 2 bench --temperature 0.7 --top-k -1
	expect_error 2 config --defaults -o threads=1
	expect_error 2 config -o threads=many
	expect_error 2 config extra

	# failures that are not usage errors exit 1
	expect_error 1 config --config /nonexistent/atlas.conf
	expect_error 1 tokenize --model /nonexistent </dev/null
	expect_error 1 generate --model /nonexistent $quiet --tokens 1
	printf '[engine]\nthreads = 1\nmax_batch = 300\n' >"$tmp/bad.conf"
	expect_error 1 config --config "$tmp/bad.conf"
	grep -q "bad.conf:3: key 'max_batch'" "$tmp/err" || fail "no FILE:LINE: key in: $(cat "$tmp/err")"
}

# bench with dummy weights of the shipped model's shape: every row is there,
# the CSV agrees with the table, and runs that cannot fit say so.
case_bench() {
	expect 0 bench --dummy-weights --arch atlas --shape tiny $quiet -o kv_memory=8M \
		--prompt-tokens 64,9000 --batch 1,3 --context 200 --context-batch 1,200 \
		--gen-tokens 6 --prefill-runs 3 --csv-out "$tmp/bench.csv"
	grep -q '^model .*atlas-tiny (Qwen3ForCausalLM, 8 layers' "$tmp/out" ||
		fail "bench: no model line: $(cat "$tmp/out")"
	grep -q '^bandwidth  *[0-9][0-9]* GB/s' "$tmp/out" || fail "bench: no bandwidth line"
	grep -qE '^prefill +1 +64 +64 ' "$tmp/out" || fail "bench: no prefill row"
	grep -qE '^prefill +1 +9000 +skipped: longer than the context' "$tmp/out" ||
		fail "bench: a prompt over the context is not skipped"
	# A decode row counts the tokens made after every session has its first
	# one, as the bench saw them: at most batch * (gen_tokens - 1), fewer when
	# a slow machine (sanitizers) looks after a later step.
	awk '$1 == "decode" && $2 == 3 && $3 == 32 && $4 >= 1 && $4 <= 15 && /%$/ { ok = 1 }
		END { exit !ok }' "$tmp/out" || fail "bench: no decode row of batch 3: $(cat "$tmp/out")"
	grep -qE '^decode +200 +200 +skipped: its KV does not fit' "$tmp/out" ||
		fail "bench: a batch over the KV pool is not skipped"
	[ "$(wc -l <"$tmp/bench.csv")" = 7 ] || fail "bench: CSV has not 7 lines: $(cat "$tmp/bench.csv")"
	# (the power columns are empty: the cpu backend has no power readings)
	grep -qE '^decode,1,200,[1-5],[0-9.]+,[0-9.]+,[0-9]+,[0-9.]+,[0-9.]+,,,,$' "$tmp/bench.csv" ||
		fail "bench: no long-context decode CSV row: $(cat "$tmp/bench.csv")"
	head -1 "$tmp/bench.csv" | grep -q ',percent_of_bound,watts,joules_per_token,percent_power_capped,sm_clock_mhz$' ||
		fail "bench: CSV header: $(head -1 "$tmp/bench.csv")"
	# The swap tier: a session pushed out to the host tier and resumed.
	expect 0 bench --dummy-weights --arch atlas --shape tiny $quiet -o kv_memory=8M \
		-o kv_host_memory=16M -o context=1024 --resume 300
	grep -qE '^prefill +1 +300 +300 ' "$tmp/out" || fail "bench --resume: no prefill row"
	grep -qE '^resume-host +1 +300 +300 ' "$tmp/out" ||
		fail "bench --resume: no resume row from the host tier: $(cat "$tmp/out")"
	# What cannot fit is skipped before it runs: a prompt within the context
	# but over the KV pool.
	expect 0 bench --dummy-weights --arch atlas --shape tiny $quiet -o kv_memory=1M \
		-o context=4096 --prompt-tokens 4000 --batch 1 --context 0 --gen-tokens 4
	grep -qE '^prefill +1 +4000 +skipped: its KV does not fit the pool' "$tmp/out" ||
		fail "bench: a prompt over the KV pool is not skipped: $(cat "$tmp/out")"
	# The cpu's defaults: rows that end in seconds on a small model.
	expect 0 bench --dummy-weights --arch atlas --shape tiny $quiet -o kv_memory=64M -o backend=cpu
	rows=$(grep -cE '^(prefill|decode) ' "$tmp/out")
	grep -qE '^prefill +1 +512 +512 ' "$tmp/out" && grep -qE '^decode +8 +32 ' "$tmp/out" &&
		grep -qE '^decode +1 +1024 ' "$tmp/out" && [ "$rows" = 7 ] ||
		fail "bench: not the cpu's default rows: $(cat "$tmp/out")"
	# Sampled decode rows: the settings are printed and the rows are there.
	expect 0 bench --dummy-weights --arch atlas --shape tiny $quiet -o kv_memory=8M \
		--prompt-tokens 16 --batch 1,3 --context 0 --gen-tokens 6 --temperature 0.7 \
		--top-p 0.9 --top-k 40
	grep -q '^sampling   decode rows at temperature 0.7, top_p 0.9, top_k 40' "$tmp/out" ||
		fail "bench --temperature: no sampling line: $(cat "$tmp/out")"
	grep -qE '^decode +3 +32 ' "$tmp/out" ||
		fail "bench --temperature: no decode row of batch 3: $(cat "$tmp/out")"
	# a value out of a session's range is the session's error, as in generate
	expect_error 1 bench --dummy-weights --arch atlas --shape tiny $quiet --batch 1 \
		--prompt-tokens 16 --context 0 --temperature 0.7 --top-p 0
	grep -q "top_p: 0 is not in (0, 1]" "$tmp/err" ||
		fail "bench --top-p 0: no range message: $(cat "$tmp/err")"
	expect_error 1 bench --dummy-weights --shape 9b $quiet
	grep -q "no shape called 'qwen3-9b' (known: qwen3-0.6b" "$tmp/err" ||
		fail "bench: unknown shape message: $(cat "$tmp/err")"
}

case_config() {
	expect 0 config --defaults
	cmp -s "$tmp/out" "$src/config/atlas.conf" ||
		fail "atlas config --defaults differs from config/atlas.conf"

	printf '[engine]\nthreads = 3\n[sessions]\nsystem = two\\nlines\n' >"$tmp/my.conf"
	expect 0 config --config "$tmp/my.conf" -o max_batch=16 -o kv_memory=512M
	cp "$tmp/out" "$tmp/effective.conf"
	for line in 'threads = 3' 'max_batch = 16' 'kv_memory = 512M' 'system = two\nlines' \
		    'chunk_size = 0'; do
		grep -qxF "$line" "$tmp/effective.conf" || fail "atlas config: no line '$line'"
	done
	grep -q '^#' "$tmp/effective.conf" && fail "atlas config prints comments"
	# what it prints reads back as the same configuration
	expect 0 config --config "$tmp/effective.conf"
	cmp -s "$tmp/out" "$tmp/effective.conf" || fail "atlas config output does not read back"
}

case_tokenize() {
	tok=$build/testdata/qwen3-tokenizer
	[ -f "$tok/tokenizer.json" ] || skip "no $tok (tools/fetch-tokenizer makes it)"
	printf 'Hello, world!' >"$tmp/text"
	expect 0 tokenize --model "$tok" <"$tmp/text"
	[ "$(cat "$tmp/out")" = "9707 11 1879 0" ] || fail "tokenize 'Hello, world!': $(cat "$tmp/out")"

	printf 'Grüße, 世界! 😀\n\n  indented\tline <|im_end|> end\n' >"$tmp/text"
	expect 0 tokenize --model "$tok" <"$tmp/text"
	cp "$tmp/out" "$tmp/ids"
	grep -qE '^[0-9]+( [0-9]+)*$' "$tmp/ids" || fail "tokenize output is not ids on one line"
	expect 0 detokenize --model "$tok" <"$tmp/ids"
	cmp -s "$tmp/out" "$tmp/text" || fail "detokenize(tokenize(text)) differs from text"
	tr ' ' ',' <"$tmp/ids" >"$tmp/ids-commas"
	expect 0 detokenize --model "$tok" <"$tmp/ids-commas"
	cmp -s "$tmp/out" "$tmp/text" || fail "detokenize of comma-separated ids differs"

	echo "1 999999999" >"$tmp/bad"
	expect_error 1 detokenize --model "$tok" <"$tmp/bad"
}

case_generate() {
	model=$(find_model) || skip "no tiny model (tests/fidelity/models or testdata/tiny-qwen3)"
	vocab=$(vocab_of "$model")
	args="--model $model $quiet --mode raw --temperature 0 --max-tokens 8 --tokens 3,1,4,1,5"
	expect 0 generate $args --ids
	cp "$tmp/out" "$tmp/ids1"
	expect 0 generate $args --ids
	cmp -s "$tmp/out" "$tmp/ids1" || fail "greedy generation differs between runs"
	n=0
	for id in $(cat "$tmp/ids1"); do
		case $id in *[!0-9]*) fail "--ids printed '$id'" ;; esac
		[ "$id" -lt "$vocab" ] || fail "generated id $id is not below the vocabulary $vocab"
		n=$((n + 1))
	done
	[ "$n" -ge 1 ] && [ "$n" -le 8 ] || fail "$n ids generated with --max-tokens 8"

	# A prompt longer than the context: the key to change, no ctl file to write.
	expect 1 generate $args -o context=4
	grep -q "prompt of 5 tokens does not fit the context of 4 tokens (the key context)" \
		"$tmp/err" || fail "generate, prompt over the context: $(cat "$tmp/err")"
	grep -q ctl "$tmp/err" && fail "generate's message speaks of ctl: $(cat "$tmp/err")"

	expect 0 generate $args
	cp "$tmp/out" "$tmp/text1"
	[ -s "$tmp/text1" ] || fail "generate printed nothing"
	[ "$(tail -c 1 "$tmp/text1" | wc -l)" = 1 ] || fail "generate's text does not end with a newline"
	expect 0 generate $args
	cmp -s "$tmp/out" "$tmp/text1" || fail "greedy text differs between runs"
}

case_logits() {
	model=$(find_model) || skip "no tiny model (tests/fidelity/models or testdata/tiny-qwen3)"
	vocab=$(vocab_of "$model")
	expect 0 logits --model "$model" $quiet --tokens 3,1,4,1,5 --out "$tmp/logits" --top 2
	size=$(wc -c <"$tmp/logits")
	[ "$size" -eq $((5 * vocab * 4)) ] || fail "logits file has $size bytes, not 5 x $vocab x 4"
	[ "$(wc -l <"$tmp/out")" = 5 ] || fail "--top printed $(wc -l <"$tmp/out") lines for 5 positions"
	grep -qE '^4 [0-9]+:[-0-9.e+]+ [0-9]+:[-0-9.e+]+$' "$tmp/out" || fail "--top line: $(tail -n 1 "$tmp/out")"

	# the best logit of the last position is greedy generation's first token
	best=$(tail -n 1 "$tmp/out" | cut -d' ' -f2 | cut -d: -f1)
	expect 0 generate --model "$model" $quiet --mode raw --temperature 0 --max-tokens 1 \
		--tokens 3,1,4,1,5 --ids
	[ "$(cat "$tmp/out")" = "$best" ] || fail "argmax $best but generate chose $(cat "$tmp/out")"
}

# meson install, as a packager runs it: `meson install --destdir` into a
# temporary directory, then the installed binaries run from there, finding
# the installed model and atlas.conf, not the source tree's; the manual
# pages read cleanly through man (not checked without man-db).
case_install() {
	dest=$tmp/dest
	"$ATLAS_MESON" install -C "$build" --no-rebuild --quiet --destdir "$dest" >"$tmp/log" 2>&1 ||
		fail "meson install: $(cat "$tmp/log")"
	bin=$(dirname "$(find "$dest" -path '*/bin/atlas' -type f)")
	[ -x "$bin/atlas" ] && [ -x "$bin/atlasd" ] || fail "no bin/atlas and bin/atlasd under $dest"
	prefix=${bin%/bin}
	for f in share/atlas/models/atlas-next/config.json share/atlas/models/atlas-next/tokenizer.json \
		 etc/atlas/atlas.conf share/man/man1/atlas.1 share/man/man8/atlasd.8 \
		 share/man/man5/atlas.conf.5 lib/systemd/system/atlasd.service share/doc/atlas/LICENSE; do
		[ -f "$prefix/$f" ] || fail "meson install left no $f in the prefix"
	done

	[ "$("$bin/atlas" --version)" = "atlas $ATLAS_VERSION" ] || fail "installed atlas --version"
	"$bin/atlasd" --version | grep -qx "atlasd $ATLAS_VERSION" || fail "installed atlasd --version"

	# The default model is the installed copy: the engine's log names it.
	"$bin/atlas" generate -o log_level=info -o threads=1 -o kv_memory=16M --max-tokens 2 \
		--temperature 0 Hello >"$tmp/out" 2>"$tmp/err" || fail "installed atlas generate: $(cat "$tmp/err")"
	grep -q "engine: $prefix/share/atlas/models/atlas-next " "$tmp/err" ||
		fail "installed atlas did not load the installed model: $(cat "$tmp/err")"

	grep -qx "ExecStart=${prefix#"$dest"}/bin/atlasd -f /mnt/atlas" "$prefix/lib/systemd/system/atlasd.service" ||
		fail "the unit's ExecStart: $(grep ExecStart= "$prefix/lib/systemd/system/atlasd.service")"
	grep -qx "Type=notify" "$prefix/lib/systemd/system/atlasd.service" || fail "the unit is not Type=notify"

	# Manual pages: groff reads them without a warning.
	if command -v man >/dev/null; then
		for page in man1/atlas.1 man8/atlasd.8 man5/atlas.conf.5; do
			MANWIDTH=80 man --warnings -E UTF-8 -l "$prefix/share/man/$page" >"$tmp/page" 2>"$tmp/warn" ||
				fail "man -l $page failed: $(cat "$tmp/warn")"
			[ ! -s "$tmp/warn" ] || fail "man -l $page warns: $(cat "$tmp/warn")"
			grep -q "atlas $ATLAS_VERSION" "$tmp/page" || fail "$page does not carry the version"
		done
		# atlas.conf(5) lists every key of the table
		MANWIDTH=80 man -E UTF-8 -l "$prefix/share/man/man5/atlas.conf.5" >"$tmp/page" 2>/dev/null
		for key in $(sed -n 's/^\([a-z_0-9]*\) =.*/\1/p' "$prefix/etc/atlas/atlas.conf"); do
			grep -q "^ *$key =" "$tmp/page" || fail "atlas.conf(5) lacks the key $key"
		done
	else
		echo "man is missing (apt-get install man-db): the manual pages are not checked"
	fi

	# The installed atlasd reads the installed atlas.conf: a bad key there stops
	# it, naming the file, before anything is mounted.
	printf '[engine]\nno_such_key = 1\n' >>"$prefix/etc/atlas/atlas.conf"
	mkdir "$tmp/mnt"
	"$bin/atlasd" -f "$tmp/mnt" 2>"$tmp/err" && fail "atlasd started with a bad installed atlas.conf"
	grep -q "$prefix/etc/atlas/atlas.conf.*no_such_key" "$tmp/err" ||
		fail "atlasd did not read the installed atlas.conf: $(cat "$tmp/err")"
}

case "$case" in
help | usage | config | tokenize | generate | logits | bench | install) "case_$case" ;;
*) fail "unknown case '$case'" ;;
esac
echo "ok: $case"
