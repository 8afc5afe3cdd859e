/* Prefill attention: the rows of one segment (consecutive positions of one
 * sequence) attend causally to every earlier position of their sequence,
 * on tensor cores (flash-attention style, see cuda_attention_common.cuh).
 *
 * Rows are packed GQA-wise: packed row r of the segment is token r / group,
 * q head kvh * group + r % group, so the heads that share a kv head share
 * each K/V tile. A CTA of WARPS warps takes M = 16 * WARPS packed rows of
 * one kv head (grid x: kv head, y: row tile, the latest rows first since
 * they have the most keys), streams the K/V tiles of keys
 * [0, last position of its rows] through a STAGES-deep cp.async ring, and
 * each warp folds every tile into its 16 rows, skipping the tiles that lie
 * wholly past its rows' positions. q is rounded to bf16; scores, softmax and
 * the output accumulate in f32; P is rounded to bf16 for the PV product.
 *
 * A block id out of range makes the rows whose keys include it NaN and sets
 * CUDA_FAULT_ATTENTION. Each CTA reads its q rows before it writes the same
 * rows of out, so out may be q.
 */
#ifndef ATLAS_KERNELS_CUDA_ATTENTION_PREFILL_CUH
#define ATLAS_KERNELS_CUDA_ATTENTION_PREFILL_CUH

#include <limits.h>

#include "kernels/cuda/cuda_attention_common.cuh"

struct prefill_args {
	att_out out;                  /* [T, n_heads * D] */
	const float *q;               /* [T, n_heads * D] f32 */
	const __nv_bfloat16 *kc, *vc; /* paged caches of n_kv * D cols (paged_kv) */
	const int32_t *blocks;        /* the segment's row of the block table */
	paged_kv kv;                  /* geometry (pos and seq unused) */
	int row0, n_rows, pos0;       /* rows [row0, row0 + n_rows) are positions pos0.. */
	int n_heads, group;           /* group = n_heads / n_kv */
	float sl2;                    /* scale * log2 e */
	unsigned *fault;
};

/* A prefill kernel variant: WARPS warps of 16 rows, a STAGES-deep ring,
 * MINB CTAs per SM asked of the register allocator, softmax steps of SUB keys. */
template <int D, int WARPS, int STAGES, int MINB, int SUB> struct prefill_cfg {
	static constexpr int threads = WARPS * 32;
	static constexpr int rows = WARPS * 16; /* packed rows per CTA */
	static constexpr int smem = STAGES * att_geom<D>::stage_bytes;
	static_assert(ATT_TILE % SUB == 0 && SUB % 16 == 0, "whole 16-key steps");
};

template <int D, int WARPS, int STAGES, int MINB, int SUB>
__global__ void __launch_bounds__(WARPS * 32, MINB) prefill_kernel(prefill_args a)
{
	typedef prefill_cfg<D, WARPS, STAGES, MINB, SUB> cfg;
	constexpr int SB = att_geom<D>::stage_bytes, TB = att_geom<D>::tile_bytes;
	extern __shared__ __align__(16) unsigned char att_smem[];
	__shared__ int bad_from;
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, kvh = blockIdx.x;
	const int packed = a.n_rows * a.group;
	const int r_first = (int)(gridDim.y - 1 - blockIdx.y) * cfg::rows;
	const int key_end = a.pos0 + (min(r_first + cfg::rows, packed) - 1) / a.group + 1;
	const int n_tiles = (key_end + ATT_TILE - 1) / ATT_TILE;
	const int w0 = r_first + warp * 16;
	const int warp_max = w0 < packed ? a.pos0 + min(w0 + 15, packed - 1) / a.group : -1;
	const int64_t ld = (int64_t)a.n_heads * D;
	const uint32_t sm = smem_addr(att_smem);
	warp_rows<D> w;
	int64_t at[2];
	int lim[2];

	pdl_wait();
	pdl_launch_dependents();
#pragma unroll
	for (int i = 0; i < 2; i++) {
		const int r = w0 + (lane >> 2) + 8 * i;

		at[i] = -1;
		lim[i] = -1;
		if (r < packed) {
			at[i] = (int64_t)(a.row0 + r / a.group) * ld +
				(int64_t)(kvh * a.group + r % a.group) * D;
			lim[i] = a.pos0 + r / a.group;
		}
	}
	warp_rows_init<D>(w, at[0] >= 0 ? a.q + at[0] : NULL, at[1] >= 0 ? a.q + at[1] : NULL);
	/* Keys of tile i into ring stage i % STAGES. */
	const auto load = [&](int i) {
		const uint32_t st = sm + (i % STAGES) * SB;

		load_kv_tile<D, cfg::threads>(st, st + TB, a.kc, a.vc, a.blocks, a.kv, kvh,
					      i * ATT_TILE, key_end, &bad_from);
	};

	if (threadIdx.x == 0)
		bad_from = INT_MAX;
	__syncthreads();
#pragma unroll
	for (int i = 0; i < STAGES - 1; i++) {
		if (i < n_tiles)
			load(i);
		cp_async_commit();
	}
	for (int kt = 0; kt < n_tiles; kt++) {
		const uint32_t stg = sm + (kt % STAGES) * SB;

		if (kt + STAGES - 1 < n_tiles)
			load(kt + STAGES - 1);
		cp_async_commit();
		cp_async_wait<STAGES - 1>();
		__syncthreads();
#pragma unroll
		for (int sub = 0; sub < ATT_TILE; sub += SUB)
			if (kt * ATT_TILE + sub <= warp_max)
				warp_attend<D, SUB>(w, stg + sub * att_geom<D>::row_bytes,
						    stg + TB + sub * att_geom<D>::row_bytes,
						    kt * ATT_TILE + sub, lim[0], lim[1], a.sl2);
		__syncthreads();
	}
	warp_rows_finish<D>(w);
#pragma unroll
	for (int i = 0; i < 2; i++) {
		const bool bad = lim[i] >= bad_from;
		const float inv = 1.0f / w.l[i];

		if (at[i] < 0)
			continue;
#pragma unroll
		for (int nd = 0; nd < D / 8; nd++) {
			const float x = w.o[nd][2 * i] * inv, y = w.o[nd][2 * i + 1] * inv;
			const float2 v = bad ? make_float2(NAN, NAN) : make_float2(x, y);

			a.out.put2(at[i] + 8 * nd + 2 * (lane & 3), v);
		}
	}
	if (threadIdx.x == 0 && bad_from != INT_MAX)
		atomicOr(a.fault, CUDA_FAULT_ATTENTION);
}

/* Allow the kernel its dynamic shared memory (once per device, before launches). */
template <int D, int WARPS, int STAGES, int MINB, int SUB>
static inline cudaError_t prefill_setup(void)
{
	return cudaFuncSetAttribute(prefill_kernel<D, WARPS, STAGES, MINB, SUB>,
				    cudaFuncAttributeMaxDynamicSharedMemorySize,
				    prefill_cfg<D, WARPS, STAGES, MINB, SUB>::smem);
}

/* Row tiles of a segment (grid y), or 0 when there are too many for one launch. */
static inline int prefill_tiles(const prefill_args &a, int rows_per_cta)
{
	const int64_t n = ((int64_t)a.n_rows * a.group + rows_per_cta - 1) / rows_per_cta;

	return n > 65535 ? 0 : (int)n;
}

template <int D, int WARPS, int STAGES, int MINB, int SUB>
static inline void prefill_launch(bool pdl, const prefill_args &a, int n_kv, cudaStream_t s)
{
	typedef prefill_cfg<D, WARPS, STAGES, MINB, SUB> cfg;
	const dim3 grid((unsigned)n_kv, (unsigned)prefill_tiles(a, cfg::rows));

	cu_launch(pdl, prefill_kernel<D, WARPS, STAGES, MINB, SUB>, grid, cfg::threads, cfg::smem, s,
		  a);
}

#endif
