/* Cases of matmul_n: the products of one x by up to KT_MATMUL_MAX_N
 * weights (a layer's q, k and v; its gate and up), which a backend may run
 * as one launch (cuda: one GEMV grid).
 *
 * Each y must be bit for bit what matmul gives it alone on the same
 * backend: the case runs both. Shapes: the Qwen3-8B and -0.6B q/k/v and
 * gate/up at one decode row, 16 rows of bf16 x (one GEMV token tile), 40
 * rows (cuBLAS, one product after another), biases of one dtype and mixed
 * (which cuda runs apart), odd widths. Against the cpu, each y as matmul's
 * cases compare it (x bf16-exact: the same exact products, f32 sums in
 * other orders): within 1e-4 of Σ|x·w| per element. And its refusals.
 */
#include <math.h>

#include "tests/ops/ops.h"

enum mn_bias { MN_NONE, MN_F32, MN_BF16, MN_MIXED };

struct mn_params {
	int T, K, n;
	int N[KT_MATMUL_MAX_N];
	bool x_tensor_bf16; /* x handed over as a bf16 tensor */
	enum mn_bias bias;
};

struct mn_in {
	float *x, *w[KT_MATMUL_MAX_N], *bias[KT_MATMUL_MAX_N];
};

struct mn_out {
	int rc, rc_alone[KT_MATMUL_MAX_N];
	float *y[KT_MATMUL_MAX_N], *alone[KT_MATMUL_MAX_N];
};

/* Bias i's dtype (the case's, or alternating for MN_MIXED). */
static enum kt_dtype mn_bias_dtype(const struct mn_params *p, int i)
{
	if (p->bias == MN_MIXED)
		return i % 2 ? KT_BF16 : KT_F32;
	return p->bias == MN_BF16 ? KT_BF16 : KT_F32;
}

static void *mn_build(struct op_run *r, const void *params, const struct op_backend *target)
{
	const struct mn_params *p = params;
	struct mn_in *in = op_alloc(r, sizeof(*in));
	size_t nx = (size_t)p->T * p->K;

	in->x = op_floats(r, nx);
	op_fill(r, in->x, nx, 1.0f);
	op_round_bf16(in->x, nx);
	for (int i = 0; i < p->n; i++) {
		size_t nw = (size_t)p->N[i] * p->K;

		in->w[i] = op_floats(r, nw);
		in->bias[i] = op_floats(r, (size_t)p->N[i]);
		op_fill(r, in->w[i], nw, 0.5f);
		op_round_bf16(in->w[i], nw);
		op_fill(r, in->bias[i], (size_t)p->N[i], 1.0f);
		op_round_bf16(in->bias[i], (size_t)p->N[i]);
	}
	return in;
}

static void *mn_run(struct op_run *r, const void *params, const void *input,
		    const struct op_backend *b)
{
	const struct mn_params *p = params;
	const struct mn_in *in = input;
	struct mn_out *o = op_alloc(r, sizeof(*o));
	struct kt_tensor x = op_tensor(r, b, p->x_tensor_bf16 ? KT_BF16 : KT_F32, p->T, p->K,
				       in->x);
	struct kt_tensor w[KT_MATMUL_MAX_N], bias[KT_MATMUL_MAX_N], y[KT_MATMUL_MAX_N];
	struct kt_tensor alone[KT_MATMUL_MAX_N];
	const struct kt_tensor *ys[KT_MATMUL_MAX_N], *ws[KT_MATMUL_MAX_N], *bs[KT_MATMUL_MAX_N];

	for (int i = 0; i < p->n; i++) {
		w[i] = op_weight_bf16(r, b, in->w[i], p->N[i], p->K);
		bias[i] = mn_bias_dtype(p, i) == KT_BF16
				  ? op_weight_bf16(r, b, in->bias[i], 1, p->N[i])
				  : op_tensor(r, b, KT_F32, 1, p->N[i], in->bias[i]);
		y[i] = op_tensor(r, b, KT_F32, p->T, p->N[i], NULL);
		alone[i] = op_tensor(r, b, KT_F32, p->T, p->N[i], NULL);
		ys[i] = &y[i];
		ws[i] = &w[i];
		bs[i] = p->bias == MN_NONE ? NULL : &bias[i];
	}
	o->rc = kt_matmul_n(b->be, p->n, ys, &x, ws, bs);
	for (int i = 0; i < p->n; i++) {
		o->rc_alone[i] = kt_matmul(b->be, &alone[i], &x, &w[i], bs[i]);
		o->y[i] = op_get(r, b, &y[i]);
		o->alone[i] = op_get(r, b, &alone[i]);
	}
	return o;
}

static void mn_check(struct op_run *r, const void *params, const void *input, const void *got,
		     const void *cpu)
{
	const struct mn_params *p = params;
	const struct mn_in *in = input;
	const struct mn_out *g = got, *c = cpu;

	op_check_rc(r, g->rc, 0, "matmul_n runs");
	for (int i = 0; i < p->n; i++) {
		size_t n = (size_t)p->T * p->N[i];
		double *ref = op_doubles(r, n), *scale = op_doubles(r, n);

		op_check_rc(r, g->rc_alone[i], 0, "matmul of weight %d runs", i);
		op_check_bits(r, g->y[i], g->alone[i], n, "y %d equal to matmul's alone", i);
		for (int t = 0; t < p->T; t++)
			for (int j = 0; j < p->N[i]; j++) {
				const float *x = in->x + (size_t)t * p->K;
				const float *w = in->w[i] + (size_t)j * p->K;
				double s = p->bias ? in->bias[i][j] : 0.0;
				double a = fabs(s);

				for (int k = 0; k < p->K; k++) {
					s += (double)x[k] * w[k];
					a += fabs((double)x[k] * w[k]);
				}
				ref[(size_t)t * p->N[i] + j] = c ? c->y[i][(size_t)t * p->N[i] + j] : s;
				scale[(size_t)t * p->N[i] + j] = a;
			}
		op_check_rel(r, g->y[i], ref, scale, n, c ? 1e-4 : 1e-5,
			     c ? "y %d against the cpu, per Σ|x·w|" : "y %d against x · wᵀ in double",
			     i);
	}
}

static const struct op_family matmul_n = { mn_build, mn_run, mn_check, false };

/* Refusals, on every backend (kt_matmul_n's own checks or the backend's):
 * outputs that overlap, a weight of another K, n past KT_MATMUL_MAX_N.
 * Nothing is written: both outputs stay poisoned. */
enum mn_fault { MN_YS_OVERLAP, MN_W_COLS, MN_TOO_MANY };

struct mn_fault_params {
	enum mn_fault fault;
};

struct mn_fault_out {
	int rc_call, rc_sync;
	float *y;
};

static void *mn_fault_run(struct op_run *r, const void *params, const void *input,
			  const struct op_backend *b)
{
	const struct mn_fault_params *p = params;
	struct mn_fault_out *o = op_alloc(r, sizeof(*o));
	struct kt_tensor x = op_tensor(r, b, KT_F32, 2, 8, NULL);
	struct kt_tensor w = op_weight_bf16(r, b, (float[48]){ 0 }, 6, 8);
	struct kt_tensor w7 = kt_reshape(w, 6, 7);
	struct kt_tensor yall = op_tensor(r, b, KT_F32, 2, 12, NULL);
	struct kt_tensor y0 = kt_reshape(yall, 2, 6);
	struct kt_tensor y1 = kt_reshape(kt_rows(kt_reshape(yall, 4, 6), 2, 2), 2, 6);
	struct kt_tensor shifted = kt_reshape(kt_rows(kt_reshape(yall, 8, 3), 1, 4), 2, 6);
	const struct kt_tensor *ys[KT_MATMUL_MAX_N + 1] = { &y0, &shifted };
	const struct kt_tensor *ws[KT_MATMUL_MAX_N + 1] = { &w, &w };

	switch (p->fault) {
	case MN_YS_OVERLAP:
		break;
	case MN_W_COLS:
		ys[1] = &y1;
		ws[1] = &w7;
		break;
	case MN_TOO_MANY:
		ys[1] = &y1;
		break;
	}
	o->rc_call = kt_matmul_n(b->be, p->fault == MN_TOO_MANY ? KT_MATMUL_MAX_N + 1 : 2, ys,
				 &x, ws, NULL);
	o->rc_sync = kt_synchronize(b->be);
	o->y = op_get(r, b, &yall);
	return o;
}

static void mn_fault_check(struct op_run *r, const void *params, const void *input,
			   const void *got, const void *cpu)
{
	const struct mn_fault_out *g = got;

	op_check_rc(r, g->rc_call, -EINVAL, "refused at the call");
	op_check_rc(r, g->rc_sync, 0, "nothing to report at the sync point");
	op_check_poison(r, g->y, 24, "both outputs left alone");
}

static const struct op_family mn_fault = { NULL, mn_fault_run, mn_fault_check, true };

#define MN(name, ...) { name, "matmul_n", &matmul_n, &(const struct mn_params){ __VA_ARGS__ } }
#define MN_FAULT(name, f) \
	{ name, "matmul_n", &mn_fault, &(const struct mn_fault_params){ f } }

static const struct op_case cases[] = {
	MN("matmul_n q/k/v 8B T=1", .T = 1, .K = 4096, .n = 3, .N = { 4096, 1024, 1024 }),
	MN("matmul_n q/k/v 8B T=1 x in bf16", .T = 1, .K = 4096, .n = 3, .N = { 4096, 1024, 1024 },
	   .x_tensor_bf16 = true),
	MN("matmul_n gate/up 0.6B T=1 x in bf16", .T = 1, .K = 1024, .n = 2, .N = { 3072, 3072 },
	   .x_tensor_bf16 = true),
	MN("matmul_n q/k/v 0.6B T=16 +bias f32", .T = 16, .K = 1024, .n = 3,
	   .N = { 2048, 1024, 1024 }, .bias = MN_F32),
	MN("matmul_n q/k/v T=9 odd rows +bias bf16", .T = 9, .K = 520, .n = 3, .N = { 77, 13, 13 },
	   .bias = MN_BF16),
	MN("matmul_n T=5 four weights, biases mixed (run apart)", .T = 5, .K = 256, .n = 4,
	   .N = { 96, 33, 64, 7 }, .bias = MN_MIXED),
	MN("matmul_n gate/up T=40 (cuBLAS) x in bf16", .T = 40, .K = 512, .n = 2, .N = { 700, 700 },
	   .x_tensor_bf16 = true),
	MN("matmul_n T=3 K=20 (K not a multiple of 8)", .T = 3, .K = 20, .n = 2, .N = { 17, 5 },
	   .bias = MN_F32),
	MN("matmul_n one weight T=2", .T = 2, .K = 64, .n = 1, .N = { 48 }),
	MN_FAULT("matmul_n: outputs that overlap", MN_YS_OVERLAP),
	MN_FAULT("matmul_n: a weight of another K", MN_W_COLS),
	MN_FAULT("matmul_n: more than KT_MATMUL_MAX_N products", MN_TOO_MANY),
};

OP_LIST(ops_matmul_n, cases);
