/* Sessions and their turns: the context, the output stream, stop handling. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/clock.h"
#include "common/log.h"
#include "engine/internal.h"
#include "engine/text/stop.h"

static int grow(void **buf, size_t *cap, size_t need, size_t elem)
{
	if (need <= *cap)
		return 0;
	size_t c = *cap ? *cap : 64;
	while (c < need)
		c *= 2;
	void *p = realloc(*buf, c * elem);
	if (!p)
		return -ENOMEM;
	*buf = p;
	*cap = c;
	return 0;
}

static int out_append(struct turn *t, const char *b, size_t n)
{
	if (!n)
		return 0;
	int rc = grow((void **)&t->out, &t->out_cap, t->out_len + n, 1);
	if (rc)
		return rc;
	memcpy(t->out + t->out_len, b, n);
	t->out_len += n;
	return 0;
}

static void turn_free(struct turn *t)
{
	if (!t)
		return;
	if (t->intake)
		intake_forget(t);
	free(t->prompt);
	free(t->out);
	free(t);
}

struct turn *session_turn(struct atlas_session *s, uint64_t number)
{
	if (number < s->first_turn || number >= s->first_turn + s->n_turns)
		return NULL;
	return s->turns[number - s->first_turn];
}

struct turn *session_newest(struct atlas_session *s)
{
	return s->n_turns ? s->turns[s->n_turns - 1] : NULL;
}

/* What a turn costs in the history: its text and about its two header
 * lines, so that empty turns count too. */
#define HISTORY_TURN_BYTES 64

void session_trim_history(struct atlas_session *s)
{
	uint64_t bytes = 0;
	size_t drop = 0;
	for (size_t i = s->n_turns; i-- > 0;) {
		const struct turn *t = s->turns[i];
		bytes += t->prompt_len + t->out_len + HISTORY_TURN_BYTES;
		if (bytes > s->e->cfg.history_max) {
			drop = i + 1;
			break;
		}
	}
	if (!drop)
		return;
	for (size_t i = 0; i < drop; i++) {
		s->dropped_out_bytes += s->turns[i]->out_len;
		turn_free(s->turns[i]);
	}
	memmove(s->turns, s->turns + drop, (s->n_turns - drop) * sizeof *s->turns);
	s->n_turns -= drop;
	s->first_turn += drop;
	s->history_dropped += drop;
}

static void mark(struct atlas_session *s)
{
	s->notify = true;
	pthread_cond_signal(&s->e->wake);
}

/* Release text held back for stop strings and the decoder's unfinished bytes. */
static void flush_held(struct atlas_session *s, struct turn *t)
{
	char tail[16];
	out_append(t, s->hold, s->hold_len);
	s->hold_len = 0;
	int n = tok_stream_flush(&s->stream, tail, sizeof tail);
	if (n > 0)
		out_append(t, tail, (size_t)n);
}

/* Time to first token (-1 before one) and tokens/s after it (0 below two
 * tokens) of t. */
static void turn_rates(const struct turn *t, double *ttft_s, double *tokens_per_s)
{
	*ttft_s = -1;
	*tokens_per_s = 0;
	if (!t->n_generated)
		return;
	*ttft_s = (double)(t->t_first_ns - t->t_submit_ns) * 1e-9;
	double span = (double)(t->t_last_ns - t->t_first_ns) * 1e-9;
	if (t->n_generated > 1 && span > 0)
		*tokens_per_s = (double)(t->n_generated - 1) / span;
}

void session_end_turn(struct atlas_session *s, int error, const char *finish, const char *msg)
{
	struct turn *t = session_newest(s);
	if (!t || t->done)
		return;
	/* Text after a stop string is dropped; any other end releases what was held. */
	if (strcmp(finish, "stop") != 0)
		flush_held(s, t);
	s->hold_len = 0;
	s->req.epoch++;
	if (!s->e->tok && t->n_generated && !error)
		out_append(t, "\n", 1);
	memset(&s->stream, 0, sizeof s->stream);
	t->done = true;
	t->error = error;
	snprintf(t->finish, sizeof t->finish, "%s", finish);
	latency_finished(&s->e->turn_stats, finish);
	t->t_last_ns = atlas_now_ns();
	if (msg)
		snprintf(s->last_error, sizeof s->last_error, "%s", msg);
	sched_stop(&s->e->sched, &s->req);
	s->state = error == -EIO ? ATLAS_STATE_ERROR : ATLAS_STATE_IDLE;
	mark(s);
	double ttft, tps;
	turn_rates(t, &ttft, &tps);
	log_info("turn: session %s turn %llu prompt_tokens %zu generated_tokens %zu ttft_s %.3f "
		 "tokens_per_s %.1f finish %s", s->name, (unsigned long long)t->number, t->n_prompt,
		 t->n_generated, ttft, tps, finish);
}

static bool is_eos(const struct atlas_engine *e, int32_t id)
{
	for (int i = 0; i < e->mc->n_eos; i++)
		if (e->mc->eos_token_ids[i] == id)
			return true;
	if (e->tok && (id == tok_eos_id(e->tok) || id == tok_chat_eot_id(e->tok)))
		return true;
	return false;
}

/* Move decoded text through the stop-string filter into the turn's output. */
static bool release_text(struct atlas_session *s, struct turn *t)
{
	size_t ok;
	long m = stop_scan(s->hold, s->hold_len, (const char (*)[ATLAS_STOP_LEN])s->params.stop,
			   s->params.n_stop, &ok);
	out_append(t, s->hold, ok);
	if (m >= 0) {
		s->hold_len = 0;
		return true;
	}
	memmove(s->hold, s->hold + ok, s->hold_len - ok);
	s->hold_len -= ok;
	return false;
}

void session_accept_token(struct atlas_session *s, int32_t id)
{
	struct atlas_engine *e = s->e;
	struct turn *t = session_newest(s);
	if (!t || t->done)
		return;
	if (sched_req_append(&s->req, &id, 1)) {
		session_end_turn(s, -EIO, "error", "out of memory for the context");
		return;
	}
	uint64_t now = atlas_now_ns();
	if (!t->n_generated) {
		t->t_first_ns = now;
		latency_observe(&e->turn_stats.ttft, now - t->t_submit_ns);
	} else {
		latency_observe(&e->turn_stats.itl, now - t->t_last_ns);
	}
	t->t_last_ns = now;
	t->n_generated++;
	e->generated_tokens_total++;
	s->state = ATLAS_STATE_DECODE;

	if (!s->params.ignore_eos && is_eos(e, id)) {
		s->ended_with_eot = e->tok && id == tok_chat_eot_id(e->tok);
		session_end_turn(s, 0, "eos", NULL);
		return;
	}
	s->ended_with_eot = false;
	size_t room = 64;
	if (e->tok) {
		int n = tok_token_bytes(e->tok, id, NULL, 0);
		room = n > 0 ? (size_t)n + 8 : 8;
	}
	if (grow((void **)&s->hold, &s->hold_cap, s->hold_len + room, 1)) {
		session_end_turn(s, -EIO, "error", "out of memory for the output");
		return;
	}
	int n = e->tok ? tok_stream_push(e->tok, &s->stream, id, true, s->hold + s->hold_len, room)
		       : snprintf(s->hold + s->hold_len, room, "%d ", id);
	if (n > 0)
		s->hold_len += (size_t)n;
	if (release_text(s, t)) {
		session_end_turn(s, 0, "stop", NULL);
		return;
	}
	s->notify = true;
	if (t->n_generated >= (size_t)s->params.max_tokens || s->req.n_tokens >= (size_t)e->context)
		session_end_turn(s, 0, "length", NULL);
}

void session_free(struct atlas_session *s)
{
	for (size_t i = 0; i < s->n_turns; i++)
		turn_free(s->turns[i]);
	free(s->turns);
	free(s->req.tokens);
	free(s->hold);
	seq_free(&s->e->x->pool, &s->req.seq);
	spec_session_free(s->e, &s->spec);
	free(s);
}

static bool valid_name(const char *name)
{
	size_t n = strlen(name);
	if (n == 0 || n > 63 || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
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
		return atlas_errf(err, errlen, -EINVAL,
				  "session name '%s': use 1-63 of [A-Za-z0-9_.-]", name);
	struct atlas_session *s = calloc(1, sizeof *s);
	if (!s)
		return atlas_errf(err, errlen, -ENOMEM, "out of memory");
	s->e = e;
	snprintf(s->name, sizeof s->name, "%s", name);
	sched_req_init(&s->req);
	spec_session_init(e, &s->spec);
	s->first_turn = s->next_turn = 1;
	params_defaults(e, &s->params);

	pthread_mutex_lock(&e->lock);
	int rc = 0;
	for (struct atlas_session *o = e->sessions; o; o = o->next) {
		if (o->closed || strcmp(o->name, name) != 0)
			continue;
		if (o->kept && !o->held) {
			/* Kept across a restart: its first handle takes it. */
			o->held = true;
			pthread_mutex_unlock(&e->lock);
			spec_session_free(e, &s->spec);
			free(s);
			*out = o;
			return 0;
		}
		rc = atlas_errf(err, errlen, -EEXIST, "session '%s' exists", name);
	}
	if (!rc && e->n_sessions >= (uint64_t)e->cfg.max_sessions)
		rc = atlas_errf(err, errlen, -EMFILE, "max_sessions (%d) sessions are open",
				e->cfg.max_sessions);
	if (!rc) {
		s->held = true;
		s->next = e->sessions;
		e->sessions = s;
		e->n_sessions++;
		sched_add(&e->sched, &s->req);
	}
	pthread_mutex_unlock(&e->lock);
	if (rc) {
		spec_session_free(s->e, &s->spec);
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
	session_end_turn(s, -ECANCELED, "cancelled", NULL);
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
	return params_validate(s->e, p, err, errlen);
}

int atlas_session_set_params(struct atlas_session *s, const struct atlas_params *p, char *err,
			     size_t errlen)
{
	int rc = params_validate(s->e, p, err, errlen);
	if (rc)
		return rc;
	pthread_mutex_lock(&s->e->lock);
	s->params = *p;
	pthread_mutex_unlock(&s->e->lock);
	return 0;
}

void atlas_session_prefetch(struct atlas_session *s)
{
	pthread_mutex_lock(&s->e->lock);
	s->req.prefetch = true;
	pthread_cond_signal(&s->e->wake);
	pthread_mutex_unlock(&s->e->lock);
}

void atlas_session_cancel(struct atlas_session *s)
{
	pthread_mutex_lock(&s->e->lock);
	session_end_turn(s, -ECANCELED, "cancelled", NULL);
	pthread_mutex_unlock(&s->e->lock);
}

void atlas_session_reset(struct atlas_session *s)
{
	pthread_mutex_lock(&s->e->lock);
	session_end_turn(s, -ECANCELED, "cancelled", NULL);
	for (size_t i = 0; i < s->n_turns; i++)
		turn_free(s->turns[i]);
	s->n_turns = 0;
	s->first_turn = s->next_turn;
	s->history_dropped = 0;
	s->dropped_out_bytes = 0;
	s->req.n_tokens = 0;
	spec_session_reset(&s->spec);
	s->ended_with_eot = false;
	s->last_error[0] = 0;
	s->state = ATLAS_STATE_IDLE;
	/* The KV may be in use by the step in flight: the engine thread frees it. */
	s->req.forgotten = true;
	s->req.epoch++;
	mark(s);
	pthread_mutex_unlock(&s->e->lock);
}

uint64_t atlas_session_newest_turn(struct atlas_session *s)
{
	pthread_mutex_lock(&s->e->lock);
	uint64_t n = s->n_turns ? s->first_turn + s->n_turns - 1 : 0;
	pthread_mutex_unlock(&s->e->lock);
	return n;
}

int atlas_session_read(struct atlas_session *s, uint64_t turn, uint64_t off, char *buf,
		       size_t len, struct atlas_read *r)
{
	memset(r, 0, sizeof *r);
	pthread_mutex_lock(&s->e->lock);
	struct turn *t = session_turn(s, turn);
	if (!t) {
		/* Not yet submitted, or forgotten by a reset. */
		r->more = turn >= s->next_turn;
		r->error = r->more ? 0 : -ECANCELED;
	} else {
		if (off < t->out_len) {
			r->n = ATLAS_MIN(len, t->out_len - (size_t)off);
			memcpy(buf, t->out + off, r->n);
		}
		r->more = !t->done || off + r->n < t->out_len;
		r->error = r->more ? 0 : t->error;
	}
	pthread_mutex_unlock(&s->e->lock);
	return (int)r->n;
}

int atlas_session_turn_tokens(struct atlas_session *s, uint64_t turn, int32_t **prompt,
			      size_t *n_prompt, int32_t **generated, size_t *n_generated)
{
	int rc = 0;
	pthread_mutex_lock(&s->e->lock);
	struct turn *t = session_turn(s, turn);
	if (!t) {
		rc = -ENOENT;
		goto out;
	}
	*prompt = malloc((t->n_prompt + 1) * sizeof **prompt);
	*generated = malloc((t->n_generated + 1) * sizeof **generated);
	if (!*prompt || !*generated) {
		free(*prompt);
		free(*generated);
		rc = -ENOMEM;
		goto out;
	}
	memcpy(*prompt, s->req.tokens + t->ctx_start, t->n_prompt * sizeof **prompt);
	memcpy(*generated, s->req.tokens + t->ctx_start + t->n_prompt,
	       t->n_generated * sizeof **generated);
	*n_prompt = t->n_prompt;
	*n_generated = t->n_generated;
out:
	pthread_mutex_unlock(&s->e->lock);
	return rc;
}

int atlas_session_status(struct atlas_session *s, struct atlas_session_status *st)
{
	struct atlas_engine *e = s->e;
	memset(st, 0, sizeof *st);
	pthread_mutex_lock(&e->lock);
	st->state = s->state;
	st->slot = s->req.slot;
	st->turns = s->next_turn - 1;
	st->context_tokens = s->req.n_tokens;
	st->context_max = (uint64_t)e->context;
	seq_count(&s->req.seq, st->kv_blocks);
	st->ttft_s = -1;
	struct turn *t = session_newest(s);
	if (t) {
		st->prompt_tokens = t->n_prompt;
		st->generated_tokens = t->n_generated;
		turn_rates(t, &st->ttft_s, &st->tokens_per_s);
		snprintf(st->finish, sizeof st->finish, "%s", t->finish);
	}
	snprintf(st->last_error, sizeof st->last_error, "%s", s->last_error);
	pthread_mutex_unlock(&e->lock);
	return 0;
}

/* n bytes to f (NULL: counted only); returns n. */
static size_t emit(FILE *f, const char *p, size_t n)
{
	if (f && n)
		fwrite(p, 1, n, f);
	return n;
}

/* One turn of the transcript (engine.h) to f, or only counted with f NULL:
 * a header line per side, then its text; the end line once it is over. A
 * running turn's text gets no line break of its own, which more text would
 * then follow: the transcript only grows. Returns its bytes. */
static size_t history_turn(FILE *f, const struct turn *t)
{
	bool chat = t->mode == ATLAS_MODE_CHAT;
	unsigned long long n = (unsigned long long)t->number;
	char line[96];
	size_t len = emit(f, line, (size_t)snprintf(line, sizeof line, "### turn %llu %s\n", n,
						       chat ? "user" : "prompt"));
	len += emit(f, t->prompt, t->prompt_len);
	if (t->prompt_len && t->prompt[t->prompt_len - 1] != '\n')
		len += emit(f, "\n", 1);
	len += emit(f, line, (size_t)snprintf(line, sizeof line, "### turn %llu %s\n", n,
					      chat ? "assistant" : "output"));
	len += emit(f, t->out, t->out_len);
	if (t->done) {
		if (t->out_len && t->out[t->out_len - 1] != '\n')
			len += emit(f, "\n", 1);
		len += emit(f, line, (size_t)snprintf(line, sizeof line, "### turn %llu end: %s\n",
						      n, t->finish));
	}
	return len;
}

/* The line that counts the turns history_max dropped, to f or only
 * counted with f NULL. Returns its bytes. */
static size_t history_head(FILE *f, const struct atlas_session *s)
{
	char line[96];
	if (!s->history_dropped)
		return 0;
	return emit(f, line, (size_t)snprintf(line, sizeof line,
					      "### %llu earlier turns dropped (history_max)\n",
					      (unsigned long long)s->history_dropped));
}

int atlas_session_sizes(struct atlas_session *s, uint64_t *history, uint64_t *answers)
{
	pthread_mutex_lock(&s->e->lock);
	*history = history_head(NULL, s);
	*answers = s->dropped_out_bytes;
	for (size_t i = 0; i < s->n_turns; i++) {
		*history += history_turn(NULL, s->turns[i]);
		*answers += s->turns[i]->out_len;
	}
	pthread_mutex_unlock(&s->e->lock);
	return 0;
}

int atlas_session_history(struct atlas_session *s, char **text, size_t *len)
{
	char *buf = NULL;
	size_t n = 0;
	FILE *f = open_memstream(&buf, &n);
	if (!f)
		return -ENOMEM;
	pthread_mutex_lock(&s->e->lock);
	history_head(f, s);
	for (size_t i = 0; i < s->n_turns; i++)
		history_turn(f, s->turns[i]);
	pthread_mutex_unlock(&s->e->lock);
	if (fclose(f) != 0) {
		free(buf);
		return -ENOMEM;
	}
	*text = buf;
	*len = n;
	return 0;
}
