/* The step command: everything one forward pass needs, and nothing else
 * (DESIGN §7.1).
 *
 * The scheduler (engine/sched/) plans a step completely: which sequences,
 * the rows each feeds (a prefill chunk, one decode row, or K+1 verify rows),
 * their positions, their block tables already resolved (residency settled
 * at plan time: a device block id, or a slot of the host tier whose block
 * attention streams through staging, DESIGN §8), which rows want logits and how to
 * sample them. The executor (exec.h) runs the command and reads nothing
 * else: not sessions, not scheduler state. The same command on the same
 * device state gives the same result, which is what makes a recorded
 * command stream replayable and what expert-parallel workers will execute
 * (wire.c is its byte form).
 *
 * Layout: rows are numbered 0..n_rows-1, sequence by sequence, and a
 * sequence's rows are consecutive positions pos0, pos0 + 1, ... The one-row
 * sequences before the first multi-row one are the step's decode rows (the
 * leading n_single rows of kt_batch), the rest its segments: the planner
 * puts every decode row first, so that a decode row's arithmetic does not
 * depend on what shares its step. Out rows are in row order.
 */
#ifndef ATLAS_ENGINE_STEP_H
#define ATLAS_ENGINE_STEP_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine/kv/kv.h"
#include "kernels/backend.h"

/* One sequence's part of a step. */
struct step_seq {
	int32_t slot;               /* its row of the block tables, 0..n_slots - 1 */
	int32_t row;                /* its first row in the step */
	int32_t n_rows;             /* rows it feeds */
	int32_t pos0;               /* position of its first row */
	int32_t table;              /* its block table is tables[table, table + n_blocks) */
	int32_t n_blocks;           /* blocks holding positions [0, pos0 + n_rows) */
	int32_t state_slot;         /* its recurrent state slot, -1 when the model has none */
};

/* A row whose logits are wanted. */
struct step_out {
	int32_t row;                /* the step row */
	uint8_t sample;             /* draw a token from them with params */
	uint8_t keep;               /* return the logits row to the host */
	struct kt_sample_row params;
};

struct step_cmd {
	uint64_t number;            /* 1, 2, ... in the order the planner made them */
	int n_seqs, n_rows, n_out, n_table;
	struct step_seq *seqs;      /* [n_seqs] in row order */
	int32_t *ids;               /* [n_rows] the token fed at each row */
	struct step_out *out;       /* [n_out] in row order */
	int32_t *tables;            /* [n_table] the sequences' tables end to end: a device
				     * block id >= 0, or STEP_HOST_BLOCK(slot) for a block in
				     * slot of the host tier, which only positions before the
				     * sequence's first row may be in */
};

/* A table entry naming host-tier slot s, and back (the encoding of kv.h). */
#define STEP_HOST_BLOCK(s) KV_HOST_ID(s)
#define STEP_HOST_SLOT(id) KV_HOST_SLOT(id)

/* What a command may hold: the capacity of its arrays. */
struct step_limits {
	int max_seqs, max_rows, max_out, max_table;
};

/* What running a command gave; the arrays belong to the executor and stay
 * valid until its next run. */
struct step_result {
	const int32_t *tokens;      /* [n_out] the token drawn at each out row that samples,
				     * -1 at the others */
	const float *logits;        /* [n_keep, vocab] the kept rows, in out order */
	int n_keep;
	bool recorded;              /* the step recorded its CUDA graph first: its time is
				     * not what its shape costs */
};

/* Arrays for a command of up to l's sizes (the planner's, a decoder's). */
int step_cmd_alloc(struct step_cmd *c, const struct step_limits *l);
void step_cmd_free(struct step_cmd *c);

/* What a command is checked against: the executor's device. */
struct step_geometry {
	int n_slots;                /* block-table rows */
	int max_blocks;             /* entries of one block-table row */
	int n_blocks;               /* blocks of the KV pool (0: the model has no attention) */
	int host_blocks;            /* slots of the host tier (0: none) */
	int block_size;             /* positions per block */
	int context;                /* positions of one sequence */
	int vocab;                  /* token ids */
	int state_slots;            /* recurrent state rows (0: the model has no linear layers) */
};

/* Whether c is well formed for device g: counts within l, rows laid out as
 * described above, ids, positions, tables and sampling parameters in range.
 * 0 or -EINVAL with the reason in err. The executor checks every command,
 * so a damaged one fails cleanly instead of reaching a kernel. */
int step_cmd_check(const struct step_cmd *c, const struct step_limits *l,
		   const struct step_geometry *g, char *err, size_t errlen);

/* The byte form of a command (wire.c): a versioned header, then every array
 * little-endian. encode returns the bytes written or -E2BIG; decode fills c
 * (allocated for l) and returns 0, -EPROTO for another version or magic,
 * -EINVAL for a damaged or truncated buffer, -E2BIG past l. */
#define STEP_WIRE_MAGIC 0x70657473u    /* "step" */
#define STEP_WIRE_VERSION 2
size_t step_wire_size(const struct step_cmd *c);
long step_encode(const struct step_cmd *c, void *buf, size_t cap);
int step_decode(const void *buf, size_t len, const struct step_limits *l, struct step_cmd *c);

#endif
