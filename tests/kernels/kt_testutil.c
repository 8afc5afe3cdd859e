/* Helpers of the kernel tests (see kt_testutil.h). */
#include "kt_testutil.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/cpu/cpu.h"

static uint64_t rng_state;

struct kt_backend *tu_open(int threads)
{
	struct kt_config c = {
		.backend = "cpu", .threads = threads, .max_tokens = 1024, .max_seqs = 16,
		.max_context = TU_MAX_CONTEXT, .max_heads = 64, .max_head_dim = TU_MAX_HEAD_DIM,
	};
	struct kt_backend *be = NULL;
	char err[256] = "";
	int rc = kt_cpu_open(&c, &be, err, sizeof err);

	if (rc)
		fail_msg("kt_cpu_open: %s (%d)", err, rc);
	return be;
}

void tu_seed(uint64_t salt)
{
	const char *env = getenv("ATLAS_TEST_SEED");

	rng_state = (env ? strtoull(env, NULL, 0) : 0x5eed1234abcdULL) ^ (salt * 0x9e3779b97f4a7c15ULL);
}

/* splitmix64 */
uint64_t tu_next(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

double tu_uniform(double lo, double hi)
{
	return lo + (hi - lo) * (double)(tu_next() >> 11) * 0x1p-53;
}

int tu_randint(int n)
{
	return (int)(tu_next() % (uint64_t)n);
}

void tu_fill(float *x, size_t n, float mag)
{
	for (size_t i = 0; i < n; i++) {
		double v = tu_uniform(mag / 100.0, mag);

		x[i] = (float)(tu_next() & 1 ? v : -v);
	}
}

void tu_shuffle(int32_t *a, int n)
{
	for (int i = n - 1; i > 0; i--) {
		int j = tu_randint(i + 1);
		int32_t t = a[i];

		a[i] = a[j];
		a[j] = t;
	}
}

struct kt_tensor tu_tensor(struct kt_backend *be, enum kt_dtype dtype, int64_t rows,
			   int64_t cols, const void *host)
{
	struct kt_tensor t;
	size_t n;
	void *buf = NULL;

	assert_int_equal(kt_alloc(be, dtype, rows, cols, &t), 0);
	n = kt_nbytes(&t);
	if (!host) {
		buf = malloc(n ? n : 1);
		assert_non_null(buf);
		if (dtype == KT_F32) {
			for (size_t i = 0; i < n / sizeof(float); i++)
				((float *)buf)[i] = NAN;
		} else {
			memset(buf, 0x7f, n);
		}
		host = buf;
	}
	assert_int_equal(kt_upload(be, &t, 0, host, n), 0);
	free(buf);
	return t;
}

void tu_get(struct kt_backend *be, const struct kt_tensor *t, void *host)
{
	assert_int_equal(kt_download(be, host, t, 0, kt_nbytes(t)), 0);
}

void tu_check(const char *what, const float *got, const double *ref, const double *scale,
	      size_t n, double tol)
{
	double max_abs = 0.0, max_rel = 0.0;
	size_t worst = 0, bad = 0;

	for (size_t i = 0; i < n; i++) {
		double s = scale ? scale[i] : fabs(ref[i]);
		double e = fabs((double)got[i] - ref[i]);
		double r = e / (s > 1e-30 ? s : 1e-30);

		if (!isfinite(got[i]) || !(r <= tol))
			bad++;
		if (!isfinite(got[i]))
			r = INFINITY;
		if (e > max_abs)
			max_abs = e;
		if (r > max_rel || (!isfinite(r) && isfinite(max_rel))) {
			max_rel = r;
			worst = i;
		}
	}
	print_message("  %-44s n=%-8zu max abs %.3g  max rel %.3g\n", what, n, max_abs, max_rel);
	if (bad)
		fail_msg("%s: %zu of %zu elements off (worst [%zu]: got %.9g want %.9g, tol %.3g)",
			 what, bad, n, worst, (double)got[worst], ref[worst], tol);
}
