/* Which grouped expert kernel moe_matmul runs for a shape, and its launch:
 * shared by cuda_moe_matmul.cu and dev/cuda/moe_bench.cu, so that the lab
 * measures the backend's choice.
 *
 * The choice is made on the host from R (= T*k sorted rows), E (experts
 * routed over) and N alone, never from the plan, so a step records into a
 * graph once. R / E is the rows of an average expert:
 *  - up to MOE_GEMV_ROWS: the grouped GEMV (cuda_moe_gemv.cuh), in tiles
 *    of 16 rows with 16 weight rows a block: on the H200 (2026-11-24,
 *    dev/cuda/moe_bench, qwen3-30b-a3b's experts) the fastest of the four
 *    GEMV variants at T = 1, 8 and 64, both products: 60 / 46 % of the copy
 *    bandwidth at T = 1 (8-row tiles: 57 / 39 %), 80 / 54 % at T = 8;
 *  - more: the grouped GEMM (cuda_moe_gemm.cuh), in tiles of 128 rows from
 *    MOE_GEMM_ROWS128 an expert, 64 below: an expert's last tile is partly
 *    empty, and at 128 rows on average (T = 2048, top-8 of 128) 64-row
 *    tiles waste about a quarter of the work, 128-row ones about half.
 * The shapes change the launch only: both kernels compute bf16(x) · w with
 * f32 accumulation, in their own summation orders.
 *
 * Operands as the kernels': y [R, N] f32, x [T or R, K] f32, w [n_local *
 * N, K] bf16, order [R] and offsets [E + 1] i32; K % 8 == 0 and x, w
 * 16-byte aligned (moe_gemv_fits).
 */
#ifndef ATLAS_KERNELS_CUDA_MOE_LAUNCH_CUH
#define ATLAS_KERNELS_CUDA_MOE_LAUNCH_CUH

#include "kernels/cuda/cuda_moe_gemm.cuh"
#include "kernels/cuda/cuda_moe_gemv.cuh"

#define MOE_GEMV_ROWS 8
#define MOE_GEMM_ROWS128 256

/* The grouped GEMV takes R rows over E experts (else the GEMM). */
static inline bool moe_takes_gemv(int64_t R, int64_t E)
{
	return R <= MOE_GEMV_ROWS * E;
}

/* Enqueue the kernel of this shape on stream; arguments checked by the caller. */
static cudaError_t moe_launch(cudaStream_t stream, float *y, const float *x,
			      const __nv_bfloat16 *w, const int32_t *order, const int32_t *offsets,
			      int R, int N, int K, int k, int E, int e0, int n_local,
			      unsigned *fault)
{
	if (moe_takes_gemv(R, E))
		return moe_gemv_launch<2, 16>(stream, y, x, w, order, offsets, R, N, K, k, e0,
					      n_local, fault);
	if (R >= (int64_t)MOE_GEMM_ROWS128 * E)
		return moe_gemm_launch<128>(stream, y, x, w, order, offsets, R, N, K, k, e0,
					    n_local, fault);
	return moe_gemm_launch<64>(stream, y, x, w, order, offsets, R, N, K, k, e0, n_local,
				   fault);
}

#endif
