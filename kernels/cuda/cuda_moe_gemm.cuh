/* The grouped expert GEMM: moe_matmul for many rows per expert (prefill),
 * a tensor-core tiled product over the plan's padded row tiles. Used by
 * cuda_moe_matmul.cu and measured by dev/cuda/moe_bench.cu.
 *
 * Shapes: y [R, N] f32 (R = T*k sorted rows), x [T, K] f32 token rows
 * (k > 0: sorted row i reads x[order[i] / k]) or [R, K] sorted rows (k ==
 * 0), w [n_local * N, K] bf16 (expert e's [N, K] at rows (e - e0) * N),
 * order [R] and offsets [E + 1] i32 from moe_route. Needs K % 8 == 0 and
 * x, w 16-byte aligned; any N, any rows per expert.
 *
 * Arithmetic: the function of the dense matmul: x rounded to bf16, bf16 ×
 * bf16 products exact in f32, f32 accumulation (mma.sync m16n8k16).
 *
 * Launch: grid (ceil(N / MOE_GEMM_BN), tiles), 256 threads, dynamic shared
 * memory moe_gemm_smem(BM) (above 48 KB: moe_gemm_prepare raises the
 * limit once). Block (bx, s) finds tile s of the plan (cuda_moe.cuh: at
 * most BM rows of one local expert; blocks past the last tile return) and
 * computes y[rows, n0 .. n0 + BN) with n0 = BN·bx, K in steps of BK = 32:
 *  - w: the BN × BK bf16 tile comes by cp.async into a ring of
 *    MOE_GEMM_STAGES stages, STAGES - 1 steps ahead; thread t copies 16
 *    bytes of weight rows t / 4 and t / 4 + 64 (zero past N or K);
 *  - x: thread t loads 4 f32 of rows t / 8 + 32 j (j < BM / 32) through the
 *    plan's gather, one step ahead in registers, rounds them to bf16 and
 *    stores them into the A stage of the next step (zero past the tile's
 *    rows or K);
 *  - warps 2 (M) × 4 (N): warp (wm, wn) owns rows wm·BM/2 .., columns
 *    wn·32 ..: BM/32 × 4 mma tiles of 16 × 8, fragments by ldmatrix.x4 from
 *    stage rows of BK + 8 bf16 (80 bytes: the 8 rows of an ldmatrix phase
 *    fall in distinct banks).
 * One barrier a step: after it the step's A and B stages are complete and
 * every warp has left the step before, whose stages are refilled.
 */
#ifndef ATLAS_KERNELS_CUDA_MOE_GEMM_CUH
#define ATLAS_KERNELS_CUDA_MOE_GEMM_CUH

#include "kernels/cuda/cuda_async.cuh"
#include "kernels/cuda/cuda_mma.cuh"
#include "kernels/cuda/cuda_moe.cuh"

#define MOE_GEMM_BN 128
#define MOE_GEMM_BK 32
#define MOE_GEMM_LD (MOE_GEMM_BK + 8) /* bf16 per stage row */
#define MOE_GEMM_STAGES 3
#define MOE_GEMM_THREADS 256

/* Dynamic shared memory of a block: A [STAGES][BM][LD] then B [STAGES][BN][LD] bf16. */
static inline constexpr size_t moe_gemm_smem(int bm)
{
	return (size_t)MOE_GEMM_STAGES * (size_t)(bm + MOE_GEMM_BN) * MOE_GEMM_LD *
	       sizeof(__nv_bfloat16);
}

/* BM: rows a tile (64 or 128). Params as in the header; slot0: the tile of
 * blockIdx.y 0; fault: the backend's fault word. */
template <int BM>
__global__ void __launch_bounds__(MOE_GEMM_THREADS, 2)
moe_gemm_kernel(float *__restrict__ y, const float *__restrict__ x,
		const __nv_bfloat16 *__restrict__ w, const int32_t *__restrict__ order,
		const int32_t *__restrict__ offsets, int R, int N, int K, int k, int e0, int n_local,
		int64_t slot0, unsigned *fault)
{
	constexpr int BN = MOE_GEMM_BN, BK = MOE_GEMM_BK, LD = MOE_GEMM_LD, S = MOE_GEMM_STAGES;
	constexpr int MT = BM / 32; /* m16 tiles of a warp, and x rows of a thread */
	static_assert(BM == 64 || BM == 128, "two warps of BM / 2 rows");
	extern __shared__ __align__(16) unsigned char moe_gemm_shared[];
	__nv_bfloat16 *const As = (__nv_bfloat16 *)moe_gemm_shared;
	__nv_bfloat16 *const Bs = As + S * BM * LD;
	const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
	const int wm = warp >> 2, wn = warp & 3;
	const moe_tile tile = moe_find_tile(offsets, e0, n_local, R, BM, slot0 + blockIdx.y,
					    CUDA_FAULT_MOE_MATMUL, fault);
	const int n0 = blockIdx.x * BN;
	const int nk = (K + BK - 1) / BK;
	const int ac = (tid & 7) * 4, bc = (tid & 3) * 8;
	const __nv_bfloat16 *we;
	const float *xa[MT];
	const __nv_bfloat16 *wb[2];
	bool aok[MT], bok[2];
	float4 areg[MT];
	float acc[MT][4][4];

	if (!tile.rows)
		return; /* past the last tile: the whole block */
	we = w + (int64_t)(tile.e - e0) * N * K;
#pragma unroll
	for (int j = 0; j < MT; j++) {
		const int r = (tid >> 3) + 32 * j;
		const int src = r < tile.rows ? moe_src_row(order, tile.row0 + r, k, R) : 0;

		if (src < 0 && (tid & 7) == 0)
			atomicOr(fault, CUDA_FAULT_MOE_MATMUL);
		aok[j] = r < tile.rows && src >= 0;
		xa[j] = x + (int64_t)(aok[j] ? src : 0) * K;
	}
#pragma unroll
	for (int j = 0; j < 2; j++) {
		const int n = n0 + (tid >> 2) + 64 * j;

		bok[j] = n < N;
		wb[j] = we + (int64_t)(bok[j] ? n : 0) * K;
	}
#pragma unroll
	for (int mt = 0; mt < MT; mt++)
#pragma unroll
		for (int nt = 0; nt < 4; nt++)
			acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;

	auto load_a = [&](int kt) {
		const int kk = kt * BK + ac;

#pragma unroll
		for (int j = 0; j < MT; j++)
			areg[j] = aok[j] && kk < K ? __ldg((const float4 *)(xa[j] + kk))
						   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
	};
	auto store_a = [&](int st) {
#pragma unroll
		for (int j = 0; j < MT; j++) {
			const int r = (tid >> 3) + 32 * j;

			*(uint2 *)(As + (st * BM + r) * LD + ac) =
				make_uint2(mma_pack_bf16(areg[j].x, areg[j].y),
					   mma_pack_bf16(areg[j].z, areg[j].w));
		}
	};
	/* one commit group per step, empty past the end */
	auto load_b = [&](int kt) {
		if (kt < nk) {
			const int st = kt % S, kk = kt * BK + bc;

#pragma unroll
			for (int j = 0; j < 2; j++) {
				const int r = (tid >> 2) + 64 * j;
				const bool ok = bok[j] && kk < K;

				cp_async16(smem_addr(Bs + (st * BN + r) * LD + bc), ok ? wb[j] + kk : w,
					   ok);
			}
		}
		cp_async_commit();
	};
	auto compute = [&](int st) {
		const __nv_bfloat16 *A = As + st * BM * LD, *B = Bs + st * BN * LD;

#pragma unroll
		for (int kk = 0; kk < BK; kk += 16) {
			uint32_t a[MT][4], b[4][2];

#pragma unroll
			for (int mt = 0; mt < MT; mt++) {
				const int r = wm * (BM / 2) + mt * 16 + (lane & 15);

				mma_ldsm_x4(smem_addr(A + r * LD + kk + (lane >> 4) * 8), a[mt]);
			}
#pragma unroll
			for (int np = 0; np < 2; np++) {
				const int n = wn * 32 + np * 16 + (lane & 7) + ((lane >> 4) << 3);
				uint32_t r4[4];

				mma_ldsm_x4(smem_addr(B + n * LD + kk + ((lane >> 3) & 1) * 8), r4);
				b[2 * np][0] = r4[0];
				b[2 * np][1] = r4[1];
				b[2 * np + 1][0] = r4[2];
				b[2 * np + 1][1] = r4[3];
			}
#pragma unroll
			for (int mt = 0; mt < MT; mt++)
#pragma unroll
				for (int nt = 0; nt < 4; nt++)
					mma_16816(acc[mt][nt], a[mt], b[nt][0], b[nt][1]);
		}
	};

#pragma unroll
	for (int s = 0; s < S - 1; s++)
		load_b(s);
	load_a(0);
	store_a(0);
	for (int kt = 0; kt < nk; kt++) {
		if (kt + 1 < nk)
			load_a(kt + 1);
		cp_async_wait<S - 2>();
		__syncthreads();
		load_b(kt + S - 1);
		compute(kt % S);
		if (kt + 1 < nk)
			store_a((kt + 1) % S);
	}
	/* accumulator c of lane l in mma tile (mt, nt): row g + 8·(c >= 2),
	 * column 2q + (c & 1) */
#pragma unroll
	for (int mt = 0; mt < MT; mt++)
#pragma unroll
		for (int h = 0; h < 2; h++) {
			const int r = wm * (BM / 2) + mt * 16 + (lane >> 2) + 8 * h;
			float *yr;

			if (r >= tile.rows)
				continue;
			yr = y + (int64_t)(tile.row0 + r) * N;
#pragma unroll
			for (int nt = 0; nt < 4; nt++) {
				const int c = n0 + wn * 32 + nt * 8 + 2 * (lane & 3);

				if (c + 1 < N && !(N & 1)) {
					*(float2 *)(yr + c) = make_float2(acc[mt][nt][2 * h],
									  acc[mt][nt][2 * h + 1]);
				} else {
					if (c < N)
						yr[c] = acc[mt][nt][2 * h];
					if (c + 1 < N)
						yr[c + 1] = acc[mt][nt][2 * h + 1];
				}
			}
		}
}

/* The GEMM takes these operands: K % 8 == 0, x and w 16-byte aligned. */
static inline bool moe_gemm_fits(const void *x, const void *w, int64_t K)
{
	return K % 8 == 0 && (uintptr_t)x % 16 == 0 && (uintptr_t)w % 16 == 0;
}

/* Let moe_gemm_kernel<BM> have its shared memory (once per device, outside
 * any graph capture). */
template <int BM> static cudaError_t moe_gemm_prepare(void)
{
	return cudaFuncSetAttribute(moe_gemm_kernel<BM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
				    (int)moe_gemm_smem(BM));
}

/* Enqueue the GEMM on stream, the plan's tiles in launches of at most
 * 65535; arguments as the kernel's, checked by the caller. */
template <int BM>
static cudaError_t moe_gemm_launch(cudaStream_t stream, float *y, const float *x,
				   const __nv_bfloat16 *w, const int32_t *order,
				   const int32_t *offsets, int R, int N, int K, int k, int e0,
				   int n_local, unsigned *fault)
{
	const int64_t tiles = moe_max_tiles(R, n_local, BM);
	const unsigned nx = (unsigned)(((int64_t)N + MOE_GEMM_BN - 1) / MOE_GEMM_BN);

	for (int64_t s0 = 0; s0 < tiles; s0 += 65535) {
		const unsigned ny = (unsigned)(tiles - s0 < 65535 ? tiles - s0 : 65535);

		moe_gemm_kernel<BM><<<dim3(nx, ny), MOE_GEMM_THREADS, moe_gemm_smem(BM), stream>>>(
			y, x, w, order, offsets, R, N, K, k, e0, n_local, s0, fault);
	}
	return cudaGetLastError();
}

#endif
