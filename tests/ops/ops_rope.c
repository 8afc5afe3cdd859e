/* Cases of rope: rotary embedding in place (rotate-half pairing) over the
 * whole head or its first R dims (partial rotary, R = 2 · inv_freq.cols:
 * D/4 and D/2 here, as Qwen3-Next's 0.25 of 256), alone or with the
 * per-head RMSNorm fused in front (Qwen3's q_norm and k_norm, which still
 * normalises all D dims), and its refusals.
 *
 * Reference: each pair rotated in double by cos/sin of the f32 angle
 * (float)pos · inv_freq[i] (what Hugging Face computes), after the head's
 * norm in double when fused; within 1e-5 of |a·cos| + |b·sin|. On every
 * backend the fused op must equal rmsnorm of the heads followed by rope,
 * bit for bit (the backend.h contract: "as rmsnorm does"). Against the cpu:
 * max_abs 1e-5 (a few f32 ulps: the device's cosf/sinf and the order of
 * the norm's double sum differ), NMSE 1e-12.
 *
 * Positions: the case's largest first, then 0, 1, 2, then random below it
 * (past 4096 and to 100000, where f32 angles lose bits). Head dims: 10, 64,
 * 70, 72, 128, 256; one head to 32. The dims past R are checked like the
 * rotated ones: unchanged (or normalised) within 1e-5 of their value.
 */
#include <errno.h>
#include <math.h>

#include "tests/ops/ops.h"

enum rope_norm { NORM_NONE, NORM_F32, NORM_BF16 };

struct rope_params {
	int T, n_heads, D;
	int rot;     /* R, the rotated dims of a head; 0: D */
	double base;
	int max_pos;
	enum rope_norm norm;
};

struct rope_in {
	float *x, *inv, *w;
	int32_t *pos;
};

struct rope_out {
	int rc, rc_norm, rc_apart;
	float *fused, *apart; /* apart: rmsnorm of the heads, then rope (norm cases) */
};

static const float eps = 1e-6f;

/* inv_freq[i] = base^(-2i / R) for i < R / 2 (Hugging Face's, over the
 * rotated dims). */
static float *inv_freq(struct op_run *r, int R, double base)
{
	float *inv = op_floats(r, (size_t)R / 2);

	for (int i = 0; i < R / 2; i++)
		inv[i] = (float)(1.0 / pow(base, 2.0 * i / R));
	return inv;
}

static int rot_dims(const struct rope_params *p)
{
	return p->rot ? p->rot : p->D;
}

static void *rope_build(struct op_run *r, const void *params, const struct op_backend *target)
{
	const struct rope_params *p = params;
	size_t n = (size_t)p->T * p->n_heads * p->D;
	struct rope_in *in = op_alloc(r, sizeof(*in));

	in->x = op_floats(r, n);
	in->w = op_floats(r, (size_t)p->D);
	in->pos = op_ints(r, (size_t)p->T);
	op_fill(r, in->x, n, 2.0f);
	op_fill(r, in->w, (size_t)p->D, 2.0f);
	if (p->norm == NORM_BF16)
		op_round_bf16(in->w, (size_t)p->D);
	in->inv = inv_freq(r, rot_dims(p), p->base);
	for (int t = 0; t < p->T; t++)
		in->pos[t] = t == 0 ? p->max_pos : t <= 3 ? t - 1 : op_randint(r, p->max_pos + 1);
	return in;
}

static void *rope_run(struct op_run *r, const void *params, const void *input,
		      const struct op_backend *b)
{
	const struct rope_params *p = params;
	const struct rope_in *in = input;
	struct rope_out *o = op_alloc(r, sizeof(*o));
	const int64_t C = (int64_t)p->n_heads * p->D;
	struct kt_tensor x = op_tensor(r, b, KT_F32, p->T, C, in->x);
	struct kt_tensor pos = op_tensor_raw(r, b, KT_I32, p->T, 1, in->pos);
	struct kt_tensor inv = op_tensor(r, b, KT_F32, 1, rot_dims(p) / 2, in->inv);
	struct kt_tensor w = p->norm == NORM_BF16 ? op_weight_bf16(r, b, in->w, 1, p->D)
						  : op_tensor(r, b, KT_F32, 1, p->D, in->w);
	struct kt_tensor y, heads;

	o->rc = kt_rope(b->be, &x, &pos, &inv, p->n_heads, p->D, p->norm ? &w : NULL, eps);
	o->fused = op_get(r, b, &x);
	if (p->norm == NORM_NONE)
		return o;
	y = op_tensor(r, b, KT_F32, p->T, C, in->x);
	heads = kt_reshape(y, (int64_t)p->T * p->n_heads, p->D);
	o->rc_norm = kt_rmsnorm(b->be, &heads, &heads, NULL, &w, eps);
	o->rc_apart = kt_rope(b->be, &y, &pos, &inv, p->n_heads, p->D, NULL, 0.0f);
	o->apart = op_get(r, b, &y);
	return o;
}

/* The rotated (and normalised) rows in double, and their scale. */
static void rope_reference(const struct rope_params *p, const struct rope_in *in, double *ref,
			   double *scale)
{
	const int half = rot_dims(p) / 2, C = p->n_heads * p->D;

	for (int t = 0; t < p->T; t++) {
		for (int h = 0; h < p->n_heads; h++) {
			const size_t at = (size_t)t * C + (size_t)h * p->D;
			const float *x = in->x + at;
			double *ra = ref + at, *sa = scale + at;
			double ss = 0.0, inv_rms = 1.0;

			for (int i = 0; p->norm && i < p->D; i++)
				ss += (double)x[i] * x[i];
			if (p->norm)
				inv_rms = 1.0 / sqrt(ss / p->D + eps);
			for (int i = 0; i < half; i++) {
				/* the angle in f32, as Hugging Face computes it */
				float angle = (float)in->pos[t] * in->inv[i];
				double c = cos((double)angle), s = sin((double)angle);
				double a = x[i], bb = x[i + half];

				if (p->norm) {
					a *= in->w[i] * inv_rms;
					bb *= in->w[i + half] * inv_rms;
				}
				ra[i] = a * c - bb * s;
				ra[i + half] = bb * c + a * s;
				sa[i] = fabs(a * c) + fabs(bb * s);
				sa[i + half] = fabs(bb * c) + fabs(a * s);
			}
			for (int i = 2 * half; i < p->D; i++) {
				ra[i] = p->norm ? (double)x[i] * in->w[i] * inv_rms : x[i];
				sa[i] = fabs(ra[i]);
			}
		}
	}
}

static void rope_check(struct op_run *r, const void *params, const void *input, const void *got,
		       const void *cpu)
{
	const struct rope_params *p = params;
	const struct rope_out *g = got, *c = cpu;
	size_t n = (size_t)p->T * p->n_heads * p->D;
	double *ref, *scale;

	op_check_rc(r, g->rc, 0, "rope runs");
	if (p->norm) {
		op_check_rc(r, g->rc_norm, 0, "rmsnorm of the heads runs");
		op_check_rc(r, g->rc_apart, 0, "rope after it runs");
		op_check_bits(r, g->fused, g->apart, n, "fused norm = rmsnorm then rope");
	}
	if (c) {
		op_check_close(r, g->fused, c->fused, n, 1e-5, 1e-12, "x against the cpu");
		return;
	}
	ref = op_doubles(r, n);
	scale = op_doubles(r, n);
	rope_reference(p, input, ref, scale);
	op_check_rel(r, g->fused, ref, scale, n, 1e-5, "x against the rotation in double");
}

static const struct op_family rope = { rope_build, rope_run, rope_check, false };

/* Refusals, on x [2, 128] (2 heads of 64 unless the case says) with
 * inv_freq [1, 32]. */
enum rope_fault {
	FAULT_NEGATIVE_POS,      /* token 1 at position -1 (device memory) */
	FAULT_NEGATIVE_POS_NORM, /* the same with the fused norm */
	FAULT_INV_COLS,          /* 4 heads of 32: inv_freq [1, 32] rotates 64 dims */
	FAULT_ODD_DIM,           /* head_dim 63 */
	FAULT_INV_EMPTY,         /* inv_freq [1, 0]: no rotated dims */
	FAULT_INV_ROWS,          /* inv_freq [2, 16] */
	FAULT_COLS,              /* 2 heads of 66: x should have 132 columns */
	FAULT_HEAD_DIM_LIMIT,    /* head_dim 258, past max_head_dim */
	FAULT_POS_ROWS,          /* pos of one row for two tokens */
	FAULT_NORM_COLS,         /* norm_w [1, 63] */
	FAULT_NORM_EPS,          /* norm with eps -1 */
};

struct rope_fault_params {
	enum rope_fault fault;
};

struct rope_fault_out {
	int rc_call, rc_sync;
	size_t n;
	float *x, *before; /* the x tensor after the call, and as it was */
	int32_t pos[2];
};

/* x's values for the position cases, from the index alone (run draws no
 * random numbers), and the norm's weights (exact in bf16). */
static float fault_x(int i)
{
	return (float)((i * 37) % 101) / 50.0f - 1.0f;
}

static float fault_w(int i)
{
	return 1.0f + (float)i / 64.0f;
}

static void *rope_fault_run(struct op_run *r, const void *params, const void *input,
			    const struct op_backend *b)
{
	const struct rope_fault_params *p = params;
	const bool bad_pos = p->fault == FAULT_NEGATIVE_POS || p->fault == FAULT_NEGATIVE_POS_NORM;
	struct rope_fault_out *o = op_alloc(r, sizeof(*o));
	float *w = op_floats(r, 64);
	struct kt_tensor x, pos, inv, nw;
	const struct kt_tensor *norm = NULL;
	int heads = 2, D = 64;
	float e = eps;

	o->before = op_floats(r, 256);
	for (int i = 0; i < 256; i++)
		o->before[i] = bad_pos ? fault_x(i) : NAN;
	for (int i = 0; i < 64; i++)
		w[i] = fault_w(i);
	o->pos[0] = 5;
	o->pos[1] = bad_pos ? -1 : 3;
	x = op_tensor(r, b, KT_F32, 2, 128, bad_pos ? o->before : NULL);
	pos = op_tensor_raw(r, b, KT_I32, 2, 1, o->pos);
	inv = op_tensor(r, b, KT_F32, 1, 32, inv_freq(r, 64, 10000.0));
	nw = op_weight(r, b, KT_F32, w, 1, 64);
	switch (p->fault) {
	case FAULT_NEGATIVE_POS_NORM: norm = &nw; break;
	case FAULT_NEGATIVE_POS: break;
	case FAULT_INV_COLS: heads = 4; D = 32; break;
	case FAULT_ODD_DIM: D = 63; break;
	case FAULT_INV_EMPTY: inv = kt_reshape(inv, 1, 0); break;
	case FAULT_INV_ROWS: inv = kt_reshape(inv, 2, 16); break;
	case FAULT_COLS: D = 66; break;
	case FAULT_HEAD_DIM_LIMIT:
		x = op_tensor(r, b, KT_F32, 1, 258, NULL);
		inv = op_tensor(r, b, KT_F32, 1, 129, NULL);
		heads = 1;
		D = 258;
		break;
	case FAULT_POS_ROWS: pos = kt_rows(pos, 0, 1); break;
	case FAULT_NORM_COLS: nw = kt_reshape(nw, 1, 63); norm = &nw; break;
	case FAULT_NORM_EPS: norm = &nw; e = -1.0f; break;
	}
	o->rc_call = kt_rope(b->be, &x, &pos, &inv, heads, D, norm, e);
	o->rc_sync = kt_synchronize(b->be);
	o->n = (size_t)(x.rows * x.cols);
	o->x = op_get(r, b, &x);
	return o;
}

static void rope_fault_check(struct op_run *r, const void *params, const void *input,
			     const void *got, const void *cpu)
{
	const struct rope_fault_params *p = params;
	const struct rope_fault_out *g = got;
	const struct rope_params one = { .T = 1, .n_heads = 2, .D = 64,
					 .norm = p->fault == FAULT_NEGATIVE_POS_NORM ? NORM_F32
										      : NORM_NONE };
	const bool bad[2] = { false, true };
	int32_t pos[2] = { g->pos[0], g->pos[1] };
	struct rope_in in = { .x = g->before, .inv = inv_freq(r, 64, 10000.0),
			      .w = op_floats(r, 64), .pos = pos };
	double ref[128], scale[128];

	if (p->fault != FAULT_NEGATIVE_POS && p->fault != FAULT_NEGATIVE_POS_NORM) {
		op_check_rc(r, g->rc_call, -EINVAL, "refused at the call");
		op_check_rc(r, g->rc_sync, 0, "nothing to report at the sync point");
		op_check_poison(r, g->x, g->n, "x left alone");
		return;
	}
	if (!op_check_fault(r, g->rc_call, g->rc_sync, g->x, g->before, bad, 2, 128,
			    OP_FAULT_UNTOUCHED, "a negative position"))
		return;
	for (int i = 0; i < 64; i++)
		in.w[i] = fault_w(i);
	rope_reference(&one, &in, ref, scale);
	op_check_rel(r, g->x, ref, scale, 128, 1e-5, "the token at a good position rotated");
}

static const struct op_family rope_fault = { NULL, rope_fault_run, rope_fault_check, true };

#define ROPE(name, ...) { name, "rope", &rope, &(const struct rope_params){ __VA_ARGS__ } }
#define FAULT(name, f) { name, "rope", &rope_fault, &(const struct rope_fault_params){ f } }

static const struct op_case cases[] = {
	ROPE("rope T=1 heads=16 D=64 pos<=2047", .T = 1, .n_heads = 16, .D = 64, .base = 1e4,
	     .max_pos = 2047),
	ROPE("rope T=6 heads=4 D=128 pos<=40000", .T = 6, .n_heads = 4, .D = 128, .base = 1e6,
	     .max_pos = 40000),
	ROPE("rope T=5 heads=3 D=72 pos<=100000", .T = 5, .n_heads = 3, .D = 72, .base = 1e4,
	     .max_pos = 100000),
	ROPE("rope T=300 heads=2 D=64 pos<=8191", .T = 300, .n_heads = 2, .D = 64, .base = 1e6,
	     .max_pos = 8191),
	ROPE("rope T=17 heads=8 D=128", .T = 17, .n_heads = 8, .D = 128, .base = 1e6,
	     .max_pos = 4095),
	ROPE("rope T=1 heads=32 D=128", .T = 1, .n_heads = 32, .D = 128, .base = 1e6,
	     .max_pos = 4095),
	ROPE("rope T=9 heads=4 D=64", .T = 9, .n_heads = 4, .D = 64, .base = 1e6, .max_pos = 4095),
	ROPE("rope T=5 heads=3 D=256", .T = 5, .n_heads = 3, .D = 256, .base = 1e6,
	     .max_pos = 4095),
	ROPE("rope T=4 heads=2 D=10", .T = 4, .n_heads = 2, .D = 10, .base = 1e6, .max_pos = 4095),
	ROPE("rope T=1 heads=1 D=2", .T = 1, .n_heads = 1, .D = 2, .base = 1e4, .max_pos = 7),
	ROPE("rope+norm T=7 heads=4 D=128 w f32", .T = 7, .n_heads = 4, .D = 128, .base = 1e6,
	     .max_pos = 4095, .norm = NORM_F32),
	ROPE("rope+norm T=3 heads=2 D=64 w f32", .T = 3, .n_heads = 2, .D = 64, .base = 1e6,
	     .max_pos = 4095, .norm = NORM_F32),
	ROPE("rope+norm T=1 heads=32 D=128 w bf16 (Qwen3 q)", .T = 1, .n_heads = 32, .D = 128,
	     .base = 1e6, .max_pos = 4095, .norm = NORM_BF16),
	ROPE("rope+norm T=7 heads=8 D=128 w bf16 (Qwen3 k)", .T = 7, .n_heads = 8, .D = 128,
	     .base = 1e6, .max_pos = 4095, .norm = NORM_BF16),
	ROPE("rope+norm T=40 heads=16 D=128 w f32", .T = 40, .n_heads = 16, .D = 128,
	     .base = 1e6, .max_pos = 4095, .norm = NORM_F32),
	ROPE("rope+norm T=3 heads=9 D=256 w bf16", .T = 3, .n_heads = 9, .D = 256, .base = 1e6,
	     .max_pos = 4095, .norm = NORM_BF16),
	ROPE("rope+norm T=5 heads=3 D=70 w f32", .T = 5, .n_heads = 3, .D = 70, .base = 1e6,
	     .max_pos = 4095, .norm = NORM_F32),
	ROPE("rope+norm T=2 heads=11 D=10 w bf16", .T = 2, .n_heads = 11, .D = 10, .base = 1e6,
	     .max_pos = 4095, .norm = NORM_BF16),
	ROPE("rope partial R=16 T=5 heads=4 D=64", .T = 5, .n_heads = 4, .D = 64, .rot = 16,
	     .base = 1e4, .max_pos = 4095),
	ROPE("rope partial R=32 T=6 heads=3 D=64", .T = 6, .n_heads = 3, .D = 64, .rot = 32,
	     .base = 1e6, .max_pos = 40000),
	ROPE("rope partial R=64 T=1 heads=16 D=256 (Qwen3-Next)", .T = 1, .n_heads = 16,
	     .D = 256, .rot = 64, .base = 1e7, .max_pos = 4095),
	ROPE("rope partial R=128 T=9 heads=2 D=256", .T = 9, .n_heads = 2, .D = 256, .rot = 128,
	     .base = 1e7, .max_pos = 100000),
	ROPE("rope partial R=2 T=3 heads=2 D=10", .T = 3, .n_heads = 2, .D = 10, .rot = 2,
	     .base = 1e4, .max_pos = 4095),
	ROPE("rope+norm partial R=64 T=7 heads=16 D=256 w bf16 (Qwen3-Next q)", .T = 7,
	     .n_heads = 16, .D = 256, .rot = 64, .base = 1e7, .max_pos = 4095,
	     .norm = NORM_BF16),
	ROPE("rope+norm partial R=64 T=3 heads=2 D=128 w f32", .T = 3, .n_heads = 2, .D = 128,
	     .rot = 64, .base = 1e6, .max_pos = 4095, .norm = NORM_F32),
	ROPE("rope+norm partial R=32 T=40 heads=4 D=128 w f32", .T = 40, .n_heads = 4, .D = 128,
	     .rot = 32, .base = 1e6, .max_pos = 8191, .norm = NORM_F32),
	FAULT("rope: a negative position", FAULT_NEGATIVE_POS),
	FAULT("rope+norm: a negative position", FAULT_NEGATIVE_POS_NORM),
	FAULT("rope: inv_freq of other columns", FAULT_INV_COLS),
	FAULT("rope: odd head_dim", FAULT_ODD_DIM),
	FAULT("rope: inv_freq of no columns", FAULT_INV_EMPTY),
	FAULT("rope: inv_freq of two rows", FAULT_INV_ROWS),
	FAULT("rope: heads x head_dim other than x's columns", FAULT_COLS),
	FAULT("rope: head_dim past max_head_dim", FAULT_HEAD_DIM_LIMIT),
	FAULT("rope: pos of other rows", FAULT_POS_ROWS),
	FAULT("rope+norm: norm_w of other columns", FAULT_NORM_COLS),
	FAULT("rope+norm: negative eps", FAULT_NORM_EPS),
};

OP_LIST(ops_rope, cases);
