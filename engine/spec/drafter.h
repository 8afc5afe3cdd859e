/* Drafters of speculative decoding (DESIGN §9), behind one table: each
 * guesses the tokens that follow a session's context.
 *
 *   ngram  prompt lookup over the session's own context (ngram_drafter.c);
 *          no model runs
 *   draft  a smaller model with the model's vocabulary, on the same backend,
 *          with its own KV per session (draft.c)
 *   mtp    the model's own multi-token-prediction head, which reads the
 *          model's final hidden state of every position (mtp.c)
 *
 * The engine (engine/speculate.c) asks in two phases before each step.
 * prepare runs with the engine lock held, once per session that may draft,
 * and takes from the context everything the drafter needs (the context can
 * change once the lock is dropped). A drafter that runs no model answers
 * there. One that runs a model queues the session and answers in run,
 * which the engine calls once for every queued session, without the lock:
 * the draft forward passes do not hold up the FUSE threads.
 *
 * A drafter that follows the model (absorb) is told after every step of
 * the model what the step computed for each of its sessions; what it keeps
 * of the step's device buffers it uses in the next run, which the engine
 * calls before the model's next step whenever pending says so.
 *
 * A drafter's per-session state is its own (session_new); only the engine
 * thread touches it, except session_new, which touches no device.
 */
#ifndef ATLAS_ENGINE_SPEC_DRAFTER_H
#define ATLAS_ENGINE_SPEC_DRAFTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"

struct exec;
struct atlas_tokenizer;
struct step_limits;

/* One session's request for the next step. */
struct draft_req {
	void *state;                        /* the session's state of this drafter */
	const int32_t *tokens;              /* [n_tokens] the context: valid in prepare only */
	size_t n_tokens;
	int k;                              /* drafts wanted, 1..ATLAS_SPEC_K_MAX */
	int32_t drafts[ATLAS_SPEC_K_MAX];   /* guesses of tokens[n_tokens], tokens[n_tokens + 1], ... */
	int n_drafts;                       /* how many, 0..k */
};

/* What one step of the model did for one session (absorb): rows [row, row
 * + n_rows) of step `step` fed positions pos0, pos0 + 1, ... of the context
 * tokens[0, n_tokens), which the step's tokens already extend; the rows
 * after n_rows (rejected drafts) are not the context. tokens is valid in
 * absorb only. */
struct draft_seen {
	void *state;
	int row, n_rows;
	size_t pos0;
	const int32_t *tokens;
	size_t n_tokens;
};

enum spec_drafter { SPEC_DRAFTER_NGRAM, SPEC_DRAFTER_DRAFT, SPEC_DRAFTER_MTP, SPEC_DRAFTERS };

struct drafter_ops {
	const char *name;                   /* what ctl/slots and ctl/spec call it */
	enum atlas_spec method;             /* the spec setting that asks for it alone */
	bool runs_model;                    /* drafting costs forward passes: the gate picks k
					     * before drafting, and run makes the drafts */
	/* Open from the config before the model is loaded (a drafter that
	 * allocates device memory goes first, so that an automatic kv_memory
	 * sees it); *self NULL: not configured, the drafter is absent. */
	int (*open)(const struct atlas_config *c, const struct step_limits *model_lim, void **self,
		    char *err, size_t errlen);
	/* Check against the loaded model (target): vocabulary, context. */
	int (*bind)(void *self, const struct exec *target, const struct atlas_tokenizer *tok,
		    char *err, size_t errlen);
	void (*close)(void *self);
	/* A session's state (NULL: out of memory); free; forget everything
	 * (the session's context was reset). */
	void *(*session_new)(void *self);
	void (*session_free)(void *self, void *state);
	void (*session_forget)(void *self, void *state);
	/* Lock held. Returns 0 with q->drafts and q->n_drafts set, or 1 when
	 * q is queued for run (which sets them). */
	int (*prepare)(void *self, struct draft_req *q);
	/* Without the lock: the drafts of queued requests q[0, n). On an error
	 * every one of them has no drafts and the drafter's state stays
	 * consistent (a failed forward forgets what it wrote). *recorded:
	 * whether one of its steps recorded a CUDA graph first, so that its
	 * time is not what drafting costs. */
	int (*run)(void *self, struct draft_req *const *q, int n, bool *recorded, char *err,
		   size_t errlen);
	/* Optional. Lock held, after step number `step` of the model: what it
	 * did for the sessions in seen[0, n) that have this drafter's state. */
	void (*absorb)(void *self, const struct draft_seen *seen, int n, uint64_t step);
	/* Optional: whether run has work even without requests. */
	bool (*pending)(void *self);
};

/* The table, by enum spec_drafter. */
extern const struct drafter_ops *const spec_drafters[SPEC_DRAFTERS];
extern const struct drafter_ops ngram_drafter_ops;
extern const struct drafter_ops draft_model_ops;
extern const struct drafter_ops mtp_drafter_ops;

#endif
