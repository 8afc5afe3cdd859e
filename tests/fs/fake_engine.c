/* A scripted engine behind engine/engine.h, for fast and deterministic tests
 * of the FUSE tree (and of atlasd) without a model.
 *
 * A turn's output is its prompt (without a trailing newline) reversed, one
 * UTF-8 character per engine step, the notify callback called after each.
 * Prompts that start with a word script the turn:
 *
 *     SLEEP ms TEXT   TEXT reversed, ms milliseconds between characters
 *     FAIL TEXT       TEXT reversed, then the turn fails with EIO
 *     SLOW TEXT       TEXT reversed, then the turn waits until cancelled
 *
 * max_tokens counts characters (finish "length"). A model directory that
 * holds a file FAIL_OPEN fails atlas_engine_open with a message.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/clock.h"
#include "engine/engine.h"
#include "fake_engine.h"

struct atlas_session {
	struct atlas_engine *e;
	char name[64];
	bool closed;               /* freed by the engine thread */
	bool notify;
	struct atlas_params params;
	struct turn **turns;       /* turns[i] is number first_turn + i */
	size_t n_turns;
	uint64_t first_turn, next_turn;
	char last_error[256];
	struct atlas_session *next;
};

struct atlas_engine {
	struct atlas_config cfg;
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t wake;
	bool stop;
	atlas_notify_fn notify_fn;
	void *notify_ctx;
	struct atlas_session *sessions;
	uint64_t n_sessions, turns_total, chars_total, steps_total;
	uint64_t t_start_ns;
};

static void turn_free(struct turn *t)
{
	free(t->prompt);
	free(t->text);
	free(t);
}

static struct turn *newest(struct atlas_session *s)
{
	return s->n_turns ? s->turns[s->n_turns - 1] : NULL;
}

static struct turn *running(struct atlas_session *s)
{
	struct turn *t = newest(s);
	return t && !t->done ? t : NULL;
}

/* Under the lock. */
static void end_turn(struct atlas_session *s, int error, const char *finish, const char *msg)
{
	struct turn *t = running(s);
	if (!t)
		return;
	t->done = true;
	t->error = error;
	snprintf(t->finish, sizeof t->finish, "%s", finish);
	if (msg)
		snprintf(s->last_error, sizeof s->last_error, "%s", msg);
	s->notify = true;
}

static size_t utf8_len(unsigned char c)
{
	return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

/* One engine step of a running turn: release one character or end it. */
static void step(struct atlas_session *s, struct turn *t, uint64_t now)
{
	struct atlas_engine *e = s->e;
	if (t->out_len < t->text_len && t->n_chars < (uint64_t)s->params.max_tokens) {
		t->out_len += utf8_len((unsigned char)t->text[t->out_len]);
		t->n_chars++;
		e->chars_total++;
		if (!t->t_first_ns)
			t->t_first_ns = now;
		t->t_last_ns = now;
		s->notify = true;
	} else if (t->out_len < t->text_len) {
		end_turn(s, 0, "length", NULL);
	} else if (t->fail) {
		end_turn(s, -EIO, "error", "fake engine: the turn failed on purpose");
	} else if (!t->hang) {
		end_turn(s, 0, "stop", NULL);
	}
	e->steps_total++;
	t->next_ns = now + (uint64_t)t->delay_ms * 1000000;
}

static void reap(struct atlas_engine *e)
{
	for (struct atlas_session **pp = &e->sessions; *pp;) {
		struct atlas_session *s = *pp;
		if (!s->closed) {
			pp = &s->next;
			continue;
		}
		*pp = s->next;
		for (size_t i = 0; i < s->n_turns; i++)
			turn_free(s->turns[i]);
		free(s->turns);
		free(s);
	}
}

static void *engine_main(void *arg)
{
	struct atlas_engine *e = arg;
	struct atlas_session **list = malloc((size_t)e->cfg.max_sessions * sizeof *list);
	pthread_mutex_lock(&e->lock);
	while (!e->stop) {
		reap(e);
		uint64_t now = atlas_now_ns(), next = UINT64_MAX;
		for (struct atlas_session *s = e->sessions; s; s = s->next) {
			struct turn *t = running(s);
			if (t && t->next_ns <= now)
				step(s, t, now);
			t = running(s);
			if (t && !(t->hang && t->out_len == t->text_len))
				next = ATLAS_MIN(next, t->next_ns);
		}
		int n = 0;
		for (struct atlas_session *s = e->sessions; s; s = s->next)
			if (s->notify && list && n < e->cfg.max_sessions) {
				s->notify = false;
				list[n++] = s;
			}
		if (n && e->notify_fn) {
			atlas_notify_fn fn = e->notify_fn;
			void *ctx = e->notify_ctx;
			pthread_mutex_unlock(&e->lock);
			for (int i = 0; i < n; i++)
				fn(ctx, list[i]);
			pthread_mutex_lock(&e->lock);
			continue;   /* work may have come while unlocked */
		}
		if (next <= atlas_now_ns())
			continue;
		if (next == UINT64_MAX) {
			pthread_cond_wait(&e->wake, &e->lock);
		} else {
			struct timespec ts = { .tv_sec = (time_t)(next / 1000000000),
					       .tv_nsec = (long)(next % 1000000000) };
			pthread_cond_timedwait(&e->wake, &e->lock, &ts);
		}
	}
	pthread_mutex_unlock(&e->lock);
	free(list);
	return NULL;
}

int atlas_engine_open(const struct atlas_config *cfg, struct atlas_engine **out, char *err,
		      size_t errlen)
{
	char path[ATLAS_PATH_MAX + 16];
	snprintf(path, sizeof path, "%s/FAIL_OPEN", cfg->model);
	if (access(path, F_OK) == 0)
		return atlas_errf(err, errlen, -EINVAL, "%s: fake engine: FAIL_OPEN is present",
				  cfg->model);
	struct atlas_engine *e = calloc(1, sizeof *e);
	if (!e)
		return atlas_errf(err, errlen, -ENOMEM, "out of memory");
	e->cfg = *cfg;
	e->t_start_ns = atlas_now_ns();
	pthread_mutex_init(&e->lock, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&e->wake, &ca);
	pthread_condattr_destroy(&ca);
	if (pthread_create(&e->thread, NULL, engine_main, e)) {
		free(e);
		return atlas_errf(err, errlen, -EAGAIN, "cannot start the engine thread");
	}
	*out = e;
	return 0;
}

void atlas_engine_close(struct atlas_engine *e)
{
	pthread_mutex_lock(&e->lock);
	e->stop = true;
	pthread_cond_signal(&e->wake);
	pthread_mutex_unlock(&e->lock);
	pthread_join(e->thread, NULL);
	for (struct atlas_session *s = e->sessions; s; s = s->next)
		s->closed = true;
	reap(e);
	pthread_cond_destroy(&e->wake);
	pthread_mutex_destroy(&e->lock);
	free(e);
}

void atlas_engine_set_notify(struct atlas_engine *e, atlas_notify_fn fn, void *ctx)
{
	pthread_mutex_lock(&e->lock);
	e->notify_fn = fn;
	e->notify_ctx = ctx;
	pthread_mutex_unlock(&e->lock);
}

static bool valid_name(const char *name)
{
	size_t n = strlen(name);
	if (n == 0 || n > 63 || !strcmp(name, ".") || !strcmp(name, ".."))
		return false;
	for (const char *c = name; *c; c++)
		if (!isalnum((unsigned char)*c) && *c != '_' && *c != '.' && *c != '-')
			return false;
	return true;
}

int atlas_session_open(struct atlas_engine *e, const char *name, struct atlas_session **out,
		       char *err, size_t errlen)
{
	if (!valid_name(name))
		return atlas_errf(err, errlen, -EINVAL, "session name '%s' is not valid", name);
	struct atlas_session *s = calloc(1, sizeof *s);
	if (!s)
		return atlas_errf(err, errlen, -ENOMEM, "out of memory");
	s->e = e;
	snprintf(s->name, sizeof s->name, "%s", name);
	s->first_turn = s->next_turn = 1;
	s->params.temperature = e->cfg.temperature;
	s->params.top_p = e->cfg.top_p;
	s->params.top_k = e->cfg.top_k;
	s->params.max_tokens = e->cfg.max_tokens;
	s->params.seed = e->cfg.seed;
	s->params.mode = e->cfg.mode == ATLAS_MODE_CHAT ? ATLAS_MODE_CHAT : ATLAS_MODE_RAW;
	snprintf(s->params.system, sizeof s->params.system, "%s", e->cfg.system);
	int rc = 0;
	pthread_mutex_lock(&e->lock);
	for (struct atlas_session *o = e->sessions; o && !rc; o = o->next)
		if (!o->closed && !strcmp(o->name, name))
			rc = atlas_errf(err, errlen, -EEXIST, "session '%s' exists", name);
	if (!rc && e->n_sessions >= (uint64_t)e->cfg.max_sessions)
		rc = atlas_errf(err, errlen, -EMFILE, "max_sessions (%d) reached",
				e->cfg.max_sessions);
	if (!rc) {
		s->next = e->sessions;
		e->sessions = s;
		e->n_sessions++;
	}
	pthread_mutex_unlock(&e->lock);
	if (rc) {
		free(s);
		return rc;
	}
	*out = s;
	return 0;
}

void atlas_session_close(struct atlas_session *s)
{
	struct atlas_engine *e = s->e;
	pthread_mutex_lock(&e->lock);
	end_turn(s, -ECANCELED, "cancelled", NULL);
	s->closed = true;
	s->notify = false;
	e->n_sessions--;
	pthread_cond_signal(&e->wake);
	pthread_mutex_unlock(&e->lock);
}

const char *atlas_session_name(const struct atlas_session *s)
{
	return s->name;
}

void atlas_session_get_params(struct atlas_session *s, struct atlas_params *out)
{
	pthread_mutex_lock(&s->e->lock);
	*out = s->params;
	pthread_mutex_unlock(&s->e->lock);
}

int atlas_session_check_params(struct atlas_session *s, const struct atlas_params *p, char *err,
			       size_t errlen)
{
	return fake_params_validate(p, err, errlen);
}

int atlas_session_set_params(struct atlas_session *s, const struct atlas_params *p, char *err,
			     size_t errlen)
{
	int rc = fake_params_validate(p, err, errlen);
	if (rc)
		return rc;
	pthread_mutex_lock(&s->e->lock);
	s->params = *p;
	pthread_mutex_unlock(&s->e->lock);
	return 0;
}

void atlas_session_cancel(struct atlas_session *s)
{
	pthread_mutex_lock(&s->e->lock);
	end_turn(s, -ECANCELED, "cancelled", NULL);
	pthread_cond_signal(&s->e->wake);
	pthread_mutex_unlock(&s->e->lock);
}

void atlas_session_reset(struct atlas_session *s)
{
	pthread_mutex_lock(&s->e->lock);
	end_turn(s, -ECANCELED, "cancelled", NULL);
	for (size_t i = 0; i < s->n_turns; i++)
		turn_free(s->turns[i]);
	s->n_turns = 0;
	s->first_turn = s->next_turn;
	s->last_error[0] = 0;
	s->notify = true;
	pthread_cond_signal(&s->e->wake);
	pthread_mutex_unlock(&s->e->lock);
}

uint64_t atlas_session_newest_turn(struct atlas_session *s)
{
	pthread_mutex_lock(&s->e->lock);
	uint64_t n = s->n_turns ? s->first_turn + s->n_turns - 1 : 0;
	pthread_mutex_unlock(&s->e->lock);
	return n;
}

int atlas_session_submit(struct atlas_session *s, const char *text, size_t len, char *err,
			 size_t errlen)
{
	struct turn *t = calloc(1, sizeof *t);
	int rc = t ? fake_script(t, text, len, err, errlen) : -ENOMEM;
	if (rc) {
		free(t);
		return rc == -ENOMEM ? atlas_errf(err, errlen, rc, "out of memory") : rc;
	}
	struct atlas_engine *e = s->e;
	pthread_mutex_lock(&e->lock);
	if (running(s)) {
		rc = atlas_errf(err, errlen, -EBUSY, "a turn is running");
	} else {
		struct turn **turns = realloc(s->turns, (s->n_turns + 1) * sizeof *turns);
		if (!turns)
			rc = atlas_errf(err, errlen, -ENOMEM, "out of memory");
		else
			s->turns = turns;
	}
	if (!rc) {
		t->number = s->next_turn++;
		t->t_submit_ns = atlas_now_ns();
		t->next_ns = t->t_submit_ns + (uint64_t)t->delay_ms * 1000000;
		s->turns[s->n_turns++] = t;
		s->last_error[0] = 0;
		s->notify = true;
		e->turns_total++;
		rc = (int)t->number;
		pthread_cond_signal(&e->wake);
	}
	pthread_mutex_unlock(&e->lock);
	if (rc < 0)
		turn_free(t);
	return rc;
}

static struct turn *find_turn(struct atlas_session *s, uint64_t number)
{
	if (number < s->first_turn || number >= s->first_turn + s->n_turns)
		return NULL;
	return s->turns[number - s->first_turn];
}

int atlas_session_read(struct atlas_session *s, uint64_t turn, uint64_t off, char *buf,
		       size_t len, struct atlas_read *r)
{
	memset(r, 0, sizeof *r);
	pthread_mutex_lock(&s->e->lock);
	struct turn *t = find_turn(s, turn);
	if (!t) {
		r->more = turn >= s->next_turn;
		r->error = r->more ? 0 : -ECANCELED;
	} else {
		if (off < t->out_len) {
			r->n = ATLAS_MIN(len, t->out_len - (size_t)off);
			memcpy(buf, t->text + off, r->n);
		}
		r->more = !t->done || off + r->n < t->out_len;
		r->error = r->more ? 0 : t->error;
	}
	pthread_mutex_unlock(&s->e->lock);
	return (int)r->n;
}

int atlas_session_history(struct atlas_session *s, char **text, size_t *len)
{
	*text = NULL;
	FILE *f = open_memstream(text, len);
	if (!f)
		return -ENOMEM;
	pthread_mutex_lock(&s->e->lock);
	for (size_t i = 0; i < s->n_turns; i++) {
		const struct turn *t = s->turns[i];
		fprintf(f, "<prompt>%.*s</prompt>\n%.*s\n", (int)t->prompt_len, t->prompt,
			(int)t->out_len, t->text);
	}
	pthread_mutex_unlock(&s->e->lock);
	return fclose(f) ? -ENOMEM : 0;
}

int atlas_session_status(struct atlas_session *s, struct atlas_session_status *st)
{
	memset(st, 0, sizeof *st);
	pthread_mutex_lock(&s->e->lock);
	struct turn *t = newest(s);
	st->state = !t ? ATLAS_STATE_IDLE : !t->done ? ATLAS_STATE_DECODE :
		    t->error == -EIO ? ATLAS_STATE_ERROR : ATLAS_STATE_IDLE;
	st->slot = t && !t->done ? 0 : -1;
	st->turns = s->next_turn - 1;
	st->context_max = 4096;
	st->ttft_s = -1;
	for (size_t i = 0; i < s->n_turns; i++)
		st->context_tokens += s->turns[i]->prompt_len + s->turns[i]->n_chars;
	if (t) {
		st->prompt_tokens = t->prompt_len;
		st->generated_tokens = t->n_chars;
		if (t->t_first_ns)
			st->ttft_s = (double)(t->t_first_ns - t->t_submit_ns) * 1e-9;
		snprintf(st->finish, sizeof st->finish, "%s", t->finish);
	}
	snprintf(st->last_error, sizeof st->last_error, "%s", s->last_error);
	pthread_mutex_unlock(&s->e->lock);
	return 0;
}

int atlas_engine_stats(struct atlas_engine *e, struct atlas_engine_stats *out)
{
	memset(out, 0, sizeof *out);
	pthread_mutex_lock(&e->lock);
	snprintf(out->model, sizeof out->model, "%s", e->cfg.model);
	snprintf(out->architecture, sizeof out->architecture, "FakeForCausalLM");
	snprintf(out->dtype, sizeof out->dtype, "f32");
	snprintf(out->backend, sizeof out->backend, "fake");
	snprintf(out->device, sizeof out->device, "none \"quoted\" \\ device");
	out->parameters = 1000;
	out->context = 4096;
	out->sessions = e->n_sessions;
	out->turns_total = e->turns_total;
	out->generated_tokens_total = e->chars_total;
	out->steps_total = e->steps_total;
	out->uptime_s = (double)(atlas_now_ns() - e->t_start_ns) * 1e-9;
	out->n_slots = ATLAS_MIN(e->cfg.max_batch, ATLAS_MAX_SLOTS);
	for (int i = 0; i < out->n_slots; i++) {
		out->slots[i].slot = i;
		out->slots[i].state = ATLAS_STATE_IDLE;
	}
	int slot = 0;
	for (struct atlas_session *s = e->sessions; s && slot < out->n_slots; s = s->next) {
		struct turn *t = running(s);
		if (s->closed || !t)
			continue;
		snprintf(out->slots[slot].session, sizeof out->slots[slot].session, "%s", s->name);
		out->slots[slot].state = ATLAS_STATE_DECODE;
		out->slots[slot].position = t->prompt_len + t->n_chars;
		slot++;
	}
	out->kv.block_size = (uint32_t)e->cfg.kv_block_size;
	snprintf(out->spec.method, sizeof out->spec.method, "off");
	out->ep.ranks = out->ep.hosts = 1;
	pthread_mutex_unlock(&e->lock);
	return 0;
}
