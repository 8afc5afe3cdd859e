/* Cases of the elementwise ops: swiglu (out = silu(gate) · up), add
 * (y += x) and sigmoid_mul (out = x · sigmoid(g), g per element or per
 * row), out of place and in place, swiglu of the halves of fused gate_up
 * rows (I a multiple of 4 or not, rows past the grid's 65,535), and their
 * refusals.
 *
 * Reference: swiglu in double within 1e-5 of |ref|; add within 1e-7 of
 * |x| + |y| and x += x exactly 2x. Against the cpu: add is bitwise (one f32
 * addition either way); swiglu within a few f32 ulps of its outputs (the
 * device's expf differs in the last bits): max_abs 4e-6 for outputs of a few
 * units, NMSE 1e-12, and a case with larger outputs scales max_abs with them.
 * sigmoid_mul: x / (1 + e^-g) in double within 1e-6 of |ref| (expf, one
 * add, a division and a product: a few ulps); against the cpu max_abs 2e-6
 * on outputs below 2 (the device's expf), NMSE 1e-12. swiglu into a bf16
 * out runs beside an f32 out on the same backend and must be it rounded,
 * bit for bit, and within a bf16 rounding (1/256) of the double.
 */
#include <errno.h>
#include <math.h>

#include "tests/ops/ops.h"

struct swiglu_params {
	int T, I;
	float mag;       /* of gate: silu's tails and its middle */
	bool in_place;   /* out = gate */
	bool halves;     /* up NULL: gate [T, 2I] holds gate | up per row */
	double pair_tol; /* max_abs against the cpu; 0: 4e-6 */
	bool bf16_out;   /* out bf16, run beside an f32 out: the f32 out rounded, bitwise */
};

struct ew_in {
	float *a, *b; /* swiglu: gate, up; add: y, x */
	float *gu;    /* swiglu halves: [T, 2I] gate | up */
};

struct ew_out {
	int rc, rc2;
	float *out, *out2; /* swiglu: out; add: y after y += x, x after x += x */
};

static void *swiglu_build(struct op_run *r, const void *params, const struct op_backend *target)
{
	const struct swiglu_params *p = params;
	size_t n = (size_t)p->T * p->I;
	struct ew_in *in = op_alloc(r, sizeof(*in));

	in->a = op_floats(r, n);
	in->b = op_floats(r, n);
	op_fill(r, in->a, n, p->mag);
	op_fill(r, in->b, n, 1.0f);
	if (p->halves) {
		/* The same values as one [T, 2I] tensor: row t = gate row | up row. */
		in->gu = op_floats(r, 2 * n);
		for (int t = 0; t < p->T; t++)
			for (int i = 0; i < p->I; i++) {
				in->gu[(size_t)t * 2 * p->I + (size_t)i] = in->a[(size_t)t * p->I + i];
				in->gu[(size_t)t * 2 * p->I + p->I + (size_t)i] =
					in->b[(size_t)t * p->I + i];
			}
	}
	return in;
}

static void *swiglu_run(struct op_run *r, const void *params, const void *input,
			const struct op_backend *b)
{
	const struct swiglu_params *p = params;
	const struct ew_in *in = input;
	struct ew_out *o = op_alloc(r, sizeof(*o));
	const enum kt_dtype odt = p->bf16_out ? KT_BF16 : KT_F32;
	if (p->halves) {
		struct kt_tensor gu = op_tensor(r, b, KT_F32, p->T, 2 * (int64_t)p->I, in->gu);
		struct kt_tensor out = op_tensor(r, b, odt, p->T, p->I, NULL);
		o->rc = kt_swiglu(b->be, &out, &gu, NULL);
		o->out = op_get(r, b, &out);
		if (p->bf16_out) {
			struct kt_tensor out32 = op_tensor(r, b, KT_F32, p->T, p->I, NULL);
			o->rc2 = kt_swiglu(b->be, &out32, &gu, NULL);
			o->out2 = op_get(r, b, &out32);
		}
		return o;
	}
	struct kt_tensor g = op_tensor(r, b, KT_F32, p->T, p->I, in->a);
	struct kt_tensor u = op_tensor(r, b, KT_F32, p->T, p->I, in->b);
	struct kt_tensor out = p->in_place ? g : op_tensor(r, b, odt, p->T, p->I, NULL);

	o->rc = kt_swiglu(b->be, &out, &g, &u);
	o->out = op_get(r, b, &out);
	if (p->bf16_out) {
		struct kt_tensor out32 = op_tensor(r, b, KT_F32, p->T, p->I, NULL);
		o->rc2 = kt_swiglu(b->be, &out32, &g, &u);
		o->out2 = op_get(r, b, &out32);
	}
	return o;
}

static void swiglu_check(struct op_run *r, const void *params, const void *input, const void *got,
			 const void *cpu)
{
	const struct swiglu_params *p = params;
	const struct ew_in *in = input;
	const struct ew_out *g = got, *c = cpu;
	size_t n = (size_t)p->T * p->I;
	double *ref;

	op_check_rc(r, g->rc, 0, "swiglu runs");
	if (p->bf16_out) {
		float *rounded = op_dup(r, g->out2, n * sizeof(float));

		op_check_rc(r, g->rc2, 0, "swiglu into f32 runs");
		op_round_bf16(rounded, n);
		op_check_bits(r, g->out, rounded, n, "bf16 out equal to the f32 out rounded");
	}
	if (c && !p->bf16_out) {
		op_check_close(r, g->out, c->out, n, p->pair_tol > 0 ? p->pair_tol : 4e-6, 1e-12,
			       "out against the cpu");
		return;
	}
	ref = op_doubles(r, n);
	for (size_t i = 0; i < n; i++)
		ref[i] = in->a[i] / (1.0 + exp(-(double)in->a[i])) * in->b[i];
	op_check_rel(r, g->out, ref, NULL, n, p->bf16_out ? 1.0 / 256 : 1e-5,
		     "out against silu(gate) · up in double");
}

static const struct op_family swiglu = { swiglu_build, swiglu_run, swiglu_check, false };

struct add_params {
	int R, D;
};

static void *add_build(struct op_run *r, const void *params, const struct op_backend *target)
{
	const struct add_params *p = params;
	size_t n = (size_t)p->R * p->D;
	struct ew_in *in = op_alloc(r, sizeof(*in));

	in->a = op_floats(r, n);
	in->b = op_floats(r, n);
	op_fill(r, in->a, n, 1.0f);
	op_fill(r, in->b, n, 1.0f);
	return in;
}

static void *add_run(struct op_run *r, const void *params, const void *input,
		     const struct op_backend *b)
{
	const struct add_params *p = params;
	const struct ew_in *in = input;
	struct ew_out *o = op_alloc(r, sizeof(*o));
	struct kt_tensor y = op_tensor(r, b, KT_F32, p->R, p->D, in->a);
	struct kt_tensor x = op_tensor(r, b, KT_F32, p->R, p->D, in->b);

	o->rc = kt_add(b->be, &y, &x);
	o->rc2 = kt_add(b->be, &x, &x);
	o->out = op_get(r, b, &y);
	o->out2 = op_get(r, b, &x);
	return o;
}

static void add_check(struct op_run *r, const void *params, const void *input, const void *got,
		      const void *cpu)
{
	const struct add_params *p = params;
	const struct ew_in *in = input;
	const struct ew_out *g = got, *c = cpu;
	size_t n = (size_t)p->R * p->D;
	double *ref, *scale, *twice;

	op_check_rc(r, g->rc, 0, "y += x runs");
	op_check_rc(r, g->rc2, 0, "x += x runs");
	if (c) {
		op_check_bits(r, g->out, c->out, n, "y += x equal to the cpu's");
		op_check_bits(r, g->out2, c->out2, n, "x += x equal to the cpu's");
		return;
	}
	ref = op_doubles(r, n);
	scale = op_doubles(r, n);
	twice = op_doubles(r, n);
	for (size_t i = 0; i < n; i++) {
		ref[i] = (double)in->a[i] + in->b[i];
		scale[i] = fabs(in->a[i]) + fabs(in->b[i]);
		twice[i] = 2.0 * in->b[i];
	}
	op_check_rel(r, g->out, ref, scale, n, 1e-7, "y += x against the sum in double");
	op_check_rel(r, g->out2, twice, NULL, n, 0.0, "x += x is exactly 2x");
}

static const struct op_family add = { add_build, add_run, add_check, false };

struct sigmul_params {
	int R, D;
	bool row_gate; /* g [R, 1] */
	bool in_place; /* out = x */
	float mag;     /* of g */
};

static void *sigmul_build(struct op_run *r, const void *params, const struct op_backend *target)
{
	const struct sigmul_params *p = params;
	size_t n = (size_t)p->R * p->D;
	struct ew_in *in = op_alloc(r, sizeof(*in));

	in->a = op_floats(r, n);
	in->b = op_floats(r, p->row_gate ? (size_t)p->R : n);
	op_fill(r, in->a, n, 2.0f);
	op_fill(r, in->b, p->row_gate ? (size_t)p->R : n, p->mag);
	return in;
}

static void *sigmul_run(struct op_run *r, const void *params, const void *input,
			const struct op_backend *b)
{
	const struct sigmul_params *p = params;
	const struct ew_in *in = input;
	struct ew_out *o = op_alloc(r, sizeof(*o));
	struct kt_tensor x = op_tensor(r, b, KT_F32, p->R, p->D, in->a);
	struct kt_tensor g = op_tensor(r, b, KT_F32, p->R, p->row_gate ? 1 : p->D, in->b);
	struct kt_tensor out = p->in_place ? x : op_tensor(r, b, KT_F32, p->R, p->D, NULL);

	o->rc = kt_sigmoid_mul(b->be, &out, &x, &g);
	o->out = op_get(r, b, &out);
	return o;
}

static void sigmul_check(struct op_run *r, const void *params, const void *input,
			 const void *got, const void *cpu)
{
	const struct sigmul_params *p = params;
	const struct ew_in *in = input;
	const struct ew_out *g = got, *c = cpu;
	size_t n = (size_t)p->R * p->D;
	double *ref;

	op_check_rc(r, g->rc, 0, "sigmoid_mul runs");
	if (c) {
		op_check_close(r, g->out, c->out, n, 2e-6, 1e-12, "out against the cpu");
		return;
	}
	ref = op_doubles(r, n);
	for (size_t i = 0; i < n; i++) {
		const double gv = in->b[p->row_gate ? i / (size_t)p->D : i];

		ref[i] = in->a[i] / (1.0 + exp(-gv));
	}
	op_check_rel(r, g->out, ref, NULL, n, 1e-6, "out against x · sigmoid(g) in double");
}

static const struct op_family sigmul = { sigmul_build, sigmul_run, sigmul_check, false };

/* Refusals: shapes that do not match, outputs that partly overlap inputs. */
enum ew_fault {
	SWIGLU_UP_COLS,     /* up [2, 9] for gate [2, 10] */
	SWIGLU_OUT_SHIFTED, /* out overlaps gate and up half a row off */
	ADD_COLS,           /* x [300, 1023] for y [300, 1024] */
	ADD_ROWS,           /* x [3, 8] for y [4, 8] */
	ADD_SHIFTED,        /* x overlaps y half a row off */
	SIGMUL_G_COLS,      /* g [4, 2] for x [4, 10] */
	SIGMUL_G_ROWS,      /* g [3, 1] for x [4, 10] */
	SIGMUL_OUT_OVER_G,  /* a row gate [4, 1] inside out */
};

struct ew_fault_params {
	enum ew_fault fault;
};

struct ew_fault_out {
	int rc_call, rc_sync;
	size_t n;
	float *dst; /* the output's memory after the call */
};

static void *ew_fault_run(struct op_run *r, const void *params, const void *input,
			  const struct op_backend *b)
{
	const struct ew_fault_params *p = params;
	struct ew_fault_out *o = op_alloc(r, sizeof(*o));
	struct kt_tensor big = op_tensor(r, b, KT_F32, 300, 1024, NULL);
	struct kt_tensor small = op_tensor(r, b, KT_F32, 300, 1023, NULL);
	struct kt_tensor a = kt_reshape(big, 4, 10), u = kt_reshape(small, 2, 9), dst = a;

	switch (p->fault) {
	case SWIGLU_UP_COLS:
		a = kt_reshape(a, 2, 10);
		dst = a;
		o->rc_call = kt_swiglu(b->be, &a, &a, &u);
		break;
	case SWIGLU_OUT_SHIFTED: {
		struct kt_tensor a5 = kt_reshape(big, 2, 5);

		dst = kt_reshape(kt_rows(kt_reshape(big, 4, 5), 1, 2), 2, 5);
		o->rc_call = kt_swiglu(b->be, &dst, &a5, &a5);
		break;
	}
	case ADD_COLS:
		dst = big;
		o->rc_call = kt_add(b->be, &big, &small);
		break;
	case ADD_ROWS: {
		struct kt_tensor x = kt_reshape(small, 3, 8);

		dst = kt_reshape(big, 4, 8);
		o->rc_call = kt_add(b->be, &dst, &x);
		break;
	}
	case ADD_SHIFTED: {
		struct kt_tensor x = kt_rows(kt_reshape(big, 8, 4), 1, 4);

		dst = kt_reshape(big, 4, 4);
		x = kt_reshape(x, 4, 4);
		o->rc_call = kt_add(b->be, &dst, &x);
		break;
	}
	case SIGMUL_G_COLS:
	case SIGMUL_G_ROWS: {
		struct kt_tensor g = p->fault == SIGMUL_G_COLS ? kt_reshape(small, 4, 2)
							       : kt_reshape(small, 3, 1);

		o->rc_call = kt_sigmoid_mul(b->be, &a, &a, &g);
		break;
	}
	case SIGMUL_OUT_OVER_G: {
		struct kt_tensor g = kt_reshape(kt_rows(kt_reshape(big, 40, 1), 5, 4), 4, 1);

		o->rc_call = kt_sigmoid_mul(b->be, &a, &a, &g);
		break;
	}
	}
	o->rc_sync = kt_synchronize(b->be);
	o->n = (size_t)(big.rows * big.cols);
	o->dst = op_get(r, b, &big);
	return o;
}

static void ew_fault_check(struct op_run *r, const void *params, const void *input,
			   const void *got, const void *cpu)
{
	const struct ew_fault_out *g = got;

	op_check_rc(r, g->rc_call, -EINVAL, "refused at the call");
	op_check_rc(r, g->rc_sync, 0, "nothing to report at the sync point");
	op_check_poison(r, g->dst, g->n, "nothing written");
}

static const struct op_family ew_fault = { NULL, ew_fault_run, ew_fault_check, true };

#define SWIGLU(name, ...) \
	{ name, "swiglu", &swiglu, &(const struct swiglu_params){ __VA_ARGS__ } }
#define ADD(name, ...) { name, "add", &add, &(const struct add_params){ __VA_ARGS__ } }
#define SIGMUL(name, ...) \
	{ name, "sigmoid_mul", &sigmul, &(const struct sigmul_params){ __VA_ARGS__ } }
#define FAULT(name, op, f) { name, op, &ew_fault, &(const struct ew_fault_params){ f } }

static const struct op_case cases[] = {
	SWIGLU("swiglu T=1 I=77 gate 4", .T = 1, .I = 77, .mag = 4.0f),
	SWIGLU("swiglu T=3 I=3072 gate 20 in place", .T = 3, .I = 3072, .mag = 20.0f,
	       .in_place = true, .pair_tol = 1.5e-5),
	SWIGLU("swiglu T=40 I=1000 gate 2", .T = 40, .I = 1000, .mag = 2.0f),
	SWIGLU("swiglu T=1 I=12288 gate 6", .T = 1, .I = 12288, .mag = 6.0f),
	SWIGLU("swiglu T=1 I=12288 gate 6 in place", .T = 1, .I = 12288, .mag = 6.0f,
	       .in_place = true),
	SWIGLU("swiglu T=7 I=1000 gate 6", .T = 7, .I = 1000, .mag = 6.0f),
	SWIGLU("swiglu T=7 I=1000 gate 6 in place", .T = 7, .I = 1000, .mag = 6.0f,
	       .in_place = true),
	SWIGLU("swiglu T=33 I=129 gate 6", .T = 33, .I = 129, .mag = 6.0f),
	SWIGLU("swiglu halves T=1 I=768 gate 6", .T = 1, .I = 768, .mag = 6.0f, .halves = true),
	SWIGLU("swiglu halves T=37 I=129 gate 6", .T = 37, .I = 129, .mag = 6.0f, .halves = true),
	SWIGLU("swiglu halves T=70 I=1100 gate 6", .T = 70, .I = 1100, .mag = 6.0f, .halves = true),
	SWIGLU("swiglu halves T=65600 I=4 gate 6", .T = 65600, .I = 4, .mag = 6.0f,
	       .halves = true),
	SWIGLU("swiglu into bf16 T=1 I=12288 gate 6", .T = 1, .I = 12288, .mag = 6.0f,
	       .bf16_out = true),
	SWIGLU("swiglu into bf16 T=40 I=1000 gate 20", .T = 40, .I = 1000, .mag = 20.0f,
	       .bf16_out = true),
	SWIGLU("swiglu halves into bf16 T=37 I=129 gate 6", .T = 37, .I = 129, .mag = 6.0f,
	       .halves = true, .bf16_out = true),
	SWIGLU("swiglu halves into bf16 T=70 I=1100 gate 6", .T = 70, .I = 1100, .mag = 6.0f,
	       .halves = true, .bf16_out = true),
	SWIGLU("swiglu T=33 I=129 gate 6 in place", .T = 33, .I = 129, .mag = 6.0f,
	       .in_place = true),
	ADD("add R=5 D=333", .R = 5, .D = 333),
	ADD("add R=1 D=12288", .R = 1, .D = 12288),
	ADD("add R=7 D=1000", .R = 7, .D = 1000),
	ADD("add R=33 D=129", .R = 33, .D = 129),
	ADD("add R=1 D=1", .R = 1, .D = 1),
	FAULT("swiglu: up of other columns", "swiglu", SWIGLU_UP_COLS),
	FAULT("swiglu: out half a row off gate and up", "swiglu", SWIGLU_OUT_SHIFTED),
	FAULT("add: x of other columns", "add", ADD_COLS),
	FAULT("add: x of other rows", "add", ADD_ROWS),
	FAULT("add: x half a row off y", "add", ADD_SHIFTED),
	SIGMUL("sigmoid_mul R=1 D=4096 gate 6 (attention output gate)", .R = 1, .D = 4096,
	       .mag = 6.0f),
	SIGMUL("sigmoid_mul R=7 D=1000 gate 20 in place", .R = 7, .D = 1000, .mag = 20.0f,
	       .in_place = true),
	SIGMUL("sigmoid_mul R=33 D=129 gate 4", .R = 33, .D = 129, .mag = 4.0f),
	SIGMUL("sigmoid_mul R=40 D=2048 row gates 6 (shared expert)", .R = 40, .D = 2048,
	       .row_gate = true, .mag = 6.0f),
	SIGMUL("sigmoid_mul R=5 D=77 row gates 20 in place", .R = 5, .D = 77, .row_gate = true,
	       .in_place = true, .mag = 20.0f),
	SIGMUL("sigmoid_mul R=3 D=1 row gates", .R = 3, .D = 1, .row_gate = true, .mag = 4.0f),
	FAULT("sigmoid_mul: g of two columns", "sigmoid_mul", SIGMUL_G_COLS),
	FAULT("sigmoid_mul: g of other rows", "sigmoid_mul", SIGMUL_G_ROWS),
	FAULT("sigmoid_mul: a row gate inside out", "sigmoid_mul", SIGMUL_OUT_OVER_G),
};

OP_LIST(ops_elementwise, cases);
