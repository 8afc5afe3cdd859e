/* atlasd's checks of its mountpoint before the model loads (mountpoint.h):
 * a clear message for a missing one, a stale atlas mount (left by an atlasd
 * that was killed) unmounted lazily, and a mountpoint that another atlasd
 * serves refused instead of stacking a second mount on it. */
#include "appliance/mountpoint.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"

/* The newest mount on a path, as /proc/self/mounts lists it. */
struct mount_entry {
	bool found;
	char source[256], type[64];
};

/* /proc/self/mounts writes space, tab, newline and backslash as \ooo. */
static void unescape(char *s)
{
	char *w = s;
	for (char *r = s; *r; r++) {
		if (r[0] == '\\' && r[1] >= '0' && r[1] <= '3' && r[2] >= '0' && r[2] <= '7' &&
		    r[3] >= '0' && r[3] <= '7') {
			*w++ = (char)((r[1] - '0') * 64 + (r[2] - '0') * 8 + (r[3] - '0'));
			r += 3;
		} else {
			*w++ = *r;
		}
	}
	*w = 0;
}

/* The last entry on path wins: it is the one a lookup of path reaches. */
static struct mount_entry find_mount(const char *path)
{
	struct mount_entry m = { 0 };
	FILE *fp = fopen("/proc/self/mounts", "re");
	if (!fp)
		return m;
	char line[PATH_MAX + 512];
	while (fgets(line, sizeof line, fp)) {
		char *save, *source = strtok_r(line, " ", &save);
		char *dir = strtok_r(NULL, " ", &save);
		char *type = strtok_r(NULL, " ", &save);
		if (!source || !dir || !type)
			continue;
		unescape(dir);
		if (strcmp(dir, path))
			continue;
		unescape(source);
		m.found = true;
		snprintf(m.source, sizeof m.source, "%s", source);
		snprintf(m.type, sizeof m.type, "%s", type);
	}
	fclose(fp);
	return m;
}

/* atlasd mounts with subtype and fsname atlas (appliance/atlasd.c); one
 * that did not name them got libfuse's default, its program's name. */
static bool is_atlas(const struct mount_entry *m)
{
	return m->found && (!strcmp(m->type, "fuse.atlas") || !strcmp(m->type, "fuse.atlasd") ||
			    (!strcmp(m->type, "fuse") && !strcmp(m->source, "atlas")));
}

/* path made absolute without looking at path itself, which a stale mount
 * makes unreadable: the parent resolved, then the last component. */
static int absolute(const char *path, char *out, size_t len)
{
	if (realpath(path, out))
		return 0;
	char copy[PATH_MAX];
	if (snprintf(copy, sizeof copy, "%s", path) >= (int)sizeof copy)
		return -ENAMETOOLONG;
	size_t n = strlen(copy);
	while (n > 1 && copy[n - 1] == '/')
		copy[--n] = 0;
	char *slash = strrchr(copy, '/');
	const char *base = copy, *parent = ".";
	if (slash) {
		*slash = 0;
		base = slash + 1;
		parent = slash == copy ? "/" : copy;
	}
	if (!strcmp(base, ".") || !strcmp(base, "..") || !*base)
		return -errno;
	char dir[PATH_MAX];
	if (!realpath(parent, dir))
		return -errno;
	if (snprintf(out, len, "%s%s%s", dir, strcmp(dir, "/") ? "/" : "", base) >= (int)len)
		return -ENAMETOOLONG;
	return 0;
}

/* fusermount3 -u -z path: detach the dead mount; 0 when it did. */
static int lazy_unmount(const char *path)
{
	pid_t pid = fork();
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		execlp("fusermount3", "fusermount3", "-u", "-z", "--", path, (char *)NULL);
		_exit(127);
	}
	int status;
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return -errno;
	return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -EIO;
}

int mountpoint_prepare(const char *path, char *out, size_t len, char *err, size_t errlen)
{
	int rc = absolute(path, out, len);
	if (rc == -ENOENT)
		return atlas_errf(err, errlen, rc, "mountpoint %s does not exist (make it with "
				  "mkdir -p %s)", path, path);
	if (rc)
		return atlas_errf(err, errlen, rc, "mountpoint %s: %s", path, strerror(-rc));
	/* statfs, not stat: the kernel answers stat from its cache for a while
	 * after the daemon died; statfs always asks the daemon. */
	struct statfs sfs;
	struct mount_entry m = find_mount(out);
	if (m.found && statfs(out, &sfs) && errno == ENOTCONN) {
		if (!is_atlas(&m))
			return atlas_errf(err, errlen, -ENOTCONN, "mountpoint %s: a stale mount "
					  "(%s, transport endpoint is not connected) that is not "
					  "atlas's; unmount it with: fusermount3 -u -z %s", out,
					  m.found ? m.type : "unknown", out);
		if (lazy_unmount(out))
			return atlas_errf(err, errlen, -ENOTCONN, "mountpoint %s: a stale atlas "
					  "mount (its atlasd is gone) that fusermount3 could not "
					  "remove; run, as its owner or root: fusermount3 -u -z %s",
					  out, out);
		log_warn("mountpoint %s: removed the stale mount of an atlasd that is gone", out);
		m = find_mount(out);
	}
	struct stat st;
	if (stat(out, &st) && errno == ENOENT)
		return atlas_errf(err, errlen, -ENOENT, "mountpoint %s does not exist (make it "
				  "with mkdir -p %s)", path, path);
	if (stat(out, &st))
		return atlas_errf(err, errlen, -errno, "mountpoint %s: %s", out, strerror(errno));
	if (!S_ISDIR(st.st_mode))
		return atlas_errf(err, errlen, -ENOTDIR, "mountpoint %s is not a directory", out);
	if (is_atlas(&m))
		return atlas_errf(err, errlen, -EBUSY, "mountpoint %s is already an atlas mount "
				  "(another atlasd serves it); stop that one first: "
				  "fusermount3 -u %s", out, out);
	return 0;
}
