/* Pieces every family's forward pass shares (blocks.c): scratch
 * allocation, the rotary table, the projection that keeps decode rows apart
 * from prompt rows, and the input of a multi-token-prediction head. */
#ifndef ATLAS_ENGINE_MODEL_BLOCKS_H
#define ATLAS_ENGINE_MODEL_BLOCKS_H

#include <stddef.h>
#include <stdint.h>

#include "engine/model/internal.h"

/* Allocate t [rows, cols] of dtype on m's backend; what names it in err. */
int model_alloc(struct model *m, enum kt_dtype dtype, int64_t rows, int64_t cols,
		struct kt_tensor *t, const char *what, char *err, size_t errlen);
/* t = the rotary inverse frequencies [1, rope_dim / 2] of m's config. */
int model_rope_table(struct model *m, struct kt_tensor *t, char *err, size_t errlen);
/* y = x · wᵀ (+ bias) over the step's rows, the decode rows apart from the
 * prompt rows: a backend picks its kernel by row count (a bandwidth-bound
 * one for a few rows), so this keeps a decode row's arithmetic the same
 * whether or not prompt chunks share its step, and its tokens with it. */
int model_project(struct kt_backend *be, const struct kt_batch *b, const struct kt_tensor *y,
		  const struct kt_tensor *x, const struct kt_tensor *w,
		  const struct kt_tensor *bias);
/* act = silu(x · w_gateᵀ) * (x · w_upᵀ) of a stacked w [2I, K] through the
 * scratch gu [T, 2I], split as model_project splits (kt_matmul_swiglu). */
int model_project_swiglu(struct kt_backend *be, const struct kt_batch *b,
			 const struct kt_tensor *act, const struct kt_tensor *gu,
			 const struct kt_tensor *x, const struct kt_tensor *w);
/* ys[i] = x · ws[i]ᵀ (+ biases[i]) for i < n, split as model_project splits
 * them: the products of one x (a layer's q, k and v, its gate and up), which
 * a backend may run as one launch (kt_matmul_n). */
int model_project_n(struct kt_backend *be, const struct kt_batch *b, int n,
		    const struct kt_tensor *const *ys, const struct kt_tensor *x,
		    const struct kt_tensor *const *ws, const struct kt_tensor *const *biases);

/* An MTP head's input, as Qwen3-Next and Qwen3.5 checkpoints define it:
 * row t is x = fc · [rmsnorm_e(embed(ids[t])) | rmsnorm_h(hidden[t])].
 * The family binds the three weights (its norms' convention); M =
 * max_tokens. */
struct model_head_input {
	struct kt_tensor norm_e, norm_h;    /* [1, E] pre_fc_norm_embedding, pre_fc_norm_hidden */
	struct kt_tensor fc;                /* [E, 2E] */
	struct kt_tensor halves;            /* [2M, E] f32: normed embeddings in rows [0, T),
					     * normed hidden rows in [M, M + T) */
	struct kt_tensor pairs;             /* [2M, E] f32: halves interleaved, row 2t the
					     * embedding's and 2t + 1 the hidden's: [T, 2E] */
	struct kt_tensor order;             /* [2M, 1] i32: 0, M, 1, M + 1, ... */
};

/* The scratch of h (after its weights are bound), and its release. */
int model_head_input_alloc(struct model *m, struct model_head_input *h, char *err,
			   size_t errlen);
void model_head_input_free(struct model *m, struct model_head_input *h);
/* x [T, E] = the head's input of step s: embed is the model's embedding,
 * s->hidden the model's final hidden rows. -EINVAL, before any work, when
 * the step's rows, ids, hidden rows, logits or hidden_out do not fit the
 * model (the checks every family's head step needs). */
int model_head_input_run(struct model *m, const struct model_head_input *h,
			 const struct kt_tensor *embed, const struct model_step *s,
			 const struct kt_tensor *x);

#endif
