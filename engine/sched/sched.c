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

int sched_init(struct sched *s, struct seq_pool *pool, int n_slots, int chunk, int tools_chunk,
	       int max_blocks, int max_seqs)
{
	memset(s, 0, sizeof *s);
	s->pool = pool;
	s->n_slots = n_slots;
	s->chunk = chunk;
	s->tools_chunk = tools_chunk;
	s->max_blocks = max_blocks;
	/* Per plan: an admission or a failure per slot, then a preemption or a
	 * failure per running request. */
	s->max_events = 3 * (n_slots + 1);
	s->slots = calloc((size_t)n_slots + 1, sizeof *s->slots);
	s->reqs_of = calloc((size_t)max_seqs, sizeof *s->reqs_of);
	s->epoch_of = calloc((size_t)max_seqs, sizeof *s->epoch_of);
	s->events = calloc((size_t)s->max_events, sizeof *s->events);
	s->running = calloc((size_t)n_slots, sizeof *s->running);
	s->want = calloc((size_t)n_slots, sizeof *s->want);
	if (!s->slots || !s->reqs_of || !s->epoch_of || !s->events || !s->running || !s->want) {
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

__attribute__((format(printf, 4, 5)))
static void event(struct sched *s, enum sched_event_kind kind, struct sched_req *r,
		  const char *fmt, ...)
{
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
	r->slot = slot;
	s->slots[slot] = r;
}

/* A request whose whole context cannot fit the pool fails at once. */
static bool fits_pool(struct sched *s, struct sched_req *r)
{
	const struct kv_pool *kv = &s->pool->kv;
	int need = kv->n_layers ? kv_blocks_for(kv, (int)r->n_tokens) : 0;
	if (need <= kv->n_blocks)
		return true;
	sched_stop(s, r);
	event(s, SCHED_FAILED, r,
	      "the context of %zu tokens needs %d KV blocks; the pool holds %d (raise kv_memory)",
	      r->n_tokens, need, kv->n_blocks);
	return false;
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
		event(s, SCHED_ADMITTED, r, NULL);
	}
}

static bool holds_device_memory(const struct sched_req *r)
{
	return r->seq.n_blocks || r->seq.state_slot >= 0;
}

/* Drop the KV of the least recently used idle request. */
static bool evict_idle(struct sched *s)
{
	struct sched_req *lru = NULL;
	for (struct sched_req *r = s->reqs; r; r = r->next)
		if (r->phase != REQ_RUNNING && !r->forgotten && holds_device_memory(r) &&
		    (!lru || r->last_used_ns < lru->last_used_ns))
			lru = r;
	if (!lru)
		return false;
	log_debug("kv: dropping the KV of an idle sequence (%d blocks)", lru->seq.n_blocks);
	seq_release(s->pool, &lru->seq);
	s->evictions++;
	return true;
}

/* Preempt the newest running session request other than keep. */
static bool preempt(struct sched *s, struct sched_req *keep)
{
	struct sched_req *victim = NULL;
	for (int i = 0; i < s->n_slots; i++) {
		struct sched_req *r = s->slots[i];
		if (r && r != keep && (!victim || r->order > victim->order))
			victim = r;
	}
	if (!victim)
		return false;
	log_debug("kv: preempting a running sequence (%d blocks)", victim->seq.n_blocks);
	seq_release(s->pool, &victim->seq);
	s->slots[victim->slot] = NULL;
	victim->slot = -1;
	victim->phase = REQ_QUEUED;
	s->preemptions++;
	event(s, SCHED_PREEMPTED, victim, NULL);
	return true;
}

/* Give r room for positions [0, upto); false if r itself had to go. */
static bool reserve(struct sched *s, struct sched_req *r, int upto)
{
	int rc;
	while ((rc = seq_reserve(s->pool, &r->seq, upto)) == -ENOSPC)
		if (!evict_idle(s) && !preempt(s, r))
			break;
	if (!rc)
		return true;
	sched_stop(s, r);
	if (rc == -ENOSPC)
		event(s, SCHED_FAILED, r, "KV pool exhausted: %d tokens need %d blocks of %d", upto,
		      kv_blocks_for(&s->pool->kv, upto), s->pool->kv.n_blocks);
	else
		event(s, SCHED_FAILED, r, "KV: cannot reserve %d tokens (%s)", upto, strerror(-rc));
	return false;
}

/* Lay n rows of r out in cmd, from its first position without KV. A
 * request with a block off the device sits the step out (-EAGAIN). */
static int add_seq(struct sched *s, struct step_cmd *cmd, struct sched_req *r, int n)
{
	const int start = r->seq.n_tokens, end = start + n;
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
	memcpy(cmd->ids + cmd->n_rows, r->tokens + start, (size_t)n * sizeof *cmd->ids);
	cmd->n_table += blocks;
	for (int k = 0; k < n; k++) {
		const int row = cmd->n_rows + k;
		if (r->keep_all)
			cmd->out[cmd->n_out++] = (struct step_out){ .row = row, .keep = 1,
								    .params = { .top_p = 1 } };
		else if (k == n - 1 && (size_t)end == r->n_tokens)
			cmd->out[cmd->n_out++] = (struct step_out){
				.row = row, .sample = 1,
				.params = { .temperature = r->sampling.temperature,
					    .top_p = r->sampling.top_p,
					    .top_k = r->sampling.top_k,
					    .u = rng_uniform(r->sampling.seed, r->n_tokens) } };
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
	if (n <= 0 || !reserve(s, r, r->seq.n_tokens + n))
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

/* The session requests' step: every decode row, then prefill chunks. */
static void plan_sessions(struct sched *s, struct step_cmd *cmd)
{
	struct sched_req **list = s->running;
	int *want = s->want;
	admit(s);
	const int n = running(s, list);

	/* Reserve first, then lay out: a preemption during reservation takes a
	 * request out of this step. */
	int budget = s->chunk;
	for (int pass = 0; pass < 2; pass++)
		for (int i = 0; i < n; i++) {
			const int p = pending(list[i]);
			if ((p == 1) != (pass == 0))
				continue;
			want[i] = pass == 0 ? 1 : ATLAS_MIN(p, budget);
			if (pass == 1)
				budget -= want[i];
		}
	for (int i = 0; i < n; i++)
		if (list[i]->phase == REQ_RUNNING && want[i] > 0)
			reserve(s, list[i], list[i]->seq.n_tokens + want[i]);
	for (int pass = 0; pass < 2; pass++)
		for (int i = 0; i < n; i++) {
			struct sched_req *r = list[i];
			if (r->phase != REQ_RUNNING || want[i] <= 0)
				continue;
			if ((want[i] == 1 && pending(r) == 1) == (pass == 0))
				add_seq(s, cmd, r, want[i]);
		}
}

int sched_plan(struct sched *s, struct step_cmd *cmd)
{
	struct sched_req *tools = s->slots[s->n_slots];
	cmd->n_seqs = cmd->n_rows = cmd->n_out = cmd->n_table = 0;
	s->n_events = 0;
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
