/* The forward pass of the MoE block (moe.h) and its scratch.
 *
 * A step's rows run in two parts, its decode rows and then its prompt
 * rows, each through route, the grouped products and the combine: a
 * backend picks kernels by row count, and the split keeps a decode row's
 * arithmetic the same whatever prompt chunks share its step. Every buffer
 * is a view of the scratch sized at load: nothing is allocated here.
 */
#include "engine/model/moe/moe.h"

#include "common/err.h"
#include "engine/model/blocks.h"

#define TRY(op) do { int rc_ = (op); if (rc_) return rc_; } while (0)

int moe_alloc_scratch(struct model *m, struct moe_scratch *s, char *err, size_t errlen)
{
	const struct model_config *c = &m->cfg;
	const int64_t M = m->max_tokens, E = c->n_experts, k = c->n_experts_per_tok;
	const int64_t I = c->moe_intermediate_size, H = c->hidden_size;
	int rc;

	if ((rc = model_alloc(m, KT_F32, M, E, &s->logits, "logits", err, errlen)) ||
	    (rc = model_alloc(m, KT_I32, M, k, &s->ids, "ids", err, errlen)) ||
	    (rc = model_alloc(m, KT_F32, M, k, &s->w, "w", err, errlen)) ||
	    (rc = model_alloc(m, KT_I32, M * k, 1, &s->order, "order", err, errlen)) ||
	    (rc = model_alloc(m, KT_I32, M * k, 1, &s->slot, "slot", err, errlen)) ||
	    (rc = model_alloc(m, KT_I32, E + 1, 1, &s->offsets, "offsets", err, errlen)) ||
	    (rc = model_alloc(m, KT_F32, M * k, 2 * I, &s->gate_up, "gate_up", err, errlen)) ||
	    (rc = model_alloc(m, KT_F32, M * k, I, &s->act, "act", err, errlen)) ||
	    (rc = model_alloc(m, KT_F32, M * k, H, &s->y, "y", err, errlen)))
		return rc;
	return 0;
}

void moe_free_scratch(struct model *m, struct moe_scratch *s)
{
	struct kt_tensor *all[] = { &s->logits, &s->ids, &s->w, &s->order, &s->slot,
				    &s->offsets, &s->gate_up, &s->act, &s->y };
	for (size_t i = 0; i < ATLAS_ARRAY_LEN(all); i++)
		if (all[i]->data)
			kt_free(m->be, all[i]);
}

/* The block over rows [r0, r0 + n) of xn into the same rows of out. */
static int block_rows(struct model *m, const struct moe_layer *w, const struct moe_scratch *s,
		      const struct kt_tensor *xn_all, const struct kt_tensor *out_all, int64_t r0,
		      int64_t n)
{
	const struct model_config *c = &m->cfg;
	struct kt_backend *be = m->be;
	const int k = c->n_experts_per_tok;
	const int64_t nk = n * k;
	const struct kt_tensor xn = kt_rows(*xn_all, r0, n), out = kt_rows(*out_all, r0, n);
	const struct kt_tensor logits = kt_rows(s->logits, 0, n), ids = kt_rows(s->ids, 0, n);
	const struct kt_tensor wt = kt_rows(s->w, 0, n);
	const struct kt_tensor order = kt_rows(s->order, 0, nk), slot = kt_rows(s->slot, 0, nk);
	const struct kt_tensor gate_up = kt_rows(s->gate_up, 0, nk), act = kt_rows(s->act, 0, nk);
	const struct kt_tensor y = kt_rows(s->y, 0, nk);
	int e0, n_local;

	moe_shard(m, &e0, &n_local);
	TRY(kt_matmul(be, &logits, &xn, &w->router, NULL));
	TRY(kt_moe_route(be, &ids, &wt, &order, &slot, &s->offsets, &logits, c->norm_topk_prob));
	TRY(kt_moe_matmul(be, &gate_up, &xn, &w->w_gate_up, &order, &s->offsets, k, e0));
	TRY(kt_swiglu(be, &act, &gate_up, NULL));
	TRY(kt_moe_matmul(be, &y, &act, &w->w_down, &order, &s->offsets, 0, e0));
	if (be->comm.n_ranks > 1)
		TRY(kt_allreduce(be, &y));
	return kt_moe_combine(be, &out, &y, &wt, &slot);
}

int moe_forward(struct model *m, const struct moe_layer *w, const struct moe_scratch *s,
		const struct kt_batch *b, const struct kt_tensor *xn, const struct kt_tensor *out)
{
	const int64_t T = xn->rows, d = b->n_single;

	if (d <= 0 || d >= T)
		return block_rows(m, w, s, xn, out, 0, T);
	TRY(block_rows(m, w, s, xn, out, 0, d));
	return block_rows(m, w, s, xn, out, d, T - d);
}
