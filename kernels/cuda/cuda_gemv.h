/* The small-batch matmul of the cuda backend (cuda_gemv.cu): y = x · wᵀ
 * (+ bias) for bf16 weights and at most CUDA_GEMV_MAX_T rows of x.
 *
 * The constant is plain C so that the gpu tests can see which batch sizes
 * take this path; the functions are for the backend's .cu files only.
 */
#ifndef ATLAS_KERNELS_CUDA_GEMV_H
#define ATLAS_KERNELS_CUDA_GEMV_H

/* Most rows of x that take the GEMV; more go to cuBLAS. Measured on an H100
 * (dev/cuda/README.md), the GEMV against cuBLAS (whose bf16 conversion of x
 * is a second launch): on the Qwen3-0.6B shapes 2-75% faster at every T up
 * to 16; on the Qwen3-8B shapes -14%..+11%, over a whole 8B layer about 2%
 * slower at T = 1 and 7% at T = 8 and 16. 16 is the most the kernel takes
 * (one mma token tile), and the larger the bound, the more batch sizes get
 * a row's result bit for bit the same as alone. */
#define CUDA_GEMV_MAX_T 16

#ifdef __cplusplus
extern "C" {
#include "kernels/backend.h"
}

struct cuda_backend;

/* The GEMV takes this product: bf16 w, 1..CUDA_GEMV_MAX_T rows, K a
 * multiple of 8 and x, w 16-byte aligned (16-byte loads). */
bool cuda_gemv_takes(const struct kt_tensor *x, const struct kt_tensor *w);
/* Whether a product of x that the GEMV takes (x not normed) runs on the
 * bulk GEMV (cuda_gemv_bulk.cuh: Hopper, at most 8 rows of x). */
bool cuda_gemv_on_bulk(const struct cuda_backend *cu, const struct kt_tensor *x);
/* Enqueue y = x · wᵀ (+ bias) on cu->stream; arguments checked by the caller. */
int cuda_gemv(struct cuda_backend *cu, const struct kt_tensor *y, const struct kt_tensor *x,
	      const struct kt_tensor *w, const struct kt_tensor *bias);
/* The GEMV takes the products of one x (matmul_n) in one launch: it takes
 * each weight, and the biases are of one dtype (or none). */
bool cuda_gemv_n_takes(int n, const struct kt_tensor *x, const struct kt_tensor *const *ws,
		       const struct kt_tensor *const *biases);
/* Enqueue ys[i] = x · ws[i]ᵀ (+ biases[i]) for i < n as one launch; arguments
 * checked by the caller. */
int cuda_gemv_n(struct cuda_backend *cu, int n, const struct kt_tensor *const *ys,
		const struct kt_tensor *x, const struct kt_tensor *const *ws,
		const struct kt_tensor *const *biases);
/* Enqueue act = silu(x · w[:I]ᵀ) * (x · w[I:]ᵀ) for a stacked w [2I, K] the
 * GEMV takes, act f32 or bf16; arguments checked by the caller. */
int cuda_gemv_swiglu(struct cuda_backend *cu, const struct kt_tensor *act,
		     const struct kt_tensor *x, const struct kt_tensor *w);
#endif

#endif
