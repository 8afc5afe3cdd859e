/* Prompt lookup as a drafter (drafter.h): the session's state is its
 * n-gram index (ngram.h); drafts come from prepare, no model runs. */
#include <errno.h>
#include <stdlib.h>

#include "common/err.h"
#include "engine/spec/drafter.h"
#include "engine/spec/ngram.h"

struct ngram_drafter {
	int min_n, max_n;           /* the n-gram lengths every session's index tries */
};

static int ngram_open(const struct atlas_config *c, const struct step_limits *model_lim,
		      void **self, char *err, size_t errlen)
{
	struct ngram_drafter *d = malloc(sizeof *d);
	if (!d)
		return atlas_errf(err, errlen, -ENOMEM, "out of memory");
	d->min_n = c->spec_ngram_min;
	d->max_n = c->spec_ngram_max;
	*self = d;
	return 0;
}

static void ngram_close(void *self)
{
	free(self);
}

static void *ngram_session_new(void *self)
{
	const struct ngram_drafter *d = self;
	struct ngram_index *x = malloc(sizeof *x);
	if (x)
		ngram_init(x, d->min_n, d->max_n);
	return x;
}

static void ngram_session_free(void *self, void *state)
{
	(void)self;
	if (state)
		ngram_free(state);
	free(state);
}

static void ngram_session_forget(void *self, void *state)
{
	(void)self;
	ngram_reset(state);
}

static int ngram_prepare(void *self, struct draft_req *q)
{
	(void)self;
	const int n = ngram_propose(q->state, q->tokens, q->n_tokens, q->k, q->drafts);
	q->n_drafts = n > 0 ? n : 0;
	return 0;
}

const struct drafter_ops ngram_drafter_ops = {
	.name = "ngram",
	.method = ATLAS_SPEC_NGRAM,
	.open = ngram_open,
	.close = ngram_close,
	.session_new = ngram_session_new,
	.session_free = ngram_session_free,
	.session_forget = ngram_session_forget,
	.prepare = ngram_prepare,
};
