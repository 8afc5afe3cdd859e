/* Binding an MoE layer's router and this rank's experts (moe.h), from
 * either checkpoint layout:
 *
 *   per expert (transformers 4.x)   <p>.mlp.experts.<e>.gate_proj.weight  [I, H]
 *                                   <p>.mlp.experts.<e>.up_proj.weight    [I, H]
 *                                   <p>.mlp.experts.<e>.down_proj.weight  [H, I]
 *   fused (transformers 5.x)        <p>.mlp.experts.gate_up_proj          [E, 2I, H]
 *                                   (rows [0, I) gate, [I, 2I) up)
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

/* The parts of one stack: projection proj ("gate_proj", "up_proj",
 * "down_proj") of experts e0 .. e0 + n - 1 in the layout of the files. */
static void expert_parts(const struct model_config *c, const char *p, bool fused,
			 const char *proj, int e0, int n, struct model_part *parts)
{
	const int64_t I = c->moe_intermediate_size, H = c->hidden_size;
	const bool down = proj[0] == 'd';

	for (int i = 0; i < n; i++) {
		struct model_part *q = &parts[i];
		if (!fused) {
			snprintf(q->name, sizeof q->name, "%s.mlp.experts.%d.%s.weight", p, e0 + i,
				 proj);
			q->slice = -1;
			q->n_slices = q->full_rows = q->row0 = 0;
			continue;
		}
		snprintf(q->name, sizeof q->name, "%s.mlp.experts.%s", p,
			 down ? "down_proj" : "gate_up_proj");
		q->slice = e0 + i;
		q->n_slices = c->n_experts;
		q->full_rows = down ? H : 2 * I;
		q->row0 = proj[0] == 'u' ? I : 0;
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
	struct model_part *parts = calloc((size_t)(n ? n : 1), sizeof *parts);
	if (!parts)
		return atlas_errf(err, errlen, -ENOMEM, "out of memory");
	const bool fused = fused_layout(m, p);
	static const char *const projs[] = { "gate_proj", "up_proj", "down_proj" };
	struct kt_tensor *dst[] = { &w->w_gate, &w->w_up, &w->w_down };
	for (int i = 0; i < 3 && !rc; i++) {
		const bool down = i == 2;
		expert_parts(c, p, fused, projs[i], e0, n, parts);
		snprintf(what, sizeof what, "%s.mlp.experts.%s (experts %d..%d)", p, projs[i], e0,
			 e0 + n - 1);
		rc = model_bind_stack(m, dst[i], what, parts, n, e0, down ? H : I, down ? I : H, err,
				      errlen);
	}
	free(parts);
	if (!rc)
		m->info.expert_bytes += kt_nbytes(&w->w_gate) + kt_nbytes(&w->w_up) +
					kt_nbytes(&w->w_down);
	return rc;
}
