/* moe_route: each token's top-k experts and their weights, then the plan
 * that sorts the T*k assignments by expert (contract in kernels/backend.h),
 * all on the device: safe in a graph. Also the MoE workspace of the backend
 * (cuda_moe_open).
 *
 * Shapes: logits [T, E] f32 (E <= CUDA_MOE_MAX_E), ids [T, k] i32, w [T, k]
 * f32, order and slot [R, 1] i32 (R = T*k), offsets [E + 1, 1] i32.
 *
 * Top-k (route_token): a warp per token; lane l holds logits l, l + 32, ..
 * in registers (VPL a lane). Softmax statistics first: the max m and the sum
 * of exp(logit - m) (lane order, then a fixed xor tree). Then k rounds of a
 * warp argmax over the experts not taken yet, ordered by logit, then lower
 * id, so that ties go to the lower id as on the cpu (a NaN logit counts as
 * -inf there); lane j keeps the j-th pick. Weights: exp(logit - m) / sum,
 * divided by their sum over the k when norm.
 *
 * Plan: a stable counting sort by expert. Within a warp, __match_any_sync
 * groups 32 consecutive assignments by expert; an assignment's rank is the
 * count of its expert before the group (a running count in shared memory)
 * plus its peers of lower lane. Then
 *  - R <= ROUTE_SMALL_ROWS (decode): one block does everything
 *    (route_small_kernel): top-k by its warps, counts by shared atomics, an
 *    exclusive scan over experts into offsets, and warp 0 ranks the
 *    assignments in order and writes slot and order;
 *  - larger R: route_topk_kernel (a warp per token), route_rank_kernel (a
 *    warp per chunk of ch assignments: ranks within the chunk into slot,
 *    the chunk's counts per expert into cu->moe_hist), route_scan_kernel
 *    (one block: per expert, the chunks' counts become their first sorted
 *    positions; offsets by a scan over experts) and route_scatter_kernel
 *    (slot += the chunk's first position of the expert; order[slot] = a).
 * Both give the same plan: the stable order is unique.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_impl.h"
#include "kernels/cuda/cuda_reduce.cuh"

/* Most assignments the one-block route takes, and its threads. */
#define ROUTE_SMALL_ROWS 1024
#define ROUTE_SMALL_THREADS 512
/* Tokens (warps) of a route_topk_kernel block; chunks (warps) of a route_rank_kernel block. */
#define ROUTE_TOPK_WARPS 8
#define ROUTE_RANK_WARPS 4
#define ROUTE_SCAN_THREADS 1024

static_assert(CUDA_MOE_MAX_E <= 32 * 32, "a lane holds at most 32 logits");
static_assert(CUDA_MOE_MAX_E <= ROUTE_SCAN_THREADS, "route_scan_kernel: an expert a thread");
static_assert(CUDA_MOE_MAX_E % ROUTE_SMALL_THREADS == 0, "route_small_kernel's scan");
static_assert(KT_MOE_MAX_K <= 32, "lane j keeps pick j");

struct op_fmax {
	__device__ __forceinline__ float operator()(float a, float b) const
	{
		return fmaxf(a, b);
	}
};

/* Inclusive prefix sum over the lanes of a warp. */
__device__ __forceinline__ int warp_inclusive_scan(int v)
{
	const int lane = threadIdx.x & 31;

	for (int o = 1; o < 32; o <<= 1) {
		const int u = __shfl_up_sync(FULL_WARP, v, o);

		if (lane >= o)
			v += u;
	}
	return v;
}

/* Exclusive prefix sum of v over the threads of the block (blockDim.x a
 * multiple of 32); every thread calls it; s_warp [32] may be reused after a
 * barrier. */
__device__ int block_exclusive_scan(int v, int *s_warp)
{
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int n_warps = (int)(blockDim.x >> 5);
	const int inc = warp_inclusive_scan(v);

	if (lane == 31)
		s_warp[warp] = inc;
	__syncthreads();
	if (warp == 0) {
		const int t = lane < n_warps ? s_warp[lane] : 0;
		const int ti = warp_inclusive_scan(t);

		if (lane < n_warps)
			s_warp[lane] = ti - t;
	}
	__syncthreads();
	return s_warp[warp] + inc - v;
}

/* Token row's top-k (see the top of this file), called by a whole warp:
 * row [E] f32, ids and w [k] of the token. Returns the expert of pick lane
 * to lanes < k, -1 to the others. */
template <int VPL>
__device__ __forceinline__ int route_token(const float *__restrict__ row, int E, int k, bool norm,
					   int32_t *__restrict__ ids, float *__restrict__ w)
{
	static_assert(VPL >= 1 && VPL <= 32, "a bit of taken per value");
	const int lane = threadIdx.x & 31;
	float v[VPL];
	unsigned taken = 0; /* bit j: expert lane + 32 j is picked or past E */
	float m = -INFINITY, s = 0.0f, my_v = 0.0f, p = 0.0f;
	int my_e = -1;

#pragma unroll
	for (int j = 0; j < VPL; j++) {
		const int e = lane + 32 * j;

		if (e < E) {
			v[j] = row[e];
			m = fmaxf(m, v[j]);
		} else {
			v[j] = -INFINITY;
			taken |= 1u << j;
		}
	}
	m = warp_reduce(m, op_fmax());
#pragma unroll
	for (int j = 0; j < VPL; j++)
		if (!(taken >> j & 1))
			s += expf(v[j] - m);
	s = warp_reduce(s, op_sum());
	for (int j = 0; j < k; j++) {
		float bk = -INFINITY, bv = 0.0f;
		int bi = INT_MAX;

#pragma unroll
		for (int jj = 0; jj < VPL; jj++) {
			const float key = isnan(v[jj]) ? -INFINITY : v[jj];

			if (!(taken >> jj & 1) && (bi == INT_MAX || key > bk)) {
				bk = key;
				bv = v[jj];
				bi = lane + 32 * jj;
			}
		}
		for (int o = 16; o > 0; o >>= 1) {
			const float ok = __shfl_xor_sync(FULL_WARP, bk, o);
			const float ov = __shfl_xor_sync(FULL_WARP, bv, o);
			const int oi = __shfl_xor_sync(FULL_WARP, bi, o);

			if (oi != INT_MAX && (bi == INT_MAX || ok > bk || (ok == bk && oi < bi))) {
				bk = ok;
				bv = ov;
				bi = oi;
			}
		}
		/* k <= E: some expert is left, so bi names one */
		if ((bi & 31) == lane)
			taken |= 1u << (bi >> 5);
		if (lane == j) {
			my_e = bi;
			my_v = bv;
		}
	}
	if (lane < k)
		p = expf(my_v - m) / s;
	if (norm)
		p /= warp_reduce(p, op_sum());
	if (lane < k) {
		ids[lane] = my_e;
		w[lane] = p;
	}
	return my_e;
}

/* Stable sorted positions of assignments a0 .. a1 - 1 (expert ids_of[a]),
 * called by a whole warp: next [E] holds each expert's next position and
 * advances; slot[a] gets the position, and order[position] = a when order
 * is given. */
__device__ void route_rank_warp(const int32_t *ids_of, int a0, int a1, int32_t *next,
				int32_t *__restrict__ slot, int32_t *__restrict__ order)
{
	const int lane = threadIdx.x & 31;

	for (int base = a0; base < a1; base += 32) {
		const int a = base + lane;
		const bool ok = a < a1;
		const int e = ok ? ids_of[a] : -1;
		const unsigned peers = __match_any_sync(FULL_WARP, e);
		const int before = __popc(peers & ((1u << lane) - 1));
		const int pos = ok ? next[e] + before : 0;

		__syncwarp();
		if (ok && !before)
			next[e] += __popc(peers);
		__syncwarp();
		if (ok) {
			slot[a] = pos;
			if (order)
				order[pos] = a;
		}
	}
}

/* The whole route in one block for R = T*k <= ROUTE_SMALL_ROWS; shapes at
 * the top of this file. */
template <int VPL>
__global__ void __launch_bounds__(ROUTE_SMALL_THREADS)
route_small_kernel(int32_t *__restrict__ ids, float *__restrict__ w, int32_t *__restrict__ order,
		   int32_t *__restrict__ slot, int32_t *__restrict__ offsets,
		   const float *__restrict__ logits, int T, int E, int k, bool norm)
{
	constexpr int EPT = CUDA_MOE_MAX_E / ROUTE_SMALL_THREADS; /* experts a thread scans */
	__shared__ int32_t s_ids[ROUTE_SMALL_ROWS];
	__shared__ int32_t s_next[CUDA_MOE_MAX_E]; /* counts, then next sorted position */
	__shared__ int s_warp[32];
	const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
	const int R = T * k;
	int c[EPT], sum = 0, excl;

	for (int e = tid; e < E; e += blockDim.x)
		s_next[e] = 0;
	__syncthreads();
	for (int t = warp; t < T; t += (int)(blockDim.x >> 5)) {
		const int e = route_token<VPL>(logits + (int64_t)t * E, E, k, norm, ids + t * k,
					       w + t * k);

		if (lane < k) {
			s_ids[t * k + lane] = e;
			atomicAdd(&s_next[e], 1);
		}
	}
	__syncthreads();
#pragma unroll
	for (int i = 0; i < EPT; i++) {
		const int e = EPT * tid + i;

		c[i] = e < E ? s_next[e] : 0;
		sum += c[i];
	}
	excl = block_exclusive_scan(sum, s_warp);
#pragma unroll
	for (int i = 0; i < EPT; i++) {
		const int e = EPT * tid + i;

		if (e < E) {
			s_next[e] = excl;
			offsets[e] = excl;
		}
		excl += c[i];
	}
	if (tid == 0)
		offsets[E] = R;
	__syncthreads();
	if (warp == 0)
		route_rank_warp(s_ids, 0, R, s_next, slot, order);
}

/* ids, w of token blockIdx.x · ROUTE_TOPK_WARPS + warp. */
template <int VPL>
__global__ void __launch_bounds__(ROUTE_TOPK_WARPS * 32)
route_topk_kernel(int32_t *__restrict__ ids, float *__restrict__ w,
		  const float *__restrict__ logits, int T, int E, int k, bool norm)
{
	const int t = blockIdx.x * ROUTE_TOPK_WARPS + (threadIdx.x >> 5);

	if (t < T)
		route_token<VPL>(logits + (int64_t)t * E, E, k, norm, ids + (int64_t)t * k,
				 w + (int64_t)t * k);
}

/* Chunk c = blockIdx.x · ROUTE_RANK_WARPS + warp, assignments c·ch ..
 * (c + 1)·ch - 1: slot[a] = rank of a within the chunk among its expert's;
 * hist [n_chunks, E] row c = the chunk's count per expert. ids [R]. */
__global__ void __launch_bounds__(ROUTE_RANK_WARPS * 32)
route_rank_kernel(int32_t *__restrict__ slot, int32_t *__restrict__ hist,
		  const int32_t *__restrict__ ids, int R, int E, int ch, int n_chunks)
{
	__shared__ int32_t s_next[ROUTE_RANK_WARPS][CUDA_MOE_MAX_E];
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const int c = blockIdx.x * ROUTE_RANK_WARPS + warp;
	int32_t *next = s_next[warp];

	if (c >= n_chunks)
		return; /* the warp: this kernel has no block barrier */
	for (int e = lane; e < E; e += 32)
		next[e] = 0;
	__syncwarp();
	route_rank_warp(ids, c * ch, min(R, (c + 1) * ch), next, slot, NULL);
	__syncwarp();
	for (int e = lane; e < E; e += 32)
		hist[(int64_t)c * E + e] = next[e];
}

/* One block, thread e: expert e's total over the chunks of hist [n_chunks,
 * E], offsets [E + 1] by a scan over experts, and hist[c, e] becomes the
 * first sorted position of expert e in chunk c. */
__global__ void __launch_bounds__(ROUTE_SCAN_THREADS)
route_scan_kernel(int32_t *__restrict__ offsets, int32_t *__restrict__ hist, int R, int E,
		  int n_chunks)
{
	__shared__ int s_warp[32];
	const int e = threadIdx.x;
	int total = 0, first;

	if (e < E)
		for (int c = 0; c < n_chunks; c++)
			total += hist[(int64_t)c * E + e];
	first = block_exclusive_scan(total, s_warp);
	if (e < E) {
		offsets[e] = first;
		for (int c = 0; c < n_chunks; c++) {
			const int h = hist[(int64_t)c * E + e];

			hist[(int64_t)c * E + e] = first;
			first += h;
		}
	}
	if (e == 0)
		offsets[E] = R;
}

/* slot[a] += hist[a / ch, ids[a]]; order[slot[a]] = a; grid-stride over a < R. */
__global__ void route_scatter_kernel(int32_t *__restrict__ order, int32_t *__restrict__ slot,
				     const int32_t *__restrict__ hist,
				     const int32_t *__restrict__ ids, int R, int E, int ch)
{
	for (int a = blockIdx.x * blockDim.x + threadIdx.x; a < R; a += gridDim.x * blockDim.x) {
		const int s = hist[(int64_t)(a / ch) * E + ids[a]] + slot[a];

		slot[a] = s;
		order[s] = a;
	}
}

template <int VPL>
static int route_launch(struct cuda_backend *cu, int32_t *ids, float *w, int32_t *order,
			int32_t *slot, int32_t *offsets, const float *logits, int T, int E, int k,
			bool norm)
{
	const int R = T * k;
	int64_t ch;
	int n_chunks;

	if (R <= ROUTE_SMALL_ROWS) {
		route_small_kernel<VPL><<<1, ROUTE_SMALL_THREADS, 0, cu->stream>>>(
			ids, w, order, slot, offsets, logits, T, E, k, norm);
		CU_LAUNCHED();
		return 0;
	}
	/* chunks of CUDA_MOE_CHUNK, longer when the workspace holds too few */
	ch = ((int64_t)R + cu->moe_chunks - 1) / cu->moe_chunks;
	ch = ch < CUDA_MOE_CHUNK ? CUDA_MOE_CHUNK : (ch + 31) / 32 * 32;
	n_chunks = (int)((R + ch - 1) / ch);
	route_topk_kernel<VPL><<<(unsigned)((T + ROUTE_TOPK_WARPS - 1) / ROUTE_TOPK_WARPS),
				 ROUTE_TOPK_WARPS * 32, 0, cu->stream>>>(ids, w, logits, T, E, k,
									 norm);
	CU_LAUNCHED();
	route_rank_kernel<<<(unsigned)((n_chunks + ROUTE_RANK_WARPS - 1) / ROUTE_RANK_WARPS),
			    ROUTE_RANK_WARPS * 32, 0, cu->stream>>>(slot, cu->moe_hist, ids, R, E,
								     (int)ch, n_chunks);
	CU_LAUNCHED();
	route_scan_kernel<<<1, ROUTE_SCAN_THREADS, 0, cu->stream>>>(offsets, cu->moe_hist, R, E,
								     n_chunks);
	CU_LAUNCHED();
	route_scatter_kernel<<<cu_blocks(R), CUDA_THREADS, 0, cu->stream>>>(order, slot,
									   cu->moe_hist, ids, R,
									   E, (int)ch);
	CU_LAUNCHED();
	return 0;
}

static bool route_args_ok(const struct kt_tensor *ids, const struct kt_tensor *w,
			  const struct kt_tensor *order, const struct kt_tensor *slot,
			  const struct kt_tensor *offsets, const struct kt_tensor *logits)
{
	const struct kt_tensor *all[] = { ids, w, order, slot, offsets, logits };
	int64_t T, E, k;

	if (!cu_valid(logits, KT_F32) || !cu_valid(ids, KT_I32))
		return false;
	T = logits->rows;
	E = logits->cols;
	k = ids->cols;
	if (E < 1 || E > CUDA_MOE_MAX_E || k < 1 || k > KT_MOE_MAX_K || k > E ||
	    T > INT32_MAX / k)
		return false;
	if (ids->rows != T || !cu_shape(w, KT_F32, T, k) || !cu_shape(order, KT_I32, T * k, 1) ||
	    !cu_shape(slot, KT_I32, T * k, 1) || !cu_shape(offsets, KT_I32, E + 1, 1))
		return false;
	/* the outputs (all but logits) touch nothing else */
	for (int i = 0; i < 5; i++)
		for (int j = i + 1; j < 6; j++)
			if (cu_overlap(all[i], all[j]))
				return false;
	return true;
}

int cuda_moe_route(struct kt_backend *be, const struct kt_tensor *ids, const struct kt_tensor *w,
		   const struct kt_tensor *order, const struct kt_tensor *slot,
		   const struct kt_tensor *offsets, const struct kt_tensor *logits, bool norm)
{
	struct cuda_backend *cu = cu_of(be);
	int32_t *idd, *od, *sd, *offd;
	float *wd;
	const float *ld;
	int T, E, k;

	if (!route_args_ok(ids, w, order, slot, offsets, logits))
		return -EINVAL;
	T = (int)logits->rows;
	E = (int)logits->cols;
	k = (int)ids->cols;
	CU_CHECK(cu_enter(cu));
	if (!T) {
		CU_CHECK(cudaMemsetAsync(offsets->data, 0, kt_nbytes(offsets), cu->stream));
		return 0;
	}
	idd = (int32_t *)ids->data;
	wd = (float *)w->data;
	od = (int32_t *)order->data;
	sd = (int32_t *)slot->data;
	offd = (int32_t *)offsets->data;
	ld = (const float *)logits->data;
	if (E <= 64)
		return route_launch<2>(cu, idd, wd, od, sd, offd, ld, T, E, k, norm);
	if (E <= 128)
		return route_launch<4>(cu, idd, wd, od, sd, offd, ld, T, E, k, norm);
	if (E <= 256)
		return route_launch<8>(cu, idd, wd, od, sd, offd, ld, T, E, k, norm);
	if (E <= 512)
		return route_launch<16>(cu, idd, wd, od, sd, offd, ld, T, E, k, norm);
	return route_launch<32>(cu, idd, wd, od, sd, offd, ld, T, E, k, norm);
}

int cuda_moe_open(struct cuda_backend *cu, const struct kt_config *c)
{
	const int64_t rows = (int64_t)c->max_tokens * KT_MOE_MAX_K;

	cu->moe_chunks = (int)((rows + CUDA_MOE_CHUNK - 1) / CUDA_MOE_CHUNK);
	if (cu->moe_chunks < 1)
		cu->moe_chunks = 1;
	CU_CHECK(cudaMalloc((void **)&cu->moe_hist,
			    (size_t)cu->moe_chunks * CUDA_MOE_MAX_E * sizeof(*cu->moe_hist)));
	CU_CHECK(cuda_moe_gemm_prepare());
	return 0;
}

void cuda_moe_close(struct cuda_backend *cu)
{
	CU_WARN(cudaFree(cu->moe_hist));
	cu->moe_hist = NULL;
}
