/* Private structures of the FUSE tree, shared by the fs/ sources.
 *
 * Locks, in the order they nest: fs.lock (the session list and every
 * session's refs) before session.lock (its engine handle and its out
 * handles). fs.wake_lock is a leaf: the engine's notify callback takes only
 * it. No lock is held while a reply or a notification goes to the kernel,
 * and none while calling fuse_req_interrupt_func(), whose callback takes
 * session.lock.
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
#define FS_IN_MAX (16u << 20)    /* bytes of one prompt */

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
	int refs;                        /* under fs.lock: the list's (until removed) + handles' */
	bool removed;                    /* rmdir'd: no longer found by name or inode */
	struct timespec born;            /* times of its inodes */
	struct fs_session *next;         /* fs.sessions, creation order */

	pthread_mutex_t lock;
	struct atlas_session *es;        /* NULL once closed; engine calls only under lock */
	struct fs_out *outs;             /* open out handles */

	struct fs_session *wake_next;    /* the waker's list of one pass (waker only) */
};

enum fs_kind { FK_TEXT, FK_IN, FK_OUT, FK_CTL };

/* What fuse_file_info.fh points to. */
struct fs_file {
	atomic_int refs;                 /* the kernel's until release + replies in flight */
	struct atlas_fs *fs;
	struct fs_file *prev, *next;     /* fs.files, under fs.lock */
	enum fs_kind kind;
	struct fs_session *sess;         /* a ref; NULL for files outside sessions */
	pthread_mutex_t lock;            /* buf of FK_IN, pending of FK_CTL */
	char *buf;                       /* FK_TEXT, FK_CTL: the snapshot read from; FK_IN:
					  * bytes written since the last commit; owned */
	size_t len, cap;
	char *pending;                   /* FK_CTL: lines written since the last flush; owned */
	size_t pending_len;
	bool poisoned;                   /* FK_CTL: a write since the last flush failed, so
					  * that flush applies nothing */
	struct fs_out out;               /* FK_OUT */
};

struct atlas_fs {
	struct atlas_engine *engine;
	struct atlas_config cfg;
	struct fuse_session *se;
	bool mounted;
	uid_t uid;
	gid_t gid;
	struct timespec born;            /* times of the fixed inodes */

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

/* fs.c: the session table */
int fs_session_create(struct atlas_fs *fs, const char *name, struct fs_session **out, char *err,
		      size_t errlen);
struct fs_session *fs_session_by_name(struct atlas_fs *fs, const char *name);
/* With removed_too, a removed session that open handles still keep is found. */
struct fs_session *fs_session_by_id(struct atlas_fs *fs, uint64_t id, bool removed_too);
void fs_session_put(struct fs_session *s);
int fs_session_remove(struct atlas_fs *fs, const char *name);

/* nodes.c: names, inodes, attributes and directories */
extern const char *const fs_sfile_names[SF_END];
void fs_init_ops_nodes(struct fuse_lowlevel_ops *ops);
bool fs_ino_session(fuse_ino_t ino, uint64_t *id, enum fs_sfile *f);

/* files.c: open files */
void fs_init_ops_files(struct fuse_lowlevel_ops *ops);
/* Drop a ref; the last one frees f and drops its session ref. */
void fs_file_put(struct fs_file *f);
void fs_file_free(struct fs_file *f);

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
