#!/bin/sh
# atlas in a shell pipeline: summarise what changed in a git repository.
#   examples/pipeline.sh [REPO]      (MNT defaults to /mnt/atlas)
# The prompt is the output of git; the answer is filtered like any text. The
# session is made for this run, set up, and removed at the end.
set -eu
mnt=${MNT:-/mnt/atlas}
s="$mnt/pipeline-$$"
mkdir "$s"
trap 'rmdir "$s"' EXIT
printf 'max_tokens 200\ntemperature 0.2\n' > "$s/ctl"
{ echo "Summarise these changes in three bullet points:"; git -C "${1:-.}" log --stat -5; } \
	> "$s/in"
cat "$s/out" | grep -v '^$'
