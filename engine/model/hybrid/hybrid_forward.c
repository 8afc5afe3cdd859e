/* The forward pass of the hybrid family (hybrid.h), and its scratch.
 *
 * One step, all rows at once, read top to bottom:
 *
 *   x = embed(ids)
 *   per layer:  xn = rmsnorm(x += previous block's output)       (1 + w)
 *               linear attention (hybrid_gdn.c), or gated attention:
 *                 q, gate, k, v = xn · Wqᵀ, Wgateᵀ, Wkᵀ, Wvᵀ   (one matmul_n)
 *                 q, k = rotary of the first R dims after a per-head norm,
 *                 and k, v stored in the paged cache      (one rope_store)
 *                 att = attention(q, cache)
 *                 proj = (att · sigmoid(gate)) · Woᵀ
 *               xn = rmsnorm(x += proj)
 *               proj = SwiGLU MLP, or the experts' sum plus the shared
 *                      expert's output scaled by sigmoid(xn · Wshᵀ)
 *   logits = lm_head · rmsnorm(x += proj)[out_rows]
 *
 * Every buffer is a row view of the scratch sized at load: nothing is
 * allocated here.
 */
#include "engine/model/hybrid/hybrid.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "common/err.h"

#define TRY(op) do { int rc_ = (op); if (rc_) return rc_; } while (0)

int hybrid_alloc_scratch(struct model *m, struct hybrid_model *h, char *err, size_t errlen)
{
	const struct model_config *c = &m->cfg;
	const struct model_linear *g = &c->linear;
	struct hybrid_scratch *s = &h->s;
	const int64_t t = m->max_tokens, e = c->hidden_size;
	const int64_t q = (int64_t)c->n_heads * c->head_dim;
	const int64_t kv = (int64_t)c->n_kv_heads * c->head_dim;
	const int64_t vd = (int64_t)g->v_heads * g->v_dim;
	const int64_t ch = 2 * (int64_t)g->k_heads * g->k_dim + vd;
	const int64_t in = c->intermediate_size > c->shared_expert_intermediate_size
				   ? c->intermediate_size : c->shared_expert_intermediate_size;
	int rc;

	if ((rc = model_alloc(m, KT_F32, t, e, &s->x, "x", err, errlen)) ||
	    (rc = model_alloc(m, KT_F32, t, e, &s->xn, "xn", err, errlen)) ||
	    (rc = model_alloc(m, KT_F32, t, e, &s->proj, "proj", err, errlen)) ||
	    (rc = model_alloc(m, KT_F32, t, q, &s->q, "q", err, errlen)) ||
	    (rc = model_alloc(m, KT_F32, t, q, &s->gate, "gate", err, errlen)) ||
	    (rc = model_alloc(m, KT_F32, t, kv, &s->k, "k", err, errlen)) ||
	    (rc = model_alloc(m, KT_F32, t, kv, &s->v, "v", err, errlen)) ||
	    (rc = model_alloc(m, KT_F32, t, q, &s->att, "att", err, errlen)) ||
	    (rc = model_alloc(m, KT_F32, t, in, &s->mlp_gate, "mlp_gate", err, errlen)) ||
	    (rc = model_alloc(m, KT_F32, t, in, &s->mlp_up, "mlp_up", err, errlen)) ||
	    (rc = model_alloc(m, KT_F32, t, e, &s->shared, "shared", err, errlen)) ||
	    (rc = model_alloc(m, KT_F32, t, 1, &s->sh_logit, "sh_logit", err, errlen)) ||
	    (rc = model_alloc(m, KT_F32, m->max_out, e, &s->out_h, "out_h", err, errlen)))
		return rc;
	if (c->n_linear_layers &&
	    ((rc = model_alloc(m, KT_F32, t, ch, &s->qkv, "qkv", err, errlen)) ||
	     (rc = model_alloc(m, KT_F32, t, ch, &s->conv, "conv", err, errlen)) ||
	     (rc = model_alloc(m, KT_F32, t, vd, &s->z, "z", err, errlen)) ||
	     (rc = model_alloc(m, KT_F32, t, vd, &s->o, "o", err, errlen)) ||
	     (rc = model_alloc(m, KT_F32, t, 2 * (int64_t)g->v_heads, &s->ba, "ba", err, errlen))))
		return rc;

	return model_rope_table(m, &s->inv_freq, err, errlen);
}

void hybrid_free_scratch(struct model *m, struct hybrid_model *h)
{
	struct hybrid_scratch *s = &h->s;
	struct kt_tensor *all[] = { &s->x, &s->xn, &s->proj, &s->q, &s->gate, &s->k, &s->v,
				    &s->att, &s->qkv, &s->conv, &s->z, &s->o, &s->ba,
				    &s->mlp_gate, &s->mlp_up, &s->shared, &s->sh_logit, &s->out_h,
				    &s->inv_freq };
	for (size_t i = 0; i < ATLAS_ARRAY_LEN(all); i++)
		if (all[i]->data)
			kt_free(m->be, all[i]);
}

int hybrid_attention_block(struct model *m, int l, const struct model_step *s,
			   const struct kt_tensor *xn, const struct kt_tensor *proj)
{
	const struct kt_batch *b = &s->batch;
	const struct model_config *c = &m->cfg;
	struct hybrid_model *hm = m->family_data;
	const struct hybrid_attention *w = &hm->layers[l].att;
	const struct hybrid_scratch *sc = &hm->s;
	struct kt_backend *be = m->be;
	const int T = b->n_tokens, hq = c->n_heads, hkv = c->n_kv_heads, d = c->head_dim;
	const struct kt_tensor q = kt_rows(sc->q, 0, T), gate = kt_rows(sc->gate, 0, T);
	const struct kt_tensor k = kt_rows(sc->k, 0, T), v = kt_rows(sc->v, 0, T);
	const struct kt_tensor att = kt_rows(sc->att, 0, T);
	const int cache = c->layers[l].cache;
	const struct kt_tensor *ys[] = { &q, &gate, &k, &v };
	const struct kt_tensor *ws[] = { &w->wq, &w->wgate, &w->wk, &w->wv };
	const struct kt_rope_store_args rs = {
		.q = &q, .k = &k, .v = &v, .inv_freq = &sc->inv_freq,
		.q_norm = &w->q_norm, .k_norm = &w->k_norm,
		.kcache = &s->kcache[cache], .vcache = &s->vcache[cache],
		.n_heads = hq, .n_kv_heads = hkv, .head_dim = d, .eps = c->rms_norm_eps,
		.attend_next = true,
	};

	TRY(model_project_n(be, b, 4, ys, xn, ws, NULL));
	TRY(kt_rope_store(be, &rs, b));
	TRY(model_attend(m, s, cache, &att, &q, hq, hkv, d, 1.0f / sqrtf((float)d)));
	TRY(kt_sigmoid_mul(be, &att, &att, &gate));
	return model_project(be, b, proj, &att, &w->wo, NULL);
}

/* SwiGLU of xn through w_gate, w_up, w_down into out. */
static int swiglu_mlp(struct model *m, const struct hybrid_layer *w, const struct kt_batch *b,
		      const struct kt_tensor *xn, const struct kt_tensor *out)
{
	struct hybrid_model *hm = m->family_data;
	struct kt_backend *be = m->be;
	const int T = b->n_tokens;
	const int64_t in = w->w_gate.rows;
	const struct kt_tensor gate = kt_reshape(kt_rows(hm->s.mlp_gate, 0, T), T, in);
	const struct kt_tensor up = kt_reshape(kt_rows(hm->s.mlp_up, 0, T), T, in);

	TRY(model_project(be, b, &gate, xn, &w->w_gate, NULL));
	TRY(model_project(be, b, &up, xn, &w->w_up, NULL));
	TRY(kt_swiglu(be, &gate, &gate, &up));
	return model_project(be, b, out, &gate, &w->w_down, NULL);
}

int hybrid_mlp_block(struct model *m, int l, const struct kt_batch *b,
		     const struct kt_tensor *xn, const struct kt_tensor *proj)
{
	struct hybrid_model *hm = m->family_data;
	const struct hybrid_layer *w = &hm->layers[l];
	struct kt_backend *be = m->be;
	const int T = b->n_tokens;

	if (m->cfg.layers[l].mlp != MODEL_MLP_MOE)
		return swiglu_mlp(m, w, b, xn, proj);
	TRY(moe_forward(m, &w->moe, &hm->moe, b, xn, proj));
	if (!w->w_gate.data)
		return 0;
	/* The shared expert, gated per token; added after the experts' sum. */
	const struct kt_tensor shared = kt_rows(hm->s.shared, 0, T);
	const struct kt_tensor logit = kt_rows(hm->s.sh_logit, 0, T);
	TRY(swiglu_mlp(m, w, b, xn, &shared));
	TRY(model_project(be, b, &logit, xn, &w->sh_gate, NULL));
	TRY(kt_sigmoid_mul(be, &shared, &shared, &logit));
	return kt_add(be, proj, &shared);
}

int hybrid_forward(struct model *m, const struct model_step *s)
{
	const struct model_config *c = &m->cfg;
	struct hybrid_model *hm = m->family_data;
	struct kt_backend *be = m->be;
	const struct kt_batch *b = &s->batch;
	const int T = b->n_tokens;
	const int64_t n_out = s->out_rows.rows;
	const float eps = c->rms_norm_eps;

	if (T <= 0 || T > m->max_tokens || s->ids.rows != T || n_out > m->max_out ||
	    s->logits.rows < n_out || s->logits.cols != c->vocab_size ||
	    (c->n_linear_layers && (!s->state || s->state_slot.rows != T)))
		return -EINVAL;

	const struct kt_tensor x = kt_rows(hm->s.x, 0, T), xn = kt_rows(hm->s.xn, 0, T);
	const struct kt_tensor proj = kt_rows(hm->s.proj, 0, T);
	const struct kt_tensor h_out = kt_rows(hm->s.out_h, 0, n_out);
	const struct kt_tensor out_logits = kt_rows(s->logits, 0, n_out);

	TRY(kt_embed(be, &x, &hm->embed, &s->ids));
	for (int l = 0; l < c->n_layers; l++) {
		TRY(kt_rmsnorm(be, &xn, &x, l ? &proj : NULL, &hm->layers[l].attn_norm, eps));
		TRY(c->layers[l].mixer == MODEL_MIXER_LINEAR
			    ? hybrid_linear_block(m, l, s, &xn, &proj)
			    : hybrid_attention_block(m, l, s, &xn, &proj));
		TRY(kt_rmsnorm(be, &xn, &x, &proj, &hm->layers[l].ffn_norm, eps));
		TRY(hybrid_mlp_block(m, l, b, &xn, &proj));
	}
	/* The last norm: into s->hidden when an MTP head reads it. */
	const struct kt_tensor fin = s->hidden.data ? kt_rows(s->hidden, 0, T) : xn;
	TRY(kt_rmsnorm(be, &fin, &x, &proj, &hm->final_norm, eps));
	if (n_out == 0)
		return 0;
	if (s->out_all && n_out == T) /* every row, in order: fin is the out rows */
		return kt_matmul(be, &out_logits, &fin, &hm->lm_head, NULL);
	TRY(kt_gather_rows(be, &h_out, &fin, &s->out_rows));
	return kt_matmul(be, &out_logits, &h_out, &hm->lm_head, NULL);
}
