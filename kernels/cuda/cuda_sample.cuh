/* What the sampling kernels share (cuda_sample.cu: one block a row, the
 * radix selection; cuda_sample_fast.cu: greedy rows and rows of a small
 * top_k over many blocks a row): the rank key of a logit, the fixed-point
 * mass of a token, a row's largest key. cuda_sample.cu's top comment gives
 * the definitions.
 */
#ifndef ATLAS_KERNELS_CUDA_SAMPLE_CUH
#define ATLAS_KERNELS_CUDA_SAMPLE_CUH

#include <math.h>
#include <stdint.h>

#include "kernels/cuda/cuda_impl.h"
#include "kernels/cuda/cuda_reduce.cuh"

#define SAMPLE_THREADS 512
#define SAMPLE_WARPS (SAMPLE_THREADS / 32)

/* Fixed-point unit of mass: a weight w in [0, 1] counts round(w * 2^40). */
#define MASS_ONE 1099511627776.0
#define SAMPLE_MAX_V (1 << 23)

/* A key that orders like the logit (larger key: earlier in rank order), with
 * NaN as -inf and -0 as +0. */
__device__ __forceinline__ uint32_t rank_key(float l)
{
	uint32_t b;

	if (isnan(l))
		l = -INFINITY;
	if (l == 0.0f)
		l = 0.0f;
	b = __float_as_uint(l);
	return b & 0x80000000u ? ~b : b | 0x80000000u;
}

__device__ __forceinline__ float key_logit(uint32_t k)
{
	return __uint_as_float(k & 0x80000000u ? k & 0x7fffffffu : ~k);
}

/* What a sampling launch leaves for the host: the ids, and the fault word
 * of the ops before it, both in pinned host memory that the kernel writes
 * through its mapping. The step then ends with the kernel: no copies after
 * it: in an H100 trace of Qwen3-0.6B at batch 1 (2026-12-02) the two copies
 * after the greedy kernel ended its step about 8 us later, 4.8 of them
 * from the kernel's end to the first copy (docs/perf.md). The sync point
 * reads the fault word the kernel left (cuda_sync_published). A sampling
 * kernel reads the word after its PDL wait, so every op before it has
 * finished and the word is final. */
struct sample_out {
	int32_t *ids;          /* [m], cu->ids_map */
	const unsigned *fault; /* cu->fault */
	unsigned *fault_host;  /* cu->fault_map */
};

static inline sample_out sample_out_of(const struct cuda_backend *cu)
{
	return sample_out{ cu->ids_map, cu->fault, cu->fault_map };
}

/* The fault word into fault_host, by one thread of the launch. */
__device__ __forceinline__ void sample_publish_fault(const sample_out &o)
{
	if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0)
		*o.fault_host = *(const volatile unsigned *)o.fault;
}

/* One row's constants. */
struct row_ctx {
	const float *l;
	int64_t V;
	bool vec4;           /* l 16-byte aligned and V % 4 == 0 */
	float lmax, temperature;
};

/* Call f(i, logit, valid) for every i in [0, V), every lane the same number
 * of times (valid false past the end, so f may hold warp collectives),
 * reading 16 bytes per thread and step when the row allows. UNROLL: steps
 * whose loads are asked for together before f sees any of them, for a
 * short f (a step's load is otherwise a round trip of its own). */
template <int UNROLL = 1, typename F>
__device__ __forceinline__ void for_each_logit(const row_ctx &r, F f)
{
	if (r.vec4) {
		const float4 *l4 = (const float4 *)r.l;
		const int64_t n4 = r.V / 4;

		for (int64_t base = 0; base < n4; base += UNROLL * blockDim.x) {
			float4 v[UNROLL];

#pragma unroll
			for (int u = 0; u < UNROLL; u++) {
				const int64_t j = base + u * blockDim.x + threadIdx.x;

				v[u] = j < n4 ? __ldg(l4 + j) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
			}
#pragma unroll
			for (int u = 0; u < UNROLL; u++) {
				const int64_t j = base + u * blockDim.x + threadIdx.x;
				const bool ok = j < n4;

				f(4 * j, v[u].x, ok);
				f(4 * j + 1, v[u].y, ok);
				f(4 * j + 2, v[u].z, ok);
				f(4 * j + 3, v[u].w, ok);
			}
		}
	} else {
		for (int64_t base = 0; base < r.V; base += blockDim.x) {
			const int64_t i = base + threadIdx.x;
			const bool ok = i < r.V;

			f(i, ok ? __ldg(r.l + i) : 0.0f, ok);
		}
	}
}

/* The fixed-point mass of a token with this logit (at most 2^40). */
__device__ __forceinline__ uint64_t mass_of(const row_ctx &r, float logit)
{
	const float w = logit == r.lmax ? 1.0f : expf((logit - r.lmax) / r.temperature);

	return __double2ull_rn((double)w * MASS_ONE);
}

__device__ __forceinline__ bool meets(double v, double bound, bool strict)
{
	return strict ? v > bound : v >= bound;
}

/* Steps of row_best's loop asked for together: greedy_kernel's chunk of
 * 16 logits a thread in one round trip, not four. Its own time at one row
 * of 151,936 went from 5.4 to 4.9 us (an H200 trace; the bench level,
 * docs/perf.md); sample_kernel's row of 74 steps takes 19 round trips. */
#define ROW_BEST_UNROLL 4

/* The largest (key, ~id) of r's logits, ids counted from lo: the
 * largest key, the lowest id among equals, as one 64-bit value. red: 32
 * values of shared memory for block_reduce. */
__device__ __forceinline__ uint64_t row_best(const row_ctx &r, int64_t lo, uint64_t *red)
{
	uint64_t best = 0;

	for_each_logit<ROW_BEST_UNROLL>(r, [&](int64_t i, float li, bool ok) {
		const uint64_t v = (uint64_t)rank_key(li) << 32 | (0xffffffffu - (uint32_t)(lo + i));

		best = ok && v > best ? v : best;
	});
	return block_reduce(best, op_max(), (uint64_t)0, red);
}

/* cuda_sample_fast.cu: whether rows [0, n) take topk_kernel (each greedy,
 * or of a top_k of at most TOPK_MAX_K whose chunks' candidates fit), and
 * the launches of m rows of logits l [m, V] (ids and the fault word to
 * sample_out_of(cu); topk's requests in rows, device-readable, at most
 * CUDA_SAMPLE_TOPK_ROWS rows). pdl: launched under PDL (cuda_pdl.cuh) when
 * cu->pdl, to follow the kernel before it (a draw's: lm_head's) closely;
 * sample's launches follow a graph or a copy and take the stream's plain
 * order. */
bool cuda_sample_topk_takes(const struct kt_sample_row *rows, int n, int64_t V);
void cuda_sample_greedy_launch(struct cuda_backend *cu, const float *l, int64_t V, int m,
			       bool pdl);
void cuda_sample_topk_launch(struct cuda_backend *cu, const float *l, int64_t V, int m,
			     const struct kt_sample_row *rows, bool pdl);

#endif
