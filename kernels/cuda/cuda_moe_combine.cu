/* moe_combine: each token's expert outputs weighted and added in a fixed
 * order (contract in kernels/backend.h).
 *
 * Shapes: out [T, N] f32, y [T*k, N] f32 (sorted rows, moe_matmul's), w
 * [T, k] f32 (moe_route's weights), slot [T*k, 1] i32 (moe_route's).
 *
 * Arithmetic: out[t, n] = ((0 + w[t,0]·y[slot[t*k],n]) + w[t,1]·y[..]) + ..
 * with each product and sum rounded separately (no fused multiply-add), j
 * in order: the same bits whatever the batch or the ranks, and those of a
 * plain C loop `acc += w * y` compiled without FMA contraction.
 *
 * Launch: a grid-stride loop over the T·N outputs, n fastest (y rows read
 * coalesced). A slot outside [0, T*k) makes the token's outputs NaN and
 * sets CUDA_FAULT_MOE_COMBINE.
 */
#include <errno.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_impl.h"

__global__ void moe_combine_kernel(float *__restrict__ out, const float *__restrict__ y,
				   const float *__restrict__ w, const int32_t *__restrict__ slot,
				   int64_t T, int64_t N, int k, unsigned *fault)
{
	const int64_t R = T * k;

	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < T * N;
	     i += (int64_t)gridDim.x * blockDim.x) {
		const int64_t t = i / N, n = i % N;
		float acc = 0.0f;

		for (int j = 0; j < k; j++) {
			const int32_t s = slot[t * k + j];

			if (s < 0 || s >= R) {
				if (!n)
					atomicOr(fault, CUDA_FAULT_MOE_COMBINE);
				acc = __int_as_float(0x7fc00000);
				break;
			}
			acc = __fadd_rn(acc, __fmul_rn(w[t * k + j], y[s * N + n]));
		}
		out[i] = acc;
	}
}

int cuda_moe_combine(struct kt_backend *be, const struct kt_tensor *out,
		     const struct kt_tensor *y, const struct kt_tensor *w,
		     const struct kt_tensor *slot)
{
	struct cuda_backend *cu = cu_of(be);
	int64_t T, N, k;

	if (!cu_valid(out, KT_F32) || !cu_valid(w, KT_F32))
		return -EINVAL;
	T = out->rows;
	N = out->cols;
	k = w->cols;
	if (w->rows != T || k < 1 || k > KT_MOE_MAX_K)
		return -EINVAL;
	if (!cu_shape(y, KT_F32, T * k, N) || !cu_shape(slot, KT_I32, T * k, 1))
		return -EINVAL;
	if (cu_overlap(out, y) || cu_overlap(out, w) || cu_overlap(out, slot))
		return -EINVAL;
	if (!T || !N)
		return 0;
	CU_CHECK(cu_enter(cu));
	moe_combine_kernel<<<cu_blocks(T * N), CUDA_THREADS, 0, cu->stream>>>(
		(float *)out->data, (const float *)y->data, (const float *)w->data,
		(const int32_t *)slot->data, T, N, (int)k, cu->fault);
	CU_LAUNCHED();
	return 0;
}
