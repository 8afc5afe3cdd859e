/* The model's multi-token-prediction head as a drafter (drafter.h).
 *
 * The head (model_load_head) runs on an executor of its own, on the same
 * backend and device as the model, with its own KV pool (mtp_kv_memory)
 * and one sequence per session. Its row at position p is the pair (the
 * model's final hidden row at p, the context token at p + 1) and guesses
 * the token at p + 2. So the head must see every position the model
 * computes, which it can only while the model's hidden rows are still in
 * the model executor's buffer: after each step of the model, absorb notes
 * each session's rows whose input is context now (a verify's rejected rows
 * are not), and the next run, before the model's next step, feeds them to
 * the head in one step for every session (the catch-up), whether or not
 * they draft.
 *
 * A session drafts when its catch-up ends at the pair of the context's
 * last two tokens: that row's logits give the first draft; each further
 * draft feeds the previous one with the head's own final hidden row of
 * the step before, one head step per draft shared by every session, as
 * deeper MTP steps do. Those chained positions hold guesses, not the
 * model's hidden rows: the next catch-up truncates them. A session whose
 * pairs the head missed (a step whose rows were not absorbed, KV given
 * back for room, a failed run, a session restored from disk) cannot catch
 * up and does not draft with the head until its context is forgotten.
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

struct mtp_seq {
	struct draft_seq_kv kv;     /* the head's KV: pairs of positions [0, fed), then the
				     * chained drafts of the last run */
	size_t fed;
	bool lost;                  /* missed pairs: no drafts until forgotten */
	/* The pairs absorb noted, fed by the next run: positions fed, fed + 1,
	 * ..., the model's hidden rows wait_row + j of its last step and the
	 * tokens wait_ids[j]. */
	int n_wait, wait_row;
	int32_t *wait_ids;          /* [max_rows] */
	struct draft_req *q;        /* queued by prepare, NULL: not drafting */
	int out;                    /* its out row in the head's last step */
};

struct mtp_drafter {
	char dir[ATLAS_PATH_MAX];
	struct exec *x;             /* the head's executor */
	bool recorded;              /* a step of the current run recorded its graph */
	struct kt_tensor model_hidden;  /* the model executor's d_hidden (bind) */
	struct step_cmd cmd;
	int max_rows;
	struct kt_tensor d_src;     /* [max_rows, 1] i32: the rows a run gathers */
	int32_t *src;               /* [max_rows] the same on the host */
	struct mtp_seq **waiting;   /* [max_seqs] sessions with pairs to feed */
	int n_waiting;
	struct draft_seqs seqs;     /* every session's sequence with KV (eviction) */
	uint64_t steps;
};

static struct mtp_seq *of(struct draft_seq_kv *kv)
{
	return (struct mtp_seq *)((char *)kv - offsetof(struct mtp_seq, kv));
}

/* A sequence drafting now, or with pairs to feed, keeps its KV. */
static bool busy(const struct draft_seq_kv *kv)
{
	const struct mtp_seq *d = of((struct draft_seq_kv *)kv);
	return d->q || d->n_wait;
}

static void evict(void *ctx, struct draft_seq_kv *kv);

/* A draft is the head's most likely token. */
static const struct kt_sample_row greedy = { .temperature = 0, .top_p = 1, .top_k = 0, .u = 0 };

static int mtp_open(const struct atlas_config *c, const struct step_limits *model_lim,
		    void **self, char *err, size_t errlen)
{
	*self = NULL;
	if (!c->mtp_head)
		return 0;
	struct model_config mc;
	const bool dummy = !strcmp(c->load_format, "dummy");
	int rc = dummy ? model_shape_config(c->model, &mc, err, errlen)
		       : model_config_load(c->model, &mc, err, errlen);
	if (rc)
		return rc;
	if (!model_config_has_head(&mc)) {
		if (c->spec == ATLAS_SPEC_MTP)
			return atlas_errf(err, errlen, -EINVAL,
					  "key 'spec': mtp, but %s has no multi-token-prediction "
					  "head that atlas can run", c->model);
		return 0;
	}
	struct mtp_drafter *m = calloc(1, sizeof *m);
	if (!m)
		return atlas_errf(err, errlen, -ENOMEM, "out of memory");
	struct atlas_config hc = *c;
	hc.kv_memory = c->mtp_kv_memory;
	hc.kv_host_memory = hc.kv_disk_memory = 0;
	snprintf(m->dir, sizeof m->dir, "%s", c->model);
	/* A catch-up step takes a whole step of the model; one out row each. */
	const struct step_limits lim = {
		.max_seqs = model_lim->max_seqs,
		.max_rows = model_lim->max_rows,
		.max_out = model_lim->max_seqs,
	};
	m->max_rows = lim.max_rows;
	rc = exec_open(&hc, EXEC_MTP_HEAD, lim.max_seqs, &lim, &m->x, err, errlen);
	if (!rc && (rc = step_cmd_alloc(&m->cmd, &m->x->lim)))
		atlas_errf(err, errlen, rc, "out of memory");
	if (!rc && (rc = kt_alloc(m->x->be, KT_I32, lim.max_rows, 1, &m->d_src)))
		atlas_errf(err, errlen, rc, "cannot allocate the head's row indices");
	if (!rc) {
		m->src = calloc((size_t)lim.max_rows, sizeof *m->src);
		m->waiting = calloc((size_t)lim.max_seqs, sizeof *m->waiting);
		if (!m->src || !m->waiting)
			rc = atlas_errf(err, errlen, -ENOMEM, "out of memory");
	}
	if (rc) {
		atlas_errprefix(err, errlen, "MTP head of %s", c->model);
		free(m->src);
		free(m->waiting);
		step_cmd_free(&m->cmd);
		if (m->d_src.data)
			kt_free(m->x->be, &m->d_src);
		exec_close(m->x);
		free(m);
		return rc;
	}
	m->seqs = (struct draft_seqs){ .pool = &m->x->pool, .busy = busy, .evict = evict,
				       .ctx = m };
	*self = m;
	return 0;
}

static int mtp_bind(void *self, const struct exec *target, const struct atlas_tokenizer *tok,
		    char *err, size_t errlen)
{
	struct mtp_drafter *m = self;
	(void)tok;
	if (!target->d_hidden.data || target->d_hidden.cols != m->x->mc->hidden_size ||
	    target->lim.max_rows > m->max_rows)
		return atlas_errf(err, errlen, -EINVAL,
				  "MTP head of %s: the model does not keep the hidden rows it "
				  "reads", m->dir);
	m->model_hidden = target->d_hidden;
	log_info("MTP head: %s (%d layers) on %s; KV %d blocks", m->dir, m->x->mc->n_layers,
		 m->x->be->info.name, m->x->pool.kv.n_blocks);
	return 0;
}

static void mtp_close(void *self)
{
	struct mtp_drafter *m = self;
	if (!m)
		return;
	step_cmd_free(&m->cmd);
	kt_free(m->x->be, &m->d_src);
	exec_close(m->x);
	free(m->src);
	free(m->waiting);
	free(m);
}

static void *mtp_session_new(void *self)
{
	struct mtp_drafter *m = self;
	struct mtp_seq *d = calloc(1, sizeof *d);
	if (!d)
		return NULL;
	d->wait_ids = malloc((size_t)m->max_rows * sizeof *d->wait_ids);
	if (!d->wait_ids) {
		free(d);
		return NULL;
	}
	seq_init(&d->kv.seq);
	return d;
}

static void unwait(struct mtp_drafter *m, struct mtp_seq *d)
{
	for (int i = 0; d->n_wait && i < m->n_waiting; i++)
		if (m->waiting[i] == d) {
			m->waiting[i] = m->waiting[--m->n_waiting];
			break;
		}
	d->n_wait = 0;
}

/* Give the sequence's KV back: it holds no pairs now. */
static void release(struct mtp_drafter *m, struct mtp_seq *d)
{
	unwait(m, d);
	draft_seqs_release(&m->seqs, &d->kv);
	d->fed = 0;
}

/* The head missed pairs of d's context. */
static void lose(struct mtp_drafter *m, struct mtp_seq *d)
{
	release(m, d);
	d->lost = true;
}

static void evict(void *ctx, struct draft_seq_kv *kv)
{
	lose(ctx, of(kv));
}

static void mtp_session_free(void *self, void *state)
{
	struct mtp_drafter *m = self;
	struct mtp_seq *d = state;
	if (!d)
		return;
	release(m, d);
	seq_free(&m->x->pool, &d->kv.seq);
	free(d->wait_ids);
	free(d);
}

static void mtp_session_forget(void *self, void *state)
{
	struct mtp_seq *d = state;
	release(self, d);
	d->lost = false;
}

/* Note what one session's rows of the model's step give the head. */
static void absorb_one(struct mtp_drafter *m, const struct draft_seen *s)
{
	struct mtp_seq *d = s->state;
	if (d->lost)
		return;
	/* A recomputed or rewritten part of the context replaces the head's. */
	if (s->pos0 < d->fed) {
		if (seq_truncate(&m->x->pool, &d->kv.seq, (int)s->pos0)) {
			lose(m, d);
			return;
		}
		d->fed = s->pos0;
	} else if ((size_t)d->kv.seq.n_tokens > d->fed &&
		   seq_truncate(&m->x->pool, &d->kv.seq, (int)d->fed)) {
		lose(m, d);
		return;
	}
	if (s->pos0 > d->fed) {
		lose(m, d);
		return;
	}
	/* The pair at p needs the token at p + 1. */
	const size_t end = ATLAS_MIN(s->pos0 + (size_t)s->n_rows, s->n_tokens - 1);
	if (end <= d->fed)
		return;
	const int n = (int)(end - d->fed);
	if (draft_seqs_reserve(&m->seqs, &d->kv, (int)end)) {
		lose(m, d);
		return;
	}
	d->wait_row = s->row;
	d->n_wait = n;
	memcpy(d->wait_ids, s->tokens + d->fed + 1, (size_t)n * sizeof *d->wait_ids);
	m->waiting[m->n_waiting++] = d;
}

static void mtp_absorb(void *self, const struct draft_seen *seen, int n, uint64_t step)
{
	struct mtp_drafter *m = self;
	(void)step;
	/* Pairs of an earlier step that no run fed: their hidden rows are gone. */
	while (m->n_waiting)
		lose(m, m->waiting[0]);
	for (int i = 0; i < n; i++)
		absorb_one(m, &seen[i]);
}

static bool mtp_pending(void *self)
{
	const struct mtp_drafter *m = self;
	return m->n_waiting > 0;
}

/* A session drafts when its waiting pairs end at the context's last two
 * tokens (fed by the next run, with an out row there). */
static int mtp_prepare(void *self, struct draft_req *q)
{
	struct mtp_drafter *m = self;
	struct mtp_seq *d = q->state;
	q->n_drafts = 0;
	if (d->lost || !d->n_wait || d->fed + (size_t)d->n_wait + 1 != q->n_tokens)
		return 0;
	if (draft_seqs_reserve(&m->seqs, &d->kv, (int)q->n_tokens - 1 + q->k - 1))
		return 0;
	d->q = q;
	return 1;
}

/* Append d's rows (ids[0, n) from position pos0) to the command, with an
 * out row at the last one when `out`, whose index d->out keeps (-1: none). */
static int add_seq(struct mtp_drafter *m, struct mtp_seq *d, const int32_t *ids, int n,
		   int pos0, bool out)
{
	d->out = out ? m->cmd.n_out : -1;
	return draft_cmd_add(&m->cmd, &m->x->pool, m->x->lim.max_table, &d->kv.seq, ids, n, pos0,
			     out ? &greedy : NULL);
}

/* Gather the command's hidden input rows (m->src of `from`) and run it. */
static int run_cmd(struct mtp_drafter *m, const struct kt_tensor *from,
		   struct step_result *res, char *err, size_t errlen)
{
	struct exec *x = m->x;
	const int n = m->cmd.n_rows;
	const struct kt_tensor idx = kt_rows(m->d_src, 0, n), dst = kt_rows(x->d_hidden, 0, n);
	int rc = kt_upload(x->be, &idx, 0, m->src, (size_t)n * sizeof *m->src);
	if (!rc)
		rc = kt_gather_rows(x->be, &dst, from, &idx);
	if (rc)
		return atlas_errf(err, errlen, rc, "%s backend: cannot gather the hidden rows",
				  x->be->info.backend);
	m->cmd.number = ++m->steps;
	rc = exec_run(x, &m->cmd, res, err, errlen);
	m->recorded |= !rc && res->recorded;
	return rc;
}

/* The catch-up step: every waiting session's pairs, the one-row ones first
 * (the step layout's decode rows), an out row at the last pair of those
 * that draft. */
static int catch_up(struct mtp_drafter *m, char *err, size_t errlen)
{
	struct step_cmd *c = &m->cmd;
	struct step_result res;
	int rc = 0;
	c->n_seqs = c->n_rows = c->n_out = c->n_table = 0;
	for (int pass = 0; pass < 2; pass++)
		for (int i = 0; i < m->n_waiting && !rc; i++) {
			struct mtp_seq *d = m->waiting[i];
			if ((d->n_wait == 1) != (pass == 0))
				continue;
			for (int j = 0; j < d->n_wait; j++)
				m->src[c->n_rows + j] = d->wait_row + j;
			rc = add_seq(m, d, d->wait_ids, d->n_wait, (int)d->fed,
				     d->q && d->q->k > 0);
		}
	if (rc)
		return atlas_errf(err, errlen, rc, "a head sequence's blocks cannot be read");
	if ((rc = run_cmd(m, &m->model_hidden, &res, err, errlen)))
		return rc;
	for (int i = 0; i < m->n_waiting; i++) {
		struct mtp_seq *d = m->waiting[i];
		d->fed += (size_t)d->n_wait;
		d->n_wait = 0;
		seq_commit(&d->kv.seq, (int)d->fed);
		if (d->out >= 0)
			d->q->drafts[d->q->n_drafts++] = res.tokens[d->out];
	}
	m->n_waiting = 0;
	return 0;
}

/* Draft j + 1 of every request that wants it: feed draft j with the head's
 * final hidden row of its last out row. */
static int extend(struct mtp_drafter *m, struct draft_req *const *q, int n, int j, char *err,
		  size_t errlen)
{
	struct step_cmd *c = &m->cmd;
	struct step_result res;
	int rc = 0;
	c->n_seqs = c->n_rows = c->n_out = c->n_table = 0;
	for (int i = 0; i < n && !rc; i++) {
		struct mtp_seq *d = q[i]->state;
		if (q[i]->k <= j + 1 || d->out < 0) {
			d->out = -1;
			continue;
		}
		m->src[c->n_rows] = d->out;
		rc = add_seq(m, d, &q[i]->drafts[j], 1, (int)d->fed + j, true);
	}
	if (rc)
		return atlas_errf(err, errlen, rc, "a head sequence's blocks cannot be read");
	if (!c->n_seqs)
		return 0;
	if ((rc = run_cmd(m, &m->x->d_hidden_out, &res, err, errlen)))
		return rc;
	for (int i = 0; i < n; i++) {
		struct mtp_seq *d = q[i]->state;
		if (d->out < 0)
			continue;
		seq_commit(&d->kv.seq, (int)d->fed + j + 1);
		q[i]->drafts[q[i]->n_drafts++] = res.tokens[d->out];
	}
	return 0;
}

static int mtp_run(void *self, struct draft_req *const *q, int n, bool *recorded, char *err,
		   size_t errlen)
{
	struct mtp_drafter *m = self;
	int kmax = 0, rc = 0;
	m->recorded = false;
	for (int i = 0; i < n; i++) {
		q[i]->n_drafts = 0;
		kmax = ATLAS_MAX(kmax, q[i]->k);
	}
	if (m->n_waiting)
		rc = catch_up(m, err, errlen);
	for (int j = 0; !rc && j + 1 < kmax; j++)
		rc = extend(m, q, n, j, err, errlen);
	*recorded = m->recorded;
	for (int i = 0; i < n; i++) {
		struct mtp_seq *d = q[i]->state;
		d->q = NULL;
		if (rc) {
			q[i]->n_drafts = 0;
			lose(m, d);
		}
	}
	if (rc) {
		/* The step left the KV of its sequences undefined. */
		while (m->n_waiting)
			lose(m, m->waiting[0]);
		atlas_errprefix(err, errlen, "MTP head");
	}
	return rc;
}

const struct drafter_ops mtp_drafter_ops = {
	.name = "mtp",
	.method = ATLAS_SPEC_MTP,
	.runs_model = true,
	.open = mtp_open,
	.bind = mtp_bind,
	.close = mtp_close,
	.session_new = mtp_session_new,
	.session_free = mtp_session_free,
	.session_forget = mtp_session_forget,
	.prepare = mtp_prepare,
	.run = mtp_run,
	.absorb = mtp_absorb,
	.pending = mtp_pending,
};
