/* RMSNorm with the fused residual add, as the cpu backend computes it:
 * x += residual (when given); var = mean(x²) summed in double;
 * out = w * (x * 1/sqrt(var + eps)).
 *
 * Layout: out, x, residual [R, D] f32; w [1, D] f32 or bf16 (a weight as
 * kt_weight stores it). rmsnorm's out may be bf16 instead (apart from x
 * and residual): the f32 value rounded to nearest even as it is stored,
 * the bits that the product reading it would have rounded it to.
 *
 * Launch: one block of CUDA_THREADS per row. Pass 1 adds the residual,
 * writes x and sums squares (per thread, then block_reduce); pass 2 writes
 * out. Every element is read and written by the same thread in both passes,
 * so out may be x or residual.
 *
 * Rows of D a multiple of 4 and at most NORM_VEC_MAX_D (every model's
 * hidden size) take rmsnorm_vec_kernel: each thread loads all its float4s
 * of x and residual into registers before it stores anything. The loads are
 * then independent and in flight together; in the plain loop each load waits
 * for the store before it (out and x may alias), and a decode step's row of
 * 4096 took 15 us on an H100 instead of a few (ncu, 2026-11-22).
 *
 * rmsnorm_gated (the gated norm of the delta rule's heads): out = w * (x *
 * inv) * silu(z), the same var and inv, silu(z) = z / (1 + e^-z). Its rows
 * are one head each (D = v_dim, 128 in Qwen3-Next), so a warp takes a row
 * (CUDA_THREADS / 32 rows per block); lane l reads and writes elements
 * l, l + 32, ... in both passes, so out may be x.
 */
#include <errno.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_impl.h"
#include "kernels/cuda/cuda_pdl.cuh"
#include "kernels/cuda/cuda_reduce.cuh"

template <typename W, typename O>
__global__ void rmsnorm_kernel(O *out, float *x, const float *res, const W *w, int64_t D,
			       float eps)
{
	__shared__ double part[32];
	const int64_t off = blockIdx.x * D;
	float *xr = x + off;
	O *o = out + off;
	double ss = 0.0;
	float inv;

	pdl_wait();
	pdl_launch_dependents();
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
		narrow_to(&o[d], widen(w[d]) * (xr[d] * inv));
}

/* float4s per thread of rmsnorm_vec_kernel. */
#define NORM_VEC 8
#define NORM_VEC_MAX_D (4 * NORM_VEC * CUDA_THREADS)

__device__ __forceinline__ float4 weights4(const float *w, int64_t i)
{
	return reinterpret_cast<const float4 *>(w)[i];
}

__device__ __forceinline__ float4 weights4(const __nv_bfloat16 *w, int64_t i)
{
	const __nv_bfloat162 *p = reinterpret_cast<const __nv_bfloat162 *>(w) + 2 * i;
	const float2 lo = __bfloat1622float2(p[0]), hi = __bfloat1622float2(p[1]);

	return make_float4(lo.x, lo.y, hi.x, hi.y);
}

template <typename W, typename O>
__global__ void rmsnorm_vec_kernel(O *out, float *x, const float *res, const W *w,
				   int64_t D, float eps)
{
	__shared__ double part[32];
	const int64_t off = blockIdx.x * D, D4 = D / 4;
	float4 *xr = reinterpret_cast<float4 *>(x + off);
	O *o = out + off;
	const float4 *rr = reinterpret_cast<const float4 *>(res + (res ? off : 0));
	float4 v[NORM_VEC];
	double ss = 0.0;
	float inv;

	pdl_wait();
	pdl_launch_dependents();
#pragma unroll
	for (int j = 0; j < NORM_VEC; j++) {
		const int64_t i = threadIdx.x + (int64_t)j * blockDim.x;

		if (i < D4)
			v[j] = xr[i];
	}
	if (res) {
#pragma unroll
		for (int j = 0; j < NORM_VEC; j++) {
			const int64_t i = threadIdx.x + (int64_t)j * blockDim.x;

			if (i < D4) {
				const float4 r = rr[i];

				v[j] = make_float4(v[j].x + r.x, v[j].y + r.y, v[j].z + r.z, v[j].w + r.w);
			}
		}
#pragma unroll
		for (int j = 0; j < NORM_VEC; j++) {
			const int64_t i = threadIdx.x + (int64_t)j * blockDim.x;

			if (i < D4)
				xr[i] = v[j];
		}
	}
#pragma unroll
	for (int j = 0; j < NORM_VEC; j++)
		if (threadIdx.x + (int64_t)j * blockDim.x < D4)
			ss += (double)v[j].x * v[j].x + (double)v[j].y * v[j].y +
			      (double)v[j].z * v[j].z + (double)v[j].w * v[j].w;
	ss = block_reduce(ss, op_sum(), 0.0, part);
	inv = 1.0f / sqrtf((float)(ss / (double)D) + eps);
#pragma unroll
	for (int j = 0; j < NORM_VEC; j++) {
		const int64_t i = threadIdx.x + (int64_t)j * blockDim.x;

		if (i < D4) {
			const float4 g = weights4(w, i);

			narrow4_to(o, i, make_float4(g.x * (v[j].x * inv), g.y * (v[j].y * inv),
						     g.z * (v[j].z * inv), g.w * (v[j].w * inv)));
		}
	}
}

/* The vector kernel applies: D fits the registers and rows are 16-byte aligned. */
static bool vec_ok(const struct kt_tensor *out, const struct kt_tensor *x, const float *res,
		   const struct kt_tensor *w, int64_t D)
{
	const uintptr_t a = (uintptr_t)out->data | (uintptr_t)x->data | (uintptr_t)res |
			    (uintptr_t)w->data;

	return D % 4 == 0 && D <= NORM_VEC_MAX_D && a % 16 == 0;
}

template <typename O, typename W>
static void launch_rmsnorm(struct cuda_backend *cu, bool vec, O *out, float *x, const float *res,
			   const W *w, int64_t R, int64_t D, float eps)
{
	if (vec)
		cu_launch(cu->pdl, rmsnorm_vec_kernel<W, O>, (unsigned)R, CUDA_THREADS, 0, cu->stream, out,
			  x, res, w, D, eps);
	else
		cu_launch(cu->pdl, rmsnorm_kernel<W, O>, (unsigned)R, CUDA_THREADS, 0, cu->stream, out, x,
			  res, w, D, eps);
}

template <typename O>
static void launch_rmsnorm(struct cuda_backend *cu, bool vec, O *out, float *x, const float *res,
			   const struct kt_tensor *w, int64_t R, int64_t D, float eps)
{
	if (w->dtype == KT_BF16)
		launch_rmsnorm(cu, vec, out, x, res, (const __nv_bfloat16 *)w->data, R, D, eps);
	else
		launch_rmsnorm(cu, vec, out, x, res, (const float *)w->data, R, D, eps);
}

int cuda_rmsnorm(struct kt_backend *be, const struct kt_tensor *out, const struct kt_tensor *x,
		 const struct kt_tensor *residual, const struct kt_tensor *w, float eps)
{
	struct cuda_backend *cu = cu_of(be);
	int64_t R, D;
	const float *res;
	bool out16, vec;

	if (!cu_valid(x, KT_F32))
		return -EINVAL;
	R = x->rows;
	D = x->cols;
	out16 = out && out->dtype == KT_BF16;
	if (!cu_shape(out, out16 ? KT_BF16 : KT_F32, R, D) || !cu_float(w) || w->rows != 1 ||
	    w->cols != D)
		return -EINVAL;
	if (residual && !cu_shape(residual, KT_F32, R, D))
		return -EINVAL;
	if (!cu_same_or_apart(out, x) ||
	    (residual && (!cu_same_or_apart(out, residual) || !cu_same_or_apart(x, residual))))
		return -EINVAL;
	if (out16 && (cu_overlap(out, x) || (residual && cu_overlap(out, residual))))
		return -EINVAL;
	if (!(eps >= 0.0f) || R > INT32_MAX)
		return -EINVAL;
	if (!R || !D)
		return 0;
	res = residual ? (const float *)residual->data : NULL;
	/* vec_ok wants out 16-byte aligned; a bf16 row of out then starts
	 * 8-byte aligned (D % 4 == 0), what narrow4_to's stores need */
	vec = vec_ok(out, x, res, w, D);
	CU_CHECK(cu_enter(cu));
	if (out16)
		launch_rmsnorm(cu, vec, (__nv_bfloat16 *)out->data, (float *)x->data, res, w, R, D,
			       eps);
	else
		launch_rmsnorm(cu, vec, (float *)out->data, (float *)x->data, res, w, R, D, eps);
	CU_LAUNCHED();
	return 0;
}

template <typename W>
__global__ void rmsnorm_gated_kernel(float *out, const float *x, const float *z, const W *w,
				     int64_t R, int64_t D, float eps)
{
	const int lane = threadIdx.x & 31;
	const int64_t r = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
	const float *xr = x + r * D, *zr = z + r * D;
	float *o = out + r * D;
	double ss = 0.0;
	float inv;

	if (r >= R)
		return;
	for (int64_t d = lane; d < D; d += 32)
		ss += (double)xr[d] * xr[d];
	ss = warp_reduce(ss, op_sum());
	inv = 1.0f / sqrtf((float)(ss / (double)D) + eps);
	for (int64_t d = lane; d < D; d += 32) {
		const float zv = zr[d];

		o[d] = widen(w[d]) * (xr[d] * inv) * (zv / (1.0f + expf(-zv)));
	}
}

int cuda_rmsnorm_gated(struct kt_backend *be, const struct kt_tensor *out,
		       const struct kt_tensor *x, const struct kt_tensor *z,
		       const struct kt_tensor *w, float eps)
{
	struct cuda_backend *cu = cu_of(be);
	const int rows_per_block = CUDA_THREADS / 32;
	int64_t R, D, blocks;

	if (!cu_valid(x, KT_F32))
		return -EINVAL;
	R = x->rows;
	D = x->cols;
	if (!cu_shape(out, KT_F32, R, D) || !cu_shape(z, KT_F32, R, D) || !cu_float(w) ||
	    w->rows != 1 || w->cols != D)
		return -EINVAL;
	if (!cu_same_or_apart(out, x) || cu_overlap(out, z) || cu_overlap(out, w))
		return -EINVAL;
	if (!(eps >= 0.0f))
		return -EINVAL;
	if (!R || !D)
		return 0;
	blocks = (R + rows_per_block - 1) / rows_per_block;
	if (blocks > INT32_MAX)
		return -EINVAL;
	CU_CHECK(cu_enter(cu));
	if (w->dtype == KT_BF16)
		rmsnorm_gated_kernel<<<(unsigned)blocks, CUDA_THREADS, 0, cu->stream>>>(
			(float *)out->data, (const float *)x->data, (const float *)z->data,
			(const __nv_bfloat16 *)w->data, R, D, eps);
	else
		rmsnorm_gated_kernel<<<(unsigned)blocks, CUDA_THREADS, 0, cu->stream>>>(
			(float *)out->data, (const float *)x->data, (const float *)z->data,
			(const float *)w->data, R, D, eps);
	CU_LAUNCHED();
	return 0;
}
