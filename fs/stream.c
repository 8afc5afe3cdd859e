/* `out`: per-handle cursors, reads that park their request instead of a
 * worker thread, poll, interrupts, and the waker thread that answers parked
 * requests when the engine reports new output.
 *
 * The engine's notify callback only records which session changed and wakes
 * the waker; the waker reads the new bytes with no lock of the engine held
 * and replies with no lock of ours held. A parked request is answered by
 * exactly one of: the waker (data, end of turn, error, session removed), its
 * interrupt callback (EINTR), or release of a handle that still had one.
 */
#include "fs/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "common/err.h"
#include "common/log.h"

/* Bytes of buf[0..n) that end on a whole UTF-8 character. A read whose
 * buffer filled up may have cut the last character: hold that back, unless
 * nothing else would be returned. */
static size_t utf8_whole(const char *buf, size_t n)
{
	size_t p = n;
	while (p > 0 && n - p < 3 && ((unsigned char)buf[p - 1] & 0xC0) == 0x80)
		p--;
	if (p == 0)
		return n;
	unsigned char lead = (unsigned char)buf[p - 1];
	size_t need = lead < 0xC0 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
	if (n - (p - 1) >= need || p - 1 == 0)
		return n;
	return p - 1;
}

/* Under s->lock. Returns true with *res set (bytes copied to buf, 0 at the
 * end of the turn, or a negative errno) when the read can be answered now,
 * false when nothing is available yet. */
static bool out_fetch(struct fs_out *o, char *buf, size_t size, ssize_t *res)
{
	struct fs_session *s = o->sess;
	if (!s->es) {
		*res = -ECANCELED;
		return true;
	}
	struct atlas_read r;
	int rc = atlas_session_read(s->es, o->turn, o->off, buf, size, &r);
	if (rc < 0) {
		*res = rc;
		return true;
	}
	if (r.n) {
		size_t n = r.n == size ? utf8_whole(buf, r.n) : r.n;
		o->off += n;
		*res = (ssize_t)n;
		return true;
	}
	if (r.more)
		return false;
	*res = r.error;
	return true;
}

/* Under s->lock: would a read be answered now? */
static bool out_ready(struct fs_out *o)
{
	struct fs_session *s = o->sess;
	if (!s->es)
		return true;
	char c;
	struct atlas_read r;
	int rc = atlas_session_read(s->es, o->turn, o->off, &c, 1, &r);
	return rc < 0 || r.n > 0 || !r.more;
}

static void reply(fuse_req_t req, const char *buf, ssize_t res)
{
	if (res < 0)
		fuse_reply_err(req, (int)-res);
	else
		fuse_reply_buf(req, buf, (size_t)res);
}

/* Answer a request taken out of PARK_PARKED (or never parked). Unregistering
 * the interrupt callback waits for a running one to return, so p is not
 * freed under it. */
static void park_finish(struct fs_park *p, const char *buf, ssize_t res)
{
	fuse_req_interrupt_func(p->req, NULL, NULL);
	reply(p->req, buf, res);
	free(p);
}

/* Under s->lock. */
static void park_unlink(struct fs_out *o, struct fs_park *p)
{
	struct fs_park **pp = &o->parked, *prev = NULL;
	while (*pp != p) {
		prev = *pp;
		pp = &(*pp)->next;
	}
	*pp = p->next;
	if (o->parked_tail == p)
		o->parked_tail = prev;
	p->next = NULL;
}

/* Interrupt callback: called by libfuse with the request's lock held, either
 * from another worker (FUSE_INTERRUPT) or inline while registering. */
static void park_interrupted(fuse_req_t req, void *data)
{
	struct fs_park *p = data;
	struct fs_session *s = p->out->sess;
	pthread_mutex_lock(&s->lock);
	enum park_state state = p->state;
	if (state == PARK_REGISTERING)
		p->interrupted = true;
	if (state == PARK_PARKED) {
		park_unlink(p->out, p);
		p->state = PARK_TAKEN;
	}
	pthread_mutex_unlock(&s->lock);
	if (state == PARK_PARKED) {
		fuse_reply_err(req, EINTR);
		free(p);
	}
}

int fs_out_open(struct fs_session *s, struct fs_out *o)
{
	pthread_mutex_lock(&s->lock);
	if (!s->es) {
		pthread_mutex_unlock(&s->lock);
		return -ENOENT;
	}
	/* Bind to the newest turn or, before any, to the next one; a turn
	 * committed between the two questions is seen by asking again. */
	uint64_t turn = atlas_session_newest_turn(s->es);
	while (!turn) {
		struct atlas_session_status st;
		int rc = atlas_session_status(s->es, &st);
		if (rc < 0) {
			pthread_mutex_unlock(&s->lock);
			return rc;
		}
		turn = atlas_session_newest_turn(s->es);
		if (!turn)
			turn = st.turns + 1;
	}
	memset(o, 0, sizeof *o);
	o->sess = s;
	o->turn = turn;
	o->next = s->outs;
	if (s->outs)
		s->outs->prev = o;
	s->outs = o;
	pthread_mutex_unlock(&s->lock);
	return 0;
}

void fs_out_read(fuse_req_t req, struct fs_out *o, size_t size, int flags)
{
	char buf[FS_READ_CHUNK];
	struct fs_session *s = o->sess;
	ssize_t res;
	size = ATLAS_MIN(size, sizeof buf);
	if (!size) {
		fuse_reply_buf(req, NULL, 0);
		return;
	}

	pthread_mutex_lock(&s->lock);
	bool ready = !o->parked && out_fetch(o, buf, size, &res);
	pthread_mutex_unlock(&s->lock);
	if (ready || (flags & O_NONBLOCK)) {
		reply(req, buf, ready ? res : -EAGAIN);
		return;
	}

	struct fs_park *p = calloc(1, sizeof *p);
	if (!p) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	p->req = req;
	p->size = size;
	p->out = o;
	p->state = PARK_REGISTERING;
	/* Registered before the request becomes visible to the waker, which
	 * may answer (and so free) it as soon as it is parked. */
	fuse_req_interrupt_func(req, park_interrupted, p);

	pthread_mutex_lock(&s->lock);
	if (p->interrupted) {
		res = -EINTR;
		ready = true;
	} else {
		/* Output that came while registering was not seen by the waker. */
		ready = !o->parked && out_fetch(o, buf, size, &res);
	}
	if (ready) {
		p->state = PARK_TAKEN;
	} else {
		p->state = PARK_PARKED;
		if (o->parked_tail)
			o->parked_tail->next = p;
		else
			o->parked = p;
		o->parked_tail = p;
	}
	pthread_mutex_unlock(&s->lock);
	if (ready)
		park_finish(p, buf, res);
}

void fs_out_poll(fuse_req_t req, struct fs_out *o, struct fuse_pollhandle *ph)
{
	struct fs_session *s = o->sess;
	struct fuse_pollhandle *old = NULL;
	pthread_mutex_lock(&s->lock);
	bool ready = !o->parked && out_ready(o);
	if (!ready && ph) {
		old = o->ph;
		o->ph = ph;
		ph = NULL;
	}
	pthread_mutex_unlock(&s->lock);
	if (old)
		fuse_pollhandle_destroy(old);
	if (ph)
		fuse_pollhandle_destroy(ph);
	fuse_reply_poll(req, ready ? POLLIN | POLLRDNORM : 0);
}

void fs_out_release(struct fs_out *o)
{
	struct fs_session *s = o->sess;
	pthread_mutex_lock(&s->lock);
	if (o->prev)
		o->prev->next = o->next;
	else
		s->outs = o->next;
	if (o->next)
		o->next->prev = o->prev;
	/* The kernel releases a handle only when no read of it is in flight;
	 * after an unmount nothing will read these anyway. */
	struct fs_park *parked = o->parked;
	for (struct fs_park *p = parked; p; p = p->next)
		p->state = PARK_TAKEN;
	o->parked = o->parked_tail = NULL;
	struct fuse_pollhandle *ph = o->ph;
	o->ph = NULL;
	pthread_mutex_unlock(&s->lock);
	while (parked) {
		struct fs_park *next = parked->next;
		park_finish(parked, NULL, -ECANCELED);
		parked = next;
	}
	if (ph)
		fuse_pollhandle_destroy(ph);
}

/* One step of serving s: answer one parked read or one poller of a handle
 * not yet done in this pass. Returns false when nothing is left to do. */
static bool serve_one(struct atlas_fs *fs, struct fs_session *s, uint64_t pass)
{
	char *buf = fs->wake_buf;
	struct fs_park *p = NULL;
	struct fuse_pollhandle *ph = NULL;
	ssize_t res = 0;
	pthread_mutex_lock(&s->lock);
	for (struct fs_out *o = s->outs; o && !p && !ph; o = o->next) {
		if (o->pass == pass)
			continue;
		if (o->parked && out_fetch(o, buf, ATLAS_MIN(o->parked->size, FS_READ_CHUNK), &res)) {
			p = o->parked;
			park_unlink(o, p);
			p->state = PARK_TAKEN;
		} else if (!o->parked && o->ph && out_ready(o)) {
			ph = o->ph;
			o->ph = NULL;
		} else {
			o->pass = pass;
		}
	}
	pthread_mutex_unlock(&s->lock);
	if (p)
		park_finish(p, buf, res);
	if (ph) {
		fuse_lowlevel_notify_poll(ph);
		fuse_pollhandle_destroy(ph);
	}
	return p || ph;
}

void fs_serve_session(struct atlas_fs *fs, struct fs_session *s)
{
	uint64_t pass = ++fs->pass;
	while (serve_one(fs, s, pass))
		;
}

static void wake_key(struct atlas_fs *fs, uintptr_t key)
{
	pthread_mutex_lock(&fs->wake_lock);
	if (!fs->wake_all) {
		int i = 0;
		while (i < fs->n_wake_keys && fs->wake_keys[i] != key)
			i++;
		if (i == fs->n_wake_keys && i < FS_WAKE_KEYS)
			fs->wake_keys[fs->n_wake_keys++] = key;
		else if (i == FS_WAKE_KEYS)
			fs->wake_all = true;
	}
	pthread_cond_signal(&fs->wake_cond);
	pthread_mutex_unlock(&fs->wake_lock);
}

/* The engine's notify callback, on the engine thread: must not block and
 * must not call into FUSE. es is only compared, never used: it may already
 * be closed. */
void fs_notify(void *ctx, struct atlas_session *es)
{
	wake_key(ctx, (uintptr_t)es);
}

void fs_wake_session(struct atlas_fs *fs, struct fs_session *s)
{
	wake_key(fs, s->key);
}

/* The sessions whose keys are in keys[0..n) (all with `all`), each with a
 * ref, chained through wake_next. A closed engine handle's address may be
 * reused by a new session: serving one more session is harmless. */
static struct fs_session *wake_list(struct atlas_fs *fs, const uintptr_t *keys, int n, bool all)
{
	struct fs_session *head = NULL;
	pthread_mutex_lock(&fs->lock);
	for (struct fs_session *s = fs->sessions; s; s = s->next) {
		bool hit = all;
		for (int i = 0; i < n && !hit; i++)
			hit = keys[i] == s->key;
		if (hit) {
			s->refs++;
			s->wake_next = head;
			head = s;
		}
	}
	pthread_mutex_unlock(&fs->lock);
	return head;
}

static void *waker_main(void *arg)
{
	struct atlas_fs *fs = arg;
	uintptr_t keys[FS_WAKE_KEYS];
	for (;;) {
		pthread_mutex_lock(&fs->wake_lock);
		while (!fs->wake_stop && !fs->n_wake_keys && !fs->wake_all)
			pthread_cond_wait(&fs->wake_cond, &fs->wake_lock);
		bool stop = fs->wake_stop, all = fs->wake_all;
		int n = fs->n_wake_keys;
		memcpy(keys, fs->wake_keys, (size_t)n * sizeof keys[0]);
		fs->n_wake_keys = 0;
		fs->wake_all = false;
		pthread_mutex_unlock(&fs->wake_lock);
		if (stop)
			break;
		struct fs_session *s = wake_list(fs, keys, n, all);
		while (s) {
			struct fs_session *next = s->wake_next;
			fs_serve_session(fs, s);
			fs_session_put(s);
			s = next;
		}
	}
	return NULL;
}

int fs_waker_start(struct atlas_fs *fs)
{
	int rc = pthread_create(&fs->waker, NULL, waker_main, fs);
	if (rc)
		return -rc;
	fs->waker_running = true;
	return 0;
}

void fs_waker_stop(struct atlas_fs *fs)
{
	if (!fs->waker_running)
		return;
	pthread_mutex_lock(&fs->wake_lock);
	fs->wake_stop = true;
	pthread_cond_signal(&fs->wake_cond);
	pthread_mutex_unlock(&fs->wake_lock);
	pthread_join(fs->waker, NULL);
	fs->waker_running = false;
}
