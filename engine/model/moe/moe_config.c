/* config.json keys of the mixture-of-experts block (moe.h). */
#include "engine/model/moe/moe.h"

#include <errno.h>

#include "common/err.h"
#include "engine/model/hf_json.h"

/* Whether layer l is in mlp_only_layers (a list of layer indices). */
static int in_mlp_only(const struct hf_json *f, json_t *only, int l, int n_layers, bool *out,
		       char *err, size_t errlen)
{
	size_t i;
	json_t *v;

	*out = false;
	if (!only)
		return 0;
	if (!json_is_array(only))
		return atlas_errf(err, errlen, -EINVAL, "%s: key mlp_only_layers: not a list",
				  f->path);
	json_array_foreach(only, i, v) {
		if (!json_is_integer(v) || json_integer_value(v) < 0 ||
		    json_integer_value(v) >= n_layers)
			return atlas_errf(err, errlen, -EINVAL,
					  "%s: key mlp_only_layers: entry %zu is not a layer index "
					  "below %d", f->path, i, n_layers);
		if (json_integer_value(v) == l)
			*out = true;
	}
	return 0;
}

int moe_parse_config(const struct hf_json *f, struct model_config *c, char *err, size_t errlen)
{
	json_t *r = f->root;
	int step, rc;

	/* transformers 5.x spells the count num_local_experts, 4.x num_experts. */
	const char *experts = hf_get(r, "num_experts") ? "num_experts" : "num_local_experts";
	if ((rc = hf_int(f, r, experts, true, 0, &c->n_experts, err, errlen)) ||
	    (rc = hf_int(f, r, "num_experts_per_tok", true, 0, &c->n_experts_per_tok, err,
			 errlen)) ||
	    (rc = hf_int(f, r, "moe_intermediate_size", true, 0, &c->moe_intermediate_size, err,
			 errlen)) ||
	    (rc = hf_bool(f, r, "norm_topk_prob", false, &c->norm_topk_prob, err, errlen)) ||
	    (rc = hf_int(f, r, "decoder_sparse_step", false, 1, &step, err, errlen)))
		return rc;
	if (c->n_experts <= 0 || c->moe_intermediate_size <= 0)
		return atlas_errf(err, errlen, -EINVAL,
				  "%s: keys num_experts and moe_intermediate_size: must be positive",
				  f->path);
	if (c->n_experts_per_tok < 1 || c->n_experts_per_tok > c->n_experts ||
	    c->n_experts_per_tok > KT_MOE_MAX_K)
		return atlas_errf(err, errlen, c->n_experts_per_tok > KT_MOE_MAX_K ? -ENOTSUP : -EINVAL,
				  "%s: key num_experts_per_tok: %d must be 1 .. %d (and at most "
				  "num_experts, %d)", f->path, c->n_experts_per_tok, KT_MOE_MAX_K,
				  c->n_experts);
	if (step < 1)
		return atlas_errf(err, errlen, -EINVAL,
				  "%s: key decoder_sparse_step: must be positive", f->path);
	c->n_moe_layers = 0;
	for (int l = 0; l < c->n_layers; l++) {
		bool dense;
		if ((rc = in_mlp_only(f, hf_get(r, "mlp_only_layers"), l, c->n_layers, &dense, err,
				      errlen)))
			return rc;
		const bool moe = !dense && (l + 1) % step == 0;
		c->layers[l].mlp = moe ? MODEL_MLP_MOE : MODEL_MLP_DENSE;
		c->n_moe_layers += moe;
	}
	return 0;
}

void moe_shard(const struct model *m, int *e0, int *n_local)
{
	const int E = m->cfg.n_experts;
	const int n = m->be->comm.n_ranks > 1 ? m->be->comm.n_ranks : 1;
	const int r = n > 1 ? m->be->comm.rank : 0;
	const int base = E / n, extra = E % n;

	*e0 = r * base + (r < extra ? r : extra);
	*n_local = base + (r < extra);
}
