/* kt_sample of the cpu backend against a naive sampler that sorts the whole
 * row: greedy and its ties, top-k, top-p, the inverse-CDF pick for given u,
 * the effect of temperature, and the refusal of bad rows. */
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

/* Sample rows of logits [n, V] on the backend. */
static void sample(struct kt_backend *be, const float *l, int n, int V,
		   const struct kt_sample_row *rows, int32_t *ids)
{
	struct kt_tensor t = tu_tensor(be, KT_F32, n, V, l);

	assert_int_equal(kt_sample(be, &t, rows, n, ids), 0);
	kt_free(be, &t);
}

static const float *sort_logits;

static int by_rank(const void *a, const void *b)
{
	int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;

	if (sort_logits[i] != sort_logits[j])
		return sort_logits[i] > sort_logits[j] ? -1 : 1;
	return i < j ? -1 : 1;
}

/* The naive sampler: sort everything, cumulate in double. *margin gets how
 * close (relative to the kept mass) a decision boundary came to the
 * threshold that decided it; a tiny margin means rounding may decide. */
static int32_t ref_sample(const float *l, int V, const struct kt_sample_row *r, double *margin)
{
	int32_t *order = malloc(sizeof(int32_t) * V), pick;
	double *cum = calloc(V + 1, sizeof(double)), lmax, need, target;
	int k, keep, i;

	*margin = 1.0;
	for (i = 0; i < V; i++)
		order[i] = i;
	sort_logits = l;
	qsort(order, V, sizeof(int32_t), by_rank);
	if (r->temperature == 0.0f) {
		pick = order[0];
		goto out;
	}
	lmax = l[order[0]];
	k = r->top_k > 0 && r->top_k < V ? r->top_k : V;
	cum[0] = 0.0;
	for (i = 0; i < k; i++)
		cum[i + 1] = cum[i] + exp(((double)l[order[i]] - lmax) / r->temperature);
	keep = k;
	if (r->top_p < 1.0f) {
		need = (double)r->top_p * cum[k];
		for (keep = 1; keep < k && cum[keep] < need; keep++)
			;
		*margin = fmin(fabs(cum[keep] - need), keep > 1 ? fabs(cum[keep - 1] - need) : 1.0) /
			  cum[k];
	}
	target = r->u * cum[keep];
	for (i = 1; i < keep && cum[i] <= target; i++)
		;
	pick = order[i - 1];
	*margin = fmin(*margin, fabs(cum[i] - target) / cum[keep]);
	if (i > 1) /* cum[0] = 0 is no boundary: every kept token has mass */
		*margin = fmin(*margin, fabs(cum[i - 1] - target) / cum[keep]);
out:
	free(order);
	free(cum);
	return pick;
}

static float gauss(void)
{
	double u1 = tu_uniform(1e-12, 1.0), u2 = tu_uniform(0.0, 1.0);

	return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

/* A random row: spread 0 gives a flat row; quant > 0 rounds to that step so
 * ties abound. */
static void make_row(float *l, int V, float spread, float quant)
{
	for (int i = 0; i < V; i++) {
		float v = spread * gauss();

		l[i] = quant > 0.0f ? quant * roundf(v / quant) : v;
	}
}

static void test_greedy_ties(void **state)
{
	struct kt_backend *be = *state;
	enum { V = 300 };
	float l[2 * V];
	struct kt_sample_row rows[2] = {
		{ .temperature = 0.0f, .top_p = 0.01f, .top_k = 3, .u = 0.9f },
		{ .temperature = 0.0f, .top_p = 1.0f, .top_k = 0, .u = 0.0f },
	};
	int32_t ids[2];

	tu_seed(31);
	make_row(l, 2 * V, 1.0f, 0.0f);
	l[5] = l[9] = l[200] = 7.0f;
	l[V + 0] = NAN;
	l[V + 17] = l[V + 18] = 9.0f;
	sample(be, l, 2, V, rows, ids);
	assert_int_equal(ids[0], 5);
	assert_int_equal(ids[1], 17);
}

/* top_k = 1 and a tiny top_p both leave only the argmax, at any u and
 * temperature. */
static void test_topk1_and_tiny_topp_are_greedy(void **state)
{
	struct kt_backend *be = *state;
	enum { N = 40, V = 1000 };
	float *l = malloc(sizeof(float) * N * V);
	struct kt_sample_row rows[N];
	int32_t ids[N];
	double margin;

	tu_seed(32);
	for (int i = 0; i < N; i++) {
		make_row(l + i * V, V, 2.0f, i % 2 ? 0.5f : 0.0f);
		rows[i] = (struct kt_sample_row){
			.temperature = (float)tu_uniform(0.1, 3.0),
			.top_p = i % 4 < 2 ? 1.0f : 1e-6f,
			.top_k = i % 4 < 2 ? 1 : 0,
			.u = (float)tu_uniform(0.0, 0.999),
		};
	}
	sample(be, l, N, V, rows, ids);
	for (int i = 0; i < N; i++) {
		struct kt_sample_row greedy = { 0 };

		assert_int_equal(ids[i], ref_sample(l + i * V, V, &greedy, &margin));
	}
	free(l);
}

struct sweep {
	int V, rows;
	float spread, quant;
};

/* Random rows, settings and u against the naive sampler. Rows are long
 * enough to need several chunks (V > 4096, flat rows, top_k around 4096),
 * and quantized rows put long runs of ties across chunk edges. Rows whose
 * decision lies within 1e-6 of the kept mass from a boundary are not
 * compared (the reference sums in another order): u = 0.99999 over a long
 * tail and top_p boundaries of flat rows are such cases. */
static void test_matches_naive_sampler(void **state)
{
	struct kt_backend *be = *state;
	static const struct sweep sweeps[] = {
		{ 1, 4, 1.0f, 0.0f },      { 7, 60, 1.0f, 0.0f },     { 1000, 200, 2.0f, 0.0f },
		{ 1000, 100, 2.0f, 0.25f }, { 5000, 60, 1.5f, 0.0f },   { 12000, 12, 0.0f, 0.0f },
		{ 9000, 16, 0.3f, 0.25f },  { 151936, 4, 3.0f, 0.0f },
	};
	static const int top_ks[] = { 0, 0, 1, 2, 5, 50, 4095, 4096, 4097, 6000, 1 << 30 };
	static const float top_ps[] = { 1.0f, 1.0f, 0.95f, 0.8f, 0.5f, 0.1f, 0.0f };
	static const float temps[] = { 0.3f, 0.7f, 1.0f, 1.6f };
	int checked = 0, ambiguous = 0;

	tu_seed(33);
	for (size_t s = 0; s < sizeof sweeps / sizeof sweeps[0]; s++) {
		const struct sweep *sw = &sweeps[s];
		float *l = malloc(sizeof(float) * (size_t)sw->rows * sw->V);
		struct kt_sample_row *rows = malloc(sizeof(*rows) * sw->rows);
		int32_t *ids = malloc(sizeof(int32_t) * sw->rows), *again = malloc(sizeof(int32_t) * sw->rows);

		for (int i = 0; i < sw->rows; i++) {
			make_row(l + (size_t)i * sw->V, sw->V, sw->spread, sw->quant);
			rows[i] = (struct kt_sample_row){
				.temperature = temps[tu_randint(4)],
				.top_p = top_ps[tu_randint(7)],
				.top_k = top_ks[tu_randint(11)],
				.u = i % 10 == 0 ? 0.0f : i % 10 == 1 ? 0.99999f : (float)tu_uniform(0, 1),
			};
		}
		sample(be, l, sw->rows, sw->V, rows, ids);
		sample(be, l, sw->rows, sw->V, rows, again);
		assert_memory_equal(ids, again, sizeof(int32_t) * sw->rows);
		for (int i = 0; i < sw->rows; i++) {
			double margin;
			int32_t want = ref_sample(l + (size_t)i * sw->V, sw->V, &rows[i], &margin);

			if (margin < 1e-6) {
				ambiguous++;
				continue;
			}
			checked++;
			if (ids[i] != want)
				fail_msg("V=%d row %d (T=%g top_k=%d top_p=%g u=%.9g): got %d want %d",
					 sw->V, i, rows[i].temperature, rows[i].top_k, rows[i].top_p,
					 rows[i].u, ids[i], want);
		}
		free(l);
		free(rows);
		free(ids);
		free(again);
	}
	print_message("  sample vs naive sorted-CDF sampler: %d rows agree, %d too close to call\n",
		      checked, ambiguous);
	assert_true(ambiguous * 10 < checked);
}

/* Rows of equal logits have masses of exactly 1 per token, so the
 * boundaries of the definition are hit exactly: the pick is the first token
 * whose running mass exceeds u * kept (strictly), and top-p keeps the first
 * tokens whose mass reaches top_p * total (>=). */
static void test_exact_boundaries(void **state)
{
	struct kt_backend *be = *state;
	enum { V = 4 };
	static const struct {
		float top_p, u;
		int top_k, want;
	} cases[] = {
		{ 1.0f, 0.0f, 0, 0 },   { 1.0f, 0.25f, 0, 1 },  { 1.0f, 0.5f, 0, 2 },
		{ 1.0f, 0.75f, 0, 3 },  { 1.0f, 0.999f, 0, 3 }, { 0.5f, 0.5f, 0, 1 },
		{ 0.5f, 0.7f, 0, 1 },   { 0.75f, 0.99f, 0, 2 }, { 0.76f, 0.76f, 0, 3 },
		{ 1.0f, 0.5f, 2, 1 },   { 1.0f, 0.49f, 2, 0 },  { 0.5f, 0.99f, 3, 1 },
		{ 0.0f, 0.99f, 0, 0 },
	};
	enum { N = sizeof cases / sizeof cases[0] };
	float l[N * V];
	struct kt_sample_row rows[N];
	int32_t ids[N];

	for (int i = 0; i < N * V; i++)
		l[i] = 0.5f;
	for (int i = 0; i < N; i++)
		rows[i] = (struct kt_sample_row){ .temperature = 0.8f, .top_p = cases[i].top_p,
						  .top_k = cases[i].top_k, .u = cases[i].u };
	sample(be, l, N, V, rows, ids);
	for (int i = 0; i < N; i++)
		if (ids[i] != cases[i].want)
			fail_msg("flat row, top_p %g top_k %d u %g: got %d want %d", cases[i].top_p,
				 cases[i].top_k, cases[i].u, ids[i], cases[i].want);
}

/* Over a fine grid of u the picks reproduce softmax(l / T) for several T. */
static void test_temperature_shapes_distribution(void **state)
{
	struct kt_backend *be = *state;
	enum { V = 4, N = 4000 };
	const float base[V] = { 1.0f, 0.5f, 0.0f, -1.0f }, temps[] = { 0.25f, 1.0f, 4.0f };
	float *l = malloc(sizeof(float) * N * V);
	struct kt_sample_row *rows = malloc(sizeof(*rows) * N);
	int32_t *ids = malloc(sizeof(int32_t) * N);

	for (int i = 0; i < N; i++)
		memcpy(l + i * V, base, sizeof base);
	for (size_t k = 0; k < sizeof temps / sizeof temps[0]; k++) {
		double z = 0.0, want[V];
		int count[V] = { 0 };

		for (int v = 0; v < V; v++)
			z += want[v] = exp(base[v] / temps[k]);
		for (int i = 0; i < N; i++)
			rows[i] = (struct kt_sample_row){ .temperature = temps[k], .top_p = 1.0f,
							  .u = (float)((i + 0.5) / N) };
		sample(be, l, N, V, rows, ids);
		for (int i = 0; i < N; i++)
			count[ids[i]]++;
		for (int v = 0; v < V; v++)
			assert_true(fabs((double)count[v] / N - want[v] / z) <= 1.0 / N);
		/* Rank order: ids never decrease as u grows. */
		for (int i = 1; i < N; i++)
			assert_true(ids[i] >= ids[i - 1]);
	}
	free(l);
	free(rows);
	free(ids);
}

static void test_refuses_bad_rows(void **state)
{
	struct kt_backend *be = *state;
	float l[2 * 8] = { 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8 };
	const struct kt_sample_row good = { .temperature = 1.0f, .top_p = 1.0f, .u = 0.5f };
	struct kt_sample_row bad[] = { good, good, good, good, good, good };
	struct kt_tensor t = tu_tensor(be, KT_F32, 2, 8, l);
	int32_t ids[2] = { -7, -7 };

	bad[0].temperature = -1.0f;
	bad[1].temperature = NAN;
	bad[2].top_p = 1.5f;
	bad[3].top_k = -1;
	bad[4].u = 1.0f;
	bad[5].u = -0.1f;
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		struct kt_sample_row pair[2] = { good, bad[i] };

		assert_int_equal(kt_sample(be, &t, pair, 2, ids), -EINVAL);
	}
	assert_int_equal(kt_sample(be, &t, bad, 1, ids), -EINVAL); /* n != rows */
	assert_int_equal(ids[0], -7);
	assert_int_equal(ids[1], -7);
	kt_free(be, &t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_greedy_ties),
		cmocka_unit_test(test_topk1_and_tiny_topp_are_greedy),
		cmocka_unit_test(test_matches_naive_sampler),
		cmocka_unit_test(test_exact_boundaries),
		cmocka_unit_test(test_temperature_shapes_distribution),
		cmocka_unit_test(test_refuses_bad_rows),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
