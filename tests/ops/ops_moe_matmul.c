/* Cases of the experts' side of the mixture-of-experts ops: moe_matmul
 * (the experts' products over a routing plan) and moe_combine (each
 * token's weighted sum of its experts' rows). Their refusals are in
 * ops_moe_faults.c.
 *
 * moe_matmul: plans built on the host from ids drawn uniformly, with one
 * hot expert taking most rows (past one CPU_MM_ROWS block), or with every
 * other expert empty; x gathered by the plan (k > 0) or already sorted
 * (k == 0); all experts or a range e0.. of them, whose outside rows must
 * be +0 bit for bit on every backend. Tolerances as ops_matmul.c's: 1e-5 ·
 * Σ|x w| against the product in double; against the cpu 1e-4 · Σ|x w| and
 * NMSE 1e-8 for bf16-exact x and w, else NMSE 1e-4 (the device rounds x,
 * or w given in f32, to bf16).
 *
 * moe_combine: within 2e-6 · Σ_j |w y| of the sum in double (k + 1
 * roundings of 2^-24), and on every backend bit for bit the f32 sum from
 * zero in j order, each element with its products rounded or fused (the
 * contract leaves the contraction to the compiler).
 */
#include <math.h>
#include <string.h>

#include "tests/ops/ops.h"
#include "tests/ops/ops_moe.h"

/* ---- moe_matmul ---- */

enum plan_kind {
	PLAN_RANDOM, /* experts drawn uniformly */
	PLAN_HOT,    /* 7 in 8 tokens' first expert is E / 2, the rest among 0..k+1 */
	PLAN_SPARSE, /* odd experts only: every even one empty */
};

enum mm_weight {
	MW_BF16, /* op_weight_bf16 of bf16 values */
	MW_F32,  /* op_weight of f32 values (bf16 on a device that keeps bf16) */
};

struct mm_params {
	int T, K, N, E, k;
	int e0, n_local;  /* the experts of w; n_local 0: all E */
	enum plan_kind plan;
	bool sorted;      /* x holds the T*k rows in sorted order (moe_matmul's k = 0) */
	enum mm_weight w;
	bool x_f32;       /* x not bf16-exact */
};

struct mm_in {
	int32_t *ids, *order, *slot, *offsets;
	float *x, *w;
};

struct mm_out {
	int rc;
	float *y;
};

/* Distinct experts for each token as plan says. */
static void make_ids(struct op_run *r, enum plan_kind plan, int T, int E, int k, int32_t *ids)
{
	for (int t = 0; t < T; t++) {
		int32_t *row = ids + (size_t)t * k;

		for (int j = 0; j < k; j++) {
			bool taken;

			do {
				if (plan == PLAN_SPARSE)
					row[j] = 2 * op_randint(r, E / 2) + 1;
				else if (plan == PLAN_HOT && j == 0 && op_randint(r, 8))
					row[j] = E / 2;
				else if (plan == PLAN_HOT)
					row[j] = op_randint(r, E < k + 2 ? E : k + 2);
				else
					row[j] = op_randint(r, E);
				taken = false;
				for (int i = 0; i < j; i++)
					taken = taken || row[i] == row[j];
			} while (taken);
		}
	}
}

static int n_local_of(const struct mm_params *p)
{
	return p->n_local ? p->n_local : p->E;
}

static void *mm_build(struct op_run *r, const void *params, const struct op_backend *target)
{
	const struct mm_params *p = params;
	const int A = p->T * p->k, xr = p->sorted ? A : p->T;
	const size_t nx = (size_t)xr * p->K, nw = (size_t)n_local_of(p) * p->N * p->K;
	struct mm_in *in = op_alloc(r, sizeof(*in));

	in->ids = op_ints(r, (size_t)A);
	in->order = op_ints(r, (size_t)A);
	in->slot = op_ints(r, (size_t)A);
	in->offsets = op_ints(r, (size_t)p->E + 1);
	make_ids(r, p->plan, p->T, p->E, p->k, in->ids);
	moe_ref_plan(in->ids, A, p->E, in->order, in->slot, in->offsets);
	in->x = op_floats(r, nx);
	in->w = op_floats(r, nw);
	op_fill(r, in->x, nx, 1.0f);
	op_fill(r, in->w, nw, 0.5f);
	if (!p->x_f32)
		op_round_bf16(in->x, nx);
	if (p->w == MW_BF16)
		op_round_bf16(in->w, nw);
	return in;
}

/* The experts' weight w [rows, K] on b as the case keeps it. */
static struct kt_tensor mm_weight(struct op_run *r, const struct op_backend *b,
				  enum mm_weight kind, const float *w, int64_t rows, int64_t K)
{
	if (kind == MW_BF16)
		return op_weight_bf16(r, b, w, rows, K);
	return op_weight(r, b, KT_F32, w, rows, K);
}

static void *mm_run(struct op_run *r, const void *params, const void *input,
		    const struct op_backend *b)
{
	const struct mm_params *p = params;
	const struct mm_in *in = input;
	const int A = p->T * p->k;
	struct mm_out *o = op_alloc(r, sizeof(*o));
	struct kt_tensor x = op_tensor(r, b, KT_F32, p->sorted ? A : p->T, p->K, in->x);
	struct kt_tensor w = mm_weight(r, b, p->w, in->w, (int64_t)n_local_of(p) * p->N, p->K);
	struct kt_tensor order = op_tensor_raw(r, b, KT_I32, A, 1, in->order);
	struct kt_tensor offsets = op_tensor_raw(r, b, KT_I32, p->E + 1, 1, in->offsets);
	struct kt_tensor y = op_tensor(r, b, KT_F32, A, p->N, NULL);

	o->rc = kt_moe_matmul(b->be, &y, &x, &w, &order, &offsets, p->sorted ? 0 : p->k, p->e0);
	o->y = op_get(r, b, &y);
	return o;
}

/* The expert of sorted position i. */
static int expert_at(const int32_t *offsets, int E, int i)
{
	int e = 0;

	while (e < E - 1 && offsets[e + 1] <= i)
		e++;
	return e;
}

static void mm_check(struct op_run *r, const void *params, const void *input, const void *got,
		     const void *cpu)
{
	const struct mm_params *p = params;
	const struct mm_in *in = input;
	const struct mm_out *g = got, *c = cpu;
	const int A = p->T * p->k, nl = n_local_of(p);
	const size_t n = (size_t)A * p->N;
	float *lgot = op_floats(r, n), *lcpu = op_floats(r, n), *zgot = op_floats(r, n);
	double *ref = op_doubles(r, n), *scale = op_doubles(r, n);
	size_t nl_el = 0, nz_el = 0;
	int zero_rows = 0;

	op_check_rc(r, g->rc, 0, "moe_matmul runs");
	for (int i = 0; i < A; i++) {
		const int e = expert_at(in->offsets, p->E, i);
		const int src = p->sorted ? i : in->order[i] / p->k;
		const float *x = in->x + (size_t)src * p->K, *yr = g->y + (size_t)i * p->N;

		if (e < p->e0 || e >= p->e0 + nl) {
			memcpy(zgot + nz_el, yr, (size_t)p->N * sizeof(float));
			nz_el += (size_t)p->N;
			zero_rows++;
			continue;
		}
		for (int j = 0; j < p->N; j++) {
			const float *w = in->w + ((size_t)(e - p->e0) * p->N + j) * p->K;
			double s = 0.0, a = 0.0;

			for (int kk = 0; kk < p->K; kk++) {
				double v = (double)x[kk] * w[kk];

				s += v;
				a += fabs(v);
			}
			ref[nl_el] = s;
			scale[nl_el] = a;
			lgot[nl_el] = yr[j];
			lcpu[nl_el] = c ? c->y[(size_t)i * p->N + j] : 0.0f;
			nl_el++;
		}
	}
	op_check_bits(r, zgot, op_floats(r, nz_el ? nz_el : 1), nz_el,
		      "%d rows of experts outside %d..%d exactly +0", zero_rows, p->e0,
		      p->e0 + nl - 1);
	if (!c) {
		op_check_rel(r, lgot, ref, scale, nl_el, 1e-5, "y against x · w_eᵀ in double");
		return;
	}
	if (p->w != MW_BF16 || p->x_f32) {
		op_check_close(r, lgot, lcpu, nl_el, INFINITY, 1e-4,
			       "y against the cpu (x or w rounded to bf16 on one side only)");
		return;
	}
	for (size_t i = 0; i < nl_el; i++)
		ref[i] = lcpu[i];
	op_check_rel(r, lgot, ref, scale, nl_el, 1e-4, "y against the cpu, per Σ|x·w|");
	op_check_close(r, lgot, lcpu, nl_el, INFINITY, 1e-8, "y against the cpu");
}

static const struct op_family moe_mm = { mm_build, mm_run, mm_check, false };

/* ---- moe_combine ---- */

struct combine_params {
	int T, N, k;
};

struct combine_in {
	float *y, *w;
	int32_t *slot;
};

static void *combine_build(struct op_run *r, const void *params, const struct op_backend *target)
{
	const struct combine_params *p = params;
	const int A = p->T * p->k;
	struct combine_in *in = op_alloc(r, sizeof(*in));

	in->y = op_floats(r, (size_t)A * p->N);
	in->w = op_floats(r, (size_t)A);
	in->slot = op_ints(r, (size_t)A);
	op_fill(r, in->y, (size_t)A * p->N, 2.0f);
	for (int a = 0; a < A; a++) {
		in->w[a] = (float)op_uniform(r, 0.001, 1.0);
		in->slot[a] = a;
	}
	op_shuffle(r, in->slot, A);
	return in;
}

static void *combine_run(struct op_run *r, const void *params, const void *input,
			 const struct op_backend *b)
{
	const struct combine_params *p = params;
	const struct combine_in *in = input;
	const int A = p->T * p->k;
	struct mm_out *o = op_alloc(r, sizeof(*o));
	struct kt_tensor y = op_tensor(r, b, KT_F32, A, p->N, in->y);
	struct kt_tensor w = op_tensor(r, b, KT_F32, p->T, p->k, in->w);
	struct kt_tensor slot = op_tensor_raw(r, b, KT_I32, A, 1, in->slot);
	struct kt_tensor out = op_tensor(r, b, KT_F32, p->T, p->N, NULL);

	o->rc = kt_moe_combine(b->be, &out, &y, &w, &slot);
	o->y = op_get(r, b, &out);
	return o;
}

static bool same_bits(float a, float b)
{
	return !memcmp(&a, &b, sizeof a);
}

static void combine_check(struct op_run *r, const void *params, const void *input,
			  const void *got, const void *cpu)
{
	const struct combine_params *p = params;
	const struct combine_in *in = input;
	const struct mm_out *g = got, *c = cpu;
	const size_t n = (size_t)p->T * p->N;
	double *ref = op_doubles(r, n), *scale = op_doubles(r, n);
	size_t neither = 0;

	op_check_rc(r, g->rc, 0, "moe_combine runs");
	for (int t = 0; t < p->T; t++)
		for (int j = 0; j < p->N; j++) {
			const size_t o = (size_t)t * p->N + j;
			float rounded = 0.0f, fused = 0.0f;

			for (int i = 0; i < p->k; i++) {
				const float w = in->w[t * p->k + i];
				const float y = in->y[(size_t)in->slot[t * p->k + i] * p->N + j];
				volatile float prod = w * y;

				rounded = rounded + prod;
				fused = fmaf(w, y, fused);
				ref[o] += (double)w * y;
				scale[o] += fabs((double)w * y);
			}
			neither += !same_bits(g->y[o], rounded) && !same_bits(g->y[o], fused);
		}
	op_check(r, !neither,
		 "out is the f32 sum from zero in j order, products rounded or fused (%zu of %zu "
		 "elements are neither)", neither, n);
	if (!c) {
		op_check_rel(r, g->y, ref, scale, n, 2e-6, "out against Σ_j w·y in double");
		return;
	}
	for (size_t i = 0; i < n; i++)
		ref[i] = c->y[i];
	op_check_rel(r, g->y, ref, scale, n, 2e-6, "out against the cpu, per Σ_j |w·y|");
}

static const struct op_family combine = { combine_build, combine_run, combine_check, false };

#define MM(name, ...) { name, "moe_matmul", &moe_mm, &(const struct mm_params){ __VA_ARGS__ } }
#define COMBINE(name, ...) \
	{ name, "moe_combine", &combine, &(const struct combine_params){ __VA_ARGS__ } }

static const struct op_case cases[] = {
	MM("moe_matmul T=17 E=8 k=2 K=40 N=24 w f32", .T = 17, .K = 40, .N = 24, .E = 8, .k = 2,
	   .w = MW_F32),
	MM("moe_matmul T=17 E=8 k=2 K=40 N=24 w f32 x sorted", .T = 17, .K = 40, .N = 24,
	   .E = 8, .k = 2, .sorted = true, .w = MW_F32),
	MM("moe_matmul T=17 E=8 k=2 K=40 N=24 experts 3..5", .T = 17, .K = 40, .N = 24,
	   .E = 8, .k = 2, .e0 = 3, .n_local = 3),
	MM("moe_matmul T=17 E=8 k=2 K=40 N=24 x sorted, experts 5..7", .T = 17, .K = 40,
	   .N = 24, .E = 8, .k = 2, .e0 = 5, .n_local = 3, .sorted = true),
	MM("moe_matmul T=17 E=64 k=4 K=40 N=24 every other expert empty", .T = 17, .K = 40,
	   .N = 24, .E = 64, .k = 4, .plan = PLAN_SPARSE),
	MM("moe_matmul T=9 E=16 k=3 K=19 N=5 w f32 x f32", .T = 9, .K = 19, .N = 5, .E = 16,
	   .k = 3, .w = MW_F32, .x_f32 = true),
	MM("moe_matmul T=3 E=4 k=2 K=1 N=1", .T = 3, .K = 1, .N = 1, .E = 4, .k = 2),
	MM("moe_matmul T=37 E=64 k=8 K=256 N=96", .T = 37, .K = 256, .N = 96, .E = 64, .k = 8),
	MM("moe_matmul T=37 E=64 k=8 K=256 N=96 x sorted", .T = 37, .K = 256, .N = 96, .E = 64,
	   .k = 8, .sorted = true),
	MM("moe_matmul T=37 E=64 k=8 K=256 N=96 experts 16..39", .T = 37, .K = 256, .N = 96,
	   .E = 64, .k = 8, .e0 = 16, .n_local = 24),
	MM("moe_matmul T=37 E=8 k=1 K=256 N=96 one hot expert", .T = 37, .K = 256, .N = 96,
	   .E = 8, .k = 1, .plan = PLAN_HOT),
	MM("moe_matmul T=200 E=16 k=2 K=256 N=96 one hot expert, x f32", .T = 200, .K = 256,
	   .N = 96, .E = 16, .k = 2, .plan = PLAN_HOT, .x_f32 = true),
	MM("moe_matmul T=200 E=16 k=2 K=256 N=96 hot expert outside 0..7", .T = 200, .K = 256,
	   .N = 96, .E = 16, .k = 2, .plan = PLAN_HOT, .n_local = 8),
	MM("moe_matmul T=1 E=128 k=8 K=256 N=96 w f32", .T = 1, .K = 256, .N = 96, .E = 128,
	   .k = 8, .w = MW_F32),
	MM("moe_matmul T=1 E=128 k=8 K=256 N=96 experts 64..127", .T = 1, .K = 256, .N = 96,
	   .E = 128, .k = 8, .e0 = 64, .n_local = 64),
	COMBINE("moe_combine T=1 N=96 k=1", .T = 1, .N = 96, .k = 1),
	COMBINE("moe_combine T=17 N=24 k=2", .T = 17, .N = 24, .k = 2),
	COMBINE("moe_combine T=37 N=256 k=8", .T = 37, .N = 256, .k = 8),
	COMBINE("moe_combine T=200 N=96 k=16", .T = 200, .N = 96, .k = KT_MOE_MAX_K),
	COMBINE("moe_combine T=3 N=2049 k=8", .T = 3, .N = 2049, .k = 8),
};

OP_LIST(ops_moe_matmul, cases);
