/* The warp's part of the tensor-core GEMV, shared by the dense GEMV
 * (cuda_gemv.cu) and the grouped expert GEMV (cuda_moe_gemv.cuh): a block
 * of GEMV_WARPS warps owns 8·NT rows of w and up to 8·HALVES rows of x;
 * warp v takes the k-steps v, v + GEMV_WARPS, ... of GEMV_KSTEP values and
 * leaves its partial tile in its own ring, and the block sums the warps'
 * tiles in warp order (gemv_tile_sum) after a barrier. How a lane streams
 * w through its cp.async ring and feeds the mma is described at the top of
 * cuda_gemv.cu; the callers only choose the rows: which rows of w (wr, wok)
 * and which rows of x (xr, xok) the tile holds, f32 or bf16 (gemv_x).
 */
#ifndef ATLAS_KERNELS_CUDA_GEMV_TILE_CUH
#define ATLAS_KERNELS_CUDA_GEMV_TILE_CUH

#include <stdint.h>

#include <cuda_bf16.h>

#include "kernels/cuda/cuda_async.cuh"
#include "kernels/cuda/cuda_mma.cuh"
#include "kernels/cuda/cuda_pdl.cuh"

#define GEMV_WARPS 8
#define GEMV_U 4                               /* vectors of a lane per row and k-step */
#define GEMV_KSTEP (32 * GEMV_U)               /* k of one warp step */
#define GEMV_KBLOCK (GEMV_WARPS * GEMV_KSTEP)  /* k of one block step */
#define GEMV_RING_VECTORS 8                    /* D · NT: 16-byte vectors a lane has in flight */

/* A lane's 8 x values of one vector: f32 x (two float4, rounded to bf16
 * when packed for the mma) or bf16 x (one 16-byte load, packed already:
 * the same bits). load: row xr at k, 0 when !ok or past K; pack: the mma's
 * A halves, pairs (0, 1), (2, 3), (4, 5), (6, 7), lo first. */
template <typename XT>
struct gemv_x;

template <>
struct gemv_x<float> {
	float4 v[2];

	__device__ __forceinline__ void load(const float *xr, bool ok, int k, int K)
	{
		if (ok && k < K) {
			v[0] = __ldg((const float4 *)(xr + k));
			v[1] = __ldg((const float4 *)(xr + k) + 1);
		} else {
			v[0] = v[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
		}
	}
	__device__ __forceinline__ void pack(uint32_t (&a)[4]) const
	{
		a[0] = mma_pack_bf16(v[0].x, v[0].y);
		a[1] = mma_pack_bf16(v[0].z, v[0].w);
		a[2] = mma_pack_bf16(v[1].x, v[1].y);
		a[3] = mma_pack_bf16(v[1].z, v[1].w);
	}
};

template <>
struct gemv_x<__nv_bfloat16> {
	uint4 v;

	__device__ __forceinline__ void load(const __nv_bfloat16 *xr, bool ok, int k, int K)
	{
		v = ok && k < K ? __ldg((const uint4 *)(xr + k)) : make_uint4(0u, 0u, 0u, 0u);
	}
	__device__ __forceinline__ void pack(uint32_t (&a)[4]) const
	{
		a[0] = v.x;
		a[1] = v.y;
		a[2] = v.z;
		a[3] = v.w;
	}
};

/* The tile's rows of x for lane row g: row g + 8h of x (h < HALVES), or
 * row 0, marked not ok, past T. */
template <int HALVES, typename XT>
__device__ __forceinline__ void gemv_x_rows(const XT *x, int T, int K, int g,
					    const XT *(&xr)[HALVES], bool (&xok)[HALVES])
{
#pragma unroll
	for (int h = 0; h < HALVES; h++) {
		xok[h] = h * 8 + g < T;
		xr[h] = x + (int64_t)(xok[h] ? h * 8 + g : 0) * K;
	}
}

/* Warp `warp` (lane `lane`) of the block: the products of its k-steps of
 * the tile's x rows xr[h] (h < HALVES; row g + 8h of the tile, xok false:
 * zeros) with the weight rows wr[nt] (row g of n-tile nt; wok false:
 * skipped) into acc, which it then leaves in its ring:
 * ring[warp] as floats [NT·4][32], element (nt·4 + c)·32 + lane is
 * accumulator c of lane `lane` for n-tile nt (token (lane >> 2) + 8·(c >= 2),
 * weight row 2·(lane & 3) + (c & 1)). w: any valid address (the source of
 * masked copies). The caller syncs the block before gemv_tile_sum.
 *
 * Only weights are read before pdl_wait (cuda_pdl.cuh): the ring's first
 * D - 1 vectors, so that a GEMV placed while the kernel before it ends
 * streams its first weights meanwhile; x is read after. (Asking the next
 * vectors into L2 there too, 16 a lane, cost Qwen3-8B 9 % at batch 1 on
 * an H200: docs/perf.md.) after_wait() runs on every thread of the block
 * right after the wait, before x is read: where a launch that norms its
 * row (cuda_gemv_norm.cuh) makes x. */
struct gemv_no_hook {
	__device__ __forceinline__ void operator()() const {}
};

template <int NT, int HALVES, typename XT, typename H = gemv_no_hook>
__device__ __forceinline__ void gemv_tile_warp(uint4 (&ring)[GEMV_WARPS][GEMV_RING_VECTORS / NT][NT][32],
					       int warp, int lane, const __nv_bfloat16 *w,
					       const __nv_bfloat16 *const (&wr)[NT],
					       const bool (&wok)[NT], const XT *const (&xr)[HALVES],
					       const bool (&xok)[HALVES], int K,
					       const H &after_wait = H())
{
	constexpr int D = GEMV_RING_VECTORS / NT;
	const int q = lane & 3;
	const int kw = warp * GEMV_KSTEP + 8 * q;
	const int nv = K > warp * GEMV_KSTEP
			       ? (K - warp * GEMV_KSTEP + GEMV_KBLOCK - 1) / GEMV_KBLOCK * GEMV_U
			       : 0;
	float acc[NT][4];
	gemv_x<XT> xn[HALVES];

#pragma unroll
	for (int nt = 0; nt < NT; nt++)
		acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
	/* k of this lane's vector v */
	auto kof = [&](int v) { return kw + v / GEMV_U * GEMV_KBLOCK + v % GEMV_U * 32; };
	/* one commit group per vector, empty past the end, so that cp_async_wait counts vectors */
	auto issue = [&](int v) {
		if (v < nv) {
			const int k = kof(v);

#pragma unroll
			for (int nt = 0; nt < NT; nt++) {
				const bool ok = wok[nt] && k < K;

				cp_async16(smem_addr(&ring[warp][v % D][nt][lane]),
					   ok ? wr[nt] + k : w, ok);
			}
		}
		cp_async_commit();
	};

#pragma unroll
	for (int d = 0; d < D - 1; d++)
		issue(d);
	pdl_wait();
	pdl_launch_dependents();
	after_wait();
#pragma unroll
	for (int h = 0; h < HALVES; h++)
		xn[h].load(xr[h], xok[h] && nv > 0, kof(0), K);
	for (int v = 0; v < nv; v++) {
		uint32_t xa[HALVES][4];
		uint4 wv[NT];

		issue(v + D - 1);
#pragma unroll
		for (int h = 0; h < HALVES; h++) {
			xn[h].pack(xa[h]);
			xn[h].load(xr[h], xok[h] && v + 1 < nv, kof(v + 1), K);
		}
		cp_async_wait<D - 1>();
#pragma unroll
		for (int nt = 0; nt < NT; nt++)
			wv[nt] = ring[warp][v % D][nt][lane];
#pragma unroll
		for (int s = 0; s < 2; s++) {
			const uint32_t a[4] = { xa[0][2 * s], HALVES > 1 ? xa[HALVES - 1][2 * s] : 0u,
						xa[0][2 * s + 1],
						HALVES > 1 ? xa[HALVES - 1][2 * s + 1] : 0u };

#pragma unroll
			for (int nt = 0; nt < NT; nt++)
				mma_16816(acc[nt], a, s ? wv[nt].z : wv[nt].x, s ? wv[nt].w : wv[nt].y);
		}
	}
	/* The warp's partial tile over its own (now idle) ring. */
	cp_async_wait<0>();
	__syncwarp();
	{
		float *part = (float *)&ring[warp][0][0][0];

#pragma unroll
		for (int nt = 0; nt < NT; nt++)
#pragma unroll
			for (int c = 0; c < 4; c++)
				part[(nt * 4 + c) * 32 + lane] = acc[nt][c];
	}
}

/* Element i of the tile (as gemv_tile_warp lays it out) summed over the
 * warps, in warp order. */
template <int NT>
__device__ __forceinline__ float gemv_tile_sum(const uint4 (&ring)[GEMV_WARPS][GEMV_RING_VECTORS / NT][NT][32],
					       int i)
{
	float s = 0.0f;

#pragma unroll
	for (int v = 0; v < GEMV_WARPS; v++)
		s += ((const float *)&ring[v][0][0][0])[i];
	return s;
}

#endif
