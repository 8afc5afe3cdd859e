/* Sampling one token id per row of logits [n, V] f32, on the device, with
 * the cpu backend's semantics (see kernels/cpu/cpu_sample.c):
 *
 * temperature 0: argmax, lowest id on ties. Otherwise tokens are taken in
 * rank order (larger logit first, lower id on equal logits, NaN as -inf) with
 * weights w = exp((l - l_max) / temperature) (1 for l == l_max):
 *  1. top-k keeps the first k tokens of rank order (0 or >= V: all);
 *  2. top-p keeps the shortest prefix of those whose mass reaches top_p times
 *     their total (all of them when rounding leaves it short);
 *  3. the pick is the first kept token whose running mass exceeds u times
 *     the kept mass (the last kept one when rounding leaves it short).
 *
 * Every step is "find the first token of rank order whose running measure
 * (count or mass) meets a bound", solved without sorting by a radix select
 * on an order-preserving 32-bit key of the logit: four passes over the row,
 * each building a 256-bucket histogram (count and mass) of the next 8 key
 * bits among the tokens still in play, then walking the buckets from the
 * top. The last level leaves one key value x; equal logits have equal
 * weights, so the position c inside x's tie group follows in closed form,
 * and the c-th lowest id with key x is the token. A prefix of rank order is
 * kept as (x, c): every token with key > x and the first c with key x.
 *
 * Masses are fixed point: each f32 weight is rounded to a multiple of 2^-40
 * and summed in 64-bit integers, so sums are exact and independent of order
 * (the pick depends only on the inputs). Against the cpu's double sums this
 * moves a running mass by at most V·2^-41 (1.2e-7 at V = 2^18, relative to
 * the mass 1 of the top token), about the f32 resolution of u: picks differ
 * only where u lands within rounding of a boundary. V is limited to
 * SAMPLE_MAX_V so that sums fit in 64 bits.
 *
 * Launch: a launch of greedy rows, or of rows greedy or of a small top_k
 * (the sessions' default), takes cuda_sample_fast.cu's kernels, many blocks
 * a row. Any other (top_k off, or large) takes sample_kernel, one block of
 * SAMPLE_THREADS a row, which finds l_max and samples the row as above. In
 * a histogram pass the lanes of a warp that hit the same bucket are grouped
 * (__match_any_sync) and their masses summed by __reduce_add_sync (low 24
 * and high 16 bits apart); the group's leader adds the sum to its warp's
 * private histogram (no atomics: 64-bit shared-memory atomics are
 * compare-and-swap loops) and the count to the shared one; the warps'
 * histograms are summed after the pass. The per-row requests go up through
 * a pinned buffer, and the kernels write the ids (and the fault word) into
 * pinned host memory themselves (sample_out), both sized at open
 * (cu->sample_cap rows per launch).
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_pdl.cuh"
#include "kernels/cuda/cuda_sample.cuh"

/* A prefix of rank order: all tokens when !bounded, else every token with
 * key > x and the first c (by id) with key == x. */
struct prefix_set {
	bool bounded;
	uint32_t x;
	int64_t c;
};

/* A selected token: key x, position c (1-based) in x's tie group, and its id. */
struct selection {
	bool found;
	uint32_t x;
	int64_t c;
	int32_t id;
};

struct sample_shared {
	unsigned cnt[256];
	uint64_t mass[256];
	uint64_t warp_mass[SAMPLE_WARPS][256]; /* each warp's private histogram */
	int32_t min_id[256];
	uint64_t u64[32];
	int warp_cnt[SAMPLE_WARPS];
	uint32_t prefix;
	int digit;           /* chosen bucket, -1: none */
	double bound;        /* of the running selection, in its units */
	uint64_t acc;        /* running measure (count or mass) above the bucket */
	int32_t id;
};

/* Add one token (when `in`) of mass m to bucket `digit` (the count only,
 * when by_count). Called by all lanes. */
__device__ void hist_add(sample_shared &sh, bool in, unsigned digit, uint64_t m, bool by_count)
{
	const unsigned active = __ballot_sync(FULL_WARP, in);
	unsigned peers, lo = 0, hi = 0;

	if (!in)
		return;
	peers = __match_any_sync(active, digit);
	if (!by_count) {
		lo = __reduce_add_sync(peers, (unsigned)(m & 0xffffffu));
		hi = __reduce_add_sync(peers, (unsigned)(m >> 24));
	}
	if ((int)(threadIdx.x & 31) == __ffs(peers) - 1) {
		sh.warp_mass[threadIdx.x >> 5][digit] += ((uint64_t)hi << 24) + lo;
		atomicAdd(&sh.cnt[digit], (unsigned)__popc(peers));
	}
}

/* One radix level: histogram of the 8 key bits at `shift` among the tokens
 * of S whose higher bits equal sh.prefix (mask `hi`); masses stay 0 when
 * by_count. */
__device__ void level_histogram(sample_shared &sh, const row_ctx &r, const prefix_set &S,
				uint32_t hi, int shift, bool by_count)
{
	const uint32_t prefix = sh.prefix;

	for (int i = threadIdx.x; i < 256; i += blockDim.x) {
		sh.cnt[i] = 0;
		sh.min_id[i] = INT32_MAX;
	}
	for (int i = threadIdx.x; i < SAMPLE_WARPS * 256; i += blockDim.x)
		sh.warp_mass[i / 256][i % 256] = 0;
	__syncthreads();
	for_each_logit(r, [&](int64_t i, float l, bool ok) {
		const uint32_t key = rank_key(l);
		const bool match = ok && (key & hi) == prefix;
		const bool in = match && (!S.bounded || key > S.x);
		const unsigned digit = (key >> shift) & 255u;

		hist_add(sh, in, digit, in && !by_count ? mass_of(r, key_logit(key)) : 0, by_count);
		if (shift == 0 && match && (!S.bounded || key >= S.x))
			atomicMin(&sh.min_id[digit], (int32_t)i);
	});
	__syncthreads();
	for (int d = threadIdx.x; d < 256; d += blockDim.x) {
		uint64_t m = 0;

		for (int w = 0; w < SAMPLE_WARPS; w++)
			m += sh.warp_mass[w][d];
		sh.mass[d] = m;
	}
	__syncthreads();
	if (threadIdx.x == 0 && S.bounded && (S.x & hi) == prefix) {
		const unsigned d = (S.x >> shift) & 255u;

		sh.cnt[d] += (unsigned)S.c;
		sh.mass[d] += (uint64_t)S.c * mass_of(r, key_logit(S.x));
	}
	__syncthreads();
}

/* Thread 0: walk the buckets from the top, choosing the first whose running
 * measure meets sh.bound. */
__device__ void level_walk(sample_shared &sh, bool by_count, bool strict)
{
	sh.digit = -1;
	for (int d = 255; d >= 0; d--) {
		const uint64_t v = by_count ? sh.cnt[d] : sh.mass[d];

		if (!sh.cnt[d])
			continue;
		if (meets((double)(sh.acc + v), sh.bound, strict)) {
			sh.digit = d;
			return;
		}
		sh.acc += v;
	}
}

/* Position (1-based) in a tie group of n tokens of measure m each, after
 * `acc`, of the first one whose running measure meets the bound. */
__device__ int64_t tie_position(double acc, double m, int64_t n, double bound, bool strict)
{
	double q;
	int64_t c;

	if (m <= 0.0)
		return 1;
	q = (bound - acc) / m;
	c = q < 1.0 ? 1 : q >= (double)n ? n : (int64_t)q;
	while (c > 1 && meets(acc + (double)(c - 1) * m, bound, strict))
		c--;
	while (c < n && !meets(acc + (double)c * m, bound, strict))
		c++;
	return c;
}

/* The c-th lowest id among tokens with key x (c >= 1, and there are that many). */
__device__ int32_t nth_with_key(sample_shared &sh, const row_ctx &r, uint32_t x, int64_t c)
{
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	int64_t seen = 0;

	if (threadIdx.x == 0)
		sh.id = 0;
	for (int64_t base = 0; base < r.V && seen < c; base += blockDim.x) {
		const int64_t i = base + threadIdx.x;
		const bool hit = i < r.V && rank_key(r.l[i]) == x;
		const unsigned bal = __ballot_sync(FULL_WARP, hit);
		int64_t before = seen + __popc(bal & ((1u << lane) - 1));

		if (lane == 0)
			sh.warp_cnt[warp] = __popc(bal);
		__syncthreads();
		for (int w = 0; w < SAMPLE_WARPS; w++) {
			before += w < warp ? sh.warp_cnt[w] : 0;
			seen += sh.warp_cnt[w];
		}
		if (hit && before + 1 == c)
			sh.id = (int32_t)i;
		__syncthreads();
	}
	__syncthreads();
	return sh.id;
}

/* The first token of S, in rank order, whose running count (by_count) meets
 * `bound`, or whose running mass meets `bound` times the mass of S (> with
 * strict, else >=). The first level's histogram covers all of S, so it
 * gives that mass without a pass of its own. */
__device__ selection select_first(sample_shared &sh, const row_ctx &r, const prefix_set &S,
				  bool by_count, double bound, bool strict)
{
	selection s = {};
	uint32_t hi = 0;
	int d = -1;

	if (threadIdx.x == 0) {
		sh.prefix = 0;
		sh.acc = 0;
	}
	__syncthreads();
	for (int shift = 24; shift >= 0; shift -= 8) {
		level_histogram(sh, r, S, hi, shift, by_count);
		if (threadIdx.x == 0) {
			if (shift == 24) {
				uint64_t total = 0;

				for (int i = 0; i < 256; i++)
					total += sh.mass[i];
				sh.bound = by_count ? bound : bound * (double)total;
			}
			level_walk(sh, by_count, strict);
			if (sh.digit >= 0)
				sh.prefix |= (uint32_t)sh.digit << shift;
		}
		__syncthreads();
		d = sh.digit;
		if (d < 0)
			return s;
		hi |= 255u << shift;
	}
	s.found = true;
	s.x = sh.prefix;
	s.c = tie_position((double)sh.acc, by_count ? 1.0 : (double)mass_of(r, key_logit(s.x)),
			   (int64_t)sh.cnt[d], sh.bound, strict);
	s.id = s.c == 1 ? sh.min_id[d] : nth_with_key(sh, r, s.x, s.c);
	__syncthreads();
	return s;
}

__device__ int32_t sample_row(sample_shared &sh, const row_ctx &r, const kt_sample_row &q)
{
	const int64_t limit = q.top_k > 0 && q.top_k < r.V ? q.top_k : r.V;
	prefix_set S = { false, 0, 0 };
	selection s;

	if (limit < r.V) {
		s = select_first(sh, r, S, true, (double)limit, false);
		S = { true, s.x, s.c };
	}
	if (q.top_p < 1.0f) {
		s = select_first(sh, r, S, false, (double)q.top_p, false);
		if (s.found)
			S = { true, s.x, s.c };
	}
	s = select_first(sh, r, S, false, (double)q.u, true);
	if (s.found)
		return s.id;
	if (S.bounded)
		return nth_with_key(sh, r, S.x, S.c);
	s = select_first(sh, r, S, true, (double)r.V, false);
	return s.id;
}

/* Row blockIdx.x's pick, one block a row. */
__global__ void __launch_bounds__(SAMPLE_THREADS)
	sample_kernel(const float *logits, int64_t V, const kt_sample_row *rows, sample_out out)
{
	__shared__ sample_shared sh;
	const kt_sample_row q = rows[blockIdx.x]; /* the host's, not the kernel before's */
	const float *l = logits + blockIdx.x * V;
	row_ctx r = { l, V, V % 4 == 0 && (uintptr_t)l % 16 == 0, 0.0f, q.temperature };
	uint64_t best;
	int32_t id;

	pdl_wait();
	pdl_launch_dependents();
	sample_publish_fault(out);
	best = row_best(r, 0, sh.u64);
	if (q.temperature == 0.0f) {
		if (threadIdx.x == 0)
			out.ids[blockIdx.x] = (int32_t)(0xffffffffu - (uint32_t)best);
		return;
	}
	r.lmax = key_logit((uint32_t)(best >> 32));
	id = sample_row(sh, r, q);
	if (threadIdx.x == 0)
		out.ids[blockIdx.x] = id;
}

static bool row_ok(const struct kt_sample_row *s)
{
	return isfinite(s->temperature) && s->temperature >= 0.0f && s->top_p >= 0.0f &&
	       s->top_p <= 1.0f && s->top_k >= 0 && s->u >= 0.0f && s->u < 1.0f;
}

/* The kernels that rows take, sample()'s and a draw's kind: greedy_kernel
 * (every row greedy), topk_kernel (each greedy or of a small top_k), or
 * sample_kernel; the same ids whichever (the top of this file). */
enum rows_kernel { ROWS_GREEDY, ROWS_TOPK, ROWS_FULL };

/* The kernel of rows [0, n) of logits of V columns; -EINVAL for a request
 * out of range. */
static int rows_kernel_of(const struct kt_sample_row *rows, int n, int64_t V)
{
	bool greedy = true;

	for (int i = 0; i < n; i++) {
		if (!row_ok(&rows[i]))
			return -EINVAL;
		greedy = greedy && rows[i].temperature == 0.0f;
	}
	return greedy ? ROWS_GREEDY : cuda_sample_topk_takes(rows, n, V) ? ROWS_TOPK : ROWS_FULL;
}

int cuda_sample(struct kt_backend *be, const struct kt_tensor *logits,
		const struct kt_sample_row *rows, int n, int32_t *ids)
{
	struct cuda_backend *cu = cu_of(be);
	int64_t V;
	int rc = 0;

	if (n < 0 || !cu_valid(logits, KT_F32) || logits->rows != n || (n && (!rows || !ids)))
		return -EINVAL;
	V = logits->cols;
	if (V < 1 || V > SAMPLE_MAX_V)
		return -EINVAL;
	const int kernel = rows_kernel_of(rows, n, V);
	const bool greedy = kernel == ROWS_GREEDY, topk = kernel == ROWS_TOPK;
	int cap = cu->sample_cap < 65535 ? cu->sample_cap : 65535; /* grid y */

	if (kernel < 0)
		return kernel;
	if (topk && cap > CUDA_SAMPLE_TOPK_ROWS)
		cap = CUDA_SAMPLE_TOPK_ROWS;
	CU_CHECK(cu_enter(cu));
	for (int r0 = 0; r0 < n && !rc; r0 += cap) {
		const int m = n - r0 < cap ? n - r0 : cap;
		const float *l = (const float *)logits->data + (int64_t)r0 * V;

		if (!greedy) {
			memcpy(cu->rows_host, rows + r0, (size_t)m * sizeof(*rows));
			CU_CHECK(cudaMemcpyAsync(cu->rows_dev, cu->rows_host,
						 (size_t)m * sizeof(*rows), cudaMemcpyHostToDevice,
						 cu->stream));
		}
		if (greedy)
			cuda_sample_greedy_launch(cu, l, V, m, false);
		else if (topk)
			cuda_sample_topk_launch(cu, l, V, m, cu->rows_dev, false);
		else
			sample_kernel<<<(unsigned)m, SAMPLE_THREADS, 0, cu->stream>>>(
				l, V, cu->rows_dev, sample_out_of(cu));
		CU_LAUNCHED();
		rc = cuda_sync_published(cu);
		if (!rc)
			memcpy(ids + r0, cu->ids_host, (size_t)m * sizeof(*ids));
	}
	return n ? rc : cuda_sync_point(cu);
}

int cuda_draw_rows(struct kt_backend *be, const struct kt_sample_row *rows, int n, int64_t V)
{
	struct cuda_backend *cu = cu_of(be);
	const int cap = cu->sample_cap < 65535 ? cu->sample_cap : 65535; /* grid y */

	if (n < 1 || n > cap || !rows || V < 1 || V > SAMPLE_MAX_V)
		return -EINVAL;
	int kernel = rows_kernel_of(rows, n, V);

	if (kernel < 0)
		return kernel;
	/* a draw is one launch: topk_kernel's only up to its candidates' rows */
	if (kernel == ROWS_TOPK && n > CUDA_SAMPLE_TOPK_ROWS)
		kernel = ROWS_FULL;
	memcpy(cu->draw_host, rows, (size_t)n * sizeof(*rows));
	cu->draw_n = n;
	cu->draw_v = V;
	cu->draw_kind = kernel;
	static_assert(ROWS_FULL < KT_DRAW_KINDS, "a draw's kind fits a graph's key");
	return kernel;
}

/* The draw's kernels under PDL, not waited for: they read the staged
 * requests through draw_map (before their wait: the host wrote them before
 * the launch) and write the ids into ids_host themselves, so drawn() only
 * waits. */
int cuda_draw(struct kt_backend *be, const struct kt_tensor *logits)
{
	struct cuda_backend *cu = cu_of(be);
	const int m = cu->draw_n;

	if (!cu_valid(logits, KT_F32) || m < 1 || logits->rows != m || logits->cols != cu->draw_v)
		return -EINVAL;
	CU_CHECK(cu_enter(cu));
	const float *l = (const float *)logits->data;
	const int64_t V = logits->cols;

	if (cu->draw_kind == ROWS_GREEDY)
		cuda_sample_greedy_launch(cu, l, V, m, true);
	else if (cu->draw_kind == ROWS_TOPK)
		cuda_sample_topk_launch(cu, l, V, m, cu->draw_map, true);
	else
		cu_launch(cu->pdl, sample_kernel, dim3((unsigned)m), dim3(SAMPLE_THREADS), 0,
			  cu->stream, l, V, (const kt_sample_row *)cu->draw_map, sample_out_of(cu));
	CU_LAUNCHED();
	return 0;
}

int cuda_drawn(struct kt_backend *be, int32_t *ids, int n)
{
	struct cuda_backend *cu = cu_of(be);
	int rc;

	if (n < 0 || n > cu->draw_n || (n && !ids))
		return -EINVAL;
	CU_CHECK(cu_enter(cu));
	if ((rc = cuda_sync_published(cu)))
		return rc;
	memcpy(ids, cu->ids_host, (size_t)n * sizeof(*ids));
	return 0;
}
