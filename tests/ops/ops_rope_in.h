/* The inputs the rope_store cases share (ops_rope_store.c, ops_rope_attend.c):
 * a paged world (ops_paged.h) whose step brings k and v rows of its own,
 * rope's inv_freq over `rot` dims, and the q and k norms' weights.
 */
#ifndef ATLAS_TESTS_OPS_OPS_ROPE_IN_H
#define ATLAS_TESTS_OPS_OPS_ROPE_IN_H

#include "tests/ops/ops_paged.h"

struct rope_in {
	struct paged_world world;
	float *k, *v;         /* the step's k and v rows [T, C] before rope */
	float *inv, *qn, *kn; /* inv_freq [R / 2], the norms' weights [D] (bf16 values) */
	int R;                /* rotated dims of a head */
};

/* The inputs of a case: the world of p, rot rotated dims a head (0: all). */
void rope_in_build(struct op_run *r, struct rope_in *in, const struct paged_params *p, int rot,
		   const struct op_backend *target);
/* The step's q, k and v rows side by side [T, QC + 2 C], as one product of
 * the stacked weights gives them. */
float *rope_in_packed(struct op_run *r, const struct rope_in *in);

#endif
