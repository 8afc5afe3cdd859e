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

	static const char *const qkv_names[] = { "self_attn.q_proj.weight",
						 "self_attn.k_proj.weight",
						 "self_attn.v_proj.weight" };
	const int64_t qkv_rows[] = { q, kv, kv };

	if ((rc = model_bind_layer(m, pre, l, &w->attn_norm, "input_layernorm.weight", 0, e, err,
				   errlen)) ||
	    (rc = model_bind_layer(m, pre, l, &w->wo, "self_attn.o_proj.weight", e, q, err, errlen)))
		return rc;
	/* Stacked, so that one product makes q, k and v; a model with biases
	 * keeps them apart (one product would need one bias). */
	if (!c->attention_bias) {
		if ((rc = model_bind_joined(m, &w->wqkv, pre, l, qkv_names, qkv_rows, 3, e, err,
					     errlen)))
			return rc;
		w->wq = kt_rows(w->wqkv, 0, q);
		w->wk = kt_rows(w->wqkv, q, kv);
		w->wv = kt_rows(w->wqkv, q + kv, kv);
	} else if ((rc = model_bind_layer(m, pre, l, &w->wq, qkv_names[0], q, e, err, errlen)) ||
		   (rc = model_bind_layer(m, pre, l, &w->wk, qkv_names[1], kv, e, err, errlen)) ||
		   (rc = model_bind_layer(m, pre, l, &w->wv, qkv_names[2], kv, e, err, errlen))) {
		return rc;
	}
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
	static const char *const gate_up_names[] = { "mlp.gate_proj.weight", "mlp.up_proj.weight" };
	const int64_t gate_up_rows[] = { in, in };

	if ((rc = model_bind_layer(m, pre, l, &w->w_down, "mlp.down_proj.weight", e, in, err,
				   errlen)))
		return rc;
	/* Stacked for one product, as q, k and v are. */
	if (!c->mlp_bias) {
		if ((rc = model_bind_joined(m, &w->w_gate_up, pre, l, gate_up_names, gate_up_rows,
					    2, e, err, errlen)))
			return rc;
		w->w_gate = kt_rows(w->w_gate_up, 0, in);
		w->w_up = kt_rows(w->w_gate_up, in, in);
	} else if ((rc = model_bind_layer(m, pre, l, &w->w_gate, gate_up_names[0], in, e, err,
					  errlen)) ||
		   (rc = model_bind_layer(m, pre, l, &w->w_up, gate_up_names[1], in, e, err,
					  errlen))) {
		return rc;
	}
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
