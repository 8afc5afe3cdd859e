/* Cases of the cpu backend's bf16-weight kernels, each forced by cpu_isa
 * (generic, avx2, avx512bf16, amx) and cpu_precision (f32, bf16), against
 * double-precision references: matmul and moe_matmul on bf16 weights, and
 * what kt_weight stores under each precision (embed and conv1d read it).
 *
 * A case opens its own cpu backend with the kernel's settings; an
 * instruction set this CPU lacks (the open says -ENOTSUP) passes as skipped
 * and says so. On another backend under test these cases check nothing:
 * the settings are the cpu's.
 *
 * References: the widening kernels (generic, avx2, and any isa under f32
 * precision) multiply exactly: |y - ref| <= 1e-5 · Σ|x w| as matmul's
 * cases. The AVX512-BF16 and AMX kernels under bf16 precision (K <= CPU_DP_MAX_K;
 * wider K widens) rounds x to bf16:
 * against the reference over bf16-rounded x the same 1e-5 bound, and
 * against the exact reference 2^-8 · Σ|x w| (x's rounding). Every row alone
 * gives the bits it gives in the whole batch (DESIGN §4.1).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "kernels/cpu/cpu_impl.h"
#include "tests/ops/ops.h"

struct isa_params {
	const char *isa, *precision;
	int T, K, N;
	bool bias;
	bool moe; /* moe_matmul over 3 experts of N rows, k = 2 */
};

struct isa_in {
	float *x, *w, *bias;
	int32_t *order, *offsets;
};

struct isa_out {
	bool skipped, dp; /* dp: x is rounded to bf16 */
	int rc;
	float *y, *alone;
};

#define MOE_E 3
#define MOE_K 2

static void *isa_build(struct op_run *r, const void *params, const struct op_backend *target)
{
	const struct isa_params *p = params;
	const int E = p->moe ? MOE_E : 1, A = p->moe ? p->T * MOE_K : p->T;
	struct isa_in *in = op_alloc(r, sizeof(*in));
	size_t nw = (size_t)E * p->N * p->K;

	in->x = op_floats(r, (size_t)p->T * p->K);
	in->w = op_floats(r, nw);
	in->bias = op_floats(r, (size_t)p->N);
	op_fill(r, in->x, (size_t)p->T * p->K, 1.0f);
	op_fill(r, in->w, nw, 0.5f);
	op_fill(r, in->bias, (size_t)p->N, 1.0f);
	op_round_bf16(in->w, nw);
	/* moe: row a = token a / k's slot a % k, sorted by expert as a plan is:
	 * expert e takes the slots a with a % E == e. */
	in->order = op_ints(r, (size_t)A);
	in->offsets = op_ints(r, (size_t)E + 1);
	for (int e = 0, n = 0; e < E; e++) {
		in->offsets[e] = n;
		for (int a = 0; a < A; a++)
			if (!p->moe || a % E == e)
				in->order[n++] = a;
		in->offsets[e + 1] = n;
	}
	return in;
}

/* The expert of sorted row a. */
static int isa_expert(const struct isa_params *p, const struct isa_in *in, int a)
{
	int e = 0;

	while (p->moe && a >= in->offsets[e + 1])
		e++;
	return e;
}

/* y on b: matmul or moe_matmul of x rows [t0, t0 + n) (moe: all rows). */
static float *isa_call(struct op_run *r, const struct op_backend *b, const struct isa_params *p,
		       const struct isa_in *in, const struct kt_tensor *x, const struct kt_tensor *w,
		       const struct kt_tensor *bias, int t0, int n, int *rc)
{
	const int A = p->T * MOE_K;
	struct kt_tensor xs = kt_rows(*x, t0, n), y;
	int e;

	if (!p->moe) {
		y = op_tensor(r, b, KT_F32, n, p->N, NULL);
		e = kt_matmul(b->be, &y, &xs, w, p->bias ? bias : NULL);
	} else {
		struct kt_tensor order = op_tensor_raw(r, b, KT_I32, A, 1, in->order);
		struct kt_tensor off = op_tensor_raw(r, b, KT_I32, MOE_E + 1, 1, in->offsets);

		y = op_tensor(r, b, KT_F32, A, p->N, NULL);
		e = kt_moe_matmul(b->be, &y, x, w, &order, &off, MOE_K, 0);
	}
	*rc = *rc ? *rc : e;
	return op_get(r, b, &y);
}

static void *isa_run(struct op_run *r, const void *params, const void *input,
		     const struct op_backend *b)
{
	const struct isa_params *p = params;
	const struct isa_in *in = input;
	struct isa_out *o = op_alloc(r, sizeof(*o));
	struct kt_config c = *b->config;
	struct kt_backend *probe;
	const struct op_backend *k;
	char err[ATLAS_ERRLEN];
	struct kt_tensor x, w, bias;
	int rc;

	if (strcmp(b->kind, "cpu")) {
		o->skipped = true;
		return o;
	}
	c.cpu_isa = p->isa;
	c.cpu_precision = p->precision;
	rc = kt_backend_open(&c, &probe, err, sizeof err);
	if (rc == -ENOTSUP) {
		o->skipped = true;
		return o;
	}
	op_ok(r, rc, "kt_backend_open with the kernel's settings");
	kt_backend_close(probe);
	k = op_open(r, b, &c);
	o->dp = (!strcmp(p->isa, "avx512bf16") || !strcmp(p->isa, "amx")) &&
		!strcmp(p->precision, "bf16") && p->K <= CPU_DP_MAX_K;
	x = op_tensor(r, k, KT_F32, p->T, p->K, in->x);
	w = op_tensor(r, k, KT_BF16, (int64_t)(p->moe ? MOE_E : 1) * p->N, p->K, in->w);
	bias = op_tensor(r, k, KT_F32, 1, p->N, in->bias);
	o->y = isa_call(r, k, p, in, &x, &w, &bias, 0, p->T, &o->rc);
	if (p->moe)
		return o;
	o->alone = op_floats(r, (size_t)p->T * p->N);
	for (int t = 0; t < p->T; t++)
		memcpy(o->alone + (size_t)t * p->N, isa_call(r, k, p, in, &x, &w, &bias, t, 1, &o->rc),
		       (size_t)p->N * sizeof(float));
	return o;
}

/* ref and Σ|x w| in double for every output row, x rounded to bf16 or not. */
static void isa_reference(const struct isa_params *p, const struct isa_in *in, bool round_x,
			  double *ref, double *scale)
{
	const int rows = p->moe ? p->T * MOE_K : p->T;

	for (int a = 0; a < rows; a++) {
		const int t = p->moe ? in->order[a] / MOE_K : a;
		const float *x = in->x + (size_t)t * p->K;
		const float *w = in->w + (size_t)isa_expert(p, in, a) * p->N * p->K;

		for (int j = 0; j < p->N; j++) {
			double s = p->bias ? in->bias[j] : 0.0, m = p->bias ? fabs(in->bias[j]) : 0.0;

			for (int kk = 0; kk < p->K; kk++) {
				double v = (double)(round_x ? op_stored(KT_BF16, x[kk]) : x[kk]) *
					   w[(size_t)j * p->K + kk];
				s += v;
				m += fabs(v);
			}
			ref[(size_t)a * p->N + j] = s;
			scale[(size_t)a * p->N + j] = m;
		}
	}
}

static void isa_check(struct op_run *r, const void *params, const void *input, const void *got,
		      const void *cpu)
{
	const struct isa_params *p = params;
	const struct isa_out *g = got;
	const size_t n = (size_t)(p->moe ? p->T * MOE_K : p->T) * p->N;
	double *ref = op_doubles(r, n), *scale = op_doubles(r, n);

	if (g->skipped) {
		op_check(r, true, "skipped: not the cpu, or this CPU lacks %s", p->isa);
		return;
	}
	op_check_rc(r, g->rc, 0, "every call runs");
	isa_reference(p, input, g->dp, ref, scale);
	op_check_rel(r, g->y, ref, scale, n, 1e-5, "y against x%s · wᵀ in double",
		     g->dp ? " rounded to bf16" : "");
	if (g->dp) {
		isa_reference(p, input, false, ref, scale);
		op_check_rel(r, g->y, ref, scale, n, 1.0 / 256, "y against x · wᵀ, per 2^-8 Σ|x w|");
	}
	if (g->alone)
		op_check_bits(r, g->y, g->alone, n, "every row in the batch as alone");
}

static const struct op_family isa_family = { isa_build, isa_run, isa_check, true };

/* What kt_weight stores under a precision, read by embed and conv1d: the
 * same results as from the weight widened to f32. */
struct store_params {
	const char *precision;
};

struct store_out {
	enum kt_dtype mat, vec;
	int rc;
	float *embed, *embed_f32, *conv, *conv_f32;
};

static void *store_run(struct op_run *r, const void *params, const void *input,
		       const struct op_backend *b)
{
	const struct store_params *p = params;
	struct store_out *o = op_alloc(r, sizeof(*o));
	struct kt_config c = *b->config;
	const struct op_backend *k;
	const int V = 40, H = 48, T = 5, C = 48, KW = 4;
	float *table = op_floats(r, (size_t)V * H), *xv = op_floats(r, (size_t)T * C);
	uint16_t *bits = op_alloc(r, (size_t)V * H * sizeof(uint16_t));
	int32_t ids[5] = { 3, 39, 0, 3, 17 }, pos[5] = { 0, 1, 2, 3, 4 }, slot[5] = { 0 };
	struct kt_tensor wt, wf, vec, out, id, x, st, sl;
	struct kt_batch bt = { .n_tokens = 5 };

	if (strcmp(b->kind, "cpu"))
		return o;
	c.cpu_precision = p->precision;
	k = op_open(r, b, &c);
	op_fill(r, table, (size_t)V * H, 1.0f);
	op_fill(r, xv, (size_t)T * C, 1.0f);
	for (int i = 0; i < V * H; i++) {
		bits[i] = op_bf16_bits(table[i]);
		table[i] = op_bf16_value(bits[i]);
	}
	wt = op_weight(r, k, KT_BF16, bits, V, H);
	wf = op_tensor(r, k, KT_F32, V, H, table);
	vec = op_weight(r, k, KT_BF16, bits, 1, H);
	o->mat = wt.dtype;
	o->vec = vec.dtype;
	id = op_tensor_raw(r, k, KT_I32, T, 1, ids);
	out = op_tensor(r, k, KT_F32, T, H, NULL);
	o->rc = kt_embed(k->be, &out, &wt, &id);
	o->embed = op_get(r, k, &out);
	o->rc = o->rc ? o->rc : kt_embed(k->be, &out, &wf, &id);
	o->embed_f32 = op_get(r, k, &out);
	/* conv1d over one sequence of T tokens; w is the table's first C rows of KW taps */
	x = op_tensor(r, k, KT_F32, T, C, xv);
	sl = op_tensor_raw(r, k, KT_I32, T, 1, slot);
	bt.pos = op_tensor_raw(r, k, KT_I32, T, 1, pos);
	for (int pass = 0; pass < 2; pass++) {
		struct kt_tensor w = kt_reshape(pass ? wf : wt, C, KW);

		st = op_tensor(r, k, KT_F32, 1, (KW - 1) * C, op_floats(r, (size_t)(KW - 1) * C));
		out = op_tensor(r, k, KT_F32, T, C, NULL);
		o->rc = o->rc ? o->rc : kt_conv1d(k->be, &out, &x, &w, &st, &sl, &bt);
		*(pass ? &o->conv_f32 : &o->conv) = op_get(r, k, &out);
	}
	return o;
}

static void store_check(struct op_run *r, const void *params, const void *input,
			const void *got, const void *cpu)
{
	const struct store_params *p = params;
	const struct store_out *g = got;

	if (!g->embed) {
		op_check(r, true, "skipped: not the cpu");
		return;
	}
	op_check_rc(r, g->rc, 0, "embed and conv1d run");
	op_check(r, g->mat == (strcmp(p->precision, "bf16") ? KT_F32 : KT_BF16),
		 "a bf16 matrix is kept as %s", kt_dtype_name(g->mat));
	op_check(r, g->vec == KT_F32, "a bf16 vector is widened to f32 (%s)",
		 kt_dtype_name(g->vec));
	op_check_bits(r, g->embed, g->embed_f32, 5 * 48, "embed as from the f32 table");
	op_check_bits(r, g->conv, g->conv_f32, 5 * 48, "conv1d as with f32 taps");
}

static const struct op_family store_family = { NULL, store_run, store_check, true };

#define ISA(isa_, prec, t, k, n, b, m) \
	{ "matmul kernel " isa_ " " prec " T=" #t " K=" #k " N=" #n, "matmul", &isa_family, \
	  &(const struct isa_params){ .isa = isa_, .precision = prec, .T = t, .K = k, .N = n, \
				      .bias = b, .moe = m } }
#define MOE(isa_, prec, t, k, n) \
	{ "moe_matmul kernel " isa_ " " prec " T=" #t " K=" #k " N=" #n, "moe_matmul", \
	  &isa_family, &(const struct isa_params){ .isa = isa_, .precision = prec, .T = t, \
						   .K = k, .N = n, .moe = true } }
/* Every tile remainder, K a multiple of 32 and not, one K above the dp kernel's bound. */
#define KERNEL(isa_, prec) \
	ISA(isa_, prec, 1, 64, 96, true, false), ISA(isa_, prec, 1, 1000, 37, false, false), \
	ISA(isa_, prec, 5, 33, 17, true, false), ISA(isa_, prec, 7, 1024, 300, false, false), \
	ISA(isa_, prec, 70, 203, 130, true, false), ISA(isa_, prec, 3, 8, 2, false, false), \
	ISA(isa_, prec, 2, 16400, 9, true, false), MOE(isa_, prec, 9, 100, 21)

static const struct op_case cases[] = {
	KERNEL("generic", "f32"), KERNEL("generic", "bf16"),
	KERNEL("avx2", "f32"), KERNEL("avx2", "bf16"),
	KERNEL("avx512bf16", "f32"), KERNEL("avx512bf16", "bf16"),
	KERNEL("amx", "f32"), KERNEL("amx", "bf16"),
	/* the amx kernel's passes of 32 rows and pairs of 16-row w tiles, partly filled */
	ISA("amx", "bf16", 33, 96, 200, true, false), ISA("amx", "bf16", 64, 40, 47, false, false),
	ISA("amx", "bf16", 17, 1536, 1000, true, false),
	{ "weights kept under cpu_precision f32", "weight", &store_family,
	  &(const struct store_params){ "f32" } },
	{ "weights kept under cpu_precision bf16", "weight", &store_family,
	  &(const struct store_params){ "bf16" } },
};

OP_LIST(ops_matmul_isa, cases);
