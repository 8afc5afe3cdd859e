/* Cases of the mixture-of-experts ops: moe_route (softmax, top-k and the
 * routing plan), moe_matmul (the experts' products over a plan) and
 * moe_combine (each token's weighted sum of its experts' rows), their
 * refusals, a recorded graph of the three, and their batch and rank
 * invariance.
 *
 * moe_route: ids, order, slot and offsets are exact on every backend (the
 * top k by logit, equal logits by lower id, by selection on the host; the
 * plan a stable sort of the assignments by expert). w within 2e-5 of |ref|,
 * ref the softmax in double (the f32 sum of E terms errs by up to
 * (E - 1) · 2^-24, 7.6e-6 at E = 128, plus expf's ulps); against the cpu
 * max_abs 1e-5, NMSE 1e-10 (a device sums E terms in another order).
 * On the cpu w is also bitwise its f32 recipe (cpu_moe.c). Logits: random
 * (±100 too, where expf overflows without the max), small integers (ties
 * across the k-th place), and all equal.
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
 *
 * Refusals: shapes (every backend: nothing written, nothing to report at
 * the sync point); offsets, order and slot entries (the cpu only: a device
 * backend does not read them on the host).
 *
 * Graph: route, moe_matmul (k > 0), moe_matmul (k == 0) and combine
 * recorded once and replayed with new logits and x give the bits they give
 * run eagerly; against the chain in double (2e-5 of its scale), or the cpu
 * (NMSE 1e-4: the device rounds the hidden rows to bf16).
 *
 * Invariance (op_moe_invariant): each of 37 tokens routed, multiplied and
 * combined alone gives the bits it gets in the batch; the batch with the
 * experts split into shards (one moe_matmul per shard, summed with add as
 * allreduce sums ranks) and on a backend of one thread gives the same
 * bits. Where not promised: NMSE 1e-8 (bf16-exact x and w).
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "tests/ops/ops.h"

/* i32 host values as a tensor of b. */
static struct kt_tensor ints(struct op_run *r, const struct op_backend *b, int64_t rows,
			     int64_t cols, const int32_t *host)
{
	return op_tensor_raw(r, b, KT_I32, rows, cols, host);
}

/* A whole i32 tensor on the host. */
static int32_t *get_ints(struct op_run *r, const struct op_backend *b, const struct kt_tensor *t)
{
	int32_t *out = op_ints(r, (size_t)(t->rows * t->cols));

	op_ok(r, kt_download(b->be, out, t, 0, kt_nbytes(t)), "kt_download (i32)");
	return out;
}

/* The top k of a token's E logits by selection: the highest logit not yet
 * taken, the lowest id among equal ones. */
static void ref_topk(const float *l, int E, int k, int32_t *ids)
{
	for (int j = 0; j < k; j++) {
		int best = -1;

		for (int e = 0; e < E; e++) {
			bool taken = false;

			for (int i = 0; i < j; i++)
				taken = taken || ids[i] == e;
			if (!taken && (best < 0 || l[e] > l[best]))
				best = e;
		}
		ids[j] = best;
	}
}

/* ids' softmax probabilities over all E logits in double, divided by their
 * sum when norm. */
static void ref_weights(const float *l, int E, const int32_t *ids, int k, bool norm, double *w)
{
	double m = l[0], s = 0.0, sum = 0.0;

	for (int e = 1; e < E; e++)
		m = l[e] > m ? l[e] : m;
	for (int e = 0; e < E; e++)
		s += exp(l[e] - m);
	for (int j = 0; j < k; j++) {
		w[j] = exp(l[ids[j]] - m) / s;
		sum += w[j];
	}
	for (int j = 0; norm && j < k; j++)
		w[j] /= sum;
}

/* ids' weights as the cpu computes them in f32: m the max logit, s the sum
 * of expf(l - m) in expert order, expf(l - m) / s, then each divided by
 * their sum in j order when norm. */
static void f32_weights(const float *l, int E, const int32_t *ids, int k, bool norm, float *w)
{
	float m = l[0], s = 0.0f, sum = 0.0f;

	for (int e = 1; e < E; e++)
		m = l[e] > m ? l[e] : m;
	for (int e = 0; e < E; e++)
		s += expf(l[e] - m);
	for (int j = 0; j < k; j++) {
		w[j] = expf(l[ids[j]] - m) / s;
		sum += w[j];
	}
	for (int j = 0; norm && j < k; j++)
		w[j] /= sum;
}

/* The A assignments of ids sorted by expert, stable: order, slot [A],
 * offsets [E + 1]. */
static void ref_plan(const int32_t *ids, int A, int E, int32_t *order, int32_t *slot,
		     int32_t *offsets)
{
	int pos = 0;

	for (int e = 0; e < E; e++) {
		offsets[e] = pos;
		for (int a = 0; a < A; a++)
			if (ids[a] == e) {
				order[pos] = a;
				slot[a] = pos++;
			}
	}
	offsets[E] = pos;
}

/* ---- moe_route ---- */

enum logits_kind {
	LOGITS_RANDOM, /* ±[mag/100, mag] */
	LOGITS_TIES,   /* integers -2..2: ties at the k-th place */
	LOGITS_EQUAL,  /* every logit 0.5 */
};

struct route_params {
	int T, E, k;
	bool norm;
	enum logits_kind logits;
	float mag; /* LOGITS_RANDOM; 0: 4 */
};

struct route_out {
	int rc;
	int32_t *ids, *order, *slot, *offsets;
	float *w;
};

static void fill_logits(struct op_run *r, float *l, size_t n, enum logits_kind kind, float mag)
{
	for (size_t i = 0; i < n; i++)
		l[i] = kind == LOGITS_TIES ? (float)(op_randint(r, 5) - 2) : 0.5f;
	if (kind == LOGITS_RANDOM)
		op_fill(r, l, n, mag > 0.0f ? mag : 4.0f);
}

static void *route_build(struct op_run *r, const void *params, const struct op_backend *target)
{
	const struct route_params *p = params;
	float *l = op_floats(r, (size_t)p->T * p->E);

	fill_logits(r, l, (size_t)p->T * p->E, p->logits, p->mag);
	return l;
}

static void *route_run(struct op_run *r, const void *params, const void *input,
		       const struct op_backend *b)
{
	const struct route_params *p = params;
	const int A = p->T * p->k;
	struct route_out *o = op_alloc(r, sizeof(*o));
	struct kt_tensor logits = op_tensor(r, b, KT_F32, p->T, p->E, input);
	struct kt_tensor ids = ints(r, b, p->T, p->k, NULL);
	struct kt_tensor w = op_tensor(r, b, KT_F32, p->T, p->k, NULL);
	struct kt_tensor order = ints(r, b, A, 1, NULL), slot = ints(r, b, A, 1, NULL);
	struct kt_tensor offsets = ints(r, b, p->E + 1, 1, NULL);

	o->rc = kt_moe_route(b->be, &ids, &w, &order, &slot, &offsets, &logits, p->norm);
	o->ids = get_ints(r, b, &ids);
	o->w = op_get(r, b, &w);
	o->order = get_ints(r, b, &order);
	o->slot = get_ints(r, b, &slot);
	o->offsets = get_ints(r, b, &offsets);
	return o;
}

static void route_check(struct op_run *r, const void *params, const void *input, const void *got,
			const void *cpu)
{
	const struct route_params *p = params;
	const float *l = input;
	const struct route_out *g = got, *c = cpu;
	const int A = p->T * p->k;
	int32_t *ids = op_ints(r, (size_t)A), *order = op_ints(r, (size_t)A);
	int32_t *slot = op_ints(r, (size_t)A), *offsets = op_ints(r, (size_t)p->E + 1);
	double *w = op_doubles(r, (size_t)A);
	float *w32 = op_floats(r, (size_t)A);

	op_check_rc(r, g->rc, 0, "moe_route runs");
	for (int t = 0; t < p->T; t++) {
		const float *lt = l + (size_t)t * p->E;
		int32_t *it = ids + (size_t)t * p->k;

		ref_topk(lt, p->E, p->k, it);
		ref_weights(lt, p->E, it, p->k, p->norm, w + (size_t)t * p->k);
		f32_weights(lt, p->E, it, p->k, p->norm, w32 + (size_t)t * p->k);
	}
	ref_plan(ids, A, p->E, order, slot, offsets);
	op_check_ints(r, g->ids, ids, (size_t)A, "ids: the top %d by logit, lower id first", p->k);
	op_check_ints(r, g->order, order, (size_t)A, "order: the stable sort by expert");
	op_check_ints(r, g->slot, slot, (size_t)A, "slot: order's inverse");
	op_check_ints(r, g->offsets, offsets, (size_t)p->E + 1, "offsets: each expert's start");
	if (c) {
		op_check_close(r, g->w, c->w, (size_t)A, 1e-5, 1e-10, "w against the cpu");
		return;
	}
	op_check_rel(r, g->w, w, NULL, (size_t)A, 2e-5, "w against the softmax in double%s",
		     p->norm ? ", renormalised" : "");
	op_check_bits(r, g->w, w32, (size_t)A, "w bitwise the cpu's f32 softmax (max, expf, "
		      "expert order%s)", p->norm ? ", then the sum over j" : "");
}

static const struct op_family route = { route_build, route_run, route_check, false };

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
	ref_plan(in->ids, A, p->E, in->order, in->slot, in->offsets);
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
	struct kt_tensor order = ints(r, b, A, 1, in->order);
	struct kt_tensor offsets = ints(r, b, p->E + 1, 1, in->offsets);
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
	struct kt_tensor slot = ints(r, b, A, 1, in->slot);
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

/* ---- refusals ---- */

/* The world of a refusal: T = 3 tokens, E = 8 experts, k = 2 (A = 6),
 * K = 16, N = 8, a valid plan, every float poisoned, each tensor allocated
 * with room for the bad shapes (k = 17 rows, one more row or column). */
enum { FT = 3, FE = 8, FK = 2, FA = FT * FK, FKD = 16, FN = 8, FROOM = 64 };

/* In op order: moe_route's, moe_matmul's from MM_W_COLS, moe_combine's from
 * COMBINE_Y_ROWS (fault_run picks the op by range). */
enum moe_fault {
	ROUTE_K_ZERO,        /* ids [3, 0] */
	ROUTE_K_ABOVE_MAX,   /* E = 32, k = KT_MOE_MAX_K + 1, every tensor to match */
	ROUTE_K_ABOVE_E,     /* E = 4, k = 5, every tensor to match */
	ROUTE_W_COLS,        /* w [3, 3] */
	ROUTE_IDS_ROWS,      /* ids [4, 2] */
	ROUTE_ORDER_ROWS,    /* order [5, 1] */
	ROUTE_SLOT_COLS,     /* slot [3, 2] */
	ROUTE_OFFSETS_ROWS,  /* offsets [8, 1] */
	ROUTE_LOGITS_I32,    /* logits of i32 */
	ROUTE_W_OVER_LOGITS, /* w is logits' memory */
	MM_W_COLS,           /* w of K - 1 columns */
	MM_W_ROWS,           /* w rows not a multiple of N */
	MM_RANGE,            /* e0 + n_local = E + 1 */
	MM_E0_NEGATIVE,      /* e0 = -1 */
	MM_K_ABOVE_MAX,      /* k = KT_MOE_MAX_K + 1 with x [1, K] and A = 17 to match */
	MM_K_NEGATIVE,       /* k = -1 */
	MM_X_ROWS,           /* x [4, K] for k = 2, A = 6 */
	MM_SORTED_X_ROWS,    /* k = 0, x [3, K] for A = 6 */
	MM_Y_ROWS,           /* y [5, N] */
	MM_ORDER_ROWS,       /* order [7, 1] */
	MM_Y_OVER_X,         /* y is x's memory */
	MM_OFFSETS_DOWN,     /* offsets going down (cpu only) */
	MM_OFFSETS_END,      /* offsets[E] = A - 1 (cpu only) */
	MM_OFFSETS_START,    /* offsets[0] = 1 (cpu only) */
	MM_ORDER_RANGE,      /* an order entry = A (cpu only) */
	COMBINE_Y_ROWS,      /* y [5, N] */
	COMBINE_K_ABOVE_MAX, /* w [1, 17], y [17, N], slot [17, 1] */
	COMBINE_SLOT_ROWS,   /* slot [5, 1] */
	COMBINE_OUT_COLS,    /* out [3, N + 1] */
	COMBINE_OUT_OVER_Y,  /* out is y's memory */
	COMBINE_SLOT_RANGE,  /* a slot entry = A (cpu only) */
};

struct fault_params {
	enum moe_fault fault;
	bool host_checked; /* refused from the values of offsets, order or slot: cpu only */
};

/* The float tensors of the world, all poisoned: none may be written. */
enum { F_LOGITS, F_X, F_W, F_Y, F_OUT, F_CW, N_FLOATS };

struct fault_out {
	bool asked;
	int rc_call, rc_sync;
	float *f[N_FLOATS];   /* each float tensor, whole, after the call */
	size_t nf[N_FLOATS];
	int32_t *ids, *slot;  /* poisoned */
	int32_t *order, *offsets, *order_in, *offsets_in; /* the plan after and before */
	size_t n_ids, n_slot;
};

static void *fault_run(struct op_run *r, const void *params, const void *input,
		       const struct op_backend *b)
{
	static const int floats_cols[N_FLOATS] = { 32, FKD, 2 * FKD, FN + 1, FN + 1,
						   KT_MOE_MAX_K + 1 };
	const struct fault_params *p = params;
	struct fault_out *o = op_alloc(r, sizeof(*o));
	int32_t ids[FA], *order = op_ints(r, FROOM), *slot = op_ints(r, FROOM);
	int32_t *offsets = op_ints(r, FROOM);
	struct kt_tensor f[N_FLOATS], d_ids, d_order, d_slot, d_offsets;
	struct kt_tensor logits, x, w, y, out, cw, id, ord, sl, off;
	int k = FK, e0 = 0;

	for (int a = 0; a < FA; a++)
		ids[a] = (a * 3) % FE;
	ref_plan(ids, FA, FE, order, slot, offsets);
	for (int i = 0; i < N_FLOATS; i++)
		f[i] = op_tensor(r, b, i == F_W ? b->weight_dtype : KT_F32, FROOM, floats_cols[i],
				 NULL);
	d_ids = ints(r, b, FROOM, KT_MOE_MAX_K + 1, NULL);
	d_slot = ints(r, b, FROOM, 2, NULL);
	d_order = ints(r, b, FROOM, 1, NULL);
	d_offsets = ints(r, b, FROOM, 1, NULL);
	logits = kt_reshape(f[F_LOGITS], FT, FE);
	x = kt_reshape(f[F_X], FT, FKD);
	w = kt_reshape(f[F_W], FE * FN, FKD);
	y = kt_reshape(f[F_Y], FA, FN);
	out = kt_reshape(f[F_OUT], FT, FN);
	cw = kt_reshape(f[F_CW], FT, FK);
	id = kt_reshape(d_ids, FT, FK);
	ord = kt_reshape(d_order, FA, 1);
	sl = kt_reshape(d_slot, FA, 1);
	off = kt_reshape(d_offsets, FE + 1, 1);
	switch (p->fault) {
	case ROUTE_K_ZERO:
		id = kt_reshape(id, FT, 0);
		cw = kt_reshape(cw, FT, 0);
		ord = kt_reshape(ord, 0, 1);
		sl = kt_reshape(sl, 0, 1);
		break;
	case ROUTE_K_ABOVE_MAX:
		k = KT_MOE_MAX_K + 1;
		logits = kt_reshape(logits, FT, 32);
		id = kt_reshape(id, FT, k);
		cw = kt_reshape(cw, FT, k);
		ord = kt_reshape(ord, FT * k, 1);
		sl = kt_reshape(sl, FT * k, 1);
		off = kt_reshape(off, 33, 1);
		break;
	case ROUTE_K_ABOVE_E:
		logits = kt_reshape(logits, FT, 4);
		id = kt_reshape(id, FT, 5);
		cw = kt_reshape(cw, FT, 5);
		ord = kt_reshape(ord, FT * 5, 1);
		sl = kt_reshape(sl, FT * 5, 1);
		off = kt_reshape(off, 5, 1);
		break;
	case ROUTE_W_COLS: cw = kt_reshape(cw, FT, FK + 1); break;
	case ROUTE_IDS_ROWS: id = kt_reshape(id, FT + 1, FK); break;
	case ROUTE_ORDER_ROWS: ord = kt_reshape(ord, FA - 1, 1); break;
	case ROUTE_SLOT_COLS: sl = kt_reshape(sl, FT, 2); break;
	case ROUTE_OFFSETS_ROWS: off = kt_reshape(off, FE, 1); break;
	case ROUTE_LOGITS_I32: logits.dtype = KT_I32; break;
	case ROUTE_W_OVER_LOGITS: cw = kt_reshape(logits, FT, FK); break;
	case MM_W_COLS: w = kt_reshape(w, FE * FN, FKD - 1); break;
	case MM_W_ROWS: w = kt_reshape(w, FE * FN - 1, FKD); break;
	case MM_RANGE: e0 = 1; break;
	case MM_E0_NEGATIVE: e0 = -1; w = kt_reshape(w, FN, FKD); break;
	case MM_K_ABOVE_MAX:
		k = KT_MOE_MAX_K + 1;
		x = kt_reshape(x, 1, FKD);
		y = kt_reshape(y, k, FN);
		ord = kt_reshape(ord, k, 1);
		break;
	case MM_K_NEGATIVE: k = -1; break;
	case MM_X_ROWS: x = kt_reshape(x, FT + 1, FKD); break;
	case MM_SORTED_X_ROWS: k = 0; break;
	case MM_Y_ROWS: y = kt_reshape(y, FA - 1, FN); break;
	case MM_ORDER_ROWS: ord = kt_reshape(ord, FA + 1, 1); break;
	case MM_Y_OVER_X: y = kt_reshape(x, FA, FN); break;
	case MM_OFFSETS_DOWN: offsets[3] = offsets[4] + 1; break;
	case MM_OFFSETS_END: offsets[FE] = FA - 1; break;
	case MM_OFFSETS_START: offsets[0] = 1; break;
	case MM_ORDER_RANGE: order[2] = FA; break;
	case COMBINE_Y_ROWS: y = kt_reshape(y, FA - 1, FN); break;
	case COMBINE_K_ABOVE_MAX:
		k = KT_MOE_MAX_K + 1;
		cw = kt_reshape(cw, 1, k);
		y = kt_reshape(y, k, FN);
		sl = kt_reshape(sl, k, 1);
		out = kt_reshape(out, 1, FN);
		break;
	case COMBINE_SLOT_ROWS: sl = kt_reshape(sl, FA - 1, 1); break;
	case COMBINE_OUT_COLS: out = kt_reshape(out, FT, FN + 1); break;
	case COMBINE_OUT_OVER_Y: out = kt_reshape(y, FT, FN); break;
	case COMBINE_SLOT_RANGE: slot[4] = FA; break;
	}
	o->order_in = order;
	o->offsets_in = offsets;
	op_ok(r, kt_upload(b->be, &d_order, 0, order, kt_nbytes(&d_order)), "kt_upload (order)");
	op_ok(r, kt_upload(b->be, &d_offsets, 0, offsets, kt_nbytes(&d_offsets)),
	      "kt_upload (offsets)");
	if (p->fault >= COMBINE_Y_ROWS)
		op_ok(r, kt_upload(b->be, &d_slot, 0, slot, FROOM * sizeof(int32_t)),
		      "kt_upload (slot)");
	o->asked = !p->host_checked || strcmp(b->be->info.backend, "cpu") == 0;
	if (!o->asked)
		return o;
	if (p->fault < MM_W_COLS)
		o->rc_call = kt_moe_route(b->be, &id, &cw, &ord, &sl, &off, &logits, true);
	else if (p->fault < COMBINE_Y_ROWS)
		o->rc_call = kt_moe_matmul(b->be, &y, &x, &w, &ord, &off, k, e0);
	else
		o->rc_call = kt_moe_combine(b->be, &out, &y, &cw, &sl);
	o->rc_sync = kt_synchronize(b->be);
	for (int i = 0; i < N_FLOATS; i++) {
		o->f[i] = op_get(r, b, &f[i]);
		o->nf[i] = (size_t)(f[i].rows * f[i].cols);
	}
	o->ids = get_ints(r, b, &d_ids);
	o->n_ids = (size_t)(d_ids.rows * d_ids.cols);
	o->order = get_ints(r, b, &d_order);
	o->offsets = get_ints(r, b, &d_offsets);
	if (p->fault < COMBINE_Y_ROWS) {
		o->slot = get_ints(r, b, &d_slot);
		o->n_slot = (size_t)(d_slot.rows * d_slot.cols);
	}
	return o;
}

static void fault_check(struct op_run *r, const void *params, const void *input,
			const void *got, const void *cpu)
{
	static const char *const names[N_FLOATS] = { "logits", "x", "w", "y", "out",
						     "the route's w and the combine's" };
	const struct fault_out *g = got;
	size_t written = 0;

	if (!g->asked) {
		op_check(r, true, "not asked of this backend: it reads the plan on the device");
		return;
	}
	op_check_rc(r, g->rc_call, -EINVAL, "refused at the call");
	op_check_rc(r, g->rc_sync, 0, "nothing to report at the sync point");
	for (int i = 0; i < N_FLOATS; i++)
		op_check_poison(r, g->f[i], g->nf[i], "%s left alone", names[i]);
	for (size_t j = 0; j < g->n_ids; j++)
		written += g->ids[j] != 0x7f7f7f7f;
	for (size_t j = 0; j < g->n_slot; j++)
		written += g->slot[j] != 0x7f7f7f7f;
	op_check(r, !written, "ids%s left alone (%zu values written)", g->n_slot ? " and slot" : "",
		 written);
	op_check_ints(r, g->order, g->order_in, FROOM, "order left alone");
	op_check_ints(r, g->offsets, g->offsets_in, FROOM, "offsets left alone");
}

static const struct op_family fault = { NULL, fault_run, fault_check, true };

/* ---- graph and invariance: route, the experts, combine ---- */

struct chain_params {
	int T, E, k, K, I, N; /* I: the hidden width of a two-matmul chain, 0: one matmul */
	bool norm;
	int shards[4];        /* invariance: first expert of each shard after the first; 0 ends */
};

struct chain_in {
	float *logits[3], *x[3]; /* per round (graph); [0] for invariance */
	float *w1, *w2;          /* w1 [E * (I ? I : N), K], w2 [E * N, I] */
};

/* A chain's tensors on one backend for T tokens. */
struct chain_dev {
	int T;
	struct kt_tensor logits, x, ids, w, order, slot, offsets, h, y, out, w1, w2;
};

static int chain_width(const struct chain_params *p)
{
	return p->I ? p->I : p->N;
}

static void *chain_build(struct op_run *r, const void *params, const struct op_backend *target)
{
	const struct chain_params *p = params;
	const size_t nl = (size_t)p->T * p->E, nx = (size_t)p->T * p->K;
	const size_t n1 = (size_t)p->E * chain_width(p) * p->K, n2 = (size_t)p->E * p->N * p->I;
	struct chain_in *in = op_alloc(r, sizeof(*in));

	for (int i = 0; i < 3; i++) {
		in->logits[i] = op_floats(r, nl);
		in->x[i] = op_floats(r, nx);
		op_fill(r, in->logits[i], nl, 3.0f);
		op_fill(r, in->x[i], nx, 1.0f);
		op_round_bf16(in->x[i], nx);
	}
	in->w1 = op_floats(r, n1);
	in->w2 = op_floats(r, n2 ? n2 : 1);
	op_fill(r, in->w1, n1, 0.5f);
	op_fill(r, in->w2, n2, 0.5f);
	op_round_bf16(in->w1, n1);
	op_round_bf16(in->w2, n2);
	return in;
}

static struct chain_dev chain_setup(struct op_run *r, const struct op_backend *b,
				    const struct chain_params *p, const struct chain_in *in,
				    int T)
{
	const int A = T * p->k;
	struct chain_dev d = { .T = T };

	d.logits = op_tensor(r, b, KT_F32, T, p->E, NULL);
	d.x = op_tensor(r, b, KT_F32, T, p->K, NULL);
	d.ids = ints(r, b, T, p->k, NULL);
	d.w = op_tensor(r, b, KT_F32, T, p->k, NULL);
	d.order = ints(r, b, A, 1, NULL);
	d.slot = ints(r, b, A, 1, NULL);
	d.offsets = ints(r, b, p->E + 1, 1, NULL);
	d.h = op_tensor(r, b, KT_F32, A, chain_width(p), NULL);
	d.y = p->I ? op_tensor(r, b, KT_F32, A, p->N, NULL) : d.h;
	d.out = op_tensor(r, b, KT_F32, T, p->N, NULL);
	d.w1 = op_weight_bf16(r, b, in->w1, (int64_t)p->E * chain_width(p), p->K);
	if (p->I)
		d.w2 = op_weight_bf16(r, b, in->w2, (int64_t)p->E * p->N, p->I);
	return d;
}

/* What record() enqueues. */
struct chain_rec {
	const struct op_backend *b;
	const struct chain_params *p;
	const struct chain_dev *d;
	int records;
};

static int chain_forward(void *ctx)
{
	struct chain_rec *c = ctx;
	const struct chain_dev *d = c->d;
	struct kt_backend *be = c->b->be;
	int rc;

	c->records++;
	rc = kt_moe_route(be, &d->ids, &d->w, &d->order, &d->slot, &d->offsets, &d->logits,
			  c->p->norm);
	rc = rc ? rc : kt_moe_matmul(be, &d->h, &d->x, &d->w1, &d->order, &d->offsets, c->p->k, 0);
	if (c->p->I)
		rc = rc ? rc : kt_moe_matmul(be, &d->y, &d->h, &d->w2, &d->order, &d->offsets, 0, 0);
	return rc ? rc : kt_moe_combine(be, &d->out, &d->y, &d->w, &d->slot);
}

/* Rows t0 .. t0 + d->T - 1 of round i's logits and x into d. */
static void chain_inputs(struct op_run *r, const struct op_backend *b, const struct chain_dev *d,
			 const struct chain_params *p, const struct chain_in *in, int i, int t0)
{
	op_ok(r, kt_upload(b->be, &d->logits, 0, in->logits[i] + (size_t)t0 * p->E,
			   kt_nbytes(&d->logits)), "kt_upload (logits)");
	op_ok(r, kt_upload(b->be, &d->x, 0, in->x[i] + (size_t)t0 * p->K, kt_nbytes(&d->x)),
	      "kt_upload (x)");
}

/* The chain of round i in double, and its scale: Σ_j |w_j| Σ |w2| · Σ |w1 x|. */
static void chain_reference(struct op_run *r, const struct chain_params *p,
			    const struct chain_in *in, int i, double *ref, double *scale)
{
	const int H = chain_width(p);
	int32_t ids[KT_MOE_MAX_K];
	double w[KT_MOE_MAX_K], *h = op_doubles(r, (size_t)H), *ha = op_doubles(r, (size_t)H);

	for (int t = 0; t < p->T; t++) {
		const float *x = in->x[i] + (size_t)t * p->K;

		ref_topk(in->logits[i] + (size_t)t * p->E, p->E, p->k, ids);
		ref_weights(in->logits[i] + (size_t)t * p->E, p->E, ids, p->k, p->norm, w);
		for (int n = 0; n < p->N; n++)
			ref[(size_t)t * p->N + n] = scale[(size_t)t * p->N + n] = 0.0;
		for (int j = 0; j < p->k; j++) {
			for (int u = 0; u < H; u++) {
				const float *w1 = in->w1 + ((size_t)ids[j] * H + u) * p->K;

				h[u] = ha[u] = 0.0;
				for (int kk = 0; kk < p->K; kk++) {
					h[u] += (double)w1[kk] * x[kk];
					ha[u] += fabs((double)w1[kk] * x[kk]);
				}
			}
			for (int n = 0; n < p->N; n++) {
				const float *w2 = in->w2 + ((size_t)ids[j] * p->N + n) * p->I;
				double s = p->I ? 0.0 : h[n], a = p->I ? 0.0 : ha[n];

				for (int u = 0; p->I && u < p->I; u++) {
					s += (double)w2[u] * h[u];
					a += fabs((double)w2[u]) * ha[u];
				}
				ref[(size_t)t * p->N + n] += w[j] * s;
				scale[(size_t)t * p->N + n] += w[j] * a;
			}
		}
	}
}

/* Graph keys are per case (a hash of its name), so no case replays another's. */
static uint64_t case_key(struct op_run *r)
{
	uint64_t h = 0xcbf29ce484222325ULL;

	for (const char *s = op_case_name(r); *s; s++)
		h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
	return h;
}

struct graph_out {
	int rc, records, calls;
	bool graphs;
	float *eager[3], *replay[3];
	int32_t *eager_ids[3], *replay_ids[3];
};

static void *graph_run(struct op_run *r, const void *params, const void *input,
		       const struct op_backend *b)
{
	const struct chain_params *p = params;
	const struct chain_in *in = input;
	struct graph_out *o = op_alloc(r, sizeof(*o));
	struct chain_dev d = chain_setup(r, b, p, in, p->T);
	struct chain_rec eager = { .b = b, .p = p, .d = &d }, rec = eager;

	o->graphs = b->be->info.graphs;
	for (int i = 0; i < 3 && !o->rc; i++) {
		chain_inputs(r, b, &d, p, in, i, 0);
		o->rc = chain_forward(&eager);
		o->eager[i] = op_get(r, b, &d.out);
		o->eager_ids[i] = get_ints(r, b, &d.ids);
		op_poison(r, b, &d.out);
		op_poison(r, b, &d.ids);
		o->calls++;
		o->rc = o->rc ? o->rc : kt_graph(b->be, case_key(r), chain_forward, &rec);
		o->replay[i] = op_get(r, b, &d.out);
		o->replay_ids[i] = get_ints(r, b, &d.ids);
	}
	o->records = rec.records;
	return o;
}

static void graph_check(struct op_run *r, const void *params, const void *input, const void *got,
			const void *cpu)
{
	const struct chain_params *p = params;
	const struct graph_out *g = got, *c = cpu;
	const size_t n = (size_t)p->T * p->N;
	double *ref = op_doubles(r, n), *scale = op_doubles(r, n);

	op_check_rc(r, g->rc, 0, "every op and graph call runs");
	op_check(r, g->calls == 3, "%d graph calls made", g->calls);
	op_check(r, g->records == (g->graphs ? 1 : g->calls),
		 "record() ran %d times for %d calls (backend %s graphs)", g->records, g->calls,
		 g->graphs ? "records" : "records no");
	for (int i = 0; i < g->calls; i++) {
		op_check_bits(r, g->replay[i], g->eager[i], n, "round %d: out %s as run eagerly", i,
			      i ? "replayed" : "recorded");
		op_check_ints(r, g->replay_ids[i], g->eager_ids[i], (size_t)p->T * p->k,
			      "round %d: ids as run eagerly", i);
		if (c && i < c->calls) {
			op_check_close(r, g->replay[i], c->replay[i], n, INFINITY, 1e-4,
				       "round %d: out against the cpu", i);
			continue;
		}
		chain_reference(r, p, input, i, ref, scale);
		op_check_rel(r, g->replay[i], ref, scale, n, 2e-5,
			     "round %d: out against the chain in double", i);
	}
}

static const struct op_family graph = { chain_build, graph_run, graph_check, false };

struct inv_out {
	int rc;
	bool promised;
	float *batch, *alone, *sharded, *one_thread;
};

/* The batch's y again with w split into shards (one moe_matmul each, as the
 * ranks hold them), summed with add, then combined. */
static float *run_sharded(struct op_run *r, const struct op_backend *b,
			  const struct chain_params *p, const struct chain_in *in,
			  const struct chain_dev *d, int *rc)
{
	const int A = p->T * p->k;
	struct kt_tensor sum = op_tensor(r, b, KT_F32, A, p->N, NULL);

	for (int s = 0, e0 = 0; e0 < p->E && !*rc; s++) {
		const int e1 = s < 4 && p->shards[s] ? p->shards[s] : p->E;
		struct kt_tensor ws = op_weight_bf16(r, b, in->w1 + (size_t)e0 * p->N * p->K,
						     (int64_t)(e1 - e0) * p->N, p->K);
		struct kt_tensor ys = s ? op_tensor(r, b, KT_F32, A, p->N, NULL) : sum;

		*rc = kt_moe_matmul(b->be, &ys, &d->x, &ws, &d->order, &d->offsets, p->k, e0);
		if (s && !*rc)
			*rc = kt_add(b->be, &sum, &ys);
		e0 = e1;
	}
	op_poison(r, b, &d->out);
	*rc = *rc ? *rc : kt_moe_combine(b->be, &d->out, &sum, &d->w, &d->slot);
	return op_get(r, b, &d->out);
}

/* The batch on a second backend of b's kind with one thread. */
static float *run_one_thread(struct op_run *r, const struct op_backend *b,
			     const struct chain_params *p, const struct chain_in *in, int *rc)
{
	struct kt_config c1 = *b->config;
	const struct op_backend *one;
	struct chain_dev d;
	struct chain_rec rec;

	c1.threads = 1;
	one = op_open(r, b, &c1);
	d = chain_setup(r, one, p, in, p->T);
	rec = (struct chain_rec){ .b = one, .p = p, .d = &d };
	chain_inputs(r, one, &d, p, in, 0, 0);
	*rc = chain_forward(&rec);
	return op_get(r, one, &d.out);
}

static void *inv_run(struct op_run *r, const void *params, const void *input,
		     const struct op_backend *b)
{
	const struct chain_params *p = params;
	const struct chain_in *in = input;
	struct inv_out *o = op_alloc(r, sizeof(*o));
	struct chain_dev d = chain_setup(r, b, p, in, p->T), d1 = chain_setup(r, b, p, in, 1);
	struct chain_rec batch = { .b = b, .p = p, .d = &d }, alone = { .b = b, .p = p, .d = &d1 };

	o->promised = op_moe_invariant(b);
	chain_inputs(r, b, &d, p, in, 0, 0);
	o->rc = chain_forward(&batch);
	o->batch = op_get(r, b, &d.out);
	o->alone = op_floats(r, (size_t)p->T * p->N);
	for (int t = 0; t < p->T && !o->rc; t++) {
		chain_inputs(r, b, &d1, p, in, 0, t);
		o->rc = chain_forward(&alone);
		op_ok(r, kt_download(b->be, o->alone + (size_t)t * p->N, &d1.out, 0,
				     kt_nbytes(&d1.out)), "kt_download");
	}
	if (!o->rc)
		o->sharded = run_sharded(r, b, p, in, &d, &o->rc);
	if (o->promised && !o->rc)
		o->one_thread = run_one_thread(r, b, p, in, &o->rc);
	return o;
}

static void inv_check(struct op_run *r, const void *params, const void *input, const void *got,
		      const void *cpu)
{
	const struct chain_params *p = params;
	const struct inv_out *g = got;
	const size_t n = (size_t)p->T * p->N;

	op_check_rc(r, g->rc, 0, "every op runs");
	if (g->rc)
		return;
	if (!g->promised) {
		op_check_close(r, g->alone, g->batch, n, INFINITY, 1e-8,
			       "each token alone against the batch of %d", p->T);
		op_check_close(r, g->sharded, g->batch, n, INFINITY, 1e-8,
			       "the experts in shards against all in one call");
		return;
	}
	op_check_bits(r, g->alone, g->batch, n, "each token alone as in the batch of %d", p->T);
	op_check_bits(r, g->sharded, g->batch, n, "the experts in shards as all in one call");
	op_check_bits(r, g->one_thread, g->batch, n, "the batch on a backend of one thread");
}

static const struct op_family invariance = { chain_build, inv_run, inv_check, true };

#define ROUTE(name, ...) \
	{ name, "moe_route", &route, &(const struct route_params){ __VA_ARGS__ } }
#define MM(name, ...) { name, "moe_matmul", &moe_mm, &(const struct mm_params){ __VA_ARGS__ } }
#define COMBINE(name, ...) \
	{ name, "moe_combine", &combine, &(const struct combine_params){ __VA_ARGS__ } }
#define FAULT(name, op, f) { name, op, &fault, &(const struct fault_params){ .fault = f } }
#define HOST_FAULT(name, op, f) \
	{ name, op, &fault, &(const struct fault_params){ .fault = f, .host_checked = true } }
#define GRAPH(name, ...) { name, "graph", &graph, &(const struct chain_params){ __VA_ARGS__ } }
#define INV(name, ...) \
	{ name, "moe_*", &invariance, &(const struct chain_params){ __VA_ARGS__ } }

static const struct op_case cases[] = {
	ROUTE("moe_route T=1 E=8 k=1", .T = 1, .E = 8, .k = 1),
	ROUTE("moe_route T=3 E=8 k=2 norm", .T = 3, .E = 8, .k = 2, .norm = true),
	ROUTE("moe_route T=17 E=64 k=8 norm", .T = 17, .E = 64, .k = 8, .norm = true),
	ROUTE("moe_route T=17 E=128 k=1", .T = 17, .E = 128, .k = 1),
	ROUTE("moe_route T=200 E=128 k=8 norm", .T = 200, .E = 128, .k = 8, .norm = true),
	ROUTE("moe_route T=200 E=128 k=8", .T = 200, .E = 128, .k = 8),
	ROUTE("moe_route T=3 E=64 k=2", .T = 3, .E = 64, .k = 2),
	ROUTE("moe_route T=5 E=64 k=16 norm", .T = 5, .E = 64, .k = KT_MOE_MAX_K, .norm = true),
	ROUTE("moe_route T=17 E=64 k=8 logits ±100", .T = 17, .E = 64, .k = 8, .mag = 100.0f),
	ROUTE("moe_route T=17 E=8 k=2 ties norm", .T = 17, .E = 8, .k = 2, .norm = true,
	      .logits = LOGITS_TIES),
	ROUTE("moe_route T=200 E=64 k=8 ties", .T = 200, .E = 64, .k = 8, .logits = LOGITS_TIES),
	ROUTE("moe_route T=17 E=128 k=1 ties", .T = 17, .E = 128, .k = 1,
	      .logits = LOGITS_TIES),
	ROUTE("moe_route T=17 E=8 k=8 (k = E) ties norm", .T = 17, .E = 8, .k = 8, .norm = true,
	      .logits = LOGITS_TIES),
	ROUTE("moe_route T=3 E=128 k=8 all equal norm", .T = 3, .E = 128, .k = 8, .norm = true,
	      .logits = LOGITS_EQUAL),
	ROUTE("moe_route T=3 E=64 k=2 all equal", .T = 3, .E = 64, .k = 2,
	      .logits = LOGITS_EQUAL),
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
	FAULT("moe_route: k = 0", "moe_route", ROUTE_K_ZERO),
	FAULT("moe_route: k = KT_MOE_MAX_K + 1", "moe_route", ROUTE_K_ABOVE_MAX),
	FAULT("moe_route: k above E", "moe_route", ROUTE_K_ABOVE_E),
	FAULT("moe_route: w of other columns", "moe_route", ROUTE_W_COLS),
	FAULT("moe_route: ids of other rows", "moe_route", ROUTE_IDS_ROWS),
	FAULT("moe_route: order of other rows", "moe_route", ROUTE_ORDER_ROWS),
	FAULT("moe_route: slot of two columns", "moe_route", ROUTE_SLOT_COLS),
	FAULT("moe_route: offsets of E rows", "moe_route", ROUTE_OFFSETS_ROWS),
	FAULT("moe_route: logits of i32", "moe_route", ROUTE_LOGITS_I32),
	FAULT("moe_route: w over logits", "moe_route", ROUTE_W_OVER_LOGITS),
	FAULT("moe_matmul: w of other columns", "moe_matmul", MM_W_COLS),
	FAULT("moe_matmul: w rows not whole experts", "moe_matmul", MM_W_ROWS),
	FAULT("moe_matmul: experts past E", "moe_matmul", MM_RANGE),
	FAULT("moe_matmul: e0 = -1", "moe_matmul", MM_E0_NEGATIVE),
	FAULT("moe_matmul: k = KT_MOE_MAX_K + 1", "moe_matmul", MM_K_ABOVE_MAX),
	FAULT("moe_matmul: k = -1", "moe_matmul", MM_K_NEGATIVE),
	FAULT("moe_matmul: x rows * k other than y's", "moe_matmul", MM_X_ROWS),
	FAULT("moe_matmul: k = 0, x rows other than y's", "moe_matmul", MM_SORTED_X_ROWS),
	FAULT("moe_matmul: y of other rows than order", "moe_matmul", MM_Y_ROWS),
	FAULT("moe_matmul: order of other rows than y", "moe_matmul", MM_ORDER_ROWS),
	FAULT("moe_matmul: y over x", "moe_matmul", MM_Y_OVER_X),
	HOST_FAULT("moe_matmul: offsets going down", "moe_matmul", MM_OFFSETS_DOWN),
	HOST_FAULT("moe_matmul: offsets ending short of T*k", "moe_matmul", MM_OFFSETS_END),
	HOST_FAULT("moe_matmul: offsets starting at 1", "moe_matmul", MM_OFFSETS_START),
	HOST_FAULT("moe_matmul: an order entry = T*k", "moe_matmul", MM_ORDER_RANGE),
	FAULT("moe_combine: y of other rows", "moe_combine", COMBINE_Y_ROWS),
	FAULT("moe_combine: k = KT_MOE_MAX_K + 1", "moe_combine", COMBINE_K_ABOVE_MAX),
	FAULT("moe_combine: slot of other rows", "moe_combine", COMBINE_SLOT_ROWS),
	FAULT("moe_combine: out of other columns", "moe_combine", COMBINE_OUT_COLS),
	FAULT("moe_combine: out over y", "moe_combine", COMBINE_OUT_OVER_Y),
	HOST_FAULT("moe_combine: a slot entry = T*k", "moe_combine", COMBINE_SLOT_RANGE),
	GRAPH("graph: moe route, matmul k>0, k=0, combine T=5 E=16 k=4",
	      .T = 5, .E = 16, .k = 4, .K = 64, .I = 40, .N = 48, .norm = true),
	GRAPH("graph: moe route, matmul k>0, k=0, combine T=37 E=64 k=8",
	      .T = 37, .E = 64, .k = 8, .K = 256, .I = 96, .N = 256),
	INV("moe invariance: batch, shards T=37 E=64 k=8 K=256 N=96 norm", .T = 37, .E = 64,
	    .k = 8, .K = 256, .N = 96, .norm = true, .shards = { 21, 48 }),
	INV("moe invariance: batch, shards T=37 E=8 k=2 K=40 N=24", .T = 37, .E = 8, .k = 2,
	    .K = 40, .N = 24, .shards = { 3, 4, 7 }),
};

OP_LIST(ops_moe, cases);
