/* The dense GEMV kernel of cuda_gemv.cu (whose top comment describes its
 * tiling and arithmetic), in a header so that the kernel lab
 * (dev/cuda/gemv_lab.cu) times the very kernel the backend launches.
 */
#ifndef ATLAS_KERNELS_CUDA_GEMV_KERNEL_CUH
#define ATLAS_KERNELS_CUDA_GEMV_KERNEL_CUH

#include <type_traits>

#include "kernels/cuda/cuda_gemv_norm.cuh"
#include "kernels/cuda/cuda_gemv_tile.cuh"
#include "kernels/cuda/cuda_impl.h"

/* The weights of one launch: products of one x (matmul_n), or one. Part
 * i has its blocks after those of the parts before it. */
template <typename B>
struct gemv_parts {
	float *y[KT_MATMUL_MAX_N];               /* [T, N_i] */
	const __nv_bfloat16 *w[KT_MATMUL_MAX_N]; /* [N_i, K] */
	const B *bias[KT_MATMUL_MAX_N];          /* [N_i] or NULL */
	int N[KT_MATMUL_MAX_N];
	int blocks[KT_MATMUL_MAX_N];
	int n;
	gemv_norm norm;   /* XT a gemv_xs: the row's norm (x is then unused) */
};

/* The part that block (or tile) `block` of a launch is in; block becomes
 * its index within that part. */
template <typename B>
__device__ __forceinline__ int gemv_part_of(const gemv_parts<B> &parts, int &block)
{
	int part = 0;

	while (part < parts.n - 1 && block >= parts.blocks[part])
		block -= parts.blocks[part++];
	return part;
}

/* The tile's rows of x: the rows of x, or (XT = gemv_xs, one row) the
 * block's normed row in shared memory, made by the hook below. */
template <int HALVES, typename XT>
__device__ __forceinline__ void gemv_rows_of(const XT *x, int T, int K, int g,
					     const XT *(&xr)[HALVES], bool (&xok)[HALVES])
{
	if constexpr (is_gemv_xs<XT>::value) {
		static_assert(HALVES == 1, "a normed row is one row");
		xr[0] = gemv_norm_row_smem<is_gemv_xs<XT>::nv>();
		xok[0] = g < T;
	} else {
		gemv_x_rows<HALVES>(x, T, K, g, xr, xok);
	}
}

/* gemv_tile_warp's after_wait of a launch that norms its row (THREADS:
 * block_reduce's). */
template <int NV, int THREADS = 0>
struct gemv_norm_hook {
	const gemv_norm *n;
	int K;
	unsigned *ticket;
	float4 (*keep)[NV];

	__device__ __forceinline__ void operator()() const
	{
		gemv_norm_row<NV, THREADS>(*n, gemv_norm_row_smem<NV>(), K, ticket, *keep);
	}
};

/* TT bounds T: 8 (the lower half of one token tile) or 16 (one tile). The
 * explicit 1 block per multiprocessor lets ptxas keep more loads ahead (77
 * registers instead of 62 at TT = 16): 20% faster at 16 tokens on the
 * Qwen3-8B MLP shapes, the same at 8. */
template <int NT, int TT, typename XT, typename B>
__global__ void __launch_bounds__(GEMV_WARPS * 32, GEMV_MIN_BLOCKS(XT))
gemv_kernel(const __grid_constant__ gemv_parts<B> parts, const XT *__restrict__ x, int T, int K)
{
	constexpr int HALVES = TT / 8, D = GEMV_RING_VECTORS / NT, E = NT * 4 * 32;
	static_assert(TT == 8 || TT == 16, "one token tile at most");
	static_assert(E <= D * NT * 32 * 4, "a warp's partial tile fits in its ring");
	__shared__ __align__(16) uint4 ring[GEMV_WARPS][D][NT][32];
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
	int block = blockIdx.x;
	const int part = gemv_part_of(parts, block);

	const __nv_bfloat16 *__restrict__ w = parts.w[part];
	const B *__restrict__ bias = parts.bias[part];
	float *__restrict__ y = parts.y[part];
	const int N = parts.N[part];
	const int64_t n0 = (int64_t)block * 8 * NT;
	const __nv_bfloat16 *wr[NT];
	const XT *xr[HALVES];
	bool wok[NT], xok[HALVES];

#pragma unroll
	for (int nt = 0; nt < NT; nt++) {
		const int64_t r = n0 + nt * 8 + g;

		wok[nt] = r < N;
		wr[nt] = w + (wok[nt] ? r : 0) * K;
	}
	unsigned ticket = 0;
	float4 keep[is_gemv_xs<XT>::nv];

	gemv_rows_of<HALVES>(x, T, K, g, xr, xok);
	if constexpr (is_gemv_xs<XT>::value)
		gemv_tile_warp<NT, HALVES>(ring, warp, lane, w, wr, wok, xr, xok, K,
					   gemv_norm_hook<is_gemv_xs<XT>::nv>{ &parts.norm, K, &ticket, &keep });
	else
		gemv_tile_warp<NT, HALVES>(ring, warp, lane, w, wr, wok, xr, xok, K);
	__syncthreads();
	for (int i = threadIdx.x; i < E; i += blockDim.x) {
		const int l = i % 32, c = i / 32 % 4, nt = i / 128;
		const int t = (l >> 2) + (c >= 2 ? 8 : 0);
		const int64_t r = n0 + nt * 8 + 2 * (l & 3) + (c & 1);

		if (t < T && r < N) {
			float s = gemv_tile_sum<NT>(ring, i);

			if (bias)
				s += widen(bias[r]);
			y[(int64_t)t * N + r] = s;
		}
	}
	if constexpr (is_gemv_xs<XT>::value)
		gemv_norm_finish<is_gemv_xs<XT>::nv>(parts.norm, K, ticket, keep);
}

#endif
