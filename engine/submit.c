/* Turning a prompt into context tokens and queueing the turn.
 *
 * A text prompt becomes a turn at once (state queued) and goes to the
 * intake thread, which tokenizes committed prompts one after the other and
 * then queues each turn for the scheduler, or fails it with the tokenizer's
 * or the template's message. So a commit of a large prompt costs its caller
 * (a FUSE worker at close) a copy of the text, not the tokenizer's time,
 * and the tokenizer runs under no lock. A turn cancelled, reset or closed
 * meanwhile drops its job's result.
 *
 * Raw mode appends the prompt's tokens as they are (the post-processor's
 * special tokens, such as a BOS, only at the start of a context). Chat mode
 * wraps the prompt in the model's chat template; the text that closes the
 * previous answer is added here, at the start of the next turn, because only
 * then is it known how that answer ended. Without a tokenizer the prompt is a
 * list of token ids.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/clock.h"
#include "engine/internal.h"

/* What the template depends on, read under the lock when the prompt is
 * committed: its turn runs from then on, so nothing else changes them. */
struct prompt_state {
	bool first;             /* the context is empty */
	bool ended_with_eot;
	enum atlas_mode mode;
	char system[ATLAS_SYSTEM_MAX];
};

/* A text prompt waiting for the intake thread, or being tokenized by it. */
struct intake_job {
	struct atlas_session *s;        /* counted in s->intake_jobs */
	struct turn *t;                 /* the prompt's turn; NULL once a reset or a close
					 * freed it */
	char *text;                     /* [len] the turn's prompt; the job's own once t is
					 * NULL */
	size_t len;
	struct prompt_state ps;
	struct intake_job *next;        /* engine.intake_head FIFO */
};

static int parse_ids(const struct atlas_engine *e, const char *text, size_t len, int32_t **ids,
		     size_t *n, char *err, size_t errlen)
{
	size_t cap = len / 2 + 1, k = 0;
	int32_t *v = malloc(cap * sizeof *v);
	if (!v)
		return atlas_errf(err, errlen, -ENOMEM, "out of memory");
	size_t i = 0;
	while (i < len) {
		if (isspace((unsigned char)text[i]) || text[i] == ',') {
			i++;
			continue;
		}
		size_t j = i;
		long long x = 0;
		while (j < len && isdigit((unsigned char)text[j]) && x <= INT32_MAX)
			x = x * 10 + (text[j++] - '0');
		bool end = j == len || isspace((unsigned char)text[j]) || text[j] == ',';
		if (j == i || !end || x >= e->vocab) {
			free(v);
			return atlas_errf(err, errlen, -EINVAL,
					  "prompt: '%.*s' is not a token id below %d (this model has "
					  "no tokenizer: write ids separated by spaces)",
					  (int)ATLAS_MIN(j - i + 1, 32), text + i, e->vocab);
		}
		v[k++] = (int32_t)x;
		i = j;
	}
	*ids = v;
	*n = k;
	return 0;
}

static int encode_prompt(struct atlas_engine *e, const struct prompt_state *ps, const char *text,
			 size_t len, int32_t **ids, size_t *n, char *err, size_t errlen)
{
	if (!e->tok)
		return parse_ids(e, text, len, ids, n, err, errlen);
	if (ps->mode == ATLAS_MODE_RAW) {
		int rc = tok_encode(e->tok, text, len, ps->first, ids, n);
		if (rc == -EINVAL)
			return atlas_errf(err, errlen, rc, "prompt: not valid UTF-8");
		return rc ? atlas_errf(err, errlen, rc, "prompt: cannot tokenize") : 0;
	}
	/* A user message does not end in the newline `echo` adds. */
	while (len && (text[len - 1] == '\n' || text[len - 1] == '\r'))
		len--;
	const char *close = ps->first ? "" : tok_chat_close(e->tok, ps->ended_with_eot);
	size_t cap = strlen(close) + len + strlen(ps->system) + 512;
	char *buf = malloc(cap);
	if (!buf)
		return atlas_errf(err, errlen, -ENOMEM, "out of memory");
	size_t off = (size_t)snprintf(buf, cap, "%s", close);
	int w = tok_chat_turn(e->tok, ps->first, ps->system, text, len, buf + off, cap - off);
	if (w < 0 || (size_t)w >= cap - off) {
		free(buf);
		return atlas_errf(err, errlen, w < 0 ? w : -E2BIG, "prompt: chat template failed");
	}
	int rc = tok_encode(e->tok, buf, off + (size_t)w, false, ids, n);
	free(buf);
	if (rc == -EINVAL)
		return atlas_errf(err, errlen, rc, "prompt: not valid UTF-8");
	return rc ? atlas_errf(err, errlen, rc, "prompt: cannot tokenize") : 0;
}

static void snapshot(struct atlas_session *s, struct prompt_state *ps)
{
	ps->first = s->req.n_tokens == 0;
	ps->ended_with_eot = s->ended_with_eot;
	ps->mode = s->params.mode;
	snprintf(ps->system, sizeof ps->system, "%s", s->params.system);
}

static int busy(struct atlas_session *s, char *err, size_t errlen)
{
	struct turn *t = session_newest(s);
	if (s->closed)
		return atlas_errf(err, errlen, -ENOENT, "session %s is closed", s->name);
	if (t && !t->done)
		return atlas_errf(err, errlen, -EBUSY,
				  "session %s: turn %llu is still running (cancel it first)",
				  s->name, (unsigned long long)t->number);
	return 0;
}

/* A new turn whose prompt is `prompt` ([len] + NUL, malloc'd: the turn's
 * once this succeeds), under the lock; NULL when memory is short. */
static struct turn *new_turn(struct atlas_session *s, char *prompt, size_t len)
{
	struct atlas_engine *e = s->e;
	session_trim_history(s);
	struct turn *t = calloc(1, sizeof *t);
	if (!t || (s->n_turns == s->turns_cap &&
		   !(s->turns = realloc(s->turns, (s->turns_cap = s->turns_cap * 2 + 4) *
						  sizeof *s->turns)))) {
		free(t);
		return NULL;
	}
	t->prompt = prompt;
	t->prompt_len = len;
	t->number = s->next_turn++;
	t->mode = e->tok ? s->params.mode : ATLAS_MODE_RAW;
	t->t_submit_ns = atlas_now_ns();
	t->ctx_start = s->req.n_tokens;
	s->turns[s->n_turns++] = t;
	s->last_error[0] = 0;
	e->turns_total++;
	return t;
}

/* The turn of a prompt that was not accepted fails with msg (under the
 * lock): status shows it and a reader waiting for it ends. Its text is not
 * kept. */
static void reject_turn(struct atlas_session *s, struct turn *t, const char *msg)
{
	char *p = realloc(t->prompt, 1);
	if (p)
		t->prompt = p;
	t->prompt[0] = 0;
	t->prompt_len = 0;
	session_end_turn(s, -EIO, "error", msg);
}

/* A prompt that was not accepted before it reached the engine, as a turn
 * that has failed with msg (under the lock). */
static void failed_turn(struct atlas_session *s, const char *msg)
{
	char *empty = strdup("");
	struct turn *t = empty ? new_turn(s, empty, 0) : NULL;
	if (t) {
		reject_turn(s, t, msg);
	} else {
		free(empty);
		snprintf(s->last_error, sizeof s->last_error, "%s", msg);
	}
}

/* The context takes turn t's prompt tokens and the turn is queued, unless
 * they cannot fit: then the turn fails (under the lock). */
static void queue_turn(struct atlas_session *s, struct turn *t, const int32_t *ids, size_t n)
{
	struct atlas_engine *e = s->e;
	if (n == 0 || s->req.n_tokens + n >= (size_t)e->context) {
		char msg[256];
		if (n == 0)
			snprintf(msg, sizeof msg, "the prompt has no tokens");
		else if (s->req.n_tokens == 0)
			snprintf(msg, sizeof msg, "prompt of %zu tokens does not fit the context "
				 "of %d tokens (the key context)", n, e->context);
		else
			snprintf(msg, sizeof msg,
				 "prompt of %zu tokens does not fit the context: %zu of %d tokens "
				 "are in use (reset the session to start over)",
				 n, s->req.n_tokens, e->context);
		reject_turn(s, t, msg);
		return;
	}
	if (sched_req_append(&s->req, ids, n)) {
		session_end_turn(s, -EIO, "error", "out of memory for the context");
		return;
	}
	t->n_prompt = n;
	e->prompt_tokens_total += n;
	s->req.sampling = (struct sched_sampling){ .temperature = s->params.temperature,
						   .top_p = s->params.top_p,
						   .top_k = s->params.top_k,
						   .seed = s->params.seed };
	sched_queue(&e->sched, &s->req);
	s->state = ATLAS_STATE_QUEUED;
	pthread_cond_signal(&e->wake);
}

/* The end of job j (under the lock): its tokens go to the context, or its
 * error ends the turn, if the turn still waits for them (a cancel, reset or
 * close ended it otherwise). */
static void intake_done(struct atlas_engine *e, struct intake_job *j, int rc, const int32_t *ids,
			size_t n, const char *err)
{
	struct atlas_session *s = j->s;
	struct turn *t = j->t;
	if (t)
		t->intake = NULL;
	else
		free(j->text);
	if (t && !t->done && rc)
		reject_turn(s, t, err);
	else if (t && !t->done)
		queue_turn(s, t, ids, n);
	if (--s->intake_jobs == 0 && s->closed)
		pthread_cond_signal(&e->wake);   /* the engine thread may free it now */
	free(j);
}

/* The intake thread: tokenizes committed text prompts in order, so that a
 * commit costs its caller (a FUSE worker) a copy of the text and no lock
 * that another session needs while the tokenizer runs. */
static void *intake_main(void *arg)
{
	struct atlas_engine *e = arg;
	pthread_mutex_lock(&e->lock);
	for (;;) {
		struct intake_job *j = e->intake_head;
		if (!j && e->intake_stop)
			break;
		if (!j) {
			pthread_cond_wait(&e->intake_wake, &e->lock);
			continue;
		}
		e->intake_head = j->next;
		if (!e->intake_head)
			e->intake_tail = NULL;
		/* Nothing to tokenize for a turn already gone or ended. */
		const bool wanted = j->t && !j->t->done && !e->intake_stop;
		pthread_mutex_unlock(&e->lock);
		int32_t *ids = NULL;
		size_t n = 0;
		char err[256] = "";
		int rc = wanted ? encode_prompt(e, &j->ps, j->text, j->len, &ids, &n, err, sizeof err)
				: atlas_errf(err, sizeof err, -ECANCELED, "the engine is closing");
		pthread_mutex_lock(&e->lock);
		intake_done(e, j, rc, ids, n, err);
		free(ids);
	}
	pthread_mutex_unlock(&e->lock);
	return NULL;
}

int intake_start(struct atlas_engine *e)
{
	int rc = -pthread_create(&e->intake, NULL, intake_main, e);
	e->intake_running = rc == 0;
	return rc;
}

void intake_stop(struct atlas_engine *e)
{
	if (!e->intake_running)
		return;
	pthread_mutex_lock(&e->lock);
	e->intake_stop = true;
	pthread_cond_signal(&e->intake_wake);
	pthread_mutex_unlock(&e->lock);
	pthread_join(e->intake, NULL);
	e->intake_running = false;
}

void intake_forget(struct turn *t)
{
	t->intake->t = NULL;
	t->intake = NULL;
	t->prompt = NULL;
}

int atlas_session_reject(struct atlas_session *s, const char *msg)
{
	struct atlas_engine *e = s->e;
	pthread_mutex_lock(&e->lock);
	int rc = busy(s, NULL, 0);
	if (!rc)
		failed_turn(s, msg);
	pthread_mutex_unlock(&e->lock);
	return rc;
}

/* The turn is made at once and queued for the intake thread, which
 * tokenizes the prompt; until then the session is queued with no prompt
 * tokens. */
int atlas_session_submit(struct atlas_session *s, const char *text, size_t len, char *err,
			 size_t errlen)
{
	struct atlas_engine *e = s->e;
	/* Many handles may commit at once: the copy is for the first alone. */
	pthread_mutex_lock(&e->lock);
	int rc = busy(s, err, errlen);
	pthread_mutex_unlock(&e->lock);
	if (rc)
		return rc;
	struct intake_job *j = calloc(1, sizeof *j);
	char *copy = malloc(len + 1);
	if (!j || !copy) {
		free(j);
		free(copy);
		return atlas_errf(err, errlen, -ENOMEM, "out of memory");
	}
	memcpy(copy, text, len);
	copy[len] = 0;
	pthread_mutex_lock(&e->lock);
	rc = busy(s, err, errlen);
	struct turn *t = rc ? NULL : new_turn(s, copy, len);
	if (!rc && !t)
		rc = atlas_errf(err, errlen, -ENOMEM, "out of memory");
	if (t) {
		*j = (struct intake_job){ .s = s, .t = t, .text = copy, .len = len };
		snapshot(s, &j->ps);
		t->intake = j;
		s->intake_jobs++;
		if (e->intake_tail)
			e->intake_tail->next = j;
		else
			e->intake_head = j;
		e->intake_tail = j;
		s->state = ATLAS_STATE_QUEUED;
		pthread_cond_signal(&e->intake_wake);
		rc = (int)t->number;
	}
	pthread_mutex_unlock(&e->lock);
	if (rc < 0) {
		free(j);
		free(copy);
	}
	return rc;
}

int atlas_session_submit_tokens(struct atlas_session *s, const int32_t *ids, size_t n,
				char *err, size_t errlen)
{
	struct atlas_engine *e = s->e;
	for (size_t i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= e->vocab)
			return atlas_errf(err, errlen, -EINVAL, "token id %d is not below the "
					  "vocabulary size %d", ids[i], e->vocab);
	char *desc = malloc(64);
	if (!desc)
		return atlas_errf(err, errlen, -ENOMEM, "out of memory");
	int dl = snprintf(desc, 64, "(%zu token ids)", n);
	pthread_mutex_lock(&e->lock);
	int rc = busy(s, err, errlen);
	struct turn *t = rc ? NULL : new_turn(s, desc, (size_t)dl);
	if (!rc && !t)
		rc = atlas_errf(err, errlen, -ENOMEM, "out of memory");
	if (t) {
		queue_turn(s, t, ids, n);
		rc = (int)t->number;
	}
	pthread_mutex_unlock(&e->lock);
	if (rc < 0)
		free(desc);
	return rc;
}
