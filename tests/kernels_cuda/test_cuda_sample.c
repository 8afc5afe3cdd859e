/* Sampling, cuda against cpu and against an independent host oracle (a full
 * sort in rank order, masses in double).
 *
 * Greedy must equal the cpu exactly (ties: lowest id; NaN counts as -inf),
 * and top_k = 1 must equal greedy at any temperature. For temperature
 * sampling the ids must be equal on rows where u (and top_p) do not sit
 * within rounding of a CDF boundary: the test builds such rows by choosing
 * the token it wants in the oracle's rank order and putting u (and top_p) in
 * the middle of that token's CDF interval, on tokens that carry at least
 * 1e-4 of the kept mass, so float rounding (~1e-7 relative) cannot move the
 * pick.
 * Logits are well separated at the top, ties included where the test says.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "ct_util.h"

#define MARGIN 1e-4

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	assert_non_null(p);
	return p;
}

/* The oracle: the row sorted in rank order and its running masses. */
struct ranked {
	float l;
	int32_t id;
};

struct oracle {
	struct ranked *r; /* [V] rank order */
	double *cum;      /* [V] mass of ranks 0..i */
	int V, limit;     /* limit: tokens top-k keeps */
	double total;     /* mass of those */
};

static int by_rank(const void *pa, const void *pb)
{
	const struct ranked *a = pa, *b = pb;

	if (a->l != b->l)
		return a->l > b->l ? -1 : 1;
	return a->id < b->id ? -1 : a->id > b->id;
}

static void oracle_init(struct oracle *o, const float *l, int V, float temp, int top_k)
{
	float lmax;

	o->V = V;
	o->r = xmalloc((size_t)V * sizeof(*o->r));
	o->cum = xmalloc((size_t)V * sizeof(double));
	for (int i = 0; i < V; i++)
		o->r[i] = (struct ranked){ isnan(l[i]) ? -INFINITY : l[i], i };
	qsort(o->r, (size_t)V, sizeof(*o->r), by_rank);
	lmax = o->r[0].l;
	for (int i = 0; i < V; i++) {
		double w = o->r[i].l == lmax ? 1.0 : exp(((double)o->r[i].l - lmax) / temp);

		o->cum[i] = (i ? o->cum[i - 1] : 0.0) + w;
	}
	o->limit = top_k > 0 && top_k < V ? top_k : V;
	o->total = o->cum[o->limit - 1];
}

static void oracle_free(struct oracle *o)
{
	free(o->r);
	free(o->cum);
}

static double oracle_w(const struct oracle *o, int k)
{
	return o->cum[k] - (k ? o->cum[k - 1] : 0.0);
}

static int oracle_keep(const struct oracle *o, float top_p)
{
	double need = (double)top_p * o->total;

	if (top_p >= 1.0f)
		return o->limit;
	for (int k = 0; k < o->limit; k++)
		if (o->cum[k] >= need)
			return k + 1;
	return o->limit;
}

static int32_t oracle_pick(const struct oracle *o, int keep, float u)
{
	double target = (double)u * o->cum[keep - 1];

	for (int k = 0; k < keep; k++)
		if (o->cum[k] > target)
			return o->r[k].id;
	return o->r[keep - 1].id;
}

/* A random rank in [lo, hi) carrying at least MARGIN of `mass`; -1 if none. */
static int pick_rank(const struct oracle *o, int lo, int hi, double mass)
{
	int n = 0, *c = xmalloc((size_t)(hi > lo ? hi - lo : 1) * sizeof(int)), k;

	for (int i = lo; i < hi; i++)
		if (oracle_w(o, i) >= MARGIN * mass)
			c[n++] = i;
	k = n ? c[ct_randint(n)] : -1;
	free(c);
	return k;
}

/* Fill top_p (when wanted) and u away from every boundary; returns the id
 * the oracle expects. */
static int32_t construct(const struct oracle *o, bool want_top_p, float *top_p, float *u)
{
	int keep = o->limit, j, jp = want_top_p ? pick_rank(o, 1, o->limit, o->total) : -1;
	double kept;
	int32_t id;

	*top_p = 1.0f;
	if (jp > 0) {
		*top_p = (float)((o->cum[jp - 1] + 0.5 * oracle_w(o, jp)) / o->total);
		keep = jp + 1;
		assert_int_equal(oracle_keep(o, *top_p), keep);
	}
	kept = o->cum[keep - 1];
	j = pick_rank(o, 0, keep, kept);
	assert_true(j >= 0);
	*u = (float)(((j ? o->cum[j - 1] : 0.0) + 0.5 * oracle_w(o, j)) / kept);
	id = oracle_pick(o, keep, *u);
	assert_int_equal(id, o->r[j].id);
	return id;
}

/* Sample n rows of logits [n, V] on both backends; expect[i] >= 0 is the
 * oracle's id for row i. Returns the cuda call's seconds. */
static double sample_both(const float *logits, int n, int V, const struct kt_sample_row *rows,
			  const int32_t *expect, const char *what)
{
	struct ct_pair pl = ct_pair_new(KT_F32, n, V, logits);
	int32_t *ic = xmalloc((size_t)n * 4), *ig = xmalloc((size_t)n * 4);
	struct timespec t0, t1;
	int checked = 0;

	assert_int_equal(kt_sample(ct_cpu, &pl.c, rows, n, ic), 0);
	assert_int_equal(kt_synchronize(ct_gpu), 0);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	assert_int_equal(kt_sample(ct_gpu, &pl.g, rows, n, ig), 0);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	for (int i = 0; i < n; i++) {
		if (ig[i] != ic[i])
			fail_msg("%s: row %d (T %g, top_k %d, top_p %.9g, u %.9g): cuda %d, cpu %d",
				 what, i, rows[i].temperature, rows[i].top_k, rows[i].top_p,
				 rows[i].u, ig[i], ic[i]);
		if (expect && expect[i] >= 0) {
			if (ig[i] != expect[i])
				fail_msg("%s: row %d: cuda and cpu %d, oracle %d", what, i, ig[i],
					 expect[i]);
			checked++;
		}
	}
	printf("  %-48s %d rows equal to cpu, %d to the oracle\n", what, n, checked);
	ct_pair_free(&pl);
	free(ic);
	free(ig);
	return (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
}

static void test_greedy(void **state)
{
	const int sizes[] = { 1, 7, 1000, 151936 };

	ct_seed(21);
	for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
		const int V = sizes[s], n = 6;
		float *l = xmalloc((size_t)n * V * 4);
		struct kt_sample_row rows[6] = { { 0 } };
		int32_t expect[6];
		char what[64];

		ct_fill(l, (size_t)n * V, 10.0f);
		/* row 1: the max at three ids; row 2: NaNs, the max after them;
		 * row 3: all equal; row 4: -inf everywhere but one; row 5: all NaN */
		l[1 * V + V / 2] = l[1 * V + V / 3] = l[1 * V + V - 1] = 20.0f;
		for (int i = 0; i < V; i += 3)
			l[2 * V + i] = NAN;
		l[2 * V + V - 1] = 11.0f;
		for (int i = 0; i < V; i++) {
			l[3 * V + i] = 0.25f;
			l[4 * V + i] = -INFINITY;
			l[5 * V + i] = NAN;
		}
		l[4 * V + V / 2] = -1e30f;
		for (int i = 0; i < n; i++) {
			struct oracle o;

			oracle_init(&o, l + (size_t)i * V, V, 1.0f, 0);
			expect[i] = o.r[0].id;
			oracle_free(&o);
		}
		snprintf(what, sizeof what, "greedy, V %d", V);
		sample_both(l, n, V, rows, expect, what);
		/* top_k = 1 at a temperature picks the same tokens */
		for (int i = 0; i < n; i++)
			rows[i] = (struct kt_sample_row){ .temperature = 0.7f, .top_p = 0.5f,
							  .top_k = 1,
							  .u = (float)ct_uniform(0, 0.99) };
		snprintf(what, sizeof what, "top_k 1 at temperature 0.7, V %d", V);
		sample_both(l, n, V, rows, expect, what);
		free(l);
	}
}

/* Top n_top ranks spaced by `step` from 6, the rest in [-30, -8], over a
 * random permutation of ids. */
static void separated_logits(float *l, int V, int n_top, float step)
{
	int32_t *ids = xmalloc((size_t)V * 4);

	for (int i = 0; i < V; i++)
		ids[i] = i;
	ct_shuffle(ids, V);
	for (int r = 0; r < V; r++)
		l[ids[r]] = r < n_top ? 6.0f - step * (float)r : (float)ct_uniform(-30.0, -8.0);
	free(ids);
}

struct temp_case {
	int V;
	float temperature;
	int top_k;
	bool top_p;
};

/* Returns the seconds of the cuda call. */
static double run_temperature(const struct temp_case *tc, int n, int ties)
{
	const int V = tc->V;
	float *l = xmalloc((size_t)n * V * 4);
	struct kt_sample_row *rows = xmalloc((size_t)n * sizeof(*rows));
	int32_t *expect = xmalloc((size_t)n * 4);
	char what[128];
	double secs;

	for (int i = 0; i < n; i++) {
		float *row = l + (size_t)i * V;
		struct oracle o;

		if (ties)
			for (int k = 0; k < V; k++)
				row[k] = 2.0f - 0.5f * (float)ct_randint(ties);
		else
			separated_logits(row, V, V < 600 ? V : 600, 0.02f);
		oracle_init(&o, row, V, tc->temperature, tc->top_k);
		rows[i] = (struct kt_sample_row){ .temperature = tc->temperature,
						  .top_k = tc->top_k };
		expect[i] = construct(&o, tc->top_p, &rows[i].top_p, &rows[i].u);
		oracle_free(&o);
	}
	snprintf(what, sizeof what, "V %d, T %.2f, top_k %d%s%s", V, tc->temperature, tc->top_k,
		 tc->top_p ? ", top_p" : "", ties ? ", tied logits" : "");
	secs = sample_both(l, n, V, rows, expect, what);
	free(l);
	free(rows);
	free(expect);
	return secs;
}

static void test_temperature(void **state)
{
	static const struct temp_case cases[] = {
		{ 5000, 1.0f, 0, false },  { 5000, 0.7f, 50, false }, { 5000, 1.3f, 0, true },
		{ 5000, 0.5f, 40, true },  { 151936, 1.0f, 0, true }, { 151936, 0.8f, 20, false },
		{ 1000, 1.0f, 1000, false }, { 1000, 1.0f, 5000, true }, { 3, 2.0f, 2, true },
	};

	ct_seed(22);
	for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
		run_temperature(&cases[c], 8, 0);
}

static void test_ties(void **state)
{
	static const struct temp_case grouped[] = {
		{ 1000, 1.0f, 0, false }, { 1000, 0.9f, 300, true }, { 4096, 3.0f, 0, true },
	};

	ct_seed(23);
	/* one value everywhere: the pick is u's id in id order */
	run_temperature(&grouped[0], 4, 1);
	/* ten values shared by ~100 ids each: picks deep inside tie groups */
	for (size_t c = 0; c < sizeof grouped / sizeof grouped[0]; c++)
		run_temperature(&grouped[c], 8, 10);
}

static void test_many_rows(void **state)
{
	/* more rows than one launch takes (max_tokens): the rows go in chunks */
	const struct temp_case tc = { 257, 1.0f, 0, true };

	ct_seed(24);
	run_temperature(&tc, CT_MAX_TOKENS + 44, 0);
}

static void test_bad_rows(void **state)
{
	float l[4] = { 1, 2, 3, 4 };
	struct ct_pair pl = ct_pair_new(KT_F32, 1, 4, l);
	struct kt_sample_row bad[] = { { .temperature = 1.0f, .top_p = 1.0f, .u = 1.0f },
				       { .temperature = -1.0f, .top_p = 1.0f },
				       { .temperature = 1.0f, .top_p = 1.5f },
				       { .temperature = NAN, .top_p = 1.0f } };
	int32_t id;

	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		assert_int_equal(kt_sample(ct_cpu, &pl.c, &bad[i], 1, &id), -22);
		assert_int_equal(kt_sample(ct_gpu, &pl.g, &bad[i], 1, &id), -22);
	}
	assert_int_equal(kt_sample(ct_gpu, &pl.g, bad, 2, &id), -22); /* rows != n */
	printf("  bad sampling requests refused with -EINVAL by both\n");
	ct_pair_free(&pl);
}

static void test_timing(void **state)
{
	const struct temp_case tc = { 151936, 0.8f, 0, true };
	double s;

	ct_seed(25);
	s = run_temperature(&tc, 16, 0);
	printf("  timing: cuda sample of 16 rows, V 151936, top_p (upload, kernel, ids back): "
	       "%.3f ms\n", s * 1e3);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_greedy),
		cmocka_unit_test(test_temperature),
		cmocka_unit_test(test_ties),
		cmocka_unit_test(test_many_rows),
		cmocka_unit_test(test_bad_rows),
		cmocka_unit_test(test_timing),
	};

	ct_require_device();
	return cmocka_run_group_tests(tests, ct_setup, ct_teardown);
}
