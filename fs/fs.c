/* The life of the FUSE tree (fs.h): open (sessions s1..sN and those that
 * kv_persist kept, the waker thread, the engine's notify hook), mount, the
 * request loop, stop, unmount and free. What the requests do is in the
 * files that ops.c names. */
#include "fs/internal.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"

int atlas_fs_open(struct atlas_engine *e, const struct atlas_config *cfg, struct atlas_fs **out,
		  char *err, size_t errlen)
{
	struct atlas_fs *fs = calloc(1, sizeof *fs);
	char *buf = malloc(FS_READ_CHUNK);
	if (!fs || !buf) {
		free(fs);
		free(buf);
		return atlas_errf(err, errlen, -ENOMEM, "filesystem: out of memory");
	}
	fs->engine = e;
	fs->cfg = *cfg;
	int rc = atlas_config_user(cfg->ctl_owner, &fs->ctl_uid, &fs->ctl_gid, err, errlen);
	if (!rc)
		rc = atlas_config_user(cfg->session_owner, &fs->session_uid, &fs->session_gid, err,
				       errlen);
	if (rc) {
		free(fs);
		free(buf);
		return rc;
	}
	clock_gettime(CLOCK_REALTIME, &fs->born);
	fs->next_id = 1;
	fs->wake_buf = buf;
	pthread_mutex_init(&fs->lock, NULL);
	pthread_mutex_init(&fs->wake_lock, NULL);
	pthread_cond_init(&fs->wake_cond, NULL);

	rc = fs_waker_start(fs);
	if (rc)
		atlas_errf(err, errlen, rc, "filesystem: cannot start the waker thread");
	for (int i = 1; !rc && i <= cfg->sessions; i++) {
		char name[16];
		snprintf(name, sizeof name, "s%d", i);
		rc = fs_session_create(fs, name, fs->session_uid, fs->session_gid, NULL, err,
				       errlen);
	}
	/* Sessions a previous atlasd kept (kv_persist) come back as they were,
	 * owned by session_owner (who made them is not kept). */
	int n_kept = rc ? 0 : atlas_engine_kept(e, NULL, 0);
	char (*kept)[64] = n_kept ? calloc((size_t)n_kept, sizeof *kept) : NULL;
	if (n_kept && !kept)
		rc = atlas_errf(err, errlen, -ENOMEM, "filesystem: out of memory");
	n_kept = kept ? atlas_engine_kept(e, kept, n_kept) : 0;
	for (int i = 0; !rc && i < n_kept; i++)
		rc = fs_session_create(fs, kept[i], fs->session_uid, fs->session_gid, NULL, err,
				       errlen);
	free(kept);
	if (rc) {
		atlas_fs_stop(fs);
		atlas_fs_free(fs);
		return rc;
	}
	/* Only now: fs must outlive the engine's use of it, and a failed open
	 * frees fs before the engine is closed. */
	atlas_engine_set_notify(e, fs_notify, fs);
	*out = fs;
	return 0;
}

int atlas_fs_mount(struct atlas_fs *fs, struct fuse_args *args, const char *mountpoint,
		   char *err, size_t errlen)
{
	if ((fs->cfg.allow_other && fuse_opt_add_arg(args, "-oallow_other")) ||
	    (fs->cfg.default_permissions && fuse_opt_add_arg(args, "-odefault_permissions")))
		return atlas_errf(err, errlen, -ENOMEM, "out of memory");

	fs->se = fs_fuse_session_new(fs, args);
	if (!fs->se)
		return atlas_errf(err, errlen, -EINVAL,
				  "cannot start the FUSE session (bad FUSE option?)");
	/* Resolved before the mount: afterwards it would ask this very mount. */
	if (!realpath(mountpoint, fs->mountpoint))
		snprintf(fs->mountpoint, sizeof fs->mountpoint, "%s", mountpoint);
	if (fuse_session_mount(fs->se, mountpoint) != 0)
		return atlas_errf(err, errlen, -EIO, "cannot mount on %s", mountpoint);
	fs->mounted = true;
	if (fs_watch_find(fs))
		log_warn("cannot read the mount table: a lazy unmount will need SIGTERM");
	log_info("mounted on %s", mountpoint);
	return 0;
}

struct fuse_session *atlas_fs_fuse_session(struct atlas_fs *fs)
{
	return fs->se;
}

int atlas_fs_loop(struct atlas_fs *fs, const struct fuse_cmdline_opts *opts)
{
	int rc = fs_watch_start(fs);
	if (rc)
		log_warn("cannot start the mount watcher: %s", strerror(-rc));
	if (opts->singlethread) {
		rc = fuse_session_loop(fs->se);
	} else {
		struct fuse_loop_config *lc = fuse_loop_cfg_create();
		if (!lc) {
			fs_watch_stop(fs);
			return -ENOMEM;
		}
		/* Parked reads hold no worker, so a few workers serve any number
		 * of waiting readers; unless told otherwise, keep them all
		 * instead of respawning. */
		fuse_loop_cfg_set_max_threads(lc, opts->max_threads);
		fuse_loop_cfg_set_idle_threads(lc, opts->max_idle_threads == UINT_MAX ?
					       opts->max_threads : opts->max_idle_threads);
		fuse_loop_cfg_set_clone_fd(lc, (unsigned)opts->clone_fd);
		rc = fuse_session_loop_mt(fs->se, lc);
		fuse_loop_cfg_destroy(lc);
	}
	/* Before the caller removes the signal handlers that the watcher's
	 * SIGTERM needs. */
	fs_watch_stop(fs);
	/* A positive value is the signal that ended the loop: a clean end. */
	return rc < 0 ? rc : 0;
}

void atlas_fs_stop(struct atlas_fs *fs)
{
	fs_waker_stop(fs);
	for (struct fs_session *s; (s = fs_session_take_next(fs));) {
		fs_session_close(s);
		fs_serve_session(fs, s);
		fs_session_put(s);
	}
}

/* Serve the requests of a mount that is gone from the tree (an outside or
 * lazy unmount) until the kernel ends its connection, or ms pass; whether it
 * ended. The kernel keeps the connection while files of the detached mount
 * are open, and closing one sends a FLUSH that waits for this process: the
 * readers that atlas_fs_stop answered close their files through here. The
 * sessions are closed by then, so a request finds them ended. */
static bool serve_until_ended(struct atlas_fs *fs, int ms)
{
	struct fuse_buf buf = { .mem = NULL };
	const double end = atlas_now_s() + ms / 1e3;
	bool ended = false;
	fuse_session_reset(fs->se);
	for (double left; !ended && (left = end - atlas_now_s()) > 0;) {
		struct pollfd p = { .fd = fuse_session_fd(fs->se), .events = POLLIN };
		int n = poll(&p, 1, (int)(left * 1e3) + 1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		if (p.revents & (POLLERR | POLLNVAL)) {
			ended = p.revents & POLLERR;
			break;
		}
		int rc = fuse_session_receive_buf(fs->se, &buf);
		if (rc == -ENODEV)
			ended = true;
		else if (rc > 0)
			fuse_session_process_buf(fs->se, &buf);
		else if (rc != -EINTR && rc != -EAGAIN)
			break;
	}
	free(buf.mem);
	return ended;
}

/* A mount that is gone already is not unmounted again: the path may hold
 * someone else's mount by now. libfuse frees its copy of the path only in
 * fuse_session_unmount, which unmounts unless the kernel has ended the
 * connection: serve the detached mount until it ends, then let libfuse see
 * that. A file held open past the wait keeps the connection, and the path's
 * copy stays until the process exits. */
void atlas_fs_unmount(struct atlas_fs *fs)
{
	if (fs->mounted) {
		fuse_session_unmount(fs->se);
	} else if (fs->se && fuse_session_fd(fs->se) >= 0) {
		bool ended = serve_until_ended(fs, FS_DETACHED_END_WAIT_MS);
		atlas_fs_stop(fs);   /* a session that a request made meanwhile */
		if (ended)
			fuse_session_unmount(fs->se);
	}
	fs->mounted = false;
}

void atlas_fs_free(struct atlas_fs *fs)
{
	if (!fs)
		return;
	if (fs->se)
		fuse_session_destroy(fs->se);
	/* Handles the kernel never released (the loop is over) go with their sessions. */
	while (fs->files)
		fs_file_free(fs->files);
	while (fs->sessions) {
		struct fs_session *s = fs->sessions;
		fs->sessions = s->next;
		fs_session_free(s);
	}
	pthread_cond_destroy(&fs->wake_cond);
	pthread_mutex_destroy(&fs->wake_lock);
	pthread_mutex_destroy(&fs->lock);
	free(fs->wake_buf);
	free(fs);
}
