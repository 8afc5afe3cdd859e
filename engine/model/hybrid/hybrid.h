/* The hybrid family (DESIGN §11): Qwen3NextForCausalLM and the Qwen3.5 text
 * models (Qwen3_5ForCausalLM dense, Qwen3_5MoeForCausalLM). Most layers mix
 * positions with Gated DeltaNet, a linear attention whose per-sequence state
 * is a causal conv's last inputs and one delta-rule matrix per head; every
 * few layers one is gated full attention (an output gate, partial rotary,
 * q/k norms). The MLPs are dense SwiGLU or mixtures of experts with a shared
 * expert whose output a sigmoid gate scales. Every RMSNorm of the residual
 * stream and of q/k is zero-centred (scale 1 + w, which the loader adds
 * once, in f32); the delta rule's output norm is not.
 *
 * hybrid_config.c reads the family's keys, hybrid_weights.c binds the
 * tensors of both checkpoint layouts into one, hybrid_forward.c runs a step
 * and hybrid_gdn.c the linear-attention block, hybrid_head.c the MTP head.
 *
 * Shapes below: E hidden, V vocab; attention Hq heads, Hkv kv heads, D
 * head_dim; linear Hk, Hv heads, dk, dv dims, C = 2 * Hk * dk + Hv * dv
 * conv channels, K conv kernel; I intermediate, Is the shared expert's.
 */
#ifndef ATLAS_ENGINE_MODEL_HYBRID_H
#define ATLAS_ENGINE_MODEL_HYBRID_H

#include "engine/model/blocks.h"
#include "engine/model/family.h"
#include "engine/model/internal.h"
#include "engine/model/moe/moe.h"

/* Table variants: which checkpoint layout. */
enum hybrid_variant {
	HYBRID_QWEN3_NEXT,   /* in_proj_qkvz / in_proj_ba grouped by key head */
	HYBRID_QWEN35,       /* in_proj_qkv, in_proj_z, in_proj_b, in_proj_a; dense MLPs */
	HYBRID_QWEN35_MOE,   /* the same with MoE MLPs */
};

extern const struct model_family hybrid_family;

/* A Gated DeltaNet mixer. */
struct hybrid_linear {
	struct kt_tensor w_qkv;         /* [C, E] q heads, k heads, v heads (the conv's channels) */
	struct kt_tensor w_z;           /* [Hv*dv, E] the output gate */
	struct kt_tensor w_ba;          /* [2*Hv, E] b rows (beta), then a rows (decay) */
	struct kt_tensor conv;          /* [C, K] conv1d.weight */
	struct kt_tensor a_log;         /* [1, Hv] f32 A_log */
	struct kt_tensor dt_bias;       /* [1, Hv] f32 */
	struct kt_tensor norm;          /* [1, dv] the gated norm's weight (not zero-centred) */
	struct kt_tensor w_out;         /* [E, Hv*dv] out_proj */
};

/* A gated full-attention mixer. */
struct hybrid_attention {
	struct kt_tensor wq, wgate;     /* [Hq*D, E] each: q_proj's query rows and gate rows */
	struct kt_tensor wk, wv;        /* [Hkv*D, E] */
	struct kt_tensor q_norm, k_norm; /* [1, D] f32, 1 + w */
	struct kt_tensor wo;            /* [E, Hq*D] */
};

struct hybrid_layer {
	struct kt_tensor attn_norm;     /* [1, E] f32, 1 + w: input_layernorm */
	struct kt_tensor ffn_norm;      /* [1, E] f32, 1 + w: post_attention_layernorm */
	struct hybrid_linear lin;       /* mixer MODEL_MIXER_LINEAR */
	struct hybrid_attention att;    /* mixer MODEL_MIXER_ATTENTION */
	/* mlp MODEL_MLP_DENSE: w_gate, w_up [I, E], w_down [E, I]. MODEL_MLP_MOE:
	 * the experts, and with a shared expert w_gate, w_up [Is, E], w_down
	 * [E, Is] are its and sh_gate [1, E] its gate. */
	struct moe_layer moe;
	struct kt_tensor w_gate, w_up, w_down;
	struct kt_tensor sh_gate;
};

/* Activations of one step, sized at load for M = max_tokens rows
 * (max_out for out_h); all f32, owned, viewed per step with kt_rows(). */
struct hybrid_scratch {
	struct kt_tensor x, xn, proj;   /* [M, E] residual stream, normed input, block output */
	struct kt_tensor q, gate;       /* [M, Hq*D] queries, their output gate */
	struct kt_tensor k, v;          /* [M, Hkv*D] */
	struct kt_tensor att;           /* [M, Hq*D] */
	struct kt_tensor qkv, conv;     /* [M, C] the projection, the conv's output */
	struct kt_tensor z, o;          /* [M, Hv*dv] the gate, the delta rule's output */
	struct kt_tensor ba;            /* [M, 2*Hv] */
	struct kt_tensor mlp_gate, mlp_up;  /* [M, max(I, Is)] */
	struct kt_tensor shared;        /* [M, E] the shared expert's output */
	struct kt_tensor sh_logit;      /* [M, 1] its gate */
	struct kt_tensor out_h;         /* [max_out, E] final hidden rows that get logits */
	struct kt_tensor inv_freq;      /* [1, R/2] */
};

/* model.family_data of a hybrid model, or of its MTP head (head != NULL). */
struct hybrid_model {
	struct kt_tensor embed;         /* [V, E] */
	struct kt_tensor final_norm;    /* [1, E] f32, 1 + w */
	struct kt_tensor lm_head;       /* [V, E]; embed's handle when tied */
	struct hybrid_layer *layers;    /* [n_layers] owned */
	struct hybrid_scratch s;
	struct moe_scratch moe;         /* allocated when the model has MoE layers */
	struct model_head_input *head;  /* an MTP head's input (norms 1 + w); owned; NULL for
					 * the model itself */
};

int hybrid_parse_config(const struct hf_json *f, int variant, struct model_config *c,
			char *err, size_t errlen);
/* Bind one decoder layer named <prefix>.<l>.* (hybrid_weights.c). */
int hybrid_bind_layer(struct model *m, int variant, const char *prefix, struct hybrid_layer *w,
		      int l, char *err, size_t errlen);
int hybrid_bind_weights(struct model *m, struct hybrid_model *h, char *err, size_t errlen);
int hybrid_alloc_scratch(struct model *m, struct hybrid_model *h, char *err, size_t errlen);
void hybrid_free_scratch(struct model *m, struct hybrid_model *h);
/* The layer-l blocks (hybrid_forward.c, hybrid_gdn.c): xn in, proj out. */
int hybrid_attention_block(struct model *m, int l, const struct model_step *s,
			   const struct kt_tensor *xn, const struct kt_tensor *proj);
int hybrid_linear_block(struct model *m, int l, const struct model_step *s,
			const struct kt_tensor *xn, const struct kt_tensor *proj);
int hybrid_mlp_block(struct model *m, int l, const struct kt_batch *b,
		     const struct kt_tensor *xn, const struct kt_tensor *proj);
int hybrid_forward(struct model *m, const struct model_step *s);
/* The MTP head (hybrid_head.c). */
int hybrid_head_load(struct model *m, char *err, size_t errlen);
void hybrid_head_free(struct model *m, struct hybrid_model *h);
int hybrid_head_forward(struct model *m, const struct model_step *s);

#endif
