/* Open files: generated text snapshots (README, the ctl/ files, history,
 * status, a session's ctl), prompts written to `in` and committed at flush,
 * and the dispatch of a session's `ctl` writes to ctl.c and of `out` to
 * stream.c. */
#include "fs/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/utf8.h"
#include "common/log.h"

static struct fs_file *file_new(struct atlas_fs *fs, enum fs_kind kind, struct fs_session *s)
{
	struct fs_file *f = calloc(1, sizeof *f);
	if (!f)
		return NULL;
	atomic_init(&f->refs, 1);
	f->fs = fs;
	f->kind = kind;
	f->sess = s;
	pthread_mutex_init(&f->lock, NULL);
	pthread_mutex_lock(&fs->lock);
	f->next = fs->files;
	if (fs->files)
		fs->files->prev = f;
	fs->files = f;
	pthread_mutex_unlock(&fs->lock);
	return f;
}

/* Frees f whatever its refs (the end of the mount, or a failed open) and
 * drops its session ref (the one handed to file_new). */
void fs_file_free(struct fs_file *f)
{
	struct atlas_fs *fs = f->fs;
	if (f->kind == FK_OUT && f->out.sess)
		fs_out_release(&f->out);
	pthread_mutex_lock(&fs->lock);
	if (f->prev)
		f->prev->next = f->next;
	else
		fs->files = f->next;
	if (f->next)
		f->next->prev = f->prev;
	pthread_mutex_unlock(&fs->lock);
	if (f->sess && f->kind == FK_IN)
		fs_unhold(f->sess, f->cap);
	if (f->sess && f->kind == FK_CTL)
		fs_ctl_batch_free(f->sess, &f->ctl);
	if (f->sess)
		fs_session_put(f->sess);
	pthread_mutex_destroy(&f->lock);
	free(f->buf);
	free(f);
}

/* Take bytes from *held within limit: 0, or -ENOSPC and nothing taken. */
static int take(_Atomic uint64_t *held, uint64_t limit, uint64_t bytes)
{
	uint64_t now = atomic_load(held);
	do {
		if (bytes > limit - ATLAS_MIN(now, limit))
			return -ENOSPC;
	} while (!atomic_compare_exchange_weak(held, &now, now + bytes));
	return 0;
}

int fs_hold(struct fs_session *s, uint64_t bytes)
{
	struct atlas_fs *fs = s->fs;
	if (take(&s->held, fs->cfg.session_prompt_memory, bytes))
		return -ENOSPC;
	if (take(&fs->held, fs->cfg.prompt_memory, bytes)) {
		atomic_fetch_sub(&s->held, bytes);
		return -ENOSPC;
	}
	return 0;
}

void fs_unhold(struct fs_session *s, uint64_t bytes)
{
	atomic_fetch_sub(&s->held, bytes);
	atomic_fetch_sub(&s->fs->held, bytes);
}

void fs_file_put(struct fs_file *f)
{
	if (atomic_fetch_sub(&f->refs, 1) == 1)
		fs_file_free(f);
}

static int session_history_text(struct fs_session *s, char **text, size_t *len)
{
	pthread_mutex_lock(&s->lock);
	int rc = s->es ? atlas_session_history(s->es, text, len) : -ENOENT;
	pthread_mutex_unlock(&s->lock);
	return rc < 0 ? rc : 0;
}

static int session_status_text(struct fs_session *s, char **text, size_t *len)
{
	struct atlas_session_status st;
	pthread_mutex_lock(&s->lock);
	int rc = s->es ? atlas_session_status(s->es, &st) : -ENOENT;
	pthread_mutex_unlock(&s->lock);
	return rc < 0 ? rc : fs_render_status(&st, text, len);
}

/* A file of session s, checked against the access mode it is opened with. */
static int open_session_file(struct atlas_fs *fs, struct fs_session *s, enum fs_sfile sf,
			     int accmode, struct fs_file **out)
{
	static const enum fs_kind kinds[SF_END] = {
		[SF_IN] = FK_IN, [SF_OUT] = FK_OUT, [SF_CTL] = FK_CTL,
		[SF_HISTORY] = FK_TEXT, [SF_STATUS] = FK_TEXT,
	};
	if (sf == SF_DIR)
		return -EISDIR;
	if ((sf == SF_IN && accmode != O_WRONLY) || (sf != SF_IN && sf != SF_CTL && accmode != O_RDONLY))
		return -EACCES;
	char *text = NULL;
	size_t len = 0;
	int rc = 0;
	if (sf == SF_CTL)
		rc = fs_ctl_text(s, &text, &len);
	else if (sf == SF_HISTORY)
		rc = session_history_text(s, &text, &len);
	else if (sf == SF_STATUS)
		rc = session_status_text(s, &text, &len);
	if (rc)
		return rc;
	struct fs_file *f = file_new(fs, kinds[sf], s);
	if (!f) {
		free(text);
		return -ENOMEM;
	}
	f->buf = text;
	f->len = len;
	f->follows = sf == SF_HISTORY;
	if (sf == SF_OUT && (rc = fs_out_open(s, &f->out))) {
		f->sess = NULL;   /* the caller keeps its ref */
		fs_file_free(f);
		return rc;
	}
	/* A prompt is on its way: its session's KV may start coming back from
	 * the swap tier while it is written. */
	if (sf == SF_IN) {
		pthread_mutex_lock(&s->lock);
		if (s->es)
			atlas_session_prefetch(s->es);
		pthread_mutex_unlock(&s->lock);
	}
	*out = f;
	return 0;
}

void fs_op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct atlas_fs *fs = fuse_req_userdata(req);
	int accmode = fi->flags & O_ACCMODE;
	struct fs_file *f = NULL;
	uint64_t id;
	enum fs_sfile sf;
	/* Modes say who may open what: ctl/ is readable by all and writable by
	 * its owner, a session's files are its owner's. */
	int rc = fs_permission(req, ino, accmode == O_RDONLY ? R_OK : accmode == O_WRONLY ? W_OK
							: R_OK | W_OK);
	if (rc) {
		fuse_reply_err(req, -rc);
		return;
	}
	if (ino > NODE_ROOT && ino < NODE_FIXED_END) {
		char *text = NULL;
		size_t len = 0;
		rc = accmode != O_RDONLY ? -EACCES : fs_render_node(fs, (enum fs_node)ino, &text, &len);
		if (!rc && !(f = file_new(fs, FK_TEXT, NULL))) {
			free(text);
			rc = -ENOMEM;
		}
		if (!rc) {
			f->buf = text;
			f->len = len;
		}
	} else if (fs_ino_session(ino, &id, &sf)) {
		struct fs_session *s = fs_session_by_id(fs, id, false);
		rc = s ? open_session_file(fs, s, sf, accmode, &f) : -ENOENT;
		if (rc && s)
			fs_session_put(s);
	} else {
		rc = -ENOENT;
	}
	if (rc) {
		fuse_reply_err(req, -rc);
		return;
	}
	/* Generated at open, streamed or consumed: never cached by the kernel. */
	fi->direct_io = 1;
	fi->keep_cache = 0;
	fi->nonseekable = f->kind == FK_OUT;
	fi->fh = (uintptr_t)f;
	if (fuse_reply_open(req, fi) != 0)
		fs_file_free(f);   /* the open was interrupted: no release will come */
}

/* A read of history past what the handle's snapshot holds: the transcript
 * as it is now (it only grew since), read at off. */
static bool history_read_on(fuse_req_t req, struct fs_file *f, size_t size, off_t off)
{
	char *text;
	size_t len;
	if (session_history_text(f->sess, &text, &len))
		return false;   /* the session is gone: the snapshot is all there is */
	if (off < 0 || (size_t)off >= len)
		fuse_reply_buf(req, NULL, 0);
	else
		fuse_reply_buf(req, text + off, ATLAS_MIN(size, len - (size_t)off));
	free(text);
	return true;
}

void fs_op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		struct fuse_file_info *fi)
{
	struct fs_file *f = (struct fs_file *)(uintptr_t)fi->fh;
	if (f->follows && off >= 0 && (size_t)off + size > f->len &&
	    history_read_on(req, f, size, off))
		return;
	if (f->kind == FK_OUT) {
		fs_out_read(req, &f->out, size, fi->flags);
		return;
	}
	if (f->kind == FK_IN) {
		fuse_reply_err(req, EBADF);
		return;
	}
	/* The reply completes the read: a release of f may then overtake the
	 * return of fuse_reply_buf, which must still find f->buf. */
	atomic_fetch_add(&f->refs, 1);
	if (off < 0 || (size_t)off >= f->len)
		fuse_reply_buf(req, NULL, 0);
	else
		fuse_reply_buf(req, f->buf + off, ATLAS_MIN(size, f->len - (size_t)off));
	fs_file_put(f);
}

/* Whether the session has a turn that has not ended: a prompt cannot be
 * committed then. */
static bool session_busy(struct fs_session *s)
{
	struct atlas_session_status st;
	bool busy = false;
	pthread_mutex_lock(&s->lock);
	if (s->es && atlas_session_status(s->es, &st) == 0)
		busy = st.state == ATLAS_STATE_QUEUED || st.state == ATLAS_STATE_PREFILL ||
		       st.state == ATLAS_STATE_DECODE || st.state == ATLAS_STATE_PARKED;
	pthread_mutex_unlock(&s->lock);
	return busy;
}

/* A write that fails (busy, too long, the mount's prompt memory or the
 * daemon's memory full, not UTF-8) fails the prompt: later writes fail with its error and the commit drops what was
 * written, so that no part of a prompt is ever taken for the whole. */
static int in_append(struct fs_file *f, const char *buf, size_t size)
{
	/* The commit at close refuses a prompt while a turn runs, but shells do
	 * not report errors of close (`echo p > in` would lose the prompt without
	 * a word): the first write of a prompt says EBUSY already. */
	const bool busy = f->len == 0 && !f->in_failed && session_busy(f->sess);
	pthread_mutex_lock(&f->lock);
	int rc = f->in_failed;
	if (!rc && busy) {
		rc = -EBUSY;
	} else if (!rc && size > f->fs->cfg.prompt_max - f->len) {
		rc = -EFBIG;
	} else if (!rc && f->len + size > f->cap) {
		/* The buffer grows by doubling, within prompt_max, and holds its
		 * bytes of the mount's prompt memory. */
		size_t cap = ATLAS_MIN(ATLAS_MAX(f->cap * 2, f->len + size),
				       (size_t)f->fs->cfg.prompt_max);
		rc = fs_hold(f->sess, cap - f->cap);
		char *n = rc ? NULL : realloc(f->buf, cap);
		if (n) {
			f->buf = n;
			f->cap = cap;
		} else if (!rc) {
			fs_unhold(f->sess, cap - f->cap);
			rc = -ENOMEM;
		}
	}
	if (!rc) {
		memcpy(f->buf + f->len, buf, size);
		f->len += size;
		/* Text that is not UTF-8 fails the write that brings it, where a
		 * shell sees it (a commit's error only close would report). */
		size_t whole;
		rc = atlas_utf8_check(f->buf + f->in_whole, f->len - f->in_whole, &whole);
		f->in_whole += whole;
	}
	f->in_failed = rc;
	pthread_mutex_unlock(&f->lock);
	return rc;
}

/* Commit what was written since the last commit as a prompt. */
static int in_commit(struct fs_file *f)
{
	struct fs_session *s = f->sess;
	char err[ATLAS_ERRLEN] = "";
	int rc = 0;
	pthread_mutex_lock(&f->lock);
	if (!f->in_failed && f->in_whole < f->len)
		f->in_failed = -EILSEQ; /* it ends inside a character */
	if (f->in_failed) {
		rc = atlas_errf(err, sizeof err, f->in_failed, "prompt not accepted: a write of it "
				"failed (%s)", f->in_failed == -EILSEQ ? "not UTF-8 text"
				: strerror(-f->in_failed));
		/* A reader waiting for this prompt's turn ends with the error;
		 * a prompt refused because a turn runs leaves that turn alone. */
		pthread_mutex_lock(&s->lock);
		if (s->es && f->in_failed != -EBUSY)
			atlas_session_reject(s->es, err);
		pthread_mutex_unlock(&s->lock);
		f->len = 0;
		f->in_whole = 0;
		f->in_failed = 0;
	} else if (f->len) {
		pthread_mutex_lock(&s->lock);
		if (s->es)
			rc = atlas_session_submit(s->es, f->buf, f->len, err, sizeof err);
		else
			rc = atlas_errf(err, sizeof err, -ENOENT, "the session is removed");
		pthread_mutex_unlock(&s->lock);
		f->len = 0;
		f->in_whole = 0;
	}
	/* The prompt is the engine's now (or gone): its buffer goes back. */
	fs_unhold(f->sess, f->cap);
	free(f->buf);
	f->buf = NULL;
	f->cap = 0;
	pthread_mutex_unlock(&f->lock);
	if (rc < 0) {
		log_info("session %s: prompt not committed: %s", s->name, err);
		return rc;
	}
	if (rc > 0)
		log_debug("session %s: turn %d committed", s->name, rc);
	return 0;
}

void fs_op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
		 struct fuse_file_info *fi)
{
	struct fs_file *f = (struct fs_file *)(uintptr_t)fi->fh;
	int rc = -EACCES;
	if (f->kind == FK_IN) {
		rc = in_append(f, buf, size);
	} else if (f->kind == FK_CTL) {
		pthread_mutex_lock(&f->lock);
		rc = fs_ctl_write(f->sess, &f->ctl, buf, size);
		pthread_mutex_unlock(&f->lock);
	}
	if (rc)
		fuse_reply_err(req, -rc);
	else
		fuse_reply_write(req, size);
}

/* A prompt and ctl lines are committed here, at close, and not at release:
 * release is asynchronous, so `echo p > in; cat out` would race it. */
void fs_op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs_file *f = (struct fs_file *)(uintptr_t)fi->fh;
	int rc = 0;
	if (f->kind == FK_IN) {
		rc = in_commit(f);
	} else if (f->kind == FK_CTL) {
		pthread_mutex_lock(&f->lock);
		rc = fs_ctl_flush(f->sess, &f->ctl);
		pthread_mutex_unlock(&f->lock);
	}
	fuse_reply_err(req, -rc);
}

void fs_op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	fuse_reply_err(req, 0);
	fs_file_put((struct fs_file *)(uintptr_t)fi->fh);
}

void fs_op_poll(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi,
		struct fuse_pollhandle *ph)
{
	struct fs_file *f = (struct fs_file *)(uintptr_t)fi->fh;
	if (f->kind == FK_OUT) {
		fs_out_poll(req, &f->out, ph);
		return;
	}
	if (ph)
		fuse_pollhandle_destroy(ph);
	fuse_reply_poll(req, f->kind == FK_IN ? POLLOUT | POLLWRNORM :
			f->kind == FK_CTL ? POLLIN | POLLRDNORM | POLLOUT | POLLWRNORM :
			POLLIN | POLLRDNORM);
}
