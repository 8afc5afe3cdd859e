#!/bin/sh
# Give a sandboxed program one session and nothing else: bubblewrap
# bind-mounts a single session directory at /llm inside an otherwise empty
# filesystem view. The program can prompt the model and read answers, but
# cannot see other sessions, ctl/, or the host.
#   examples/sandbox.sh [SESSION]               (needs bubblewrap; atlasd
#                                               mounted with -o allow_other
#                                               if the sandbox runs as
#                                               another user)
# Without SESSION the sandbox gets a session made for it, removed at the end.
set -eu
mnt=${MNT:-/mnt/atlas}
if [ $# -gt 0 ]; then
	s=$1
else
	s=sandbox-$$
	mkdir "$mnt/$s"
	trap 'rmdir "$mnt/$s"' EXIT
fi
bwrap --ro-bind /usr /usr --symlink usr/bin /bin --symlink usr/lib /lib \
	--symlink usr/lib64 /lib64 --proc /proc --dev /dev --unshare-all \
	--bind "$mnt/$s" /llm \
	sh -c 'echo "Write a haiku about filesystems." > /llm/in; cat /llm/out; echo; cat /llm/status'
