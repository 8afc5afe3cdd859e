#!/bin/sh
# Ask one question in a fresh session and print the answer as it streams.
#   examples/ask.sh "Why is the sky blue?"        (MNT defaults to /mnt/atlas)
# A session directory made with mkdir is private to this run and removed at
# the end, so several asks can run at once.
set -eu
mnt=${MNT:-/mnt/atlas}
s="$mnt/ask-$$"
mkdir "$s"
trap 'rmdir "$s"' EXIT
printf '%s\n' "$*" > "$s/in"
cat "$s/out"
echo
