/* Binding the dense family's tensors by their Hugging Face names. */
#include "engine/model/dense/dense.h"

#include <errno.h>
#include <stdlib.h>

#include "common/err.h"

static int bind_attention(struct model *m, const char *pre, struct dense_layer *w, int l,
			  char *err, size_t errlen)
{
	const struct model_config *c = &m->cfg;
	const int64_t e = c->hidden_size, q = (int64_t)c->n_heads * c->head_dim;
	const int64_t kv = (int64_t)c->n_kv_heads * c->head_dim, d = c->head_dim;
	int rc;

	if ((rc = model_bind_layer(m, pre, l, &w->attn_norm, "input_layernorm.weight", 0, e, err,
				   errlen)) ||
	    (rc = model_bind_layer(m, pre, l, &w->wq, "self_attn.q_proj.weight", q, e, err, errlen)) ||
	    (rc = model_bind_layer(m, pre, l, &w->wk, "self_attn.k_proj.weight", kv, e, err, errlen)) ||
	    (rc = model_bind_layer(m, pre, l, &w->wv, "self_attn.v_proj.weight", kv, e, err, errlen)) ||
	    (rc = model_bind_layer(m, pre, l, &w->wo, "self_attn.o_proj.weight", e, q, err, errlen)))
		return rc;
	if (c->attention_bias &&
	    ((rc = model_bind_layer(m, pre, l, &w->bq, "self_attn.q_proj.bias", 0, q, err, errlen)) ||
	     (rc = model_bind_layer(m, pre, l, &w->bk, "self_attn.k_proj.bias", 0, kv, err, errlen)) ||
	     (rc = model_bind_layer(m, pre, l, &w->bv, "self_attn.v_proj.bias", 0, kv, err, errlen)) ||
	     (rc = model_bind_layer(m, pre, l, &w->bo, "self_attn.o_proj.bias", 0, e, err, errlen))))
		return rc;
	if (c->qk_norm &&
	    ((rc = model_bind_layer(m, pre, l, &w->q_norm, "self_attn.q_norm.weight", 0, d, err,
				    errlen)) ||
	     (rc = model_bind_layer(m, pre, l, &w->k_norm, "self_attn.k_norm.weight", 0, d, err,
				    errlen))))
		return rc;
	return 0;
}

static int bind_mlp(struct model *m, const char *pre, struct dense_layer *w, int l, char *err,
		    size_t errlen)
{
	const struct model_config *c = &m->cfg;
	const int64_t e = c->hidden_size, in = c->intermediate_size;
	int rc;

	if ((rc = model_bind_layer(m, pre, l, &w->ffn_norm, "post_attention_layernorm.weight", 0, e,
				   err, errlen)))
		return rc;
	if (c->layers[l].mlp == MODEL_MLP_MOE)
		return moe_bind_layer(m, pre, l, &w->moe, err, errlen);
	if ((rc = model_bind_layer(m, pre, l, &w->w_gate, "mlp.gate_proj.weight", in, e, err,
				   errlen)) ||
	    (rc = model_bind_layer(m, pre, l, &w->w_up, "mlp.up_proj.weight", in, e, err, errlen)) ||
	    (rc = model_bind_layer(m, pre, l, &w->w_down, "mlp.down_proj.weight", e, in, err, errlen)))
		return rc;
	if (c->mlp_bias &&
	    ((rc = model_bind_layer(m, pre, l, &w->b_gate, "mlp.gate_proj.bias", 0, in, err, errlen)) ||
	     (rc = model_bind_layer(m, pre, l, &w->b_up, "mlp.up_proj.bias", 0, in, err, errlen)) ||
	     (rc = model_bind_layer(m, pre, l, &w->b_down, "mlp.down_proj.bias", 0, e, err, errlen))))
		return rc;
	return 0;
}

int dense_bind_layer(struct model *m, const char *prefix, struct dense_layer *w, int l,
		     char *err, size_t errlen)
{
	int rc = bind_attention(m, prefix, w, l, err, errlen);
	return rc ? rc : bind_mlp(m, prefix, w, l, err, errlen);
}

int dense_bind_weights(struct model *m, struct dense_model *d, char *err, size_t errlen)
{
	const struct model_config *c = &m->cfg;
	int rc;

	d->layers = calloc((size_t)c->n_layers, sizeof *d->layers);
	if (!d->layers)
		return atlas_errf(err, errlen, -ENOMEM, "out of memory for %d layers", c->n_layers);
	if ((rc = model_bind(m, &d->embed, "model.embed_tokens.weight", c->vocab_size,
			     c->hidden_size, err, errlen)))
		return rc;
	for (int l = 0; l < c->n_layers; l++)
		if ((rc = dense_bind_layer(m, "model.layers", &d->layers[l], l, err, errlen)))
			return rc;
	if ((rc = model_bind(m, &d->final_norm, "model.norm.weight", 0, c->hidden_size, err,
			     errlen)))
		return rc;
	if (c->tie_word_embeddings)
		d->lm_head = d->embed;
	else if ((rc = model_bind(m, &d->lm_head, "lm_head.weight", c->vocab_size,
				  c->hidden_size, err, errlen)))
		return rc;
	if (!c->tie_word_embeddings)
		m->info.lookup_only_bytes = kt_nbytes(&d->embed);
	model_bind_done(m);
	return 0;
}
