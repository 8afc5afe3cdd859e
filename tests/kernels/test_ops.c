/* The row and elementwise ops of the cpu backend (embed, gather_rows,
 * rmsnorm, matmul, rope, swiglu, add) against naive double-precision
 * references on random inputs and poisoned outputs, plus their refusals. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kt_testutil.h"

#define F32_TOL 1e-5

static int setup(void **state)
{
	*state = tu_open(0);
	return 0;
}

static int teardown(void **state)
{
	kt_backend_close(*state);
	return 0;
}

static float *fvec(size_t n)
{
	float *p = malloc(n * sizeof(float) + 1);

	assert_non_null(p);
	return p;
}

static double *dvec(size_t n)
{
	double *p = calloc(n + 1, sizeof(double));

	assert_non_null(p);
	return p;
}

/* All n floats are NaN: the op did not write them. */
static void assert_untouched(struct kt_backend *be, const struct kt_tensor *t)
{
	size_t n = (size_t)(t->rows * t->cols);
	float *got = fvec(n);

	tu_get(be, t, got);
	for (size_t i = 0; i < n; i++)
		assert_true(isnan(got[i]));
	free(got);
}

static void test_embed_and_gather(void **state)
{
	struct kt_backend *be = *state;
	enum { V = 50, H = 24, T = 7, T2 = 5 };
	int32_t ids[T] = { 3, 49, 0, 3, 17, 17, 48 }, idx[T2] = { 6, 0, 3, 3, 2 };
	int32_t bad_ids[T] = { 3, 50, 0, 3, 17, 17, 48 }, neg[T2] = { 1, -1, 0, 0, 0 };
	float *table = fvec(V * H), *got = fvec(T * H);
	double *ref = dvec(T * H);
	struct kt_tensor tt, idt, out, idx_t, out2, bad;

	tu_seed(1);
	tu_fill(table, V * H, 1.0f);
	tt = tu_tensor(be, KT_F32, V, H, table);
	idt = tu_tensor(be, KT_I32, T, 1, ids);
	out = tu_tensor(be, KT_F32, T, H, NULL);
	assert_int_equal(kt_embed(be, &out, &tt, &idt), 0);
	tu_get(be, &out, got);
	for (int t = 0; t < T; t++)
		for (int h = 0; h < H; h++)
			ref[t * H + h] = table[ids[t] * H + h];
	tu_check("embed V=50 H=24 T=7", got, ref, NULL, T * H, 0.0);

	/* gather_rows of the embedded rows: out2[i] = out[idx[i]] */
	idx_t = tu_tensor(be, KT_I32, T2, 1, idx);
	out2 = tu_tensor(be, KT_F32, T2, H, NULL);
	assert_int_equal(kt_gather_rows(be, &out2, &out, &idx_t), 0);
	tu_get(be, &out2, got);
	for (int i = 0; i < T2; i++)
		for (int h = 0; h < H; h++)
			ref[i * H + h] = table[ids[idx[i]] * H + h];
	tu_check("gather_rows n=5 of T=7", got, ref, NULL, T2 * H, 0.0);

	/* Out-of-range ids fail before anything is written. */
	kt_free(be, &out2);
	out2 = tu_tensor(be, KT_F32, T, H, NULL);
	bad = tu_tensor(be, KT_I32, T, 1, bad_ids);
	assert_int_equal(kt_embed(be, &out2, &tt, &bad), -EINVAL);
	assert_untouched(be, &out2);
	kt_free(be, &bad);
	bad = tu_tensor(be, KT_I32, T2, 1, neg);
	struct kt_tensor out3 = kt_rows(out2, 0, T2);
	assert_int_equal(kt_gather_rows(be, &out3, &out, &bad), -EINVAL);
	assert_untouched(be, &out2);
	struct kt_tensor wrong = kt_reshape(out2, T, H - 1);
	assert_int_equal(kt_embed(be, &wrong, &tt, &idt), -EINVAL);
	struct kt_tensor head = kt_rows(out, 0, T2);
	assert_int_equal(kt_gather_rows(be, &head, &out, &idx_t), -EINVAL);

	kt_free(be, &bad);
	kt_free(be, &tt);
	kt_free(be, &idt);
	kt_free(be, &out);
	kt_free(be, &idx_t);
	kt_free(be, &out2);
	free(table);
	free(got);
	free(ref);
}

/* One rmsnorm case: R × D at magnitude mag, with or without residual, out
 * separate or in place over x. */
static void rmsnorm_case(struct kt_backend *be, int R, int D, float mag, bool residual,
			 bool in_place)
{
	const float eps = 1e-6f;
	size_t n = (size_t)R * D;
	float *x = fvec(n), *r = fvec(n), *w = fvec(D), *got = fvec(n);
	double *ref = dvec(n), *xref = dvec(n);
	struct kt_tensor xt, rt, wt, ot;
	char what[96];

	tu_fill(x, n, mag);
	tu_fill(r, n, mag);
	tu_fill(w, D, 2.0f);
	xt = tu_tensor(be, KT_F32, R, D, x);
	rt = tu_tensor(be, KT_F32, R, D, r);
	wt = tu_tensor(be, KT_F32, 1, D, w);
	ot = in_place ? xt : tu_tensor(be, KT_F32, R, D, NULL);
	assert_int_equal(kt_rmsnorm(be, &ot, &xt, residual ? &rt : NULL, &wt, eps), 0);
	for (int i = 0; i < R; i++) {
		double ss = 0.0;

		for (int d = 0; d < D; d++) {
			double v = (double)x[i * D + d] + (residual ? r[i * D + d] : 0.0);
			xref[i * D + d] = v;
			ss += v * v;
		}
		for (int d = 0; d < D; d++)
			ref[i * D + d] = w[d] * xref[i * D + d] / sqrt(ss / D + eps);
	}
	tu_get(be, &ot, got);
	snprintf(what, sizeof what, "rmsnorm R=%d D=%d mag=%g%s%s", R, D, mag,
		 residual ? " +res" : "", in_place ? " in-place" : "");
	tu_check(what, got, ref, NULL, n, F32_TOL);
	if (residual && !in_place) {
		tu_get(be, &xt, got);
		tu_check("  x after x += residual", got, xref, NULL, n, 1e-7);
	}
	if (!in_place)
		kt_free(be, &ot);
	kt_free(be, &xt);
	kt_free(be, &rt);
	kt_free(be, &wt);
	free(x);
	free(r);
	free(w);
	free(got);
	free(ref);
	free(xref);
}

static void test_rmsnorm(void **state)
{
	struct kt_backend *be = *state;
	struct kt_tensor x, w, o;

	tu_seed(2);
	rmsnorm_case(be, 1, 64, 1.0f, false, false);
	rmsnorm_case(be, 5, 1024, 3.0f, true, false);
	rmsnorm_case(be, 3, 77, 1e-3f, true, true);
	rmsnorm_case(be, 3, 77, 1e-3f, false, false);
	rmsnorm_case(be, 257, 128, 1.0f, true, false);
	rmsnorm_case(be, 257, 128, 10.0f, false, true);

	x = tu_tensor(be, KT_F32, 2, 8, NULL);
	w = tu_tensor(be, KT_F32, 1, 7, NULL);
	o = tu_tensor(be, KT_F32, 2, 8, NULL);
	assert_int_equal(kt_rmsnorm(be, &o, &x, NULL, &w, 1e-6f), -EINVAL);
	struct kt_tensor w8 = kt_reshape(w, 1, 8), half = kt_rows(o, 0, 1);
	assert_int_equal(kt_rmsnorm(be, &half, &x, NULL, &w8, 1e-6f), -EINVAL);
	assert_int_equal(kt_rmsnorm(be, &o, &x, &half, &w8, 1e-6f), -EINVAL);
	kt_free(be, &x);
	kt_free(be, &w);
	kt_free(be, &o);
}

static void matmul_case(struct kt_backend *be, int T, int K, int N, bool bias)
{
	float *x = fvec((size_t)T * K), *w = fvec((size_t)N * K), *b = fvec(N);
	float *got = fvec((size_t)T * N);
	double *ref = dvec((size_t)T * N), *scale = dvec((size_t)T * N);
	struct kt_tensor xt, wt, bt, yt;
	char what[96];

	tu_fill(x, (size_t)T * K, 1.0f);
	tu_fill(w, (size_t)N * K, 0.5f);
	tu_fill(b, N, 1.0f);
	xt = tu_tensor(be, KT_F32, T, K, x);
	wt = tu_tensor(be, KT_F32, N, K, w);
	bt = tu_tensor(be, KT_F32, 1, N, b);
	yt = tu_tensor(be, KT_F32, T, N, NULL);
	assert_int_equal(kt_matmul(be, &yt, &xt, &wt, bias ? &bt : NULL), 0);
	for (int t = 0; t < T; t++) {
		for (int j = 0; j < N; j++) {
			double s = bias ? b[j] : 0.0, a = bias ? fabs(b[j]) : 0.0;

			for (int k = 0; k < K; k++) {
				s += (double)x[t * K + k] * w[j * K + k];
				a += fabs((double)x[t * K + k] * w[j * K + k]);
			}
			ref[t * N + j] = s;
			scale[t * N + j] = a;
		}
	}
	tu_get(be, &yt, got);
	snprintf(what, sizeof what, "matmul T=%d K=%d N=%d%s", T, K, N, bias ? " +bias" : "");
	tu_check(what, got, ref, scale, (size_t)T * N, F32_TOL);
	kt_free(be, &xt);
	kt_free(be, &wt);
	kt_free(be, &bt);
	kt_free(be, &yt);
	free(x);
	free(w);
	free(b);
	free(got);
	free(ref);
	free(scale);
}

static void test_matmul(void **state)
{
	struct kt_backend *be = *state;
	struct kt_tensor x, w, y, b;

	tu_seed(3);
	matmul_case(be, 1, 64, 96, true);
	matmul_case(be, 1, 1024, 1000, false);
	matmul_case(be, 5, 33, 17, true);
	matmul_case(be, 7, 1024, 1000, false);
	matmul_case(be, 64, 256, 130, true);
	matmul_case(be, 70, 203, 700, true);
	matmul_case(be, 3, 8, 2, false);
	matmul_case(be, 2, 5, 4, true);
	matmul_case(be, 1, 19, 23, true);
	matmul_case(be, 9, 40, 29, false);

	x = tu_tensor(be, KT_F32, 3, 8, NULL);
	w = tu_tensor(be, KT_F32, 5, 8, NULL);
	y = tu_tensor(be, KT_F32, 3, 5, NULL);
	b = tu_tensor(be, KT_F32, 1, 4, NULL);
	struct kt_tensor w7 = kt_reshape(w, 5, 7), y4 = kt_reshape(y, 3, 4), xy = kt_reshape(x, 3, 5);
	assert_int_equal(kt_matmul(be, &y, &x, &w7, NULL), -EINVAL);
	assert_int_equal(kt_matmul(be, &y4, &x, &w, NULL), -EINVAL);
	assert_int_equal(kt_matmul(be, &y, &x, &w, &b), -EINVAL);
	assert_int_equal(kt_matmul(be, &xy, &x, &w, NULL), -EINVAL);
	struct kt_tensor w16 = w;
	w16.dtype = KT_BF16;
	assert_int_equal(kt_matmul(be, &y, &x, &w16, NULL), -EINVAL);
	assert_untouched(be, &y);
	kt_free(be, &x);
	kt_free(be, &w);
	kt_free(be, &y);
	kt_free(be, &b);
}

/* Each row of y is bitwise the same whether computed alone, inside a window
 * of the batch, in the full batch, or with another thread count (DESIGN
 * §4.1). Shapes hit every tile remainder and several blocks of x and w. */
static void test_matmul_batch_invariant(void **state)
{
	enum { T = 70, K = 203, N = 700 };
	struct kt_backend *be = *state, *one = tu_open(1);
	float *x = fvec(T * K), *w = fvec(N * K), *b = fvec(N), *all = fvec(T * N);
	float *part = fvec(T * N), *solo = fvec(T * N);
	struct kt_tensor xt, wt, bt, yt, x1, w1, b1, y1;
	int windows[][2] = { { 0, 1 }, { 5, 13 }, { 1, 2 }, { 66, 4 }, { 17, 53 } };

	tu_seed(9);
	tu_fill(x, T * K, 1.0f);
	tu_fill(w, N * K, 0.5f);
	tu_fill(b, N, 1.0f);
	xt = tu_tensor(be, KT_F32, T, K, x);
	wt = tu_tensor(be, KT_F32, N, K, w);
	bt = tu_tensor(be, KT_F32, 1, N, b);
	yt = tu_tensor(be, KT_F32, T, N, NULL);
	assert_int_equal(kt_matmul(be, &yt, &xt, &wt, &bt), 0);
	tu_get(be, &yt, all);
	for (size_t i = 0; i < sizeof windows / sizeof windows[0]; i++) {
		int r0 = windows[i][0], n = windows[i][1];
		struct kt_tensor xs = kt_rows(xt, r0, n), ys = kt_rows(yt, 0, n);

		assert_int_equal(kt_matmul(be, &ys, &xs, &wt, &bt), 0);
		tu_get(be, &ys, part);
		assert_memory_equal(part, all + r0 * N, sizeof(float) * n * N);
	}
	for (int t = 0; t < T; t++) {
		struct kt_tensor xs = kt_rows(xt, t, 1), ys = kt_rows(yt, t, 1);

		assert_int_equal(kt_matmul(be, &ys, &xs, &wt, &bt), 0);
	}
	tu_get(be, &yt, solo);
	assert_memory_equal(solo, all, sizeof(float) * T * N);

	x1 = tu_tensor(one, KT_F32, T, K, x);
	w1 = tu_tensor(one, KT_F32, N, K, w);
	b1 = tu_tensor(one, KT_F32, 1, N, b);
	y1 = tu_tensor(one, KT_F32, T, N, NULL);
	assert_int_equal(kt_matmul(one, &y1, &x1, &w1, &b1), 0);
	tu_get(one, &y1, solo);
	assert_memory_equal(solo, all, sizeof(float) * T * N);
	print_message("  matmul T=70 K=203 N=700: rows identical alone, in 5 windows, 1 or %s threads\n",
		      "all");

	kt_backend_close(one);
	kt_free(be, &xt);
	kt_free(be, &wt);
	kt_free(be, &bt);
	kt_free(be, &yt);
	free(x);
	free(w);
	free(b);
	free(all);
	free(part);
	free(solo);
}

static void rope_case(struct kt_backend *be, int T, int n_heads, int D, double base, int max_pos)
{
	int half = D / 2, C = n_heads * D;
	float *x = fvec((size_t)T * C), *inv = fvec(half), *got = fvec((size_t)T * C);
	double *ref = dvec((size_t)T * C), *scale = dvec((size_t)T * C);
	int32_t *pos = malloc(T * sizeof(int32_t));
	struct kt_tensor xt, pt, it;
	char what[96];

	tu_fill(x, (size_t)T * C, 2.0f);
	for (int i = 0; i < half; i++)
		inv[i] = (float)(1.0 / pow(base, 2.0 * i / D));
	for (int t = 0; t < T; t++)
		pos[t] = t == 0 ? max_pos : tu_randint(max_pos + 1);
	xt = tu_tensor(be, KT_F32, T, C, x);
	pt = tu_tensor(be, KT_I32, T, 1, pos);
	it = tu_tensor(be, KT_F32, 1, half, inv);
	assert_int_equal(kt_rope(be, &xt, &pt, &it, n_heads, D, NULL, 0.0f), 0);
	for (int t = 0; t < T; t++) {
		for (int h = 0; h < n_heads; h++) {
			const float *a = x + t * C + h * D, *b = a + half;
			double *ra = ref + t * C + h * D, *rb = ra + half;
			double *sa = scale + t * C + h * D, *sb = sa + half;

			for (int i = 0; i < half; i++) {
				float angle = (float)pos[t] * inv[i]; /* f32, as Hugging Face */
				double c = cos((double)angle), s = sin((double)angle);

				ra[i] = a[i] * c - b[i] * s;
				rb[i] = b[i] * c + a[i] * s;
				sa[i] = fabs(a[i] * c) + fabs(b[i] * s);
				sb[i] = fabs(b[i] * c) + fabs(a[i] * s);
			}
		}
	}
	tu_get(be, &xt, got);
	snprintf(what, sizeof what, "rope T=%d heads=%d D=%d base=%g pos<=%d", T, n_heads, D, base,
		 max_pos);
	tu_check(what, got, ref, scale, (size_t)T * C, F32_TOL);
	kt_free(be, &xt);
	kt_free(be, &pt);
	kt_free(be, &it);
	free(x);
	free(inv);
	free(got);
	free(ref);
	free(scale);
	free(pos);
}

/* rope with norm_w is rmsnorm of each head followed by rope, bit for bit. */
static void rope_norm_case(struct kt_backend *be, int T, int n_heads, int D)
{
	int C = n_heads * D, half = D / 2;
	float *x = fvec((size_t)T * C), *w = fvec(D), *inv = fvec(half);
	float *fused = fvec((size_t)T * C), *apart = fvec((size_t)T * C);
	int32_t *pos = malloc(T * sizeof(int32_t));

	tu_fill(x, (size_t)T * C, 3.0f);
	tu_fill(w, D, 1.5f);
	for (int i = 0; i < half; i++)
		inv[i] = (float)(1.0 / pow(1000000.0, 2.0 * i / D));
	for (int t = 0; t < T; t++)
		pos[t] = tu_randint(4096);
	struct kt_tensor a = tu_tensor(be, KT_F32, T, C, x), b = tu_tensor(be, KT_F32, T, C, x);
	struct kt_tensor pt = tu_tensor(be, KT_I32, T, 1, pos), it = tu_tensor(be, KT_F32, 1, half, inv);
	struct kt_tensor wt = tu_tensor(be, KT_F32, 1, D, w);
	struct kt_tensor b_heads = kt_reshape(b, (int64_t)T * n_heads, D);

	assert_int_equal(kt_rope(be, &a, &pt, &it, n_heads, D, &wt, 1e-6f), 0);
	assert_int_equal(kt_rmsnorm(be, &b_heads, &b_heads, NULL, &wt, 1e-6f), 0);
	assert_int_equal(kt_rope(be, &b, &pt, &it, n_heads, D, NULL, 0.0f), 0);
	tu_get(be, &a, fused);
	tu_get(be, &b, apart);
	assert_memory_equal(fused, apart, (size_t)T * C * sizeof(float));
	kt_free(be, &a);
	kt_free(be, &b);
	kt_free(be, &pt);
	kt_free(be, &it);
	kt_free(be, &wt);
	free(x);
	free(w);
	free(inv);
	free(fused);
	free(apart);
	free(pos);
}

static void test_rope(void **state)
{
	struct kt_backend *be = *state;
	int32_t pos[2] = { 4, -1 };
	struct kt_tensor x, p, inv;

	tu_seed(4);
	rope_case(be, 1, 16, 64, 10000.0, 2047);
	rope_case(be, 6, 4, 128, 1000000.0, 40000);
	rope_case(be, 5, 3, 72, 10000.0, 100000);
	rope_case(be, 300, 2, 64, 1000000.0, 8191);
	rope_norm_case(be, 7, 4, 128);
	rope_norm_case(be, 3, 2, 64);

	x = tu_tensor(be, KT_F32, 2, 2 * 64, NULL);
	p = tu_tensor(be, KT_I32, 2, 1, pos);
	inv = tu_tensor(be, KT_F32, 1, 32, NULL);
	assert_int_equal(kt_rope(be, &x, &p, &inv, 2, 64, NULL, 0.0f), -EINVAL);
	assert_untouched(be, &x);
	pos[1] = 3;
	assert_int_equal(kt_upload(be, &p, 0, pos, sizeof pos), 0);
	assert_int_equal(kt_rope(be, &x, &p, &inv, 4, 32, NULL, 0.0f), -EINVAL);
	assert_int_equal(kt_rope(be, &x, &p, &inv, 2, 63, NULL, 0.0f), -EINVAL);
	assert_int_equal(kt_rope(be, &x, &p, &inv, 1, 128, NULL, 0.0f), -EINVAL);
	assert_untouched(be, &x);
	kt_free(be, &x);
	kt_free(be, &p);
	kt_free(be, &inv);
}

static void swiglu_case(struct kt_backend *be, int T, int I, float mag, bool in_place)
{
	size_t n = (size_t)T * I;
	float *g = fvec(n), *u = fvec(n), *got = fvec(n);
	double *ref = dvec(n);
	struct kt_tensor gt, ut, ot;
	char what[96];

	tu_fill(g, n, mag);
	tu_fill(u, n, 1.0f);
	gt = tu_tensor(be, KT_F32, T, I, g);
	ut = tu_tensor(be, KT_F32, T, I, u);
	ot = in_place ? gt : tu_tensor(be, KT_F32, T, I, NULL);
	assert_int_equal(kt_swiglu(be, &ot, &gt, &ut), 0);
	for (size_t i = 0; i < n; i++)
		ref[i] = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
	tu_get(be, &ot, got);
	snprintf(what, sizeof what, "swiglu T=%d I=%d mag=%g%s", T, I, mag, in_place ? " in-place" : "");
	tu_check(what, got, ref, NULL, n, F32_TOL);
	if (!in_place)
		kt_free(be, &ot);
	kt_free(be, &gt);
	kt_free(be, &ut);
	free(g);
	free(u);
	free(got);
	free(ref);
}

static void test_swiglu(void **state)
{
	struct kt_backend *be = *state;
	struct kt_tensor a, b;

	tu_seed(6);
	swiglu_case(be, 1, 77, 4.0f, false);
	swiglu_case(be, 3, 3072, 20.0f, true);
	swiglu_case(be, 40, 1000, 2.0f, false);

	a = tu_tensor(be, KT_F32, 2, 10, NULL);
	b = tu_tensor(be, KT_F32, 2, 9, NULL);
	assert_int_equal(kt_swiglu(be, &a, &a, &b), -EINVAL);
	struct kt_tensor shifted = kt_rows(kt_reshape(a, 4, 5), 1, 2);
	shifted = kt_reshape(shifted, 2, 5);
	struct kt_tensor a5 = kt_reshape(a, 2, 5);
	assert_int_equal(kt_swiglu(be, &shifted, &a5, &a5), -EINVAL);
	kt_free(be, &a);
	kt_free(be, &b);
}

static void test_add(void **state)
{
	struct kt_backend *be = *state;
	enum { R = 5, D = 333, N = R * D };
	float *x = fvec(N), *y = fvec(N), *got = fvec(N);
	double *ref = dvec(N), *scale = dvec(N);
	struct kt_tensor xt, yt, big, small;

	tu_seed(7);
	tu_fill(x, N, 1.0f);
	tu_fill(y, N, 1.0f);
	xt = tu_tensor(be, KT_F32, R, D, x);
	yt = tu_tensor(be, KT_F32, R, D, y);
	assert_int_equal(kt_add(be, &yt, &xt), 0);
	for (int i = 0; i < N; i++) {
		ref[i] = (double)y[i] + x[i];
		scale[i] = fabs(y[i]) + fabs(x[i]);
	}
	tu_get(be, &yt, got);
	tu_check("add R=5 D=333", got, ref, scale, N, 1e-7);
	assert_int_equal(kt_add(be, &xt, &xt), 0);
	for (int i = 0; i < N; i++)
		ref[i] = 2.0 * x[i];
	tu_get(be, &xt, got);
	tu_check("add x += x", got, ref, NULL, N, 0.0);

	big = tu_tensor(be, KT_F32, 300, 1024, NULL);
	small = tu_tensor(be, KT_F32, 300, 1023, NULL);
	assert_int_equal(kt_add(be, &big, &small), -EINVAL);
	kt_free(be, &big);
	kt_free(be, &small);
	kt_free(be, &xt);
	kt_free(be, &yt);
	free(x);
	free(y);
	free(got);
	free(ref);
	free(scale);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_embed_and_gather),
		cmocka_unit_test(test_rmsnorm),
		cmocka_unit_test(test_matmul),
		cmocka_unit_test(test_matmul_batch_invariant),
		cmocka_unit_test(test_rope),
		cmocka_unit_test(test_swiglu),
		cmocka_unit_test(test_add),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
