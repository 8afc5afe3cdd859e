/* The grouped expert GEMV: moe_matmul for few rows per expert (decode),
 * reading each active expert's weight once for all its rows. Used by
 * cuda_moe_matmul.cu and measured by dev/cuda/moe_bench.cu.
 *
 * Shapes: y [R, N] f32 (R = T*k sorted rows), x [T, K] f32 token rows
 * (k > 0: sorted row i reads x[order[i] / k]) or [R, K] sorted rows (k ==
 * 0), w [n_local * N, K] bf16 (expert e's [N, K] at rows (e - e0) * N),
 * order [R] and offsets [E + 1] i32 from moe_route. Needs K % 8 == 0 and
 * x, w 16-byte aligned (16-byte loads); any N.
 *
 * Arithmetic: as the dense GEMV (cuda_gemv.cu): x rounded to bf16 in
 * registers, bf16 × bf16 products exact in f32, f32 accumulation; a row's
 * result depends on K alone, not on the other rows of its expert.
 *
 * Launch: grid (ceil(N / 8·NT), tiles), GEMV_WARPS warps. Block (bx, s)
 * finds tile s of the plan (cuda_moe.cuh: at most TT rows of one local
 * expert, every warp on its own, no barrier) and computes those rows × the
 * 8·NT weight rows n0 = 8·NT·bx ..: the block of the dense GEMV
 * (cuda_gemv_tile.cuh, the same warp code) with the tile's rows as its
 * tokens. An expert with more than TT rows has several tiles, adjacent in
 * the grid: its weight comes from HBM once and from L2 after.
 */
#ifndef ATLAS_KERNELS_CUDA_MOE_GEMV_CUH
#define ATLAS_KERNELS_CUDA_MOE_GEMV_CUH

#include "kernels/cuda/cuda_gemv_tile.cuh"
#include "kernels/cuda/cuda_moe.cuh"

/* NT: n-tiles of 8 weight rows a block; TT: rows a tile (8 or 16). Params
 * as in the header; slot0: the tile of blockIdx.y 0 (launches of more than
 * 65535 tiles go in parts); fault: the backend's fault word. */
template <int NT, int TT>
__global__ void __launch_bounds__(GEMV_WARPS * 32, 1)
moe_gemv_kernel(float *__restrict__ y, const float *__restrict__ x,
		const __nv_bfloat16 *__restrict__ w, const int32_t *__restrict__ order,
		const int32_t *__restrict__ offsets, int R, int N, int K, int k, int e0, int n_local,
		int64_t slot0, unsigned *fault)
{
	constexpr int HALVES = TT / 8, D = GEMV_RING_VECTORS / NT, NOUT = NT * 4 * 32;
	static_assert(TT == 8 || TT == 16, "one token tile at most");
	static_assert(NOUT <= D * NT * 32 * 4, "a warp's partial tile fits in its ring");
	__shared__ __align__(16) uint4 ring[GEMV_WARPS][D][NT][32];
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
	const moe_tile tile = moe_find_tile(offsets, e0, n_local, R, TT, slot0 + blockIdx.y,
					    CUDA_FAULT_MOE_MATMUL, fault);
	const int64_t n0 = (int64_t)blockIdx.x * 8 * NT;
	const __nv_bfloat16 *we;
	const __nv_bfloat16 *wr[NT];
	const float *xr[HALVES];
	bool wok[NT], xok[HALVES];

	if (!tile.rows)
		return; /* past the last tile: the whole block (every warp found the same) */
	we = w + (int64_t)(tile.e - e0) * N * K;
#pragma unroll
	for (int nt = 0; nt < NT; nt++) {
		const int64_t r = n0 + nt * 8 + g;

		wok[nt] = r < N;
		wr[nt] = we + (wok[nt] ? r : 0) * K;
	}
#pragma unroll
	for (int h = 0; h < HALVES; h++) {
		const int t = h * 8 + g;
		const int src = t < tile.rows ? moe_src_row(order, tile.row0 + t, k, R) : 0;

		if (src < 0 && q == 0)
			atomicOr(fault, CUDA_FAULT_MOE_MATMUL);
		xok[h] = t < tile.rows && src >= 0;
		xr[h] = x + (int64_t)(xok[h] ? src : 0) * K;
	}
	gemv_tile_warp<NT, HALVES>(ring, warp, lane, w, wr, wok, xr, xok, K);
	__syncthreads();
	for (int i = threadIdx.x; i < NOUT; i += blockDim.x) {
		const int l = i % 32, c = i / 32 % 4, nt = i / 128;
		const int t = (l >> 2) + (c >= 2 ? 8 : 0);
		const int64_t r = n0 + nt * 8 + 2 * (l & 3) + (c & 1);

		if (t < tile.rows && r < N)
			y[(int64_t)(tile.row0 + t) * N + r] = gemv_tile_sum<NT>(ring, i);
	}
}

/* The GEMV takes these operands: K % 8 == 0, x and w 16-byte aligned. */
static inline bool moe_gemv_fits(const void *x, const void *w, int64_t K)
{
	return K % 8 == 0 && (uintptr_t)x % 16 == 0 && (uintptr_t)w % 16 == 0;
}

/* Enqueue the GEMV on stream, the plan's tiles in launches of at most
 * 65535; arguments as the kernel's, checked by the caller. */
template <int NT, int TT>
static cudaError_t moe_gemv_launch(cudaStream_t stream, float *y, const float *x,
				   const __nv_bfloat16 *w, const int32_t *order,
				   const int32_t *offsets, int R, int N, int K, int k, int e0,
				   int n_local, unsigned *fault)
{
	const int64_t tiles = moe_max_tiles(R, n_local, TT);
	const unsigned nx = (unsigned)(((int64_t)N + 8 * NT - 1) / (8 * NT));

	for (int64_t s0 = 0; s0 < tiles; s0 += 65535) {
		const unsigned ny = (unsigned)(tiles - s0 < 65535 ? tiles - s0 : 65535);

		moe_gemv_kernel<NT, TT><<<dim3(nx, ny), GEMV_WARPS * 32, 0, stream>>>(
			y, x, w, order, offsets, R, N, K, k, e0, n_local, s0, fault);
	}
	return cudaGetLastError();
}

#endif
