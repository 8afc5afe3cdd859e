#!/bin/sh
# Give a sandboxed program one session and nothing else: bubblewrap
# bind-mounts a single session directory at /llm inside an otherwise empty
# filesystem view. The program can prompt the model and read answers, but
# cannot see other sessions, ctl/, or the host.
#   examples/sandbox.sh [SESSION]        (needs bubblewrap)
# Without SESSION the sandbox gets a session made for it, removed at the
# end; a SESSION that does not exist is made and kept.
# Run by the user who runs atlasd, the program runs as that user and the
# mount needs no option. Run as root with SANDBOX_USER=NAME (a user of the
# tool's own), the session is made by that user, so that it is theirs
# alone, and the program runs as them; atlasd then needs -o allow_other,
# which lets other users reach the mount but not one another's sessions
# (README, "Users and permissions").
set -eu
mnt=${MNT:-/mnt/atlas}
as=""
if [ -n "${SANDBOX_USER:-}" ]; then
	as="setpriv --reuid=$(id -u "$SANDBOX_USER") --regid=$(id -g "$SANDBOX_USER") --clear-groups"
fi
if [ $# -gt 0 ]; then
	s=$1
	[ -d "$mnt/$s" ] || $as mkdir "$mnt/$s"
else
	s=sandbox-$$
	$as mkdir "$mnt/$s"
	trap '$as rmdir "$mnt/$s"' EXIT
fi
$as bwrap --ro-bind /usr /usr --symlink usr/bin /bin --symlink usr/lib /lib \
	--symlink usr/lib64 /lib64 --proc /proc --dev /dev --unshare-all \
	--bind "$mnt/$s" /llm \
	sh -c 'echo "Write a haiku about filesystems." > /llm/in; cat /llm/out; echo; cat /llm/status'
