/* Hopper's bulk copies (cp.async.bulk, "TMA" without a tensor map) and the
 * shared-memory mbarriers that count their bytes: one thread asks for a
 * contiguous run of global memory to land in shared memory, and the
 * threads that read it wait on the barrier the copy completes.
 *
 * A ring of stages then needs two barriers a stage: `full` (the producer
 * arrives with the stage's byte count, and its copies complete them) and
 * `empty` (each reader arrives once it has read the stage, and the
 * producer waits there before refilling it). Phase p of a barrier is
 * waited for by its parity (p & 1).
 *
 * Addresses are shared-window (smem_addr) for shared memory; a bulk copy's
 * global source, shared destination and size are multiples of 16 bytes.
 * These are sm_90 instructions: built for an older architecture, each
 * traps (the backend launches no kernel that uses them there:
 * cu->gemv_bulk_blocks).
 */
#ifndef ATLAS_KERNELS_CUDA_BULK_CUH
#define ATLAS_KERNELS_CUDA_BULK_CUH

#include <stdint.h>

#include "kernels/cuda/cuda_async.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define BULK_ASM(...) __trap()
#else
#define BULK_ASM(...) asm volatile(__VA_ARGS__)
#endif

/* A barrier of `count` arrivals a phase; then fence it for the async proxy
 * (the bulk copies) and sync the block before any use. */
__device__ __forceinline__ void mbar_init(uint32_t bar, unsigned count)
{
	BULK_ASM("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_fence_init(void)
{
	BULK_ASM("fence.mbarrier_init.release.cluster;\n"
		 "fence.proxy.async.shared::cta;\n" ::
			 : "memory");
}

/* One arrival that also expects `bytes` of bulk copies this phase. */
__device__ __forceinline__ void mbar_arrive_expect(uint32_t bar, unsigned bytes)
{
	BULK_ASM("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
		 "r"(bytes)
		 : "memory");
}

/* One arrival. */
__device__ __forceinline__ void mbar_arrive(uint32_t bar)
{
	BULK_ASM("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

/* Returns once the phase of parity `parity` has completed. */
__device__ __forceinline__ void mbar_wait(uint32_t bar, unsigned parity)
{
	uint32_t done = 0;

	do {
		BULK_ASM("{\n .reg .pred p;\n"
			 " mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
			 " selp.u32 %0, 1, 0, p;\n}\n"
			 : "=r"(done)
			 : "r"(bar), "r"(parity)
			 : "memory");
	} while (!done);
}

/* bytes from global src to shared dst, completing on barrier bar. */
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void *src, unsigned bytes,
					  uint32_t bar)
{
	BULK_ASM("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
		 " [%0], [%1], %2, [%3];\n" ::"r"(dst),
		 "l"(src), "r"(bytes), "r"(bar)
		 : "memory");
}

/* 16 bytes of shared memory. */
__device__ __forceinline__ uint4 lds128(uint32_t addr)
{
	uint4 v;

	asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
		     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
		     : "r"(addr));
	return v;
}

#endif
