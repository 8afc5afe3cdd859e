/* Tensor-core building blocks of the MoE kernels (cuda_moe_gemv.cuh,
 * cuda_moe_gemm.cuh): bf16 packing, ldmatrix and mma.sync m16n8k16 with
 * bf16 inputs and f32 accumulation.
 *
 * Fragment layouts are the PTX ones for m16n8k16: lane l = 4g + q holds of
 * A (16 × 16, row major) rows g and g + 8 at k = 2q, 2q + 1 and 2q + 8,
 * 2q + 9 (a0: row g, k low; a1: row g + 8, k low; a2: row g, k high; a3:
 * row g + 8, k high); of B (16 × 8, "col": stored n-major, k contiguous)
 * column g at k = 2q, 2q + 1 (b0) and 2q + 8, 2q + 9 (b1); of C rows g
 * (c0, c1) and g + 8 (c2, c3) at columns 2q, 2q + 1.
 */
#ifndef ATLAS_KERNELS_CUDA_MMA_CUH
#define ATLAS_KERNELS_CUDA_MMA_CUH

#include <stdint.h>

#include <cuda_bf16.h>

/* Two f32 rounded to bf16 (nearest even), lo in the low half. */
__device__ __forceinline__ uint32_t mma_pack_bf16(float lo, float hi)
{
	__nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);

	return *reinterpret_cast<uint32_t *>(&h);
}

/* c += a · b: a 16×16 (row major), b 16×8 (col), bf16, f32 accumulate. */
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
					  uint32_t b1)
{
	asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
	    "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
	    : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
	    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Four 8×8 b16 matrices from shared memory: lanes 8i..8i+7 give the row
 * addresses (16 bytes each) of matrix i, which lands in r[i]. */
__device__ __forceinline__ void mma_ldsm_x4(uint32_t addr, uint32_t (&r)[4])
{
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
		     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
		     : "r"(addr));
}

#endif
