/* config.json keys of the hybrid family, and its table entry. */
#include "engine/model/hybrid/hybrid.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/model/hf_json.h"

/* What transformers' Qwen3NextConfig defaults the keys to when absent. */
#define HYBRID_DEFAULT_MAX_POSITION 32768
#define HYBRID_DEFAULT_FULL_INTERVAL 4
#define HYBRID_DEFAULT_K_HEADS 16
#define HYBRID_DEFAULT_V_HEADS 32
#define HYBRID_DEFAULT_HEAD_DIM 128
#define HYBRID_DEFAULT_CONV_KERNEL 4
/* The widest conv the kernels keep in registers. */
#define HYBRID_MAX_CONV_KERNEL 8

/* Which layers are full attention: layer_types (a list of "linear_attention"
 * and "full_attention"), else every full_attention_interval-th layer. */
static int parse_layer_types(const struct hf_json *f, struct model_config *c, char *err,
			     size_t errlen)
{
	json_t *types = hf_get(f->root, "layer_types");
	int interval, rc;

	if (types) {
		if (!json_is_array(types) || (int)json_array_size(types) != c->n_layers)
			return atlas_errf(err, errlen, -EINVAL,
					  "%s: key layer_types: want a list of %d layer types",
					  f->path, c->n_layers);
		for (int l = 0; l < c->n_layers; l++) {
			const char *t = json_string_value(json_array_get(types, (size_t)l));
			if (!t || (strcmp(t, "linear_attention") && strcmp(t, "full_attention")))
				return atlas_errf(err, errlen, -ENOTSUP,
						  "%s: key layer_types: entry %d: %s is not "
						  "linear_attention or full_attention", f->path, l,
						  t ? t : "(not a string)");
			c->layers[l].mixer = strcmp(t, "full_attention") ? MODEL_MIXER_LINEAR
									 : MODEL_MIXER_ATTENTION;
		}
		return 0;
	}
	if ((rc = hf_int(f, f->root, "full_attention_interval", false,
			 HYBRID_DEFAULT_FULL_INTERVAL, &interval, err, errlen)))
		return rc;
	if (interval < 1)
		return atlas_errf(err, errlen, -EINVAL,
				  "%s: key full_attention_interval: must be positive", f->path);
	for (int l = 0; l < c->n_layers; l++)
		c->layers[l].mixer = (l + 1) % interval ? MODEL_MIXER_LINEAR
							: MODEL_MIXER_ATTENTION;
	return 0;
}

static int parse_linear(const struct hf_json *f, struct model_config *c, char *err,
			size_t errlen)
{
	struct model_linear *g = &c->linear;
	json_t *r = f->root;
	int rc;

	if ((rc = hf_int(f, r, "linear_num_key_heads", false, HYBRID_DEFAULT_K_HEADS, &g->k_heads,
			 err, errlen)) ||
	    (rc = hf_int(f, r, "linear_num_value_heads", false, HYBRID_DEFAULT_V_HEADS,
			 &g->v_heads, err, errlen)) ||
	    (rc = hf_int(f, r, "linear_key_head_dim", false, HYBRID_DEFAULT_HEAD_DIM, &g->k_dim,
			 err, errlen)) ||
	    (rc = hf_int(f, r, "linear_value_head_dim", false, HYBRID_DEFAULT_HEAD_DIM, &g->v_dim,
			 err, errlen)) ||
	    (rc = hf_int(f, r, "linear_conv_kernel_dim", false, HYBRID_DEFAULT_CONV_KERNEL,
			 &g->conv_kernel, err, errlen)))
		return rc;
	if (g->k_heads <= 0 || g->v_heads <= 0 || g->v_heads % g->k_heads)
		return atlas_errf(err, errlen, -EINVAL,
				  "%s: keys linear_num_key_heads %d, linear_num_value_heads %d: "
				  "the value heads must be a positive multiple of the key heads",
				  f->path, g->k_heads, g->v_heads);
	if (g->k_dim <= 0 || g->v_dim <= 0)
		return atlas_errf(err, errlen, -EINVAL,
				  "%s: keys linear_key_head_dim, linear_value_head_dim: must be "
				  "positive", f->path);
	if (g->conv_kernel < 2 || g->conv_kernel > HYBRID_MAX_CONV_KERNEL)
		return atlas_errf(err, errlen, -ENOTSUP,
				  "%s: key linear_conv_kernel_dim: %d is not in [2, %d]", f->path,
				  g->conv_kernel, HYBRID_MAX_CONV_KERNEL);
	const int64_t channels = 2 * (int64_t)g->k_heads * g->k_dim + (int64_t)g->v_heads * g->v_dim;
	c->linear_state_floats = (int64_t)(g->conv_kernel - 1) * channels +
				 (int64_t)g->v_heads * g->k_dim * g->v_dim;
	return 0;
}

int hybrid_parse_config(const struct hf_json *f, int variant, struct model_config *c,
			char *err, size_t errlen)
{
	int rc;

	if (!c->max_position_embeddings)
		c->max_position_embeddings = HYBRID_DEFAULT_MAX_POSITION;
	if (c->attention_bias)
		return atlas_errf(err, errlen, -ENOTSUP,
				  "%s: key attention_bias: %s has no attention biases", f->path,
				  c->architecture);
	c->qk_norm = true;
	c->mlp_bias = false;
	for (int l = 0; l < c->n_layers; l++)
		c->layers[l] = (struct model_layer){ .mlp = MODEL_MLP_DENSE };
	if ((rc = parse_layer_types(f, c, err, errlen)) || (rc = parse_linear(f, c, err, errlen)))
		return rc;
	c->n_attention_layers = c->n_linear_layers = 0;
	for (int l = 0; l < c->n_layers; l++)
		c->layers[l].cache = (int16_t)(c->layers[l].mixer == MODEL_MIXER_ATTENTION
					       ? c->n_attention_layers++ : c->n_linear_layers++);
	if (!c->n_linear_layers)
		c->linear_state_floats = 0;
	if (variant == HYBRID_QWEN35)
		return 0;
	if ((rc = moe_parse_config(f, c, err, errlen)))
		return rc;
	/* Qwen3.5's MoE configuration has no norm_topk_prob: its router always
	 * divides the top k by their sum. */
	if (variant == HYBRID_QWEN35_MOE && !hf_get(f->root, "norm_topk_prob"))
		c->norm_topk_prob = true;
	if ((rc = hf_int(f, f->root, "shared_expert_intermediate_size", false, 0,
			 &c->shared_expert_intermediate_size, err, errlen)))
		return rc;
	if (c->shared_expert_intermediate_size < 0)
		return atlas_errf(err, errlen, -EINVAL,
				  "%s: key shared_expert_intermediate_size: must not be negative",
				  f->path);
	return 0;
}

static int hybrid_load(struct model *m, char *err, size_t errlen)
{
	struct hybrid_model *h = calloc(1, sizeof *h);
	if (!h)
		return atlas_errf(err, errlen, -ENOMEM, "out of memory");
	m->family_data = h;
	int rc = hybrid_bind_weights(m, h, err, errlen);
	if (!rc)
		rc = hybrid_alloc_scratch(m, h, err, errlen);
	if (!rc && m->cfg.n_moe_layers)
		rc = moe_alloc_scratch(m, &h->moe, err, errlen);
	return rc;
}

static void hybrid_free(struct model *m)
{
	struct hybrid_model *h = m->family_data;
	if (!h)
		return;
	hybrid_free_scratch(m, h);
	moe_free_scratch(m, &h->moe);
	hybrid_head_free(m, h);
	free(h->layers);
	free(h);
	m->family_data = NULL;
}

const struct model_family hybrid_family = {
	.name = "hybrid",
	.parse_config = hybrid_parse_config,
	.load = hybrid_load,
	.free = hybrid_free,
	.forward = hybrid_forward,
	.head_load = hybrid_head_load,
	.head_forward = hybrid_head_forward,
};
