/* The Gated DeltaNet block of the hybrid family (hybrid.h):
 *
 *   qkv = xn · Wqkvᵀ      [T, C]        z = xn · Wzᵀ  [T, Hv·dv]
 *   ba  = xn · Wbaᵀ       [T, 2Hv]
 *   conv = silu(causal depthwise conv of qkv)     the state keeps the last K - 1 rows
 *   o = gated delta rule(conv's q, k, v; ba)      the state keeps each head's [dk, dv]
 *   o = rmsnorm(o per head) · w · silu(z)         over each head's dv values
 *   proj = o · Woutᵀ
 *
 * The layer's state is row s->state_slot[t] of s->state[cache], laid out as
 * kt conv1d and delta_rule want it: conv inputs first, then the matrices at
 * float (K - 1) · C.
 */
#include "engine/model/hybrid/hybrid.h"

#include <errno.h>

#define TRY(op) do { int rc_ = (op); if (rc_) return rc_; } while (0)

int hybrid_linear_block(struct model *m, int l, const struct model_step *s,
			const struct kt_tensor *xn, const struct kt_tensor *proj)
{
	const struct kt_batch *b = &s->batch;
	const struct model_config *c = &m->cfg;
	const struct model_linear *g = &c->linear;
	struct hybrid_model *hm = m->family_data;
	const struct hybrid_linear *w = &hm->layers[l].lin;
	const struct hybrid_scratch *sc = &hm->s;
	struct kt_backend *be = m->be;
	const int T = b->n_tokens;
	const int64_t ch = sc->qkv.cols, heads = (int64_t)T * g->v_heads;
	const struct kt_tensor qkv = kt_rows(sc->qkv, 0, T), conv = kt_rows(sc->conv, 0, T);
	const struct kt_tensor z = kt_rows(sc->z, 0, T), o = kt_rows(sc->o, 0, T);
	const struct kt_tensor ba = kt_rows(sc->ba, 0, T);
	const struct kt_tensor o_heads = kt_reshape(o, heads, g->v_dim);
	const struct kt_tensor z_heads = kt_reshape(z, heads, g->v_dim);
	const struct kt_tensor *state = &s->state[c->layers[l].cache];

	TRY(model_project(be, b, &qkv, xn, &w->w_qkv, NULL));
	TRY(model_project(be, b, &z, xn, &w->w_z, NULL));
	TRY(model_project(be, b, &ba, xn, &w->w_ba, NULL));
	TRY(kt_conv1d(be, &conv, &qkv, &w->conv, state, &s->state_slot, b));
	TRY(kt_delta_rule(be, &o, &conv, &ba, &w->a_log, &w->dt_bias, state,
			  (int64_t)(g->conv_kernel - 1) * ch, &s->state_slot, b, g->k_heads,
			  g->v_heads, g->k_dim, g->v_dim));
	TRY(kt_rmsnorm_gated(be, &o_heads, &o_heads, &z_heads, &w->norm, c->rms_norm_eps));
	return model_project(be, b, proj, &o, &w->w_out, NULL);
}
