/* Generic paged attention: any head_dim up to CUDA_MAX_HEAD_DIM, f32 or
 * bf16 caches, every token by its device-side position and slot. It serves
 * what the tensor-core kernels do not take (f32 caches, head_dim other than
 * 64 or 128, a batch without step structure) and is the lab's baseline.
 *
 * One block of GEN_WARPS warps per (token, head); q goes to shared memory.
 * The keys 0..pos[t] are split in tiles of 32, tile i going to warp
 * i % GEN_WARPS. In a tile, lane j scores key j (a whole dot product over D,
 * q broadcast from shared memory), the warp updates its online softmax state
 * (running max m, sum l, f32 accumulator with D/32 values per lane) and adds
 * the 32 value rows, lane d reading column d (coalesced). At the end the
 * warps' states merge through shared memory:
 * out = Σ acc_w e^(m_w - M) / Σ l_w e^(m_w - M). All arithmetic is f32 with
 * expf. q is read whole before out is written, so out may be q. A bad slot,
 * position (past max_pos included) or block id makes the token's row NaN
 * and sets CUDA_FAULT_ATTENTION.
 */
#ifndef ATLAS_KERNELS_CUDA_ATTENTION_GENERIC_CUH
#define ATLAS_KERNELS_CUDA_ATTENTION_GENERIC_CUH

#include "kernels/cuda/cuda_attention_common.cuh"

#define GEN_WARPS 4

template <typename CT> struct gen_args {
	att_out out;
	const float *q;
	const CT *kc, *vc;
	paged_kv kv;
	int n_heads, group, D; /* group = n_heads / n_kv_heads */
	int max_pos;           /* largest valid position: min(max_context, max_kv_len) - 1 */
	float scale;
	bool vec4;             /* f32 caches, D % 4 == 0, 16-byte aligned */
	unsigned *fault;
};

__device__ __forceinline__ float gen_dot(const float *qs, const float *k, int D, bool vec4)
{
	float s = 0.0f;

	if (vec4) {
		const float4 *q4 = (const float4 *)qs, *k4 = (const float4 *)k;

		for (int i = 0; i < D / 4; i++) {
			const float4 a = q4[i], b = __ldg(k4 + i);

			s += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
		}
	} else {
		for (int d = 0; d < D; d++)
			s += qs[d] * __ldg(k + d);
	}
	return s;
}

__device__ __forceinline__ float gen_dot(const float *qs, const __nv_bfloat16 *k, int D, bool)
{
	float s = 0.0f;

	for (int d = 0; d < D; d++)
		s += qs[d] * widen(k[d]);
	return s;
}

/* One warp's online-softmax state: running max, sum and NPL output values per lane. */
template <int NPL> struct gen_state {
	float m, l, acc[NPL];
};

/* Fold the tile of keys [base, base + 32) ∩ [0, n) into st. Sets *bad on a
 * block id out of range. */
template <typename CT, int NPL>
__device__ __forceinline__ void gen_tile(const gen_args<CT> &a, const int32_t *blocks,
					 int64_t koff, const float *qs, int base, int n,
					 gen_state<NPL> &st, int *bad)
{
	const int lane = threadIdx.x & 31, j = base + lane;
	const int cnt = n - base < 32 ? n - base : 32;
	int64_t row = j < n ? cache_row(a.kv, blocks, j) : -1;
	float sc = -INFINITY, m_new, corr, pj;

	if (j < n && row < 0)
		*bad = 1;
	if (row >= 0)
		sc = gen_dot(qs, a.kc + row * a.kv.row_len + koff, a.D, a.vec4) * a.scale;
	m_new = fmaxf(st.m, warp_reduce(sc, op_max()));
	if (m_new == -INFINITY)
		return;
	corr = st.m == -INFINITY ? 0.0f : expf(st.m - m_new);
	pj = row >= 0 ? expf(sc - m_new) : 0.0f;
	st.l = st.l * corr + warp_reduce(pj, op_sum());
#pragma unroll
	for (int i = 0; i < NPL; i++)
		st.acc[i] *= corr;
	for (int jj = 0; jj < cnt; jj++) {
		const float w = __shfl_sync(FULL_WARP, pj, jj);
		const int64_t r = __shfl_sync(FULL_WARP, row, jj);
		const CT *vr = a.vc + r * a.kv.row_len + koff;

		if (w == 0.0f)
			continue;
#pragma unroll
		for (int i = 0; i < NPL; i++)
			if (lane + 32 * i < a.D)
				st.acc[i] += w * widen(vr[lane + 32 * i]);
	}
	st.m = m_new;
}

template <typename CT, int NPL>
__global__ void __launch_bounds__(GEN_WARPS * 32) gen_kernel(gen_args<CT> a)
{
	__shared__ __align__(16) float qs[CUDA_MAX_HEAD_DIM];
	__shared__ float part_acc[GEN_WARPS][CUDA_MAX_HEAD_DIM];
	__shared__ float part_m[GEN_WARPS], part_l[GEN_WARPS];
	__shared__ int bad;
	const int64_t t = blockIdx.x / a.n_heads, at = (int64_t)blockIdx.x * a.D;
	const int h = blockIdx.x % a.n_heads, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int64_t koff = (int64_t)(h / a.group) * a.D;
	const int32_t *blocks = token_blocks(a.kv, t, a.max_pos);
	gen_state<NPL> st = { -INFINITY, 0.0f, {} };
	float M = -INFINITY;

	if (threadIdx.x == 0)
		bad = !blocks;
	for (int d = threadIdx.x; d < a.D; d += blockDim.x)
		qs[d] = a.q[at + d];
	__syncthreads();
	if (blocks) {
		const int n = a.kv.pos[t] + 1;

		for (int base = warp * 32; base < n; base += GEN_WARPS * 32)
			gen_tile<CT, NPL>(a, blocks, koff, qs, base, n, st, &bad);
	}
	if (lane == 0) {
		part_m[warp] = st.m;
		part_l[warp] = st.l;
	}
#pragma unroll
	for (int i = 0; i < NPL; i++)
		if (lane + 32 * i < a.D)
			part_acc[warp][lane + 32 * i] = st.acc[i];
	__syncthreads();
	if (bad) {
		for (int d = threadIdx.x; d < a.D; d += blockDim.x)
			a.out.put(at + d, NAN);
		if (threadIdx.x == 0)
			atomicOr(a.fault, CUDA_FAULT_ATTENTION);
		return;
	}
	for (int w = 0; w < GEN_WARPS; w++)
		M = fmaxf(M, part_m[w]);
	for (int d = threadIdx.x; d < a.D; d += blockDim.x) {
		float L = 0.0f, o = 0.0f;

		for (int w = 0; w < GEN_WARPS; w++) {
			if (part_m[w] == -INFINITY)
				continue;
			const float f = expf(part_m[w] - M);

			L += part_l[w] * f;
			o += part_acc[w][d] * f;
		}
		a.out.put(at + d, o / L);
	}
}

/* Enqueue tokens 0..T-1 (T * n_heads blocks). */
template <typename CT>
static inline void gen_launch(const gen_args<CT> &a, unsigned blocks, cudaStream_t s)
{
	const int npl = (a.D + 31) / 32;

	switch (npl) {
	case 1: gen_kernel<CT, 1><<<blocks, GEN_WARPS * 32, 0, s>>>(a); break;
	case 2: gen_kernel<CT, 2><<<blocks, GEN_WARPS * 32, 0, s>>>(a); break;
	case 3: gen_kernel<CT, 3><<<blocks, GEN_WARPS * 32, 0, s>>>(a); break;
	case 4: gen_kernel<CT, 4><<<blocks, GEN_WARPS * 32, 0, s>>>(a); break;
	case 5: gen_kernel<CT, 5><<<blocks, GEN_WARPS * 32, 0, s>>>(a); break;
	case 6: gen_kernel<CT, 6><<<blocks, GEN_WARPS * 32, 0, s>>>(a); break;
	case 7: gen_kernel<CT, 7><<<blocks, GEN_WARPS * 32, 0, s>>>(a); break;
	default: gen_kernel<CT, 8><<<blocks, GEN_WARPS * 32, 0, s>>>(a); break;
	}
}

#endif
