/* Private structures of the FUSE tree, shared by the fs/ sources, and the
 * request handlers that the operation table of ops.c lists.
 *
 * Files: fs.c the tree's life (open, mount, loop, stop, free); ops.c the
 * FUSE operation table; sessions.c the session table; nodes.c names,
 * inodes, attributes and directories; files.c open files and prompts;
 * ctl.c a session's ctl file and its line protocol; stream.c `out`, parked
 * reads and the waker thread; watch.c the mount watcher; render.c and
 * metrics.c generated text.
 *
 * Locks, in the order they nest: fs.lock (the session list and every
 * session's refs), a handle's fs_file.lock (its written bytes), then
 * session.lock (its engine handle and its out handles). fs.wake_lock is a
 * leaf: the engine's notify callback takes only it. No lock is held while
 * a reply or a notification goes to the kernel, and none while calling
 * fuse_req_interrupt_func(), whose callback takes session.lock.
 */
#ifndef ATLAS_FS_INTERNAL_H
#define ATLAS_FS_INTERNAL_H

#define FUSE_USE_VERSION 312

#include <fuse_lowlevel.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "config/config.h"
#include "engine/engine.h"
#include "fs/fs.h"

/* Inode numbers: fixed nodes are small; file k of the session with id i is
 * FS_INO_SESSIONS + i * FS_INO_STRIDE + k. Ids are never reused within a
 * mount, so an inode of a removed session stays stale (ENOENT). */
enum fs_node {
	NODE_ROOT = FUSE_ROOT_ID,
	NODE_README,
	NODE_CTL,
	NODE_CTL_SLOTS,
	NODE_CTL_KV,
	NODE_CTL_SPEC,
	NODE_CTL_EP,
	NODE_CTL_ENGINE,
	NODE_CTL_METRICS,
	NODE_CTL_CONFIG,
	NODE_FIXED_END,
};

enum fs_sfile { SF_DIR, SF_IN, SF_OUT, SF_CTL, SF_HISTORY, SF_STATUS, SF_END };
#define SF_FIRST_FILE SF_IN

#define FS_INO_SESSIONS 1024
#define FS_INO_STRIDE 8

#define FS_WAKE_KEYS 64          /* distinct sessions remembered between waker passes */
#define FS_READ_CHUNK 65536      /* bytes of out one read copies at most */
/* How long atlas_fs_unmount serves a mount that an outside or lazy unmount
 * removed, waiting for the kernel to end its connection (fs.c says why). */
#define FS_DETACHED_END_WAIT_MS 2000

struct fs_session;

/* A read of `out` that found nothing yet: its request waits here until the
 * waker (or an interrupt, or rmdir) answers it. Whoever moves it out of
 * PARK_PARKED under session.lock owns the reply. */
enum park_state { PARK_REGISTERING, PARK_PARKED, PARK_TAKEN };

struct fs_park {
	fuse_req_t req;
	size_t size;                     /* bytes asked for */
	struct fs_out *out;
	enum park_state state;
	bool interrupted;                /* the interrupt came while registering */
	struct fs_park *next;            /* out.parked FIFO */
};

/* An open handle of `out`: its own cursor into the turn bound at open. */
struct fs_out {
	struct fs_session *sess;
	uint64_t turn;                   /* bound at open: the newest, or the next one */
	uint64_t off;                    /* bytes of the turn already returned */
	struct fs_park *parked, *parked_tail;
	struct fuse_pollhandle *ph;      /* the kernel wants a poll notification; owned */
	struct fs_out *prev, *next;      /* sess.outs */
	uint64_t pass;                   /* waker pass that last served it (waker only) */
};

struct fs_session {
	struct atlas_fs *fs;
	uint64_t id;                     /* inode block, never reused */
	char name[64];
	uintptr_t key;                   /* address of the engine handle, to match notifies */
	uid_t uid;                       /* its owner: who made it, or cfg.session_owner */
	gid_t gid;
	int refs;                        /* under fs.lock: the list's (until removed) + handles' */
	bool removed;                    /* rmdir'd: no longer found by name or inode */
	struct timespec born;            /* times of its inodes */
	struct fs_session *next;         /* fs.sessions, creation order */

	pthread_mutex_t lock;
	struct atlas_session *es;        /* NULL once closed; engine calls only under lock */
	struct fs_out *outs;             /* open out handles */
	char ctl_error[256];             /* why the last refused ctl write was refused, "" once
					  * a batch applied (ctl.c shows it) */
	/* Bytes its open in and ctl handles hold, at most
	 * cfg.session_prompt_memory (and counted in fs.held too). */
	_Atomic uint64_t held;

	struct fs_session *wake_next;    /* the waker's list of one pass (waker only) */
};

enum fs_kind { FK_TEXT, FK_IN, FK_OUT, FK_CTL };

struct fs_ctl_parse;

/* The lines written to a session's ctl through one handle since its last
 * flush (ctl.c). */
struct fs_ctl_batch {
	char *text;                      /* [len] the lines as written; owned */
	size_t len;
	size_t checked;                  /* text[0, checked): complete lines already checked,
					  * into `parsed` */
	struct fs_ctl_parse *parsed;     /* what those lines set so far, from the settings of
					  * the batch's first write; owned, NULL before */
	int failed;                      /* 0, or the negative errno of a write since the last
					  * flush that failed: later writes and the flush fail
					  * with it and nothing is applied */
};

/* What fuse_file_info.fh points to. */
struct fs_file {
	atomic_int refs;                 /* the kernel's until release + replies in flight */
	struct atlas_fs *fs;
	struct fs_file *prev, *next;     /* fs.files, under fs.lock */
	enum fs_kind kind;
	struct fs_session *sess;         /* a ref; NULL for files outside sessions */
	pthread_mutex_t lock;            /* buf of FK_IN, ctl of FK_CTL */
	char *buf;                       /* FK_TEXT, FK_CTL: the snapshot read from; FK_IN:
					  * bytes written since the last commit; owned */
	size_t len, cap;
	int in_failed;                   /* FK_IN: 0, or the negative errno of a write since
					  * the last commit that failed: the commit drops the
					  * prompt and fails with it */
	size_t in_whole;                 /* FK_IN: bytes of buf checked as whole UTF-8
					  * characters (a write may end inside one) */
	struct fs_ctl_batch ctl;         /* FK_CTL: lines written since the last flush */
	bool follows;                    /* FK_TEXT of history: buf is the transcript at open,
					  * which only grows; a read past it reads it anew */
	struct fs_out out;               /* FK_OUT */
};

struct atlas_fs {
	struct atlas_engine *engine;
	struct atlas_config cfg;
	struct fuse_session *se;
	bool mounted;
	char mountpoint[ATLAS_PATH_MAX]; /* canonical, as the mount table shows it */

	/* The mount watcher (watch.c) and the thread of the request loop. */
	int mount_id;                    /* in /proc/self/mountinfo, -1: not watched */
	pthread_t watcher, loop_thread;
	bool watching;
	int watch_pipe[2];               /* a byte stops the watcher */
	uid_t ctl_uid, session_uid;      /* cfg.ctl_owner, cfg.session_owner */
	gid_t ctl_gid, session_gid;
	struct timespec born;            /* times of the fixed inodes */

	/* Bytes the open in and ctl handles hold (their buffers), at most
	 * cfg.prompt_memory: fs_hold / fs_unhold. */
	_Atomic uint64_t held;

	pthread_mutex_t lock;
	struct fs_session *sessions;
	struct fs_file *files;           /* open handles, freed at the end if never released */
	uint64_t next_id;

	pthread_t waker;
	bool waker_running;
	pthread_mutex_t wake_lock;
	pthread_cond_t wake_cond;
	uintptr_t wake_keys[FS_WAKE_KEYS];
	int n_wake_keys;
	bool wake_all;                   /* more sessions than wake_keys: serve all */
	bool wake_stop;
	char *wake_buf;                  /* [FS_READ_CHUNK] the waker's read buffer */
	uint64_t pass;                   /* (waker only) */
};

/* files.c: take bytes of the mount's prompt memory (cfg.prompt_memory)
 * for a handle's buffer: 0, or -ENOSPC when they are not there; and give
 * them back. */
int fs_hold(struct fs_session *s, uint64_t bytes);
void fs_unhold(struct fs_session *s, uint64_t bytes);

/* watch.c: note the id of the mount on fs->mountpoint (right after
 * mounting); while the loop runs, a thread that ends it (as SIGTERM does,
 * on the calling thread) when a lazy unmount takes the mount away. */
int fs_watch_find(struct atlas_fs *fs);
int fs_watch_start(struct atlas_fs *fs);
void fs_watch_stop(struct atlas_fs *fs);

/* ops.c: the FUSE session of fs, serving the operation table. */
struct fuse_session *fs_fuse_session_new(struct atlas_fs *fs, struct fuse_args *args);

/* sessions.c: the session table. Lookups return the session with a ref
 * (fs_session_put drops it), NULL if none. */
int fs_session_create(struct atlas_fs *fs, const char *name, uid_t uid, gid_t gid,
		      struct fs_session **out, char *err, size_t errlen);
struct fs_session *fs_session_by_name(struct atlas_fs *fs, const char *name);
/* With removed_too, a removed session that open handles still keep is found. */
struct fs_session *fs_session_by_id(struct atlas_fs *fs, uint64_t id, bool removed_too);
void fs_session_put(struct fs_session *s);
/* rmdir: remove the session called name from the tree and close its engine
 * session; its readers are answered by the waker. 0 or -ENOENT. */
int fs_session_remove(struct atlas_fs *fs, const char *name);
/* Take the engine handle away from s (under its lock, so that no engine
 * call on it is in flight) and close it. */
void fs_session_close(struct fs_session *s);
/* At the end of the mount: mark the first session not yet removed as
 * removed and return it with the table's ref, NULL when none is left. */
struct fs_session *fs_session_take_next(struct atlas_fs *fs);
/* Free s whatever its refs (atlas_fs_free). */
void fs_session_free(struct fs_session *s);

/* nodes.c: names, inodes, attributes, permissions and directories */
extern const char *const fs_sfile_names[SF_END];
bool fs_ino_session(fuse_ino_t ino, uint64_t *id, enum fs_sfile *f);
/* Whether the caller of req may access inode ino for mask (R_OK, W_OK,
 * X_OK; F_OK: it exists), by its owner and mode as the kernel's
 * default_permissions checks them (root may do anything): 0, -EACCES or
 * -ENOENT. Every request checks this itself, so that the owners hold
 * whatever default_permissions says. */
int fs_permission(fuse_req_t req, fuse_ino_t ino, int mask);
void fs_op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name);
void fs_op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup);
void fs_op_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets);
void fs_op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void fs_op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
		   struct fuse_file_info *fi);
void fs_op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void fs_op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		   struct fuse_file_info *fi);
void fs_op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void fs_op_access(fuse_req_t req, fuse_ino_t ino, int mask);
void fs_op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode);
void fs_op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name);
void fs_op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name);
void fs_op_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
		  struct fuse_file_info *fi);
void fs_op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev);
void fs_op_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name);
void fs_op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname);
void fs_op_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
		  const char *newname, unsigned int flags);

/* files.c: open files */
void fs_op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void fs_op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		struct fuse_file_info *fi);
void fs_op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
		 struct fuse_file_info *fi);
void fs_op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void fs_op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void fs_op_poll(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi,
		struct fuse_pollhandle *ph);
/* Drop a ref; the last one frees f and drops its session ref. */
void fs_file_put(struct fs_file *f);
void fs_file_free(struct fs_file *f);

/* ctl.c: a session's ctl file. The caller serialises the calls on one
 * batch (the handle's lock). */
/* The settings as `key value` lines (malloc'd, owned by the caller). */
int fs_ctl_text(struct fs_session *s, char **text, size_t *len);
/* Add a write to the batch and check its new complete lines: 0, -EINVAL for
 * a bad line, -EFBIG, -ENOMEM, -ENOENT (the batch has then failed). */
int fs_ctl_write(struct fs_session *s, struct fs_ctl_batch *b, const char *buf, size_t size);
/* Apply the batch (settings, then cancel/reset in order) and empty it; a
 * failed batch applies nothing and returns its write's error. */
int fs_ctl_flush(struct fs_session *s, struct fs_ctl_batch *b);
void fs_ctl_batch_free(struct fs_session *s, struct fs_ctl_batch *b);

/* stream.c: out handles, parked reads, the waker thread */
int fs_out_open(struct fs_session *s, struct fs_out *o);
void fs_out_read(fuse_req_t req, struct fs_out *o, size_t size, int flags);
void fs_out_poll(fuse_req_t req, struct fs_out *o, struct fuse_pollhandle *ph);
void fs_out_release(struct fs_out *o);
void fs_wake_session(struct atlas_fs *fs, struct fs_session *s);
void fs_notify(void *ctx, struct atlas_session *es);
int fs_waker_start(struct atlas_fs *fs);
void fs_waker_stop(struct atlas_fs *fs);
/* Answer what can be answered: parked reads with data, an end or an error
 * (ECANCELED once s is closed), pollers that became ready. No lock held. */
void fs_serve_session(struct atlas_fs *fs, struct fs_session *s);

/* render.c, metrics.c: generated text (malloc'd, owned by the caller) */
int fs_render_node(struct atlas_fs *fs, enum fs_node node, char **text, size_t *len);
int fs_render_status(const struct atlas_session_status *st, char **text, size_t *len);
int fs_render_metrics(const struct atlas_engine_stats *st, char **text, size_t *len);

#endif
