/* Step commands (step.h): their arrays and the check every command passes
 * before the executor touches the device. */
#include "engine/step/step.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

int step_cmd_alloc(struct step_cmd *c, const struct step_limits *l)
{
	memset(c, 0, sizeof *c);
	c->seqs = calloc((size_t)l->max_seqs, sizeof *c->seqs);
	c->ids = calloc((size_t)l->max_rows, sizeof *c->ids);
	c->out = calloc((size_t)l->max_out, sizeof *c->out);
	c->tables = calloc((size_t)l->max_table, sizeof *c->tables);
	if (!c->seqs || !c->ids || !c->out || !c->tables) {
		step_cmd_free(c);
		return -ENOMEM;
	}
	return 0;
}

void step_cmd_free(struct step_cmd *c)
{
	free(c->seqs);
	free(c->ids);
	free(c->out);
	free(c->tables);
	memset(c, 0, sizeof *c);
}

static int check_seq(const struct step_cmd *c, int i, const struct step_geometry *g, char *err,
		     size_t errlen)
{
	const struct step_seq *q = &c->seqs[i];
	const int row = i ? c->seqs[i - 1].row + c->seqs[i - 1].n_rows : 0;
	const int table = i ? c->seqs[i - 1].table + c->seqs[i - 1].n_blocks : 0;
	const int end = q->pos0 + q->n_rows;

	if (q->slot < 0 || q->slot >= g->n_slots)
		return atlas_errf(err, errlen, -EINVAL, "sequence %d: slot %d is not below %d", i,
				  q->slot, g->n_slots);
	for (int j = 0; j < i; j++)
		if (c->seqs[j].slot == q->slot)
			return atlas_errf(err, errlen, -EINVAL, "sequence %d: slot %d twice", i,
					  q->slot);
	if (g->state_slots && (q->state_slot < 0 || q->state_slot >= g->state_slots))
		return atlas_errf(err, errlen, -EINVAL,
				  "sequence %d: state slot %d is not below %d", i, q->state_slot,
				  g->state_slots);
	for (int j = 0; g->state_slots && j < i; j++)
		if (c->seqs[j].state_slot == q->state_slot)
			return atlas_errf(err, errlen, -EINVAL, "sequence %d: state slot %d twice",
					  i, q->state_slot);
	if (q->row != row || q->n_rows < 1 || q->table != table || q->n_blocks < 0)
		return atlas_errf(err, errlen, -EINVAL,
				  "sequence %d: rows or table not where the one before ends", i);
	if (q->pos0 < 0 || end > g->context)
		return atlas_errf(err, errlen, -EINVAL,
				  "sequence %d: positions %d..%d outside the context of %d", i,
				  q->pos0, end - 1, g->context);
	if (g->n_blocks && (q->n_blocks > g->max_blocks ||
			    (int64_t)q->n_blocks * g->block_size < end))
		return atlas_errf(err, errlen, -EINVAL,
				  "sequence %d: %d blocks do not hold its %d positions", i,
				  q->n_blocks, end);
	for (int b = 0; b < q->n_blocks; b++) {
		const int32_t id = c->tables[q->table + b];

		if (id >= g->n_blocks)
			return atlas_errf(err, errlen, -EINVAL,
					  "sequence %d: block %d is not in the pool of %d", i, id,
					  g->n_blocks);
		if (id >= 0)
			continue;
		if (STEP_HOST_SLOT(id) >= g->host_blocks)
			return atlas_errf(err, errlen, -EINVAL,
					  "sequence %d: host slot %d is not in the host tier of %d",
					  i, STEP_HOST_SLOT(id), g->host_blocks);
		/* Attention reads a host block through staging: the step must not
		 * write any of its positions. */
		if ((int64_t)(b + 1) * g->block_size > q->pos0)
			return atlas_errf(err, errlen, -EINVAL,
					  "sequence %d: block %d is on the host tier but holds "
					  "positions the step writes (from %d)", i, b, q->pos0);
	}
	return 0;
}

static int check_out(const struct step_cmd *c, int i, char *err, size_t errlen)
{
	const struct step_out *o = &c->out[i];
	const struct kt_sample_row *p = &o->params;

	if (o->row < (i ? c->out[i - 1].row + 1 : 0) || o->row >= c->n_rows)
		return atlas_errf(err, errlen, -EINVAL, "out row %d: row %d out of order", i,
				  o->row);
	if (o->sample > 1 || o->keep > 1 || !(p->temperature >= 0) ||
	    !(p->top_p > 0 && p->top_p <= 1) || p->top_k < 0 || !(p->u >= 0 && p->u < 1))
		return atlas_errf(err, errlen, -EINVAL, "out row %d: bad sampling parameters", i);
	return 0;
}

int step_cmd_check(const struct step_cmd *c, const struct step_limits *l,
		   const struct step_geometry *g, char *err, size_t errlen)
{
	int rc;

	if (c->n_seqs < 1 || c->n_seqs > l->max_seqs || c->n_rows > l->max_rows ||
	    c->n_out < 0 || c->n_out > l->max_out || c->n_table < 0 || c->n_table > l->max_table)
		return atlas_errf(err, errlen, -EINVAL,
				  "%d sequences, %d rows, %d out rows, %d table entries: over the "
				  "limits", c->n_seqs, c->n_rows, c->n_out, c->n_table);
	for (int i = 0; i < c->n_seqs; i++)
		if ((rc = check_seq(c, i, g, err, errlen)))
			return rc;
	const struct step_seq *last = &c->seqs[c->n_seqs - 1];
	if (last->row + last->n_rows != c->n_rows || last->table + last->n_blocks != c->n_table)
		return atlas_errf(err, errlen, -EINVAL, "the sequences do not cover the rows");
	for (int i = 0; i < c->n_rows; i++)
		if (c->ids[i] < 0 || c->ids[i] >= g->vocab)
			return atlas_errf(err, errlen, -EINVAL, "row %d: token id %d not below %d",
					  i, c->ids[i], g->vocab);
	for (int i = 0; i < c->n_out; i++)
		if ((rc = check_out(c, i, err, errlen)))
			return rc;
	return 0;
}
