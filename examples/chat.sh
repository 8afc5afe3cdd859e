#!/bin/sh
# An interactive multi-turn chat on one session: each line you type is a
# turn; the session keeps its history (and its KV), so follow-up questions
# see the earlier ones. Ctrl-D ends, `reset` forgets the history.
#   examples/chat.sh [SESSION]                    (default: s1)
set -eu
mnt=${MNT:-/mnt/atlas}
s="$mnt/${1:-s1}"
while printf '> ' && IFS= read -r line; do
	case "$line" in
	reset) echo reset > "$s/ctl"; continue ;;
	"") continue ;;
	esac
	printf '%s\n' "$line" > "$s/in"
	cat "$s/out"
	echo
done
