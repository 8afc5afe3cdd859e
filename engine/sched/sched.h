/* The scheduler: which rows of which sequences the next step runs, planned
 * as a step command (engine/step/step.h).
 *
 * A request is one sequence the scheduler advances: its tokens, its device
 * state (engine/seq/) and how its logits are used. Sessions own one each;
 * a tools request (atlas_engine_logits) is one too. The scheduler knows
 * requests only, never sessions or turns: what planning did to a request
 * that its owner must hear about (it was admitted, preempted, or cannot
 * run) comes back as events, and the owner applies them.
 *
 * Every running request is one kind of work: feed the tokens that have no
 * KV yet. With one such token it is decoding; with more, prefilling. Each
 * step takes one row from every decoding request and fills the rest of its
 * budget (chunk rows) with prefill chunks, oldest request first; a chunk
 * that reaches the last token asks for logits and samples the next token.
 *
 * Requests enter free slots in FIFO order. When the pool cannot hold the
 * step, idle requests give their device blocks back first (least recently
 * used), then the newest running request is preempted and waits at the head
 * of the queue. Blocks given back move to the swap tier (host, then disk:
 * seq_park) and come back when their request runs again (seq_restore); with
 * no room there they are dropped and the request recomputes them. A running
 * request whose context is more than its device share (device_share, or
 * automatically what the pool can give it) keeps only its newest blocks on
 * the device: its older ones move to the host tier (seq_spill) and stay
 * there while it runs, and each step's attention streams them (the table
 * names them by host slot, seq_resolve). Sampling
 * is keyed by position, so recomputation gives the same tokens (DESIGN
 * §4.1). A request whose blocks are still moving, or that waits for blocks
 * others are moving away, is deferred: it keeps its slot and sits the step
 * out.
 *
 * A decoding request may carry drafts (speculative decoding, DESIGN §9):
 * guesses of the tokens after its last one, which its owner sets before
 * each plan. Its rows are then a verify segment: the last token and the
 * drafts, every row sampled with the parameters plain decoding would use
 * at that position, so row j draws what plain decoding would draw after
 * the drafts before it. Verify rows come out of the step's chunk budget,
 * before prefill chunks; the owner keeps the drafts the draws agree with
 * and the first draw that does not, and sched_settle rolls the rest of
 * the sequence back.
 *
 * A tools request runs alone, in the slot after the sessions' ones, in
 * chunks whose every row returns its logits.
 *
 * Runs on the engine thread with engine.lock held.
 */
#ifndef ATLAS_ENGINE_SCHED_H
#define ATLAS_ENGINE_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "engine/seq/seq.h"
#include "engine/step/step.h"

enum sched_phase { REQ_IDLE, REQ_QUEUED, REQ_RUNNING };

/* How a request's next tokens are drawn. */
struct sched_sampling {
	float temperature;              /* 0 = greedy */
	float top_p;
	int top_k;
	uint64_t seed;
};

struct sched_req {
	int32_t *tokens;                /* [cap] the sequence's tokens; owned */
	size_t n_tokens, cap;
	struct seq seq;                 /* K/V (and state) of tokens[0, seq.n_tokens) */
	enum sched_phase phase;
	int slot;                       /* while running, else -1 */
	uint64_t order;                 /* FIFO order of admission */
	uint64_t last_used_ns;          /* idle requests lose their KV least recent first */
	uint64_t epoch;                 /* bumped by the owner when results of steps planned
					 * before must not reach it */
	bool keep_all;                  /* tools: every row returns logits, nothing is sampled */
	bool forgotten;                 /* the owner dropped the sequence while a step may be
					 * writing it: the engine thread releases it after */
	bool prefetch;                  /* its owner hinted that it runs soon (sched_prefetch) */
	bool prefetched;                /* a hint started bringing its KV back; its admission
					 * counts a hit or a miss */
	int host_prefix;                /* leading blocks that stay on the host tier while it
					 * runs (attention streams them); only grows until it
					 * leaves its slot, so blocks do not go back and forth */
	struct sched_sampling sampling;
	int32_t draft[ATLAS_SPEC_K_MAX];        /* guesses of the tokens after tokens[n_tokens - 1] */
	int n_draft;                    /* drafts for the next plan; the owner sets it */
	struct sched_req *next;         /* sched.reqs */
};

enum sched_event_kind {
	SCHED_ADMITTED,                 /* it got a slot */
	SCHED_PREEMPTED,                /* its KV was dropped; it waits to recompute */
	SCHED_FAILED,                   /* it cannot run: msg says why; it is idle now */
	SCHED_DROPPED,                  /* its KV could not be parked and was dropped: msg */
};

struct sched_event {
	enum sched_event_kind kind;
	struct sched_req *req;
	char msg[200];
};

struct sched {
	struct seq_pool *pool;          /* the executor's; not owned */
	int n_slots;                    /* session slots; slot n_slots is the tools slot */
	int chunk;                      /* rows of one step besides the decode rows */
	int tools_chunk;                /* rows of one tools step (its logits rows) */
	int max_blocks;                 /* block-table entries of one sequence */
	int device_share;               /* device blocks a running request keeps when it has
					 * more (kv_device_blocks_per_seq), 0: automatic */
	struct sched_req *reqs;         /* every registered request */
	struct sched_req **slots;       /* [n_slots + 1] running requests by slot; owned */
	uint64_t next_order;

	/* The plan: cmd.seqs[i] is reqs_of[i]'s, planned at its epoch_of[i]. */
	struct sched_req **reqs_of;     /* [max_seqs] */
	uint64_t *epoch_of;             /* [max_seqs] */
	int *drafts_of;                 /* [max_seqs] draft rows after the last token's row (a
					 * verify segment), 0 for any other */
	int spec_rows;                  /* most draft rows of one step (the executor's out rows
					 * beyond one per slot) */
	struct sched_event *events;     /* [max_events] what the plan did to requests */
	int n_events, max_events;

	struct sched_req **running;     /* [n_slots] planning's scratch: running requests */
	int *want;                      /* [n_slots] planning's scratch: rows each one wants */

	uint64_t steps, preemptions, evictions, deferrals;
	uint64_t parks;                 /* requests whose blocks went to the swap tier */
	uint64_t drops;                 /* requests whose KV was dropped (no room to park) */
	uint64_t prefetch_hits;         /* admissions that found the hinted KV back */
	uint64_t prefetch_misses;       /* admissions whose hinted KV was still elsewhere */
};

int sched_init(struct sched *s, struct seq_pool *pool, int n_slots, int chunk, int tools_chunk,
	       int max_blocks, int max_seqs, int device_share);
void sched_free(struct sched *s);

/* Register an idle request (tokens empty, seq empty) / forget one that is
 * not running. */
void sched_req_init(struct sched_req *r);
void sched_add(struct sched *s, struct sched_req *r);
void sched_remove(struct sched *s, struct sched_req *r);
/* Append n tokens to the request's sequence (its owner's prompt or the
 * token a step drew). */
int sched_req_append(struct sched_req *r, const int32_t *ids, size_t n);
/* Queue r to feed its tokens that have no KV yet. */
void sched_queue(struct sched *s, struct sched_req *r);
/* r stops running or waiting (its turn ended): it keeps its KV. */
void sched_stop(struct sched *s, struct sched_req *r);
/* Drop r's KV now (no step may be writing it). */
void sched_drop(struct sched *s, struct sched_req *r);

/* Start bringing r's KV back to the device if it is elsewhere and the
 * device has room (a hint: the owner expects to run it soon). */
void sched_prefetch(struct sched *s, struct sched_req *r);

/* Plan the next step into cmd (arrays sized by the executor's limits);
 * s->events says what it did to requests. Returns the number of sequences
 * in cmd, 0 when there is nothing to run. */
int sched_plan(struct sched *s, struct step_cmd *cmd);
/* The step ran: its sequences' K/V are written. */
void sched_commit(struct sched *s, const struct step_cmd *cmd);
/* After sched_commit: of the verify segment of cmd.seqs[i], only the first
 * `kept` rows (>= 1) stay, the KV of the rest is forgotten (seq_truncate).
 * A model with linear-attention layers goes back to the state before the
 * segment (its snapshot) and its next step feeds the kept rows again. */
int sched_settle(struct sched *s, const struct step_cmd *cmd, int i, int kept);

#endif
