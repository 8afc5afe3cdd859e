/* The dense family's multi-token-prediction head (model_load_head), as
 * Qwen3-Next and Qwen3.5 checkpoints lay it out beside the decoder:
 *
 *   mtp.pre_fc_norm_embedding.weight  [E]      norm of the next token's embedding
 *   mtp.pre_fc_norm_hidden.weight     [E]      norm of the model's final hidden row
 *   mtp.fc.weight                     [E, 2E]  the joined pair to the residual stream
 *   mtp.layers.<j>.*                           decoder layers, named as the model's
 *   mtp.norm.weight                   [E]      the head's final norm
 *
 * with the model's embedding and output head (tied or not). The head is a
 * struct model of its own: its cfg lists only its layers, each full
 * attention with a KV cache of its own, so that an executor sizes a KV
 * pool for it as for any model. dense_forward.c runs it.
 */
#include "engine/model/dense/dense.h"

#include <errno.h>
#include <stdlib.h>

#include "common/err.h"

/* The head's layers are the config's layers from now on. */
static void head_layers(struct model_config *c)
{
	c->n_layers = c->n_mtp_layers;
	for (int l = 0; l < c->n_layers; l++)
		c->layers[l] = (struct model_layer){ .mixer = MODEL_MIXER_ATTENTION,
						     .mlp = MODEL_MLP_DENSE, .cache = (int16_t)l };
	c->n_attention_layers = c->n_layers;
	c->n_linear_layers = 0;
	c->linear_state_floats = 0;
}

static int bind_head(struct model *m, struct dense_model *d, char *err, size_t errlen)
{
	const struct model_config *c = &m->cfg;
	const int64_t e = c->hidden_size;
	struct model_head_input *h = d->head;
	int rc;

	d->layers = calloc((size_t)c->n_layers, sizeof *d->layers);
	if (!d->layers)
		return atlas_errf(err, errlen, -ENOMEM, "out of memory");
	if ((rc = model_bind(m, &d->embed, "model.embed_tokens.weight", c->vocab_size, e, err,
			     errlen)) ||
	    (rc = model_bind(m, &h->norm_e, "mtp.pre_fc_norm_embedding.weight", 0, e, err,
			     errlen)) ||
	    (rc = model_bind(m, &h->norm_h, "mtp.pre_fc_norm_hidden.weight", 0, e, err,
			     errlen)) ||
	    (rc = model_bind(m, &h->fc, "mtp.fc.weight", e, 2 * e, err, errlen)) ||
	    (rc = model_bind(m, &d->final_norm, "mtp.norm.weight", 0, e, err, errlen)))
		return rc;
	for (int l = 0; l < c->n_layers; l++)
		if ((rc = dense_bind_layer(m, "mtp.layers", &d->layers[l], l, err, errlen)))
			return rc;
	if (c->tie_word_embeddings)
		d->lm_head = d->embed;
	else if ((rc = model_bind(m, &d->lm_head, "lm_head.weight", c->vocab_size, e, err,
				  errlen)))
		return rc;
	model_bind_done(m);
	return 0;
}

int dense_head_load(struct model *m, char *err, size_t errlen)
{
	struct dense_model *d = calloc(1, sizeof *d);
	if (!d)
		return atlas_errf(err, errlen, -ENOMEM, "out of memory");
	m->family_data = d;
	if (!(d->head = calloc(1, sizeof *d->head)))
		return atlas_errf(err, errlen, -ENOMEM, "out of memory");
	head_layers(&m->cfg);
	int rc = bind_head(m, d, err, errlen);
	if (!rc)
		rc = dense_alloc_scratch(m, d, err, errlen);
	return rc ? rc : model_head_input_alloc(m, d->head, err, errlen);
}

void dense_head_free(struct model *m, struct dense_model *d)
{
	if (!d->head)
		return;
	model_head_input_free(m, d->head);
	free(d->head);
	d->head = NULL;
}
