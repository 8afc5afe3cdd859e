/* Turning a prompt into context tokens and queueing the turn.
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

/* What the template depends on, read under the lock before tokenizing
 * outside it; the submit is redone if it changed meanwhile. */
struct prompt_state {
	bool first;             /* the context is empty */
	bool ended_with_eot;
	enum atlas_mode mode;
	uint64_t epoch;
	char system[ATLAS_SYSTEM_MAX];
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
	ps->epoch = s->req.epoch;
	snprintf(ps->system, sizeof ps->system, "%s", s->params.system);
}

static bool same_state(struct atlas_session *s, const struct prompt_state *ps)
{
	return ps->first == (s->req.n_tokens == 0) && ps->ended_with_eot == s->ended_with_eot &&
	       ps->mode == s->params.mode && ps->epoch == s->req.epoch &&
	       strcmp(ps->system, s->params.system) == 0;
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

/* A new turn of prompt text[0..len) (under the lock), or NULL when memory
 * is short. */
static struct turn *new_turn(struct atlas_session *s, const char *text, size_t len)
{
	struct atlas_engine *e = s->e;
	struct turn *t = calloc(1, sizeof *t);
	char *prompt = malloc(len + 1);
	if (!t || !prompt || (s->n_turns == s->turns_cap &&
			      !(s->turns = realloc(s->turns, (s->turns_cap = s->turns_cap * 2 + 4) *
							     sizeof *s->turns)))) {
		free(t);
		free(prompt);
		return NULL;
	}
	memcpy(prompt, text, len);
	prompt[len] = 0;
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

/* A prompt that was not accepted, as a turn that has failed with msg (under
 * the lock): status shows it and a reader waiting for the next turn ends.
 * Its text is not kept. */
static void failed_turn(struct atlas_session *s, const char *msg)
{
	if (new_turn(s, "", 0))
		session_end_turn(s, -EIO, "error", msg);
	else
		snprintf(s->last_error, sizeof s->last_error, "%s", msg);
}

/* Append the turn (under the lock). The context takes its tokens unless they
 * cannot fit, in which case the turn exists and has failed. */
static int queue_turn(struct atlas_session *s, const char *text, size_t len, int32_t *ids,
		      size_t n, char *err, size_t errlen)
{
	struct atlas_engine *e = s->e;
	struct turn *t = new_turn(s, text, len);
	if (!t)
		return atlas_errf(err, errlen, -ENOMEM, "out of memory");

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
		session_end_turn(s, -EIO, "error", msg);
		return (int)t->number;
	}
	if (sched_req_append(&s->req, ids, n)) {
		session_end_turn(s, -EIO, "error", "out of memory for the context");
		return (int)t->number;
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
	return (int)t->number;
}

static int submit(struct atlas_session *s, const char *text, size_t len, const int32_t *given,
		  size_t n_given, char *err, size_t errlen)
{
	struct atlas_engine *e = s->e;
	struct prompt_state ps;
	for (;;) {
		pthread_mutex_lock(&e->lock);
		int rc = busy(s, err, errlen);
		snapshot(s, &ps);
		pthread_mutex_unlock(&e->lock);
		if (rc)
			return rc;

		int32_t *ids = NULL;
		size_t n = n_given;
		if (given) {
			for (size_t i = 0; i < n_given; i++)
				if (given[i] < 0 || given[i] >= e->vocab)
					return atlas_errf(err, errlen, -EINVAL,
							  "token id %d is not below the vocabulary "
							  "size %d", given[i], e->vocab);
			ids = malloc((n_given + 1) * sizeof *ids);
			if (!ids)
				return atlas_errf(err, errlen, -ENOMEM, "out of memory");
			memcpy(ids, given, n_given * sizeof *ids);
		} else if ((rc = encode_prompt(e, &ps, text, len, &ids, &n, err, errlen))) {
			/* A prompt that cannot be tokenized ends the turn a reader waits for. */
			pthread_mutex_lock(&e->lock);
			if (rc != -ENOMEM && !busy(s, NULL, 0))
				failed_turn(s, err);
			pthread_mutex_unlock(&e->lock);
			return rc;
		}

		pthread_mutex_lock(&e->lock);
		if (!same_state(s, &ps)) {
			pthread_mutex_unlock(&e->lock);
			free(ids);
			continue;
		}
		rc = busy(s, err, errlen);
		if (!rc)
			rc = queue_turn(s, text, len, ids, n, err, errlen);
		pthread_mutex_unlock(&e->lock);
		free(ids);
		return rc;
	}
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

int atlas_session_submit(struct atlas_session *s, const char *text, size_t len, char *err,
			 size_t errlen)
{
	return submit(s, text, len, NULL, 0, err, errlen);
}

int atlas_session_submit_tokens(struct atlas_session *s, const int32_t *ids, size_t n,
				char *err, size_t errlen)
{
	char desc[64];
	int dl = snprintf(desc, sizeof desc, "(%zu token ids)", n);
	return submit(s, desc, (size_t)dl, ids, n, err, errlen);
}
