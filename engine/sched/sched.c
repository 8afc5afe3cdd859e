/* The scheduler: which tokens of which sessions the next step runs.
 *
 * Every running sequence is one kind of work: feed the context tokens that
 * have no KV yet. A sequence with one such token is decoding; with more, it
 * is prefilling. Each step takes one token from every decoding sequence and
 * fills the rest of its budget (chunk_size tokens) with prefill chunks, oldest
 * sequence first; a chunk that reaches the end of its context asks for logits
 * and so samples the sequence's next token.
 *
 * Sessions enter free slots in FIFO order. When the KV pool cannot hold the
 * step, idle sessions' KV is dropped first (least recently used), then the
 * newest running sequence is preempted: its KV is dropped and it waits at the
 * head of the queue to recompute its context. Sampling is keyed by position,
 * so recomputation produces the same tokens (DESIGN §4.1).
 *
 * Runs on the engine thread with engine.lock held.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/clock.h"
#include "engine/internal.h"
#include "engine/sampler/sampler.h"

static int free_slot(struct atlas_engine *e)
{
	for (int i = 0; i < e->max_batch; i++)
		if (!e->slots[i])
			return i;
	return -1;
}

static struct atlas_session *oldest_queued(struct atlas_engine *e)
{
	struct atlas_session *best = NULL;
	for (struct atlas_session *s = e->sessions; s; s = s->next)
		if (!s->closed && s->phase == SEQ_QUEUED &&
		    (!best || s->queued_seq < best->queued_seq))
			best = s;
	return best;
}

static void admit(struct atlas_engine *e)
{
	struct atlas_session *s;
	int slot;
	while ((slot = free_slot(e)) >= 0 && (s = oldest_queued(e))) {
		int need = kv_blocks_for(&e->kv, (int)s->n_ctx);
		if (need > e->kv.n_blocks) {
			char msg[256];
			snprintf(msg, sizeof msg,
				 "the context of %zu tokens needs %d KV blocks; the pool holds %d "
				 "(raise kv_memory)", s->n_ctx, need, e->kv.n_blocks);
			session_end_turn(s, -EIO, "error", msg);
			continue;
		}
		s->phase = SEQ_RUNNING;
		s->slot = slot;
		e->slots[slot] = s;
		s->state = (size_t)s->kv.n_tokens + 1 < s->n_ctx ? ATLAS_STATE_PREFILL
							      : ATLAS_STATE_DECODE;
		s->notify = true;
	}
}

/* Drop the KV of the least recently used idle session. */
static bool evict_idle(struct atlas_engine *e)
{
	struct atlas_session *lru = NULL;
	for (struct atlas_session *s = e->sessions; s; s = s->next)
		if (s->phase == SEQ_IDLE && s->kv.n_blocks &&
		    (!lru || s->last_used_ns < lru->last_used_ns))
			lru = s;
	if (!lru)
		return false;
	log_debug("kv: evicting idle session %s (%d blocks)", lru->name, lru->kv.n_blocks);
	session_drop_kv(lru);
	e->evictions_total++;
	return true;
}

/* Preempt the newest running sequence other than `keep`. */
static bool preempt(struct atlas_engine *e, struct atlas_session *keep)
{
	struct atlas_session *victim = NULL;
	for (int i = 0; i < e->max_batch; i++) {
		struct atlas_session *s = e->slots[i];
		if (s && s != keep && (!victim || s->queued_seq > victim->queued_seq))
			victim = s;
	}
	if (!victim)
		return false;
	log_debug("kv: preempting session %s (%d blocks)", victim->name, victim->kv.n_blocks);
	session_drop_kv(victim);
	e->slots[victim->slot] = NULL;
	victim->slot = -1;
	victim->phase = SEQ_QUEUED;
	victim->state = ATLAS_STATE_PARKED;
	victim->notify = true;
	e->preemptions_total++;
	return true;
}

/* Give s the blocks for positions [0, upto); false if s itself had to go. */
static bool reserve(struct atlas_engine *e, struct atlas_session *s, int upto)
{
	while (kv_seq_reserve(&e->kv, &s->kv, upto) != 0) {
		if (evict_idle(e) || preempt(e, s))
			continue;
		char msg[256];
		snprintf(msg, sizeof msg, "KV pool exhausted: %d tokens need %d blocks of %d",
			 upto, kv_blocks_for(&e->kv, upto), e->kv.n_blocks);
		session_end_turn(s, -EIO, "error", msg);
		return false;
	}
	return true;
}

static void add_seq(struct atlas_engine *e, struct atlas_session *s, int n)
{
	struct step *st = &e->step;
	int start = s->kv.n_tokens;
	struct step_seq *q = &st->seqs[st->n_seqs++];
	*q = (struct step_seq){ .s = s, .slot = s->slot, .start = start, .n = n,
				.logits = (size_t)(start + n) == s->n_ctx, .epoch = s->epoch };
	for (int i = 0; i < n; i++) {
		st->ids[st->n_tokens] = s->ctx[start + i];
		st->pos[st->n_tokens] = start + i;
		st->seqslot[st->n_tokens] = s->slot;
		st->n_tokens++;
	}
	if (q->logits) {
		const struct atlas_params *p = &s->params;
		st->out_rows[st->n_out] = st->n_tokens - 1;
		st->sample[st->n_out] = (struct kt_sample_row){
			.temperature = p->temperature, .top_p = p->top_p, .top_k = p->top_k,
			.u = sampler_uniform(p->seed, s->n_ctx) };
		st->n_out++;
	}
	s->state = n > 1 || !q->logits ? ATLAS_STATE_PREFILL : ATLAS_STATE_DECODE;
}

/* Running sessions in admission order. */
static int running(struct atlas_engine *e, struct atlas_session **out)
{
	int n = 0;
	for (int i = 0; i < e->max_batch; i++)
		if (e->slots[i])
			out[n++] = e->slots[i];
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0 && out[j]->queued_seq < out[j - 1]->queued_seq; j--) {
			struct atlas_session *t = out[j];
			out[j] = out[j - 1];
			out[j - 1] = t;
		}
	return n;
}

int sched_plan(struct atlas_engine *e)
{
	struct step *st = &e->step;
	struct atlas_session *run[ATLAS_MAX_SLOTS];
	st->n_seqs = st->n_tokens = st->n_out = 0;
	admit(e);
	int n = running(e, run);
	if (!n)
		return 0;

	/* Reserve first, then lay out: a preemption during reservation removes a
	 * sequence from this step. Decoding sequences first, then prefill chunks. */
	int want[ATLAS_MAX_SLOTS] = { 0 };
	int budget = e->cfg.chunk_size;
	for (int pass = 0; pass < 2; pass++)
		for (int i = 0; i < n; i++) {
			struct atlas_session *s = run[i];
			int pending = (int)s->n_ctx - s->kv.n_tokens;
			if ((pending == 1) != (pass == 0))
				continue;
			want[i] = pass == 0 ? 1 : ATLAS_MIN(pending, budget);
			if (pass == 1)
				budget -= want[i];
		}
	for (int i = 0; i < n; i++) {
		struct atlas_session *s = run[i];
		if (s->phase != SEQ_RUNNING || want[i] <= 0)
			continue;
		reserve(e, s, s->kv.n_tokens + want[i]);
	}
	for (int pass = 0; pass < 2; pass++)
		for (int i = 0; i < n; i++) {
			struct atlas_session *s = run[i];
			if (s->phase != SEQ_RUNNING || want[i] <= 0)
				continue;
			if ((want[i] == 1 && (int)s->n_ctx - s->kv.n_tokens == 1) == (pass == 0))
				add_seq(e, s, want[i]);
		}
	for (int i = 0; i < st->n_seqs; i++)
		st->seqs[i].s->notify = true;
	return st->n_seqs;
}

void sched_finish(struct atlas_engine *e)
{
	struct step *st = &e->step;
	int out = 0;
	for (int i = 0; i < st->n_seqs; i++) {
		struct step_seq *q = &st->seqs[i];
		struct atlas_session *s = q->s;
		int row = q->logits ? out++ : -1;
		if (s->closed || s->reset_pending)
			continue;
		if (s->kv.n_tokens < q->start + q->n)
			s->kv.n_tokens = q->start + q->n;
		s->last_used_ns = atlas_now_ns();
		if (row >= 0 && q->epoch == s->epoch)
			session_accept_token(s, st->sampled[row]);
	}
	e->steps_total++;
	e->step_tokens_total += (uint64_t)st->n_tokens;
}
