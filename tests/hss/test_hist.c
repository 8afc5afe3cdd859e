/* The latency histogram (engine/hss/hist.h): counts add up, percentiles are
 * ordered, within an eighth above the truth and never above the largest
 * value, small values exact, the extremes of uint64_t without overflow. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "engine/hss/hist.h"

static struct lat_hist h;

static uint64_t sum_counts(void)
{
	uint64_t n = 0;
	for (int b = 0; b < HIST_BUCKETS; b++)
		n += h.counts[b];
	return n;
}

static void test_empty_and_small(void **state)
{
	memset(&h, 0, sizeof h);
	assert_int_equal(hist_quantile(&h, 0.5), 0);
	for (uint64_t v = 0; v < 8; v++)
		hist_add(&h, v);
	/* One bucket per value below 8: exact. */
	assert_int_equal(hist_quantile(&h, 0.0), 0);
	assert_int_equal(hist_quantile(&h, 0.5), 3);
	assert_int_equal(hist_quantile(&h, 1.0), 7);
	assert_int_equal(sum_counts(), 8);
}

static void test_uniform(void **state)
{
	memset(&h, 0, sizeof h);
	enum { N = 100000 };
	for (uint64_t v = 1; v <= N; v++)
		hist_add(&h, v * 1000);
	assert_int_equal(h.n, N);
	assert_int_equal(sum_counts(), N);
	assert_int_equal(h.max, (uint64_t)N * 1000);
	uint64_t prev = 0;
	for (int i = 0; i <= 100; i++) {
		double q = i / 100.0;
		uint64_t got = hist_quantile(&h, q), truth = (uint64_t)(q * N + 0.5) * 1000;
		if (truth < 1000)
			truth = 1000;
		assert_true(got >= prev);
		assert_true(got >= truth);
		assert_true(got <= truth + truth / 8);
		assert_true(got <= h.max);
		prev = got;
	}
	assert_int_equal(hist_quantile(&h, 1.0), h.max);
}

static void test_extremes(void **state)
{
	memset(&h, 0, sizeof h);
	hist_add(&h, UINT64_MAX);
	hist_add(&h, (1ull << 63) + 1);
	hist_add(&h, 1ull << 40);
	assert_int_equal(sum_counts(), 3);
	assert_int_equal(hist_quantile(&h, 1.0), UINT64_MAX);
	uint64_t p50 = hist_quantile(&h, 0.5);
	assert_true(p50 >= (1ull << 63) + 1 && p50 <= (1ull << 63) + (1ull << 60));
	uint64_t p0 = hist_quantile(&h, 0.0);
	assert_true(p0 >= 1ull << 40 && p0 < (1ull << 40) + (1ull << 37));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_empty_and_small),
		cmocka_unit_test(test_uniform),
		cmocka_unit_test(test_extremes),
	};
	return cmocka_run_group_tests_name("hss_hist", tests, NULL, NULL);
}
