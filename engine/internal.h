/* Private structures of the engine, shared by the engine sources and engine/sched/.
 *
 * Locking: one mutex (engine.lock) guards every field below that the FUSE
 * threads can see: sessions, turns, their output, params, states and stats.
 * The engine thread takes it to plan a step and to apply its results, and
 * drops it while the model runs; the step's inputs are copied out first.
 * Fields marked (engine thread) are touched by the engine thread only.
 */
#ifndef ATLAS_ENGINE_INTERNAL_H
#define ATLAS_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/kv/kv.h"
#include "engine/model/model.h"
#include "engine/tokenizer/tokenizer.h"
#include "kernels/backend.h"

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
};

enum seq_phase { SEQ_IDLE, SEQ_QUEUED, SEQ_RUNNING };

struct atlas_session {
	struct atlas_engine *e;
	char name[64];
	bool closed;                /* atlas_session_close called; the engine thread frees it */
	bool reset_pending;         /* reset asked; the engine thread releases the KV */
	struct atlas_params params;
	struct atlas_session *next; /* engine.sessions list */

	/* The context: every token of every turn, prompt and generated. */
	int32_t *ctx;               /* [ctx_cap]; owned */
	size_t n_ctx, ctx_cap;
	struct kv_seq kv;           /* kv.n_tokens = context tokens whose K/V are written (engine thread) */

	/* Turns: turns[i] has number first_turn + i; a reset forgets them all and
	 * later turns keep counting, so a reader of a forgotten turn never sees a new one. */
	struct turn **turns;
	size_t n_turns, turns_cap;
	uint64_t first_turn, next_turn;

	/* Scheduling. */
	uint64_t epoch;             /* bumped when a turn ends or the session resets: a step
				     * planned before that must not apply its token */
	enum seq_phase phase;
	enum atlas_state state;
	int slot;                   /* engine slot while running, else -1 */
	uint64_t queued_seq;        /* FIFO order of admission */
	uint64_t last_used_ns;      /* for evicting idle sessions' KV, least recent first */
	bool ended_with_eot;        /* the previous turn ended with the template's end-of-turn token */
	bool notify;                /* output or state changed since the last notification */

	/* Text of the running turn not yet released (engine thread). */
	struct tok_stream stream;
	char *hold;                 /* [hold_cap] decoded text held back for stop strings */
	size_t hold_len, hold_cap;
	char last_error[256];
};

/* One entry of a planned step: n tokens of one sequence starting at its
 * first position without KV. */
struct step_seq {
	struct atlas_session *s;
	int slot;
	int start;                  /* first position fed */
	int n;                      /* tokens fed */
	bool logits;                /* the step ends at the context's last token: sample */
	uint64_t epoch;             /* the session's epoch when planned */
};

struct step {
	int n_seqs, n_tokens, n_out;
	struct step_seq *seqs;      /* [max_batch + 2] */
	struct kt_segment *segments; /* [max_batch + 2] the multi-token part, for kt_batch */
	int32_t *ids, *pos, *seqslot, *out_rows;  /* [max_tokens] host staging */
	struct kt_sample_row *sample;             /* [max_out] */
	int32_t *sampled;                          /* [max_out] */
};

/* A synchronous request for atlas_engine_logits(), run by the engine thread. */
struct logits_job {
	const int32_t *ids;
	size_t n;
	float *out;
	int rc;
	char err[256];
	bool done;
	struct logits_job *next;
};

struct atlas_engine {
	struct atlas_config cfg;
	struct kt_backend *be;
	struct model *model;
	const struct model_config *mc;
	struct model_info minfo;
	struct atlas_tokenizer *tok;   /* NULL: the model works through ids */
	int vocab;                      /* logits columns */
	int context;                    /* tokens of one context */
	int max_batch;                  /* slots */
	int max_tokens;                 /* tokens in one step: chunk_size + max_batch */
	int max_out;                    /* logits rows in one step */
	int max_blocks;                 /* block table columns: blocks of one full context */

	struct kv_pool kv;              /* (engine thread) */
	struct kt_tensor d_ids, d_pos, d_seq, d_out_rows, d_tables, d_logits;  /* step inputs/outputs */
	int32_t *tables;                /* [(max_batch + 2) * max_blocks] host copy of block tables */
	bool graphs;                    /* decode steps replay CUDA graphs (backend and config) */
	struct step step;               /* (engine thread) */

	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t wake;            /* work arrived for the engine thread */
	pthread_cond_t job_done;        /* a logits job finished */
	bool stop;

	atlas_notify_fn notify_fn;
	void *notify_ctx;

	struct atlas_session *sessions;
	uint64_t n_sessions;
	uint64_t queue_seq;             /* next FIFO number */
	struct atlas_session *slots[ATLAS_MAX_SLOTS];
	struct logits_job *jobs;

	/* Totals (lock). */
	uint64_t turns_total, prompt_tokens_total, generated_tokens_total;
	uint64_t steps_total, step_tokens_total, preemptions_total, evictions_total;
	double busy_s;
	uint64_t t_open_ns;
};

/* Block-table rows: slots 0..max_batch-1 run sessions, the next one serves
 * atlas_engine_logits, the last one the padding rows of graphed steps. */
static inline int tools_slot(const struct atlas_engine *e)
{
	return e->max_batch;
}

static inline int pad_slot(const struct atlas_engine *e)
{
	return e->max_batch + 1;
}

/* engine/session.c */
void session_free(struct atlas_session *s);
struct turn *session_turn(struct atlas_session *s, uint64_t number);
struct turn *session_newest(struct atlas_session *s);
void session_end_turn(struct atlas_session *s, int error, const char *finish, const char *msg);
void session_accept_token(struct atlas_session *s, int32_t id);
void session_drop_kv(struct atlas_session *s);

/* engine/params.c */
void params_defaults(const struct atlas_engine *e, struct atlas_params *p);
int params_validate(const struct atlas_engine *e, const struct atlas_params *p, char *err,
		    size_t errlen);

/* engine/sched/sched.c */
int sched_plan(struct atlas_engine *e);
void sched_finish(struct atlas_engine *e);

/* engine/step.c */
int step_run(struct atlas_engine *e, char *err, size_t errlen);
int step_run_logits_job(struct atlas_engine *e, struct logits_job *job);

#endif
