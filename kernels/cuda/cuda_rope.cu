/* Rotary position embedding in place, rotate-half pairing (GPT-NeoX, Hugging
 * Face), as the cpu backend computes it: x[i] and x[i + D/2] of each head are
 * rotated by the f32 angle (float)pos * inv_freq[i], with cosf/sinf (the
 * accurate library functions, not the __cosf intrinsics) and unfused
 * products (__fmul_rn), so the result matches the cpu within the last bits
 * of cosf/sinf.
 *
 * Layout: x [T, n_heads * D] f32, pos [T, 1] i32 (device), inv_freq
 * [1, D/2] f32.
 *
 * Launch: one block of CUDA_THREADS per token. The block first puts the
 * token's D/2 cos/sin pairs in shared memory, then strides over the
 * n_heads * D/2 pairs. A negative position leaves the token alone and sets
 * CUDA_FAULT_ROPE.
 */
#include <errno.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_impl.h"

__global__ void rope_kernel(float *x, const int32_t *pos, const float *inv_freq, int n_heads,
			    int D, unsigned *fault)
{
	__shared__ float cs[CUDA_MAX_HEAD_DIM / 2], sn[CUDA_MAX_HEAD_DIM / 2];
	const int half = D / 2;
	const int32_t p = pos[blockIdx.x];
	float *xt = x + (int64_t)blockIdx.x * n_heads * D;

	if (p < 0) {
		if (threadIdx.x == 0)
			atomicOr(fault, CUDA_FAULT_ROPE);
		return;
	}
	for (int i = threadIdx.x; i < half; i += blockDim.x) {
		float angle = (float)p * inv_freq[i];

		cs[i] = cosf(angle);
		sn[i] = sinf(angle);
	}
	__syncthreads();
	for (int j = threadIdx.x; j < n_heads * half; j += blockDim.x) {
		const int h = j / half, i = j % half;
		float *a = xt + (int64_t)h * D + i, *b = a + half;
		const float x0 = *a, x1 = *b;

		*a = __fmul_rn(x0, cs[i]) - __fmul_rn(x1, sn[i]);
		*b = __fmul_rn(x1, cs[i]) + __fmul_rn(x0, sn[i]);
	}
}

int cuda_rope(struct kt_backend *be, const struct kt_tensor *x, const struct kt_tensor *pos,
	      const struct kt_tensor *inv_freq, int n_heads, int head_dim)
{
	struct cuda_backend *cu = cu_of(be);
	int64_t T;

	if (n_heads <= 0 || head_dim <= 0 || head_dim % 2 || head_dim > cu->max_head_dim)
		return -EINVAL;
	if (!cu_valid(x, KT_F32))
		return -EINVAL;
	T = x->rows;
	if (x->cols != (int64_t)n_heads * head_dim || !cu_shape(pos, KT_I32, T, 1) ||
	    !cu_shape(inv_freq, KT_F32, 1, head_dim / 2) || T > INT32_MAX)
		return -EINVAL;
	if (cu_overlap(x, pos) || cu_overlap(x, inv_freq))
		return -EINVAL;
	if (!T)
		return 0;
	CU_CHECK(cu_enter(cu));
	rope_kernel<<<(unsigned)T, CUDA_THREADS, 0, cu->stream>>>(
		(float *)x->data, (const int32_t *)pos->data, (const float *)inv_freq->data,
		n_heads, head_dim, cu->fault);
	CU_LAUNCHED();
	return 0;
}
