/* moe_matmul: the experts' product over a routing plan (contract in
 * kernels/backend.h), and the choice of its kernel.
 *
 * Shapes: y [R, N] f32 (R = T*k sorted rows), x [T, K] f32 (k > 0) or
 * [R, K] (k == 0), w [n_local * N, K] (experts e0 .. e0 + n_local - 1 back
 * to back), order [R, 1] and offsets [E + 1, 1] i32 from moe_route.
 *
 * The kernel is chosen on the host from the shapes alone (R, E, N, K,
 * alignment), never from the plan, so a step records into a graph once:
 *  - bf16 w, K % 8 == 0, x and w 16-byte aligned: the grouped GEMV for few
 *    rows per expert (each active expert's weight read once) or the grouped
 *    tensor-core GEMM for many, as cuda_moe_launch.cuh chooses;
 *  - anything else (K not a multiple of 8, unaligned views, f32 weights):
 *    moe_generic_kernel below, a warp per output, slow but the same
 *    function (x rounded to bf16 against bf16 weights, as the dense matmul
 *    does; f32 weights take x as it is).
 * The fast kernels write only the rows of local experts; when w holds a
 * part of the experts, moe_zero_kernel first writes 0 to the others.
 */
#include <errno.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_impl.h"
#include "kernels/cuda/cuda_moe.cuh"
#include "kernels/cuda/cuda_moe_launch.cuh"
#include "kernels/cuda/cuda_reduce.cuh"

/* An element of x as the product sees it: rounded to bf16 against bf16 weights. */
__device__ __forceinline__ float moe_x(float v, const __nv_bfloat16 *)
{
	return __bfloat162float(__float2bfloat16_rn(v));
}

__device__ __forceinline__ float moe_x(float v, const float *)
{
	return v;
}

/* The expert whose sorted rows hold row i: the last e with offsets[e] <= i
 * (binary search), or -1 (and a fault) when the offsets do not cover i. */
__device__ int moe_expert_of(const int32_t *offsets, int E, int i, unsigned *fault)
{
	int lo = 0, hi = E; /* offsets[lo] <= i < offsets[hi] while the plan is sound */

	if (offsets[0] > i || offsets[E] <= i) {
		atomicOr(fault, CUDA_FAULT_MOE_MATMUL);
		return -1;
	}
	while (hi - lo > 1) {
		const int mid = lo + (hi - lo) / 2;

		if (offsets[mid] <= i)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

/* y[i, n] for sorted row i = blockIdx.x, n = 8·(blockIdx.y + gridDim.y·j) +
 * warp: one warp per output, lanes striding over K, a fixed-order warp
 * sum. Rows of experts outside [e0, e0 + n_local) are 0; a row whose order
 * entry is out of range is NaN. y [R, N], x [T or R, K], w [n_local * N, K]. */
template <typename W>
__global__ void moe_generic_kernel(float *__restrict__ y, const float *__restrict__ x,
				   const W *__restrict__ w, const int32_t *__restrict__ order,
				   const int32_t *__restrict__ offsets, int R, int N, int K, int k,
				   int E, int e0, int n_local, unsigned *fault)
{
	__shared__ int row_e, row_src;
	const int i = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

	if (threadIdx.x == 0) {
		row_e = moe_expert_of(offsets, E, i, fault);
		row_src = moe_src_row(order, i, k, R);
		if (row_src < 0)
			atomicOr(fault, CUDA_FAULT_MOE_MATMUL);
	}
	__syncthreads();
	for (int n = 8 * blockIdx.y + warp; n < N; n += 8 * gridDim.y) {
		float acc = 0.0f;

		if (row_e >= e0 && row_e < e0 + n_local) {
			if (row_src < 0) {
				acc = __int_as_float(0x7fc00000);
			} else {
				const float *xr = x + (int64_t)row_src * K;
				const W *wr = w + ((int64_t)(row_e - e0) * N + n) * K;

				for (int kk = lane; kk < K; kk += 32)
					acc += moe_x(xr[kk], w) * widen(wr[kk]);
				acc = warp_reduce(acc, op_sum());
			}
		}
		if (lane == 0)
			y[(int64_t)i * N + n] = acc;
	}
}

/* y[i, :] = 0 for the sorted rows outside [offsets[e0], offsets[e0 +
 * n_local]), the rows of experts this w does not hold; y [R, N], a block
 * per row (grid-stride), threads over the columns. */
__global__ void moe_zero_kernel(float *__restrict__ y, const int32_t *__restrict__ offsets, int e0,
				int n_local, int R, int N)
{
	const int lo = offsets[e0], hi = offsets[e0 + n_local];

	for (int i = blockIdx.x; i < R; i += gridDim.x)
		if (i < lo || i >= hi)
			for (int n = threadIdx.x; n < N; n += blockDim.x)
				y[(int64_t)i * N + n] = 0.0f;
}

cudaError_t cuda_moe_gemm_prepare(void)
{
	cudaError_t e = moe_gemm_prepare<64>();

	return e ? e : moe_gemm_prepare<128>();
}

static bool matmul_args_ok(const struct kt_tensor *y, const struct kt_tensor *x,
			   const struct kt_tensor *w, const struct kt_tensor *order,
			   const struct kt_tensor *offsets, int k, int e0)
{
	int64_t R, N, E, n_local;

	if (!cu_valid(y, KT_F32) || !cu_valid(x, KT_F32) || !cu_float(w) ||
	    !cu_valid(order, KT_I32) || !cu_valid(offsets, KT_I32))
		return false;
	R = y->rows;
	N = y->cols;
	E = offsets->rows - 1;
	if (order->cols != 1 || order->rows != R || offsets->cols != 1 || E < 1 || E > INT32_MAX - 1)
		return false;
	if (k < 0 || k > KT_MOE_MAX_K || (k ? x->rows * k : x->rows) != R)
		return false;
	if (w->cols != x->cols || (N ? w->rows % N : w->rows))
		return false;
	n_local = N ? w->rows / N : 0;
	if (e0 < 0 || e0 > E || n_local > E - e0)
		return false;
	if (R > INT32_MAX || N > INT32_MAX || x->cols > INT32_MAX)
		return false;
	return !cu_overlap(y, x) && !cu_overlap(y, w) && !cu_overlap(y, order) &&
	       !cu_overlap(y, offsets);
}

static int launch_generic(struct cuda_backend *cu, const struct kt_tensor *y,
			  const struct kt_tensor *x, const struct kt_tensor *w,
			  const struct kt_tensor *order, const struct kt_tensor *offsets, int k,
			  int e0, int n_local)
{
	const int R = (int)y->rows, N = (int)y->cols, K = (int)x->cols;
	const int E = (int)offsets->rows - 1;
	const int64_t ny = ((int64_t)N + 7) / 8;
	const dim3 grid((unsigned)R, (unsigned)(ny < 65535 ? ny : 65535));

	if (w->dtype == KT_BF16)
		moe_generic_kernel<<<grid, 256, 0, cu->stream>>>(
			(float *)y->data, (const float *)x->data, (const __nv_bfloat16 *)w->data,
			(const int32_t *)order->data, (const int32_t *)offsets->data, R, N, K, k, E,
			e0, n_local, cu->fault);
	else
		moe_generic_kernel<<<grid, 256, 0, cu->stream>>>(
			(float *)y->data, (const float *)x->data, (const float *)w->data,
			(const int32_t *)order->data, (const int32_t *)offsets->data, R, N, K, k, E,
			e0, n_local, cu->fault);
	CU_LAUNCHED();
	return 0;
}

int cuda_moe_matmul(struct kt_backend *be, const struct kt_tensor *y, const struct kt_tensor *x,
		    const struct kt_tensor *w, const struct kt_tensor *order,
		    const struct kt_tensor *offsets, int k, int e0)
{
	struct cuda_backend *cu = cu_of(be);
	int R, N, K, E, n_local;
	float *yd;
	const float *xd;
	const __nv_bfloat16 *wd;
	const int32_t *od, *offd;

	if (!matmul_args_ok(y, x, w, order, offsets, k, e0))
		return -EINVAL;
	R = (int)y->rows;
	N = (int)y->cols;
	K = (int)x->cols;
	E = (int)offsets->rows - 1;
	n_local = N ? (int)(w->rows / N) : 0;
	if (!R || !N)
		return 0;
	CU_CHECK(cu_enter(cu));
	if (!K || !n_local) {
		CU_CHECK(cudaMemsetAsync(y->data, 0, kt_nbytes(y), cu->stream));
		return 0;
	}
	if (w->dtype != KT_BF16 || !moe_gemv_fits(x->data, w->data, K))
		return launch_generic(cu, y, x, w, order, offsets, k, e0, n_local);
	yd = (float *)y->data;
	xd = (const float *)x->data;
	wd = (const __nv_bfloat16 *)w->data;
	od = (const int32_t *)order->data;
	offd = (const int32_t *)offsets->data;
	if (e0 > 0 || e0 + n_local < E) {
		moe_zero_kernel<<<(unsigned)(R < 65536 ? R : 65536), CUDA_THREADS, 0, cu->stream>>>(
			yd, offd, e0, n_local, R, N);
		CU_LAUNCHED();
	}
	CU_CHECK(moe_launch(cu->stream, yd, xd, wd, od, offd, R, N, K, k, E, e0, n_local,
			    cu->fault));
	return 0;
}
