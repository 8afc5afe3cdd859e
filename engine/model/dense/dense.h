/* The dense decoder family: Qwen3ForCausalLM and LlamaForCausalLM
 * (pre-norm, GQA attention with rotary positions, SwiGLU MLP), and
 * Qwen3MoeForCausalLM, the same decoder whose MLPs are mixtures of experts
 * (engine/model/moe/) in the layers its configuration names. Every layer is
 * full attention.
 *
 * dense_config.c reads the family's keys, dense_weights.c binds the tensors,
 * dense_forward.c runs a step.
 */
#ifndef ATLAS_ENGINE_MODEL_DENSE_H
#define ATLAS_ENGINE_MODEL_DENSE_H

#include "engine/model/blocks.h"
#include "engine/model/family.h"
#include "engine/model/internal.h"
#include "engine/model/moe/moe.h"

/* Table variants: the defaults and quirks of each architecture. */
enum dense_variant { DENSE_QWEN3, DENSE_LLAMA, DENSE_QWEN3_MOE };

extern const struct model_family dense_family;

/* The weights of one decoder layer; an absent bias has data == NULL. Shapes
 * with Hq = n_heads, Hkv = n_kv_heads, D = head_dim, E = hidden, I = intermediate. */
struct dense_layer {
	struct kt_tensor attn_norm;     /* [1, E] */
	/* q, k and v stacked [(Hq + 2 Hkv)*D, E] (model_bind_joined), of which
	 * wq, wk and wv are row views; no data in a model with attention_bias,
	 * whose wq, wk and wv are tensors of their own. */
	struct kt_tensor wqkv;
	struct kt_tensor wq, wk, wv;    /* [Hq*D, E], [Hkv*D, E], [Hkv*D, E] */
	struct kt_tensor bq, bk, bv;    /* [1, Hq*D], [1, Hkv*D], [1, Hkv*D] (attention_bias) */
	struct kt_tensor q_norm, k_norm;  /* [1, D] (qk_norm) */
	struct kt_tensor wo, bo;        /* [E, Hq*D], [1, E] (attention_bias) */
	struct kt_tensor ffn_norm;      /* [1, E] */
	/* A dense MLP, or in a layer whose mlp is MODEL_MLP_MOE the experts
	 * (then w_gate .. b_down have no data). */
	struct moe_layer moe;
	/* gate and up stacked [2I, E], of which w_gate and w_up are row views;
	 * no data with mlp_bias (or experts). */
	struct kt_tensor w_gate_up;
	struct kt_tensor w_gate, w_up;  /* [I, E] */
	struct kt_tensor w_down;        /* [E, I] */
	struct kt_tensor b_gate, b_up, b_down;  /* [1, I], [1, I], [1, E] (mlp_bias) */
};

/* Activations of one step, sized at load for max_tokens rows (max_out for
 * the logits side) and viewed per step with kt_rows(); all f32, owned. */
struct dense_scratch {
	struct kt_tensor x;             /* [max_tokens, E] the residual stream */
	struct kt_tensor xn;            /* [max_tokens, E] normed input of a block */
	struct kt_tensor proj;          /* [max_tokens, E] output of o_proj / down_proj */
	struct kt_tensor q;             /* [max_tokens, Hq*D] */
	struct kt_tensor k, v;          /* [max_tokens, Hkv*D] */
	struct kt_tensor att;           /* [max_tokens, Hq*D] attention output, bf16 where the
					 * backend rounds x (else f32) */
	struct kt_tensor gate, up;      /* [max_tokens, I]: the two halves of gate_up's memory */
	struct kt_tensor gate_up;       /* [max_tokens, 2I]: the product of w_gate_up */
	struct kt_tensor qkv;           /* [max_tokens, (Hq + 2 Hkv)*D]: the product of wqkv
					 * (layers that have it) */
	/* bf16 inputs of a dense block's products, allocated when the backend
	 * rounds x to bf16 itself (matmul_x_bf16): the norms, attention and
	 * swiglu write the rounded values once instead of every product rounding
	 * them again, and the products read half the bytes. The same bits
	 * either way. */
	struct kt_tensor xnb;           /* [max_tokens, E] bf16 */
	struct kt_tensor act;           /* [max_tokens, I]: silu(gate) * up, bf16 where the
					 * backend rounds x (else f32) */
	struct kt_tensor out_h;         /* [max_out, E] final hidden rows that get logits */
	struct kt_tensor inv_freq;      /* [1, R/2] rotary inverse frequencies (R = rope_dim) */
};

/* model.family_data of a dense model, or of its MTP head (head != NULL:
 * layers are the head's, final_norm its mtp.norm). */
struct dense_model {
	struct kt_tensor embed;         /* [V, E] */
	struct kt_tensor final_norm;    /* [1, E] */
	struct kt_tensor lm_head;       /* [V, E]; a copy of embed's handle when tied */
	struct dense_layer *layers;     /* [n_layers] owned */
	struct dense_scratch s;
	struct moe_scratch moe;         /* allocated when the model has MoE layers */
	struct model_head_input *head;  /* an MTP head's input (dense_head.c binds it); owned;
					 * NULL for the model itself */
};

int dense_parse_config(const struct hf_json *f, int variant, struct model_config *c,
		       char *err, size_t errlen);
/* Bind the weights (dense_weights.c); the scratch (dense_forward.c). */
int dense_bind_weights(struct model *m, struct dense_model *d, char *err, size_t errlen);
/* One decoder layer's weights, named <prefix>.<l>.* (dense_weights.c). */
int dense_bind_layer(struct model *m, const char *prefix, struct dense_layer *w, int l,
		     char *err, size_t errlen);
int dense_alloc_scratch(struct model *m, struct dense_model *d, char *err, size_t errlen);
void dense_free_scratch(struct model *m, struct dense_model *d);
int dense_forward(struct model *m, const struct model_step *s);
/* The MTP head (dense_head.c loads it, dense_forward.c runs it). */
int dense_head_load(struct model *m, char *err, size_t errlen);
void dense_head_free(struct model *m, struct dense_model *d);
int dense_head_forward(struct model *m, const struct model_step *s);

#endif
