/* What the drafters that run a model (draft.c, mtp.c) share about their
 * sessions' sequences in their own KV pool: the list of those that hold
 * KV, from which a full pool takes KV back, and appending a sequence's
 * rows to the step command of their executor, where each sequence's
 * block-table row is its place in the command. Engine thread only.
 */
#ifndef ATLAS_ENGINE_SPEC_DRAFT_SEQS_H
#define ATLAS_ENGINE_SPEC_DRAFT_SEQS_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/seq/seq.h"
#include "engine/step/step.h"

/* One session's sequence, inside the drafter's state of the session. */
struct draft_seq_kv {
	struct seq seq;
	bool linked;                    /* on the list: it may hold KV */
	struct draft_seq_kv *prev, *next;
};

/* A drafter's pool and its sequences that hold KV. When a reserve finds
 * the pool full, sequences that busy() does not hold give theirs back
 * through evict(ctx, s), which forgets what s held and calls
 * draft_seqs_release. */
struct draft_seqs {
	struct seq_pool *pool;
	struct draft_seq_kv *head;
	bool (*busy)(const struct draft_seq_kv *s);
	void (*evict)(void *ctx, struct draft_seq_kv *s);
	void *ctx;
};

/* Room for positions [0, n) in s (seq_reserve), taking others' KV when
 * the pool is full; s is on the list after. 0 or -ENOSPC. */
int draft_seqs_reserve(struct draft_seqs *l, struct draft_seq_kv *s, int n);
/* Give s's KV back and take it off the list. */
void draft_seqs_release(struct draft_seqs *l, struct draft_seq_kv *s);

/* Append ids[0, n) at positions pos0, pos0 + 1, ... of sequence s to c,
 * its blocks resolved from pool into c's tables (max_table entries in
 * all); with an out row at the last row, drawn with *out, when out is not
 * NULL. 0, or seq_resolve's error. */
int draft_cmd_add(struct step_cmd *c, const struct seq_pool *pool, int max_table,
		  const struct seq *s, const int32_t *ids, int n, int pos0,
		  const struct kt_sample_row *out);

#endif
