/* y = x · wᵀ (+ bias): the GEMV for small batches, cuBLAS otherwise.
 *
 * bf16 weights with at most CUDA_GEMV_MAX_T rows of x (decode) go to the
 * tensor-core GEMV of cuda_gemv.cu, which reads w once (70-100% of the copy
 * bandwidth on large weights), rounds x to bf16 in registers and adds the
 * bias itself: one launch. Everything else (more rows, K not a multiple of
 * 8, f32 weights) takes cuBLAS as below. Both compute bf16(x) · w with f32
 * accumulation; they differ only in summation order, so a row's result may
 * change in its last bits where a batch crosses CUDA_GEMV_MAX_T rows.
 *
 * Layout: x [T, K] f32, w [N, K] (the Hugging Face Linear layout), y [T, N]
 * f32, bias [1, N] f32 or bf16. Row-major y = x · wᵀ is column-major
 * yᵀ = w^T(col) · xᵀ(col): cublasGemmEx(OP_T, OP_N, m = N, n = T, k = K,
 * A = w (lda K), B = x (ldb K), C = y (ldc N)).
 *
 * bf16 weights (what kt_weight stores): x is first rounded to bf16 (nearest
 * even) into the backend's workspace cu->xbf16 [max_tokens, xbf16_cols], then
 * a bf16 × bf16 product accumulates in f32 (CUBLAS_COMPUTE_32F) into f32 y.
 * The workspace is sized for the largest K of the weights loaded, so a model
 * runs in one product per call; more than max_tokens rows run in row chunks,
 * and a K larger than the workspace (a bf16 tensor not made by kt_weight) in
 * K chunks accumulated with beta = 1. f32 weights (kt_alloc'd) go straight to
 * an f32 product, no conversion. A bf16 x (rmsnorm or swiglu wrote it
 * rounded: matmul_x_bf16) skips the conversion: one product of all its
 * rows, the same bits as the f32 x it was rounded from.
 *
 * matmul_n (the products of one x): one GEMV launch when the GEMV takes
 * every weight, else the products one after another.
 *
 * The GEMV paths call cu_keep_norm() only: a norm that rmsnorm_product left
 * pending for this x is theirs to take (cuda_gemv.cu); every other path
 * launches it first (cu_enter).
 *
 * matmul_swiglu (a stacked gate/up product and its SwiGLU): the GEMV with
 * the SwiGLU in its epilogue when the GEMV takes w (decode sizes) and either
 * runs the bulk GEMV (any I) or I is at most CUDA_SWIGLU_FUSE_MAX_I, else
 * the product into gu and swiglu of its halves.
 *
 * Launch: to_bf16_kernel and bias_kernel are grid-stride loops over the
 * elements; the product is cuBLAS's choice, on the backend's stream with the
 * workspace given at open (cuBLAS allocates nothing here).
 */
#include <errno.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_gemv.h"
#include "kernels/cuda/cuda_impl.h"
#include "kernels/cuda/cuda_pdl.cuh"

/* The widest MLP (I) whose matmul_swiglu runs the fused gemv_kernel.
 * Measured on an H100 (docs/perf.md, 2026-11-27), fused against the
 * stacked product and swiglu apart: Qwen3-0.6B (I = 3072) +3 to +5 %
 * tokens/s at batch 1, where the launch it saves is a large share of a
 * small layer; Qwen3-8B (I = 12288) -3 % at batch 8 and 16, its gate and
 * up rows read from two places a block instead of one, and no gain at
 * batch 1. The bulk GEMV (up to 8 rows on Hopper) fuses any I: it reads a
 * tile's rows by bulk copies wherever they are, and Qwen3-8B gained 2.4 %
 * at batch 1 and 2.2 % at batch 8 (an H100, 2026-11-28). */
#define CUDA_SWIGLU_FUSE_MAX_I 4096

/* ws[r, k] = bf16(x[r, k0 + k])   ws [rows, kl] packed, x [rows, K] */
__global__ void to_bf16_kernel(__nv_bfloat16 *ws, const float *x, int64_t rows, int64_t K,
			       int64_t k0, int64_t kl)
{
	const int64_t n = rows * kl;

	pdl_wait();
	pdl_launch_dependents();
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x) {
		const int64_t r = i / kl, k = i % kl;

		ws[i] = __float2bfloat16_rn(x[r * K + k0 + k]);
	}
}

/* y[t, j] += bias[j]   y [T, N] */
template <typename B>
__global__ void bias_kernel(float *y, const B *bias, int64_t T, int64_t N)
{
	pdl_wait();
	pdl_launch_dependents();
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < T * N;
	     i += (int64_t)gridDim.x * blockDim.x)
		y[i] += widen(bias[i % N]);
}

static int gemm_f32(struct cuda_backend *cu, float *y, const float *x, const float *w, int T,
		    int N, int K)
{
	const float one = 1.0f, zero = 0.0f;

	BLAS_CHECK(cublasGemmEx(cu->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &one, w, CUDA_R_32F,
				K, x, CUDA_R_32F, K, &zero, y, CUDA_R_32F, N, CUBLAS_COMPUTE_32F,
				CUBLAS_GEMM_DEFAULT));
	return 0;
}

/* Rows [r0, r0 + rows) of y from x rounded to bf16, K in chunks of the
 * workspace width. */
static int gemm_bf16_rows(struct cuda_backend *cu, float *y, const float *x,
			  const __nv_bfloat16 *w, int64_t rows, int N, int64_t K)
{
	const float one = 1.0f, zero = 0.0f;

	for (int64_t k0 = 0; k0 < K; k0 += cu->xbf16_cols) {
		const int64_t kl = K - k0 < cu->xbf16_cols ? K - k0 : cu->xbf16_cols;

		cu_launch(cu->pdl, to_bf16_kernel, cu_blocks(rows * kl), CUDA_THREADS, 0,
			  cu->stream, cu->xbf16, x, rows, K, k0, kl);
		CU_LAUNCHED();
		BLAS_CHECK(cublasGemmEx(cu->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, (int)rows, (int)kl,
					&one, w + k0, CUDA_R_16BF, (int)K, cu->xbf16, CUDA_R_16BF,
					(int)kl, k0 ? &one : &zero, y, CUDA_R_32F, N,
					CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
	}
	return 0;
}

/* y = x · wᵀ for a bf16 x [T, K]: straight to the product. */
static int gemm_bf16_x(struct cuda_backend *cu, float *y, const __nv_bfloat16 *x,
		       const __nv_bfloat16 *w, int T, int N, int K)
{
	const float one = 1.0f, zero = 0.0f;

	BLAS_CHECK(cublasGemmEx(cu->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &one, w, CUDA_R_16BF,
				K, x, CUDA_R_16BF, K, &zero, y, CUDA_R_32F, N, CUBLAS_COMPUTE_32F,
				CUBLAS_GEMM_DEFAULT));
	return 0;
}

static int add_bias(struct cuda_backend *cu, const struct kt_tensor *y,
		    const struct kt_tensor *bias)
{
	const int64_t T = y->rows, N = y->cols;

	if (bias->dtype == KT_BF16)
		cu_launch(cu->pdl, bias_kernel<__nv_bfloat16>, cu_blocks(T * N), CUDA_THREADS, 0,
			  cu->stream, (float *)y->data, (const __nv_bfloat16 *)bias->data, T, N);
	else
		cu_launch(cu->pdl, bias_kernel<float>, cu_blocks(T * N), CUDA_THREADS, 0,
			  cu->stream, (float *)y->data, (const float *)bias->data, T, N);
	CU_LAUNCHED();
	return 0;
}

static bool matmul_args_ok(const struct kt_tensor *y, const struct kt_tensor *x,
			   const struct kt_tensor *w, const struct kt_tensor *bias)
{
	if (!cu_float(w) || w->cols != x->cols)
		return false;
	if (!cu_valid(x, KT_F32) && !(cu_valid(x, KT_BF16) && w->dtype == KT_BF16))
		return false;
	if (!cu_shape(y, KT_F32, x->rows, w->rows))
		return false;
	if (bias && (!cu_float(bias) || bias->rows != 1 || bias->cols != w->rows ||
		     cu_overlap(y, bias)))
		return false;
	if (x->rows > INT32_MAX || x->cols > INT32_MAX || w->rows > INT32_MAX)
		return false;
	return !cu_overlap(y, x) && !cu_overlap(y, w);
}

/* After a product's call: cu->after_product set when it launched, cleared
 * when it failed, and left as it was when it had nothing to do (the op
 * before it is still the last). */
static void product_done(struct cuda_backend *cu, int rc, bool launched)
{
	if (rc)
		cu->after_product = false;
	else if (launched)
		cu->after_product = true;
}

static int matmul_run(struct kt_backend *be, const struct kt_tensor *y, const struct kt_tensor *x,
		      const struct kt_tensor *w, const struct kt_tensor *bias)
{
	struct cuda_backend *cu = cu_of(be);
	int64_t T, K, N;
	int rc = 0;

	if (!matmul_args_ok(y, x, w, bias))
		return -EINVAL;
	T = x->rows;
	K = x->cols;
	N = w->rows;
	if (!T || !N)
		return 0;
	CU_CHECK(cu_keep_norm(cu));
	if (K && cuda_gemv_takes(x, w))
		return cuda_gemv(cu, y, x, w, bias);
	CU_CHECK(cu_enter(cu));
	if (!K)
		CU_CHECK(cudaMemsetAsync(y->data, 0, kt_nbytes(y), cu->stream));
	else if (x->dtype == KT_BF16)
		rc = gemm_bf16_x(cu, (float *)y->data, (const __nv_bfloat16 *)x->data,
				 (const __nv_bfloat16 *)w->data, (int)T, (int)N, (int)K);
	else if (w->dtype == KT_F32)
		rc = gemm_f32(cu, (float *)y->data, (const float *)x->data,
			      (const float *)w->data, (int)T, (int)N, (int)K);
	else
		for (int64_t r0 = 0; r0 < T && !rc; r0 += cu->max_tokens) {
			const int64_t rows = T - r0 < cu->max_tokens ? T - r0 : cu->max_tokens;

			rc = gemm_bf16_rows(cu, (float *)y->data + r0 * N,
					    (const float *)x->data + r0 * K,
					    (const __nv_bfloat16 *)w->data, rows, (int)N, K);
		}
	if (rc || !bias)
		return rc;
	return add_bias(cu, y, bias);
}

int cuda_matmul(struct kt_backend *be, const struct kt_tensor *y, const struct kt_tensor *x,
		const struct kt_tensor *w, const struct kt_tensor *bias)
{
	int rc = matmul_run(be, y, x, w, bias);

	product_done(cu_of(be), rc, x->rows > 0 && w->rows > 0);
	return rc;
}

static int matmul_n_run(struct kt_backend *be, int n, const struct kt_tensor *const *ys,
			const struct kt_tensor *x, const struct kt_tensor *const *ws,
			const struct kt_tensor *const *biases)
{
	struct cuda_backend *cu = cu_of(be);

	if (n < 1 || n > KT_MATMUL_MAX_N || !ys || !ws)
		return -EINVAL;
	for (int i = 0; i < n; i++)
		if (!ys[i] || !ws[i] || !matmul_args_ok(ys[i], x, ws[i], biases ? biases[i] : NULL))
			return -EINVAL;
	if (x->rows && x->cols && cuda_gemv_n_takes(n, x, ws, biases)) {
		CU_CHECK(cu_keep_norm(cu));
		return cuda_gemv_n(cu, n, ys, x, ws, biases);
	}
	/* every product below reads x: a pending norm is written out first */
	CU_CHECK(cu_enter(cu));
	for (int i = 0; i < n; i++) {
		int rc = cuda_matmul(be, ys[i], x, ws[i], biases ? biases[i] : NULL);

		if (rc)
			return rc;
	}
	return 0;
}

int cuda_matmul_n(struct kt_backend *be, int n, const struct kt_tensor *const *ys,
		  const struct kt_tensor *x, const struct kt_tensor *const *ws,
		  const struct kt_tensor *const *biases)
{
	int rc = matmul_n_run(be, n, ys, x, ws, biases);
	bool launched = false;

	for (int i = 0; !rc && i < n; i++)
		launched = launched || (x->rows > 0 && ws[i]->rows > 0);
	product_done(cu_of(be), rc, launched);
	return rc;
}

static int matmul_swiglu_run(struct kt_backend *be, const struct kt_tensor *act,
			     const struct kt_tensor *gu, const struct kt_tensor *x,
			     const struct kt_tensor *w)
{
	struct cuda_backend *cu = cu_of(be);
	int rc;

	if (!matmul_args_ok(gu, x, w, NULL) || !act ||
	    (act->dtype != KT_F32 && act->dtype != KT_BF16) ||
	    !cu_shape(act, act->dtype, x->rows, w->rows / 2) || w->rows % 2)
		return -EINVAL;
	if (x->rows && x->cols && cuda_gemv_takes(x, w) &&
	    (w->rows / 2 <= CUDA_SWIGLU_FUSE_MAX_I || cuda_gemv_on_bulk(cu, x))) {
		CU_CHECK(cu_keep_norm(cu));
		return cuda_gemv_swiglu(cu, act, x, w);
	}
	if ((rc = cuda_matmul(be, gu, x, w, NULL)))
		return rc;
	return cuda_swiglu(be, act, gu, NULL);
}

int cuda_matmul_swiglu(struct kt_backend *be, const struct kt_tensor *act,
		       const struct kt_tensor *gu, const struct kt_tensor *x,
		       const struct kt_tensor *w)
{
	int rc = matmul_swiglu_run(be, act, gu, x, w);

	product_done(cu_of(be), rc, x->rows > 0 && w->rows > 0);
	return rc;
}
