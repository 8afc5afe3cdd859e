/* RMSNorm with the fused residual add, as the cpu backend computes it:
 * x += residual (when given); var = mean(x²) summed in double;
 * out = w * (x * 1/sqrt(var + eps)).
 *
 * Layout: out, x, residual [R, D] f32; w [1, D] f32 or bf16 (a weight as
 * kt_weight stores it).
 *
 * Launch: one block of CUDA_THREADS per row. Pass 1 adds the residual,
 * writes x and sums squares (per thread, then block_reduce); pass 2 writes
 * out. Every element is read and written by the same thread in both passes,
 * so out may be x or residual.
 */
#include <errno.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_impl.h"
#include "kernels/cuda/cuda_reduce.cuh"

template <typename W>
__global__ void rmsnorm_kernel(float *out, float *x, const float *res, const W *w, int64_t D,
			       float eps)
{
	__shared__ double part[32];
	const int64_t off = blockIdx.x * D;
	float *xr = x + off, *o = out + off;
	double ss = 0.0;
	float inv;

	for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
		float v = xr[d];

		if (res) {
			v += res[off + d];
			xr[d] = v;
		}
		ss += (double)v * v;
	}
	ss = block_reduce(ss, op_sum(), 0.0, part);
	inv = 1.0f / sqrtf((float)(ss / (double)D) + eps);
	for (int64_t d = threadIdx.x; d < D; d += blockDim.x)
		o[d] = widen(w[d]) * (xr[d] * inv);
}

int cuda_rmsnorm(struct kt_backend *be, const struct kt_tensor *out, const struct kt_tensor *x,
		 const struct kt_tensor *residual, const struct kt_tensor *w, float eps)
{
	struct cuda_backend *cu = cu_of(be);
	int64_t R, D;
	const float *res;

	if (!cu_valid(x, KT_F32))
		return -EINVAL;
	R = x->rows;
	D = x->cols;
	if (!cu_shape(out, KT_F32, R, D) || !cu_float(w) || w->rows != 1 || w->cols != D)
		return -EINVAL;
	if (residual && !cu_shape(residual, KT_F32, R, D))
		return -EINVAL;
	if (!cu_same_or_apart(out, x) ||
	    (residual && (!cu_same_or_apart(out, residual) || !cu_same_or_apart(x, residual))))
		return -EINVAL;
	if (!(eps >= 0.0f) || R > INT32_MAX)
		return -EINVAL;
	if (!R || !D)
		return 0;
	res = residual ? (const float *)residual->data : NULL;
	CU_CHECK(cu_enter(cu));
	if (w->dtype == KT_BF16)
		rmsnorm_kernel<<<(unsigned)R, CUDA_THREADS, 0, cu->stream>>>(
			(float *)out->data, (float *)x->data, res,
			(const __nv_bfloat16 *)w->data, D, eps);
	else
		rmsnorm_kernel<<<(unsigned)R, CUDA_THREADS, 0, cu->stream>>>(
			(float *)out->data, (float *)x->data, res, (const float *)w->data, D,
			eps);
	CU_LAUNCHED();
	return 0;
}
