/* The mount watcher. A lazy unmount (umount -l, fusermount3 -u -z)
 * detaches the mount at once, but the kernel keeps the connection while
 * files of it are open, and sends nothing: readers parked on idle sessions'
 * `out` would wait for atlasd, and atlasd for requests, for ever. This
 * thread polls the mount table (/proc/self/mountinfo signals every change)
 * and, once the mount is no longer in it, ends the request loop as SIGTERM
 * does; atlas_fs_stop then answers the parked readers and the daemon
 * exits, which ends the connection for any handle still open. */
#include "fs/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"

/* Undo mountinfo's octal escapes (\040 for a space) in place. */
static void unescape(char *s)
{
	char *o = s;
	for (; *s; s++) {
		if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' &&
		    s[3] >= '0' && s[3] <= '7') {
			*o++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
			s += 3;
		} else {
			*o++ = *s;
		}
	}
	*o = 0;
}

/* The id of the newest FUSE mount on path in the mount table f (read from
 * its start), or with a NULL path the id `id` if it is still there; -1 when
 * there is none. By id, a mount moved elsewhere (mount --move) is still
 * there. */
static int find_mount(FILE *f, const char *path, int id_wanted)
{
	char *line = NULL;
	size_t cap = 0;
	int id = -1;
	rewind(f);
	while (getline(&line, &cap, f) > 0) {
		/* ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - TYPE ... */
		int mid, end = 0;
		char point[4096];
		if (sscanf(line, "%d %*d %*s %*s %4095s%n", &mid, point, &end) != 2)
			continue;
		const char *type = strstr(line + end, " - ");
		unescape(point);
		if (type && !strncmp(type + 3, "fuse", 4) &&
		    (path ? !strcmp(point, path) : mid == id_wanted))
			id = mid;
	}
	free(line);
	return id;
}

int fs_watch_find(struct atlas_fs *fs)
{
	fs->mount_id = -1;
	FILE *f = fopen("/proc/self/mountinfo", "re");
	if (!f)
		return -errno;
	fs->mount_id = find_mount(f, fs->mountpoint, -1);
	fclose(f);
	return 0;
}

static void *watch_main(void *arg)
{
	struct atlas_fs *fs = arg;
	FILE *f = fopen("/proc/self/mountinfo", "re");
	if (!f) {
		log_warn("cannot watch the mount table: %s", strerror(errno));
		return NULL;
	}
	struct pollfd p[2] = { { .fd = fileno(f), .events = POLLPRI },
			       { .fd = fs->watch_pipe[0], .events = POLLIN } };
	for (;;) {
		if (poll(p, 2, -1) < 0 && errno != EINTR)
			break;
		if (p[1].revents)
			break;
		if (!(p[0].revents & (POLLPRI | POLLERR)) ||
		    find_mount(f, NULL, fs->mount_id) == fs->mount_id)
			continue;
		log_info("%s is no longer mounted (lazy unmount): stopping", fs->mountpoint);
		fs->mounted = false;   /* read after the join: nothing left to unmount */
		fuse_session_exit(fs->se);
		/* The loop's thread may wait for a request that never comes:
		 * libfuse's handler of SIGTERM (fuse_set_signal_handlers) wakes
		 * it, which the default action would not do gently. */
		struct sigaction sa;
		if (sigaction(SIGTERM, NULL, &sa) == 0 && sa.sa_handler != SIG_DFL &&
		    sa.sa_handler != SIG_IGN)
			pthread_kill(fs->loop_thread, SIGTERM);
		break;
	}
	fclose(f);
	return NULL;
}

int fs_watch_start(struct atlas_fs *fs)
{
	if (fs->mount_id < 0)
		return 0;
	if (pipe2(fs->watch_pipe, O_CLOEXEC))
		return -errno;
	fs->loop_thread = pthread_self();
	/* Signals that end the loop go to the loop's thread, not this one. */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	int rc = -pthread_create(&fs->watcher, NULL, watch_main, fs);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc) {
		close(fs->watch_pipe[0]);
		close(fs->watch_pipe[1]);
		return rc;
	}
	fs->watching = true;
	return 0;
}

void fs_watch_stop(struct atlas_fs *fs)
{
	if (!fs->watching)
		return;
	char c = 0;
	if (write(fs->watch_pipe[1], &c, 1) != 1)
		log_warn("cannot stop the mount watcher: %s", strerror(errno));
	pthread_join(fs->watcher, NULL);
	close(fs->watch_pipe[0]);
	close(fs->watch_pipe[1]);
	fs->watching = false;
}
