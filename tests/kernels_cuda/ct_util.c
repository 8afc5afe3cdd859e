/* Helpers of the cuda-against-cpu kernel tests (see ct_util.h). */
#include "ct_util.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "kernels/cuda/cuda.h"

struct kt_backend *ct_cpu, *ct_gpu;

static uint64_t rng_state;

void ct_require_device(void)
{
	if (!kt_cuda_available()) {
		printf("skip: no CUDA device\n");
		exit(77);
	}
}

static struct kt_config config(const char *backend)
{
	return (struct kt_config){ .backend = backend, .threads = 2, .device = 0,
				   .max_tokens = CT_MAX_TOKENS, .max_seqs = CT_MAX_SEQS,
				   .max_context = CT_MAX_CONTEXT, .max_heads = 64,
				   .max_head_dim = CT_MAX_HEAD_DIM };
}

int ct_setup(void **state)
{
	char err[ATLAS_ERRLEN];
	struct kt_config c = config("cpu");
	const char *dev = getenv("ATLAS_CUDA_DEVICE");

	if (kt_backend_open(&c, &ct_cpu, err, sizeof err)) {
		fprintf(stderr, "cpu backend: %s\n", err);
		return -1;
	}
	c = config("cuda");
	c.device = dev ? atoi(dev) : 0;
	if (kt_backend_open(&c, &ct_gpu, err, sizeof err)) {
		fprintf(stderr, "cuda backend: %s\n", err);
		return -1;
	}
	printf("comparing cuda [%s] against cpu [%s]\n", ct_gpu->info.name, ct_cpu->info.name);
	return 0;
}

int ct_teardown(void **state)
{
	kt_backend_close(ct_gpu);
	kt_backend_close(ct_cpu);
	ct_gpu = ct_cpu = NULL;
	return 0;
}

void ct_seed(uint64_t salt)
{
	const char *s = getenv("ATLAS_TEST_SEED");

	rng_state = (s ? strtoull(s, NULL, 0) : 0x5eed5eedULL) ^ (salt * 0x9e3779b97f4a7c15ULL);
}

uint64_t ct_next(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

double ct_uniform(double lo, double hi)
{
	return lo + (hi - lo) * (double)(ct_next() >> 11) * 0x1.0p-53;
}

int ct_randint(int n)
{
	return (int)(ct_next() % (uint64_t)n);
}

void ct_fill(float *x, size_t n, float mag)
{
	for (size_t i = 0; i < n; i++) {
		float v = (float)ct_uniform(mag / 100.0, mag);

		x[i] = ct_next() & 1 ? v : -v;
	}
}

void ct_shuffle(int32_t *a, int n)
{
	for (int i = n - 1; i > 0; i--) {
		int j = ct_randint(i + 1);
		int32_t t = a[i];

		a[i] = a[j];
		a[j] = t;
	}
}

uint16_t ct_bf16_bits(float f)
{
	uint32_t b;

	memcpy(&b, &f, sizeof b);
	if ((b & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((b >> 16) | 0x40);
	b += 0x7fffu + ((b >> 16) & 1);
	return (uint16_t)(b >> 16);
}

float ct_bf16_value(uint16_t h)
{
	uint32_t b = (uint32_t)h << 16;
	float f;

	memcpy(&f, &b, sizeof f);
	return f;
}

void ct_round_bf16(float *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		x[i] = ct_bf16_value(ct_bf16_bits(x[i]));
}

struct ct_pair ct_pair_new(enum kt_dtype dt, int64_t rows, int64_t cols, const void *host)
{
	struct ct_pair p;

	assert_int_equal(kt_alloc(ct_cpu, dt, rows, cols, &p.c), 0);
	assert_int_equal(kt_alloc(ct_gpu, dt, rows, cols, &p.g), 0);
	if (host)
		ct_pair_set(&p, host);
	return p;
}

struct ct_pair ct_pair_weight(enum kt_dtype src_dt, const void *src, int64_t rows, int64_t cols)
{
	struct ct_pair p;

	assert_int_equal(kt_weight(ct_cpu, src_dt, src, rows, cols, false, &p.c), 0);
	assert_int_equal(kt_weight(ct_gpu, src_dt, src, rows, cols, false, &p.g), 0);
	return p;
}

void ct_pair_free(struct ct_pair *p)
{
	kt_free(ct_cpu, &p->c);
	kt_free(ct_gpu, &p->g);
}

void ct_pair_set(const struct ct_pair *p, const void *host)
{
	assert_int_equal(kt_upload(ct_cpu, &p->c, 0, host, kt_nbytes(&p->c)), 0);
	assert_int_equal(kt_upload(ct_gpu, &p->g, 0, host, kt_nbytes(&p->g)), 0);
}

void ct_pair_get(const struct ct_pair *p, void *cpu_host, void *gpu_host)
{
	assert_int_equal(kt_download(ct_cpu, cpu_host, &p->c, 0, kt_nbytes(&p->c)), 0);
	assert_int_equal(kt_download(ct_gpu, gpu_host, &p->g, 0, kt_nbytes(&p->g)), 0);
}

void ct_compare(const char *what, const float *got, const float *ref, size_t n,
		double max_abs_tol, double nmse_tol)
{
	double max_abs = 0.0, se = 0.0, ss = 0.0, nmse;
	size_t bad = 0, worst = 0;

	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)got[i] - (double)ref[i]);

		if (isfinite(ref[i]) && !isfinite(got[i])) {
			bad++;
			continue;
		}
		if (d > max_abs) {
			max_abs = d;
			worst = i;
		}
		se += d * d;
		ss += (double)ref[i] * ref[i];
	}
	nmse = ss > 0.0 ? se / ss : se;
	printf("  %-44s max_abs %.3e (tol %.1e)  nmse %.3e (tol %.1e)%s\n", what, max_abs,
	       max_abs_tol, nmse, nmse_tol, bad ? "  NON-FINITE" : "");
	if (bad || max_abs > max_abs_tol || nmse > nmse_tol)
		fail_msg("%s: %zu non-finite, max_abs %.3e at %zu (cuda %.9g, cpu %.9g), nmse %.3e",
			 what, bad, max_abs, worst, n ? got[worst] : 0.0, n ? ref[worst] : 0.0,
			 nmse);
}

void ct_compare_exact(const char *what, const float *got, const float *ref, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (memcmp(&got[i], &ref[i], sizeof(float)))
			fail_msg("%s: element %zu: cuda %.9g, cpu %.9g", what, i, got[i], ref[i]);
	printf("  %-44s bitwise equal (%zu values)\n", what, n);
}
