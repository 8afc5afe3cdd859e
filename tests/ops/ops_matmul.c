/* Cases of matmul: y = x · wᵀ (+ bias), its batch invariance and its
 * refusals.
 *
 * Weights come three ways: an f32 tensor (kt_alloc'd), a weight from bf16
 * values (kt_weight: the cpu widens it exactly, cuda keeps bf16), and a
 * tensor kt_alloc'd in the backend's weight dtype (wider in K than any
 * kt_weight, which makes cuda split K over its workspace). x is random f32
 * or already bf16-exact.
 *
 * Reference: |y - ref| <= 1e-5 · Σ_k |x_k w_k| (+ |bias|) per element, ref
 * in double over the values the backend holds. Against the cpu, with w bf16
 * or f32: given bf16-exact x both backends form the same exact products and
 * differ only in f32 accumulation, |cuda - cpu| <= 1e-4 · Σ|x w| per
 * element and NMSE <= 1e-8; given other x, cuda rounds x to bf16 (an 8-bit
 * significand) and the cpu does not: NMSE <= 1e-4. Both cuda paths are hit:
 * the GEMV (bf16 w, T <= CUDA_GEMV_MAX_T, K % 8 == 0) at every T up to its
 * bound and past it, and cuBLAS for the rest, with rows past max_tokens.
 * x handed over as a bf16 tensor (what rmsnorm and swiglu write for a
 * backend with matmul_x_bf16) must give y bit for bit as the same values
 * in an f32 tensor, on every path.
 */
#include <assert.h>
#include <errno.h>
#include <math.h>
#include <string.h>

#include "kernels/cuda/cuda_gemv.h"
#include "tests/ops/ops.h"

enum mm_w {
	W_F32,       /* an f32 tensor */
	W_BF16,      /* a weight from bf16 values */
	W_BF16_WIDE, /* bf16 values in a tensor of the backend's weight dtype */
};

enum mm_bias { BIAS_NONE, BIAS_BF16, BIAS_F32 };

struct mm_params {
	int T, K, N;
	enum mm_w w;
	bool x_bf16; /* x bf16-exact */
	bool x_tensor_bf16; /* and handed over as a bf16 tensor (with a bf16 w) */
	enum mm_bias bias;
};

struct mm_in {
	float *x, *w, *bias;
};

struct mm_out {
	int rc, rc32;
	float *y, *y32; /* y32: with x_tensor_bf16, y of the same x as an f32 tensor */
};

static void *mm_build(struct op_run *r, const void *params, const struct op_backend *target)
{
	const struct mm_params *p = params;
	size_t nx = (size_t)p->T * p->K, nw = (size_t)p->N * p->K;
	struct mm_in *in = op_alloc(r, sizeof(*in));

	in->x = op_floats(r, nx);
	in->w = op_floats(r, nw);
	in->bias = op_floats(r, (size_t)p->N);
	op_fill(r, in->x, nx, 1.0f);
	op_fill(r, in->w, nw, 0.5f);
	op_fill(r, in->bias, (size_t)p->N, 1.0f);
	if (p->x_bf16)
		op_round_bf16(in->x, nx);
	if (p->w != W_F32)
		op_round_bf16(in->w, nw);
	if (p->bias == BIAS_BF16)
		op_round_bf16(in->bias, (size_t)p->N);
	return in;
}

/* w as the case asks for it on b. */
static struct kt_tensor mm_weight(struct op_run *r, const struct op_backend *b, enum mm_w kind,
				  const float *w, int N, int K)
{
	if (kind == W_BF16)
		return op_weight_bf16(r, b, w, N, K);
	return op_tensor(r, b, kind == W_F32 ? KT_F32 : b->weight_dtype, N, K, w);
}

static void *mm_run(struct op_run *r, const void *params, const void *input,
		    const struct op_backend *b)
{
	const struct mm_params *p = params;
	const struct mm_in *in = input;
	struct mm_out *o = op_alloc(r, sizeof(*o));
	struct kt_tensor x = op_tensor(r, b, KT_F32, p->T, p->K, in->x);
	struct kt_tensor w = mm_weight(r, b, p->w, in->w, p->N, p->K);
	struct kt_tensor y = op_tensor(r, b, KT_F32, p->T, p->N, NULL), bias;

	if (p->bias == BIAS_BF16)
		bias = op_weight_bf16(r, b, in->bias, 1, p->N);
	else
		bias = op_tensor(r, b, KT_F32, 1, p->N, in->bias);
	if (p->x_tensor_bf16) {
		struct kt_tensor x16 = op_tensor(r, b, KT_BF16, p->T, p->K, in->x);
		struct kt_tensor y32 = op_tensor(r, b, KT_F32, p->T, p->N, NULL);

		o->rc32 = kt_matmul(b->be, &y32, &x, &w, p->bias ? &bias : NULL);
		o->y32 = op_get(r, b, &y32);
		x = x16;
	}
	o->rc = kt_matmul(b->be, &y, &x, &w, p->bias ? &bias : NULL);
	o->y = op_get(r, b, &y);
	return o;
}

/* The exact product in double and its scale Σ|x w| (+ |bias|). */
static void mm_reference(const struct mm_params *p, const struct mm_in *in, double *ref,
			 double *scale)
{
	for (int t = 0; t < p->T; t++) {
		const float *x = in->x + (size_t)t * p->K;

		for (int j = 0; j < p->N; j++) {
			const float *w = in->w + (size_t)j * p->K;
			double s = p->bias ? in->bias[j] : 0.0;
			double a = p->bias ? fabs(in->bias[j]) : 0.0;

			for (int k = 0; k < p->K; k++) {
				double v = (double)x[k] * w[k];

				s += v;
				a += fabs(v);
			}
			ref[(size_t)t * p->N + j] = s;
			scale[(size_t)t * p->N + j] = a;
		}
	}
}

static void mm_check(struct op_run *r, const void *params, const void *input, const void *got,
		     const void *cpu)
{
	const struct mm_params *p = params;
	const struct mm_out *g = got, *c = cpu;
	size_t n = (size_t)p->T * p->N;
	double *ref = op_doubles(r, n), *scale = op_doubles(r, n);

	op_check_rc(r, g->rc, 0, "matmul runs");
	if (p->x_tensor_bf16) {
		op_check_rc(r, g->rc32, 0, "matmul of the f32 x runs");
		op_check_bits(r, g->y, g->y32, n, "y of bf16 x equal to y of the same f32 x");
	}
	if (c && p->w != W_F32 && !p->x_bf16) {
		op_check_close(r, g->y, c->y, n, INFINITY, 1e-4,
			       "y against the cpu (x rounded to bf16 on one side only)");
		return;
	}
	mm_reference(p, input, ref, scale);
	if (!c) {
		op_check_rel(r, g->y, ref, scale, n, 1e-5, "y against x · wᵀ in double");
		return;
	}
	for (size_t i = 0; i < n; i++)
		ref[i] = c->y[i];
	op_check_rel(r, g->y, ref, scale, n, 1e-4, "y against the cpu, per Σ|x·w|");
	op_check_close(r, g->y, c->y, n, INFINITY, 1e-8, "y against the cpu");
}

static const struct op_family matmul = { mm_build, mm_run, mm_check, false };

/* Batch invariance (DESIGN §4.1): each row of x alone, then batches of rows
 * (windows), and the whole batch on a second backend of the same kind opened
 * with one thread; a batch the backend promises invariant
 * (op_matmul_invariant) must give every row's bits as alone. */
#define MAX_WINDOWS 24

struct inv_params {
	int R, K, N;
	bool bf16; /* bf16 w and bias (else f32 tensors) */
	int windows[MAX_WINDOWS][2]; /* first row, rows; rows 0 ends the list */
};

struct inv_out {
	int rc;
	float *alone, *windows[MAX_WINDOWS], *other; /* other: the whole batch, 1 thread */
	bool promised[MAX_WINDOWS], other_promised;
};

static void *inv_build(struct op_run *r, const void *params, const struct op_backend *target)
{
	const struct inv_params *p = params;
	struct mm_in *in = op_alloc(r, sizeof(*in));

	in->x = op_floats(r, (size_t)p->R * p->K);
	in->w = op_floats(r, (size_t)p->N * p->K);
	in->bias = op_floats(r, (size_t)p->N);
	op_fill(r, in->x, (size_t)p->R * p->K, 1.0f);
	op_fill(r, in->w, (size_t)p->N * p->K, 0.5f);
	op_fill(r, in->bias, (size_t)p->N, 1.0f);
	if (p->bf16) {
		op_round_bf16(in->w, (size_t)p->N * p->K);
		op_round_bf16(in->bias, (size_t)p->N);
	}
	return in;
}

/* The case's tensors on one backend. */
struct inv_tensors {
	struct kt_tensor x, w, bias, y;
};

static struct inv_tensors inv_setup(struct op_run *r, const struct op_backend *b,
				    const struct inv_params *p, const struct mm_in *in)
{
	struct inv_tensors t;

	t.x = op_tensor(r, b, KT_F32, p->R, p->K, in->x);
	t.w = p->bf16 ? op_weight_bf16(r, b, in->w, p->N, p->K)
		      : op_tensor(r, b, KT_F32, p->N, p->K, in->w);
	t.bias = p->bf16 ? op_weight_bf16(r, b, in->bias, 1, p->N)
			 : op_tensor(r, b, KT_F32, 1, p->N, in->bias);
	t.y = op_tensor(r, b, KT_F32, p->R, p->N, NULL);
	return t;
}

/* Rows [t0, t0 + n) of x · wᵀ + bias on b, as host floats; *rc keeps the
 * first error. */
static float *inv_rows(struct op_run *r, const struct op_backend *b, const struct inv_tensors *t,
		       int t0, int n, int *rc)
{
	struct kt_tensor xs = kt_rows(t->x, t0, n), ys = kt_rows(t->y, 0, n);
	float *out = op_floats(r, (size_t)n * t->y.cols);
	int e = kt_matmul(b->be, &ys, &xs, &t->w, &t->bias);

	*rc = *rc ? *rc : e;
	op_ok(r, kt_download(b->be, out, &ys, 0, kt_nbytes(&ys)), "kt_download");
	return out;
}

static void *inv_run(struct op_run *r, const void *params, const void *input,
		     const struct op_backend *b)
{
	const struct inv_params *p = params;
	struct inv_out *o = op_alloc(r, sizeof(*o));
	const enum kt_dtype wdt = p->bf16 ? KT_BF16 : KT_F32;
	struct inv_tensors t = inv_setup(r, b, p, input), t1;
	struct kt_config c1 = *b->config;
	const struct op_backend *one;

	o->alone = op_floats(r, (size_t)p->R * p->N);
	for (int i = 0; i < p->R; i++)
		memcpy(o->alone + (size_t)i * p->N, inv_rows(r, b, &t, i, 1, &o->rc),
		       (size_t)p->N * sizeof(float));
	for (int i = 0; i < MAX_WINDOWS && p->windows[i][1]; i++) {
		o->windows[i] = inv_rows(r, b, &t, p->windows[i][0], p->windows[i][1], &o->rc);
		o->promised[i] = op_matmul_invariant(b, p->windows[i][1], p->K, wdt);
	}
	o->other_promised = op_matmul_invariant(b, p->R, p->K, wdt);
	if (!o->other_promised)
		return o;
	c1.threads = 1;
	one = op_open(r, b, &c1);
	t1 = inv_setup(r, one, p, input);
	o->other = inv_rows(r, one, &t1, 0, p->R, &o->rc);
	return o;
}

static void inv_check(struct op_run *r, const void *params, const void *input, const void *got,
		      const void *cpu)
{
	const struct inv_params *p = params;
	const struct inv_out *g = got;
	int checked = 0, total = 0;

	op_check_rc(r, g->rc, 0, "every matmul runs");
	for (int i = 0; i < MAX_WINDOWS && p->windows[i][1]; i++, total++) {
		if (!g->promised[i])
			continue;
		checked++;
		const int t0 = p->windows[i][0], n = p->windows[i][1];

		op_check_bits(r, g->windows[i], g->alone + (size_t)t0 * p->N, (size_t)n * p->N,
			      "rows %d..%d in a batch of %d as alone", t0, t0 + n - 1, n);
	}
	if (g->other_promised)
		op_check_bits(r, g->other, g->alone, (size_t)p->R * p->N,
			      "the whole batch on a second backend (one thread) as alone");
	op_check(r, true, "%d of %d batches promised invariant on this backend", checked, total);
}

static const struct op_family invariance = { inv_build, inv_run, inv_check, true };

/* Refusals: x [3, 8], w [5, 8], y [3, 5] unless said. */
enum mm_fault {
	FAULT_W_COLS,    /* w of 7 columns */
	FAULT_Y_COLS,    /* y of 4 columns */
	FAULT_BIAS_COLS, /* bias of 4 columns */
	FAULT_Y_OVER_X,  /* y is x's memory */
	FAULT_W_DTYPE,   /* w of f16, a dtype no backend keeps weights in */
	FAULT_W_I32,     /* w of i32 */
};

struct mm_fault_params {
	enum mm_fault fault;
};

struct mm_fault_out {
	int rc_call, rc_sync;
	float *x, *y;
};

static void *mm_fault_run(struct op_run *r, const void *params, const void *input,
			  const struct op_backend *b)
{
	const struct mm_fault_params *p = params;
	struct mm_fault_out *o = op_alloc(r, sizeof(*o));
	struct kt_tensor x = op_tensor(r, b, KT_F32, 3, 8, NULL);
	struct kt_tensor w = op_tensor(r, b, KT_F32, 5, 8, NULL);
	struct kt_tensor y = op_tensor(r, b, KT_F32, 3, 5, NULL);
	struct kt_tensor bias = op_tensor(r, b, KT_F32, 1, 4, NULL);
	struct kt_tensor w7 = kt_reshape(w, 5, 7), y4 = kt_reshape(y, 3, 4);
	struct kt_tensor xy = kt_reshape(x, 3, 5);
	struct kt_tensor wt = w;

	switch (p->fault) {
	case FAULT_W_COLS: o->rc_call = kt_matmul(b->be, &y, &x, &w7, NULL); break;
	case FAULT_Y_COLS: o->rc_call = kt_matmul(b->be, &y4, &x, &w, NULL); break;
	case FAULT_BIAS_COLS: o->rc_call = kt_matmul(b->be, &y, &x, &w, &bias); break;
	case FAULT_Y_OVER_X: o->rc_call = kt_matmul(b->be, &xy, &x, &w, NULL); break;
	case FAULT_W_DTYPE:
		wt.dtype = KT_F16;
		o->rc_call = kt_matmul(b->be, &y, &x, &wt, NULL);
		break;
	case FAULT_W_I32:
		wt.dtype = KT_I32;
		o->rc_call = kt_matmul(b->be, &y, &x, &wt, NULL);
		break;
	}
	o->rc_sync = kt_synchronize(b->be);
	o->x = op_get(r, b, &x);
	o->y = op_get(r, b, &y);
	return o;
}

static void mm_fault_check(struct op_run *r, const void *params, const void *input,
			   const void *got, const void *cpu)
{
	const struct mm_fault_out *g = got;

	op_check_rc(r, g->rc_call, -EINVAL, "refused at the call");
	op_check_rc(r, g->rc_sync, 0, "nothing to report at the sync point");
	op_check_poison(r, g->x, 24, "x left alone");
	op_check_poison(r, g->y, 15, "y left alone");
}

static const struct op_family mm_fault = { NULL, mm_fault_run, mm_fault_check, true };

#define MM(name, ...) { name, "matmul", &matmul, &(const struct mm_params){ __VA_ARGS__ } }
/* The GEMV sweep: every T up to CUDA_GEMV_MAX_T + 2, N odd and growing, every bias kind. */
#define GEMV(t) \
	MM("matmul T=" #t " K=1024 N=93+2T w bf16 x bf16", .T = t, .K = 1024, .N = 93 + 2 * t, \
	   .w = W_BF16, .x_bf16 = true, .bias = (enum mm_bias)(t % 3))
#define INV(name, ...) \
	{ name, "matmul", &invariance, &(const struct inv_params){ __VA_ARGS__ } }
#define FAULT(name, f) { name, "matmul", &mm_fault, &(const struct mm_fault_params){ f } }

static_assert(CUDA_GEMV_MAX_T == 16, "the GEMV sweep and windows below assume 16 rows");

static const struct op_case cases[] = {
	/* f32 weights: shapes that hit every tile remainder of the cpu kernel */
	MM("matmul T=1 K=64 N=96 +bias", .T = 1, .K = 64, .N = 96, .bias = BIAS_F32),
	MM("matmul T=1 K=1024 N=1000", .T = 1, .K = 1024, .N = 1000),
	MM("matmul T=5 K=33 N=17 +bias", .T = 5, .K = 33, .N = 17, .bias = BIAS_F32),
	MM("matmul T=7 K=1024 N=1000", .T = 7, .K = 1024, .N = 1000),
	MM("matmul T=64 K=256 N=130 +bias", .T = 64, .K = 256, .N = 130, .bias = BIAS_F32),
	MM("matmul T=70 K=203 N=700 +bias", .T = 70, .K = 203, .N = 700, .bias = BIAS_F32),
	MM("matmul T=3 K=8 N=2", .T = 3, .K = 8, .N = 2),
	MM("matmul T=2 K=5 N=4 +bias", .T = 2, .K = 5, .N = 4, .bias = BIAS_F32),
	MM("matmul T=1 K=19 N=23 +bias", .T = 1, .K = 19, .N = 23, .bias = BIAS_F32),
	MM("matmul T=9 K=40 N=29", .T = 9, .K = 40, .N = 29),
	MM("matmul T=1 K=1 N=1", .T = 1, .K = 1, .N = 1),
	MM("matmul T=16 K=512 N=200 x bf16 +bias bf16", .T = 16, .K = 512, .N = 200,
	   .x_bf16 = true, .bias = BIAS_BF16),
	/* bf16 weights, as a model's */
	MM("matmul T=1 K=4096 N=1000 w bf16 x bf16", .T = 1, .K = 4096, .N = 1000, .w = W_BF16,
	   .x_bf16 = true),
	MM("matmul T=7 K=1000 N=333 w bf16 x bf16 +bias bf16", .T = 7, .K = 1000, .N = 333,
	   .w = W_BF16, .x_bf16 = true, .bias = BIAS_BF16),
	MM("matmul T=64 K=257 N=96 w bf16 x bf16 +bias", .T = 64, .K = 257, .N = 96, .w = W_BF16,
	   .x_bf16 = true, .bias = BIAS_F32),
	MM("matmul T=33 K=2048 N=3072 w bf16 x bf16", .T = 33, .K = 2048, .N = 3072, .w = W_BF16,
	   .x_bf16 = true),
	MM("matmul T=5 K=777 N=129 w bf16", .T = 5, .K = 777, .N = 129, .w = W_BF16),
	MM("matmul T=max_tokens+45 K=64 N=48 w bf16 x bf16 +bias", .T = OP_MAX_TOKENS + 45,
	   .K = 64, .N = 48, .w = W_BF16, .x_bf16 = true, .bias = BIAS_F32),
	/* K wider than any kt_weight: cuda's workspace takes it in K chunks */
	MM("matmul T=19 K=20000 N=16 w bf16 wide x bf16", .T = CUDA_GEMV_MAX_T + 3, .K = 20000,
	   .N = 16, .w = W_BF16_WIDE, .x_bf16 = true),
	MM("matmul T=3 K=20000 N=16 w bf16 wide x bf16", .T = 3, .K = 20000, .N = 16,
	   .w = W_BF16_WIDE, .x_bf16 = true),
	GEMV(1), GEMV(2), GEMV(3), GEMV(4), GEMV(5), GEMV(6), GEMV(7), GEMV(8), GEMV(9),
	GEMV(10), GEMV(11), GEMV(12), GEMV(13), GEMV(14), GEMV(15), GEMV(16), GEMV(17), GEMV(18),
	/* the GEMV's block shapes (N small, mid, large), K not a multiple of its k step */
	MM("matmul T=4 K=1032 N=12289 w bf16 x bf16 +bias bf16", .T = 4, .K = 1032, .N = 12289,
	   .w = W_BF16, .x_bf16 = true, .bias = BIAS_BF16),
	MM("matmul T=11 K=1000 N=5003 w bf16 x bf16 +bias", .T = 11, .K = 1000, .N = 5003,
	   .w = W_BF16, .x_bf16 = true, .bias = BIAS_F32),
	MM("matmul T=16 K=520 N=9000 w bf16 x bf16", .T = 16, .K = 520, .N = 9000, .w = W_BF16,
	   .x_bf16 = true),
	MM("matmul T=1 K=4096 N=6144 w bf16 x in a bf16 tensor (decode GEMV)", .T = 1, .K = 4096,
	   .N = 6144, .w = W_BF16, .x_bf16 = true, .x_tensor_bf16 = true),
	MM("matmul T=1 K=3072 N=1024 w bf16 x in a bf16 tensor +bias bf16 (GEMV, 128 blocks)",
	   .T = 1, .K = 3072, .N = 1024, .w = W_BF16, .x_bf16 = true, .x_tensor_bf16 = true,
	   .bias = BIAS_BF16),
	MM("matmul T=5 K=4096 N=4200 w bf16 x in a bf16 tensor (cuda: the bulk GEMV, x too wide to stage)",
	   .T = 5, .K = 4096, .N = 4200, .w = W_BF16, .x_bf16 = true, .x_tensor_bf16 = true),
	MM("matmul T=16 K=1024 N=3000 w bf16 x in a bf16 tensor +bias bf16 (GEMV tile of 16)",
	   .T = 16, .K = 1024, .N = 3000, .w = W_BF16, .x_bf16 = true, .x_tensor_bf16 = true,
	   .bias = BIAS_BF16),
	MM("matmul T=64 K=1000 N=777 w bf16 x in a bf16 tensor +bias (cuBLAS)", .T = 64,
	   .K = 1000, .N = 777, .w = W_BF16, .x_bf16 = true, .x_tensor_bf16 = true,
	   .bias = BIAS_F32),
	MM("matmul T=max_tokens+3 K=512 N=96 w bf16 x in a bf16 tensor", .T = OP_MAX_TOKENS + 3,
	   .K = 512, .N = 96, .w = W_BF16, .x_bf16 = true, .x_tensor_bf16 = true),
	MM("matmul T=1 K=8 N=1 w bf16 x bf16 +bias bf16", .T = 1, .K = 8, .N = 1, .w = W_BF16,
	   .x_bf16 = true, .bias = BIAS_BF16),
	MM("matmul T=9 K=2048 N=3001 w bf16", .T = 9, .K = 2048, .N = 3001, .w = W_BF16),
	MM("matmul T=2 K=777 N=65 w bf16 x bf16 +bias bf16", .T = 2, .K = 777, .N = 65,
	   .w = W_BF16, .x_bf16 = true, .bias = BIAS_BF16),
	MM("matmul T=16 K=1001 N=77 w bf16 +bias", .T = 16, .K = 1001, .N = 77, .w = W_BF16,
	   .bias = BIAS_F32),
	INV("matmul batch invariance R=70 K=203 N=700 f32", .R = 70, .K = 203, .N = 700,
	    .windows = { { 0, 70 }, { 0, 1 }, { 5, 13 }, { 1, 2 }, { 66, 4 }, { 17, 53 } }),
	INV("matmul batch invariance R=21 K=1536 N=777 bf16", .R = 21, .K = 1536, .N = 777,
	    .bf16 = true,
	    .windows = { { 0, 21 }, { 14, 2 }, { 2, 3 }, { 8, 4 }, { 0, 5 }, { 12, 6 }, { 1, 7 },
			 { 8, 8 }, { 3, 9 }, { 10, 10 }, { 0, 11 }, { 4, 12 }, { 0, 13 },
			 { 2, 14 }, { 6, 15 }, { 0, 16 }, { 5, 16 } }),
	/* cuda: one tile a block of 5 k-blocks: 1-3 rows stage x in the bulk
	 * GEMV, 4-8 read it from global memory (deep ring), 9-12 gemv_kernel */
	INV("matmul batch invariance R=12 K=5000 N=64 bf16", .R = 12, .K = 5000, .N = 64,
	    .bf16 = true,
	    .windows = { { 0, 12 }, { 3, 1 }, { 0, 2 }, { 5, 3 }, { 1, 4 }, { 4, 8 }, { 2, 9 } }),
	/* cuda: past GEMV_WIDE_ROWS (an lm_head), 1-8 rows stay on gemv_kernel,
	 * at 16 rows of w a block where K is one k-block (GEMV_WIDE_NT2_MAX_K)
	 * and 8 past it; 9 rows take its tiles of 16 rows of x */
	INV("matmul batch invariance R=9 K=256 N=65544 bf16", .R = 9, .K = 256, .N = 65544,
	    .bf16 = true, .windows = { { 0, 9 }, { 4, 1 }, { 0, 3 }, { 1, 8 } }),
	INV("matmul batch invariance R=9 K=1032 N=65544 bf16", .R = 9, .K = 1032, .N = 65544,
	    .bf16 = true, .windows = { { 0, 9 }, { 2, 1 }, { 1, 8 } }),
	FAULT("matmul: w of other columns", FAULT_W_COLS),
	FAULT("matmul: y of other columns", FAULT_Y_COLS),
	FAULT("matmul: bias of other columns", FAULT_BIAS_COLS),
	FAULT("matmul: y over x", FAULT_Y_OVER_X),
	FAULT("matmul: w in a dtype the backend keeps no weights in", FAULT_W_DTYPE),
	FAULT("matmul: w of i32", FAULT_W_I32),
};

OP_LIST(ops_matmul, cases);
