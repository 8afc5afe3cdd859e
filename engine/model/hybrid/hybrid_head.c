/* The hybrid family's multi-token-prediction head (model_load_head), as
 * Qwen3-Next and Qwen3.5 checkpoints lay it out beside the decoder:
 *
 *   mtp.pre_fc_norm_embedding.weight  [E]      norm of the next token's embedding (1 + w)
 *   mtp.pre_fc_norm_hidden.weight     [E]      norm of the model's final hidden row (1 + w)
 *   mtp.fc.weight                     [E, 2E]  the joined pair to the residual stream
 *   mtp.layers.<j>.*                           gated full-attention decoder layers,
 *                                              their MLP the model's kind (MoE when it
 *                                              has experts)
 *   mtp.norm.weight                   [E]      the head's final norm (1 + w)
 *
 * with the model's embedding and output head. Row t's input is the pair
 * (the model's final hidden row at position p, the token at p + 1), and
 * its logits guess the token at p + 2:
 *
 *   halves[0, T) = rmsnorm_e(embed(ids)), halves[M, M + T) = rmsnorm_h(hidden)
 *   x = fc · interleave(halves)          ([T, 2E] as one GEMM)
 *   per head layer: as the decoder's attention layers
 *   hidden_out = rmsnorm(x)[out_rows]; logits = lm_head · hidden_out
 */
#include "engine/model/hybrid/hybrid.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/err.h"

#define TRY(op) do { int rc_ = (op); if (rc_) return rc_; } while (0)

/* The head's layers are the config's layers from now on. */
static void head_layers(struct model_config *c)
{
	const bool moe = c->n_experts > 0;
	c->n_layers = c->n_mtp_layers;
	for (int l = 0; l < c->n_layers; l++)
		c->layers[l] = (struct model_layer){ .mixer = MODEL_MIXER_ATTENTION,
						     .mlp = moe ? MODEL_MLP_MOE : MODEL_MLP_DENSE,
						     .cache = (int16_t)l };
	c->n_attention_layers = c->n_layers;
	c->n_moe_layers = moe ? c->n_layers : 0;
	c->n_linear_layers = 0;
	c->linear_state_floats = 0;
}

static int bind_head(struct model *m, struct hybrid_model *hm, char *err, size_t errlen)
{
	const struct model_config *c = &m->cfg;
	const struct model_arch *row = model_arch_find(c->architecture, NULL);
	const int64_t e = c->hidden_size;
	struct model_head_input *h = hm->head;
	const char *embed = m->st && !st_find(m->st, "model.embed_tokens.weight") &&
				    st_find(m->st, "model.language_model.embed_tokens.weight")
			    ? "model.language_model.embed_tokens.weight"
			    : "model.embed_tokens.weight";

	hm->layers = calloc((size_t)c->n_layers, sizeof *hm->layers);
	if (!hm->layers || !row)
		return atlas_errf(err, errlen, -ENOMEM, "out of memory");
	TRY(model_bind(m, &hm->embed, embed, c->vocab_size, e, err, errlen));
	TRY(model_bind_f32(m, &h->norm_e, "mtp.pre_fc_norm_embedding.weight", e, 1.0f, err,
			   errlen));
	TRY(model_bind_f32(m, &h->norm_h, "mtp.pre_fc_norm_hidden.weight", e, 1.0f, err, errlen));
	TRY(model_bind(m, &h->fc, "mtp.fc.weight", e, 2 * e, err, errlen));
	TRY(model_bind_f32(m, &hm->final_norm, "mtp.norm.weight", e, 1.0f, err, errlen));
	for (int l = 0; l < c->n_layers; l++)
		TRY(hybrid_bind_layer(m, row->variant, "mtp.layers", &hm->layers[l], l, err,
				      errlen));
	if (c->tie_word_embeddings)
		hm->lm_head = hm->embed;
	else
		TRY(model_bind(m, &hm->lm_head, "lm_head.weight", c->vocab_size, e, err, errlen));
	model_bind_done(m);
	return 0;
}

int hybrid_head_load(struct model *m, char *err, size_t errlen)
{
	struct hybrid_model *hm = calloc(1, sizeof *hm);
	if (!hm)
		return atlas_errf(err, errlen, -ENOMEM, "out of memory");
	m->family_data = hm;
	if (!(hm->head = calloc(1, sizeof *hm->head)))
		return atlas_errf(err, errlen, -ENOMEM, "out of memory");
	head_layers(&m->cfg);
	TRY(bind_head(m, hm, err, errlen));
	TRY(hybrid_alloc_scratch(m, hm, err, errlen));
	if (m->cfg.n_moe_layers)
		TRY(moe_alloc_scratch(m, &hm->moe, err, errlen));
	return model_head_input_alloc(m, hm->head, err, errlen);
}

void hybrid_head_free(struct model *m, struct hybrid_model *hm)
{
	if (!hm->head)
		return;
	model_head_input_free(m, hm->head);
	free(hm->head);
	hm->head = NULL;
}

int hybrid_head_forward(struct model *m, const struct model_step *s)
{
	const struct model_config *c = &m->cfg;
	struct hybrid_model *hm = m->family_data;
	const struct model_head_input *hd = hm->head;
	struct kt_backend *be = m->be;
	const struct kt_batch *b = &s->batch;
	const int T = b->n_tokens;
	const int64_t n_out = s->out_rows.rows;
	const float eps = c->rms_norm_eps;

	if (!hd)
		return -EINVAL;

	const struct kt_tensor x = kt_rows(hm->s.x, 0, T), xn = kt_rows(hm->s.xn, 0, T);
	const struct kt_tensor proj = kt_rows(hm->s.proj, 0, T);
	const struct kt_tensor h_out = s->hidden_out.data ? kt_rows(s->hidden_out, 0, n_out)
							  : kt_rows(hm->s.out_h, 0, n_out);
	const struct kt_tensor out_logits = kt_rows(s->logits, 0, n_out);

	TRY(model_head_input_run(m, hd, &hm->embed, s, &x));
	for (int l = 0; l < c->n_layers; l++) {
		TRY(kt_rmsnorm(be, &xn, &x, l ? &proj : NULL, &hm->layers[l].attn_norm, eps));
		TRY(hybrid_attention_block(m, l, s, &xn, &proj));
		TRY(kt_rmsnorm(be, &xn, &x, &proj, &hm->layers[l].ffn_norm, eps));
		TRY(hybrid_mlp_block(m, l, b, &xn, &proj));
	}
	TRY(kt_rmsnorm(be, &xn, &x, &proj, &hm->final_norm, eps));
	if (n_out == 0)
		return 0;
	TRY(kt_gather_rows(be, &h_out, &xn, &s->out_rows));
	return kt_matmul(be, &out_logits, &h_out, &hm->lm_head, NULL);
}
