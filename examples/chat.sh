#!/bin/sh
# An interactive multi-turn chat: each line you type is a turn; the session
# keeps its history (and its KV), so follow-up questions see the earlier
# ones. Ctrl-D ends, `reset` forgets the history.
#   examples/chat.sh [SESSION]       (MNT defaults to /mnt/atlas)
# Without SESSION the chat makes its own session and removes it at the end;
# with one (s1, or a name made with mkdir) it continues that session.
set -eu
mnt=${MNT:-/mnt/atlas}
if [ $# -gt 0 ]; then
	s="$mnt/$1"
else
	s="$mnt/chat-$$"
	mkdir "$s"
	trap 'rmdir "$s"' EXIT
fi
while printf '> ' && IFS= read -r line; do
	case "$line" in
	reset) echo reset > "$s/ctl"; continue ;;
	"") continue ;;
	esac
	printf '%s\n' "$line" > "$s/in"
	cat "$s/out"
	echo
done
