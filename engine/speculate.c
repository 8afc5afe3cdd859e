/* Speculative decoding in the engine (DESIGN §9): drafts before each plan,
 * the outcome of each verify after its step, the gate and the numbers of
 * ctl/spec.
 *
 * Before a plan, every decoding session with speculation on asks a
 * drafter (spec/drafter.h) for up to k guesses of the tokens that follow (k
 * within spec_k, its turn's max_tokens and the context, and what the gate
 * allows): prompt lookup when its setting is ngram, or auto and the context
 * has a match; the MTP head when it is mtp, or auto without a match (or
 * with one the gate holds back); the draft model when it is draft, or auto
 * where neither drafted. A drafter's model runs once for every session
 * that asked it, with the engine lock dropped. After each step, the MTP
 * head is told what the step computed for its sessions (spec_absorb): it
 * follows every position of the model. Then the
 * scheduler lays its last token and the drafts out as one verify segment
 * whose every row draws with the parameters and the per-position random
 * number plain decoding would use there. After the step, the draws are the
 * tokens: row 0's is always the next token; row j's counts only when the
 * drafts before it were what rows 0..j-1 drew. So the session receives
 * exactly the tokens plain decoding would have made, greedy or sampled with
 * a seed (the draws are the target model's own; a draft never changes one),
 * and the sequence keeps the KV of the rows whose input was accepted.
 *
 * With sampling this is speculative sampling with drafts of one token each
 * (a draft is a point guess): a draft d is accepted with the target's
 * probability of d, and on rejection the token is the target's draw given
 * that it is not d, which is what rejection sampling gives for such drafts;
 * coupling through the shared random number is what keeps the text equal
 * to plain decoding's for the same seed.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "engine/internal.h"

int spec_open(struct atlas_engine *e, const struct step_limits *lim, char *err, size_t errlen)
{
	for (int d = 0; d < SPEC_DRAFTERS; d++) {
		int rc = spec_drafters[d]->open(&e->cfg, lim, &e->spec.drafter[d], err, errlen);
		if (rc)
			return rc;
	}
	return 0;
}

int spec_bind(struct atlas_engine *e, char *err, size_t errlen)
{
	struct spec_engine *sp = &e->spec;
	for (int d = 0; d < SPEC_DRAFTERS; d++) {
		const struct drafter_ops *ops = spec_drafters[d];
		int rc = sp->drafter[d] && ops->bind
				 ? ops->bind(sp->drafter[d], e->x, e->tok, err, errlen) : 0;
		if (rc)
			return rc;
	}
	int rc = spec_cost_init(&sp->cost, e->x->lim.max_rows, e->cfg.max_batch);
	sp->seen = calloc((size_t)e->x->lim.max_seqs, sizeof *sp->seen);
	rc |= !sp->seen;
	for (int d = 0; d < SPEC_DRAFTERS; d++) {
		if (!spec_drafters[d]->runs_model)
			continue;
		sp->queued[d] = calloc((size_t)e->cfg.max_batch, sizeof *sp->queued[d]);
		rc |= !sp->queued[d] || spec_cost_init(&sp->draft_cost[d], e->cfg.max_batch, 0);
	}
	if (rc)
		return atlas_errf(err, errlen, -ENOMEM, "out of memory for speculative decoding");
	return 0;
}

void spec_close(struct atlas_engine *e)
{
	for (int d = 0; d < SPEC_DRAFTERS; d++)
		if (e->spec.drafter[d])
			spec_drafters[d]->close(e->spec.drafter[d]);
	spec_cost_free(&e->spec.cost);
	for (int d = 0; d < SPEC_DRAFTERS; d++) {
		spec_cost_free(&e->spec.draft_cost[d]);
		free(e->spec.queued[d]);
	}
	free(e->spec.seen);
}

void spec_session_init(struct atlas_engine *e, struct spec_session *p)
{
	memset(p, 0, sizeof *p);
	for (int d = 0; d < SPEC_DRAFTERS; d++) {
		if (e->spec.drafter[d])
			p->state[d] = spec_drafters[d]->session_new(e->spec.drafter[d]);
		spec_accept_init(&p->accept[d]);
	}
	p->drafter = -1;
}

void spec_session_free(struct atlas_engine *e, struct spec_session *p)
{
	for (int d = 0; d < SPEC_DRAFTERS; d++)
		if (p->state[d])
			spec_drafters[d]->session_free(e->spec.drafter[d], p->state[d]);
	memset(p->state, 0, sizeof p->state);
}

void spec_session_reset(struct spec_session *p)
{
	for (int d = 0; d < SPEC_DRAFTERS; d++)
		spec_accept_init(&p->accept[d]);
	p->n_shadow = 0;
	p->held = 0;
	p->drafter = -1;
	p->gated = false;
}

void spec_session_forget(struct atlas_engine *e, struct spec_session *p)
{
	for (int d = 0; d < SPEC_DRAFTERS; d++)
		if (p->state[d])
			spec_drafters[d]->session_forget(e->spec.drafter[d], p->state[d]);
}

/* Drafts the gate held back, checked against the tokens plain decoding
 * made since: the gate learns acceptance at no device cost. Only tokens the
 * model generated count (a new prompt is not a rejection). */
static void check_shadow(struct atlas_session *s, const struct turn *t)
{
	struct spec_session *p = &s->spec;
	const size_t n = s->req.n_tokens, gen0 = t->ctx_start + t->n_prompt;
	if (!p->n_shadow)
		return;
	if (p->shadow_at < gen0 || p->shadow_at > n) {
		p->n_shadow = 0;
		return;
	}
	const size_t known = n - p->shadow_at;
	int a = 0;
	while (a < p->n_shadow && (size_t)a < known && s->req.tokens[p->shadow_at + a] == p->shadow[a])
		a++;
	if (a < p->n_shadow && (size_t)a == known)
		return;
	spec_accept_add(&p->accept[SPEC_DRAFTER_NGRAM], a, a < p->n_shadow);
	p->n_shadow = 0;
}

/* Drafts s may verify in the next step: within its settings, what is left
 * of its turn and of the context. */
static int draft_room(const struct atlas_session *s, const struct turn *t, int context)
{
	const long left = (long)s->params.max_tokens - (long)t->n_generated - 1;
	const long room = (long)context - (long)s->req.n_tokens - 1;
	return (int)ATLAS_MAX(0, ATLAS_MIN((long)s->params.spec_k, ATLAS_MIN(left, room)));
}

static void set_drafts(struct atlas_session *s, int drafter, const int32_t *drafts, int k)
{
	memcpy(s->req.draft, drafts, (size_t)k * sizeof *drafts);
	s->req.n_draft = k;
	s->spec.drafter = drafter;
	s->spec.gated = false;
}

/* Prompt lookup: its drafts are free, so the gate sees how many there are,
 * and keeps checking the ones it holds back. */
static int plan_ngram(struct atlas_engine *e, struct atlas_session *s, int others, int segs,
		      int kmax)
{
	struct spec_session *p = &s->spec;
	struct draft_req q = { .state = p->state[SPEC_DRAFTER_NGRAM], .tokens = s->req.tokens,
			       .n_tokens = s->req.n_tokens, .k = kmax };
	spec_drafters[SPEC_DRAFTER_NGRAM]->prepare(e->spec.drafter[SPEC_DRAFTER_NGRAM], &q);
	if (q.n_drafts <= 0)
		return 0;
	const double alpha = spec_accept_rate(&p->accept[SPEC_DRAFTER_NGRAM]);
	const int k = e->cfg.spec_gate
		? spec_gate_k(&e->spec.cost, alpha, others, segs, q.n_drafts, 0) : q.n_drafts;
	if (k == 0) {
		p->gated = true;
		e->spec.gated++;
		if (!p->n_shadow) {
			memcpy(p->shadow, q.drafts, (size_t)q.n_drafts * sizeof *q.drafts);
			p->n_shadow = q.n_drafts;
			p->shadow_at = s->req.n_tokens;
		}
		return 0;
	}
	set_drafts(s, SPEC_DRAFTER_NGRAM, q.drafts, k);
	p->n_shadow = 0;
	return k;
}

/* A drafter that runs a model: the gate picks k first (its cost counts),
 * then the session is queued for the drafter's run. Returns the rows it
 * expects to add to the step. */
static int plan_model(struct atlas_engine *e, struct atlas_session *s, int d, int others,
		      int segs, int kmax)
{
	struct spec_engine *sp = &e->spec;
	struct spec_session *p = &s->spec;
	int k = kmax;
	if (e->cfg.spec_gate) {
		const double extra = spec_cost_at(&sp->draft_cost[d], sp->n_queued[d] + 1, 0);
		k = spec_gate_k(&sp->cost, spec_accept_rate(&p->accept[d]), others, segs, kmax,
				extra);
		if (k == 0 && ++p->held < SPEC_GATE_PROBE) {
			p->gated = true;
			sp->gated++;
			return 0;
		}
		if (k == 0)
			k = kmax;
	}
	p->held = 0;
	if (sp->n_queued[d] >= e->cfg.max_batch)
		return 0;
	p->req = (struct draft_req){ .state = p->state[d], .tokens = s->req.tokens,
				     .n_tokens = s->req.n_tokens, .k = k };
	if (spec_drafters[d]->prepare(sp->drafter[d], &p->req) != 1)
		return 0;
	p->req_epoch = s->req.epoch;
	p->req_tokens = s->req.n_tokens;
	sp->queued[d][sp->n_queued[d]++] = s;
	return p->req.k;
}

/* Decide s's drafts for the next plan beside `others` rows and `segs`
 * verify segments; returns the rows they add. */
static int plan_session(struct atlas_engine *e, struct atlas_session *s, int others, int segs)
{
	struct sched_req *r = &s->req;
	struct spec_session *p = &s->spec;
	struct turn *t = session_newest(s);
	const enum atlas_spec m = s->params.spec;
	p->drafter = -1;
	p->gated = false;
	if (!t || t->done || m == ATLAS_SPEC_OFF || r->phase != REQ_RUNNING || r->forgotten ||
	    r->n_tokens != (size_t)r->seq.n_tokens + 1)
		return 0;
	check_shadow(s, t);
	const int kmax = draft_room(s, t, e->context);
	if (kmax <= 0)
		return 0;
	if ((m == ATLAS_SPEC_NGRAM || m == ATLAS_SPEC_AUTO) && p->state[SPEC_DRAFTER_NGRAM]) {
		const int k = plan_ngram(e, s, others, segs, kmax);
		if (k > 0 || m == ATLAS_SPEC_NGRAM)
			return k;
	}
	if ((m == ATLAS_SPEC_MTP || m == ATLAS_SPEC_AUTO) && p->state[SPEC_DRAFTER_MTP]) {
		const int k = plan_model(e, s, SPEC_DRAFTER_MTP, others, segs, kmax);
		if (k > 0 || m == ATLAS_SPEC_MTP)
			return k;
	}
	if ((m == ATLAS_SPEC_DRAFT || m == ATLAS_SPEC_AUTO) && p->state[SPEC_DRAFTER_DRAFT])
		return plan_model(e, s, SPEC_DRAFTER_DRAFT, others, segs, kmax);
	return 0;
}

/* Run drafter d's model for every session queued for it (and what it has
 * pending) without the lock, then hand each its drafts if its context is
 * still the one they were made for. */
static void run_model(struct atlas_engine *e, int d)
{
	struct spec_engine *sp = &e->spec;
	struct draft_req *q[ATLAS_MAX_SLOTS];
	const int n = sp->n_queued[d];
	int kmax = 0;
	char err[ATLAS_ERRLEN];
	for (int i = 0; i < n; i++) {
		q[i] = &sp->queued[d][i]->spec.req;
		kmax = ATLAS_MAX(kmax, q[i]->k);
	}
	pthread_mutex_unlock(&e->lock);
	const uint64_t t0 = atlas_now_ns();
	bool recorded = false;
	const int rc = spec_drafters[d]->run(sp->drafter[d], q, n, &recorded, err, sizeof err);
	const uint64_t t1 = atlas_now_ns();
	pthread_mutex_lock(&e->lock);
	sp->n_queued[d] = 0;
	if (rc) {
		if (!sp->draft_errors++)
			log_warn("speculative decoding: %s; those sessions decode without drafts", err);
		return;
	}
	/* Seconds per draft token; a run that only caught up drafted none. */
	if (kmax > 0 && !recorded)
		spec_cost_add(&sp->draft_cost[d], n, 0, (double)(t1 - t0) * 1e-9 / kmax);
	for (int i = 0; i < n; i++) {
		struct atlas_session *s = sp->queued[d][i];
		struct spec_session *p = &s->spec;
		const struct turn *t = session_newest(s);
		if (s->closed || s->req.forgotten || s->req.epoch != p->req_epoch ||
		    s->req.n_tokens != p->req_tokens || !t || t->done || q[i]->n_drafts <= 0)
			continue;
		set_drafts(s, d, q[i]->drafts,
			   ATLAS_MIN(q[i]->n_drafts, draft_room(s, t, e->context)));
	}
}

/* The gate weighs each session's drafts against the step as planned so
 * far: every running session's row and the drafts granted before it, so
 * that many sessions' verifies together must pay for the step they make. */
void spec_plan(struct atlas_engine *e)
{
	int rows = 0, segs = 0;
	for (int i = 0; i < e->sched.n_slots; i++)
		rows += e->sched.slots[i] != NULL;
	memset(e->spec.n_queued, 0, sizeof e->spec.n_queued);
	for (struct atlas_session *s = e->sessions; s; s = s->next) {
		s->req.n_draft = 0;
		const int k = s->closed ? 0 : plan_session(e, s, ATLAS_MAX(0, rows - 1), segs);
		rows += k;
		segs += k > 0;
	}
	for (int d = 0; d < SPEC_DRAFTERS; d++) {
		const struct drafter_ops *ops = spec_drafters[d];
		void *self = e->spec.drafter[d];
		if (self && ops->runs_model &&
		    (e->spec.n_queued[d] || (ops->pending && ops->pending(self))))
			run_model(e, d);
	}
}

/* Rows of step row..row + n whose input is the session's context now: a
 * verify's rows up to its first rejected draft, every row of the rest. */
static int rows_in_context(const struct step_cmd *c, const struct step_seq *q,
			   const struct sched_req *r)
{
	int n = 0;
	while (n < q->n_rows && (size_t)q->pos0 + (size_t)n < r->n_tokens &&
	       c->ids[q->row + n] == r->tokens[q->pos0 + n])
		n++;
	return n;
}

void spec_absorb(struct atlas_engine *e)
{
	const struct step_cmd *c = &e->cmd;
	for (int d = 0; d < SPEC_DRAFTERS; d++) {
		const struct drafter_ops *ops = spec_drafters[d];
		if (!e->spec.drafter[d] || !ops->absorb)
			continue;
		int n = 0;
		for (int i = 0; i < c->n_seqs; i++) {
			struct sched_req *r = e->sched.reqs_of[i];
			if (r->keep_all || r->forgotten || r->epoch != e->sched.epoch_of[i])
				continue;
			struct atlas_session *s = session_of(r);
			if (s->closed || !s->spec.state[d])
				continue;
			e->spec.seen[n++] = (struct draft_seen){
				.state = s->spec.state[d], .row = c->seqs[i].row,
				.n_rows = rows_in_context(c, &c->seqs[i], r),
				.pos0 = (size_t)c->seqs[i].pos0, .tokens = r->tokens,
				.n_tokens = r->n_tokens };
		}
		ops->absorb(e->spec.drafter[d], e->spec.seen, n, c->number);
	}
}

void spec_settle(struct atlas_engine *e, int i, const struct step_result *res, int out)
{
	struct sched *sc = &e->sched;
	struct sched_req *r = sc->reqs_of[i];
	const int d = sc->drafts_of[i];
	int kept = 1;
	if (!r->forgotten && r->epoch == sc->epoch_of[i]) {
		struct atlas_session *s = session_of(r);
		struct spec_session *p = &s->spec;
		const size_t before = r->n_tokens;
		int accepted = 0;
		bool rejected = false;
		for (int j = 0; j <= d; j++) {
			const int32_t id = res->tokens[out + j];
			session_accept_token(s, id);
			if (r->n_tokens == before + (size_t)j || session_newest(s)->done || j == d)
				break;
			if (id != r->draft[j]) {
				rejected = true;
				break;
			}
			accepted++;
		}
		kept = (int)ATLAS_MAX(1, r->n_tokens - before);
		const int who = p->drafter >= 0 ? p->drafter : SPEC_DRAFTER_NGRAM;
		spec_accept_add(&p->accept[who], accepted, rejected);
		p->draft_tokens += (uint64_t)d;
		p->accepted += (uint64_t)accepted;
		struct spec_totals *tot[] = { &e->spec.all, &e->spec.by[who] };
		for (int w = 0; w < 2; w++) {
			tot[w]->drafts++;
			tot[w]->draft_tokens += (uint64_t)d;
			tot[w]->accepted += (uint64_t)accepted;
		}
		for (int j = 0; j < d; j++) {
			e->spec.tried_at[j]++;
			e->spec.accepted_at[j] += j < accepted;
		}
	}
	int rc = sched_settle(sc, &e->cmd, i, kept);
	if (rc && !r->forgotten) {
		/* The model has recurrent state and no snapshot at the kept row:
		 * the rest of the sequence cannot be trusted. */
		session_end_turn(session_of(r), -EIO, "error",
				 "speculative decoding: the sequence could not be rolled back");
		sched_drop(sc, r);
	}
}

void spec_measure(struct atlas_engine *e, int rows, int segs, double seconds)
{
	spec_cost_add(&e->spec.cost, rows, segs, seconds);
}

void spec_stats(struct atlas_engine *e, struct atlas_spec_stats *o)
{
	const struct spec_engine *sp = &e->spec;
	snprintf(o->method, sizeof o->method, "%s", atlas_spec_name(e->cfg.spec));
	snprintf(o->draft_model, sizeof o->draft_model, "%s",
		 sp->drafter[SPEC_DRAFTER_DRAFT] ? e->cfg.draft_model : "");
	o->mtp_head = sp->drafter[SPEC_DRAFTER_MTP] != NULL;
	o->drafts_total = sp->all.drafts;
	o->draft_tokens_total = sp->all.draft_tokens;
	o->accepted_tokens_total = sp->all.accepted;
	for (int d = 0; d < SPEC_DRAFTERS; d++) {
		snprintf(o->by_drafter[d].name, sizeof o->by_drafter[d].name, "%s",
			 spec_drafters[d]->name);
		o->by_drafter[d].drafts_total = sp->by[d].drafts;
		o->by_drafter[d].draft_tokens_total = sp->by[d].draft_tokens;
		o->by_drafter[d].accepted_tokens_total = sp->by[d].accepted;
		o->by_drafter[d].seconds_per_token =
			sp->draft_cost[d].seconds ? spec_cost_at(&sp->draft_cost[d], 1, 0) : 0;
	}
	o->draft_errors_total = sp->draft_errors;
	o->gated_total = sp->gated;
	for (int j = 0; j < ATLAS_SPEC_POSITIONS; j++)
		o->acceptance_by_position[j] =
			sp->tried_at[j] ? (double)sp->accepted_at[j] / (double)sp->tried_at[j] : 0;
	o->mean_accepted_length =
		sp->all.drafts ? (double)sp->all.accepted / (double)sp->all.drafts : 0;
	o->step_seconds_decode = spec_cost_at(&sp->cost, 1, 0);
	/* A step of one verify segment alone: row k + 1 of segments 1. */
	const double *one = sp->cost.seconds + (sp->cost.max_segs >= 1 ? sp->cost.max_rows + 1 : 0);
	for (int k = 1; k <= ATLAS_SPEC_POSITIONS; k++)
		o->step_seconds_verify[k - 1] =
			sp->cost.max_segs >= 1 && k + 1 <= sp->cost.max_rows && one[k + 1] > 0
				? one[k + 1] : 0;
}

const char *spec_slot_state(const struct atlas_session *s)
{
	return s->spec.drafter >= 0 ? spec_drafters[s->spec.drafter]->name
				    : s->spec.gated ? "gated" : "off";
}
