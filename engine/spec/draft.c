/* The draft model as a drafter (drafter.h): a smaller model with the
 * model's vocabulary, run by an executor of its own on the same backend,
 * with its own KV pool (draft_kv_memory) and one sequence per session.
 *
 * A session's draft sequence holds the KV of the context tokens it has
 * seen and of the drafts it fed itself. Before drafting, prepare keeps the
 * longest part of it that is still the context (the accepted drafts are
 * context now; a rejected draft and what follows it are rolled back with
 * seq_truncate) and queues the context tokens it has not seen, at least the
 * last one, whose logits give the first draft. run feeds them for every
 * queued session in one step (prefill segments, at most chunk_size rows in
 * all: a longer catch-up is spread over several steps, drafting nothing
 * until it is done), then one decode row per session and draft: k drafts
 * cost k forward passes of the draft model, each shared by every session
 * that drafts. Drafts are the draft model's greedy choice: the engine's
 * verification accepts a draft with the model's own probability of it, so
 * the text never depends on the draft model, only the speed.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "engine/spec/draft_seqs.h"
#include "engine/spec/drafter.h"
#include "engine/step/exec.h"
#include "engine/tokenizer/tokenizer.h"

struct draft_seq {
	struct draft_seq_kv kv;     /* the draft model's KV of positions [0, base + n_fed) */
	size_t base;                /* context tokens [0, base) are in seq */
	int32_t fed[ATLAS_SPEC_K_MAX];  /* drafts fed at positions base, base + 1, ... */
	int n_fed;
	/* The queued request (prepare to run). */
	struct draft_req *q;        /* NULL: not queued */
	int32_t *feed;              /* [chunk] context tokens to feed from position base */
	int n_feed;
};

struct draft_model {
	char dir[ATLAS_PATH_MAX];
	struct exec *x;
	struct step_cmd cmd;
	bool recorded;              /* a step of the current run recorded its graph */
	int chunk;                  /* catch-up rows of one run, over all sessions */
	int queued_rows;            /* catch-up rows queued for the next run */
	struct draft_seqs seqs;     /* every session's sequence with KV (eviction) */
	uint64_t steps;
};

static struct draft_seq *of(struct draft_seq_kv *kv)
{
	return (struct draft_seq *)((char *)kv - offsetof(struct draft_seq, kv));
}

/* A sequence drafting now keeps its KV. */
static bool busy(const struct draft_seq_kv *kv)
{
	return of((struct draft_seq_kv *)kv)->q != NULL;
}

static void evict(void *ctx, struct draft_seq_kv *kv);

/* A draft is the most likely token. */
static const struct kt_sample_row greedy = { .temperature = 0, .top_p = 1, .top_k = 0, .u = 0 };

static int draft_open(const struct atlas_config *c, const struct step_limits *model_lim,
		      void **self, char *err, size_t errlen)
{
	*self = NULL;
	if (!c->draft_model[0])
		return 0;
	struct draft_model *m = calloc(1, sizeof *m);
	if (!m)
		return atlas_errf(err, errlen, -ENOMEM, "out of memory");
	struct atlas_config dc = *c;
	snprintf(dc.model, sizeof dc.model, "%s", c->draft_model);
	snprintf(m->dir, sizeof m->dir, "%s", c->draft_model);
	dc.kv_memory = c->draft_kv_memory;
	dc.kv_host_memory = dc.kv_disk_memory = 0;
	dc.mtp_head = false;
	m->chunk = c->chunk_size;
	const struct step_limits lim = {
		.max_seqs = c->max_batch,
		.max_rows = ATLAS_MAX(c->chunk_size, c->max_batch),
		.max_out = c->max_batch,
	};
	int rc = exec_open(&dc, EXEC_MODEL, c->max_batch, &lim, &m->x, err, errlen);
	if (!rc && (rc = step_cmd_alloc(&m->cmd, &m->x->lim)))
		atlas_errf(err, errlen, rc, "out of memory");
	/* Its sequences roll back by truncating KV alone (draft_seqs.c). */
	if (!rc && m->x->mc->n_linear_layers)
		rc = atlas_errf(err, errlen, -ENOTSUP,
				"%s has linear-attention layers: a draft model must be all full "
				"attention (use spec mtp or ngram)", m->x->mc->architecture);
	if (rc) {
		atlas_errprefix(err, errlen, "draft_model %s", c->draft_model);
		exec_close(m->x);
		free(m);
		return rc;
	}
	m->seqs = (struct draft_seqs){ .pool = &m->x->pool, .busy = busy, .evict = evict,
				       .ctx = m };
	*self = m;
	return 0;
}

/* The vocabularies agree: the same number of logits, and where the model
 * has a tokenizer, the draft model has one whose every token is the same. */
static int check_vocab(struct draft_model *m, const struct exec *target,
		       const struct atlas_tokenizer *tok, char *err, size_t errlen)
{
	if (m->x->geo.vocab != target->geo.vocab)
		return atlas_errf(err, errlen, -EINVAL,
				  "draft_model %s: vocab_size %d, the model's is %d: a draft model "
				  "must share the model's vocabulary", m->dir, m->x->geo.vocab,
				  target->geo.vocab);
	if (!tok)
		return 0;
	struct atlas_tokenizer *dt;
	int rc = tok_load(m->dir, &dt, err, errlen);
	if (rc == -ENOENT)
		return atlas_errf(err, errlen, -EINVAL,
				  "draft_model %s: no tokenizer.json; a draft model must have the "
				  "model's tokenizer", m->dir);
	if (rc)
		return rc;
	char a[256], b[256];
	const int n_draft = tok_vocab_size(dt), n_model = tok_vocab_size(tok);
	int diff = n_draft != n_model ? -1 : 0;
	for (int32_t id = 0; !diff && id < n_model; id++) {
		const int na = tok_token_bytes(tok, id, a, sizeof a);
		const int nb = tok_token_bytes(dt, id, b, sizeof b);
		if (na != nb || (na > 0 && memcmp(a, b, (size_t)ATLAS_MIN(na, (int)sizeof a))))
			diff = id + 1;
	}
	tok_free(dt);
	if (diff < 0)
		return atlas_errf(err, errlen, -EINVAL,
				  "draft_model %s: its tokenizer has %d tokens, the model's %d: a "
				  "draft model must share the model's vocabulary", m->dir, n_draft,
				  n_model);
	if (diff)
		return atlas_errf(err, errlen, -EINVAL,
				  "draft_model %s: token %d differs from the model's: a draft model "
				  "must share the model's vocabulary", m->dir, diff - 1);
	return 0;
}

static int draft_bind(void *self, const struct exec *target, const struct atlas_tokenizer *tok,
		      char *err, size_t errlen)
{
	struct draft_model *m = self;
	int rc = check_vocab(m, target, tok, err, errlen);
	if (rc)
		return rc;
	if (m->x->geo.context < target->geo.context)
		return atlas_errf(err, errlen, -EINVAL,
				  "draft_model %s: its context of %d tokens is shorter than the "
				  "model's %d (set context)", m->dir, m->x->geo.context,
				  target->geo.context);
	log_info("draft model: %s (%s, %d layers, %llu parameters) on %s; KV %d blocks", m->dir,
		 m->x->mc->architecture, m->x->mc->n_layers,
		 (unsigned long long)m->x->info.parameters, m->x->be->info.name,
		 m->x->pool.kv.n_blocks);
	return 0;
}

static void draft_close(void *self)
{
	struct draft_model *m = self;
	if (!m)
		return;
	step_cmd_free(&m->cmd);
	exec_close(m->x);
	free(m);
}

static void *draft_session_new(void *self)
{
	struct draft_model *m = self;
	struct draft_seq *d = calloc(1, sizeof *d);
	if (!d)
		return NULL;
	d->feed = malloc((size_t)m->chunk * sizeof *d->feed);
	if (!d->feed) {
		free(d);
		return NULL;
	}
	seq_init(&d->kv.seq);
	return d;
}

/* Give the sequence's KV back; it starts from the first token again. */
static void release(struct draft_model *m, struct draft_seq *d)
{
	draft_seqs_release(&m->seqs, &d->kv);
	d->base = 0;
	d->n_fed = 0;
}

static void evict(void *ctx, struct draft_seq_kv *kv)
{
	release(ctx, of(kv));
}

static void draft_session_free(void *self, void *state)
{
	struct draft_model *m = self;
	struct draft_seq *d = state;
	if (!d)
		return;
	release(m, d);
	seq_free(&m->x->pool, &d->kv.seq);
	free(d->feed);
	free(d);
}

static void draft_session_forget(void *self, void *state)
{
	release(self, state);
}

static int draft_prepare(void *self, struct draft_req *q)
{
	struct draft_model *m = self;
	struct draft_seq *d = q->state;
	const size_t n = q->n_tokens;
	q->n_drafts = 0;
	if (d->base > n)
		release(m, d);
	/* What of the sequence is still the context. */
	size_t valid = d->base;
	for (int j = 0; j < d->n_fed && valid < n && d->fed[j] == q->tokens[valid]; j++)
		valid++;
	const size_t start = ATLAS_MIN(valid, n - 1);
	if ((size_t)d->kv.seq.n_tokens > start &&
	    seq_truncate(&m->x->pool, &d->kv.seq, (int)start))
		release(m, d);
	d->base = ATLAS_MIN(start, (size_t)d->kv.seq.n_tokens);
	d->n_fed = 0;
	const int room = m->chunk - m->queued_rows;
	if (room <= 0)
		return 0;
	const size_t need = n - d->base;
	const int feed = (int)ATLAS_MIN(need, (size_t)room);
	const int k = (size_t)feed == need ? q->k : 0;
	if (draft_seqs_reserve(&m->seqs, &d->kv, (int)d->base + feed + ATLAS_MAX(k - 1, 0)))
		return 0;
	memcpy(d->feed, q->tokens + d->base, (size_t)feed * sizeof *d->feed);
	d->n_feed = feed;
	q->k = k;
	d->q = q;
	m->queued_rows += feed;
	return 1;
}

/* Append d's rows (ids[0, n) from position pos0) to the command, with an
 * out row at the last one when `out`. */
static int add_seq(struct draft_model *m, struct draft_seq *d, const int32_t *ids, int n,
		   int pos0, bool out)
{
	return draft_cmd_add(&m->cmd, &m->x->pool, m->x->lim.max_table, &d->kv.seq, ids, n, pos0,
			     out ? &greedy : NULL);
}

static int run_cmd(struct draft_model *m, struct step_result *res, char *err, size_t errlen)
{
	m->cmd.number = ++m->steps;
	int rc = exec_run(m->x, &m->cmd, res, err, errlen);
	m->recorded |= !rc && res->recorded;
	return rc;
}

/* The catch-up step: every queued sequence's unseen context tokens, the
 * one-row sequences first (the step layout's decode rows). */
static int catch_up(struct draft_model *m, struct draft_req *const *q, int n, char *err,
		    size_t errlen)
{
	struct step_cmd *c = &m->cmd;
	struct step_result res;
	int rc = 0;
	c->n_seqs = c->n_rows = c->n_out = c->n_table = 0;
	for (int pass = 0; pass < 2; pass++)
		for (int i = 0; i < n && !rc; i++) {
			struct draft_seq *d = q[i]->state;
			if ((d->n_feed == 1) == (pass == 0))
				rc = add_seq(m, d, d->feed, d->n_feed, (int)d->base, q[i]->k > 0);
		}
	if (rc)
		return atlas_errf(err, errlen, rc, "a draft sequence's blocks cannot be read");
	if ((rc = run_cmd(m, &res, err, errlen)))
		return rc;
	int out = 0;
	for (int pass = 0; pass < 2; pass++)
		for (int i = 0; i < n; i++) {
			struct draft_seq *d = q[i]->state;
			if ((d->n_feed == 1) != (pass == 0))
				continue;
			d->base += (size_t)d->n_feed;
			seq_commit(&d->kv.seq, (int)d->base);
			if (q[i]->k > 0)
				q[i]->drafts[q[i]->n_drafts++] = res.tokens[out++];
		}
	return 0;
}

/* Draft j + 1 of every request that wants it: feed draft j. */
static int extend(struct draft_model *m, struct draft_req *const *q, int n, int j, char *err,
		  size_t errlen)
{
	struct step_cmd *c = &m->cmd;
	struct step_result res;
	int rc = 0;
	c->n_seqs = c->n_rows = c->n_out = c->n_table = 0;
	for (int i = 0; i < n && !rc; i++) {
		struct draft_seq *d = q[i]->state;
		if (q[i]->k > j + 1)
			rc = add_seq(m, d, &q[i]->drafts[j], 1, (int)d->base + d->n_fed, true);
	}
	if (rc)
		return atlas_errf(err, errlen, rc, "a draft sequence's blocks cannot be read");
	if (!c->n_seqs)
		return 0;
	if ((rc = run_cmd(m, &res, err, errlen)))
		return rc;
	int out = 0;
	for (int i = 0; i < n; i++) {
		struct draft_seq *d = q[i]->state;
		if (q[i]->k <= j + 1)
			continue;
		d->fed[d->n_fed++] = q[i]->drafts[j];
		seq_commit(&d->kv.seq, (int)d->base + d->n_fed);
		q[i]->drafts[q[i]->n_drafts++] = res.tokens[out++];
	}
	return 0;
}

static int draft_run(void *self, struct draft_req *const *q, int n, bool *recorded, char *err,
		     size_t errlen)
{
	struct draft_model *m = self;
	int kmax = 0, rc;
	m->recorded = false;
	for (int i = 0; i < n; i++) {
		q[i]->n_drafts = 0;
		kmax = ATLAS_MAX(kmax, q[i]->k);
	}
	rc = catch_up(m, q, n, err, errlen);
	for (int j = 0; !rc && j + 1 < kmax; j++)
		rc = extend(m, q, n, j, err, errlen);
	m->queued_rows = 0;
	*recorded = m->recorded;
	for (int i = 0; i < n; i++) {
		struct draft_seq *d = q[i]->state;
		d->q = NULL;
		if (rc) {
			/* The step left the sequence's KV undefined. */
			q[i]->n_drafts = 0;
			release(m, d);
		}
	}
	if (rc)
		atlas_errprefix(err, errlen, "draft model");
	return rc;
}

const struct drafter_ops draft_model_ops = {
	.name = "draft",
	.method = ATLAS_SPEC_DRAFT,
	.runs_model = true,
	.open = draft_open,
	.bind = draft_bind,
	.close = draft_close,
	.session_new = draft_session_new,
	.session_free = draft_session_free,
	.session_forget = draft_session_forget,
	.prepare = draft_prepare,
	.run = draft_run,
};
