/* What the drafters that run a model (draft.c, mtp.c) share: appending a
 * session's rows to the step command of their own executor, where each
 * sequence's block-table row is its place in the command. */
#ifndef ATLAS_ENGINE_SPEC_DRAFT_CMD_H
#define ATLAS_ENGINE_SPEC_DRAFT_CMD_H

#include <stdint.h>

#include "engine/seq/seq.h"
#include "engine/step/step.h"

/* Append ids[0, n) at positions pos0, pos0 + 1, ... of sequence s to c,
 * its blocks resolved from pool into c's tables (max_table entries in
 * all); with an out row at the last row, drawn with *out, when out is not
 * NULL. 0, or seq_resolve's error. */
int draft_cmd_add(struct step_cmd *c, const struct seq_pool *pool, int max_table,
		  const struct seq *s, const int32_t *ids, int n, int pos0,
		  const struct kt_sample_row *out);

#endif
