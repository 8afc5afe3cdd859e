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
 *
 * The wide variant (MT > 1, prefill_wide_kernel) gives a warp MT m-tiles of
 * 16 rows instead of one. Why: each ldmatrix of a K or V fragment then
 * feeds MT mmas instead of one. At one m-tile a warp reads 16 bytes of
 * shared memory per 256 flops (a multiprocessor's 128 bytes a clock feed
 * half the tensor cores' rate), and every warp of a CTA reads the whole
 * K/V tile. Its q rows do not fit the registers beside MT accumulators, so
 * the CTA rounds them to bf16 into shared memory once (rows of D + 8, as
 * the K tiles) and the warps load their A fragments from there at each
 * 16-dim step. A row's arithmetic is the same as at one m-tile, in the
 * same order: the same bits. A CTA holds twice the rows, so a short
 * segment's grid leaves multiprocessors idle, and a causal segment's
 * latest CTA runs longer; cuda_attention.cu gives it the segments where
 * prefill_wide_pays estimates that its rate makes up for that.
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

/* A prefill kernel variant: WARPS warps of MT m-tiles of 16 rows, a
 * STAGES-deep ring, MINB CTAs per SM asked of the register allocator,
 * softmax steps of SUB keys. Shared memory: the ring, then (MT > 1) the
 * CTA's q rows. */
template <int D, int WARPS, int STAGES, int MINB, int SUB, int MT = 1> struct prefill_cfg {
	static constexpr int threads = WARPS * 32;
	static constexpr int rows = WARPS * 16 * MT; /* packed rows per CTA */
	static constexpr int q_bytes = MT > 1 ? rows * att_geom<D>::row_bytes : 0;
	static constexpr int smem = STAGES * att_geom<D>::stage_bytes + q_bytes;
	static_assert(ATT_TILE % SUB == 0 && SUB % 16 == 0, "whole 16-key steps");
	static_assert(MT >= 1, "at least one m-tile a warp");
};

/* The K/V ring of a prefill CTA of NT threads: tile i (keys [i·ATT_TILE,
 * (i + 1)·ATT_TILE) of kv head kvh, zero from key_end) goes to stage i %
 * STAGES at shared address sm (STAGES stages of att_geom<D>::stage_bytes,
 * K then V). */
template <int D, int NT, int STAGES> struct prefill_ring {
	const prefill_args &a;
	uint32_t sm;
	int kvh, key_end, n_tiles;
	int *bad_from; /* shared: the smallest key in a bad block */

	__device__ __forceinline__ void load(int i) const
	{
		const uint32_t st = sm + (i % STAGES) * att_geom<D>::stage_bytes;

		load_kv_tile<D, NT>(st, st + att_geom<D>::tile_bytes, a.kc, a.vc, a.blocks, a.kv,
				    kvh, i * ATT_TILE, key_end, bad_from);
	}

	/* Reset *bad_from, then ask for the first STAGES - 1 tiles. */
	__device__ __forceinline__ void start() const
	{
		if (threadIdx.x == 0)
			*bad_from = INT_MAX;
		__syncthreads();
#pragma unroll
		for (int i = 0; i < STAGES - 1; i++) {
			if (i < n_tiles)
				load(i);
			cp_async_commit();
		}
	}

	/* attend(stage address, kt) for each tile kt in turn, by every thread
	 * once the tile has landed; the ring refills behind it. */
	template <typename F> __device__ __forceinline__ void run(F attend) const
	{
		for (int kt = 0; kt < n_tiles; kt++) {
			if (kt + STAGES - 1 < n_tiles)
				load(kt + STAGES - 1);
			cp_async_commit();
			cp_async_wait<STAGES - 1>();
			__syncthreads();
			attend(sm + (kt % STAGES) * att_geom<D>::stage_bytes, kt);
			__syncthreads();
		}
	}
};

template <int D, int WARPS, int STAGES, int MINB, int SUB>
__global__ void __launch_bounds__(WARPS * 32, MINB) prefill_kernel(prefill_args a)
{
	typedef prefill_cfg<D, WARPS, STAGES, MINB, SUB> cfg;
	constexpr int TB = att_geom<D>::tile_bytes, RB = att_geom<D>::row_bytes;
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
	const prefill_ring<D, cfg::threads, STAGES> ring = { a, smem_addr(att_smem), kvh, key_end,
							     n_tiles, &bad_from };
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
	ring.start();
	ring.run([&](uint32_t stg, int kt) {
#pragma unroll
		for (int sub = 0; sub < ATT_TILE; sub += SUB)
			if (kt * ATT_TILE + sub <= warp_max)
				warp_attend<D, SUB>(w, stg + sub * RB, stg + TB + sub * RB,
						    kt * ATT_TILE + sub, lim[0], lim[1], a.sl2);
	});
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

/* A warp's MT m-tiles of 16 rows (the wide variant): per m-tile what
 * warp_rows holds but q, which stays in shared memory. */
template <int D, int MT> struct warp_tiles {
	float o[MT][D / 8][4]; /* accumulators, m-tile mt's rows g, g + 8 */
	float m[MT][2], l[MT][2];
};

/* warp_attend for MT m-tiles whose q rows (bf16, rows of D + 8) start at
 * shared address qs: each K and V fragment feeds every m-tile. Row g (g +
 * 8) of m-tile mt sees positions up to lim[mt][0] (lim[mt][1]). */
template <int D, int NK, int MT>
__device__ __forceinline__ void warp_attend_tiles(warp_tiles<D, MT> &w, uint32_t qs, uint32_t ks,
						  uint32_t vs, int key0, const int (&lim)[MT][2],
						  float sl2)
{
	constexpr int RB = att_geom<D>::row_bytes;
	const int lane = threadIdx.x & 31, mat = lane >> 3, r8 = lane & 7;
	const int c0 = key0 + 2 * (lane & 3);
	float s[MT][NK / 8][4];

	/* ldmatrix row addresses: q as A (rows lane % 16, dims 8 (lane / 16)
	 * on), K and V as warp_attend reads them */
	qs += (lane & 15) * RB + (lane >> 4) * 16;
	ks += ((mat >> 1) * 8 + r8) * RB + (mat & 1) * 16;
	vs += ((mat & 1) * 8 + r8) * RB + (mat >> 1) * 16;

#pragma unroll
	for (int mt = 0; mt < MT; mt++)
#pragma unroll
		for (int i = 0; i < NK / 8; i++)
			s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.0f;
#pragma unroll
	for (int kk = 0; kk < D / 16; kk++) {
		uint32_t a[MT][4];

#pragma unroll
		for (int mt = 0; mt < MT; mt++)
			ldsm_x4(qs + mt * 16 * RB + 32 * kk, a[mt]);
#pragma unroll
		for (int np = 0; np < NK / 16; np++) {
			uint32_t b[4];

			ldsm_x4(ks + 16 * np * RB + 32 * kk, b);
#pragma unroll
			for (int mt = 0; mt < MT; mt++) {
				mma_bf16(s[mt][2 * np], a[mt], b[0], b[1]);
				mma_bf16(s[mt][2 * np + 1], a[mt], b[2], b[3]);
			}
		}
	}
#pragma unroll
	for (int mt = 0; mt < MT; mt++)
		softmax_tile<D, NK>(s[mt], w.o[mt], w.m[mt], w.l[mt], c0, lim[mt][0], lim[mt][1],
				    sl2);
#pragma unroll
	for (int kk = 0; kk < NK / 16; kk++) {
		uint32_t a[MT][4];

#pragma unroll
		for (int mt = 0; mt < MT; mt++) {
			a[mt][0] = pack_bf16(s[mt][2 * kk][0], s[mt][2 * kk][1]);
			a[mt][1] = pack_bf16(s[mt][2 * kk][2], s[mt][2 * kk][3]);
			a[mt][2] = pack_bf16(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
			a[mt][3] = pack_bf16(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
		}
#pragma unroll
		for (int np = 0; np < D / 16; np++) {
			uint32_t b[4];

			ldsm_x4_trans(vs + 16 * kk * RB + 32 * np, b);
#pragma unroll
			for (int mt = 0; mt < MT; mt++) {
				mma_bf16(w.o[mt][2 * np], a[mt], b[0], b[1]);
				mma_bf16(w.o[mt][2 * np + 1], a[mt], b[2], b[3]);
			}
		}
	}
}

/* prefill_kernel with MT m-tiles a warp and q in shared memory (the top
 * says why). */
template <int D, int WARPS, int STAGES, int MINB, int SUB, int MT>
__global__ void __launch_bounds__(WARPS * 32, MINB) prefill_wide_kernel(prefill_args a)
{
	typedef prefill_cfg<D, WARPS, STAGES, MINB, SUB, MT> cfg;
	constexpr int SB = att_geom<D>::stage_bytes, TB = att_geom<D>::tile_bytes;
	constexpr int RB = att_geom<D>::row_bytes, WR = 16 * MT; /* rows a warp */
	extern __shared__ __align__(16) unsigned char att_smem[];
	__shared__ int bad_from;
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, kvh = blockIdx.x;
	const int packed = a.n_rows * a.group;
	const int r_first = (int)(gridDim.y - 1 - blockIdx.y) * cfg::rows;
	const int key_end = a.pos0 + (min(r_first + cfg::rows, packed) - 1) / a.group + 1;
	const int n_tiles = (key_end + ATT_TILE - 1) / ATT_TILE;
	const int w0 = r_first + warp * WR;
	const int warp_max = w0 < packed ? a.pos0 + min(w0 + WR - 1, packed - 1) / a.group : -1;
	const int64_t ld = (int64_t)a.n_heads * D;
	const uint32_t sm = smem_addr(att_smem), qs = sm + STAGES * SB + warp * WR * RB;
	unsigned char *const q_tile = att_smem + STAGES * SB;
	const prefill_ring<D, cfg::threads, STAGES> ring = { a, sm, kvh, key_end, n_tiles,
							     &bad_from };
	warp_tiles<D, MT> w;
	int lim[MT][2]; /* -1 for a padding row */

	pdl_wait();
	pdl_launch_dependents();
	ring.start();
	/* While the first tiles come: the CTA's q rows into shared memory as
	 * bf16 (padding rows zero), rounded as warp_rows_init rounds them,
	 * QB loads a thread in flight at once (the first iteration's barrier
	 * makes them visible). */
	constexpr int QV = cfg::rows * (D / 4) / cfg::threads, QB = 16;
	static_assert(QV % QB == 0, "whole batches of q loads");
	for (int b0 = 0; b0 < QV; b0 += QB) {
		float4 x[QB];

#pragma unroll
		for (int j = 0; j < QB; j++) {
			const int c = (int)threadIdx.x + (b0 + j) * cfg::threads;
			const int r = r_first + c / (D / 4);

			x[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
			if (r < packed)
				x[j] = *(const float4 *)(a.q + (int64_t)(a.row0 + r / a.group) * ld +
							 (int64_t)(kvh * a.group + r % a.group) * D +
							 4 * (c % (D / 4)));
		}
#pragma unroll
		for (int j = 0; j < QB; j++) {
			const int c = (int)threadIdx.x + (b0 + j) * cfg::threads;

			*(uint2 *)(q_tile + (c / (D / 4)) * RB + 8 * (c % (D / 4))) =
				make_uint2(pack_bf16(x[j].x, x[j].y), pack_bf16(x[j].z, x[j].w));
		}
	}
#pragma unroll
	for (int mt = 0; mt < MT; mt++)
#pragma unroll
		for (int i = 0; i < 2; i++) {
			const int r = w0 + 16 * mt + (lane >> 2) + 8 * i;

			lim[mt][i] = r < packed ? a.pos0 + r / a.group : -1;
			w.m[mt][i] = -INFINITY;
			w.l[mt][i] = 0.0f;
		}
#pragma unroll
	for (int mt = 0; mt < MT; mt++)
#pragma unroll
		for (int i = 0; i < D / 8; i++)
			w.o[mt][i][0] = w.o[mt][i][1] = w.o[mt][i][2] = w.o[mt][i][3] = 0.0f;
	ring.run([&](uint32_t stg, int kt) {
#pragma unroll
		for (int sub = 0; sub < ATT_TILE; sub += SUB)
			if (kt * ATT_TILE + sub <= warp_max)
				warp_attend_tiles<D, SUB, MT>(w, qs, stg + sub * RB,
							      stg + TB + sub * RB,
							      kt * ATT_TILE + sub, lim, a.sl2);
	});
#pragma unroll
	for (int mt = 0; mt < MT; mt++)
#pragma unroll
		for (int i = 0; i < 2; i++) {
			const int r = w0 + 16 * mt + (lane >> 2) + 8 * i;
			const int64_t at = (int64_t)(a.row0 + r / a.group) * ld +
					   (int64_t)(kvh * a.group + r % a.group) * D;
			float l = w.l[mt][i];

			l += __shfl_xor_sync(FULL_WARP, l, 1);
			l += __shfl_xor_sync(FULL_WARP, l, 2);
			const bool bad = lim[mt][i] >= bad_from;
			const float inv = 1.0f / l;

			if (r >= packed)
				continue;
#pragma unroll
			for (int nd = 0; nd < D / 8; nd++) {
				const float x = w.o[mt][nd][2 * i] * inv;
				const float y = w.o[mt][nd][2 * i + 1] * inv;
				const float2 v = bad ? make_float2(NAN, NAN) : make_float2(x, y);

				a.out.put2(at + 8 * nd + 2 * (lane & 3), v);
			}
		}
	if (threadIdx.x == 0 && bad_from != INT_MAX)
		atomicOr(a.fault, CUDA_FAULT_ATTENTION);
}

/* Allow the kernel its dynamic shared memory (once per device, before
 * launches): prefill_kernel at one m-tile a warp, else the wide one. */
template <int D, int WARPS, int STAGES, int MINB, int SUB, int MT = 1>
static inline cudaError_t prefill_setup(void)
{
	constexpr int smem = prefill_cfg<D, WARPS, STAGES, MINB, SUB, MT>::smem;

	if constexpr (MT == 1)
		return cudaFuncSetAttribute(prefill_kernel<D, WARPS, STAGES, MINB, SUB>,
					    cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
	else
		return cudaFuncSetAttribute(prefill_wide_kernel<D, WARPS, STAGES, MINB, SUB, MT>,
					    cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
}

/* Row tiles of a segment (grid y), or 0 when there are too many for one launch. */
static inline int prefill_tiles(const prefill_args &a, int rows_per_cta)
{
	const int64_t n = ((int64_t)a.n_rows * a.group + rows_per_cta - 1) / rows_per_cta;

	return n > 65535 ? 0 : (int)n;
}

/* The wide variant's rate per CTA against one m-tile a warp, when both
 * grids keep every multiprocessor busy: 239 against 183 TFLOP/s on
 * Qwen3-8B's prompt of 8,192 tokens in chunks of 2,048, H200
 * (dev/cuda/attention_prefill.cu, 2026-12-02). */
#define PREFILL_WIDE_GAIN 1.3

/* Whether a segment ends sooner in CTAs of rows_wide packed rows (at
 * PREFILL_WIDE_GAIN times the rate) than of rows_narrow, on sms
 * multiprocessors that run one CTA each. A grid's time is taken as the
 * larger of its longest CTA (the latest rows, which see every key: rows ·
 * keys) and the work of all its CTAs (packed rows · their mean keys, for
 * every kv head) spread over the multiprocessors: the latest rows go
 * first, so the shorter CTAs fill in around the longest ones. A segment
 * that fills no wide CTA stays narrow. */
static inline bool prefill_wide_pays(const prefill_args &a, int n_kv, int sms, int rows_narrow,
				     int rows_wide)
{
	const double packed = (double)a.n_rows * a.group, keys = (double)a.pos0 + a.n_rows;
	const double spread = n_kv * packed * (a.pos0 + 0.5 * a.n_rows) / sms;
	const double narrow = fmax(rows_narrow * keys, spread);
	const double wide = fmax(rows_wide * keys, spread) / PREFILL_WIDE_GAIN;

	return packed >= rows_wide && wide < narrow;
}

template <int D, int WARPS, int STAGES, int MINB, int SUB, int MT = 1>
static inline void prefill_launch(bool pdl, const prefill_args &a, int n_kv, cudaStream_t s)
{
	typedef prefill_cfg<D, WARPS, STAGES, MINB, SUB, MT> cfg;
	const dim3 grid((unsigned)n_kv, (unsigned)prefill_tiles(a, cfg::rows));

	if constexpr (MT == 1)
		cu_launch(pdl, prefill_kernel<D, WARPS, STAGES, MINB, SUB>, grid, cfg::threads,
			  cfg::smem, s, a);
	else
		cu_launch(pdl, prefill_wide_kernel<D, WARPS, STAGES, MINB, SUB, MT>, grid,
			  cfg::threads, cfg::smem, s, a);
}

#endif
