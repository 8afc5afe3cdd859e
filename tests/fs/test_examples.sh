#!/bin/sh
# The shell examples (examples/) against the real atlasd serving the
# scripted model, which answers a prompt reversed: each runs, answers, and
# leaves no session of its own behind; monitor.sh's screen fits 24 lines.
#
#   test_examples.sh ATLASD SCRIPT_MODEL
#
# Exits 0 (passed), 1 (failed) or 77 (skipped: FUSE mounts are not possible).
set -u
atlasd=$1
model=$2
src=${ATLAS_SOURCE_ROOT:?}
tmp=$(mktemp -d)
export MNT="$tmp/mnt"
mkdir "$MNT"
trap 'fusermount3 -u -z "$MNT" 2>/dev/null; rm -rf "$tmp"' EXIT INT TERM
fail() { echo "FAIL: $*" >&2; exit 1; }

[ -r /dev/fuse ] && [ -w /dev/fuse ] && command -v fusermount3 >/dev/null ||
	{ echo "SKIP: no FUSE"; exit 77; }
# In the background: atlasd returns once mounted.
"$atlasd" -o "model=$model,backend=cpu,threads=1,kv_memory=1M,log_level=warn" "$MNT" \
	2>"$tmp/log" || { grep -qi "not permitted\|permission denied" "$tmp/log" &&
			  { echo "SKIP: FUSE mounts are not permitted"; exit 77; }
			  fail "atlasd: $(cat "$tmp/log")"; }
ls "$MNT" >"$tmp/before"

# left_behind NAME: the example left a session directory in the mount.
left_behind() { ls "$MNT" | cmp -s - "$tmp/before" || fail "$1 left $(ls "$MNT")"; }

sh "$src/examples/ask.sh" "hello there" >"$tmp/out" || fail "ask.sh"
grep -q "ereht olleh" "$tmp/out" || fail "ask.sh printed: $(cat "$tmp/out")"
left_behind ask.sh

printf 'abc\nxyz\n' | sh "$src/examples/chat.sh" >"$tmp/out" || fail "chat.sh"
grep -q cba "$tmp/out" && grep -q zyx "$tmp/out" || fail "chat.sh printed: $(cat "$tmp/out")"
left_behind chat.sh

# A repository of one small commit: the scripted model's context is short.
if command -v git >/dev/null && git init -q "$tmp/repo" && echo hi >"$tmp/repo/f" &&
	git -C "$tmp/repo" add f && git -C "$tmp/repo" -c user.name=t -c user.email=t@t \
		commit -qm one; then
	sh "$src/examples/pipeline.sh" "$tmp/repo" >"$tmp/out" || fail "pipeline.sh"
	[ -s "$tmp/out" ] || fail "pipeline.sh printed nothing"
	left_behind pipeline.sh
fi

sh "$src/examples/monitor.sh" --once >"$tmp/out" || fail "monitor.sh --once"
grep -q "^slot session state" "$tmp/out" || fail "monitor.sh shows no slots: $(cat "$tmp/out")"
grep -q "^blocks_used_device " "$tmp/out" || fail "monitor.sh shows no KV: $(cat "$tmp/out")"
[ "$(wc -l <"$tmp/out")" -le 24 ] || fail "monitor.sh's screen has $(wc -l <"$tmp/out") lines"

fusermount3 -u "$MNT" || fail "fusermount3 -u"
echo passed
