/* A model-running drafter's sequences (draft_seqs.h). */
#include "engine/spec/draft_seqs.h"

#include <errno.h>
#include <string.h>

int draft_seqs_reserve(struct draft_seqs *l, struct draft_seq_kv *s, int n)
{
	int rc = seq_reserve(l->pool, &s->seq, n);
	for (struct draft_seq_kv *o = l->head, *next; rc == -ENOSPC && o; o = next) {
		next = o->next;
		if (o == s || l->busy(o))
			continue;
		l->evict(l->ctx, o);
		rc = seq_reserve(l->pool, &s->seq, n);
	}
	if (!rc && !s->linked) {
		s->next = l->head;
		if (l->head)
			l->head->prev = s;
		l->head = s;
		s->linked = true;
	}
	return rc;
}

void draft_seqs_release(struct draft_seqs *l, struct draft_seq_kv *s)
{
	seq_release(l->pool, &s->seq);
	if (!s->linked)
		return;
	*(s->prev ? &s->prev->next : &l->head) = s->next;
	if (s->next)
		s->next->prev = s->prev;
	s->linked = false;
	s->prev = s->next = NULL;
}

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
