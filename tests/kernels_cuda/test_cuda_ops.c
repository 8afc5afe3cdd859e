/* Every op except attention and sampling, cuda against cpu on the same
 * inputs (random, never zero, odd sizes). Tolerances, per op:
 *  - copies (embed, gather_rows, add, weight conversion, residual add):
 *    bitwise equal;
 *  - swiglu, rmsnorm, rope (with or without its fused per-head norm): max_abs
 *    at a few f32 ulps of O(1) outputs (the device's expf/cosf/sinf and
 *    summation order differ in the last bits);
 *  - matmul with bf16 weights: the cpu is given the same bf16 weights
 *    (kt_weight from a bf16 source) and x already rounded to bf16, so both
 *    compute the same exact products and differ only in f32 accumulation:
 *    |cuda - cpu| <= 1e-4 · Σ_k |x_k w_k| per element (NMSE <= 1e-8).
 *    With x not rounded, cuda rounds it to bf16 and the cpu does not:
 *    NMSE <= 1e-4 (bf16 has an 8-bit significand). This holds for both
 *    cuda paths: the GEMV (bf16 w, T <= CUDA_GEMV_MAX_T, K % 8 == 0) and
 *    cuBLAS (the rest);
 *  - the GEMV's batch invariance: a row of x gives the same bits alone and
 *    in any batch of up to CUDA_GEMV_MAX_T rows (bitwise).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ct_util.h"
#include "kernels/cuda/cuda_gemv.h"

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	assert_non_null(p);
	return p;
}

static void test_device_info(void **state)
{
	const struct kt_device_info *i = &ct_gpu->info;

	printf("  device %s, backend %s, memory %.1f GiB total, %.1f GiB free\n", i->name,
	       i->backend, (double)i->memory_total / (1 << 30),
	       (double)i->memory_free / (1 << 30));
	assert_string_equal(i->backend, "cuda");
	assert_true(strlen(i->name) > 0);
	assert_true(i->memory_total > 0 && i->memory_free <= i->memory_total);
	assert_int_equal(i->kv_dtype, KT_BF16);
	assert_true(i->graphs);
	assert_non_null(strstr(kt_backends_built(), "cuda"));
}

static void test_upload_download(void **state)
{
	const int n = 1001;
	float *a = xmalloc(n * sizeof(float)), *b = xmalloc(n * sizeof(float));
	struct kt_tensor t;

	ct_seed(1);
	ct_fill(a, n, 3.0f);
	assert_int_equal(kt_alloc(ct_gpu, KT_F32, 7, 143, &t), 0);
	assert_int_equal(kt_upload(ct_gpu, &t, 0, a, n * sizeof(float)), 0);
	/* Overwrite a middle range, then read back pieces at offsets. */
	assert_int_equal(kt_upload(ct_gpu, &t, 40 * 4, a + 500, 100 * 4), 0);
	memcpy(b, a, n * sizeof(float));
	memcpy(b + 40, a + 500, 100 * sizeof(float));
	memset(a, 0, n * sizeof(float));
	assert_int_equal(kt_download(ct_gpu, a, &t, 0, 10 * sizeof(float)), 0);
	assert_int_equal(kt_download(ct_gpu, a + 10, &t, 10 * 4, (n - 10) * 4), 0);
	ct_compare_exact("upload/download with offsets", a, b, n);
	assert_int_equal(kt_upload(ct_gpu, &t, 4, a, n * sizeof(float)), -22);
	assert_int_equal(kt_download(ct_gpu, a, &t, n * sizeof(float), 1), -22);
	kt_free(ct_gpu, &t);
	kt_free(ct_gpu, &t); /* a second free of the cleared struct is harmless */
	free(a);
	free(b);
}

/* IEEE binary16 to binary32, exact (the test's own reference). */
static float f16_value(uint16_t h)
{
	int e = (h >> 10) & 0x1f, m = h & 0x3ff;
	float v = e ? ldexpf((float)(m | 0x400), e - 25) : ldexpf((float)m, -24);

	return h & 0x8000 ? -v : v;
}

static void check_weight(enum kt_dtype src_dt, const void *src, const float *value,
			 int64_t rows, int64_t cols, const char *what)
{
	size_t n = (size_t)rows * (size_t)cols;
	uint16_t *got = xmalloc(n * 2);
	struct kt_tensor w;

	assert_int_equal(kt_weight(ct_gpu, src_dt, src, rows, cols, false, &w), 0);
	assert_int_equal(w.dtype, KT_BF16);
	assert_true(w.rows == rows && w.cols == cols);
	assert_int_equal(kt_download(ct_gpu, got, &w, 0, n * 2), 0);
	for (size_t i = 0; i < n; i++)
		if (got[i] != ct_bf16_bits(value[i]))
			fail_msg("%s: element %zu: device bf16 0x%04x, expected 0x%04x (%.9g)",
				 what, i, got[i], ct_bf16_bits(value[i]), value[i]);
	printf("  %-44s bf16 bits equal to round-to-nearest-even (%zu values)\n", what, n);
	kt_free(ct_gpu, &w);
	free(got);
}

static void test_weight(void **state)
{
	/* 3000 × 3000 f32 is bigger than the staging buffer: several chunks. */
	const int64_t shapes[][2] = { { 37, 129 }, { 1, 7 }, { 3000, 3000 } };

	ct_seed(2);
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
		int64_t rows = shapes[s][0], cols = shapes[s][1];
		size_t n = (size_t)rows * (size_t)cols;
		float *f = xmalloc(n * sizeof(float)), *v = xmalloc(n * sizeof(float));
		uint16_t *h = xmalloc(n * 2);
		char what[64];

		ct_fill(f, n, 50.0f);
		snprintf(what, sizeof what, "weight f32 -> bf16 [%lld, %lld]", (long long)rows,
			 (long long)cols);
		check_weight(KT_F32, f, f, rows, cols, what);
		for (size_t i = 0; i < n; i++) {
			/* every exponent, subnormals included; finite only */
			h[i] = (uint16_t)((ct_next() & 0x83ff) | (uint16_t)(ct_randint(31) << 10));
			v[i] = f16_value(h[i]);
		}
		snprintf(what, sizeof what, "weight f16 -> bf16 [%lld, %lld]", (long long)rows,
			 (long long)cols);
		check_weight(KT_F16, h, v, rows, cols, what);
		for (size_t i = 0; i < n; i++) {
			h[i] = ct_bf16_bits(f[i]);
			v[i] = ct_bf16_value(h[i]);
		}
		snprintf(what, sizeof what, "weight bf16 copy [%lld, %lld]", (long long)rows,
			 (long long)cols);
		check_weight(KT_BF16, h, v, rows, cols, what);
		free(f);
		free(v);
		free(h);
	}
}

/* A random bf16 matrix as both backends hold it after kt_weight, and its values. */
static struct ct_pair bf16_weight(int64_t rows, int64_t cols, float mag, float *values)
{
	size_t n = (size_t)rows * (size_t)cols;
	uint16_t *h = xmalloc(n * 2);
	struct ct_pair p;

	ct_fill(values, n, mag);
	for (size_t i = 0; i < n; i++) {
		h[i] = ct_bf16_bits(values[i]);
		values[i] = ct_bf16_value(h[i]);
	}
	p = ct_pair_weight(KT_BF16, h, rows, cols);
	free(h);
	return p;
}

static void run_copy_op(bool embed, int V, int H, int T, bool f32_table)
{
	float *table = xmalloc((size_t)V * H * sizeof(float));
	float *oc = xmalloc((size_t)T * H * 4), *og = xmalloc((size_t)T * H * 4);
	int32_t *ids = xmalloc((size_t)T * sizeof(int32_t));
	struct ct_pair tab, idx, out;
	char what[96];

	if (f32_table || !embed) {
		ct_fill(table, (size_t)V * H, 2.0f);
		tab = ct_pair_new(KT_F32, V, H, table);
	} else {
		tab = bf16_weight(V, H, 2.0f, table);
	}
	for (int t = 0; t < T; t++)
		ids[t] = t % 3 == 2 ? ids[t - 1] : ct_randint(V);
	idx = ct_pair_new(KT_I32, T, 1, ids);
	out = ct_pair_new(KT_F32, T, H, NULL);
	if (embed) {
		assert_int_equal(kt_embed(ct_cpu, &out.c, &tab.c, &idx.c), 0);
		assert_int_equal(kt_embed(ct_gpu, &out.g, &tab.g, &idx.g), 0);
	} else {
		assert_int_equal(kt_gather_rows(ct_cpu, &out.c, &tab.c, &idx.c), 0);
		assert_int_equal(kt_gather_rows(ct_gpu, &out.g, &tab.g, &idx.g), 0);
	}
	ct_pair_get(&out, oc, og);
	snprintf(what, sizeof what, "%s %s [%d, %d], %d rows", embed ? "embed" : "gather_rows",
		 embed ? (f32_table ? "f32" : "bf16") : "f32", V, H, T);
	ct_compare_exact(what, og, oc, (size_t)T * H);
	ct_pair_free(&tab);
	ct_pair_free(&idx);
	ct_pair_free(&out);
	free(table);
	free(oc);
	free(og);
	free(ids);
}

static void test_embed_gather(void **state)
{
	ct_seed(3);
	run_copy_op(true, 1000, 257, 1, false);
	run_copy_op(true, 1000, 257, 64, false);
	run_copy_op(true, 513, 96, 7, true);
	run_copy_op(false, 300, 4096, 9, true);
	run_copy_op(false, 5, 33, 100, true);
}

static void test_swiglu_add(void **state)
{
	const int shapes[][2] = { { 1, 12288 }, { 7, 1000 }, { 33, 129 } };

	ct_seed(4);
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
		int R = shapes[s][0], C = shapes[s][1];
		size_t n = (size_t)R * C;
		float *g = xmalloc(n * 4), *u = xmalloc(n * 4), *oc = xmalloc(n * 4),
		      *og = xmalloc(n * 4);
		struct ct_pair pg, pu, po;
		char what[96];

		ct_fill(g, n, 6.0f);
		ct_fill(u, n, 1.0f);
		pg = ct_pair_new(KT_F32, R, C, g);
		pu = ct_pair_new(KT_F32, R, C, u);
		po = ct_pair_new(KT_F32, R, C, NULL);
		assert_int_equal(kt_swiglu(ct_cpu, &po.c, &pg.c, &pu.c), 0);
		assert_int_equal(kt_swiglu(ct_gpu, &po.g, &pg.g, &pu.g), 0);
		ct_pair_get(&po, oc, og);
		snprintf(what, sizeof what, "swiglu [%d, %d]", R, C);
		ct_compare(what, og, oc, n, 4e-6, 1e-12);
		/* in place over gate */
		assert_int_equal(kt_swiglu(ct_cpu, &pg.c, &pg.c, &pu.c), 0);
		assert_int_equal(kt_swiglu(ct_gpu, &pg.g, &pg.g, &pu.g), 0);
		ct_pair_get(&pg, oc, og);
		snprintf(what, sizeof what, "swiglu in place [%d, %d]", R, C);
		ct_compare(what, og, oc, n, 4e-6, 1e-12);
		/* y += x, then y += y */
		ct_pair_set(&po, g);
		assert_int_equal(kt_add(ct_cpu, &po.c, &pu.c), 0);
		assert_int_equal(kt_add(ct_gpu, &po.g, &pu.g), 0);
		assert_int_equal(kt_add(ct_cpu, &po.c, &po.c), 0);
		assert_int_equal(kt_add(ct_gpu, &po.g, &po.g), 0);
		ct_pair_get(&po, oc, og);
		snprintf(what, sizeof what, "add, add to itself [%d, %d]", R, C);
		ct_compare_exact(what, og, oc, n);
		ct_pair_free(&pg);
		ct_pair_free(&pu);
		ct_pair_free(&po);
		free(g);
		free(u);
		free(oc);
		free(og);
	}
}

static void run_rmsnorm(int R, int D, bool residual, bool in_place, bool bf16_w)
{
	size_t n = (size_t)R * D;
	float *x = xmalloc(n * 4), *r = xmalloc(n * 4), *w = xmalloc((size_t)D * 4);
	float *oc = xmalloc(n * 4), *og = xmalloc(n * 4);
	struct ct_pair px, pr, pw, po;
	char what[96];

	ct_fill(x, n, 3.0f);
	ct_fill(r, n, 3.0f);
	px = ct_pair_new(KT_F32, R, D, x);
	pr = ct_pair_new(KT_F32, R, D, r);
	if (bf16_w) {
		pw = bf16_weight(1, D, 2.0f, w);
	} else {
		ct_fill(w, D, 2.0f);
		pw = ct_pair_new(KT_F32, 1, D, w);
	}
	po = in_place ? px : ct_pair_new(KT_F32, R, D, NULL);
	assert_int_equal(kt_rmsnorm(ct_cpu, &po.c, &px.c, residual ? &pr.c : NULL, &pw.c, 1e-6f),
			 0);
	assert_int_equal(kt_rmsnorm(ct_gpu, &po.g, &px.g, residual ? &pr.g : NULL, &pw.g, 1e-6f),
			 0);
	ct_pair_get(&po, oc, og);
	snprintf(what, sizeof what, "rmsnorm [%d, %d]%s%s, w %s", R, D,
		 residual ? " +residual" : "", in_place ? " in place" : "",
		 bf16_w ? "bf16" : "f32");
	ct_compare(what, og, oc, n, 1e-5, 1e-12);
	if (residual && !in_place) {
		ct_pair_get(&px, oc, og);
		ct_compare_exact("  x after the residual add", og, oc, n);
	}
	if (!in_place)
		ct_pair_free(&po);
	ct_pair_free(&px);
	ct_pair_free(&pr);
	ct_pair_free(&pw);
	free(x);
	free(r);
	free(w);
	free(oc);
	free(og);
}

static void test_rmsnorm(void **state)
{
	ct_seed(5);
	run_rmsnorm(1, 4096, true, false, true);
	run_rmsnorm(5, 1000, true, false, false);
	run_rmsnorm(33, 129, false, false, true);
	run_rmsnorm(40, 128, false, true, true); /* per-head q/k norm shape */
	run_rmsnorm(3, 2048, true, true, true);
}

enum norm_kind { NORM_NONE, NORM_F32, NORM_BF16 };

static void run_rope(int T, int n_heads, int D, enum norm_kind norm)
{
	static const char *const norms[] = { "", ", norm f32 w", ", norm bf16 w" };
	size_t n = (size_t)T * n_heads * D;
	float *x = xmalloc(n * 4), *inv = xmalloc((size_t)D / 2 * 4), *oc = xmalloc(n * 4),
	      *og = xmalloc(n * 4), *w = xmalloc((size_t)D * 4);
	int32_t *pos = xmalloc((size_t)T * 4);
	struct ct_pair px, pp, pi, pw = { 0 };
	const struct kt_tensor *wc = NULL, *wg = NULL;
	char what[96];

	ct_fill(x, n, 2.0f);
	for (int i = 0; i < D / 2; i++)
		inv[i] = 1.0f / powf(1000000.0f, (float)(2 * i) / (float)D);
	for (int t = 0; t < T; t++)
		pos[t] = t < 3 ? t : ct_randint(CT_MAX_CONTEXT);
	px = ct_pair_new(KT_F32, T, (int64_t)n_heads * D, x);
	pp = ct_pair_new(KT_I32, T, 1, pos);
	pi = ct_pair_new(KT_F32, 1, D / 2, inv);
	if (norm == NORM_BF16) {
		pw = bf16_weight(1, D, 2.0f, w);
	} else if (norm == NORM_F32) {
		ct_fill(w, D, 2.0f);
		pw = ct_pair_new(KT_F32, 1, D, w);
	}
	if (norm != NORM_NONE) {
		wc = &pw.c;
		wg = &pw.g;
	}
	assert_int_equal(kt_rope(ct_cpu, &px.c, &pp.c, &pi.c, n_heads, D, wc, 1e-6f), 0);
	assert_int_equal(kt_rope(ct_gpu, &px.g, &pp.g, &pi.g, n_heads, D, wg, 1e-6f), 0);
	ct_pair_get(&px, oc, og);
	snprintf(what, sizeof what, "rope T %d, %d heads, head_dim %d%s", T, n_heads, D,
		 norms[norm]);
	ct_compare(what, og, oc, n, 1e-5, 1e-12);
	ct_pair_free(&px);
	ct_pair_free(&pp);
	ct_pair_free(&pi);
	if (norm != NORM_NONE)
		ct_pair_free(&pw);
	free(w);
	free(x);
	free(inv);
	free(oc);
	free(og);
	free(pos);
}

static void test_rope(void **state)
{
	ct_seed(6);
	run_rope(17, 8, 128, NORM_NONE);
	run_rope(1, 32, 128, NORM_NONE);
	run_rope(9, 4, 64, NORM_NONE);
	run_rope(5, 3, 256, NORM_NONE);
	run_rope(4, 2, 10, NORM_NONE);
	/* Qwen3's q (32 heads) and k (8 heads) of head_dim 128, then odd sizes */
	run_rope(1, 32, 128, NORM_BF16);
	run_rope(7, 8, 128, NORM_BF16);
	run_rope(40, 16, 128, NORM_F32);
	run_rope(3, 9, 256, NORM_BF16);
	run_rope(5, 3, 70, NORM_F32);
	run_rope(2, 11, 10, NORM_BF16);
}

/* A negative position: the token is left alone, the op still returns 0 and
 * the next sync point reports the fault. */
static void test_rope_bad_position(void **state)
{
	const int D = 64, H = 2;
	float x[2 * H * D], got[2 * H * D], inv[D / 2], w[D];
	int32_t pos[2] = { 5, -1 };
	struct ct_pair px, pp, pi, pw;

	ct_seed(9);
	ct_fill(x, sizeof x / sizeof x[0], 1.0f);
	for (int i = 0; i < D / 2; i++)
		inv[i] = 1.0f / powf(10000.0f, (float)(2 * i) / (float)D);
	px = ct_pair_new(KT_F32, 2, H * D, x);
	pp = ct_pair_new(KT_I32, 2, 1, pos);
	pi = ct_pair_new(KT_F32, 1, D / 2, inv);
	pw = bf16_weight(1, D, 1.0f, w);
	assert_int_equal(kt_rope(ct_gpu, &px.g, &pp.g, &pi.g, H, D, &pw.g, 1e-6f), 0);
	assert_int_equal(kt_synchronize(ct_gpu), -22);
	assert_int_equal(kt_download(ct_gpu, got, &px.g, 0, sizeof got), 0);
	ct_compare_exact("rope: token at position -1 untouched", got + H * D, x + H * D, H * D);
	assert_int_equal(kt_rope(ct_gpu, &px.g, &pp.g, &pi.g, H, D + 2, &pw.g, 1e-6f), -22);
	assert_int_equal(kt_rope(ct_gpu, &px.g, &pp.g, &pi.g, H, D, &pw.g, -1.0f), -22);
	ct_pair_free(&px);
	ct_pair_free(&pp);
	ct_pair_free(&pi);
	ct_pair_free(&pw);
}

/* Per-element scale Σ_k |x_k w_k| of y = x · wᵀ (+ |bias|). */
static void product_scale(const float *x, const float *w, const float *bias, int T, int K,
			  int N, double *scale)
{
	for (int t = 0; t < T; t++)
		for (int j = 0; j < N; j++) {
			double s = bias ? fabs(bias[j]) : 0.0;

			for (int k = 0; k < K; k++)
				s += fabs((double)x[(size_t)t * K + k] * w[(size_t)j * K + k]);
			scale[(size_t)t * N + j] = s;
		}
}

/* |cuda - cpu| <= tol · scale per element. */
static void compare_scaled(const char *what, const float *got, const float *ref,
			   const double *scale, size_t n, double tol)
{
	double worst = 0.0;

	for (size_t i = 0; i < n; i++) {
		double e = fabs((double)got[i] - ref[i]) / (scale[i] > 0.0 ? scale[i] : 1.0);

		if (!isfinite(got[i]) || !(e <= tol))
			fail_msg("%s: element %zu: cuda %.9g, cpu %.9g, scale %.3g", what, i,
				 got[i], ref[i], scale[i]);
		worst = e > worst ? e : worst;
	}
	printf("  %-44s max |d|/Σ|x·w| %.3e (tol %.1e)\n", what, worst, tol);
}

enum mm_kind { MM_BF16_ROUNDED_X, MM_BF16_RAW_X, MM_F32_W, MM_BF16_ALLOC };

static void run_matmul(int T, int K, int N, enum mm_kind kind, int bias_kind)
{
	float *x = xmalloc((size_t)T * K * 4), *w = xmalloc((size_t)N * K * 4);
	float *b = xmalloc((size_t)N * 4), *yc = xmalloc((size_t)T * N * 4),
	      *yg = xmalloc((size_t)T * N * 4);
	double *scale = xmalloc((size_t)T * N * sizeof(double));
	struct ct_pair px, pw, pb = { 0 }, py;
	static const char *const kinds[] = { "bf16 w, x bf16-exact", "bf16 w, f32 x",
					     "f32 w", "bf16 w alloc'd, x bf16-exact" };
	char what[128];

	ct_fill(x, (size_t)T * K, 1.0f);
	if (kind != MM_BF16_RAW_X)
		ct_round_bf16(x, (size_t)T * K);
	if (kind == MM_F32_W) {
		ct_fill(w, (size_t)N * K, 0.5f);
		pw = ct_pair_new(KT_F32, N, K, w);
	} else if (kind == MM_BF16_ALLOC) {
		uint16_t *h = xmalloc((size_t)N * K * 2);

		ct_fill(w, (size_t)N * K, 0.5f);
		for (size_t i = 0; i < (size_t)N * K; i++) {
			h[i] = ct_bf16_bits(w[i]);
			w[i] = ct_bf16_value(h[i]);
		}
		/* the cpu holds f32 weights; the device a bf16 tensor of the same values */
		assert_int_equal(kt_weight(ct_cpu, KT_BF16, h, N, K, false, &pw.c), 0);
		assert_int_equal(kt_alloc(ct_gpu, KT_BF16, N, K, &pw.g), 0);
		assert_int_equal(kt_upload(ct_gpu, &pw.g, 0, h, (size_t)N * K * 2), 0);
		free(h);
	} else {
		pw = bf16_weight(N, K, 0.5f, w);
	}
	if (bias_kind == 1) {
		pb = bf16_weight(1, N, 1.0f, b);
	} else if (bias_kind == 2) {
		ct_fill(b, N, 1.0f);
		pb = ct_pair_new(KT_F32, 1, N, b);
	}
	px = ct_pair_new(KT_F32, T, K, x);
	py = ct_pair_new(KT_F32, T, N, NULL);
	assert_int_equal(kt_matmul(ct_cpu, &py.c, &px.c, &pw.c, bias_kind ? &pb.c : NULL), 0);
	assert_int_equal(kt_matmul(ct_gpu, &py.g, &px.g, &pw.g, bias_kind ? &pb.g : NULL), 0);
	ct_pair_get(&py, yc, yg);
	snprintf(what, sizeof what, "matmul T %d K %d N %d, %s%s", T, K, N, kinds[kind],
		 bias_kind == 1 ? ", bf16 bias" : bias_kind == 2 ? ", f32 bias" : "");
	if (kind == MM_BF16_RAW_X) {
		ct_compare(what, yg, yc, (size_t)T * N, INFINITY, 1e-4);
	} else {
		product_scale(x, w, bias_kind ? b : NULL, T, K, N, scale);
		compare_scaled(what, yg, yc, scale, (size_t)T * N, 1e-4);
		ct_compare("  same, as NMSE", yg, yc, (size_t)T * N, INFINITY, 1e-8);
	}
	ct_pair_free(&px);
	ct_pair_free(&pw);
	ct_pair_free(&py);
	if (bias_kind)
		ct_pair_free(&pb);
	free(x);
	free(w);
	free(b);
	free(yc);
	free(yg);
	free(scale);
}

static void test_matmul(void **state)
{
	ct_seed(7);
	run_matmul(1, 4096, 1000, MM_BF16_ROUNDED_X, 0);
	run_matmul(7, 1000, 333, MM_BF16_ROUNDED_X, 1);
	run_matmul(64, 257, 96, MM_BF16_ROUNDED_X, 2);
	run_matmul(33, 2048, 3072, MM_BF16_ROUNDED_X, 0);
	run_matmul(5, 777, 129, MM_BF16_RAW_X, 0);
	run_matmul(16, 512, 200, MM_F32_W, 1);
	/* more rows than max_tokens: the x workspace is used in row chunks */
	run_matmul(CT_MAX_TOKENS + 45, 64, 48, MM_BF16_ROUNDED_X, 2);
	/* K wider than any kt_weight so far: cuBLAS uses the workspace in K chunks */
	run_matmul(CUDA_GEMV_MAX_T + 3, 20000, 16, MM_BF16_ALLOC, 0);
	run_matmul(3, 20000, 16, MM_BF16_ALLOC, 0);
}

/* The GEMV against the cpu: every T up to the threshold and a few past it,
 * the three block shapes (N small, mid, large), K not a multiple of the
 * block's k step, odd N, every bias kind, x not bf16-exact, and K not a
 * multiple of 8 (cuBLAS takes it). */
static void test_matmul_gemv(void **state)
{
	ct_seed(8);
	for (int T = 1; T <= CUDA_GEMV_MAX_T + 2; T++)
		run_matmul(T, 1024, 93 + 2 * T, MM_BF16_ROUNDED_X, T % 3);
	run_matmul(4, 4104, 12289, MM_BF16_ROUNDED_X, 1);
	run_matmul(11, 1000, 5003, MM_BF16_ROUNDED_X, 2);
	run_matmul(CUDA_GEMV_MAX_T, 520, 9000, MM_BF16_ROUNDED_X, 0);
	run_matmul(1, 8, 1, MM_BF16_ROUNDED_X, 1);
	run_matmul(9, 2048, 3001, MM_BF16_RAW_X, 0);
	run_matmul(2, 777, 65, MM_BF16_ROUNDED_X, 1);
	run_matmul(CUDA_GEMV_MAX_T, 1001, 77, MM_BF16_RAW_X, 2);
}

/* y rows of x [T, K] · wᵀ + bias on the device, downloaded into out [T, N]. */
static void gpu_matmul_rows(const struct ct_pair *px, const struct ct_pair *pw,
			    const struct ct_pair *pb, const struct ct_pair *py, int t0, int T,
			    float *out)
{
	struct kt_tensor x = kt_rows(px->g, t0, T), y = kt_rows(py->g, 0, T);

	assert_int_equal(kt_matmul(ct_gpu, &y, &x, &pw->g, &pb->g), 0);
	assert_int_equal(kt_download(ct_gpu, out, &y, 0, kt_nbytes(&y)), 0);
}

/* The batch-invariance of the GEMV: each row alone, then every batch size up
 * to CUDA_GEMV_MAX_T (its rows starting at a varying row of x), bitwise. */
static void test_matmul_batch_invariance(void **state)
{
	const int K = 1536, N = 777, R = CUDA_GEMV_MAX_T + 5;
	float *x = xmalloc((size_t)R * K * 4), *w = xmalloc((size_t)N * K * 4),
	      *b = xmalloc((size_t)N * 4);
	float *alone = xmalloc((size_t)R * N * 4), *got = xmalloc((size_t)CUDA_GEMV_MAX_T * N * 4);
	struct ct_pair px, pw, pb, py;
	char what[96];

	ct_seed(10);
	ct_fill(x, (size_t)R * K, 1.0f);
	px = ct_pair_new(KT_F32, R, K, x);
	pw = bf16_weight(N, K, 0.5f, w);
	pb = bf16_weight(1, N, 1.0f, b);
	py = ct_pair_new(KT_F32, CUDA_GEMV_MAX_T, N, NULL);
	for (int t = 0; t < R; t++)
		gpu_matmul_rows(&px, &pw, &pb, &py, t, 1, alone + (size_t)t * N);
	for (int T = 2; T <= CUDA_GEMV_MAX_T; T++) {
		const int t0 = (T * 7) % (R - T + 1);

		gpu_matmul_rows(&px, &pw, &pb, &py, t0, T, got);
		snprintf(what, sizeof what, "gemv rows %d..%d in a batch of %d", t0, t0 + T - 1, T);
		ct_compare_exact(what, got, alone + (size_t)t0 * N, (size_t)T * N);
	}
	ct_pair_free(&px);
	ct_pair_free(&pw);
	ct_pair_free(&pb);
	ct_pair_free(&py);
	free(x);
	free(w);
	free(b);
	free(alone);
	free(got);
}

struct graph_matmul {
	const struct kt_tensor *y, *x, *w, *bias;
};

static int record_matmul(void *ctx)
{
	const struct graph_matmul *m = ctx;

	return kt_matmul(ct_gpu, m->y, m->x, m->w, m->bias);
}

/* Both matmul paths recorded into a CUDA graph (no allocation, no sync, no
 * host read inside), then replayed on new contents of x. */
static void test_matmul_graph(void **state)
{
	const int K = 1024, N = 515, Ts[] = { 3, CUDA_GEMV_MAX_T + 3 };

	ct_seed(11);
	for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
		const int T = Ts[i];
		float *x = xmalloc((size_t)T * K * 4), *w = xmalloc((size_t)N * K * 4),
		      *b = xmalloc((size_t)N * 4), *yc = xmalloc((size_t)T * N * 4),
		      *yg = xmalloc((size_t)T * N * 4);
		struct ct_pair px, pw, pb, py;
		struct graph_matmul m;
		char what[96];

		pw = bf16_weight(N, K, 0.5f, w);
		pb = bf16_weight(1, N, 1.0f, b);
		px = ct_pair_new(KT_F32, T, K, NULL);
		py = ct_pair_new(KT_F32, T, N, NULL);
		m = (struct graph_matmul){ &py.g, &px.g, &pw.g, &pb.g };
		for (int round = 0; round < 3; round++) {
			ct_fill(x, (size_t)T * K, 1.0f);
			ct_round_bf16(x, (size_t)T * K);
			ct_pair_set(&px, x);
			assert_int_equal(kt_matmul(ct_cpu, &py.c, &px.c, &pw.c, &pb.c), 0);
			assert_int_equal(kt_graph(ct_gpu, 0x6e3e0000u + (uint64_t)T, record_matmul,
						  &m), 0);
			ct_pair_get(&py, yc, yg);
			snprintf(what, sizeof what, "matmul T %d in a graph, %s", T,
				 round ? "replayed" : "recorded");
			ct_compare(what, yg, yc, (size_t)T * N, INFINITY, 1e-8);
		}
		ct_pair_free(&px);
		ct_pair_free(&pw);
		ct_pair_free(&pb);
		ct_pair_free(&py);
		free(x);
		free(w);
		free(b);
		free(yc);
		free(yg);
	}
}

static void test_bad_arguments(void **state)
{
	struct kt_tensor a, b;

	assert_int_equal(kt_alloc(ct_gpu, KT_F32, 4, 8, &a), 0);
	assert_int_equal(kt_alloc(ct_gpu, KT_F32, 4, 9, &b), 0);
	assert_int_equal(kt_add(ct_gpu, &a, &b), -22);
	assert_int_equal(kt_swiglu(ct_gpu, &a, &a, &b), -22);
	assert_int_equal(kt_matmul(ct_gpu, &a, &b, &a, NULL), -22);
	assert_int_equal(kt_rmsnorm(ct_gpu, &a, &a, NULL, &b, 1e-6f), -22);
	assert_int_equal(kt_synchronize(ct_gpu), 0);
	kt_free(ct_gpu, &a);
	kt_free(ct_gpu, &b);
	printf("  bad shapes refused with -EINVAL before any launch\n");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_device_info),
		cmocka_unit_test(test_upload_download),
		cmocka_unit_test(test_weight),
		cmocka_unit_test(test_embed_gather),
		cmocka_unit_test(test_swiglu_add),
		cmocka_unit_test(test_rmsnorm),
		cmocka_unit_test(test_rope),
		cmocka_unit_test(test_rope_bad_position),
		cmocka_unit_test(test_matmul),
		cmocka_unit_test(test_matmul_gemv),
		cmocka_unit_test(test_matmul_batch_invariance),
		cmocka_unit_test(test_matmul_graph),
		cmocka_unit_test(test_bad_arguments),
	};

	ct_require_device();
	return cmocka_run_group_tests(tests, ct_setup, ct_teardown);
}
