/* Cases of rmsnorm: out = x / rms(x) · w per row, after x += residual when
 * one is given; out separate or in place over x; w f32 or a bf16 weight.
 * And of rmsnorm_gated (the Gated DeltaNet heads' norm): the same norm
 * times silu(z), out separate or over x, on [R, dv] head rows.
 *
 * Reference: the row in double, out within 1e-5 of |ref| and x after the
 * residual add within 1e-7. Against the cpu: out within max_abs 1e-5 (a few
 * f32 ulps of outputs of a few units: the sums of squares are added in
 * another order), NMSE 1e-12; x after the residual add bitwise (one f32
 * addition either way). Shapes: one row, odd widths, 257 rows, every
 * model's hidden sizes, a per-head norm's [40, 128]. rmsnorm into a bf16
 * out: the f32 out rounded, bit for bit (norm16).
 */
#include <errno.h>
#include <math.h>

#include "tests/ops/ops.h"

struct norm_params {
	int R, D;
	float mag;     /* of x and residual */
	bool residual;
	bool in_place; /* out = x */
	bool bf16_w;   /* w a weight from bf16 values */
};

struct norm_in {
	float *x, *res, *w;
};

struct norm_out {
	int rc;
	float *out, *x; /* x: after the residual add */
};

static const float eps = 1e-6f;

static void *norm_build(struct op_run *r, const void *params, const struct op_backend *target)
{
	const struct norm_params *p = params;
	size_t n = (size_t)p->R * p->D;
	struct norm_in *in = op_alloc(r, sizeof(*in));

	in->x = op_floats(r, n);
	in->res = op_floats(r, n);
	in->w = op_floats(r, (size_t)p->D);
	op_fill(r, in->x, n, p->mag);
	op_fill(r, in->res, n, p->mag);
	op_fill(r, in->w, (size_t)p->D, 2.0f);
	if (p->bf16_w)
		op_round_bf16(in->w, (size_t)p->D);
	return in;
}

static void *norm_run(struct op_run *r, const void *params, const void *input,
		      const struct op_backend *b)
{
	const struct norm_params *p = params;
	const struct norm_in *in = input;
	struct norm_out *o = op_alloc(r, sizeof(*o));
	struct kt_tensor x = op_tensor(r, b, KT_F32, p->R, p->D, in->x);
	struct kt_tensor res = op_tensor(r, b, KT_F32, p->R, p->D, in->res);
	struct kt_tensor w = p->bf16_w ? op_weight_bf16(r, b, in->w, 1, p->D)
				       : op_tensor(r, b, KT_F32, 1, p->D, in->w);
	struct kt_tensor out = p->in_place ? x : op_tensor(r, b, KT_F32, p->R, p->D, NULL);

	o->rc = kt_rmsnorm(b->be, &out, &x, p->residual ? &res : NULL, &w, eps);
	o->out = op_get(r, b, &out);
	o->x = op_get(r, b, &x);
	return o;
}

/* The norm in double: xref = x (+ residual), ref = w · xref / rms(xref). */
static void norm_reference(const struct norm_params *p, const struct norm_in *in, double *ref,
			   double *xref)
{
	for (int i = 0; i < p->R; i++) {
		double ss = 0.0;

		for (int d = 0; d < p->D; d++) {
			size_t at = (size_t)i * p->D + d;
			double v = (double)in->x[at] + (p->residual ? in->res[at] : 0.0);

			xref[at] = v;
			ss += v * v;
		}
		for (int d = 0; d < p->D; d++) {
			size_t at = (size_t)i * p->D + d;

			ref[at] = in->w[d] * xref[at] / sqrt(ss / p->D + eps);
		}
	}
}

static void norm_check(struct op_run *r, const void *params, const void *input, const void *got,
		       const void *cpu)
{
	const struct norm_params *p = params;
	const struct norm_in *in = input;
	const struct norm_out *g = got, *c = cpu;
	size_t n = (size_t)p->R * p->D;
	double *ref, *xref;

	op_check_rc(r, g->rc, 0, "rmsnorm runs");
	if (c) {
		op_check_close(r, g->out, c->out, n, 1e-5, 1e-12, "out against the cpu");
		if (p->residual && !p->in_place)
			op_check_bits(r, g->x, c->x, n,
				      "x after the residual add equal to the cpu's");
		return;
	}
	ref = op_doubles(r, n);
	xref = op_doubles(r, n);
	norm_reference(p, in, ref, xref);
	op_check_rel(r, g->out, ref, NULL, n, 1e-5, "out against the row in double");
	if (p->residual && !p->in_place)
		op_check_rel(r, g->x, xref, NULL, n, 1e-7, "x after x += residual");
}

static const struct op_family norm = { norm_build, norm_run, norm_check, false };

/* rmsnorm into a bf16 out (a model's input of bf16 products): run twice
 * on fresh copies of x, into bf16 and into f32. The bf16 out must be the
 * f32 out rounded to nearest even, bit for bit (what makes handing a
 * product bf16 x exact), and within a bf16 rounding of the row in double. */
struct norm16_out {
	int rc, rc32;
	float *out, *out32, *x;
};

static void *norm16_run(struct op_run *r, const void *params, const void *input,
			const struct op_backend *b)
{
	const struct norm_params *p = params;
	const struct norm_in *in = input;
	struct norm16_out *o = op_alloc(r, sizeof(*o));
	struct kt_tensor x = op_tensor(r, b, KT_F32, p->R, p->D, in->x);
	struct kt_tensor x32 = op_tensor(r, b, KT_F32, p->R, p->D, in->x);
	struct kt_tensor res = op_tensor(r, b, KT_F32, p->R, p->D, in->res);
	struct kt_tensor w = p->bf16_w ? op_weight_bf16(r, b, in->w, 1, p->D)
				       : op_tensor(r, b, KT_F32, 1, p->D, in->w);
	struct kt_tensor out = op_tensor(r, b, KT_BF16, p->R, p->D, NULL);
	struct kt_tensor out32 = op_tensor(r, b, KT_F32, p->R, p->D, NULL);

	o->rc = kt_rmsnorm(b->be, &out, &x, p->residual ? &res : NULL, &w, eps);
	o->rc32 = kt_rmsnorm(b->be, &out32, &x32, p->residual ? &res : NULL, &w, eps);
	o->out = op_get(r, b, &out);
	o->out32 = op_get(r, b, &out32);
	o->x = op_get(r, b, &x);
	return o;
}

static void norm16_check(struct op_run *r, const void *params, const void *input,
			 const void *got, const void *cpu)
{
	const struct norm_params *p = params;
	const struct norm_in *in = input;
	const struct norm16_out *g = got;
	size_t n = (size_t)p->R * p->D;
	float *rounded = op_dup(r, g->out32, n * sizeof(float));
	double *ref = op_doubles(r, n);

	(void)cpu;
	op_check_rc(r, g->rc, 0, "rmsnorm into bf16 runs");
	op_check_rc(r, g->rc32, 0, "rmsnorm into f32 runs");
	op_round_bf16(rounded, n);
	op_check_bits(r, g->out, rounded, n, "bf16 out equal to the f32 out rounded");
	norm_reference(p, in, ref, op_doubles(r, n));
	op_check_rel(r, g->out, ref, NULL, n, 1.0 / 256, "bf16 out against the row in double");
}

static const struct op_family norm16 = { norm_build, norm16_run, norm16_check, false };

/* rmsnorm_gated: reference (w · x / rms(x)) · z / (1 + e^-z) in double,
 * out within 1e-5 of |ref| (the norm's, then silu's expf and two more
 * products: a few ulps); against the cpu as rmsnorm's out. in->res is z. */
static void *gated_run(struct op_run *r, const void *params, const void *input,
		       const struct op_backend *b)
{
	const struct norm_params *p = params;
	const struct norm_in *in = input;
	struct norm_out *o = op_alloc(r, sizeof(*o));
	struct kt_tensor x = op_tensor(r, b, KT_F32, p->R, p->D, in->x);
	struct kt_tensor z = op_tensor(r, b, KT_F32, p->R, p->D, in->res);
	struct kt_tensor w = p->bf16_w ? op_weight_bf16(r, b, in->w, 1, p->D)
				       : op_tensor(r, b, KT_F32, 1, p->D, in->w);
	struct kt_tensor out = p->in_place ? x : op_tensor(r, b, KT_F32, p->R, p->D, NULL);

	o->rc = kt_rmsnorm_gated(b->be, &out, &x, &z, &w, eps);
	o->out = op_get(r, b, &out);
	return o;
}

static void gated_check(struct op_run *r, const void *params, const void *input, const void *got,
			const void *cpu)
{
	const struct norm_params *p = params;
	const struct norm_in *in = input;
	const struct norm_out *g = got, *c = cpu;
	size_t n = (size_t)p->R * p->D;
	double *ref;

	op_check_rc(r, g->rc, 0, "rmsnorm_gated runs");
	if (c) {
		op_check_close(r, g->out, c->out, n, 1e-5, 1e-12, "out against the cpu");
		return;
	}
	ref = op_doubles(r, n);
	for (int i = 0; i < p->R; i++) {
		const float *x = in->x + (size_t)i * p->D, *z = in->res + (size_t)i * p->D;
		double ss = 0.0;

		for (int d = 0; d < p->D; d++)
			ss += (double)x[d] * x[d];
		for (int d = 0; d < p->D; d++)
			ref[(size_t)i * p->D + d] = in->w[d] * x[d] / sqrt(ss / p->D + eps) *
						    (z[d] / (1.0 + exp(-(double)z[d])));
	}
	op_check_rel(r, g->out, ref, NULL, n, 1e-5, "out against the gated norm in double");
}

static const struct op_family gated = { norm_build, gated_run, gated_check, false };

/* Refusals (x [2, 8], the first rows of a [4, 8] allocation, unless said). */
enum norm_fault {
	W_COLS,        /* w [1, 7] */
	OUT_ROWS,      /* out of one row */
	RESIDUAL_ROWS, /* residual of one row */
	OUT_SHIFTED,   /* out half a row off x */
	EPS_NEGATIVE,
	EPS_NAN,
	GATED_Z_ROWS,  /* rmsnorm_gated: z of one row */
	GATED_OUT_Z,   /* rmsnorm_gated: out is z's memory */
	GATED_EPS,     /* rmsnorm_gated: negative eps */
};

struct norm_fault_params {
	enum norm_fault fault;
};

struct norm_fault_out {
	int rc_call, rc_sync;
	float *x, *out; /* x's allocation [4, 8] and out [2, 8] as left */
};

static void *norm_fault_run(struct op_run *r, const void *params, const void *input,
			    const struct op_backend *b)
{
	const struct norm_fault_params *p = params;
	struct norm_fault_out *o = op_alloc(r, sizeof(*o));
	struct kt_tensor xall = op_tensor(r, b, KT_F32, 4, 8, NULL), x = kt_rows(xall, 0, 2);
	struct kt_tensor w = op_tensor(r, b, KT_F32, 1, 8, NULL);
	struct kt_tensor out = op_tensor(r, b, KT_F32, 2, 8, NULL);
	struct kt_tensor w7 = kt_reshape(w, 1, 7), half = kt_rows(out, 0, 1);
	struct kt_tensor shifted = kt_reshape(kt_rows(kt_reshape(xall, 8, 4), 1, 4), 2, 8);
	float e = p->fault == EPS_NEGATIVE ? -1.0f : p->fault == EPS_NAN ? NAN : eps;

	switch (p->fault) {
	case W_COLS: o->rc_call = kt_rmsnorm(b->be, &out, &x, NULL, &w7, e); break;
	case OUT_ROWS: o->rc_call = kt_rmsnorm(b->be, &half, &x, NULL, &w, e); break;
	case RESIDUAL_ROWS: o->rc_call = kt_rmsnorm(b->be, &out, &x, &half, &w, e); break;
	case OUT_SHIFTED: o->rc_call = kt_rmsnorm(b->be, &shifted, &x, NULL, &w, e); break;
	case EPS_NEGATIVE:
	case EPS_NAN: o->rc_call = kt_rmsnorm(b->be, &out, &x, NULL, &w, e); break;
	case GATED_Z_ROWS: o->rc_call = kt_rmsnorm_gated(b->be, &out, &x, &half, &w, e); break;
	case GATED_OUT_Z: o->rc_call = kt_rmsnorm_gated(b->be, &out, &x, &out, &w, e); break;
	case GATED_EPS: o->rc_call = kt_rmsnorm_gated(b->be, &out, &x, &x, &w, -1.0f); break;
	}
	o->rc_sync = kt_synchronize(b->be);
	o->x = op_get(r, b, &xall);
	o->out = op_get(r, b, &out);
	return o;
}

static void norm_fault_check(struct op_run *r, const void *params, const void *input,
			     const void *got, const void *cpu)
{
	const struct norm_fault_out *g = got;

	op_check_rc(r, g->rc_call, -EINVAL, "refused at the call");
	op_check_rc(r, g->rc_sync, 0, "nothing to report at the sync point");
	op_check_poison(r, g->x, 32, "x left alone");
	op_check_poison(r, g->out, 16, "out left alone");
}

static const struct op_family norm_fault = { NULL, norm_fault_run, norm_fault_check, true };

#define NORM(name, ...) { name, "rmsnorm", &norm, &(const struct norm_params){ __VA_ARGS__ } }
#define NORM16(name, ...) \
	{ name, "rmsnorm", &norm16, &(const struct norm_params){ __VA_ARGS__ } }
#define FAULT(name, f) \
	{ name, "rmsnorm", &norm_fault, &(const struct norm_fault_params){ f } }
#define GATED(name, ...) \
	{ name, "rmsnorm_gated", &gated, &(const struct norm_params){ __VA_ARGS__ } }
#define GFAULT(name, f) \
	{ name, "rmsnorm_gated", &norm_fault, &(const struct norm_fault_params){ f } }

static const struct op_case cases[] = {
	NORM("rmsnorm R=1 D=64", .R = 1, .D = 64, .mag = 1.0f),
	NORM("rmsnorm R=5 D=1024 +residual", .R = 5, .D = 1024, .mag = 3.0f, .residual = true),
	NORM("rmsnorm R=3 D=77 small +residual in place", .R = 3, .D = 77, .mag = 1e-3f,
	     .residual = true, .in_place = true),
	NORM("rmsnorm R=3 D=77 small", .R = 3, .D = 77, .mag = 1e-3f),
	NORM("rmsnorm R=257 D=128 +residual", .R = 257, .D = 128, .mag = 1.0f, .residual = true),
	NORM("rmsnorm R=257 D=128 large in place", .R = 257, .D = 128, .mag = 10.0f,
	     .in_place = true),
	NORM("rmsnorm R=1 D=4096 +residual w bf16", .R = 1, .D = 4096, .mag = 3.0f,
	     .residual = true, .bf16_w = true),
	NORM("rmsnorm R=5 D=1000 +residual", .R = 5, .D = 1000, .mag = 3.0f, .residual = true),
	NORM("rmsnorm R=33 D=129 w bf16", .R = 33, .D = 129, .mag = 3.0f, .bf16_w = true),
	NORM("rmsnorm R=40 D=128 in place w bf16 (per-head)", .R = 40, .D = 128, .mag = 3.0f,
	     .in_place = true, .bf16_w = true),
	NORM("rmsnorm R=3 D=2048 +residual in place w bf16", .R = 3, .D = 2048, .mag = 3.0f,
	     .residual = true, .in_place = true, .bf16_w = true),
	NORM("rmsnorm R=2 D=8194 +residual (wider than the vector kernel)", .R = 2, .D = 8194,
	     .mag = 1.0f, .residual = true),
	NORM("rmsnorm R=1 D=1", .R = 1, .D = 1, .mag = 1.0f),
	NORM16("rmsnorm into bf16 R=1 D=4096 +residual w bf16 (decode)", .R = 1, .D = 4096,
	       .mag = 3.0f, .residual = true, .bf16_w = true),
	NORM16("rmsnorm into bf16 R=257 D=1024 +residual w bf16", .R = 257, .D = 1024,
	       .mag = 3.0f, .residual = true, .bf16_w = true),
	NORM16("rmsnorm into bf16 R=3 D=77 small (the plain kernel)", .R = 3, .D = 77,
	       .mag = 1e-3f),
	NORM16("rmsnorm into bf16 R=2 D=8196 +residual (wider than the vector kernel)", .R = 2,
	       .D = 8196, .mag = 1.0f, .residual = true),
	FAULT("rmsnorm: w of other columns", W_COLS),
	FAULT("rmsnorm: out of other rows", OUT_ROWS),
	FAULT("rmsnorm: residual of other rows", RESIDUAL_ROWS),
	FAULT("rmsnorm: out half a row off x", OUT_SHIFTED),
	FAULT("rmsnorm: negative eps", EPS_NEGATIVE),
	FAULT("rmsnorm: eps NaN", EPS_NAN),
	GATED("rmsnorm_gated R=1 D=128 (a decode row's head)", .R = 1, .D = 128, .mag = 1.0f),
	GATED("rmsnorm_gated R=64 D=128 in place w bf16 (Qwen3-Next heads)", .R = 64, .D = 128,
	      .mag = 3.0f, .in_place = true, .bf16_w = true),
	GATED("rmsnorm_gated R=33 D=77 small", .R = 33, .D = 77, .mag = 1e-3f),
	GATED("rmsnorm_gated R=300 D=64 large in place", .R = 300, .D = 64, .mag = 10.0f,
	      .in_place = true),
	GATED("rmsnorm_gated R=3 D=1", .R = 3, .D = 1, .mag = 1.0f),
	GFAULT("rmsnorm_gated: z of other rows", GATED_Z_ROWS),
	GFAULT("rmsnorm_gated: out over z", GATED_OUT_Z),
	GFAULT("rmsnorm_gated: negative eps", GATED_EPS),
};

OP_LIST(ops_norm, cases);
