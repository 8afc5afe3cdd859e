/* Two hand-written products for the 17..128 rows of decode at batch 17..128
 * (y = x · wᵀ, x [T, K] bf16, w [N, K] bf16, y [T, N] f32), where reading w
 * once is the cost: the kernels skinny_lab.cu measures against cuBLAS. Not
 * in the backend: neither beat cuBLAS on the Qwen3 shapes (results in
 * dev/cuda/README.md); they stay here as the record of what was tried.
 *
 * skinny_kernel<BN, TM, WR, ST, NW>: block (tile, split) owns BN rows of w,
 * all TM tokens (T <= TM) and the split-th of S equal parts of K (K a
 * multiple of SKINNY_BK · S). Its NW warps (8 unless said) stand WR along
 * the rows and NW / WR along the tokens; warp (wr, wt) owns rows
 * wr·BN/WR.. (16 an m-tile) and tokens wt·TM·WR/NW.. (8 an n-tile). w and
 * x pass through a ring of ST stages of SKINNY_BK k in shared memory,
 * filled by cp.async, rows of 128 bytes whose 16-byte chunks are
 * XOR-swizzled by the row so that ldmatrix reads 8 rows without bank
 * conflicts. An mma.sync m16n8k16 takes rows of w as M (A from
 * ldmatrix.x4 of the w stage) and tokens as N (B from ldmatrix.x4 of the x
 * stage, two n-tiles a load). Rows of w past N and tokens past T are
 * zero-filled and never stored. Every block reads its k-range of x from L2:
 * x traffic is (N / BN) · T · K · 2 bytes, as much as w's at BN = TM.
 *
 * skinny_xs_kernel<BN, TM, WR, ST, KC> (x-stationary): block b holds x[:, its
 * split of K] (at most KC wide) in shared memory for its whole life and
 * streams the row tiles p, p + P, ... of w over that split through a ring
 * that runs on from one tile into the next: x is read from L2 once a block.
 *
 * Split K, both: with S > 1 every block stores its partial tile to
 * partial[split][tile] and counts itself in count[tile]; the block that
 * counts last sums the S partials in split order (skinny_sum_splits), writes
 * y and zeroes the count for the next launch. An output's arithmetic is:
 * within a split, f32 accumulation over k in order; then the splits in
 * order. It depends on K and S alone, never on T or on which block finished
 * first, so a row of x gets the same bits for every T, run after run.
 *
 * Before griddepcontrol.wait (kernels/cuda/cuda_pdl.cuh) a block reads only
 * w, as the backend's kernels do, so that the kernels could be launched
 * with programmatic dependent launch there.
 */
#ifndef ATLAS_DEV_CUDA_SKINNY_KERNELS_CUH
#define ATLAS_DEV_CUDA_SKINNY_KERNELS_CUH

#include <stdint.h>

#include <cuda_bf16.h>

#include "kernels/cuda/cuda_async.cuh"
#include "kernels/cuda/cuda_mma.cuh"
#include "kernels/cuda/cuda_pdl.cuh"

#define SKINNY_WARPS 8
#define SKINNY_BK 64 /* k a stage: one 128-byte row of bf16 */

struct skinny_args {
	float *y;                     /* [T, N] */
	float *partial;               /* [S, tiles, BN · TM] when S > 1 */
	unsigned *count;              /* [tiles], zero between launches, when S > 1 */
	const __nv_bfloat16 *w;       /* [N, K] */
	const __nv_bfloat16 *x;       /* [T, K] */
	int T, N, K, S;
};

/* Shared memory of a block: ST stages of w [BN][64] and x [TM][64]. */
template <int BN, int TM, int ST>
constexpr int skinny_smem_bytes(void)
{
	return ST * (BN + TM) * SKINNY_BK * 2;
}

/* Byte offset of 16-byte chunk c of row r in a stage part. */
__device__ __forceinline__ uint32_t skinny_swz(int r, int c)
{
	return (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4));
}

/* v[i] (element i·THREADS + tid of this block's partial tile, i < E) becomes
 * the sum of the S splits' partials in split order; this block's own
 * (split) is v itself, the others are read from partial + q · stride. The
 * loads of one split are issued together, so the sum costs S round trips
 * to L2, not S · E. */
template <int E, int THREADS>
__device__ __forceinline__ void skinny_sum_splits(float *v, const float *partial,
						  int64_t stride, int S, int split, int tid)
{
	float s[E];

	for (int q = 0; q < S; q++) {
		const float *src = partial + q * stride + tid;

#pragma unroll
		for (int i = 0; i < E; i++) {
			const float t = q == split ? v[i] : __ldcg(src + i * THREADS);

			s[i] = q ? s[i] + t : t;
		}
	}
#pragma unroll
	for (int i = 0; i < E; i++)
		v[i] = s[i];
}

/* One stage of SKINNY_BK k: acc[mi][ni] += w rows row0 + 16 mi.. (stage at
 * ws, skinny_swz layout) times tokens tok0 + 8 ni.. (xaddr(t, c): where
 * 16-byte chunk c of the stage's k for token t lies). */
template <int MI, int NI, typename XA>
__device__ __forceinline__ void skinny_stage(float (&acc)[MI][NI][4], uint32_t ws, int row0,
					     int tok0, int lane, XA xaddr)
{
#pragma unroll
	for (int kk = 0; kk < SKINNY_BK / 16; kk++) {
		uint32_t A[MI][4], B[NI / 2][4];

#pragma unroll
		for (int mi = 0; mi < MI; mi++)
			mma_ldsm_x4(ws + skinny_swz(row0 + mi * 16 + (lane & 15), kk * 2 + (lane >> 4)),
				    A[mi]);
#pragma unroll
		for (int nj = 0; nj < NI / 2; nj++) {
			const int m = lane >> 3;

			mma_ldsm_x4(xaddr(tok0 + nj * 16 + (m >> 1) * 8 + (lane & 7), kk * 2 + (m & 1)),
				    B[nj]);
		}
#pragma unroll
		for (int mi = 0; mi < MI; mi++)
#pragma unroll
			for (int ni = 0; ni < NI; ni++)
				mma_16816(acc[mi][ni], A[mi], B[ni / 2][(ni & 1) * 2],
					  B[ni / 2][(ni & 1) * 2 + 1]);
	}
}

/* A split's end of a tile: store this block's partial, count it; the block
 * that counts last (true) gets the sum of the splits in acc and puts the
 * count back to 0. A barrier for the whole block. */
template <int E, int THREADS>
__device__ __forceinline__ bool skinny_split_done(float *acc, float *partial, unsigned *count,
						  int tile, int tiles, int S, int split, int tid,
						  bool &last)
{
	float *mine = partial + ((int64_t)split * tiles + tile) * (E * THREADS);

#pragma unroll
	for (int i = 0; i < E; i++)
		mine[i * THREADS + tid] = acc[i];
	__threadfence();
	__syncthreads();
	if (tid == 0)
		last = atomicAdd(&count[tile], 1u) == (unsigned)S - 1;
	__syncthreads();
	if (!last)
		return false;
	__threadfence();
	skinny_sum_splits<E, THREADS>(acc, partial + (int64_t)tile * (E * THREADS),
				      (int64_t)tiles * (E * THREADS), S, split, tid);
	if (tid == 0)
		count[tile] = 0;
	return true;
}

/* y[t, r] = acc for the warp's rows row0 + 16 mi.. and tokens tok0 + 8 ni.. */
template <int MI, int NI>
__device__ __forceinline__ void skinny_store(const float (&acc)[MI][NI][4], float *y, int64_t row0,
					     int tok0, int N, int T, int lane)
{
	const int g = lane >> 2, q = lane & 3;

#pragma unroll
	for (int mi = 0; mi < MI; mi++)
#pragma unroll
		for (int ni = 0; ni < NI; ni++)
#pragma unroll
			for (int e = 0; e < 4; e++) {
				const int64_t r = row0 + mi * 16 + g + (e >> 1) * 8;
				const int t = tok0 + ni * 8 + 2 * q + (e & 1);

				if (r < N && t < T)
					y[(int64_t)t * N + r] = acc[mi][ni][e];
			}
}

template <int BN, int TM, int WR, int ST, int NW = SKINNY_WARPS>
__global__ void __launch_bounds__(NW * 32)
skinny_kernel(const __grid_constant__ skinny_args a)
{
	constexpr int WT = NW / WR, RM = BN / WR, TN = TM / WT;
	constexpr int MI = RM / 16, NI = TN / 8, THREADS = NW * 32;
	constexpr int W_BYTES = BN * 128, STAGE = (BN + TM) * 128, E = MI * NI * 4;
	static_assert(RM % 16 == 0 && TN % 16 == 0, "whole m-tiles and n-tile pairs a warp");
	extern __shared__ __align__(128) unsigned char skinny_smem[];
	__shared__ bool last;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int wr = warp % WR, wt = warp / WR;
	const int tile = blockIdx.x, split = blockIdx.y, tiles = gridDim.x;
	const int N = a.N, K = a.K, T = a.T;
	const int kper = K / a.S, nk = kper / SKINNY_BK;
	const int64_t n0 = (int64_t)tile * BN;
	const uint32_t base = smem_addr(skinny_smem);
	const __nv_bfloat16 *__restrict__ w = a.w + (int64_t)split * kper;
	const __nv_bfloat16 *__restrict__ x = a.x + (int64_t)split * kper;
	float acc[MI][NI][4];

	auto load_w = [&](int kt) {
		const uint32_t st = base + (kt % ST) * STAGE;

#pragma unroll
		for (int j = 0; j < (BN * 8 + THREADS - 1) / THREADS; j++) {
			const int i = tid + j * THREADS, r = i >> 3, c = i & 7;
			const bool ok = n0 + r < N;

			if (BN * 8 % THREADS && i >= BN * 8)
				break;

			cp_async16(st + skinny_swz(r, c),
				   w + (ok ? n0 + r : 0) * K + kt * SKINNY_BK + c * 8, ok);
		}
	};
	auto load_x = [&](int kt) {
		const uint32_t st = base + (kt % ST) * STAGE + W_BYTES;

#pragma unroll
		for (int j = 0; j < (TM * 8 + THREADS - 1) / THREADS; j++) {
			const int i = tid + j * THREADS, r = i >> 3, c = i & 7;
			const bool ok = r < T;

			if (TM * 8 % THREADS && i >= TM * 8)
				break;

			cp_async16(st + skinny_swz(r, c),
				   x + (int64_t)(ok ? r : 0) * K + kt * SKINNY_BK + c * 8, ok);
		}
	};

#pragma unroll
	for (int mi = 0; mi < MI; mi++)
#pragma unroll
		for (int ni = 0; ni < NI; ni++)
			acc[mi][ni][0] = acc[mi][ni][1] = acc[mi][ni][2] = acc[mi][ni][3] = 0.0f;

	/* Group 0: the w of stages 0..D-2 and the x of stage 0; group s: the x of stage s. */
#pragma unroll
	for (int s = 0; s < ST - 1; s++)
		if (s < nk)
			load_w(s);
	pdl_wait();
	pdl_launch_dependents();
#pragma unroll
	for (int s = 0; s < ST - 1; s++) {
		if (s < nk)
			load_x(s);
		cp_async_commit();
	}

	for (int kt = 0; kt < nk; kt++) {
		const uint32_t ws = base + (kt % ST) * STAGE, xs = ws + W_BYTES;

		cp_async_wait<ST - 2>();
		__syncthreads();
		if (kt + ST - 1 < nk) {
			load_w(kt + ST - 1);
			load_x(kt + ST - 1);
		}
		cp_async_commit();
		skinny_stage<MI, NI>(acc, ws, wr * RM, wt * TN, lane,
				     [&](int t, int c) { return xs + skinny_swz(t, c); });
	}
	cp_async_wait<0>();
	if (a.S > 1 && !skinny_split_done<E, THREADS>(&acc[0][0][0], a.partial, a.count, tile, tiles,
						      a.S, split, tid, last))
		return;
	skinny_store<MI, NI>(acc, a.y, n0 + wr * RM, wt * TN, N, T, lane);
}

/* ---- x-stationary: x's k-chunk held in shared memory, w streamed ---------- */

struct skinny_xs_args {
	float *y;                     /* [T, N] */
	float *partial;               /* [S, tiles, BN · TM] when S > 1 */
	unsigned *count;              /* [tiles], zero between launches, when S > 1 */
	const __nv_bfloat16 *w;       /* [N, K] */
	const __nv_bfloat16 *x;       /* [T, K] */
	int T, N, K, S, P;            /* grid: P · S blocks */
};

template <int BN, int TM, int ST, int KC>
constexpr int skinny_xs_smem_bytes(void)
{
	return TM * KC * 2 + ST * BN * 128;
}

/* Block b takes split s = b / P of K (kc = K / S wide, at most KC), holds
 * x[:, its kc] in shared memory, and streams the row tiles p, p + P, ... (p
 * = b % P) of w over that split through a ring of ST stages that runs on
 * from one tile into the next. */
template <int BN, int TM, int WR, int ST, int KC>
__global__ void __launch_bounds__(SKINNY_WARPS * 32, 1)
skinny_xs_kernel(const __grid_constant__ skinny_xs_args a)
{
	constexpr int WT = SKINNY_WARPS / WR, RM = BN / WR, TN = TM / WT;
	constexpr int MI = RM / 16, NI = TN / 8, THREADS = SKINNY_WARPS * 32;
	constexpr int W_STAGE = BN * 128, X_ROW = KC * 2, E = MI * NI * 4;
	static_assert(RM % 16 == 0 && TN % 16 == 0, "whole m-tiles and n-tile pairs a warp");
	static_assert(BN * 8 % THREADS == 0, "whole chunks a thread");
	extern __shared__ __align__(128) unsigned char skinny_smem[];
	__shared__ bool last;
	const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const int wr = warp % WR, wt = warp / WR;
	const int split = blockIdx.x / a.P, p = blockIdx.x % a.P;
	const int N = a.N, K = a.K, T = a.T, S = a.S, P = a.P;
	const int kc = K / S, nk = kc / SKINNY_BK, tiles = (N + BN - 1) / BN;
	const int mine = p < tiles ? (tiles - 1 - p) / P + 1 : 0, total = mine * nk;
	const uint32_t xbase = smem_addr(skinny_smem), ring = xbase + TM * X_ROW;
	const __nv_bfloat16 *__restrict__ w = a.w + (int64_t)split * kc;
	const __nv_bfloat16 *__restrict__ x = a.x + (int64_t)split * kc;
	float acc[MI][NI][4];

	/* stage j: k-step j % nk of tile p + (j / nk) · P */
	auto load_w = [&](int j) {
		const uint32_t st = ring + (j % ST) * W_STAGE;
		const int64_t n0 = (int64_t)(p + j / nk * P) * BN;
		const int k0 = j % nk * SKINNY_BK;

#pragma unroll
		for (int i = 0; i < BN * 8 / THREADS; i++) {
			const int e = tid + i * THREADS, r = e >> 3, c = e & 7;
			const bool ok = n0 + r < N;

			cp_async16(st + skinny_swz(r, c), w + (ok ? n0 + r : 0) * K + k0 + c * 8, ok);
		}
	};
	/* x chunk c (16 bytes) of token t at (c & ~7) | ((c ^ t) & 7) of its row */
	auto xaddr = [&](int t, int c) {
		return xbase + (uint32_t)(t * X_ROW + (((c & ~7) | ((c ^ t) & 7)) << 4));
	};
	auto zero = [&]() {
#pragma unroll
		for (int mi = 0; mi < MI; mi++)
#pragma unroll
			for (int ni = 0; ni < NI; ni++)
				acc[mi][ni][0] = acc[mi][ni][1] = acc[mi][ni][2] = acc[mi][ni][3] = 0.0f;
	};

	zero();
	/* group 0: w of stages 0..ST-2 and all of x; groups 1..ST-2 empty */
	for (int j = 0; j < ST - 1 && j < total; j++)
		load_w(j);
	pdl_wait();
	pdl_launch_dependents();
	if (total)
		for (int e = tid; e < TM * (kc / 8); e += THREADS) {
			const int t = e / (kc / 8), c = e % (kc / 8);
			const bool ok = t < T;

			cp_async16(xaddr(t, c), x + (int64_t)(ok ? t : 0) * K + c * 8, ok);
		}
#pragma unroll
	for (int j = 0; j < ST - 1; j++)
		cp_async_commit();

	for (int j = 0; j < total; j++) {
		const uint32_t ws = ring + (j % ST) * W_STAGE;
		const int kt = j % nk;

		cp_async_wait<ST - 2>();
		__syncthreads();
		if (j + ST - 1 < total)
			load_w(j + ST - 1);
		cp_async_commit();
		skinny_stage<MI, NI>(acc, ws, wr * RM, wt * TN, lane,
				     [&](int t, int c) { return xaddr(t, kt * 8 + c); });
		if (kt < nk - 1)
			continue;

		/* the tile's last k-step: its partial, or its sum over the splits, out */
		{
			const int tile = p + j / nk * P;

			if (S == 1 || skinny_split_done<E, THREADS>(&acc[0][0][0], a.partial, a.count,
								     tile, tiles, S, split, tid, last))
				skinny_store<MI, NI>(acc, a.y, (int64_t)tile * BN + wr * RM, wt * TN, N,
						     T, lane);
		}
		zero();
	}
	cp_async_wait<0>();
}

#endif
