/* Private structures of the engine: sessions, turns, tools requests and the
 * engine itself, shared by the engine's top-level sources.
 *
 * Layers inside the engine, top to bottom: sessions and turns (this folder)
 * own a scheduler request each; the scheduler (sched/) plans step commands
 * over requests; the executor (step/) runs them on the model (model/) and
 * the sequence pool (seq/, kv/).
 *
 * Locking: one mutex (engine.lock) guards every field below that the FUSE
 * threads can see: sessions, turns, their output, params, states and stats,
 * and the scheduler with its requests and pool allocator. The engine thread
 * takes it to plan a step and to apply its result, and drops it while the
 * executor runs the command, which reads nothing else.
 */
#ifndef ATLAS_ENGINE_INTERNAL_H
#define ATLAS_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/sched/sched.h"
#include "engine/spec/drafter.h"
#include "engine/spec/gate.h"
#include "engine/ep/ep.h"
#include "engine/step/exec.h"
#include "engine/step/step.h"
#include "engine/tokenizer/tokenizer.h"

struct intake_job;

struct turn {
	uint64_t number;
	enum atlas_mode mode;       /* the session's mode when it was submitted */
	char *prompt;               /* text as submitted (ids mode: the id list); owned */
	size_t prompt_len;
	size_t ctx_start;           /* where its prompt tokens start in the session context */
	size_t n_prompt;            /* prompt tokens it added (template included) */
	size_t n_generated;         /* tokens it generated (also in the context after the prompt) */
	char *out;                  /* released output bytes; owned */
	size_t out_len, out_cap;
	bool done;
	int error;                  /* 0, -EIO or -ECANCELED once done */
	char finish[16];            /* "stop", "length", "eos", "error", "cancelled" */
	uint64_t t_submit_ns, t_first_ns, t_last_ns;
	bool stepped;               /* a step has run it: its queue time is recorded */
	struct intake_job *intake;  /* the intake thread's job for its prompt text (which it
				     * reads without the lock), NULL once tokenized */
};

/* A session's speculative decoding (engine/speculate.c). */
struct spec_session {
	void *state[SPEC_DRAFTERS];     /* each open drafter's state of the session (NULL: the
					 * drafter is absent, or had no memory); owned */
	struct spec_accept accept[SPEC_DRAFTERS];       /* the gate's estimate, by drafter */
	int32_t shadow[ATLAS_SPEC_K_MAX];       /* prompt lookup's drafts the gate held back:
						 * guesses of tokens[shadow_at, shadow_at + n_shadow) */
	int n_shadow;
	size_t shadow_at;
	int held;                       /* plans since the gate last let the draft model draft */
	int drafter;                    /* the drafter of the last plan's drafts, -1: none */
	bool gated;                     /* the last plan held drafts back */
	uint64_t draft_tokens, accepted;        /* verified and accepted draft tokens */
	/* Queued for a drafter that runs a model (spec_plan): the request, and
	 * the context it was made for. */
	struct draft_req req;
	uint64_t req_epoch;
	size_t req_tokens;
};

struct atlas_session {
	struct atlas_engine *e;
	char name[64];
	bool closed;                /* atlas_session_close called; the engine thread frees it */
	bool kept;                  /* brought back by kv_persist at open (engine/persist.c) */
	bool held;                  /* atlas_session_open gave a handle to it (a kept session
				     * has none until its name is opened) */
	int intake_jobs;            /* intake jobs that point to it: it is not freed before
				     * they end */
	struct atlas_params params;
	struct atlas_session *next; /* engine.sessions list */

	/* The context (every token of every turn, prompt and generated) and its
	 * device state: req.tokens[0, req.n_tokens), K/V of req.seq.n_tokens. */
	struct sched_req req;
	struct spec_session spec;

	/* Turns: turns[i] has number first_turn + i; a reset forgets them all and
	 * later turns keep counting, so a reader of a forgotten turn never sees a new one. */
	struct turn **turns;
	size_t n_turns, turns_cap;
	uint64_t first_turn, next_turn;
	uint64_t history_dropped;   /* turns dropped for history_max since the last reset */
	uint64_t dropped_out_bytes; /* their answers' bytes: out's size counts them, so that
				     * it only grows */

	enum atlas_state state;
	bool ended_with_eot;        /* the previous turn ended with the template's end-of-turn token */
	bool notify;                /* output or state changed since the last notification */

	/* Text of the running turn not yet released (engine thread). */
	struct tok_stream stream;
	char *hold;                 /* [hold_cap] decoded text held back for stop strings */
	size_t hold_len, hold_cap;
	char last_error[256];
};

_Static_assert((int)KV_TIERS == (int)ATLAS_TIERS, "the KV tiers are the API's tiers");
_Static_assert((int)SPEC_DRAFTERS == (int)ATLAS_SPEC_DRAFTERS, "ctl/spec shows every drafter");

/* The session a (non-tools) scheduler request belongs to. */
static inline struct atlas_session *session_of(struct sched_req *r)
{
	return (struct atlas_session *)((char *)r - offsetof(struct atlas_session, req));
}

/* A synchronous request of atlas_engine_logits(), run by the engine thread
 * as a tools request of the scheduler. */
struct logits_job {
	size_t n;                   /* positions */
	float *out;                 /* [n, vocab] the caller's */
	struct sched_req req;       /* tokens: a copy of the ids */
	int rc;
	char err[256];
	bool started, done;
	struct logits_job *next;
};

/* Called after every step with its command and result (replay tests). */
typedef void (*engine_step_fn)(void *ctx, const struct step_cmd *cmd,
			       const struct step_result *res);

enum persist_phase { PERSIST_NONE, PERSIST_ASKED, PERSIST_DONE };

/* Speculative decoding, engine-wide (engine/speculate.c; lock). */
struct spec_totals {
	uint64_t drafts, draft_tokens, accepted;
};

struct spec_engine {
	void *drafter[SPEC_DRAFTERS];   /* each drafter's own state, NULL: absent; owned */
	struct spec_cost cost;          /* the gate's measured step seconds by verify
					 * segments and rows */
	struct spec_cost draft_cost[SPEC_DRAFTERS];  /* seconds of a drafter's model per draft
						      * token, by the sessions drafting together */
	struct atlas_session **queued[SPEC_DRAFTERS];  /* [max_batch] sessions queued for a
							* drafter that runs a model */
	int n_queued[SPEC_DRAFTERS];
	struct draft_seen *seen;        /* [max_batch] what a step did (drafters that absorb) */
	struct spec_totals all, by[SPEC_DRAFTERS];
	uint64_t gated, draft_errors;
	uint64_t tried_at[ATLAS_SPEC_K_MAX];    /* verifies with a draft token at place j */
	uint64_t accepted_at[ATLAS_SPEC_K_MAX]; /* ... whose token at place j was accepted */
};

struct persist_manifest;

struct atlas_engine {
	struct atlas_config cfg;
	struct exec *x;                 /* the device side; (engine thread) */
	struct ep_head *ep;             /* ep > 1: the group of ranks this engine heads */
	const struct model_config *mc;
	struct atlas_tokenizer *tok;    /* NULL: the model works through ids */
	int vocab;                      /* logits columns */
	int context;                    /* tokens of one context */

	struct sched sched;             /* (lock) */
	struct step_cmd cmd;            /* the planned step (engine thread) */

	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t wake;            /* work arrived for the engine thread */
	pthread_cond_t job_done;        /* a logits job finished */
	bool stop;

	atlas_notify_fn notify_fn;
	void *notify_ctx;
	engine_step_fn step_fn;         /* with it, every out row keeps its logits */
	void *step_ctx;

	struct atlas_session *sessions;
	uint64_t n_sessions;
	struct logits_job *jobs;

	/* The intake thread (engine/submit.c) and its FIFO of text prompts (lock). */
	pthread_t intake;
	bool intake_running, intake_stop;
	pthread_cond_t intake_wake;
	struct intake_job *intake_head, *intake_tail;

	/* kv_persist (engine/persist.c). */
	uint64_t model_id, vocab_id;    /* fingerprints of the model directory */
	struct persist_manifest *kept;  /* read at load, restored before the thread starts */
	enum persist_phase persist;     /* (lock) atlas_engine_persist asked, then done */
	int persist_rc;
	char persist_err[256];

	struct spec_engine spec;

	/* Totals (lock). */
	uint64_t turns_total, prompt_tokens_total, generated_tokens_total;
	uint64_t step_tokens_total;
	double busy_s;
	uint64_t t_open_ns;
	struct atlas_turn_stats turn_stats;     /* (lock) latency.c records them */
};

/* The executor an engine with config c opens: its step limits (max_table
 * left to exec_open) and sequence slots. What a replay of its commands
 * opens too. */
void engine_step_limits(const struct atlas_config *c, struct step_limits *l);
int engine_seq_slots(const struct atlas_config *c);

/* Record every step (engine/engine.c): fn runs on the engine thread without
 * the lock, after the step's result is known. Set before any session opens. */
void engine_on_step(struct atlas_engine *e, engine_step_fn fn, void *ctx);

/* Sleep until a move between tiers may have ended (engine/engine.c). */
void engine_wait_for_moves(struct atlas_engine *e);

/* engine/persist.c: the disk tier's file name (NULL: unnamed), the kept
 * sessions read at load and opened at restore, and the engine thread's
 * part of atlas_engine_persist. */
const char *persist_file(const struct atlas_config *c);
int persist_load(struct atlas_engine *e, char *err, size_t errlen);
int persist_restore(struct atlas_engine *e);
void persist_run(struct atlas_engine *e);

/* engine/latency.c: one observation of ns into h; a turn ended with finish. */
void latency_observe(struct atlas_lat_hist *h, uint64_t ns);
void latency_finished(struct atlas_turn_stats *st, const char *finish);

/* engine/session.c */
void session_free(struct atlas_session *s);
struct turn *session_turn(struct atlas_session *s, uint64_t number);
struct turn *session_newest(struct atlas_session *s);
/* Before a turn is added (under the lock, every turn done): drop the
 * oldest turns until the others fit history_max. */
void session_trim_history(struct atlas_session *s);
void session_end_turn(struct atlas_session *s, int error, const char *finish, const char *msg);
void session_accept_token(struct atlas_session *s, int32_t id);

/* engine/speculate.c: the drafters, opened before the model (spec_open)
 * and checked against it once it is loaded (spec_bind); a session's state
 * (init from any thread; forget and free on the engine thread, reset under
 * the lock by whoever resets the session); drafts for the next plan (every
 * decoding session's req.n_draft; the lock is dropped while a draft model
 * runs); the outcome of the verify segment cmd.seqs[i] whose first out row
 * is `out` (its tokens go to the session, the rest of its KV is rolled
 * back); after a step's results, what it computed to the drafters that
 * follow the model (spec_absorb); the cost model's measurements; the
 * ctl/spec numbers. */
int spec_open(struct atlas_engine *e, const struct step_limits *lim, char *err, size_t errlen);
int spec_bind(struct atlas_engine *e, char *err, size_t errlen);
void spec_close(struct atlas_engine *e);
void spec_session_init(struct atlas_engine *e, struct spec_session *p);
void spec_session_free(struct atlas_engine *e, struct spec_session *p);
void spec_session_reset(struct spec_session *p);
void spec_session_forget(struct atlas_engine *e, struct spec_session *p);
void spec_plan(struct atlas_engine *e);
void spec_settle(struct atlas_engine *e, int i, const struct step_result *res, int out);
void spec_absorb(struct atlas_engine *e);
void spec_measure(struct atlas_engine *e, int rows, int segs, double seconds);
void spec_stats(struct atlas_engine *e, struct atlas_spec_stats *o);
const char *spec_slot_state(const struct atlas_session *s);

/* engine/submit.c: the intake thread, started before any session opens and
 * stopped after every turn has ended (its queued jobs are then dropped);
 * intake_forget(t), under the lock, when turn t is freed while its prompt
 * waits for the thread: the job keeps the text. */
int intake_start(struct atlas_engine *e);
void intake_stop(struct atlas_engine *e);
void intake_forget(struct turn *t);

/* engine/params.c */
void params_defaults(const struct atlas_engine *e, struct atlas_params *p);
int params_validate(const struct atlas_engine *e, const struct atlas_params *p, char *err,
		    size_t errlen);

#endif
