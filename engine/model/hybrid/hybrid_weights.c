/* Binding the hybrid family's tensors by their Hugging Face names, both
 * checkpoint layouts into one set of products (hybrid.h):
 *
 *   Qwen3-Next  linear_attn.in_proj_qkvz [Hk * (2dk + 2r·dv), E] holds per
 *               key head g its q, k, then the r = Hv / Hk value heads' v and
 *               z rows; in_proj_ba [Hk * 2r, E] per key head its r b rows,
 *               then its r a rows. Regrouped here into w_qkv (all q, all k,
 *               all v: the conv's channel order), w_z and w_ba.
 *   Qwen3.5     in_proj_qkv, in_proj_z, in_proj_b, in_proj_a: already so.
 *
 * Gated attention's q_proj [Hq * 2D, E] holds per head its D query rows,
 * then its D gate rows; split into wq and wgate. The zero-centred norms are
 * held as 1 + w in f32. A Qwen3.5 checkpoint of the vision-language model
 * keeps the text model under model.language_model.
 */
#include "engine/model/hybrid/hybrid.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/err.h"

#define TRY(op) do { int rc_ = (op); if (rc_) return rc_; } while (0)

static int bind_f32(struct model *m, const char *pre, int l, struct kt_tensor *dst,
		    const char *suffix, int64_t cols, float add, char *err, size_t errlen)
{
	char name[160];
	snprintf(name, sizeof name, "%s.%d.%s", pre, l, suffix);
	return model_bind_f32(m, dst, name, cols, add, err, errlen);
}

static int bind_rows(struct model *m, const char *pre, int l, struct kt_tensor *dst,
		     const char *suffix, int64_t full_rows, int64_t cols, const int64_t *row0,
		     const int64_t *n, int n_runs, char *err, size_t errlen)
{
	char name[160];
	snprintf(name, sizeof name, "%s.%d.%s", pre, l, suffix);
	return model_bind_rows(m, dst, name, full_rows, cols, row0, n, n_runs, err, errlen);
}

/* Qwen3-Next's grouped projections regrouped: per key head g of the
 * in_proj_qkvz rows, its q at g·G, k at g·G + dk, v at g·G + 2dk, z at
 * g·G + 2dk + r·dv (G = 2dk + 2r·dv); of in_proj_ba, b at g·2r, a at
 * g·2r + r. */
static int bind_grouped(struct model *m, const char *pre, int l, struct hybrid_linear *w,
			char *err, size_t errlen)
{
	const struct model_linear *g = &m->cfg.linear;
	const int64_t e = m->cfg.hidden_size, hk = g->k_heads, r = g->v_heads / g->k_heads;
	const int64_t dk = g->k_dim, rv = r * g->v_dim, G = 2 * dk + 2 * rv;
	int64_t *row0 = malloc((size_t)(3 * hk) * sizeof *row0);
	int64_t *n = malloc((size_t)(3 * hk) * sizeof *n);
	int rc = -ENOMEM;

	if (!row0 || !n) {
		free(row0);
		free(n);
		return atlas_errf(err, errlen, -ENOMEM, "out of memory");
	}
	for (int64_t i = 0; i < hk; i++) {  /* q heads, k heads, v heads */
		row0[i] = i * G;
		row0[hk + i] = i * G + dk;
		row0[2 * hk + i] = i * G + 2 * dk;
		n[i] = n[hk + i] = dk;
		n[2 * hk + i] = rv;
	}
	rc = bind_rows(m, pre, l, &w->w_qkv, "linear_attn.in_proj_qkvz.weight", hk * G, e, row0,
		       n, (int)(3 * hk), err, errlen);
	for (int64_t i = 0; !rc && i < hk; i++) {  /* z */
		row0[i] = i * G + 2 * dk + rv;
		n[i] = rv;
	}
	if (!rc)
		rc = bind_rows(m, pre, l, &w->w_z, "linear_attn.in_proj_qkvz.weight", hk * G, e,
			       row0, n, (int)hk, err, errlen);
	for (int64_t i = 0; !rc && i < hk; i++) {  /* b heads, then a heads */
		row0[i] = i * 2 * r;
		row0[hk + i] = i * 2 * r + r;
		n[i] = n[hk + i] = r;
	}
	if (!rc)
		rc = bind_rows(m, pre, l, &w->w_ba, "linear_attn.in_proj_ba.weight", hk * 2 * r, e,
			       row0, n, (int)(2 * hk), err, errlen);
	free(row0);
	free(n);
	return rc;
}

/* Qwen3.5's separate projections; b and a stacked into w_ba. */
static int bind_separate(struct model *m, const char *pre, int l, struct hybrid_linear *w,
			 char *err, size_t errlen)
{
	const struct model_linear *g = &m->cfg.linear;
	const int64_t e = m->cfg.hidden_size, hv = g->v_heads;
	const int64_t ch = 2 * (int64_t)g->k_heads * g->k_dim + hv * g->v_dim;
	struct model_part parts[2];

	TRY(model_bind_layer(m, pre, l, &w->w_qkv, "linear_attn.in_proj_qkv.weight", ch, e, err,
			     errlen));
	TRY(model_bind_layer(m, pre, l, &w->w_z, "linear_attn.in_proj_z.weight", hv * g->v_dim, e,
			     err, errlen));
	snprintf(parts[0].name, sizeof parts[0].name, "%s.%d.linear_attn.in_proj_b.weight", pre, l);
	snprintf(parts[1].name, sizeof parts[1].name, "%s.%d.linear_attn.in_proj_a.weight", pre, l);
	for (int i = 0; i < 2; i++)
		parts[i].slice = -1, parts[i].row0 = 0;
	return model_bind_stack(m, &w->w_ba, "linear_attn.in_proj_b and in_proj_a", parts, 2, 0,
				hv, e, err, errlen);
}

static int bind_linear(struct model *m, int variant, const char *pre, int l,
		       struct hybrid_linear *w, char *err, size_t errlen)
{
	const struct model_linear *g = &m->cfg.linear;
	const int64_t e = m->cfg.hidden_size, hv = g->v_heads, vd = hv * g->v_dim;
	const int64_t ch = 2 * (int64_t)g->k_heads * g->k_dim + vd;

	TRY(variant == HYBRID_QWEN3_NEXT ? bind_grouped(m, pre, l, w, err, errlen)
					 : bind_separate(m, pre, l, w, err, errlen));
	TRY(model_bind_layer(m, pre, l, &w->conv, "linear_attn.conv1d.weight", ch, g->conv_kernel,
			     err, errlen));
	TRY(bind_f32(m, pre, l, &w->a_log, "linear_attn.A_log", hv, 0.0f, err, errlen));
	TRY(bind_f32(m, pre, l, &w->dt_bias, "linear_attn.dt_bias", hv, 0.0f, err, errlen));
	TRY(model_bind_layer(m, pre, l, &w->norm, "linear_attn.norm.weight", 0, g->v_dim, err,
			     errlen));
	return model_bind_layer(m, pre, l, &w->w_out, "linear_attn.out_proj.weight", e, vd, err,
				errlen);
}

static int bind_attention(struct model *m, const char *pre, int l, struct hybrid_attention *w,
			  char *err, size_t errlen)
{
	const struct model_config *c = &m->cfg;
	const int64_t e = c->hidden_size, hq = c->n_heads, d = c->head_dim;
	const int64_t kv = (int64_t)c->n_kv_heads * d;
	int64_t *row0 = malloc((size_t)hq * sizeof *row0), *n = malloc((size_t)hq * sizeof *n);
	int rc;

	if (!row0 || !n) {
		free(row0);
		free(n);
		return atlas_errf(err, errlen, -ENOMEM, "out of memory");
	}
	for (int64_t h = 0; h < hq; h++) {
		row0[h] = 2 * h * d;
		n[h] = d;
	}
	rc = bind_rows(m, pre, l, &w->wq, "self_attn.q_proj.weight", 2 * hq * d, e, row0, n,
		       (int)hq, err, errlen);
	for (int64_t h = 0; h < hq; h++)
		row0[h] = 2 * h * d + d;
	if (!rc)
		rc = bind_rows(m, pre, l, &w->wgate, "self_attn.q_proj.weight", 2 * hq * d, e, row0,
			       n, (int)hq, err, errlen);
	free(row0);
	free(n);
	TRY(rc);
	TRY(model_bind_layer(m, pre, l, &w->wk, "self_attn.k_proj.weight", kv, e, err, errlen));
	TRY(model_bind_layer(m, pre, l, &w->wv, "self_attn.v_proj.weight", kv, e, err, errlen));
	TRY(model_bind_layer(m, pre, l, &w->wo, "self_attn.o_proj.weight", e, hq * d, err, errlen));
	TRY(bind_f32(m, pre, l, &w->q_norm, "self_attn.q_norm.weight", d, 1.0f, err, errlen));
	return bind_f32(m, pre, l, &w->k_norm, "self_attn.k_norm.weight", d, 1.0f, err, errlen);
}

static int bind_mlp(struct model *m, const char *pre, int l, struct hybrid_layer *w, char *err,
		    size_t errlen)
{
	const struct model_config *c = &m->cfg;
	const int64_t e = c->hidden_size;
	const bool moe = c->layers[l].mlp == MODEL_MLP_MOE;
	const int64_t in = moe ? c->shared_expert_intermediate_size : c->intermediate_size;
	const char *mlp = moe ? "mlp.shared_expert" : "mlp";
	char name[64];

	if (moe)
		TRY(moe_bind_layer(m, pre, l, &w->moe, err, errlen));
	if (!in)
		return 0;
	snprintf(name, sizeof name, "%s.gate_proj.weight", mlp);
	TRY(model_bind_layer(m, pre, l, &w->w_gate, name, in, e, err, errlen));
	snprintf(name, sizeof name, "%s.up_proj.weight", mlp);
	TRY(model_bind_layer(m, pre, l, &w->w_up, name, in, e, err, errlen));
	snprintf(name, sizeof name, "%s.down_proj.weight", mlp);
	TRY(model_bind_layer(m, pre, l, &w->w_down, name, e, in, err, errlen));
	if (moe)
		TRY(model_bind_layer(m, pre, l, &w->sh_gate, "mlp.shared_expert_gate.weight", 1, e,
				     err, errlen));
	return 0;
}

int hybrid_bind_layer(struct model *m, int variant, const char *prefix, struct hybrid_layer *w,
		      int l, char *err, size_t errlen)
{
	const int64_t e = m->cfg.hidden_size;

	TRY(bind_f32(m, prefix, l, &w->attn_norm, "input_layernorm.weight", e, 1.0f, err, errlen));
	TRY(m->cfg.layers[l].mixer == MODEL_MIXER_LINEAR
		    ? bind_linear(m, variant, prefix, l, &w->lin, err, errlen)
		    : bind_attention(m, prefix, l, &w->att, err, errlen));
	TRY(bind_f32(m, prefix, l, &w->ffn_norm, "post_attention_layernorm.weight", e, 1.0f, err,
		     errlen));
	return bind_mlp(m, prefix, l, w, err, errlen);
}

/* The text model's prefix: model, or model.language_model in a Qwen3.5
 * vision-language checkpoint. */
static const char *text_prefix(struct model *m)
{
	if (m->st && !st_find(m->st, "model.embed_tokens.weight") &&
	    st_find(m->st, "model.language_model.embed_tokens.weight"))
		return "model.language_model";
	return "model";
}

int hybrid_bind_weights(struct model *m, struct hybrid_model *h, char *err, size_t errlen)
{
	const struct model_config *c = &m->cfg;
	const struct model_arch *row = model_arch_find(c->architecture, NULL);
	const char *pre = text_prefix(m);
	char name[96], layers[80];

	h->layers = calloc((size_t)c->n_layers, sizeof *h->layers);
	if (!h->layers || !row)
		return atlas_errf(err, errlen, -ENOMEM, "out of memory for %d layers", c->n_layers);
	snprintf(name, sizeof name, "%s.embed_tokens.weight", pre);
	TRY(model_bind(m, &h->embed, name, c->vocab_size, c->hidden_size, err, errlen));
	snprintf(layers, sizeof layers, "%s.layers", pre);
	for (int l = 0; l < c->n_layers; l++)
		TRY(hybrid_bind_layer(m, row->variant, layers, &h->layers[l], l, err, errlen));
	snprintf(name, sizeof name, "%s.norm.weight", pre);
	TRY(model_bind_f32(m, &h->final_norm, name, c->hidden_size, 1.0f, err, errlen));
	if (c->tie_word_embeddings)
		h->lm_head = h->embed;
	else
		TRY(model_bind(m, &h->lm_head, "lm_head.weight", c->vocab_size, c->hidden_size, err,
			       errlen));
	if (!c->tie_word_embeddings)
		m->info.lookup_only_bytes = kt_nbytes(&h->embed);
	model_bind_done(m);
	return 0;
}
