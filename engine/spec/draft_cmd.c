/* Appending a drafter's rows to its command (draft_cmd.h). */
#include "engine/spec/draft_cmd.h"

#include <string.h>

int draft_cmd_add(struct step_cmd *c, const struct seq_pool *pool, int max_table,
		  const struct seq *s, const int32_t *ids, int n, int pos0,
		  const struct kt_sample_row *out)
{
	const int nb = seq_resolve(pool, s, pos0 + n, c->tables + c->n_table,
				   max_table - c->n_table);
	if (nb < 0)
		return nb;
	c->seqs[c->n_seqs] = (struct step_seq){ .slot = c->n_seqs, .row = c->n_rows,
						.n_rows = n, .pos0 = pos0, .table = c->n_table,
						.n_blocks = nb, .state_slot = -1 };
	memcpy(c->ids + c->n_rows, ids, (size_t)n * sizeof *ids);
	c->n_rows += n;
	c->n_table += nb;
	c->n_seqs++;
	if (out)
		c->out[c->n_out++] = (struct step_out){ .row = c->n_rows - 1, .sample = 1,
							.params = *out };
	return 0;
}
