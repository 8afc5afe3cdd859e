/* Helpers of the kernel tests: a backend to test, random inputs, poisoned
 * outputs and error reports against double-precision references. */
#ifndef ATLAS_TESTS_KT_TESTUTIL_H
#define ATLAS_TESTS_KT_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"

/* Limits every test backend is opened with. */
#define TU_MAX_CONTEXT 4096
#define TU_MAX_HEAD_DIM 256

/* Open the cpu backend with `threads` workers (0 = all cores); fails the test
 * on error. */
struct kt_backend *tu_open(int threads);

/* Deterministic random numbers: seeded from ATLAS_TEST_SEED or a fixed value. */
void tu_seed(uint64_t salt);
uint64_t tu_next(void);
double tu_uniform(double lo, double hi);
int tu_randint(int n); /* 0..n-1 */
/* Values in [-mag, -mag/100] ∪ [mag/100, mag]: random, never zero. */
void tu_fill(float *x, size_t n, float mag);
void tu_shuffle(int32_t *a, int n);

/* A backend tensor holding `host` (rows × cols of dtype); NULL host leaves it
 * filled with NaN (f32) or 0x7fff.. (others) so unwritten elements show. */
struct kt_tensor tu_tensor(struct kt_backend *be, enum kt_dtype dtype, int64_t rows,
			   int64_t cols, const void *host);
/* Download the whole tensor into host (kt_nbytes(t) bytes). */
void tu_get(struct kt_backend *be, const struct kt_tensor *t, void *host);

/* Check got[i] against ref[i]: |got - ref| <= tol * scale[i] (scale NULL:
 * |ref|, at least 1e-30). Prints max abs and max scaled error under `what`
 * and fails the test on any miss or non-finite value. */
void tu_check(const char *what, const float *got, const double *ref, const double *scale,
	      size_t n, double tol);

#endif
