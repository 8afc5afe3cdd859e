/* The arithmetic of rmsnorm's vector kernel (cuda_norm.cu), in a header so
 * that the GEMV that computes a norm inside its blocks (cuda_gemv_norm.cuh)
 * runs the very same steps and gets the same bits.
 *
 * A block of CUDA_THREADS threads takes one row of D floats (D a multiple
 * of 4, at most NORM_VEC_MAX_D): thread t holds the float4s t + j ·
 * CUDA_THREADS (j < NORM_VEC) in registers. The squares sum per thread in
 * double, in j order, then over the block (block_reduce); inv = 1 /
 * sqrt(ss / D + eps) in f32; out = w · (x · inv). A caller whose rows
 * are shorter may hold fewer vectors (NV < NORM_VEC): the vectors past D
 * take no part anyway, so the order of the sums is the same. A square of an f32 is
 * exact in a double, so whether the compiler fuses a square into the add
 * after it does not change the sum.
 */
#ifndef ATLAS_KERNELS_CUDA_NORM_CUH
#define ATLAS_KERNELS_CUDA_NORM_CUH

#include <stdint.h>

#include <cuda_bf16.h>

#include "kernels/cuda/cuda_impl.h"
#include "kernels/cuda/cuda_reduce.cuh"

/* float4s per thread of the vector kernel. */
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

/* The float4 index of this thread's j-th vector (THREADS: block_reduce's). */
template <int THREADS = 0>
__device__ __forceinline__ int64_t norm_vec_index(int j)
{
	return threadIdx.x + (int64_t)j * reduce_threads<THREADS>();
}

/* v = x (+ res) of this thread's vectors; D4 = D / 4, at most NV ·
 * CUDA_THREADS (NV: the registers a caller gives the row). */
template <int THREADS = 0, int NV>
__device__ __forceinline__ void norm_vec_load(float4 (&v)[NV], const float4 *xr,
					      const float4 *rr, int64_t D4)
{
#pragma unroll
	for (int j = 0; j < NV; j++)
		if (norm_vec_index<THREADS>(j) < D4)
			v[j] = xr[norm_vec_index<THREADS>(j)];
	if (rr) {
#pragma unroll
		for (int j = 0; j < NV; j++)
			if (norm_vec_index<THREADS>(j) < D4) {
				const float4 r = rr[norm_vec_index<THREADS>(j)];

				v[j] = make_float4(v[j].x + r.x, v[j].y + r.y, v[j].z + r.z,
						   v[j].w + r.w);
			}
	}
}

/* inv of the row, on every thread of the block (block_reduce's barrier). */
template <int THREADS = 0, int NV>
__device__ __forceinline__ float norm_vec_inv(const float4 (&v)[NV], int64_t D4, float eps,
					      double *part)
{
	double ss = 0.0;

#pragma unroll
	for (int j = 0; j < NV; j++)
		if (norm_vec_index<THREADS>(j) < D4)
			ss += (double)v[j].x * v[j].x + (double)v[j].y * v[j].y +
			      (double)v[j].z * v[j].z + (double)v[j].w * v[j].w;
	ss = block_reduce<THREADS>(ss, op_sum(), 0.0, part);
	return 1.0f / sqrtf((float)(ss / (double)(4 * D4)) + eps);
}

/* w · (x · inv) of one vector. */
__device__ __forceinline__ float4 norm_vec_out(float4 g, float4 x, float inv)
{
	return make_float4(g.x * (x.x * inv), g.y * (x.y * inv), g.z * (x.z * inv),
			   g.w * (x.w * inv));
}

#endif
