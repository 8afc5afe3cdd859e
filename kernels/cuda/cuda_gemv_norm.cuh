/* A row's rmsnorm inside the GEMV (rmsnorm_product, kernels/backend.h): at
 * one row of x, the norm that rmsnorm would have written for the product
 * right after it is computed by every block of that product instead, and
 * the rmsnorm launch is gone. On an H100 (docs/perf.md) that gave Qwen3-0.6B
 * +5 % tokens/s at batch 1 and Qwen3-8B 0.3-1 %: the norm's cost is mostly
 * its chain of memory round trips after the wait, which the blocks still
 * run before their products, and each block pays it (cuda_gemv.cu bounds
 * the blocks of a launch that takes a norm).
 *
 * After griddepcontrol.wait each block loads the row x (+ res) and runs the
 * arithmetic of rmsnorm's vector kernel (cuda_norm.cuh: the same threads,
 * sums and roundings), then leaves w · (x · inv) rounded to bf16 in shared
 * memory, the bits rmsnorm would have stored in its bf16 out; its warps
 * read x from there (gemv_x<gemv_xs>), so every output is what rmsnorm then
 * the GEMV give. With res, x += res must be stored, but every block reads
 * x: each block counts itself past its norm, and the one that counts last
 * (all others have read x by then) stores x + res at its end and sets the
 * count back to 0 for the next launch.
 *
 * The blocks are CUDA_THREADS threads (GEMV_WARPS warps), as rmsnorm's.
 * Shared memory: the row in bf16, K · 2 bytes (dynamic), beside the ring.
 */
#ifndef ATLAS_KERNELS_CUDA_GEMV_NORM_CUH
#define ATLAS_KERNELS_CUDA_GEMV_NORM_CUH

#include <cuda_bf16.h>

#include "kernels/cuda/cuda_gemv_tile.cuh"
#include "kernels/cuda/cuda_impl.h"
#include "kernels/cuda/cuda_norm.cuh"

static_assert(GEMV_WARPS * 32 == CUDA_THREADS, "the GEMV's blocks run rmsnorm's threads");

/* The widest row the GEMV norms: its bf16 copy (10 KB) and the ring (32 KB)
 * fit the 48 KB of shared memory a launch has without opting in. Qwen3's
 * hidden sizes are 1024 to 5120. */
#define GEMV_NORM_MAX_K 5120
static_assert(GEMV_NORM_MAX_K <= NORM_VEC_MAX_D, "a normed row is one rmsnorm_vec_kernel takes");

/* The norm of a launch: rmsnorm(out, x, res, w, eps) for the one row. */
struct gemv_norm {
	float *x;          /* [1, K] f32: the residual stream; x + res stored by the last block */
	const float *res;  /* [1, K] f32, or NULL */
	const void *w;     /* [1, K]: the norm's weight, bf16 (w_bf16) or f32 */
	bool w_bf16;
	float eps;
	unsigned *count;   /* device: blocks past their norm, 0 at rest (cu->norm_count) */
};

/* The pending norm of rmsnorm_product (cuda_norm.cu) into n when x is its
 * out, and no longer pending; false (nothing taken) otherwise. */
bool cuda_norm_take(struct cuda_backend *cu, const struct kt_tensor *x, struct gemv_norm *n);

/* An element of the normed row in shared memory: x of gemv_tile_warp when
 * the launch norms its row. NV: float4s of the row a thread holds while it
 * norms it (rows of up to NV · CUDA_THREADS · 4), as few as the row needs,
 * since the kernel's registers are the most any part of it uses. */
template <int NV>
struct gemv_xs {
	__nv_bfloat16 v;
};

template <typename XT>
struct is_gemv_xs {
	static constexpr bool value = false;
	static constexpr int nv = 1;
};

template <int NV>
struct is_gemv_xs<gemv_xs<NV>> {
	static constexpr bool value = true;
	static constexpr int nv = NV;
};

template <int NV>
struct gemv_x<gemv_xs<NV>> {
	uint4 v;

	__device__ __forceinline__ void load(const gemv_xs<NV> *xr, bool ok, int k, int K)
	{
		v = ok && k < K ? *reinterpret_cast<const uint4 *>(xr + k)
				: make_uint4(0u, 0u, 0u, 0u);
	}
	__device__ __forceinline__ void pack(uint32_t (&a)[4]) const
	{
		a[0] = v.x;
		a[1] = v.y;
		a[2] = v.z;
		a[3] = v.w;
	}
};

/* Blocks a multiprocessor must hold at once (__launch_bounds__): 1 for
 * the plain GEMV (cuda_gemv_kernel.cuh says why), 4 for a normed row, whose
 * norm would otherwise take the registers of a fourth block at 4096-wide
 * rows (74 a thread instead of 52-58). The normed swiglu of the shortest
 * rows is held tighter still (GEMV_SWIGLU_NORM_REGS, cuda_gemv.cu). */
#define GEMV_MIN_BLOCKS(XT) (is_gemv_xs<XT>::value ? 4 : 1)

/* The block's copy of the normed row (dynamic shared memory, K values). */
template <int NV>
__device__ __forceinline__ gemv_xs<NV> *gemv_norm_row_smem()
{
	extern __shared__ __align__(16) unsigned char gemv_norm_dyn[];

	return reinterpret_cast<gemv_xs<NV> *>(gemv_norm_dyn);
}

/* Whether a thread keeps its x + res in registers for the store at the
 * block's end (the count's last block) instead of reading them again: for
 * rows of up to 2 vectors a thread, where the registers are there. */
template <int NV>
struct gemv_norm_keeps {
	static constexpr bool value = NV <= 2;
};

/* Every thread of the block (or its first THREADS: block_reduce's), after
 * pdl_wait: the normed row into xs, x + res into keep (gemv_norm_keeps).
 * x, res and the norm's weight are loaded together, before the sum. With
 * res, thread 0 counts the block and gets its ticket (what the count
 * was). */
template <int NV, int THREADS = 0>
__device__ __forceinline__ void gemv_norm_row(const gemv_norm &n, gemv_xs<NV> *xs, int K,
					      unsigned *ticket, float4 (&keep)[NV])
{
	__shared__ double part[32];
	const int64_t D4 = K / 4;
	float4 v[NV], g[NV];
	float inv;

	norm_vec_load<THREADS>(v, reinterpret_cast<const float4 *>(n.x),
		      reinterpret_cast<const float4 *>(n.res), D4);
#pragma unroll
	for (int j = 0; j < NV; j++)
		if (norm_vec_index<THREADS>(j) < D4)
			g[j] = n.w_bf16 ? weights4((const __nv_bfloat16 *)n.w, norm_vec_index<THREADS>(j))
					: weights4((const float *)n.w, norm_vec_index<THREADS>(j));
	inv = norm_vec_inv<THREADS>(v, D4, n.eps, part);
#pragma unroll
	for (int j = 0; j < NV; j++)
		if (norm_vec_index<THREADS>(j) < D4)
			narrow4_to(reinterpret_cast<__nv_bfloat16 *>(xs), norm_vec_index<THREADS>(j),
				   norm_vec_out(g[j], v[j], inv));
	if constexpr (gemv_norm_keeps<NV>::value) {
#pragma unroll
		for (int j = 0; j < NV; j++)
			keep[j] = v[j];
	}
	reduce_sync<THREADS>();
	if (n.res && threadIdx.x == 0) {
		__threadfence();
		*ticket = atomicAdd(n.count, 1u);
	}
}

/* Every thread of the block (or its first THREADS), at its end: the block
 * that counted last stores x + res (rmsnorm's x: kept, or loaded again)
 * and sets the count back. */
template <int NV, int THREADS = 0>
__device__ __forceinline__ void gemv_norm_finish(const gemv_norm &n, int K, unsigned ticket,
						 const float4 (&keep)[NV])
{
	__shared__ bool last;
	const int64_t D4 = K / 4;
	float4 v[NV];

	if (!n.res)
		return;
	if (threadIdx.x == 0)
		last = ticket == gridDim.x - 1;
	reduce_sync<THREADS>();
	if (!last)
		return;
	if constexpr (gemv_norm_keeps<NV>::value) {
#pragma unroll
		for (int j = 0; j < NV; j++)
			v[j] = keep[j];
	} else {
		norm_vec_load<THREADS>(v, reinterpret_cast<const float4 *>(n.x),
			      reinterpret_cast<const float4 *>(n.res), D4);
	}
#pragma unroll
	for (int j = 0; j < NV; j++)
		if (norm_vec_index<THREADS>(j) < D4)
			reinterpret_cast<float4 *>(n.x)[norm_vec_index<THREADS>(j)] = v[j];
	if (threadIdx.x == 0)
		*n.count = 0;
}

#endif
