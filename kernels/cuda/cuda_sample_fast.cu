/* Sampling's fast launches (cuda_sample.cu dispatches; the definitions of
 * rank order, masses and the sets are at its top), many blocks a row.
 *
 * Greedy rows (greedy_kernel): a row is read by up to
 * CUDA_SAMPLE_MAX_CHUNKS blocks of SAMPLE_THREADS, each taking a chunk of
 * at least SAMPLE_CHUNK_MIN logits: one block reading a row of Qwen3's
 * 151,936 alone took 40 us, 3 % of a Qwen3-0.6B decode step at batch 1
 * (H100, docs/perf.md). Each block leaves its chunk's (key, ~id) maximum in
 * cu->sample_part and counts itself in cu->sample_count; the row's last
 * block takes the maximum of the maxima (exact in any order: the pick one
 * block alone makes), writes it and sets the count back to 0.
 *
 * Rows greedy or of a top_k of at most TOPK_MAX_K (topk_kernel; the
 * sessions' default top_k is 40): a block a chunk of TOPK_CHUNK logits
 * selects its top_k (key, ~id) values in rank order (topk_desc: the keys at
 * or above a threshold that keeps at least top_k of them, each placed by
 * its rank among them; a sort of all 4,096 made 64 rows of 38 blocks cost
 * Qwen3-0.6B a quarter of its batch-64 rate) and leaves them in
 * cu->sample_cand, which hold the row's top_k first among them; the row's
 * last block selects those the same way and draws from them (topk_pick:
 * sample_row's sets and bounds over a list of at most TOPK_MAX_K, its
 * running masses a scan). At one row the kernel took 40 us with a sort
 * for each selection and the pick in one thread, 19 us so, a
 * greedy_kernel 5 (H200 traces, 2026-12-03, docs/perf.md). The
 * one-block radix selection took 9 to 13 passes over the row, 40-50 us
 * each: about 0.6 ms a step at any batch (docs/perf.md).
 */
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_pdl.cuh"
#include "kernels/cuda/cuda_sample.cuh"

/* Logits a block of the max pass reads at least: 4 loads of 16 bytes a
 * thread; a row of 151,936 takes 19 blocks. */
#define SAMPLE_CHUNK_MIN (16 * SAMPLE_THREADS)

/* topk_kernel: logits a block sorts, the candidates a row's last block
 * sorts, the largest top_k it takes (topk_pick's sums stay exact in a
 * double), and the rows a launch takes (cu->sample_cand holds that many
 * rows of TOPK_CAND). */
#define TOPK_CHUNK 4096
#define TOPK_CAND CUDA_SAMPLE_TOPK_CAND
#define TOPK_MAX_K 256


/* Greedy row blockIdx.y's pick: block blockIdx.x takes logits [x·chunk,
 * (x+1)·chunk) (chunk a multiple of 4). part [rows, CUDA_SAMPLE_MAX_CHUNKS]
 * and count [rows] are cu->sample_part and cu->sample_count. */
__global__ void __launch_bounds__(SAMPLE_THREADS)
	greedy_kernel(const float *logits, int64_t V, int64_t chunk, sample_out out,
		      uint64_t *part, unsigned *count)
{
	__shared__ uint64_t red[32];
	__shared__ bool last;
	const int row = blockIdx.y;
	const float *l = logits + row * V + blockIdx.x * chunk;
	const int64_t lo = blockIdx.x * chunk, n = V - lo < chunk ? V - lo : chunk;
	const row_ctx c = { l, n, n % 4 == 0 && (uintptr_t)l % 16 == 0, 0.0f, 0.0f };
	uint64_t *rp = part + (int64_t)row * CUDA_SAMPLE_MAX_CHUNKS;
	uint64_t best;

	pdl_wait();
	pdl_launch_dependents();
	sample_publish_fault(out);
	best = row_best(c, lo, red);
	if (threadIdx.x == 0) {
		rp[blockIdx.x] = best;
		__threadfence();
		last = atomicAdd(&count[row], 1u) == gridDim.x - 1;
	}
	__syncthreads();
	static_assert(CUDA_SAMPLE_MAX_CHUNKS <= 64, "a warp reads a row's maxima, two a lane");
	if (!last || threadIdx.x >= 32)
		return;
	const int k = threadIdx.x;
	uint64_t a, b;

	__threadfence();
	a = k < (int)gridDim.x ? __ldcg(rp + k) : 0;
	b = k + 32 < (int)gridDim.x ? __ldcg(rp + k + 32) : 0;
	best = warp_reduce(a > b ? a : b, op_max());
	if (k == 0) {
		out.ids[row] = (int32_t)(0xffffffffu - (uint32_t)best);
		count[row] = 0;
	}
}

/* v[0, n) sorted into descending order by the block (n a power of 2), a
 * bitonic network through shared memory: for more values than threads. */
__device__ void sort_desc(uint64_t *v, int n)
{
	for (int k = 2; k <= n; k <<= 1)
		for (int j = k >> 1; j > 0; j >>= 1) {
			for (int i = threadIdx.x; i < n; i += blockDim.x) {
				const int o = i ^ j;

				if (o > i) {
					const uint64_t a = v[i], b = v[o];

					if ((i & k) == 0 ? a < b : a > b) {
						v[i] = b;
						v[o] = a;
					}
				}
			}
			__syncthreads();
		}
}

/* v[0, SAMPLE_THREADS) sorted into descending order by the block, the same
 * network with value i in thread i's register: a compare of partners in one
 * warp (j < 32) is a shuffle, one across warps goes through v and spare
 * ([SAMPLE_THREADS] of shared scratch) in turn, a barrier a compare. The
 * network in shared memory paid a barrier for each of its 45 compares. */
__device__ void sort_desc_regs(uint64_t *v, uint64_t *spare)
{
	const int i = threadIdx.x;
	uint64_t x = v[i];
	bool turn = false;

	for (int k = 2; k <= SAMPLE_THREADS; k <<= 1)
		for (int j = k >> 1; j > 0; j >>= 1) {
			uint64_t y;

			if (j >= 32) {
				uint64_t *b = turn ? spare : v;

				turn = !turn;
				b[i] = x;
				__syncthreads();
				y = b[i ^ j];
			} else {
				y = __shfl_xor_sync(FULL_WARP, x, j);
			}
			/* the lower of the pair keeps the larger in a descending run */
			const bool lower = (i & j) == 0, desc = (i & k) == 0;
			x = (lower == desc) ? (x > y ? x : y) : (x < y ? x : y);
		}
	__syncthreads();
	v[i] = x;
	__syncthreads();
}

/* Largest keys a block ranks by counting instead of sorting: each of
 * them compares itself with all the others, about 42 for k = 40. */
#define TOPK_RANK_MAX 256

/* The k largest of n keys (k <= TOPK_MAX_K, n <= TOPK_CAND, unique but
 * for 0s), in descending order with 0s after the keys if fewer than k, by
 * the block: key i is key(i), read once. Returns where they are: spare
 * ([SAMPLE_THREADS] of shared scratch) or v. Each thread keeps its keys
 * i = tid + SAMPLE_THREADS·j in registers; the k-th largest of the
 * threads' maxima, t, has at least k keys at or above it (those maxima),
 * so the k largest are among the keys >= t. Those (a few more than k for
 * logits: about 42 for k = 40 of 4,096) are gathered into v and each one's
 * rank among them (the keys above it) is its place: the same k keys in the
 * same order as a sort of all n. */
template <typename F>
__device__ uint64_t *topk_desc(uint64_t *v, int n, int k, uint64_t *spare, int *count,
			       const F &key)
{
	constexpr int J = TOPK_CAND / SAMPLE_THREADS;
	uint64_t x[J], m = 0, t;
	int c, p = 1;

	static_assert(TOPK_MAX_K <= SAMPLE_THREADS, "the threshold is one of the maxima");
	static_assert(TOPK_RANK_MAX <= SAMPLE_THREADS, "a thread ranks one key");
#pragma unroll
	for (int j = 0; j < J; j++) {
		const int i = (int)threadIdx.x + j * SAMPLE_THREADS;

		x[j] = i < n ? key(i) : 0;
		m = x[j] > m ? x[j] : m;
	}
	spare[threadIdx.x] = m;
	if (threadIdx.x == 0)
		*count = 0;
	sort_desc_regs(spare, v);
	t = spare[k - 1];
#pragma unroll
	for (int j = 0; j < J; j++) {
		const bool in = x[j] >= t && x[j] != 0;
		const unsigned ballot = __ballot_sync(FULL_WARP, in);
		const int lane = threadIdx.x & 31;
		const int leader = ballot ? __ffs(ballot) - 1 : 0;
		int base = 0;

		if (ballot && lane == leader)
			base = atomicAdd(count, __popc(ballot));
		base = __shfl_sync(FULL_WARP, base, leader);
		if (in)
			v[base + __popc(ballot & ((1u << lane) - 1u))] = x[j];
	}
	__syncthreads();
	c = *count;
	if (c <= TOPK_RANK_MAX) {
		const int i = threadIdx.x;

		if (i < c) {
			const uint64_t key_i = v[i];
			int rank = 0;

			for (int j = 0; j < c; j++)
				rank += v[j] > key_i;
			if (rank < k)
				spare[rank] = key_i;
		} else if (i < k) {
			spare[i] = 0;
		}
		__syncthreads();
		return spare;
	}
	while (p < c || p < k)
		p <<= 1;
	for (int i = c + (int)threadIdx.x; i < p; i += SAMPLE_THREADS)
		v[i] = 0;
	__syncthreads();
	sort_desc(v, p);
	return v;
}

/* sample_row's pick for a row of q whose k first tokens of rank order are
 * c[0, k) ((key, ~id), rank order; k = q.top_k < V, or 1 for a greedy row),
 * by the block: the same sets and bounds, with the running masses summed
 * token by token. Thread i < k takes token i's mass and the running masses
 * are a scan of them: sums of integers, the same in any order. A tie group
 * that a radix level splits gets the same position here: every sum of
 * k <= TOPK_MAX_K masses of at most 2^40 is exact in a double, so
 * sample_row's comparisons and tie_position's give what this one's exact
 * ones give. run: [TOPK_MAX_K] of shared scratch. */
__device__ int32_t topk_pick(const uint64_t *c, int k, const kt_sample_row &q, uint64_t *run)
{
	__shared__ uint64_t warp_sums[SAMPLE_WARPS];
	__shared__ int first_in_p, first_drawn;
	const row_ctx r = { NULL, 0, false, key_logit((uint32_t)(c[0] >> 32)), q.temperature };
	auto id_of = [&](int i) { return (int32_t)(0xffffffffu - (uint32_t)c[i]); };
	const int i = threadIdx.x, lane = i & 31;
	uint64_t mine, total;
	int n = k;

	if (q.temperature == 0.0f)
		return id_of(0);
	mine = i < k ? mass_of(r, key_logit((uint32_t)(c[i] >> 32))) : 0;
	for (int o = 1; o < 32; o <<= 1) {
		const uint64_t below = __shfl_up_sync(FULL_WARP, mine, o);

		if (lane >= o)
			mine += below;
	}
	if (lane == 31)
		warp_sums[i >> 5] = mine;
	if (i == 0) {
		first_in_p = k;
		first_drawn = k;
	}
	__syncthreads();
	for (int w = 0; w < (i >> 5); w++)
		mine += warp_sums[w];
	if (i < k)
		run[i] = mine;
	__syncthreads();
	total = run[k - 1];
	if (q.top_p < 1.0f) {
		const double bound = (double)q.top_p * (double)total;

		if (i < k && meets((double)mine, bound, false))
			atomicMin(&first_in_p, i);
		__syncthreads();
		if (first_in_p < k) {
			n = first_in_p + 1;
			total = run[first_in_p];
		}
	}
	const double bound = (double)q.u * (double)total;

	if (i < n && meets((double)mine, bound, true))
		atomicMin(&first_drawn, i);
	__syncthreads();
	return id_of(first_drawn < n ? first_drawn : n - 1);
}

/* Row blockIdx.y of a launch whose rows are greedy or have a top_k of at
 * most TOPK_MAX_K: block blockIdx.x sorts logits [x·TOPK_CHUNK,
 * (x+1)·TOPK_CHUNK) by rank and leaves its k first in cand (row r's
 * [x·k, (x+1)·k) of cand + r·TOPK_CAND, k·gridDim.x <= TOPK_CAND); the
 * row's last block sorts those and picks from the k first. */
__global__ void __launch_bounds__(SAMPLE_THREADS)
	topk_kernel(const float *logits, int64_t V, const kt_sample_row *rows, sample_out out,
		    uint64_t *cand, unsigned *count)
{
	__shared__ uint64_t v[TOPK_CAND], spare[SAMPLE_THREADS];
	__shared__ int count_in;
	__shared__ bool last;
	const int row = blockIdx.y;
	const kt_sample_row q = rows[row]; /* the host's, not the kernel before's */
	const int k = q.temperature > 0.0f ? q.top_k : 1;
	const int64_t lo = (int64_t)blockIdx.x * TOPK_CHUNK;
	const float *l = logits + row * V;
	uint64_t *rc = cand + (int64_t)row * TOPK_CAND;

	static_assert(TOPK_CHUNK <= TOPK_CAND, "a chunk sorts in the row's buffer");
	pdl_wait();
	pdl_launch_dependents();
	sample_publish_fault(out);
	const uint64_t *top = topk_desc(v, TOPK_CHUNK, k, spare, &count_in, [&](int i) {
		return lo + i < V ? (uint64_t)rank_key(__ldg(l + lo + i)) << 32 |
					    (0xffffffffu - (uint32_t)(lo + i))
				  : (uint64_t)0;
	});
	for (int i = threadIdx.x; i < k; i += blockDim.x)
		rc[blockIdx.x * k + i] = top[i];
	__syncthreads();
	if (threadIdx.x == 0) {
		__threadfence();
		last = atomicAdd(&count[row], 1u) == gridDim.x - 1;
	}
	__syncthreads();
	if (!last)
		return;
	__threadfence();
	top = topk_desc(v, k * (int)gridDim.x, k, spare, &count_in,
			[&](int i) { return __ldcg(rc + i); });
	const int32_t id = topk_pick(top, k, q, top == v ? spare : v);

	if (threadIdx.x == 0) {
		out.ids[row] = id;
		count[row] = 0;
	}
}

bool cuda_sample_topk_takes(const struct kt_sample_row *rows, int n, int64_t V)
{
	const int64_t chunks = (V + TOPK_CHUNK - 1) / TOPK_CHUNK;

	for (int i = 0; i < n; i++) {
		const struct kt_sample_row *q = &rows[i];

		if (q->temperature != 0.0f &&
		    !(q->top_k >= 1 && q->top_k <= TOPK_MAX_K && q->top_k < V &&
		      q->top_k * chunks <= TOPK_CAND))
			return false;
	}
	return true;
}

void cuda_sample_greedy_launch(struct cuda_backend *cu, const float *l, int64_t V, int m,
			       bool pdl)
{
	/* the fewest chunks of at least SAMPLE_CHUNK_MIN, at most CUDA_SAMPLE_MAX_CHUNKS */
	const int64_t per = (V + CUDA_SAMPLE_MAX_CHUNKS - 1) / CUDA_SAMPLE_MAX_CHUNKS;
	const int64_t chunk = per > SAMPLE_CHUNK_MIN ? (per + 3) / 4 * 4 : SAMPLE_CHUNK_MIN;
	const unsigned chunks = (unsigned)((V + chunk - 1) / chunk);

	cu_launch(pdl && cu->pdl, greedy_kernel, dim3(chunks, (unsigned)m), dim3(SAMPLE_THREADS), 0,
		  cu->stream, l, V, chunk, sample_out_of(cu), cu->sample_part, cu->sample_count);
}

void cuda_sample_topk_launch(struct cuda_backend *cu, const float *l, int64_t V, int m,
			     const struct kt_sample_row *rows, bool pdl)
{
	const unsigned chunks = (unsigned)((V + TOPK_CHUNK - 1) / TOPK_CHUNK);

	cu_launch(pdl && cu->pdl, topk_kernel, dim3(chunks, (unsigned)m), dim3(SAMPLE_THREADS), 0,
		  cu->stream, l, V, rows, sample_out_of(cu), cu->sample_cand, cu->sample_count);
}
