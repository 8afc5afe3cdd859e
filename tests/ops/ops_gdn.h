/* The world of the Gated DeltaNet op cases (ops_gdn.c, ops_gdn_split.c):
 * sequences (runs) of a step with their state rows, positions and inputs,
 * one call of conv1d or delta_rule over pieces of them, and the
 * double-precision references of both ops.
 */
#ifndef ATLAS_TESTS_OPS_OPS_GDN_H
#define ATLAS_TESTS_OPS_OPS_GDN_H

#include "tests/ops/ops.h"

#define GDN_MAX_RUNS 8

enum gdn_op { GDN_CONV, GDN_DELTA };

/* One sequence of the case: len rows from position pos0; seg: a prompt
 * segment of the step, else decode (or verify) rows, which come first. */
struct gdn_run {
	int len, pos0;
	bool seg;
};

struct gdn_params {
	enum gdn_op op;
	int Hk, Hv, dk, dv, K;
	int n_runs;
	struct gdn_run runs[GDN_MAX_RUNS]; /* decode runs before segments */
	int chunks[3];                     /* split cases: rows per call (0: none) */
	double tol;                        /* delta_rule against the reference */
};

/* Inputs of a case. Row j of run i is world row start[i] + j. */
struct gdn_world {
	int T, n_slots;
	int start[GDN_MAX_RUNS], slot[GDN_MAX_RUNS];
	int64_t C;            /* conv channels: 2·Hk·dk + Hv·dv, also qkv's cols */
	int64_t F, off;       /* state cols; the delta rule's matrices at off */
	float *x;             /* [T, C] conv1d's input; delta_rule's qkv */
	float *w;             /* [C, K] */
	float *ba;            /* [T, 2·Hv] */
	float *a_log, *dt_bias; /* [Hv] */
	float *state;         /* [n_slots, F] as before the step */
};

/* The parts of world rows one call gets: rows [r0, r0 + n) of run `run`. */
struct gdn_piece {
	int run, r0, n;
};

struct gdn_world *gdn_build(struct op_run *r, const struct gdn_params *p);

/* The world's tensors on b that every call shares. */
struct gdn_dev {
	struct kt_tensor state, w, a_log, dt_bias;
};

struct gdn_dev gdn_upload(struct op_run *r, const struct op_backend *b,
			  const struct gdn_params *p, const struct gdn_world *w);
/* One call of the case's op over the pieces, in order (decode pieces must
 * come before segment pieces), on d's state; the out rows go to their
 * world rows of out [T, Hv·dv or C]. Returns the op's rc. */
int gdn_call(struct op_run *r, const struct op_backend *b, const struct gdn_params *p,
	     const struct gdn_world *w, const struct gdn_dev *d, const struct gdn_piece *pc,
	     int n_pc, float *out);

/* The references, each run whole from the world's state: out [T, out cols]
 * and its scale, the state after [n_slots, F] and its scale. conv1d's
 * state after is exact (copies), as floats; its scale is |terms| + |out|.
 * delta_rule's scales are the RMS of each (row, head) of out and each
 * (slot, head) matrix. */
void gdn_ref_conv(const struct gdn_params *p, const struct gdn_world *w, double *out,
		  double *scale, float *state);
void gdn_ref_delta(const struct gdn_params *p, const struct gdn_world *w, double *out,
		   double *out_scale, double *state, double *state_scale);

#endif
