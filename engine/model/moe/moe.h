/* The mixture-of-experts MLP block (DESIGN §11): a router picks k of E
 * experts per token, each a SwiGLU MLP, and their outputs are added with the
 * router's weights. A family whose layers have mlp MODEL_MLP_MOE holds a
 * struct moe_layer for each and calls moe_forward() where a dense MLP would
 * run (the Qwen3-MoE layers of the dense family; the hybrid families later).
 *
 *   logits = xn · Wrᵀ                          [T, E]
 *   ids, w, plan = route(logits)               top k per token; the T*k
 *                                              assignments sorted by expert
 *   gate | up = xn[tok] · [Wg_e; Wu_e]ᵀ        [T*k, 2I] in expert order
 *   y = (silu(gate) * up) · Wd_eᵀ              [T*k, H]
 *   y = sum over ranks of y                    expert parallelism only
 *   out[t] = Σ_j w[t, j] · y[slot(t, j)]       j = 0 .. k-1 in order
 *
 * Expert parallelism (DESIGN §10): with the backend's communicator open on
 * n ranks, a rank holds experts [e0, e0 + n_local) (moe_shard()) and writes
 * exact zeros in the rows of the others' experts, so the sum over ranks
 * gives every rank every row, each computed by one rank, and the combine
 * then runs the same on every rank: the output is bitwise what one rank
 * holding every expert computes.
 *
 * moe_config.c reads the config keys, moe_weights.c binds the experts of
 * both checkpoint layouts, moe_block.c runs the block.
 */
#ifndef ATLAS_ENGINE_MODEL_MOE_H
#define ATLAS_ENGINE_MODEL_MOE_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/model/internal.h"

struct hf_json;

/* The weights of one MoE layer. E = n_experts, H = hidden, I =
 * moe_intermediate_size; n_local experts of this rank, from e0. */
struct moe_layer {
	struct kt_tensor router;        /* [E, H] mlp.gate.weight */
	struct kt_tensor w_gate_up;     /* [n_local * 2I, H] the local experts' gate_proj and
					 * up_proj, expert e's at rows (e - e0) * 2I: its
					 * gate's I rows, then its up's (one product) */
	struct kt_tensor w_down;        /* [n_local * H, I] their down_proj */
};

/* Activations of the block, sized at load for M = max_tokens rows; owned. */
struct moe_scratch {
	struct kt_tensor logits;        /* [M, E] f32 router logits */
	struct kt_tensor ids;           /* [M, k] i32 chosen experts */
	struct kt_tensor w;             /* [M, k] f32 their weights */
	struct kt_tensor order, slot;   /* [M * k, 1] i32 the plan (kt moe_route) */
	struct kt_tensor offsets;       /* [E + 1, 1] i32 */
	struct kt_tensor gate_up;       /* [M * k, 2I] f32, in expert order */
	struct kt_tensor act;           /* [M * k, I] f32 silu(gate) * up */
	struct kt_tensor y;             /* [M * k, H] f32 each assignment's expert output */
};

/* Read num_experts, num_experts_per_tok, moe_intermediate_size,
 * norm_topk_prob, decoder_sparse_step and mlp_only_layers of f into c and
 * mark the MoE layers in c->layers (mlp), as the Qwen3-MoE configuration
 * defines them: layer l is MoE when it is not in mlp_only_layers and
 * (l + 1) is a multiple of decoder_sparse_step. */
int moe_parse_config(const struct hf_json *f, struct model_config *c, char *err, size_t errlen);

/* The experts this rank holds: the n ranks of the backend's communicator
 * (none open: one rank) each take a contiguous share, the first E % n ranks
 * one more. */
void moe_shard(const struct model *m, int *e0, int *n_local);

/* Bind layer l's router and its local experts, named <prefix>.<l>.mlp.*
 * in the per-expert layout (transformers 4.x: experts.<e>.gate_proj.weight
 * ...) or the fused one (5.x: experts.gate_up_proj [E, 2I, H],
 * experts.down_proj [E, H, I]), whichever the files have. */
int moe_bind_layer(struct model *m, const char *prefix, int l, struct moe_layer *w, char *err,
		   size_t errlen);

int moe_alloc_scratch(struct model *m, struct moe_scratch *s, char *err, size_t errlen);
void moe_free_scratch(struct model *m, struct moe_scratch *s);

/* out = the block of xn over the step's rows: decode rows apart from prompt
 * rows, as the dense projections do (a decode row's arithmetic does not
 * depend on what shares its step). xn, out [T, H] f32. */
int moe_forward(struct model *m, const struct moe_layer *w, const struct moe_scratch *s,
		const struct kt_batch *b, const struct kt_tensor *xn, const struct kt_tensor *out);

#endif
