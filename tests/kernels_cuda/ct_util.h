/* Helpers of the cuda-against-cpu kernel tests: both backends opened with the
 * same limits, tensor pairs with identical contents, random inputs, bf16
 * rounding as the device does it, and error reports that print what they
 * measured. */
#ifndef ATLAS_TESTS_KERNELS_CUDA_CT_UTIL_H
#define ATLAS_TESTS_KERNELS_CUDA_CT_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"

/* Limits both backends are opened with. */
#define CT_MAX_TOKENS 256
#define CT_MAX_SEQS 8
#define CT_MAX_CONTEXT 4096
#define CT_MAX_HEAD_DIM 256

/* The backends under comparison, opened by ct_setup (a cmocka group setup). */
extern struct kt_backend *ct_cpu, *ct_gpu;

/* Exits 77 after printing "skip: no CUDA device" when there is none. */
void ct_require_device(void);
int ct_setup(void **state);
int ct_teardown(void **state);

/* Deterministic random numbers, seeded from ATLAS_TEST_SEED or a fixed value. */
void ct_seed(uint64_t salt);
uint64_t ct_next(void);
double ct_uniform(double lo, double hi);
int ct_randint(int n); /* 0..n-1 */
/* Values in [-mag, -mag/100] ∪ [mag/100, mag]: random, never zero. */
void ct_fill(float *x, size_t n, float mag);
void ct_shuffle(int32_t *a, int n);

/* bf16 as the device rounds (nearest even, NaN kept quiet). */
uint16_t ct_bf16_bits(float f);
float ct_bf16_value(uint16_t h);
void ct_round_bf16(float *x, size_t n);

/* One tensor on each backend. */
struct ct_pair {
	struct kt_tensor c, g; /* cpu, cuda */
};

/* Allocate rows × cols of dt on both and upload host (NULL: contents unset). */
struct ct_pair ct_pair_new(enum kt_dtype dt, int64_t rows, int64_t cols, const void *host);
/* kt_weight() on both from the same source. */
struct ct_pair ct_pair_weight(enum kt_dtype src_dt, const void *src, int64_t rows, int64_t cols);
void ct_pair_free(struct ct_pair *p);
/* Upload host over the whole tensor on both backends. */
void ct_pair_set(const struct ct_pair *p, const void *host);
/* Download both (kt_nbytes bytes each). */
void ct_pair_get(const struct ct_pair *p, void *cpu_host, void *gpu_host);

/* Errors of got (cuda) against ref (cpu): max |got - ref| and NMSE =
 * Σ(got - ref)² / Σ ref². Prints both with the tolerances and fails the test
 * when either is above its tolerance or got is not finite where ref is. */
void ct_compare(const char *what, const float *got, const float *ref, size_t n,
		double max_abs_tol, double nmse_tol);
/* Bitwise equality of n floats (NaN compares by bits too). */
void ct_compare_exact(const char *what, const float *got, const float *ref, size_t n);

#endif
