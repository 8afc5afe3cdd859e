/* cp.async: 16-byte copies from global to shared memory that run behind the
 * thread's other work, shared by the GEMV and the attention kernels.
 *
 * .cg bypasses L1: the streamed operand (weights, K and V tiles) passes
 * through once and leaves L1 to what is reused. A copy with !valid reads
 * nothing and writes 16 zero bytes (src-size 0). Copies are grouped by
 * cp_async_commit; cp_async_wait<N> returns when at most N of the thread's
 * groups are still in flight.
 */
#ifndef ATLAS_KERNELS_CUDA_ASYNC_CUH
#define ATLAS_KERNELS_CUDA_ASYNC_CUH

#include <stdint.h>

__device__ __forceinline__ uint32_t smem_addr(const void *p)
{
	return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool valid)
{
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
		     "r"(valid ? 16 : 0)
		     : "memory");
}

__device__ __forceinline__ void cp_async_commit(void)
{
	asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N> __device__ __forceinline__ void cp_async_wait(void)
{
	asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

#endif
