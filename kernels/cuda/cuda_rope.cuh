/* Rotary embedding of one head by one warp, with Qwen3's per-head RMSNorm in
 * front: the device functions that rope, rope_store (cuda_rope.cu) and the
 * decode attention that takes a pending rope_store (cuda_attention_decode.cuh)
 * share, so that all of them compute the same bits. What they compute, and
 * the layout of a head in a warp's registers, is at the top of cuda_rope.cu.
 */
#ifndef ATLAS_KERNELS_CUDA_ROPE_CUH
#define ATLAS_KERNELS_CUDA_ROPE_CUH

#include "kernels/cuda/cuda_impl.h"
#include "kernels/cuda/cuda_reduce.cuh"

/* Pairs a lane holds: R/2 <= CUDA_MAX_HEAD_DIM/2 spread over 32 lanes. */
#define ROPE_PAIRS (CUDA_MAX_HEAD_DIM / 64)
/* Unrotated dims a lane holds: D - R < CUDA_MAX_HEAD_DIM spread over 32 lanes. */
#define ROPE_TAIL (CUDA_MAX_HEAD_DIM / 32)

/* Normalise one head held as pairs (a[j], b[j]) = (x[i], x[i + R/2]),
 * i = lane + 32·j < n_pairs = R/2, and the tail c[j] = x[R + lane + 32·j]
 * of n_tail = D - R dims, as cpu_rmsnorm does a row of D. */
template <typename W>
__device__ __forceinline__ void norm_head(float (&a)[ROPE_PAIRS], float (&b)[ROPE_PAIRS],
					  float (&c)[ROPE_TAIL], const W *w, int lane,
					  int n_pairs, int n_tail, float eps)
{
	const int R = 2 * n_pairs;
	double ss = 0.0;
	float inv;

#pragma unroll
	for (int j = 0; j < ROPE_PAIRS; j++)
		if (lane + 32 * j < n_pairs)
			ss += (double)a[j] * a[j] + (double)b[j] * b[j];
#pragma unroll
	for (int j = 0; j < ROPE_TAIL; j++)
		if (lane + 32 * j < n_tail)
			ss += (double)c[j] * c[j];
	ss = warp_reduce(ss, op_sum());
	inv = 1.0f / sqrtf((float)(ss / (double)(R + n_tail)) + eps);
#pragma unroll
	for (int j = 0; j < ROPE_PAIRS; j++) {
		const int i = lane + 32 * j;

		if (i < n_pairs) {
			a[j] = widen(w[i]) * (a[j] * inv);
			b[j] = widen(w[i + n_pairs]) * (b[j] * inv);
		}
	}
#pragma unroll
	for (int j = 0; j < ROPE_TAIL; j++) {
		const int i = lane + 32 * j;

		if (i < n_tail)
			c[j] = widen(w[R + i]) * (c[j] * inv);
	}
}

/* One head's values in a warp's registers: lane l holds the pairs
 * (a[j], b[j]) = (x[i], x[i + R/2]), i = l + 32·j, and the tail dims c[j] =
 * x[R + l + 32·j]. */
struct rope_regs {
	float a[ROPE_PAIRS], b[ROPE_PAIRS], c[ROPE_TAIL];
};

/* The head at src (D = 2·half + tail dims) loaded into r, normalised when
 * norm_w, rotated by the block's cos/sin table and written to dst (src, or
 * a head of its own); r holds what was written. */
template <typename W>
__device__ __forceinline__ void rope_head(const float *src, float *dst, rope_regs &r,
					  const float *cs, const float *sn, const W *norm_w,
					  float eps, int lane, int n_half, int tail)
{
	const float *xa = src, *xb = src + n_half, *xc = src + 2 * n_half;
	float *da = dst, *db = dst + n_half, *dc = dst + 2 * n_half;

#pragma unroll
	for (int j = 0; j < ROPE_PAIRS; j++) {
		const int i = lane + 32 * j;

		r.a[j] = i < n_half ? xa[i] : 0.0f;
		r.b[j] = i < n_half ? xb[i] : 0.0f;
	}
#pragma unroll
	for (int j = 0; j < ROPE_TAIL; j++) {
		const int i = lane + 32 * j;

		r.c[j] = i < tail ? xc[i] : 0.0f;
	}
	if (norm_w)
		norm_head(r.a, r.b, r.c, norm_w, lane, n_half, tail, eps);
#pragma unroll
	for (int j = 0; j < ROPE_PAIRS; j++) {
		const int i = lane + 32 * j;

		if (i < n_half) {
			const float a = r.a[j], b = r.b[j];

			r.a[j] = __fmul_rn(a, cs[i]) - __fmul_rn(b, sn[i]);
			r.b[j] = __fmul_rn(b, cs[i]) + __fmul_rn(a, sn[i]);
			da[i] = r.a[j];
			db[i] = r.b[j];
		}
	}
	/* In place, the tail changes only when the norm scaled it. */
	if (norm_w || dst != src) {
#pragma unroll
		for (int j = 0; j < ROPE_TAIL; j++) {
			const int i = lane + 32 * j;

			if (i < tail)
				dc[i] = r.c[j];
		}
	}
}

/* cos and sin of position p's angles into the block's tables; false (and
 * the rope fault) for a negative position. Ends with a barrier. */
__device__ __forceinline__ bool rope_table(float *cs, float *sn, int32_t p,
					   const float *inv_freq, int n_half, unsigned *fault,
					   unsigned fault_bits)
{
	if (p < 0) {
		if (threadIdx.x == 0)
			atomicOr(fault, fault_bits);
		return false;
	}
	for (int i = threadIdx.x; i < n_half; i += blockDim.x) {
		float angle = (float)p * inv_freq[i];

		cs[i] = cosf(angle);
		sn[i] = sinf(angle);
	}
	__syncthreads();
	return true;
}

/* The roped k head in r written to the cache row kr (D = 2·n_half + tail
 * values), rounded as kv_store rounds what rope left in k. */
template <typename CT>
__device__ __forceinline__ void rope_put_k(CT *kr, const rope_regs &r, int lane, int n_half,
					   int tail)
{
#pragma unroll
	for (int j = 0; j < ROPE_PAIRS; j++) {
		const int i = lane + 32 * j;

		if (i < n_half) {
			narrow_to(&kr[i], r.a[j]);
			narrow_to(&kr[i + n_half], r.b[j]);
		}
	}
#pragma unroll
	for (int j = 0; j < ROPE_TAIL; j++) {
		const int i = lane + 32 * j;

		if (i < tail)
			narrow_to(&kr[2 * n_half + i], r.c[j]);
	}
}

#endif
