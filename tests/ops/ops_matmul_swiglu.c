/* Cases of matmul_swiglu: act = silu(x · w_gateᵀ) * (x · w_upᵀ) of a gate
 * and up stacked in one w [2I, K] (a dense layer's MLP), which a backend
 * may fuse (cuda: the SwiGLU in the GEMV's epilogue at decode sizes).
 *
 * act must be bit for bit what matmul into gu [T, 2I] then swiglu(act, gu,
 * NULL) give on the same backend: the case runs both. Shapes: the
 * Qwen3-0.6B MLP at 1, 8 and 16 rows (the GEMV's token tiles), x as a bf16
 * tensor and f32, act f32 and bf16; 40 rows (cuBLAS, then swiglu); K not a
 * multiple of 8 (no GEMV); an I that is not a multiple of the GEMV's 8
 * rows; an I past the widest that cuda fuses on gemv_kernel, at 2 rows
 * (cuda on Hopper: fused on the bulk GEMV, which takes any I) and at 12
 * (the product, then swiglu). Against the cpu: act within 1e-3 (f32) or
 * 1e-2 (bf16: one rounding of the output) of the cpu's, relative to |act|
 * + 1. And its refusals.
 */
#include <math.h>

#include "tests/ops/ops.h"

struct ms_params {
	int T, K, I;
	bool x_bf16;    /* x handed over as a bf16 tensor */
	bool act_bf16;  /* act written in bf16 */
};

struct ms_in {
	float *x, *w;
};

struct ms_out {
	int rc, rc_mm, rc_sw;
	float *act, *apart;
};

static void *ms_build(struct op_run *r, const void *params, const struct op_backend *target)
{
	const struct ms_params *p = params;
	struct ms_in *in = op_alloc(r, sizeof(*in));
	const size_t nx = (size_t)p->T * p->K, nw = (size_t)2 * p->I * p->K;

	in->x = op_floats(r, nx);
	in->w = op_floats(r, nw);
	op_fill(r, in->x, nx, 1.0f);
	op_round_bf16(in->x, nx);
	op_fill(r, in->w, nw, 0.1f);
	op_round_bf16(in->w, nw);
	return in;
}

static void *ms_run(struct op_run *r, const void *params, const void *input,
		    const struct op_backend *b)
{
	const struct ms_params *p = params;
	const struct ms_in *in = input;
	const enum kt_dtype adt = p->act_bf16 ? KT_BF16 : KT_F32;
	struct ms_out *o = op_alloc(r, sizeof(*o));
	struct kt_tensor x = op_tensor(r, b, p->x_bf16 ? KT_BF16 : KT_F32, p->T, p->K, in->x);
	struct kt_tensor w = op_weight_bf16(r, b, in->w, 2 * p->I, p->K);
	struct kt_tensor gu = op_tensor(r, b, KT_F32, p->T, 2 * p->I, NULL);
	struct kt_tensor gu2 = op_tensor(r, b, KT_F32, p->T, 2 * p->I, NULL);
	struct kt_tensor act = op_tensor(r, b, adt, p->T, p->I, NULL);
	struct kt_tensor apart = op_tensor(r, b, adt, p->T, p->I, NULL);

	o->rc = kt_matmul_swiglu(b->be, &act, &gu, &x, &w);
	o->rc_mm = kt_matmul(b->be, &gu2, &x, &w, NULL);
	o->rc_sw = kt_swiglu(b->be, &apart, &gu2, NULL);
	o->act = op_get(r, b, &act);
	o->apart = op_get(r, b, &apart);
	return o;
}

static void ms_check(struct op_run *r, const void *params, const void *input, const void *got,
		     const void *cpu)
{
	const struct ms_params *p = params;
	const struct ms_out *g = got, *c = cpu;
	const size_t n = (size_t)p->T * p->I;

	op_check_rc(r, g->rc, 0, "matmul_swiglu runs");
	op_check_rc(r, g->rc_mm, 0, "matmul runs");
	op_check_rc(r, g->rc_sw, 0, "swiglu runs");
	op_check_bits(r, g->act, g->apart, n, "act equal to matmul then swiglu");
	if (c) {
		double *ref = op_doubles(r, n), *scale = op_doubles(r, n);

		for (size_t i = 0; i < n; i++) {
			ref[i] = c->act[i];
			scale[i] = fabs(c->act[i]) + 1.0;
		}
		op_check_rel(r, g->act, ref, scale, n, p->act_bf16 ? 1e-2 : 1e-3,
			     "act against the cpu, per |act| + 1");
	}
}

static const struct op_family matmul_swiglu = { ms_build, ms_run, ms_check, false };

/* Refusals, on every backend: an act of the wrong width, a w of an odd
 * number of rows, act overlapping gu. Nothing is written. */
enum ms_fault { MS_ACT_COLS, MS_W_ODD, MS_OVERLAP };

struct ms_fault_params {
	enum ms_fault fault;
};

struct ms_fault_out {
	int rc_call, rc_sync;
	float *act, *gu;
};

static void *ms_fault_run(struct op_run *r, const void *params, const void *input,
			  const struct op_backend *b)
{
	const struct ms_fault_params *p = params;
	struct ms_fault_out *o = op_alloc(r, sizeof(*o));
	struct kt_tensor x = op_tensor(r, b, KT_F32, 2, 16, NULL);
	struct kt_tensor w = op_weight_bf16(r, b, (float[32 * 16]){ 0 }, 32, 16);
	struct kt_tensor gu = op_tensor(r, b, KT_F32, 2, 32, NULL);
	struct kt_tensor act = op_tensor(r, b, KT_F32, 2, 16, NULL);
	struct kt_tensor a = act, wv = w;

	op_set(r, b, &x, (float[32]){ 0 });
	switch (p->fault) {
	case MS_ACT_COLS: a = kt_reshape(act, 2, 15); break;
	case MS_W_ODD: wv = kt_rows(w, 0, 31); break;
	case MS_OVERLAP: a = kt_reshape(kt_rows(kt_reshape(gu, 4, 16), 1, 2), 2, 16); break;
	}
	o->rc_call = kt_matmul_swiglu(b->be, &a, &gu, &x, &wv);
	o->rc_sync = kt_synchronize(b->be);
	o->act = op_get(r, b, &act);
	o->gu = op_get(r, b, &gu);
	return o;
}

static void ms_fault_check(struct op_run *r, const void *params, const void *input,
			   const void *got, const void *cpu)
{
	const struct ms_fault_out *g = got;

	op_check_rc(r, g->rc_call, -EINVAL, "refused at the call");
	op_check_rc(r, g->rc_sync, 0, "nothing to report at the sync point");
	op_check_poison(r, g->act, 32, "act left alone");
	op_check_poison(r, g->gu, 64, "gu left alone");
}

static const struct op_family ms_fault = { NULL, ms_fault_run, ms_fault_check, true };

#define MS(name, ...) \
	{ name, "matmul_swiglu", &matmul_swiglu, &(const struct ms_params){ __VA_ARGS__ } }
#define MS_FAULT(name, f) \
	{ name, "matmul_swiglu", &ms_fault, &(const struct ms_fault_params){ f } }

static const struct op_case cases[] = {
	MS("matmul_swiglu 0.6B MLP T=1, x and act bf16", .T = 1, .K = 1024, .I = 3072,
	   .x_bf16 = true, .act_bf16 = true),
	MS("matmul_swiglu 0.6B MLP T=8, x and act bf16", .T = 8, .K = 1024, .I = 3072,
	   .x_bf16 = true, .act_bf16 = true),
	MS("matmul_swiglu T=16 K=2048 I=1536, x and act bf16", .T = 16, .K = 2048, .I = 1536,
	   .x_bf16 = true, .act_bf16 = true),
	MS("matmul_swiglu T=5 K=512 I=700, x f32, act f32", .T = 5, .K = 512, .I = 700),
	MS("matmul_swiglu T=11 K=256 I=13 (I not a multiple of 8), act bf16", .T = 11, .K = 256,
	   .I = 13, .act_bf16 = true),
	MS("matmul_swiglu T=40 (cuBLAS, then swiglu), x and act bf16", .T = 40, .K = 512,
	   .I = 384, .x_bf16 = true, .act_bf16 = true),
	MS("matmul_swiglu T=3 K=20 (K not a multiple of 8), act f32", .T = 3, .K = 20, .I = 9),
	MS("matmul_swiglu T=2 K=256 I=4104 (cuda: the bulk GEMV fuses any I), act bf16", .T = 2,
	   .K = 256, .I = 4104, .x_bf16 = true, .act_bf16 = true),
	MS("matmul_swiglu T=12 K=256 I=4104 (cuda: past gemv_kernel's fused I), act bf16",
	   .T = 12, .K = 256, .I = 4104, .x_bf16 = true, .act_bf16 = true),
	MS_FAULT("matmul_swiglu: act of the wrong width", MS_ACT_COLS),
	MS_FAULT("matmul_swiglu: w of an odd number of rows", MS_W_ODD),
	MS_FAULT("matmul_swiglu: act overlapping gu", MS_OVERLAP),
};

OP_LIST(ops_matmul_swiglu, cases);
