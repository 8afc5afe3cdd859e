/* The forward pass of the dense family (dense.h), and its scratch.
 *
 * One step, all rows at once, read top to bottom:
 *
 *   x = embed(ids)
 *   per layer:  xn = rmsnorm(x += previous block's output)
 *               q, k, v = xn · Wqᵀ, Wkᵀ, Wvᵀ (+ bias)   (one product of the
 *                         stacked wqkv; with biases, one matmul_n)
 *               q, k = rotary (after an rmsnorm per head in Qwen3),
 *               and k, v stored in the paged cache   (one rope_store)
 *               att = attention(q, cache)
 *               proj = att · Woᵀ
 *               xn = rmsnorm(x += proj)
 *               proj = (silu(xn · Wgateᵀ) * (xn · Wupᵀ)) · Wdownᵀ
 *                      (gate, up and the SwiGLU: one matmul_swiglu of
 *                      the stacked w_gate_up)
 *                      (or the experts' sum in an MoE layer, moe.h)
 *   logits = lm_head · rmsnorm(x += proj)[out_rows]
 *                      (with every row an out row in order: no gather, and
 *                      the norm an rmsnorm_product that lm_head may take)
 *
 * The residual add is the fused first half of the rmsnorm op, so the residual
 * stream x is touched once per block. The norms whose out only the product
 * after them reads are rmsnorm_product: a backend may compute them inside
 * that product (cuda, at one row). Every buffer is a row view of the
 * scratch sized at load: nothing is allocated here. On a backend that rounds
 * x to bf16 for its products (matmul_x_bf16), a dense block's xn, the
 * attention output and silu(gate) * up are written in bf16 (xnb, att, act);
 * an MoE block's xn stays f32 for its router.
 */
#include "engine/model/dense/dense.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "common/err.h"

#define TRY(op) do { int rc_ = (op); if (rc_) return rc_; } while (0)

/* A bias that the model does not have is passed to matmul as NULL. */
static const struct kt_tensor *opt(const struct kt_tensor *t)
{
	return t->data ? t : NULL;
}

int dense_alloc_scratch(struct model *m, struct dense_model *d, char *err, size_t errlen)
{
	const struct model_config *c = &m->cfg;
	struct dense_scratch *s = &d->s;
	const int64_t t = m->max_tokens, e = c->hidden_size, in = c->intermediate_size;
	const int64_t q = (int64_t)c->n_heads * c->head_dim;
	const int64_t kv = (int64_t)c->n_kv_heads * c->head_dim;
	const enum kt_dtype xdt = m->be->info.matmul_x_bf16 ? KT_BF16 : KT_F32;
	int rc;

	if ((rc = model_alloc(m, KT_F32, t, e, &s->x, "x", err, errlen)) ||
	    (rc = model_alloc(m, KT_F32, t, e, &s->xn, "xn", err, errlen)) ||
	    (rc = model_alloc(m, KT_F32, t, e, &s->proj, "proj", err, errlen)) ||
	    (rc = model_alloc(m, KT_F32, t, q, &s->q, "q", err, errlen)) ||
	    (rc = model_alloc(m, KT_F32, t, kv, &s->k, "k", err, errlen)) ||
	    (rc = model_alloc(m, KT_F32, t, kv, &s->v, "v", err, errlen)) ||
	    (rc = model_alloc(m, KT_F32, t, 2 * in, &s->gate_up, "gate_up", err, errlen)) ||
	    (rc = model_alloc(m, KT_F32, m->max_out, e, &s->out_h, "out_h", err, errlen)))
		return rc;
	/* gate and up: the halves of gate_up's memory, [t, I] each */
	s->gate = kt_reshape(kt_rows(kt_reshape(s->gate_up, 2 * t, in), 0, t), t, in);
	s->up = kt_reshape(kt_rows(kt_reshape(s->gate_up, 2 * t, in), t, t), t, in);
	/* the product of the stacked q/k/v weights (dense_weights.c stacks them
	 * in every layer of a model without attention biases) */
	if (!c->attention_bias &&
	    (rc = model_alloc(m, KT_F32, t, q + 2 * kv, &s->qkv, "qkv", err, errlen)))
		return rc;
	if (m->be->info.matmul_x_bf16 &&
	    (rc = model_alloc(m, KT_BF16, t, e, &s->xnb, "xnb", err, errlen)))
		return rc;
	/* o_proj's and down's x: bf16 where the products round x to bf16 anyway
	 * (attention and swiglu store it rounded: the same bits, half the bytes) */
	if ((rc = model_alloc(m, xdt, t, q, &s->att, "att", err, errlen)) ||
	    (in && (rc = model_alloc(m, xdt, t, in, &s->act, "act", err, errlen))))
		return rc;
	return model_rope_table(m, &s->inv_freq, err, errlen);
}

void dense_free_scratch(struct model *m, struct dense_model *d)
{
	struct dense_scratch *s = &d->s;
	struct kt_tensor *all[] = { &s->x, &s->xn, &s->proj, &s->q, &s->k, &s->v, &s->att,
				    &s->gate_up, &s->qkv, &s->xnb, &s->act, &s->out_h,
				    &s->inv_freq };
	for (size_t i = 0; i < ATLAS_ARRAY_LEN(all); i++)
		if (all[i]->data)
			kt_free(m->be, all[i]);
}

/* Attention block of layer l, which owns paged cache `cache`: q, k, v from
 * xn, into the cache, out to proj. */
static int attention_block(struct model *m, int l, const struct model_step *s, int cache,
			   const struct kt_tensor *xn, const struct kt_tensor *proj)
{
	const struct kt_batch *b = &s->batch;
	const struct model_config *c = &m->cfg;
	struct dense_model *dm = m->family_data;
	const struct dense_layer *w = &dm->layers[l];
	const struct dense_scratch *sc = &dm->s;
	struct kt_backend *be = m->be;
	const int T = b->n_tokens, hq = c->n_heads, hkv = c->n_kv_heads, d = c->head_dim;
	const struct kt_tensor q = kt_rows(sc->q, 0, T), k = kt_rows(sc->k, 0, T);
	const struct kt_tensor v = kt_rows(sc->v, 0, T), att = kt_rows(sc->att, 0, T);

	const struct kt_tensor *qkv[] = { &q, &k, &v }, *wqkv[] = { &w->wq, &w->wk, &w->wv };
	const struct kt_tensor *bqkv[] = { opt(&w->bq), opt(&w->bk), opt(&w->bv) };

	const struct kt_tensor qkv_all = w->wqkv.data ? kt_rows(sc->qkv, 0, T) : q;
	const struct kt_rope_store_args rs = {
		.qkv = w->wqkv.data ? &qkv_all : NULL, .q = &q, .k = &k, .v = &v,
		.inv_freq = &sc->inv_freq,
		.q_norm = c->qk_norm ? &w->q_norm : NULL, .k_norm = c->qk_norm ? &w->k_norm : NULL,
		.kcache = &s->kcache[cache], .vcache = &s->vcache[cache],
		.n_heads = hq, .n_kv_heads = hkv, .head_dim = d, .eps = c->rms_norm_eps,
		.attend_next = true,
	};

	if (w->wqkv.data)
		TRY(model_project(be, b, &qkv_all, xn, &w->wqkv, NULL));
	else
		TRY(model_project_n(be, b, 3, qkv, xn, wqkv, bqkv));
	TRY(kt_rope_store(be, &rs, b));
	TRY(model_attend(m, s, cache, &att, &q, hq, hkv, d, 1.0f / sqrtf((float)d)));
	TRY(model_project(be, b, proj, &att, &w->wo, opt(&w->bo)));
	return 0;
}

/* MLP block of layer l: SwiGLU of xn (or the layer's experts'), out to proj. */
static int mlp_block(struct model *m, int l, const struct kt_batch *b,
		     const struct kt_tensor *xn, const struct kt_tensor *proj)
{
	struct dense_model *dm = m->family_data;
	const struct dense_layer *w = &dm->layers[l];
	struct kt_backend *be = m->be;
	const int T = b->n_tokens;
	const struct kt_tensor gate = kt_rows(dm->s.gate, 0, T), up = kt_rows(dm->s.up, 0, T);
	const struct kt_tensor act = kt_rows(dm->s.act, 0, T);

	if (m->cfg.layers[l].mlp == MODEL_MLP_MOE)
		return moe_forward(m, &w->moe, &dm->moe, b, xn, proj);

	const struct kt_tensor *gu[] = { &gate, &up }, *wgu[] = { &w->w_gate, &w->w_up };
	const struct kt_tensor *bgu[] = { opt(&w->b_gate), opt(&w->b_up) };

	if (w->w_gate_up.data) {
		const struct kt_tensor gate_up = kt_rows(dm->s.gate_up, 0, T);

		TRY(model_project_swiglu(be, b, &act, &gate_up, xn, &w->w_gate_up));
	} else {
		TRY(model_project_n(be, b, 2, gu, xn, wgu, bgu));
		TRY(kt_swiglu(be, &act, &gate, &up));
	}
	TRY(model_project(be, b, proj, &act, &w->w_down, opt(&w->b_down)));
	return 0;
}

/* The decoder layers over the embedded rows in x: each block's input
 * normed into xn, or into xnb where the block's products take it in bf16;
 * the last block's output is left in proj. */
static int decoder_layers(struct model *m, const struct model_step *s,
			  const struct kt_tensor *x, const struct kt_tensor *xn,
			  const struct kt_tensor *proj)
{
	const struct model_config *c = &m->cfg;
	struct dense_model *dm = m->family_data;
	struct kt_backend *be = m->be;
	const float eps = c->rms_norm_eps;
	const struct kt_tensor xnb = dm->s.xnb.data ? kt_rows(dm->s.xnb, 0, s->batch.n_tokens)
						    : *xn;

	for (int l = 0; l < c->n_layers; l++) {
		const bool moe = c->layers[l].mlp == MODEL_MLP_MOE;
		const struct kt_tensor *mlp_in = moe ? xn : &xnb;

		/* xnb is read by the product after the norm only (q/k/v's, and
		 * gate/up's in a dense MLP), which may compute it instead; an
		 * MoE block's xn is read by the router and the experts */
		TRY(kt_rmsnorm_product(be, &xnb, x, l ? proj : NULL, &dm->layers[l].attn_norm,
				       eps));
		TRY(attention_block(m, l, s, c->layers[l].cache, &xnb, proj));
		if (moe)
			TRY(kt_rmsnorm(be, mlp_in, x, proj, &dm->layers[l].ffn_norm, eps));
		else
			TRY(kt_rmsnorm_product(be, mlp_in, x, proj, &dm->layers[l].ffn_norm, eps));
		TRY(mlp_block(m, l, &s->batch, mlp_in, proj));
	}
	return 0;
}

int dense_forward(struct model *m, const struct model_step *s)
{
	const struct model_config *c = &m->cfg;
	struct dense_model *dm = m->family_data;
	struct kt_backend *be = m->be;
	const struct kt_batch *b = &s->batch;
	const int T = b->n_tokens;
	const int64_t n_out = s->out_rows.rows;
	const float eps = c->rms_norm_eps;

	if (T <= 0 || T > m->max_tokens || s->ids.rows != T || n_out > m->max_out ||
	    s->logits.rows < n_out || s->logits.cols != c->vocab_size)
		return -EINVAL;

	const struct kt_tensor x = kt_rows(dm->s.x, 0, T), xn = kt_rows(dm->s.xn, 0, T);
	const struct kt_tensor proj = kt_rows(dm->s.proj, 0, T);
	const struct kt_tensor h_out = kt_rows(dm->s.out_h, 0, n_out);
	const struct kt_tensor out_logits = kt_rows(s->logits, 0, n_out);

	TRY(kt_embed(be, &x, &dm->embed, &s->ids));
	TRY(decoder_layers(m, s, &x, &xn, &proj));
	if (s->out_all && n_out == T && !s->hidden.data && dm->s.xnb.data) {
		/* Every row gives logits and only lm_head reads the last norm:
		 * in bf16 (its product rounds x to that anyway: the same bits),
		 * for the product to take, with no gather of the out rows. */
		const struct kt_tensor xnb = kt_rows(dm->s.xnb, 0, T);

		TRY(kt_rmsnorm_product(be, &xnb, &x, &proj, &dm->final_norm, eps));
		return kt_matmul(be, &out_logits, &xnb, &dm->lm_head, NULL);
	}
	/* The last norm: into s->hidden when an MTP head reads it. */
	const struct kt_tensor fin = s->hidden.data ? kt_rows(s->hidden, 0, T) : xn;
	TRY(kt_rmsnorm(be, &fin, &x, &proj, &dm->final_norm, eps));
	if (n_out == 0)
		return 0;
	if (s->out_all && n_out == T)
		return kt_matmul(be, &out_logits, &fin, &dm->lm_head, NULL);
	TRY(kt_gather_rows(be, &h_out, &fin, &s->out_rows));
	TRY(kt_matmul(be, &out_logits, &h_out, &dm->lm_head, NULL));
	return 0;
}

/* The MTP head: row t's input is the pair (s->hidden row t, the embedding
 * of ids[t]), each RMS-normed with its own weight, joined and projected
 * by fc to the residual stream; then the head's decoder layers and its
 * norm, whose out rows give s->hidden_out and the logits.
 *
 *   halves[0, T) = rmsnorm_e(embed(ids)), halves[M, M + T) = rmsnorm_h(hidden)
 *   x = fc · interleave(halves)          ([T, 2E] as one GEMM)
 *   per head layer: as the decoder's
 *   hidden_out = rmsnorm(x)[out_rows]; logits = lm_head · hidden_out */
int dense_head_forward(struct model *m, const struct model_step *s)
{
	const struct model_config *c = &m->cfg;
	struct dense_model *dm = m->family_data;
	const struct model_head_input *hd = dm->head;
	struct kt_backend *be = m->be;
	const struct kt_batch *b = &s->batch;
	const int T = b->n_tokens;
	const int64_t n_out = s->out_rows.rows;
	const float eps = c->rms_norm_eps;

	if (!hd)
		return -EINVAL;

	const struct kt_tensor x = kt_rows(dm->s.x, 0, T), xn = kt_rows(dm->s.xn, 0, T);
	const struct kt_tensor proj = kt_rows(dm->s.proj, 0, T);
	const struct kt_tensor h_out = s->hidden_out.data ? kt_rows(s->hidden_out, 0, n_out)
							  : kt_rows(dm->s.out_h, 0, n_out);
	const struct kt_tensor out_logits = kt_rows(s->logits, 0, n_out);

	TRY(model_head_input_run(m, hd, &dm->embed, s, &x));
	TRY(decoder_layers(m, s, &x, &xn, &proj));
	TRY(kt_rmsnorm(be, &xn, &x, &proj, &dm->final_norm, eps));
	if (n_out == 0)
		return 0;
	TRY(kt_gather_rows(be, &h_out, &xn, &s->out_rows));
	TRY(kt_matmul(be, &out_logits, &h_out, &dm->lm_head, NULL));
	return 0;
}
