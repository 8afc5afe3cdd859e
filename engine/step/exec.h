/* The executor: the device side of the engine. It owns the backend, the
 * model's weights, the sequence pool's device memory and the step buffers,
 * and runs step commands (step.h); it knows nothing of sessions, turns or
 * the scheduler. The engine drives one; a replay test drives a second from
 * a recorded command stream; an expert-parallel worker will be one.
 *
 * Block-table rows: the first n_seq_slots belong to sequences (slots in the
 * commands); one more, the pad slot, serves the padding rows of graphed
 * steps and points every entry at the pool's pad block.
 *
 * One thread at a time: the engine thread. exec_run (exec_launch, exec_finish)
 * allocates nothing.
 */
#ifndef ATLAS_ENGINE_EXEC_H
#define ATLAS_ENGINE_EXEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "engine/model/model.h"
#include "engine/seq/seq.h"
#include "engine/step/step.h"
#include "kernels/backend.h"

/* What an executor runs: a model, or the MTP head of one (an MTP drafter's,
 * engine/spec/mtp.c). */
enum exec_part { EXEC_MODEL, EXEC_MTP_HEAD };

struct exec {
	struct atlas_config cfg;        /* a copy: backend, model, sizes */
	enum exec_part part;
	struct kt_backend *be;
	struct model *model;
	const struct model_config *mc;  /* the model's */
	struct model_info info;
	struct seq_pool pool;           /* device memory of the sequences; its allocator is the
					 * scheduler's (engine thread, engine.lock) */
	struct step_limits lim;         /* the largest command */
	struct step_geometry geo;       /* what commands are checked against */
	int n_seq_slots;                /* block-table rows of sequences */
	int pad_slot;                   /* n_seq_slots */
	bool graphs;                    /* steps of decode rows replay CUDA graphs */

	/* Device step buffers. */
	/* A step's row arrays [4 * max_rows + max_out, 1] i32, packed n rows
	 * apart for a step of n rows so that one copy uploads them: ids, then
	 * positions, slots, state rows (models with linear layers), and the
	 * n_out out rows. */
	struct kt_tensor d_rows;
	int pad_state;                          /* the state row of graph padding rows, which
						 * no sequence holds; -1 without states */
	struct kt_tensor d_tables;              /* [n_seq_slots + 1, max_blocks] i32 */
	struct kt_tensor d_logits;              /* [max_out, vocab] f32 */
	/* Final hidden rows [max_rows, hidden] f32: a model's every row, kept
	 * for its MTP head (exec_keeps_hidden; else no data), valid until the
	 * next run; a head's input rows, which its drafter writes before a run. */
	struct kt_tensor d_hidden;
	struct kt_tensor d_hidden_out;          /* a head's: [max_out, hidden] f32, the out
						 * rows' final hidden after a run */

	/* Attention over host-tier blocks (exec_staging_open; none without a
	 * host tier): stage's tensors are owned, its counts are the current
	 * step's. */
	bool staging;
	struct model_staging stage;
	int max_rounds;                         /* rounds the span tensor holds */
	uint64_t staged_blocks;                 /* pieces of every step run so far (ctl/kv) */
	int32_t *h_src;                         /* [max_table] pieces */
	int32_t *h_span;                        /* [max_rounds * max_rows * 2] */
	int32_t *h_from;                        /* [n_seq_slots + 1] */
	int32_t *h_tables;                      /* [max_table] the command's tables, host
						 * entries replaced by the pad block */

	/* Host staging, sized for the largest command (plus graph padding). */
	int32_t *ids, *pos, *seqslot, *stslot;  /* [max_rows] */
	int32_t *out_rows;                      /* [max_rows] */
	int32_t *h_rows;                        /* [4 * max_rows + max_out] d_rows' upload */
	int32_t *h_tables_dev;                  /* [n_seq_slots + 1, max_blocks] what
						 * d_tables holds: a run uploads only the
						 * table entries that changed */
	bool tables_stale;                      /* a table copy failed: upload them all */
	struct kt_sample_row *sample;           /* [max_out] */
	struct kt_segment *segments;            /* [max_seqs] */
	int32_t *tokens;                        /* [max_out] the result's tokens */
	float *logits;                          /* [max_out, vocab] the result's kept rows */

	/* The command exec_launch queued, until exec_finish. */
	bool launched_sample;                   /* it draws sampled rows */
	uint64_t launched_graphs;               /* be->graphs_recorded before it */
};

/* Open the backend cfg names, load its model (or dummy shape), or that
 * model's MTP head for EXEC_MTP_HEAD, and size the sequence pool
 * (kv_memory, or what the device has left): for n_seq_slots sequence slots
 * and commands up to lim, whose max_table exec_open sets from the context
 * (x->lim is the whole of it). */
int exec_open(const struct atlas_config *cfg, enum exec_part part, int n_seq_slots,
	      const struct step_limits *lim, struct exec **out, char *err, size_t errlen);

/* exec_open, with join(ctx, be) called once the backend is open and
 * before the model loads: where expert parallelism's ranks meet and open
 * the backend's communicator, whose rank decides which experts load. */
typedef int (*exec_join_fn)(void *ctx, struct kt_backend *be, char *err, size_t errlen);
int exec_open_joined(const struct atlas_config *cfg, enum exec_part part, int n_seq_slots,
		     const struct step_limits *lim, exec_join_fn join, void *ctx,
		     struct exec **out, char *err, size_t errlen);
/* Whether a model of config mc keeps its final hidden rows under cfg:
 * it has an MTP head that cfg loads (mtp_head). */
bool exec_keeps_hidden(const struct atlas_config *cfg, const struct model_config *mc);
void exec_close(struct exec *x);

/* The staging buffers of attention over host-tier blocks, once the pool
 * has its tiers (seq_pool_tiers): stage_bytes of device memory (at least
 * one block of one layer). A no-op without a host tier. */
int exec_staging_open(struct exec *x, uint64_t stage_bytes, char *err, size_t errlen);

/* Check and run one command; on success r points into x's result arrays.
 * Returns when the sampled tokens and kept logits are on the host. An error
 * leaves the KV of the command's sequences undefined. */
int exec_run(struct exec *x, const struct step_cmd *c, struct step_result *r, char *err,
	     size_t errlen);

/* exec_run in two halves, so that the caller works while a device runs
 * the step: exec_launch checks c and queues its forward pass (on a backend
 * without a queue, runs it); exec_finish, on the same c and next after a
 * launch that succeeded, waits for it and fills r. An error of either
 * leaves the KV of the command's sequences undefined. */
int exec_launch(struct exec *x, const struct step_cmd *c, char *err, size_t errlen);
int exec_finish(struct exec *x, const struct step_cmd *c, struct step_result *r, char *err,
		size_t errlen);

#endif
