/* The scheduler (sched.h): admission, reservation with eviction and
 * preemption, and the layout of a step command. */
#include "engine/sched/sched.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "engine/sched/rng.h"

/* Events a plan keeps beyond those of admission and reservation. */
#define SCHED_SPARE_EVENTS 64

int sched_init(struct sched *s, struct seq_pool *pool, int n_slots, int chunk, int tools_chunk,
	       int max_blocks, int max_seqs, int device_share)
{
	memset(s, 0, sizeof *s);
	s->pool = pool;
	s->n_slots = n_slots;
	s->chunk = chunk;
	s->tools_chunk = tools_chunk;
	s->max_blocks = max_blocks;
	s->device_share = device_share;
	/* Per plan: an admission or a failure per slot, then a preemption or a
	 * failure per running request; the rest for lost and dropped KV, which
	 * wait for the next plan when there is no room. */
	s->max_events = 4 * (n_slots + 1) + SCHED_SPARE_EVENTS;
	s->slots = calloc((size_t)n_slots + 1, sizeof *s->slots);
	s->reqs_of = calloc((size_t)max_seqs, sizeof *s->reqs_of);
	s->epoch_of = calloc((size_t)max_seqs, sizeof *s->epoch_of);
	s->drafts_of = calloc((size_t)max_seqs, sizeof *s->drafts_of);
	s->events = calloc((size_t)s->max_events, sizeof *s->events);
	s->running = calloc((size_t)n_slots, sizeof *s->running);
	s->want = calloc((size_t)n_slots, sizeof *s->want);
	if (!s->slots || !s->reqs_of || !s->epoch_of || !s->drafts_of || !s->events ||
	    !s->running || !s->want) {
		sched_free(s);
		return -ENOMEM;
	}
	return 0;
}

void sched_free(struct sched *s)
{
	free(s->slots);
	free(s->reqs_of);
	free(s->epoch_of);
	free(s->drafts_of);
	free(s->events);
	free(s->running);
	free(s->want);
	memset(s, 0, sizeof *s);
}

void sched_req_init(struct sched_req *r)
{
	memset(r, 0, sizeof *r);
	seq_init(&r->seq);
	r->slot = -1;
	r->sampling.top_p = 1;
}

void sched_add(struct sched *s, struct sched_req *r)
{
	r->next = s->reqs;
	s->reqs = r;
	r->last_used_ns = atlas_now_ns();
}

void sched_remove(struct sched *s, struct sched_req *r)
{
	sched_stop(s, r);
	for (struct sched_req **pp = &s->reqs; *pp; pp = &(*pp)->next)
		if (*pp == r) {
			*pp = r->next;
			break;
		}
}

int sched_req_append(struct sched_req *r, const int32_t *ids, size_t n)
{
	/* Nothing to add (a kept session with an empty context): no memcpy on
	 * a request that has no buffer yet. */
	if (n == 0)
		return 0;
	if (r->n_tokens + n > r->cap) {
		size_t cap = r->cap ? r->cap : 256;
		while (cap < r->n_tokens + n)
			cap *= 2;
		int32_t *t = realloc(r->tokens, cap * sizeof *t);
		if (!t)
			return -ENOMEM;
		r->tokens = t;
		r->cap = cap;
	}
	memcpy(r->tokens + r->n_tokens, ids, n * sizeof *ids);
	r->n_tokens += n;
	return 0;
}

void sched_queue(struct sched *s, struct sched_req *r)
{
	r->phase = REQ_QUEUED;
	r->order = s->next_order++;
}

void sched_stop(struct sched *s, struct sched_req *r)
{
	if (r->phase == REQ_RUNNING && r->slot >= 0)
		s->slots[r->slot] = NULL;
	r->slot = -1;
	r->phase = REQ_IDLE;
	r->last_used_ns = atlas_now_ns();
}

void sched_drop(struct sched *s, struct sched_req *r)
{
	seq_release(s->pool, &r->seq);
}

/* Tell r's owner what planning did; false when the plan's events are full
 * (only the informational DROPPED can meet that; see sched_init). */
__attribute__((format(printf, 4, 5)))
static bool event(struct sched *s, enum sched_event_kind kind, struct sched_req *r,
		  const char *fmt, ...)
{
	if (s->n_events == s->max_events)
		return false;
	struct sched_event *ev = &s->events[s->n_events++];
	ev->kind = kind;
	ev->req = r;
	ev->msg[0] = 0;
	if (fmt) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(ev->msg, sizeof ev->msg, fmt, ap);
		va_end(ap);
	}
	return true;
}

static struct sched_req *oldest_queued(struct sched *s, bool keep_all)
{
	struct sched_req *best = NULL;
	for (struct sched_req *r = s->reqs; r; r = r->next)
		if (r->phase == REQ_QUEUED && r->keep_all == keep_all && !r->forgotten &&
		    (!best || r->order < best->order))
			best = r;
	return best;
}

static int free_slot(const struct sched *s)
{
	for (int i = 0; i < s->n_slots; i++)
		if (!s->slots[i])
			return i;
	return -1;
}

static void run_in(struct sched *s, struct sched_req *r, int slot)
{
	r->phase = REQ_RUNNING;
	r->host_prefix = 0;
	r->slot = slot;
	s->slots[slot] = r;
}

/* A request whose whole context cannot fit the pool and the host tier
 * together fails at once. */
static bool fits_pool(struct sched *s, struct sched_req *r)
{
	const struct kv_pool *kv = &s->pool->kv;
	int need = kv->n_layers ? kv_blocks_for(kv, (int)r->n_tokens) : 0;
	if (need <= kv->n_blocks + s->pool->host.n_blocks)
		return true;
	sched_stop(s, r);
	event(s, SCHED_FAILED, r,
	      "the context of %zu tokens needs %d KV blocks; the pool holds %d and the host tier "
	      "%d (raise kv_memory or kv_host_memory)",
	      r->n_tokens, need, kv->n_blocks, s->pool->host.n_blocks);
	return false;
}

static int device_blocks(const struct sched_req *r);

/* Leading blocks of r that stay off the device in a step reaching position
 * upto: none without a host tier; all but device_share of them; or,
 * automatically, all but what the device can give r (its own blocks, the
 * free ones and idle requests' ones). Never one that holds a position the
 * step writes. */
static int host_prefix(const struct sched *s, const struct sched_req *r, int upto)
{
	const struct seq_pool *p = s->pool;
	if (!p->host.n_blocks || !p->kv.n_layers)
		return 0;
	const int nb = kv_blocks_for(&p->kv, upto), written = r->seq.n_tokens / p->kv.block_size;
	int keep = s->device_share;
	if (keep <= 0) {
		uint32_t held[KV_TIERS];  /* its device blocks count, moving away or not */
		seq_count(&r->seq, held);
		keep = p->kv.n_free + (int)held[KV_TIER_DEVICE];
		for (const struct sched_req *o = s->reqs; o; o = o->next)
			if (o->phase != REQ_RUNNING && !o->forgotten)
				keep += device_blocks(o) - (o->seq.state_slot >= 0);
	}
	return ATLAS_MAX(0, ATLAS_MIN(nb - keep, written));
}

void sched_prefetch(struct sched *s, struct sched_req *r)
{
	if (r->forgotten || r->phase == REQ_RUNNING ||
	    seq_resident(s->pool, &r->seq, r->seq.n_tokens))
		return;
	if (seq_restore(s->pool, &r->seq, r->seq.n_tokens,
			host_prefix(s, r, (int)r->seq.n_tokens)) >= 0)
		r->prefetched = true;
}

/* Whether a hinted request's KV came back in time. */
static void count_prefetch(struct sched *s, struct sched_req *r)
{
	if (!r->prefetched)
		return;
	r->prefetched = false;
	if (!seq_resident(s->pool, &r->seq, r->seq.n_tokens))
		s->prefetch_misses++;
	else
		s->prefetch_hits++;
}

/* Queued requests into free slots, oldest first; the events of the
 * reservations that follow keep their room. */
static void admit(struct sched *s)
{
	struct sched_req *r;
	int slot;
	while (s->n_events < s->max_events - 2 * (s->n_slots + 1) &&
	       (slot = free_slot(s)) >= 0 && (r = oldest_queued(s, false))) {
		if (!fits_pool(s, r))
			continue;
		run_in(s, r, slot);
		count_prefetch(s, r);
		event(s, SCHED_ADMITTED, r, NULL);
	}
}

/* Device blocks r holds that no move is taking away already. */
static int device_blocks(const struct sched_req *r)
{
	int n = 0;
	for (int i = 0; i < r->seq.n_blocks; i++)
		n += r->seq.blocks[i].tier == KV_TIER_DEVICE && !r->seq.blocks[i].moving;
	return n + (r->seq.state_slot >= 0);
}

/* Free r's device blocks: park them in the swap tier, or drop the KV when
 * they cannot go there (its next turn recomputes it). */
static void give_back(struct sched *s, struct sched_req *r)
{
	const int failed = r->seq.move_error;
	if (!failed && seq_park(s->pool, &r->seq) > 0) {
		s->parks++;
		return;
	}
	seq_release(s->pool, &r->seq);
	s->drops++;
	r->seq.move_error = 0;
	if (failed)
		event(s, SCHED_DROPPED, r,
		      "KV: the swap tier could not take its blocks (%s); they were dropped and "
		      "its next turn recomputes them", strerror(-failed));
}

/* Free the device blocks of the least recently used idle request. */
static bool evict_idle(struct sched *s)
{
	struct sched_req *lru = NULL;
	for (struct sched_req *r = s->reqs; r; r = r->next)
		if (r->phase != REQ_RUNNING && !r->forgotten && device_blocks(r) &&
		    (!lru || r->last_used_ns < lru->last_used_ns))
			lru = r;
	if (!lru)
		return false;
	log_debug("kv: an idle sequence gives back %d device blocks", device_blocks(lru));
	give_back(s, lru);
	s->evictions++;
	return true;
}

/* Preempt the newest running session request other than keep that holds
 * device blocks: it leaves its slot, its blocks go to the swap tier (or are
 * dropped), and it waits at the head of the queue. */
static bool preempt(struct sched *s, struct sched_req *keep)
{
	struct sched_req *victim = NULL;
	for (int i = 0; i < s->n_slots; i++) {
		struct sched_req *r = s->slots[i];
		if (r && r != keep && device_blocks(r) && (!victim || r->order > victim->order))
			victim = r;
	}
	if (!victim)
		return false;
	log_debug("kv: preempting a running sequence (%d blocks)", victim->seq.n_blocks);
	give_back(s, victim);
	s->slots[victim->slot] = NULL;
	victim->slot = -1;
	victim->phase = REQ_QUEUED;
	s->preemptions++;
	event(s, SCHED_PREEMPTED, victim, NULL);
	return true;
}

enum room { ROOM_OK, ROOM_WAIT, ROOM_FAILED };

/* Start writing the host blocks of the least recently used idle request
 * to disk, to make room on the host tier; whether any started. A request
 * whose last write failed is not tried again: the disk is full or failing,
 * and moves that keep failing would keep the planner waiting on them. */
static bool demote_idle(struct sched *s)
{
	struct sched_req *lru = NULL;
	for (struct sched_req *r = s->reqs; r; r = r->next) {
		if (r->phase == REQ_RUNNING || r->forgotten || r->seq.move_error)
			continue;
		uint32_t counts[KV_TIERS];
		seq_count(&r->seq, counts);
		if (counts[KV_TIER_HOST] && (!lru || r->last_used_ns < lru->last_used_ns))
			lru = r;
	}
	return lru && seq_demote(s->pool, &lru->seq) > 0;
}

/* Blocks of r's first n that wait for a host slot: still on the device or
 * on disk, with no move under way. */
static int off_host(const struct seq *q, int n)
{
	int off = 0;
	for (int b = 0; b < n && b < q->n_blocks; b++)
		off += !q->blocks[b].moving && q->blocks[b].tier != KV_TIER_HOST;
	return off;
}

/* r's blocks back where the step reads them (its host prefix on the host
 * tier, the rest on the device), and room for positions [0, upto): 0, the
 * blocks still on their way (> 0), or a negative errno. The blocks past its
 * written positions come back too: the step writes them. */
static int try_room(struct sched *s, struct sched_req *r, int upto)
{
	/* Never a block the step writes, even after a truncate went back. */
	const int written = s->pool->kv.n_layers ? r->seq.n_tokens / s->pool->kv.block_size : 0;
	const int hb = ATLAS_MIN(ATLAS_MAX(r->host_prefix, host_prefix(s, r, upto)), written);
	if (hb > 0) {
		seq_spill(s->pool, &r->seq, hb);
		if (!s->pool->host.n_free && off_host(&r->seq, hb))
			demote_idle(s);
	}
	r->host_prefix = hb;
	int rc = seq_restore(s->pool, &r->seq, upto, hb);
	return rc ? rc : seq_reserve(s->pool, &r->seq, upto);
}

/* Give r what try_room asks for, freeing device blocks of others as it must:
 * idle requests' first, then the newest running request's. A request whose
 * blocks are still moving, or that would need blocks moves still hold,
 * sits this step out. */
static enum room reserve(struct sched *s, struct sched_req *r, int upto)
{
	int rc;
	for (;;) {
		rc = try_room(s, r, upto);
		if (rc > 0) {
			s->deferrals++;
			return ROOM_WAIT;
		}
		if (rc != -ENOSPC)
			break;
		if (seq_pool_poll(s->pool) > 0)
			continue;
		/* Moves in flight end by themselves: blocks on their way out free
		 * device memory, blocks on their way in become evictable. */
		if (s->pool->n_active > 0) {
			s->deferrals++;
			return ROOM_WAIT;
		}
		if (!evict_idle(s) && !preempt(s, r))
			break;
	}
	if (!rc)
		return ROOM_OK;
	sched_stop(s, r);
	if (rc == -ENOSPC)
		event(s, SCHED_FAILED, r, "KV pool exhausted: %d tokens need %d blocks of %d", upto,
		      kv_blocks_for(&s->pool->kv, upto), s->pool->kv.n_blocks);
	else
		event(s, SCHED_FAILED, r, "KV: cannot reserve %d tokens (%s)", upto, strerror(-rc));
	return ROOM_FAILED;
}

/* Requests whose KV could not be read back from the swap tier: they fail
 * and start over from their tokens. */
static void collect_lost(struct sched *s)
{
	for (struct sched_req *r = s->reqs; r && s->n_events < s->max_events; r = r->next) {
		if (!r->seq.lost || r->forgotten)
			continue;
		const int rc = r->seq.lost;
		if (rc == -EBADMSG) {
			/* The data are not what was written (a kept block file changed
			 * since): the tokens are, so it computes them again. */
			seq_release(s->pool, &r->seq);
			event(s, SCHED_DROPPED, r,
			      "KV: a block read back from disk does not match its checksum; the "
			      "context is recomputed");
			continue;
		}
		sched_stop(s, r);
		seq_release(s->pool, &r->seq);
		event(s, SCHED_FAILED, r, "KV: reading its blocks back from the swap tier failed (%s)",
		      strerror(-rc));
	}
}

/* Lay n rows of r out in cmd, from its first position without KV: its
 * tokens, then its drafts. A request with a block off the device sits the
 * step out (-EAGAIN). */
static int add_seq(struct sched *s, struct step_cmd *cmd, struct sched_req *r, int n)
{
	const int start = r->seq.n_tokens, last = (int)r->n_tokens - 1;
	/* Drafts through linear-attention layers: their recurrent state is
	 * remembered first, for sched_settle to go back to; without room for
	 * the copy, the step carries no drafts. */
	if (start + n - 1 > last && s->pool->state.n_layers && seq_snapshot(s->pool, &r->seq))
		n = ATLAS_MAX(1, last + 1 - start);
	const int end = start + n;
	int blocks = seq_resolve(s->pool, &r->seq, end, cmd->tables + cmd->n_table, s->max_blocks);
	if (blocks == -EAGAIN) {
		s->deferrals++;
		return blocks;
	}
	if (blocks < 0)
		return blocks;
	const int i = cmd->n_seqs++;
	cmd->seqs[i] = (struct step_seq){ .slot = r->slot, .row = cmd->n_rows, .n_rows = n,
					  .pos0 = start, .table = cmd->n_table,
					  .n_blocks = blocks, .state_slot = r->seq.state_slot };
	s->reqs_of[i] = r;
	s->epoch_of[i] = r->epoch;
	s->drafts_of[i] = ATLAS_MAX(0, end - 1 - last);
	cmd->n_table += blocks;
	for (int k = 0; k < n; k++) {
		const int row = cmd->n_rows + k, pos = start + k;
		cmd->ids[row] = pos <= last ? r->tokens[pos] : r->draft[pos - last - 1];
		if (r->keep_all)
			cmd->out[cmd->n_out++] = (struct step_out){ .row = row, .keep = 1,
								    .params = { .top_p = 1 } };
		else if (pos >= last)
			/* The draw of position pos + 1, as plain decoding makes it. */
			cmd->out[cmd->n_out++] = (struct step_out){
				.row = row, .sample = 1,
				.params = { .temperature = r->sampling.temperature,
					    .top_p = r->sampling.top_p,
					    .top_k = r->sampling.top_k,
					    .u = rng_uniform(r->sampling.seed, (size_t)pos + 1) } };
	}
	cmd->n_rows += n;
	return 0;
}

/* A tools request: alone in the step, in the tools slot, a chunk at a time. */
static int plan_tools(struct sched *s, struct step_cmd *cmd, struct sched_req *r)
{
	if (r->phase != REQ_RUNNING) {
		if (!fits_pool(s, r))
			return 0;
		run_in(s, r, s->n_slots);
	}
	const int n = (int)ATLAS_MIN((size_t)s->tools_chunk, r->n_tokens - (size_t)r->seq.n_tokens);
	if (n <= 0 || reserve(s, r, r->seq.n_tokens + n) != ROOM_OK)
		return 0;
	add_seq(s, cmd, r, n);
	return cmd->n_seqs;
}

/* Running session requests in admission order. */
static int running(struct sched *s, struct sched_req **out)
{
	int n = 0;
	for (int i = 0; i < s->n_slots; i++)
		if (s->slots[i])
			out[n++] = s->slots[i];
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0 && out[j]->order < out[j - 1]->order; j--) {
			struct sched_req *t = out[j];
			out[j] = out[j - 1];
			out[j - 1] = t;
		}
	return n;
}

static int pending(const struct sched_req *r)
{
	return (int)(r->n_tokens - (size_t)r->seq.n_tokens);
}

/* The session requests' step: every decode row, then verify segments, then
 * prefill chunks out of the chunk budget (verify rows first, up to
 * spec_rows). */
static void plan_sessions(struct sched *s, struct step_cmd *cmd)
{
	struct sched_req **list = s->running;
	int *want = s->want;
	admit(s);
	const int n = running(s, list);

	/* Reserve first, then lay out: a preemption during reservation takes a
	 * request out of this step. */
	int budget = s->chunk, spec = ATLAS_MIN(s->chunk, s->spec_rows);
	for (int i = 0; i < n; i++) {
		want[i] = 0;
		if (pending(list[i]) != 1)
			continue;
		const int d = ATLAS_MIN(list[i]->n_draft, spec);
		want[i] = 1 + d;
		spec -= d;
		budget -= d;
	}
	for (int i = 0; i < n; i++) {
		const int p = pending(list[i]);
		if (p > 1) {
			want[i] = ATLAS_MIN(p, budget);
			budget -= want[i];
		}
	}
	for (int i = 0; i < n; i++)
		if (list[i]->phase == REQ_RUNNING && want[i] > 0 &&
		    reserve(s, list[i], list[i]->seq.n_tokens + want[i]) != ROOM_OK)
			want[i] = 0;
	/* Decode rows, then verify segments, then prefill chunks: the executor
	 * runs the short segments at the front like decode rows (exec.c). */
	for (int pass = 0; pass < 3; pass++)
		for (int i = 0; i < n; i++) {
			struct sched_req *r = list[i];
			if (r->phase != REQ_RUNNING || want[i] <= 0)
				continue;
			const int kind = pending(r) != 1 ? 2 : want[i] > 1;
			if (kind == pass)
				add_seq(s, cmd, r, want[i]);
		}
}

int sched_plan(struct sched *s, struct step_cmd *cmd)
{
	struct sched_req *tools = s->slots[s->n_slots];
	cmd->n_seqs = cmd->n_rows = cmd->n_out = cmd->n_table = 0;
	s->n_events = 0;
	seq_pool_poll(s->pool);
	collect_lost(s);
	if (!tools)
		tools = oldest_queued(s, true);
	if (tools)
		plan_tools(s, cmd, tools);
	else
		plan_sessions(s, cmd);
	if (cmd->n_seqs)
		cmd->number = ++s->steps;
	return cmd->n_seqs;
}

void sched_commit(struct sched *s, const struct step_cmd *cmd)
{
	const uint64_t now = atlas_now_ns();
	for (int i = 0; i < cmd->n_seqs; i++) {
		struct sched_req *r = s->reqs_of[i];
		const int end = cmd->seqs[i].pos0 + cmd->seqs[i].n_rows;
		if (r->forgotten)
			continue;
		if (r->seq.n_tokens < end)
			seq_commit(&r->seq, end);
		r->last_used_ns = now;
	}
}

int sched_settle(struct sched *s, const struct step_cmd *cmd, int i, int kept)
{
	struct sched_req *r = s->reqs_of[i];
	const struct step_seq *q = &cmd->seqs[i];
	if (r->forgotten)
		return 0;
	if (!s->pool->state.n_layers)
		return kept >= q->n_rows ? 0
					 : seq_truncate(s->pool, &r->seq, q->pos0 + ATLAS_MAX(kept, 1));
	/* A recurrent state went through every row: back to the snapshot
	 * add_seq took before them, and the kept rows are fed again. The
	 * snapshot's slot goes back either way (an idle session holds one
	 * state slot, not two). */
	int rc = kept >= q->n_rows ? 0 : seq_truncate(s->pool, &r->seq, q->pos0);
	seq_forget_snapshot(s->pool, &r->seq);
	return rc;
}
