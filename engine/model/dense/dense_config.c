/* config.json keys of the dense family, and its table entry. */
#include "engine/model/dense/dense.h"

#include <errno.h>
#include <stdlib.h>

#include "common/err.h"

/* max_position_embeddings when config.json has none, as transformers'
 * config classes default it. */
#define QWEN3_DEFAULT_MAX_POSITION 32768
#define LLAMA_DEFAULT_MAX_POSITION 2048


int dense_parse_config(const struct hf_json *f, int variant, struct model_config *c,
		       char *err, size_t errlen)
{
	if (!c->max_position_embeddings)
		c->max_position_embeddings = variant == DENSE_QWEN3 ? QWEN3_DEFAULT_MAX_POSITION
								    : LLAMA_DEFAULT_MAX_POSITION;
	const bool qwen3 = variant == DENSE_QWEN3 || variant == DENSE_QWEN3_MOE;
	c->qk_norm = qwen3;
	if (qwen3)
		c->mlp_bias = false; /* Qwen3's MLPs have no biases whatever the key says */
	for (int l = 0; l < c->n_layers; l++)
		c->layers[l] = (struct model_layer){ .mixer = MODEL_MIXER_ATTENTION,
						     .mlp = MODEL_MLP_DENSE, .cache = (int16_t)l };
	c->n_attention_layers = c->n_layers;
	return variant == DENSE_QWEN3_MOE ? moe_parse_config(f, c, err, errlen) : 0;
}

static int dense_load(struct model *m, char *err, size_t errlen)
{
	struct dense_model *d = calloc(1, sizeof *d);
	if (!d)
		return atlas_errf(err, errlen, -ENOMEM, "out of memory");
	m->family_data = d;
	int rc = dense_bind_weights(m, d, err, errlen);
	if (!rc)
		rc = dense_alloc_scratch(m, d, err, errlen);
	if (!rc && m->cfg.n_moe_layers)
		rc = moe_alloc_scratch(m, &d->moe, err, errlen);
	return rc;
}

static void dense_free(struct model *m)
{
	struct dense_model *d = m->family_data;
	if (!d)
		return;
	dense_free_scratch(m, d);
	moe_free_scratch(m, &d->moe);
	dense_head_free(m, d);
	free(d->layers);
	free(d);
	m->family_data = NULL;
}

const struct model_family dense_family = {
	.name = "dense",
	.parse_config = dense_parse_config,
	.load = dense_load,
	.free = dense_free,
	.forward = dense_forward,
	.head_load = dense_head_load,
	.head_forward = dense_head_forward,
};
