/* Speculative decoding in the engine (DESIGN §9): drafts before each plan,
 * the outcome of each verify after its step, the gate and the numbers of
 * ctl/spec.
 *
 * Before a plan, every decoding session with speculation on asks its
 * drafter for up to k guesses of the tokens that follow (k within spec_k,
 * its turn's max_tokens and the context, and what the gate allows); the
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
#include <string.h>

#include "common/err.h"
#include "engine/internal.h"

int spec_open(struct atlas_engine *e)
{
	return spec_cost_init(&e->spec.cost, e->x->lim.max_rows);
}

void spec_close(struct atlas_engine *e)
{
	spec_cost_free(&e->spec.cost);
}

void spec_session_init(struct atlas_engine *e, struct spec_session *p)
{
	memset(p, 0, sizeof *p);
	ngram_init(&p->ngram, e->cfg.spec_ngram_min, e->cfg.spec_ngram_max);
	spec_accept_init(&p->accept);
}

void spec_session_free(struct spec_session *p)
{
	ngram_free(&p->ngram);
}

void spec_session_reset(struct spec_session *p)
{
	ngram_reset(&p->ngram);
	spec_accept_init(&p->accept);
	p->n_shadow = 0;
	p->drafting = p->gated = false;
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
	spec_accept_add(&p->accept, a, a < p->n_shadow);
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

/* Set s's drafts for the next plan; returns how many. */
static int plan_session(struct atlas_engine *e, struct atlas_session *s, int others)
{
	struct sched_req *r = &s->req;
	struct spec_session *p = &s->spec;
	struct turn *t = session_newest(s);
	p->drafting = p->gated = false;
	if (!t || t->done || s->params.spec == ATLAS_SPEC_OFF || r->phase != REQ_RUNNING ||
	    r->forgotten || r->n_tokens != (size_t)r->seq.n_tokens + 1)
		return 0;
	check_shadow(s, t);
	const int kmax = draft_room(s, t, e->context);
	if (kmax <= 0)
		return 0;
	int32_t drafts[ATLAS_SPEC_K_MAX];
	const int n = ngram_propose(&p->ngram, r->tokens, r->n_tokens, kmax, drafts);
	if (n <= 0)
		return 0;
	const int k = e->cfg.spec_gate
		? spec_gate_k(&e->spec.cost, spec_accept_rate(&p->accept), others, n) : n;
	if (k == 0) {
		p->gated = true;
		e->spec.gated++;
		if (!p->n_shadow) {
			memcpy(p->shadow, drafts, (size_t)n * sizeof *drafts);
			p->n_shadow = n;
			p->shadow_at = r->n_tokens;
		}
		return 0;
	}
	memcpy(r->draft, drafts, (size_t)k * sizeof *drafts);
	r->n_draft = k;
	p->drafting = true;
	p->n_shadow = 0;
	return k;
}

/* The gate weighs each session's drafts against the step as planned so
 * far: every running session's row and the drafts granted before it, so
 * that many sessions' verifies together must pay for the step they make. */
void spec_plan(struct atlas_engine *e)
{
	int rows = 0;
	for (int i = 0; i < e->sched.n_slots; i++)
		rows += e->sched.slots[i] != NULL;
	for (struct atlas_session *s = e->sessions; s; s = s->next) {
		s->req.n_draft = 0;
		if (!s->closed)
			rows += plan_session(e, s, ATLAS_MAX(0, rows - 1));
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
		spec_accept_add(&p->accept, accepted, rejected);
		p->draft_tokens += (uint64_t)d;
		p->accepted += (uint64_t)accepted;
		e->spec.drafts++;
		e->spec.draft_tokens += (uint64_t)d;
		e->spec.accepted += (uint64_t)accepted;
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

void spec_measure(struct atlas_engine *e, int rows, double seconds)
{
	spec_cost_add(&e->spec.cost, rows, seconds);
}

void spec_stats(struct atlas_engine *e, struct atlas_spec_stats *o)
{
	const struct spec_engine *sp = &e->spec;
	snprintf(o->method, sizeof o->method, "%s", atlas_spec_name(e->cfg.spec));
	o->drafts_total = sp->drafts;
	o->draft_tokens_total = sp->draft_tokens;
	o->accepted_tokens_total = sp->accepted;
	o->gated_total = sp->gated;
	for (int j = 0; j < ATLAS_SPEC_POSITIONS; j++)
		o->acceptance_by_position[j] =
			sp->tried_at[j] ? (double)sp->accepted_at[j] / (double)sp->tried_at[j] : 0;
	o->mean_accepted_length = sp->drafts ? (double)sp->accepted / (double)sp->drafts : 0;
	o->step_seconds_decode = spec_cost_at(&sp->cost, 1);
	for (int k = 1; k <= ATLAS_SPEC_POSITIONS; k++)
		o->step_seconds_verify[k - 1] =
			k + 1 <= sp->cost.max_rows && sp->cost.seconds[k + 1] > 0
				? sp->cost.seconds[k + 1] : 0;
}

const char *spec_slot_state(const struct atlas_session *s)
{
	return s->spec.drafting ? "on" : s->spec.gated ? "gated" : "off";
}
