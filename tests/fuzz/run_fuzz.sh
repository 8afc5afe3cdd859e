#!/bin/sh
# Run one libFuzzer target for a bounded time:
#   run_fuzz.sh FUZZER SEED_CORPUS WORKDIR SECONDS
# New inputs go to WORKDIR/corpus (the committed seeds are only read); a
# crashing input is written to WORKDIR/crash-* and printed in hex, to be
# added to the seed corpus once fixed.
set -eu
fuzzer=$1 seeds=$2 work=$3 seconds=$4
mkdir -p "$work/corpus"
status=0
# -error_exitcode: libFuzzer's own default, 77, is what meson reads as a skip.
"$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
	-error_exitcode=1 -timeout_exitcode=1 \
	-print_final_stats=1 -artifact_prefix="$work/" "$work/corpus" "$seeds" || status=$?
for f in "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-*; do
	[ -f "$f" ] || continue
	echo "== $f"
	od -A d -c "$f" | head -40
done
exit $status
