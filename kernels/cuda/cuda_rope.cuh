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

/* One head's values in a warp's registers, for heads of up to MAXD dims:
 * lane l holds the pairs (a[j], b[j]) = (x[i], x[i + R/2]), i = l + 32·j <
 * n_pairs = R/2, and the tail dims c[j] = x[R + l + 32·j] of n_tail = D - R.
 * A head's norm weights are held the same way. */
template <int MAXD> struct rope_regs_of {
	float a[MAXD / 64], b[MAXD / 64], c[MAXD / 32];
	static constexpr int pairs = MAXD / 64, tails = MAXD / 32;
};
typedef rope_regs_of<CUDA_MAX_HEAD_DIM> rope_regs;

/* The head at src (D = 2·n_pairs + n_tail values, any dtype) into r. */
template <int MAXD, typename T>
__device__ __forceinline__ void rope_load(rope_regs_of<MAXD> &r, const T *src, int lane,
					  int n_pairs, int n_tail)
{
	typedef rope_regs_of<MAXD> R;
	const T *xb = src + n_pairs, *xc = src + 2 * n_pairs;

#pragma unroll
	for (int j = 0; j < R::pairs; j++) {
		const int i = lane + 32 * j;

		r.a[j] = i < n_pairs ? widen(src[i]) : 0.0f;
		r.b[j] = i < n_pairs ? widen(xb[i]) : 0.0f;
	}
#pragma unroll
	for (int j = 0; j < R::tails; j++) {
		const int i = lane + 32 * j;

		r.c[j] = i < n_tail ? widen(xc[i]) : 0.0f;
	}
}

/* r normalised as cpu_rmsnorm does a row of D (when norm, by the head's
 * norm weights, which weights(w) puts in w after the sum of squares: a
 * rope_load, or a copy of weights loaded before), then its pairs rotated by
 * the block's cos/sin table. */
template <int MAXD, typename WF>
__device__ __forceinline__ void rope_apply(rope_regs_of<MAXD> &r, bool norm, const WF &weights,
					   const float *cs, const float *sn, float eps, int lane,
					   int n_pairs, int n_tail)
{
	typedef rope_regs_of<MAXD> R;

	if (norm) {
		rope_regs_of<MAXD> w;
		double ss = 0.0;
		float inv;

#pragma unroll
		for (int j = 0; j < R::pairs; j++)
			if (lane + 32 * j < n_pairs)
				ss += (double)r.a[j] * r.a[j] + (double)r.b[j] * r.b[j];
#pragma unroll
		for (int j = 0; j < R::tails; j++)
			if (lane + 32 * j < n_tail)
				ss += (double)r.c[j] * r.c[j];
		ss = warp_reduce(ss, op_sum());
		inv = 1.0f / sqrtf((float)(ss / (double)(2 * n_pairs + n_tail)) + eps);
		weights(w);
#pragma unroll
		for (int j = 0; j < R::pairs; j++) {
			r.a[j] = w.a[j] * (r.a[j] * inv);
			r.b[j] = w.b[j] * (r.b[j] * inv);
		}
#pragma unroll
		for (int j = 0; j < R::tails; j++)
			r.c[j] = w.c[j] * (r.c[j] * inv);
	}
#pragma unroll
	for (int j = 0; j < R::pairs; j++) {
		const int i = lane + 32 * j;

		if (i < n_pairs) {
			const float a = r.a[j], b = r.b[j];

			r.a[j] = __fmul_rn(a, cs[i]) - __fmul_rn(b, sn[i]);
			r.b[j] = __fmul_rn(b, cs[i]) + __fmul_rn(a, sn[i]);
		}
	}
}

/* r written to the head at dst, rounded to CT (as kv_store rounds what rope
 * left in k, for a cache row); the tail only when tail_too. */
template <int MAXD, typename CT>
__device__ __forceinline__ void rope_put(CT *dst, const rope_regs_of<MAXD> &r, int lane,
					 int n_pairs, int n_tail, bool tail_too)
{
	typedef rope_regs_of<MAXD> R;

#pragma unroll
	for (int j = 0; j < R::pairs; j++) {
		const int i = lane + 32 * j;

		if (i < n_pairs) {
			narrow_to(&dst[i], r.a[j]);
			narrow_to(&dst[i + n_pairs], r.b[j]);
		}
	}
	if (!tail_too)
		return;
#pragma unroll
	for (int j = 0; j < R::tails; j++) {
		const int i = lane + 32 * j;

		if (i < n_tail)
			narrow_to(&dst[2 * n_pairs + i], r.c[j]);
	}
}

/* The head loaded in r from src (D = 2·half + tail dims), normalised when
 * norm_w, rotated by the block's cos/sin table and written to dst (src, or
 * a head of its own); r holds what was written. For a kernel that loads
 * the head early, before its table. */
template <int MAXD, typename W>
__device__ __forceinline__ void rope_finish(const float *src, float *dst, rope_regs_of<MAXD> &r,
					    const float *cs, const float *sn, const W *norm_w,
					    float eps, int lane, int n_half, int tail)
{
	rope_apply(
		r, norm_w != NULL,
		[&](rope_regs_of<MAXD> &w) { rope_load(w, norm_w, lane, n_half, tail); }, cs, sn,
		eps, lane, n_half, tail);
	/* In place, the tail changes only when the norm scaled it. */
	rope_put(dst, r, lane, n_half, tail, norm_w || dst != src);
}

/* The head at src loaded into r, then rope_finish. */
template <typename W>
__device__ __forceinline__ void rope_head(const float *src, float *dst, rope_regs &r,
					  const float *cs, const float *sn, const W *norm_w,
					  float eps, int lane, int n_half, int tail)
{
	rope_load(r, src, lane, n_half, tail);
	rope_finish(src, dst, r, cs, sn, norm_w, eps, lane, n_half, tail);
}

/* Entry i of the cos/sin tables of position p, for the pair whose
 * frequency is freq: the one definition of the angles, which every rope
 * shares so that they give the same bits. */
__device__ __forceinline__ void rope_angle(float *cs, float *sn, int i, int32_t p, float freq)
{
	const float angle = (float)p * freq;

	cs[i] = cosf(angle);
	sn[i] = sinf(angle);
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
	for (int i = threadIdx.x; i < n_half; i += blockDim.x)
		rope_angle(cs, sn, i, p, inv_freq[i]);
	__syncthreads();
	return true;
}

#endif
