#!/bin/sh
# Install what atlas needs, build it, make sure a default model exists and
# mount the appliance.
#
#   tools/setup.sh [MOUNTPOINT]      default mountpoint: /mnt/atlas
#   tools/setup.sh --no-mount        everything but the mount (CI, tools/check.sh)
#
# Debian 12 packages are installed with apt-get when missing (as root, or
# through sudo). The build goes to build/; with a mount, atlas and atlasd
# are linked into /usr/local/bin. The default model is the one the
# repository ships, models/atlas-next (models/README.md).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

mount=1
mnt=/mnt/atlas
for a in "$@"; do
	case "$a" in
	--no-mount) mount=0 ;;
	-h|--help) sed -n '2,10p' "$0"; exit 0 ;;
	-*) echo "setup: unknown option $a" >&2; exit 2 ;;
	*) mnt=$a ;;
	esac
done

PKGS="gcc pkg-config meson ninja-build python3 fuse3 libfuse3-dev liburing-dev libjansson-dev \
libonig-dev libinih-dev libutf8proc-dev libcmocka-dev libxxhash-dev man-db"
sudo=""
[ "$(id -u)" = 0 ] || sudo=sudo
missing=""
for p in $PKGS; do
	dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
command -v npm >/dev/null 2>&1 || missing="$missing npm"
if [ -n "$missing" ]; then
	echo "setup: installing$missing"
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing >/dev/null
fi

[ -f build/build.ninja ] || meson setup build >/dev/null
# Progress: ninja's own counting line on a terminal; elsewhere (CI logs) a
# line every 50 steps, and ninja's whole output when the build fails.
echo "setup: building into build/"
if [ -t 1 ]; then
	ninja -C build
else
	(ninja -C build 2>&1; echo $? >build/setup-ninja.status) | tee build/setup-ninja.log |
		awk '/^\[[0-9]+\/[0-9]+\]/ { split(substr($1, 2), a, "[/\\]]")
			if (a[1] % 50 == 0 || a[1] == a[2]) { print "setup: built " a[1] " of " a[2]; fflush() } }'
	[ "$(cat build/setup-ninja.status)" = 0 ] || { cat build/setup-ninja.log; exit 1; }
fi

if [ ! -f models/atlas-next/config.json ]; then
	echo "setup: models/atlas-next is missing: the checkout is incomplete" >&2
	exit 1
fi

[ "$mount" = 1 ] || exit 0
# A mount whose atlasd died (kill -9, a crash) is stale: every look at it
# fails with "Transport endpoint is not connected". Detach it first.
if grep -qs " $mnt fuse" /proc/mounts && ! stat -f "$mnt" >/dev/null 2>&1; then
	echo "setup: removing the stale mount on $mnt (its atlasd is gone)"
	fusermount3 -u -z "$mnt"
fi
mkdir -p "$mnt"
if mountpoint -q "$mnt"; then
	fusermount3 -u "$mnt"
fi
# atlas and atlasd on the PATH: links to this build.
for b in appliance/atlasd tools/atlas; do
	$sudo ln -sf "$root/build/$b" "/usr/local/bin/${b#*/}" ||
		echo "setup: cannot link /usr/local/bin/${b#*/}; the binaries are in $root/build" >&2
done
build/appliance/atlasd "$mnt"
echo "atlas is mounted at $mnt (atlas and atlasd are in /usr/local/bin):"
echo "  echo 'Why is the sky blue?' > $mnt/s1/in; cat $mnt/s1/out"
echo "  cat $mnt/README; fusermount3 -u $mnt to stop"
