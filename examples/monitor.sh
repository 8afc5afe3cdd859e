#!/bin/sh
# Watch the engine on a 24-line terminal, refreshed every second: the busy
# slots (at most 9), KV blocks per tier, token and turn totals.
#   examples/monitor.sh [--once]                  (MNT defaults to /mnt/atlas)
# --once prints one screen and returns.
mnt=${MNT:-/mnt/atlas}
if [ "${1:-}" = --once ]; then
	awk 'NR == 1 || $3 != "idle"' "$mnt/ctl/slots" | head -n 10
	echo
	grep -E '^(blocks_(used|capacity)_|parked_sessions)' "$mnt/ctl/kv"
	echo
	grep -E '^atlas_((generated|prompt)_tokens|turns)_total ' "$mnt/ctl/metrics"
	exit
fi
exec watch -t -n 1 "MNT='$mnt' '$0' --once"
