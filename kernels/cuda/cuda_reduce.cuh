/* Warp and block reductions shared by the cuda kernels.
 *
 * Reductions run in a fixed tree order (xor butterfly in the warp, then the
 * warp results in order), so a kernel's result does not depend on timing.
 * block_reduce needs blockDim.x a multiple of 32 (at most 1024), is called by
 * every thread of the block, returns the result to every thread and ends with
 * a barrier, so its 32-entry shared buffer may be reused at once.
 */
#ifndef ATLAS_KERNELS_CUDA_REDUCE_CUH
#define ATLAS_KERNELS_CUDA_REDUCE_CUH

#include <stdint.h>

#define FULL_WARP 0xffffffffu

struct op_sum {
	template <typename T> __device__ __forceinline__ T operator()(T a, T b) const
	{
		return a + b;
	}
};

struct op_max {
	template <typename T> __device__ __forceinline__ T operator()(T a, T b) const
	{
		return a > b ? a : b;
	}
};

template <typename T, typename Op> __device__ __forceinline__ T warp_reduce(T v, Op op)
{
	for (int o = 16; o > 0; o >>= 1)
		v = op(v, __shfl_xor_sync(FULL_WARP, v, o));
	return v;
}

/* The threads a block reduction spans: the whole block (THREADS = 0), or
 * its first THREADS threads, which then meet at named barrier 1 (a block
 * whose other warps never join them: the bulk GEMV's producer). */
template <int THREADS>
__device__ __forceinline__ unsigned reduce_threads(void)
{
	return THREADS ? (unsigned)THREADS : blockDim.x;
}

template <int THREADS>
__device__ __forceinline__ void reduce_sync(void)
{
	if constexpr (THREADS > 0)
		asm volatile("bar.sync 1, %0;\n" ::"n"(THREADS) : "memory");
	else
		__syncthreads();
}

template <int THREADS = 0, typename T, typename Op>
__device__ __forceinline__ T block_reduce(T v, Op op, T identity, T *shared32)
{
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int n_warps = (int)(reduce_threads<THREADS>() >> 5);

	v = warp_reduce(v, op);
	if (lane == 0)
		shared32[warp] = v;
	reduce_sync<THREADS>();
	v = lane < n_warps ? shared32[lane] : identity;
	v = warp_reduce(v, op);
	reduce_sync<THREADS>();
	return v;
}

#endif
