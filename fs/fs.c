/* Setting up, running and tearing down the FUSE tree, and its session table. */
#include "fs/internal.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"

int fs_session_create(struct atlas_fs *fs, const char *name, struct fs_session **out, char *err,
		      size_t errlen)
{
	struct fs_session *s = calloc(1, sizeof *s);
	if (!s)
		return atlas_errf(err, errlen, -ENOMEM, "session '%s': out of memory", name);
	int rc = atlas_session_open(fs->engine, name, &s->es, err, errlen);
	if (rc) {
		free(s);
		return rc;
	}
	s->fs = fs;
	s->key = (uintptr_t)s->es;
	snprintf(s->name, sizeof s->name, "%s", name);
	clock_gettime(CLOCK_REALTIME, &s->born);
	pthread_mutex_init(&s->lock, NULL);

	pthread_mutex_lock(&fs->lock);
	s->id = fs->next_id++;
	s->refs = out ? 2 : 1;
	struct fs_session **tail = &fs->sessions;
	while (*tail)
		tail = &(*tail)->next;
	*tail = s;
	pthread_mutex_unlock(&fs->lock);
	if (out)
		*out = s;
	return 0;
}

struct fs_session *fs_session_by_name(struct atlas_fs *fs, const char *name)
{
	pthread_mutex_lock(&fs->lock);
	struct fs_session *s = fs->sessions;
	while (s && (s->removed || strcmp(s->name, name) != 0))
		s = s->next;
	if (s)
		s->refs++;
	pthread_mutex_unlock(&fs->lock);
	return s;
}

struct fs_session *fs_session_by_id(struct atlas_fs *fs, uint64_t id, bool removed_too)
{
	pthread_mutex_lock(&fs->lock);
	struct fs_session *s = fs->sessions;
	while (s && ((s->removed && !removed_too) || s->id != id))
		s = s->next;
	if (s)
		s->refs++;
	pthread_mutex_unlock(&fs->lock);
	return s;
}

static void session_free(struct fs_session *s)
{
	pthread_mutex_destroy(&s->lock);
	free(s);
}

void fs_session_put(struct fs_session *s)
{
	struct atlas_fs *fs = s->fs;
	pthread_mutex_lock(&fs->lock);
	bool last = --s->refs == 0;
	if (last) {
		struct fs_session **pp = &fs->sessions;
		while (*pp != s)
			pp = &(*pp)->next;
		*pp = s->next;
	}
	pthread_mutex_unlock(&fs->lock);
	if (last)
		session_free(s);
}

/* Take the engine handle away from s (under its lock, so that no engine
 * call on it is in flight) and close it. Readers are answered by serving s. */
static void session_close(struct fs_session *s)
{
	pthread_mutex_lock(&s->lock);
	struct atlas_session *es = s->es;
	s->es = NULL;
	pthread_mutex_unlock(&s->lock);
	if (es)
		atlas_session_close(es);
}

int fs_session_remove(struct atlas_fs *fs, const char *name)
{
	pthread_mutex_lock(&fs->lock);
	struct fs_session *s = fs->sessions;
	while (s && (s->removed || strcmp(s->name, name) != 0))
		s = s->next;
	if (!s) {
		pthread_mutex_unlock(&fs->lock);
		return -ENOENT;
	}
	s->removed = true;   /* the list's ref now keeps it until this function ends */
	pthread_mutex_unlock(&fs->lock);

	session_close(s);
	/* Parked readers and pollers of s are answered by the waker thread: no
	 * reply storm and no poll notification from inside this handler. */
	fs_wake_session(fs, s);
	fs_session_put(s);
	log_info("session %s removed", name);
	return 0;
}

static void fs_init(void *userdata, struct fuse_conn_info *conn)
{
	/* Every file is generated or streamed: the kernel must neither cache
	 * writes nor split a read of `out` into parallel requests. */
	conn->want &= ~(unsigned)(FUSE_CAP_WRITEBACK_CACHE | FUSE_CAP_ASYNC_DIO);
	if (conn->capable & FUSE_CAP_ATOMIC_O_TRUNC)
		conn->want |= FUSE_CAP_ATOMIC_O_TRUNC;
}

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
	fs->uid = getuid();
	fs->gid = getgid();
	clock_gettime(CLOCK_REALTIME, &fs->born);
	fs->next_id = 1;
	fs->wake_buf = buf;
	pthread_mutex_init(&fs->lock, NULL);
	pthread_mutex_init(&fs->wake_lock, NULL);
	pthread_cond_init(&fs->wake_cond, NULL);

	int rc = fs_waker_start(fs);
	if (rc)
		atlas_errf(err, errlen, rc, "filesystem: cannot start the waker thread");
	for (int i = 1; !rc && i <= cfg->sessions; i++) {
		char name[16];
		snprintf(name, sizeof name, "s%d", i);
		rc = fs_session_create(fs, name, NULL, err, errlen);
	}
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

	struct fuse_lowlevel_ops ops;
	memset(&ops, 0, sizeof ops);
	ops.init = fs_init;
	fs_init_ops_nodes(&ops);
	fs_init_ops_files(&ops);
	fs->se = fuse_session_new(args, &ops, sizeof ops, fs);
	if (!fs->se)
		return atlas_errf(err, errlen, -EINVAL,
				  "cannot start the FUSE session (bad FUSE option?)");
	if (fuse_session_mount(fs->se, mountpoint) != 0)
		return atlas_errf(err, errlen, -EIO, "cannot mount on %s", mountpoint);
	fs->mounted = true;
	log_info("mounted on %s", mountpoint);
	return 0;
}

struct fuse_session *atlas_fs_fuse_session(struct atlas_fs *fs)
{
	return fs->se;
}

int atlas_fs_loop(struct atlas_fs *fs, const struct fuse_cmdline_opts *opts)
{
	int rc;
	if (opts->singlethread) {
		rc = fuse_session_loop(fs->se);
	} else {
		struct fuse_loop_config *lc = fuse_loop_cfg_create();
		if (!lc)
			return -ENOMEM;
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
	/* A positive value is the signal that ended the loop: a clean end. */
	return rc < 0 ? rc : 0;
}

void atlas_fs_stop(struct atlas_fs *fs)
{
	fs_waker_stop(fs);
	for (;;) {
		pthread_mutex_lock(&fs->lock);
		struct fs_session *s = fs->sessions;
		while (s && s->removed)
			s = s->next;
		if (s)
			s->removed = true;
		pthread_mutex_unlock(&fs->lock);
		if (!s)
			break;
		session_close(s);
		fs_serve_session(fs, s);
		fs_session_put(s);
	}
}

void atlas_fs_unmount(struct atlas_fs *fs)
{
	if (fs->mounted)
		fuse_session_unmount(fs->se);
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
		session_free(s);
	}
	pthread_cond_destroy(&fs->wake_cond);
	pthread_mutex_destroy(&fs->wake_lock);
	pthread_mutex_destroy(&fs->lock);
	free(fs->wake_buf);
	free(fs);
}
