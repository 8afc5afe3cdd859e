/* The inputs of the rope_store cases (ops_rope_in.h). */
#include "tests/ops/ops_rope_in.h"

#include <math.h>
#include <string.h>

void rope_in_build(struct op_run *r, struct rope_in *in, const struct paged_params *p, int rot,
		   const struct op_backend *target)
{
	const int R = rot ? rot : p->D, D = p->D;
	size_t n;

	in->R = R;
	paged_build(r, &in->world, p, target);
	n = (size_t)in->world.step.T * in->world.C;
	in->k = op_floats(r, n);
	in->v = op_floats(r, n);
	op_fill(r, in->k, n, p->kmag);
	op_fill(r, in->v, n, 1.0f);
	in->inv = op_floats(r, (size_t)R / 2);
	for (int i = 0; i < R / 2; i++)
		in->inv[i] = (float)pow(1e6, -2.0 * i / R);
	in->qn = op_floats(r, (size_t)D);
	in->kn = op_floats(r, (size_t)D);
	for (int i = 0; i < D; i++) {
		in->qn[i] = op_bf16_value(op_bf16_bits((float)op_uniform(r, 0.5, 1.5)));
		in->kn[i] = op_bf16_value(op_bf16_bits((float)op_uniform(r, 0.5, 1.5)));
	}
}

float *rope_in_packed(struct op_run *r, const struct rope_in *in)
{
	const struct paged_world *w = &in->world;
	const size_t ld = (size_t)w->QC + 2 * (size_t)w->C;
	float *qkv = op_floats(r, (size_t)w->step.T * ld);

	for (int t = 0; t < w->step.T; t++) {
		float *row = qkv + (size_t)t * ld;

		memcpy(row, w->q + (size_t)t * w->QC, (size_t)w->QC * sizeof(float));
		memcpy(row + w->QC, in->k + (size_t)t * w->C, (size_t)w->C * sizeof(float));
		memcpy(row + w->QC + w->C, in->v + (size_t)t * w->C, (size_t)w->C * sizeof(float));
	}
	return qkv;
}
