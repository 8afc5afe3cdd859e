/* Binding an MoE layer's router and this rank's experts (moe.h), from
 * either checkpoint layout:
 *
 *   per expert (transformers 4.x)   <p>.mlp.experts.<e>.gate_proj.weight  [I, H]
 *                                   <p>.mlp.experts.<e>.up_proj.weight    [I, H]
 *                                   <p>.mlp.experts.<e>.down_proj.weight  [H, I]
 *   fused (transformers 5.x)        <p>.mlp.experts.gate_up_proj          [E, 2I, H]
 *                                   (rows [0, I) gate, [I, 2I) up: the
 *                                   layout atlas keeps in both cases)
 *                                   <p>.mlp.experts.down_proj             [E, H, I]
 *
 * with <p> = <prefix>.<l>, and the router <p>.mlp.gate.weight [E, H] in
 * both. Only the experts of this rank's shard are read.
 */
#include "engine/model/moe/moe.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/err.h"

/* Whether the files hold layer p's experts fused (a dummy model: no). */
static bool fused_layout(struct model *m, const char *p)
{
	char name[160];

	if (!m->st)
		return false;
	snprintf(name, sizeof name, "%s.mlp.experts.gate_up_proj", p);
	return st_find(m->st, name) != NULL;
}

/* The parts of the gate_up stack of experts e0 .. e0 + n - 1: each
 * expert's [2I, H] slice of the fused tensor, or its gate_proj and up_proj
 * one after the other (2n parts of I rows). Returns the parts written. */
static int gate_up_parts(const struct model_config *c, const char *p, bool fused, int e0, int n,
			 struct model_part *parts)
{
	const int64_t I = c->moe_intermediate_size;

	for (int i = 0; i < n; i++) {
		if (fused) {
			parts[i] = (struct model_part){ .slice = e0 + i, .n_slices = c->n_experts,
							.full_rows = 2 * I };
			snprintf(parts[i].name, sizeof parts[i].name, "%s.mlp.experts.gate_up_proj", p);
			continue;
		}
		for (int j = 0; j < 2; j++) {
			struct model_part *q = &parts[2 * i + j];
			*q = (struct model_part){ .slice = -1 };
			snprintf(q->name, sizeof q->name, "%s.mlp.experts.%d.%s.weight", p, e0 + i,
				 j ? "up_proj" : "gate_proj");
		}
	}
	return fused ? n : 2 * n;
}

/* The parts of the down stack of experts e0 .. e0 + n - 1. */
static void down_parts(const struct model_config *c, const char *p, bool fused, int e0, int n,
		       struct model_part *parts)
{
	for (int i = 0; i < n; i++) {
		parts[i] = (struct model_part){ .slice = fused ? e0 + i : -1,
						.n_slices = fused ? c->n_experts : 0,
						.full_rows = fused ? c->hidden_size : 0 };
		if (fused)
			snprintf(parts[i].name, sizeof parts[i].name, "%s.mlp.experts.down_proj", p);
		else
			snprintf(parts[i].name, sizeof parts[i].name,
				 "%s.mlp.experts.%d.down_proj.weight", p, e0 + i);
	}
}

int moe_bind_layer(struct model *m, const char *prefix, int l, struct moe_layer *w, char *err,
		   size_t errlen)
{
	const struct model_config *c = &m->cfg;
	const int64_t I = c->moe_intermediate_size, H = c->hidden_size;
	char p[96], what[160];
	int e0, n, rc;

	snprintf(p, sizeof p, "%s.%d", prefix, l);
	moe_shard(m, &e0, &n);
	if ((rc = model_bind_layer(m, prefix, l, &w->router, "mlp.gate.weight", c->n_experts, H,
				   err, errlen)))
		return rc;
	struct model_part *parts = calloc((size_t)(2 * n + 1), sizeof *parts);
	if (!parts)
		return atlas_errf(err, errlen, -ENOMEM, "out of memory");
	const bool fused = fused_layout(m, p);
	/* Dummy weights: expert e's gate_up is stack matrix e of 2I rows. */
	const int n_gu = gate_up_parts(c, p, fused, e0, n, parts);
	const bool whole = fused || !m->st;
	snprintf(what, sizeof what, "%s.mlp.experts gate_up (experts %d..%d)", p, e0, e0 + n - 1);
	rc = model_bind_stack(m, &w->w_gate_up, what, parts, whole ? n : n_gu,
			      whole ? e0 : 2 * e0, whole ? 2 * I : I, H, err, errlen);
	if (!rc) {
		down_parts(c, p, fused, e0, n, parts);
		snprintf(what, sizeof what, "%s.mlp.experts down (experts %d..%d)", p, e0,
			 e0 + n - 1);
		rc = model_bind_stack(m, &w->w_down, what, parts, n, e0, H, I, err, errlen);
	}
	free(parts);
	if (!rc)
		m->info.expert_bytes += kt_nbytes(&w->w_gate_up) + kt_nbytes(&w->w_down);
	return rc;
}
