/* Programmatic dependent launch (Hopper and later): a kernel launched by
 * cu_launch may be put on the multiprocessors while the kernel before it on
 * the stream is still running, so that the gap between two kernels (the
 * launch, the first blocks' start, the last blocks' drain) is hidden behind
 * the work of the first. A decode step is hundreds of short kernels in a
 * row, and each such gap is a few microseconds of an idle GPU.
 *
 * The contract, for every kernel that cu_launch launches:
 *
 *   - pdl_wait() comes before its first access to memory that an earlier op
 *     writes or that a later op may still read: every activation, cache,
 *     table and output. Only weights (written at load, before any step) may
 *     be read before it. pdl_wait() returns once the kernel before has
 *     finished and its writes are visible, which by induction holds for every
 *     op before it on the stream. One kernel reads more before it: the
 *     decode attention that runs a rope_store (cuda_attention_decode.cuh)
 *     reads the step's tables and the keys before its row's, through L2
 *     only. It is launched so only right after a product, which writes
 *     neither, and when a kernel is placed every op before the kernel
 *     right before it has finished (that kernel has passed its pdl_wait,
 *     by the next rule). The sampling kernels of a draw read their rows'
 *     requests before it: host memory that the host wrote before the
 *     launch (cuda_sample.cu), which no op writes.
 *   - pdl_launch_dependents() comes after pdl_wait(): the next kernel's
 *     blocks may then be placed as soon as every block of this one has
 *     passed it, which keeps at most two kernels on the multiprocessors, the
 *     running one and the next one waiting. Called first, it let a kernel be
 *     placed before the one two behind it had finished, and pdl_wait()
 *     promises only its predecessor's writes: tokens changed on an H100
 *     (test_engine, docs/perf.md).
 *
 * tests/ops/check_pdl.py (test pdl-contract) checks in the sources that
 * every kernel cu_launch starts calls both, itself or through a device
 * function; where in the kernel is for review to see.
 *
 * A kernel that is launched without the attribute (cu->pdl false, an older
 * GPU) runs the two instructions as no-ops; ops of other kinds (copies,
 * cuBLAS) keep the stream's ordinary order on both sides. The order of the
 * arithmetic does not change, so results are the same bits either way.
 */
#ifndef ATLAS_KERNELS_CUDA_PDL_CUH
#define ATLAS_KERNELS_CUDA_PDL_CUH

#include <cuda_runtime.h>

/* Wait for the kernel before this one on the stream, and its writes. */
__device__ __forceinline__ void pdl_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Let the next kernel on the stream be placed (it waits in pdl_wait). */
__device__ __forceinline__ void pdl_launch_dependents(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* kernel<<<grid, block, smem, stream>>>(args...) in thread block clusters
 * of `cluster` blocks (Hopper and later; 1 x 1 x 1: none), with
 * programmatic serialisation when pdl (cuda_backend.pdl): the kernel must
 * keep the contract above.
 * A launch error is left for CU_LAUNCHED(), as with <<<>>>. */
template <typename... Params, typename... Args>
static inline void cu_launch_cluster(bool pdl, void (*kernel)(Params...), dim3 cluster,
				     dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
				     Args... args)
{
	cudaLaunchAttribute attr[2];
	cudaLaunchConfig_t cfg = {};
	unsigned n = 0;

	if (pdl) {
		attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
		attr[n++].val.programmaticStreamSerializationAllowed = 1;
	}
	if (cluster.x * cluster.y * cluster.z > 1) {
		attr[n].id = cudaLaunchAttributeClusterDimension;
		attr[n].val.clusterDim.x = cluster.x;
		attr[n].val.clusterDim.y = cluster.y;
		attr[n++].val.clusterDim.z = cluster.z;
	}
	cfg.gridDim = grid;
	cfg.blockDim = block;
	cfg.dynamicSmemBytes = smem;
	cfg.stream = stream;
	cfg.attrs = attr;
	cfg.numAttrs = n;
	(void)cudaLaunchKernelEx(&cfg, kernel, ((Params)args)...);
}

/* The same without clusters. */
template <typename... Params, typename... Args>
static inline void cu_launch(bool pdl, void (*kernel)(Params...), dim3 grid, dim3 block,
			     size_t smem, cudaStream_t stream, Args... args)
{
	cu_launch_cluster(pdl, kernel, dim3(1, 1, 1), grid, block, smem, stream, args...);
}

#endif
