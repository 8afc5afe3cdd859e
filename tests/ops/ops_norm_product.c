/* Cases of rmsnorm_product: an rmsnorm whose out only the product right
 * after it reads, which a backend may compute inside that product (cuda:
 * in the GEMV's blocks at one row, kernels/cuda/cuda_gemv_norm.cuh).
 *
 * Each case runs the pair twice, side by side with rmsnorm then the same
 * product, on the same backend and from the same x: the product's results
 * and x after its residual add must be the same bits (two rounds, so that
 * x has the residual added twice and a launch's count of blocks starts
 * again from 0; in a graph, recorded once and replayed). Products: matmul
 * (with and without a bias: cuda's two GEMVs at K 1024 and 2048), matmul_n
 * (one launch of two weights), matmul_swiglu (the fused SwiGLU GEMV, at
 * Qwen3-0.6B's MLP and 8B's, whose I only the bulk GEMV fuses); out
 * read by another op before the product (download: out must be
 * written); matmul_n whose weights cuda does not take in one launch (its
 * products one after another, each reading out). Shapes: Qwen3-0.6B's and
 * 8B's hidden sizes, 2048 and 2560 (a thread's vectors partly used), 5120
 * (the widest the GEMV norms), 6144 (past it), products of more blocks
 * than cuda's gemv_kernel norms in (the bulk GEMV norms them on Hopper)
 * and a vocabulary-wide one (the norm runs apart, GEMV_WIDE_ROWS), 3
 * rows (no fusion), an f32 out, no residual (the first layer), norm
 * weights f32 and bf16. Against the cpu: the products within 1e-2 of |y| + 1 (out is rounded to bf16,
 * where one rounding may fall the other way).
 */
#include <errno.h>
#include <math.h>

#include "tests/ops/ops.h"

enum np_product {
	NP_MATMUL,      /* y = out · wᵀ */
	NP_MATMUL_BIAS, /* y = out · wᵀ + b1 (f32) */
	NP_MATMUL_N,    /* y, y2 = out · wᵀ, out · w2ᵀ in one matmul_n */
	NP_SWIGLU,      /* y = silu(out · w[:I]ᵀ) · (out · w[I:]ᵀ), N = 2I */
	NP_READ_OUT,    /* out downloaded, then matmul */
	NP_N_APART,     /* matmul_n with an f32 and a bf16 bias: cuda runs two products */
};

struct np_params {
	enum np_product product;
	int T, K, N;
	bool residual;
	bool w_f32;    /* the norm weight an f32 tensor, not a weight */
	bool out_f32;  /* out f32 (nothing to fuse on cuda) */
	bool graph;    /* the fused side recorded as a graph and replayed */
};

#define NP_ROUNDS 2

struct np_in {
	float *x, *res, *g, *w, *w2, *b1, *b2;
};

struct np_side {
	int rc;
	float *y[NP_ROUNDS], *y2[NP_ROUNDS], *x[NP_ROUNDS], *out[NP_ROUNDS];
};

struct np_out {
	struct np_side fused, apart;
};

static const float eps = 1e-6f;

static void *np_build(struct op_run *r, const void *params, const struct op_backend *target)
{
	const struct np_params *p = params;
	struct np_in *in = op_alloc(r, sizeof(*in));
	const size_t nx = (size_t)p->T * p->K, nw = (size_t)p->N * p->K;

	in->x = op_floats(r, nx);
	in->res = op_floats(r, nx);
	in->g = op_floats(r, (size_t)p->K);
	in->w = op_floats(r, nw);
	in->w2 = op_floats(r, nw);
	in->b1 = op_floats(r, (size_t)p->N);
	in->b2 = op_floats(r, (size_t)p->N);
	op_fill(r, in->x, nx, 4.0f);
	op_fill(r, in->res, nx, 1.0f);
	op_fill(r, in->g, (size_t)p->K, 2.0f);
	op_round_bf16(in->g, (size_t)p->K);
	op_fill(r, in->w, nw, 0.1f);
	op_round_bf16(in->w, nw);
	op_fill(r, in->w2, nw, 0.1f);
	op_round_bf16(in->w2, nw);
	op_fill(r, in->b1, (size_t)p->N, 1.0f);
	op_fill(r, in->b2, (size_t)p->N, 1.0f);
	op_round_bf16(in->b2, (size_t)p->N);
	return in;
}

/* One side's tensors and the ops of a round. */
struct np_world {
	const struct np_params *p;
	const struct op_backend *b;
	struct op_run *r;
	bool fused;
	struct kt_tensor x, res, g, out, w, w2, b1, b2, y, y2, gu;
	float *out_read;  /* NP_READ_OUT: out as the download found it */
};

static int np_round(void *ctx)
{
	struct np_world *c = ctx;
	const struct np_params *p = c->p;
	struct kt_backend *be = c->b->be;
	const struct kt_tensor *res = p->residual ? &c->res : NULL;
	const struct kt_tensor *ys[] = { &c->y, &c->y2 }, *ws[] = { &c->w, &c->w2 };
	const struct kt_tensor *bs[] = { &c->b1, &c->b2 };
	int rc = c->fused ? kt_rmsnorm_product(be, &c->out, &c->x, res, &c->g, eps)
			  : kt_rmsnorm(be, &c->out, &c->x, res, &c->g, eps);

	if (rc)
		return rc;
	switch (p->product) {
	case NP_MATMUL:
		return kt_matmul(be, &c->y, &c->out, &c->w, NULL);
	case NP_MATMUL_BIAS:
		return kt_matmul(be, &c->y, &c->out, &c->w, &c->b1);
	case NP_MATMUL_N:
		return kt_matmul_n(be, 2, ys, &c->out, ws, NULL);
	case NP_SWIGLU:
		return kt_matmul_swiglu(be, &c->y, &c->gu, &c->out, &c->w);
	case NP_READ_OUT:
		c->out_read = op_get(c->r, c->b, &c->out);
		return kt_matmul(be, &c->y, &c->out, &c->w, NULL);
	case NP_N_APART:
		return kt_matmul_n(be, 2, ys, &c->out, ws, bs);
	}
	return -EINVAL;
}

static void np_side_run(struct op_run *r, const struct np_params *p, const struct np_in *in,
			const struct op_backend *b, bool fused, struct np_side *o)
{
	const int Ny = p->product == NP_SWIGLU ? p->N / 2 : p->N;
	struct np_world c = { .p = p, .b = b, .r = r, .fused = fused };

	c.x = op_tensor(r, b, KT_F32, p->T, p->K, in->x);
	c.res = op_tensor(r, b, KT_F32, p->T, p->K, in->res);
	c.g = p->w_f32 ? op_tensor(r, b, KT_F32, 1, p->K, in->g)
		       : op_weight_bf16(r, b, in->g, 1, p->K);
	c.out = op_tensor(r, b, p->out_f32 ? KT_F32 : KT_BF16, p->T, p->K, NULL);
	c.w = op_weight_bf16(r, b, in->w, p->N, p->K);
	c.w2 = op_weight_bf16(r, b, in->w2, p->N, p->K);
	c.b1 = op_tensor(r, b, KT_F32, 1, p->N, in->b1);
	c.b2 = op_weight_bf16(r, b, in->b2, 1, p->N);
	c.y = op_tensor(r, b, p->product == NP_SWIGLU ? KT_BF16 : KT_F32, p->T, Ny, NULL);
	c.y2 = op_tensor(r, b, KT_F32, p->T, p->N, NULL);
	c.gu = op_tensor(r, b, KT_F32, p->T, p->N, NULL);
	for (int i = 0; i < NP_ROUNDS && !o->rc; i++) {
		o->rc = fused && p->graph ? kt_graph(b->be, op_case_key(r), np_round, &c) : np_round(&c);
		o->y[i] = op_get(r, b, &c.y);
		o->y2[i] = op_get(r, b, &c.y2);
		o->x[i] = op_get(r, b, &c.x);
		o->out[i] = c.out_read;
		op_poison(r, b, &c.y);
		op_poison(r, b, &c.y2);
	}
}

static void *np_run(struct op_run *r, const void *params, const void *input,
		    const struct op_backend *b)
{
	const struct np_params *p = params;
	struct np_out *o = op_alloc(r, sizeof(*o));

	np_side_run(r, p, input, b, true, &o->fused);
	np_side_run(r, p, input, b, false, &o->apart);
	return o;
}

static void np_check(struct op_run *r, const void *params, const void *input, const void *got,
		     const void *cpu)
{
	const struct np_params *p = params;
	const struct np_out *g = got, *c = cpu;
	const size_t ny = (size_t)p->T * (p->product == NP_SWIGLU ? p->N / 2 : p->N);
	const size_t nx = (size_t)p->T * p->K;
	const bool two = p->product == NP_MATMUL_N || p->product == NP_N_APART;

	op_check_rc(r, g->fused.rc, 0, "rmsnorm_product and the product run");
	op_check_rc(r, g->apart.rc, 0, "rmsnorm and the product run");
	if (g->fused.rc || g->apart.rc)
		return;
	for (int i = 0; i < NP_ROUNDS; i++) {
		op_check_bits(r, g->fused.y[i], g->apart.y[i], ny,
			      "round %d: the product equal to rmsnorm's then the product", i + 1);
		if (two)
			op_check_bits(r, g->fused.y2[i], g->apart.y2[i], ny,
				      "round %d: the second product equal too", i + 1);
		op_check_bits(r, g->fused.x[i], g->apart.x[i], nx,
			      "round %d: x after the residual add equal to rmsnorm's", i + 1);
		if (p->product == NP_READ_OUT)
			op_check_bits(r, g->fused.out[i], g->apart.out[i], nx,
				      "round %d: out, read before the product, written", i + 1);
	}
	if (c) {
		double *ref = op_doubles(r, ny), *scale = op_doubles(r, ny);

		for (int i = 0; i < NP_ROUNDS; i++) {
			for (size_t j = 0; j < ny; j++) {
				ref[j] = c->fused.y[i][j];
				scale[j] = fabs(c->fused.y[i][j]) + 1.0;
			}
			op_check_rel(r, g->fused.y[i], ref, scale, ny, 1e-2,
				     "round %d: the product against the cpu, per |y| + 1", i + 1);
		}
	}
}

static const struct op_family norm_product = { np_build, np_run, np_check, false };

/* Refusals, on every backend: what rmsnorm refuses (an out of another
 * width, an out overlapping x) comes back at the call; nothing is written,
 * and the product after it still runs on what out held. */
struct np_fault_params {
	bool overlap;
};

struct np_fault_out {
	int rc_call, rc_mm, rc_sync;
	float *x;
};

static void *np_fault_run(struct op_run *r, const void *params, const void *input,
			  const struct op_backend *b)
{
	const struct np_fault_params *p = params;
	struct np_fault_out *o = op_alloc(r, sizeof(*o));
	struct kt_tensor x = op_tensor(r, b, KT_F32, 1, 64, NULL);
	struct kt_tensor g = op_tensor(r, b, KT_F32, 1, 64, NULL);
	struct kt_tensor out = op_tensor(r, b, KT_BF16, 1, 72, NULL);
	struct kt_tensor w = op_weight_bf16(r, b, (float[16 * 64]){ 0 }, 16, 64);
	struct kt_tensor y = op_tensor(r, b, KT_F32, 1, 16, NULL);
	struct kt_tensor o64 = kt_reshape(kt_rows(kt_reshape(out, 72, 1), 0, 64), 1, 64);

	op_set(r, b, &g, (float[64]){ 0 });
	o->rc_call = p->overlap
			     ? kt_rmsnorm_product(b->be, &(struct kt_tensor){ .data = x.data,
									     .dtype = KT_BF16,
									     .rows = 1, .cols = 64 },
						  &x, NULL, &g, eps)
			     : kt_rmsnorm_product(b->be, &out, &x, NULL, &g, eps);
	op_set(r, b, &out, (float[72]){ 0 });
	o->rc_mm = kt_matmul(b->be, &y, &o64, &w, NULL);
	o->rc_sync = kt_synchronize(b->be);
	o->x = op_get(r, b, &x);
	return o;
}

static void np_fault_check(struct op_run *r, const void *params, const void *input,
			   const void *got, const void *cpu)
{
	const struct np_fault_out *g = got;

	op_check_rc(r, g->rc_call, -EINVAL, "refused at the call");
	op_check_rc(r, g->rc_mm, 0, "the product after it runs");
	op_check_rc(r, g->rc_sync, 0, "nothing to report at the sync point");
	op_check_poison(r, g->x, 64, "x left alone");
}

static const struct op_family np_fault = { NULL, np_fault_run, np_fault_check, true };

#define NP(name, ...) \
	{ name, "rmsnorm_product", &norm_product, &(const struct np_params){ __VA_ARGS__ } }
#define NP_FAULT(name, ...) \
	{ name, "rmsnorm_product", &np_fault, &(const struct np_fault_params){ __VA_ARGS__ } }

static const struct op_case cases[] = {
	NP("rmsnorm_product 0.6B q/k/v: T=1 K=1024 N=4096, residual", .product = NP_MATMUL,
	   .T = 1, .K = 1024, .N = 4096, .residual = true),
	NP("rmsnorm_product 0.6B MLP: matmul_swiglu T=1 K=1024 I=3072, residual",
	   .product = NP_SWIGLU, .T = 1, .K = 1024, .N = 6144, .residual = true),
	NP("rmsnorm_product 8B q/k/v: T=1 K=4096 N=6144, residual", .product = NP_MATMUL,
	   .T = 1, .K = 4096, .N = 6144, .residual = true),
	NP("rmsnorm_product 8B MLP: matmul_swiglu T=1 K=4096 I=12288, residual",
	   .product = NP_SWIGLU, .T = 1, .K = 4096, .N = 24576, .residual = true),
	NP("rmsnorm_product first layer: T=1 K=4096 N=1024, no residual", .product = NP_MATMUL,
	   .T = 1, .K = 4096, .N = 1024),
	NP("rmsnorm_product matmul_n T=1 K=2048 N=1000, f32 norm weight", .product = NP_MATMUL_N,
	   .T = 1, .K = 2048, .N = 1000, .residual = true, .w_f32 = true),
	NP("rmsnorm_product T=1 K=2560 N=512, residual, in a graph", .product = NP_MATMUL,
	   .T = 1, .K = 2560, .N = 512, .residual = true, .graph = true),
	NP("rmsnorm_product matmul_swiglu T=1 K=5120 I=128, residual", .product = NP_SWIGLU,
	   .T = 1, .K = 5120, .N = 256, .residual = true),
	NP("rmsnorm_product T=1 K=6144 N=256 (past the widest the GEMV norms)",
	   .product = NP_MATMUL, .T = 1, .K = 6144, .N = 256, .residual = true),
	NP("rmsnorm_product T=1 K=1024 N=8200 (cuda: more blocks than gemv_kernel norms in)",
	   .product = NP_MATMUL, .T = 1, .K = 1024, .N = 8200, .residual = true),
	NP("rmsnorm_product T=1 K=1024 N=40000, in a graph (an lm_head's shape)",
	   .product = NP_MATMUL, .T = 1, .K = 1024, .N = 40000, .residual = true, .graph = true),
	NP("rmsnorm_product T=1 K=256 N=65544, in a graph (cuda: past GEMV_WIDE_ROWS, the norm "
	   "apart, then gemv_kernel)",
	   .product = NP_MATMUL, .T = 1, .K = 256, .N = 65544, .residual = true, .graph = true),
	NP("rmsnorm_product T=3 K=1024 N=512 (more than one row)", .product = NP_MATMUL, .T = 3,
	   .K = 1024, .N = 512, .residual = true),
	NP("rmsnorm_product T=1 K=1024 N=512, out f32", .product = NP_MATMUL, .T = 1, .K = 1024,
	   .N = 512, .residual = true, .out_f32 = true),
	NP("rmsnorm_product: out downloaded before the product", .product = NP_READ_OUT, .T = 1,
	   .K = 1024, .N = 512, .residual = true),
	NP("rmsnorm_product: matmul_n of an f32 and a bf16 bias (products apart)",
	   .product = NP_N_APART, .T = 1, .K = 1024, .N = 512, .residual = true),
	NP("rmsnorm_product matmul +bias T=1 K=2048 N=512, residual", .product = NP_MATMUL_BIAS,
	   .T = 1, .K = 2048, .N = 512, .residual = true),
	NP("rmsnorm_product matmul +bias T=1 K=1024 N=512, residual", .product = NP_MATMUL_BIAS,
	   .T = 1, .K = 1024, .N = 512, .residual = true),
	NP("rmsnorm_product matmul_swiglu T=1 K=1024 I=3072, in a graph", .product = NP_SWIGLU,
	   .T = 1, .K = 1024, .N = 6144, .residual = true, .graph = true),
	NP_FAULT("rmsnorm_product: out of another width", .overlap = false),
	NP_FAULT("rmsnorm_product: out overlapping x", .overlap = true),
};

OP_LIST(ops_norm_product, cases);
