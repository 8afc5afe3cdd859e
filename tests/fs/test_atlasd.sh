#!/bin/sh
# End to end: the real atlasd with the real engine and a small model.
#
#   test_atlasd.sh ATLASD
#
# Exits 0 (passed), 1 (failed) or 77 (skipped: no model, or FUSE mounts are
# not possible here).
set -u
atlasd=$1
src=${ATLAS_SOURCE_ROOT:?}
build=${ATLAS_BUILD_ROOT:?}
tmp=$(mktemp -d)
mnt=$tmp/mnt
mkdir "$mnt"
pid=

cleanup() {
	[ -n "$pid" ] && kill "$pid" 2>/dev/null
	grep -qs " $mnt fuse" /proc/mounts && fusermount3 -u -z "$mnt"
	rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

fail() { echo "FAIL: $*" >&2; [ -f "$tmp/log" ] && sed 's/^/atlasd: /' "$tmp/log" >&2; exit 1; }
skip() { echo "SKIP: $*"; exit 77; }
mounted() { grep -qs " $mnt fuse" /proc/mounts; }

[ -r /dev/fuse ] && [ -w /dev/fuse ] || skip "no usable /dev/fuse"
command -v fusermount3 >/dev/null || skip "no fusermount3"

# A small model: one with a tokenizer if there is one (prompts are then
# text), else token ids.
model=
for dir in "$src"/tests/fidelity/models/*/ "$build/testdata/tiny-qwen3/"; do
	[ -f "$dir/config.json" ] || continue
	[ -z "$model" ] && model=${dir%/}
	[ -f "$dir/tokenizer.json" ] && { model=${dir%/}; break; }
done
[ -n "$model" ] || skip "no test model (tests/fidelity/models, build/testdata/tiny-qwen3)"
if [ -f "$model/tokenizer.json" ]; then prompt="The sky is"; else prompt="1 2 3 4"; fi

# Small KV memory and greedy sampling: quick, and the same answer every time.
# context=384: the config key, not the SELinux mount option of that name.
opts="model=$model,log_level=warn,threads=1,kv_memory=16M,max_tokens=6,temperature=0,sessions=2,context=384"

# start: run atlasd -f in the background and wait (model load included) for the mount.
start() {
	"$atlasd" -f -o "$opts" "$mnt" 2>"$tmp/log" &
	pid=$!
	i=0
	while ! mounted; do
		if ! kill -0 "$pid" 2>/dev/null; then
			wait "$pid"
			pid=
			grep -qi "permission denied\|not permitted" "$tmp/log" && skip "FUSE mounts are not permitted"
			fail "atlasd did not mount"
		fi
		i=$((i + 1))
		[ $i -lt 600 ] || fail "atlasd did not mount within 60 s"
		sleep 0.1
	done
}

# stop_with CMD: end atlasd with CMD and check that it exits 0 and unmounts.
stop_with() {
	"$@" || fail "$*"
	i=0
	while kill -0 "$pid" 2>/dev/null; do
		i=$((i + 1))
		[ $i -lt 100 ] || fail "atlasd still runs 10 s after $*"
		sleep 0.1
	done
	wait "$pid"
	status=$?
	pid=
	[ $status = 0 ] || fail "atlasd exited $status after $*"
	mounted && fail "still mounted after $*"
	[ -z "$(ls -A "$mnt")" ] || fail "the mountpoint is not empty after $*"
}

# ask SESSION FILE: commit the prompt and stream the answer into FILE.
ask() {
	echo "$prompt" > "$mnt/$1/in" || fail "commit to $1/in"
	timeout 60 cat "$mnt/$1/out" > "$2" || fail "cat $1/out did not end cleanly"
	[ -s "$2" ] || fail "$1/out is empty"
}

value() { sed -n "s/^$2 //p" "$mnt/$1"; }

start

# One turn, then the same prompt in two fresh sessions at once: with greedy
# sampling all three answers are the same.
ask s1 "$tmp/solo"
echo reset > "$mnt/s1/ctl" || fail "reset"
echo "$prompt" > "$mnt/s1/in" || fail "commit to s1/in"
echo "$prompt" > "$mnt/s2/in" || fail "commit to s2/in"
timeout 60 cat "$mnt/s1/out" > "$tmp/a" &
reader=$!
timeout 60 cat "$mnt/s2/out" > "$tmp/b" || fail "cat s2/out"
wait $reader || fail "cat s1/out"
cmp -s "$tmp/a" "$tmp/solo" && cmp -s "$tmp/b" "$tmp/solo" ||
	fail "concurrent answers differ: '$(cat "$tmp/a")' '$(cat "$tmp/b")' vs '$(cat "$tmp/solo")'"

# status after a turn
[ "$(value s2/status state)" = idle ] || fail "s2 state: $(value s2/status state)"
[ "$(value s2/status turns)" = 1 ] || fail "s2 turns: $(value s2/status turns)"
[ "$(value s2/status generated_tokens)" -gt 0 ] || fail "s2 generated no tokens"
grep -q . "$mnt/s2/history" || fail "s2/history is empty"

# A session made with mkdir, used and removed.
mkdir "$mnt/s9" || fail "mkdir s9"
ask s9 "$tmp/s9"
rmdir "$mnt/s9" || fail "rmdir s9"
[ ! -e "$mnt/s9" ] || fail "s9 still exists"

# Settings: a good line applies, a bad one fails the write.
echo "max_tokens 2" > "$mnt/s1/ctl" || fail "ctl write"
[ "$(value s1/ctl max_tokens)" = 2 ] || fail "max_tokens not applied"
if printf 'max_tokens 3\nbogus 1\n' > "$mnt/s1/ctl" 2>/dev/null; then fail "a bad ctl line was accepted"; fi
[ "$(value s1/ctl max_tokens)" = 2 ] || fail "a failed ctl write changed max_tokens"
ask s1 "$tmp/short"
[ "$(value s1/status generated_tokens)" -le 2 ] || fail "max_tokens 2 not honoured"
# What the model cannot do fails at the write, not only at close (which
# shells do not report): chat mode needs a chat template.
if [ ! -f "$model/tokenizer.json" ]; then
	if echo "mode chat" > "$mnt/s1/ctl" 2>/dev/null; then fail "chat mode accepted without a template"; fi
	[ "$(value s1/ctl mode)" = raw ] || fail "a refused mode changed the mode"
fi

# A prompt while a turn runs is refused at its first write.
printf 'max_tokens 100000\n' > "$mnt/s2/ctl" || fail "ctl write"
echo "$prompt" > "$mnt/s2/in" || fail "commit to s2/in"
if echo "$prompt" > "$mnt/s2/in" 2>/dev/null; then fail "a prompt was accepted while a turn runs"; fi
echo cancel > "$mnt/s2/ctl" || fail "cancel"
if timeout 60 cat "$mnt/s2/out" >/dev/null 2>&1; then fail "a cancelled turn read as a normal end"; fi
[ "$(value s2/status finish)" = cancelled ] || fail "s2 finish: $(value s2/status finish)"

# ctl/ files and metrics
for f in slots kv spec ep engine metrics config; do
	grep -q . "$mnt/ctl/$f" || fail "ctl/$f is empty"
done
grep -q "^model = $model\$" "$mnt/ctl/config" || fail "ctl/config does not show the model"
grep -q "^context = 384\$" "$mnt/ctl/config" || fail "-o context=384 did not set the key context"
total=$(sed -n 's/^atlas_generated_tokens_total //p' "$mnt/ctl/metrics")
[ "${total:-0}" -gt 0 ] || fail "atlas_generated_tokens_total is '$total'"
bad=$(grep -Ev '^# (HELP|TYPE) atlas_[a-z_]+ .+$|^atlas_[a-z_]+(\{[a-z_]+="([^"\\]|\\.)*"(,[a-z_]+="([^"\\]|\\.)*")*\})? [-+0-9.eEInfNa]+$' \
	"$mnt/ctl/metrics")
[ -z "$bad" ] || fail "ctl/metrics has bad lines: $bad"

stop_with kill -TERM "$pid"

start
stop_with fusermount3 -u "$mnt"

# kv_persist: a session made with mkdir comes back after a restart with its
# history, and its next turn computes only its new tokens.
mkdir "$tmp/kv" || fail "mkdir $tmp/kv"
plain=$opts
opts="$plain,kv_persist=true,kv_dir=$tmp/kv,kv_disk_memory=64M"
start
mkdir "$mnt/kept" || fail "mkdir kept"
ask kept "$tmp/k1"
ctx1=$(value kept/status context_tokens)
stop_with kill -TERM "$pid"
[ -f "$tmp/kv/atlas-sessions.json" ] || fail "no manifest in kv_dir after a stop"
start
[ -d "$mnt/kept" ] || fail "the session kept did not come back: $(ls "$mnt")"
[ "$(value kept/status turns)" = 1 ] || fail "kept turns: $(value kept/status turns)"
grep -qF "$prompt" "$mnt/kept/history" || fail "kept/history lost its turn"
before=$(value ctl/engine step_tokens_total)
ask kept "$tmp/k2"
computed=$(($(value ctl/engine step_tokens_total) - before))
new=$(($(value kept/status context_tokens) - ctx1))
[ "$computed" = "$new" ] ||
	fail "the turn after a restart computed $computed tokens, not its $new new ones"
stop_with fusermount3 -u "$mnt"
opts=$plain

# Errors stop startup with exit status 1 and a message naming what is wrong.
expect_error() {
	what=$1
	shift
	"$atlasd" -f "$@" "$mnt" 2>"$tmp/err"
	status=$?
	[ $status = 1 ] || fail "atlasd $* exited $status, not 1"
	grep -q "$what" "$tmp/err" || fail "atlasd $*: '$what' is not named: $(cat "$tmp/err")"
}
expect_error no_such_key -o "$opts,no_such_key=1"
expect_error "$tmp/nonexistent" -o "model=$tmp/nonexistent"
mounted && fail "mounted after a failed start"
echo "passed"
