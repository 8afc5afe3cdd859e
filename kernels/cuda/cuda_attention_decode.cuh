/* Decode attention: rows that each attend on their own by their position
 * (a decode row, or one of a verify's rows of one sequence), flash-decoding
 * style (split-K over the keys) on tensor cores.
 *
 * A CTA of DEC_WARPS warps serves one row, one split of its keys and up to
 * DEC_HEADS q heads of one kv head (the 16 rows of the m16n8k16 tiles; a
 * GQA group larger than that takes several head chunks), so each K/V row is
 * read once per group. Grid: x row, y kv head × head chunk, z split: the
 * rows of one sequence in a step (a verify's) are neighbours in launch
 * order, so that the keys one of them reads are still in L2 for the
 * others. Its
 * keys [split * chunk, min((split + 1) * chunk, pos + 1)) stream through a
 * STAGES-deep cp.async ring of ATT_TILE keys; warp w folds keys
 * [16 w, 16 w + 16) of each tile into its own softmax state, and the warps'
 * states merge through shared memory at the end. With one split the CTA
 * writes out; so does a CTA whose row's keys all fall in its split (the
 * only split of that row that runs), with the merge's arithmetic for one
 * split, o · (1 / l), so the bits are the merge's. Otherwise the splits
 * merge in the same launch (no second kernel), through the workspace and a
 * counter or, in a launch of a few splits, through a cluster's shared
 * memory (cuda_attention_merge.cuh; CLUSTER).
 *
 * The launch shape depends only on the row count, the heads and max_kv_len
 * (decode_plan_make), never on the positions, so a captured graph replays
 * for any positions below max_kv_len: CTAs whose split starts past their
 * row's length return at once, and only the splits that ran are counted and
 * merged. A row whose slot or position is out of range (position >=
 * max_kv_len included) gets NaN; a block id out of range makes the split's
 * (m, l) NaN, hence the row NaN. Either sets CUDA_FAULT_ATTENTION. A CTA
 * reads q only for its heads before any CTA writes those heads of out (the
 * merging CTA is the last of them), so out may be q.
 *
 * With a rope (RW not no_rope: a pending rope_store of one decode row that
 * this launch takes, cuda_rope.cu), q is not read: each CTA ropes its own q
 * heads from the row's q before rope into shared memory, through
 * cuda_rope.cuh's rope_load, rope_apply and rope_put, so they are the bits
 * rope_store gives q. The CTA whose split holds the row's own key ropes its
 * k head and puts the rounded k and v rows into the tile itself
 * (load_kv_tile skips that key), and split 0's CTA of each kv head stores
 * them in the cache for the steps after, with rope_store's faults; so every
 * key a CTA reads is the bits the two launches gave it. The row's tables,
 * the norm weights, the angles' frequencies, the first K/V tiles of the
 * keys before its own and the cos/sin table come before the PDL wait, while
 * the q, k, v product still runs (cuda_pdl.cuh says why that is safe);
 * after it, only the rope of q and k and the tiles are left. A warp asks
 * for the heads of two of its rope tasks (and v's, for the k task) before
 * it computes either, since each round trip after the wait is on the step's
 * critical path and costs microseconds while a GEMV streams. For the same
 * reason the next kernel is placed only after the tiles: the next GEMV asks
 * for its first weights as soon as it is placed (8B's o_proj: 14 MB), and
 * those requests queued ahead of this kernel's own (docs/perf.md: 3.7 us a
 * layer at 8B). A CTA of a cluster launch whose tiles were all asked for
 * before the wait places it after the rope tasks instead: it reads nothing
 * more from memory, and its merge goes through the cluster, not through L2
 * (+0.7 % at Qwen3-0.6B batch 1 on an H200, docs/perf.md).
 */
#ifndef ATLAS_KERNELS_CUDA_ATTENTION_DECODE_CUH
#define ATLAS_KERNELS_CUDA_ATTENTION_DECODE_CUH

#include <limits.h>

#include <type_traits>

#include "kernels/cuda/cuda_attention_common.cuh"
#include "kernels/cuda/cuda_attention_merge.cuh"
#include "kernels/cuda/cuda_rope.cuh"

#define DEC_MIN_CHUNK 64   /* fewest keys worth a split of their own, at one row */
/* The same at two rows or more. A split's first tiles are read before the
 * PDL wait, beside the other splits', which pays at one row; at two rows
 * and up the grid fills without short splits, and their merges cost.
 * Qwen3-0.6B on an H200, 22-33 rounds (docs/perf.md, 2026-12-03): 256
 * for every row count gained 1.3-3.1 % at 2-8 rows (level at 16 and at a
 * context of 2,048) and lost 1.8-4.2 % at one row (10.1 % at 2,048). */
#define DEC_MIN_CHUNK_ROWS 256
#define DEC_STAGES 3
/* Row stride in floats of the warps' outputs in the epilogue: D + 8, so
 * that the 8 rows a float2 store spreads over fall in different banks (a
 * stride of D put them all in one: an 8-way conflict on every store). */
#define DEC_OS_STRIDE(D) ((D) + 8)

/* The decode kernel's RW without a rope. */
struct no_rope {};

/* The rope_store a decode launch takes (RW: its norms' dtype). */
struct decode_rope {
	const float *q, *k, *v;       /* row t's heads before rope: q + t·ld_q [n_heads·D],
				       * k and v + t·ld_kv [n_kv·D] */
	int64_t ld_q, ld_kv;
	__nv_bfloat16 *kc, *vc;       /* decode_args' caches, to store the row's k and v */
	const float *inv_freq;        /* [n_pairs] */
	const void *q_norm, *k_norm;  /* NULL or [D] of RW */
	float eps;
	int n_pairs;                  /* rotated pairs of a head: R/2 */
};

struct decode_args {
	att_out out;                  /* [T, n_heads * D] (rows 0..rows-1 used) */
	const float *q;               /* [T, n_heads * D] f32 */
	const __nv_bfloat16 *kc, *vc; /* paged caches of n_kv * D cols (paged_kv) */
	paged_kv kv;
	int n_heads, group, head_chunks;
	int max_pos;      /* largest valid position: min(max_context, max_kv_len) - 1 */
	int chunk;        /* keys per split, a multiple of ATT_TILE */
	int splits;
	float sl2;        /* scale * log2 e */
	float *part_o;    /* [rows, n_heads, splits, D]: unnormalised outputs (splits > 1) */
	float2 *part_ml;  /* [rows, n_heads, splits]: (m, l); m NaN after a bad block id */
	int *count;       /* [rows, n_kv * head_chunks]: splits done; 0 between launches */
	unsigned *fault;
	decode_rope rope; /* RW not no_rope: the rope taken (head_chunks 1) */
};

/* The launch shape of a decode step. */
struct decode_plan {
	int splits, chunk, head_chunks;
};

/* The fewest keys of a split for a launch of `rows` decode rows. */
static inline int decode_min_chunk(int rows)
{
	return rows > 1 ? DEC_MIN_CHUNK_ROWS : DEC_MIN_CHUNK;
}

/* Pick the split count for rows decode rows of up to max_kv_len keys: the
 * grid should fill whole waves of `slots` resident CTAs, splits of at least
 * min_chunk keys, at most ws_rows / rows splits (the workspace holds
 * ws_rows row-splits per head). */
static inline decode_plan decode_plan_make(int rows, int group, int n_kv, int max_kv_len,
					   int slots, int ws_rows, int min_chunk)
{
	decode_plan p;
	const int L = max_kv_len > 0 ? max_kv_len : 1;
	const int64_t units = (int64_t)rows * n_kv * ((group + DEC_HEADS - 1) / DEC_HEADS);
	int cap = (L + min_chunk - 1) / min_chunk;
	double best = -1.0;

	cap = cap < DEC_MAX_SPLITS ? cap : DEC_MAX_SPLITS;
	cap = cap < ws_rows / (rows > 0 ? rows : 1) ? cap : ws_rows / (rows > 0 ? rows : 1);
	p.head_chunks = (group + DEC_HEADS - 1) / DEC_HEADS;
	p.splits = 1;
	p.chunk = (L + ATT_TILE - 1) / ATT_TILE * ATT_TILE;
	for (int s = 1; s <= cap; s++) {
		const int chunk = ((L + s - 1) / s + ATT_TILE - 1) / ATT_TILE * ATT_TILE;
		const int n = (L + chunk - 1) / chunk;
		const int64_t total = units * n;
		const int64_t waves = (total + slots - 1) / (slots > 0 ? slots : 1);
		const double score = (double)total / ((double)waves * slots) - 0.002 * n;

		if (score > best + 1e-9) {
			best = score;
			p.splits = n;
			p.chunk = chunk;
		}
	}
	return p;
}

template <int D, int STAGES> struct decode_cfg {
	static constexpr int threads = DEC_WARPS * 32;
	static constexpr int smem = STAGES * att_geom<D>::stage_bytes;
	static_assert(DEC_WARPS * DEC_HEADS * DEC_OS_STRIDE(D) * 4 <= smem,
		      "merge area fits the ring");
	static_assert(DEC_WARPS * 16 == ATT_TILE, "one 16-key slice per warp");
};

/* The rope tasks of a CTA that takes a rope (one warp each): task i < nh
 * ropes q head h0 + i into qs; task nh, the k task, ropes k head kvh and
 * puts the rounded k and v rows into row_new (when the split holds the
 * row's own key) and into the cache row krow (when store; -1: a bad block
 * id, rope_store's fault). A warp loads the heads of two tasks before it
 * computes either, so that their memory round trips overlap; the norm
 * weights come from kw and qw, loaded before the PDL wait. */
template <int D, typename RW> struct decode_rope_tasks {
	typedef rope_regs_of<D> regs;
	const decode_args &a;
	int64_t t, krow;
	int h0, nh, kvh;
	const float *cs, *sn;
	float *qs;
	__nv_bfloat16 *row_new; /* NULL: the split does not hold the row's key */
	bool store;

	__device__ __forceinline__ const float *src(int task) const
	{
		const decode_rope &rp = a.rope;

		return task < nh ? rp.q + t * rp.ld_q + (int64_t)(h0 + task) * D
				 : rp.k + t * rp.ld_kv + (int64_t)kvh * D;
	}

	/* Tasks t0 and t1 (t1 < 0: none) of this warp; at most one is the k
	 * task. has_qw, has_kw: whether q and k have norms (weights qw, kw). */
	__device__ __forceinline__ void run2(int t0, int t1, bool has_qw, const regs &qw,
					     bool has_kw, const regs &kw, int lane) const
	{
		const decode_rope &rp = a.rope;
		const int n_pairs = rp.n_pairs, n_tail = D - 2 * n_pairs;
		regs r[2];
		float v[D / 32];

		rope_load(r[0], src(t0), lane, n_pairs, n_tail);
		if (t1 >= 0)
			rope_load(r[1], src(t1), lane, n_pairs, n_tail);
		if (t0 == nh || t1 == nh) {
			const float *vh = rp.v + t * rp.ld_kv + (int64_t)kvh * D;

#pragma unroll
			for (int j = 0; j < D / 32; j++)
				v[j] = vh[lane + 32 * j];
		}
#pragma unroll
		for (int u = 0; u < 2; u++) {
			const int task = u == 0 ? t0 : t1;

			if (task < 0)
				break;
			if (task < nh) {
				rope_apply(
					r[u], has_qw, [&](regs &w) { w = qw; }, cs, sn, rp.eps, lane,
					n_pairs, n_tail);
				rope_put(qs + task * D, r[u], lane, n_pairs, n_tail, true);
				continue;
			}
			rope_apply(
				r[u], has_kw, [&](regs &w) { w = kw; }, cs, sn, rp.eps, lane, n_pairs,
				n_tail);
			if (row_new) {
				rope_put(row_new, r[u], lane, n_pairs, n_tail, true);
#pragma unroll
				for (int j = 0; j < D / 32; j++)
					narrow_to(&row_new[D + lane + 32 * j], v[j]);
			}
			if (!store)
				continue;
			if (krow < 0) {
				if (lane == 0)
					atomicOr(a.fault, CUDA_FAULT_KV_STORE);
				continue;
			}
			__nv_bfloat16 *kr = rp.kc + krow * a.kv.row_len + (int64_t)kvh * D;
			__nv_bfloat16 *vr = rp.vc + (kr - rp.kc);

			rope_put(kr, r[u], lane, n_pairs, n_tail, true);
#pragma unroll
			for (int j = 0; j < D / 32; j++)
				narrow_to(&vr[lane + 32 * j], v[j]);
		}
	}
};

/* The norm weights of a head (w: NULL or [D] of RW) into r; false without. */
template <int D, typename RW>
__device__ __forceinline__ bool decode_rope_w(rope_regs_of<D> &r, const void *w, int lane,
					      int n_pairs)
{
	if (!w)
		return false;
	rope_load(r, (const RW *)w, lane, n_pairs, D - 2 * n_pairs);
	return true;
}

/* rope_store's part of a row whose attention is NaN (its slot or position
 * out of range), by every thread of split 0's CTA of kv head kvh: the
 * faults, and the k and v stored where the cache row is in range. */
template <int D, typename RW>
__device__ __forceinline__ void decode_rope_bad_row(const decode_args &a, int64_t t, int kvh,
						    float *cs, float *sn)
{
	const int32_t p = a.kv.pos[t];
	const int lane = threadIdx.x & 31;
	const int32_t *blocks;
	rope_regs_of<D> kw;
	bool has_kw;

	if (!rope_table(cs, sn, p, a.rope.inv_freq, a.rope.n_pairs, a.fault,
			CUDA_FAULT_ROPE | CUDA_FAULT_KV_STORE))
		return;
	if (threadIdx.x >= 32)
		return;
	blocks = token_blocks(a.kv, t, INT32_MAX);
	has_kw = decode_rope_w<D, RW>(kw, a.rope.k_norm, lane, a.rope.n_pairs);
	const decode_rope_tasks<D, RW> k = { a, t, blocks ? cache_row(a.kv, blocks, p) : -1,
					     0, 0, kvh, cs, sn, NULL, NULL, true };
	k.run2(0, -1, false, kw, has_kw, kw, lane);
}

/* The row's own k and v (row_new) into row `row` of the ring stage at st. */
template <int D>
__device__ __forceinline__ void decode_put_row(unsigned char *st, int row,
					       const __nv_bfloat16 *row_new)
{
	constexpr int CPR = D / 8; /* 16-byte chunks per row */

	for (int c = threadIdx.x; c < 2 * CPR; c += DEC_WARPS * 32) {
		const int is_v = c / CPR, col = c % CPR;
		unsigned char *dst = st + is_v * att_geom<D>::tile_bytes +
				     row * att_geom<D>::row_bytes + col * 16;

		*(uint4 *)dst = *(const uint4 *)(row_new + is_v * D + col * 8);
	}
}

template <int D, int STAGES, typename RW, bool CLUSTER>
__global__ void __launch_bounds__(DEC_WARPS * 32) decode_kernel(decode_args a)
{
	typedef decode_cfg<D, STAGES> cfg;
	constexpr bool ROPE = !std::is_same<RW, no_rope>::value;
	constexpr int SB = att_geom<D>::stage_bytes, TB = att_geom<D>::tile_bytes;
	constexpr int RB = att_geom<D>::row_bytes;
	extern __shared__ __align__(16) unsigned char att_smem[];
	__shared__ float ms[DEC_WARPS][DEC_HEADS], ls[DEC_WARPS][DEC_HEADS];
	__shared__ float wts[DEC_HEADS][DEC_MAX_SPLITS], inv_l[DEC_HEADS];
	__shared__ int bad_from, last;
	/* with a rope: the row's own k then v, as the cache holds them */
	__shared__ __align__(16) __nv_bfloat16 row_new[ROPE ? 2 * D : 8];
	const int t = blockIdx.x, split = blockIdx.z, hc = blockIdx.y % a.head_chunks;
	const int kvh = blockIdx.y / a.head_chunks, h0 = kvh * a.group + hc * DEC_HEADS;
	const int nh = min(DEC_HEADS, a.group - hc * DEC_HEADS);
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const int64_t ld = (int64_t)a.n_heads * D, at = (int64_t)t * ld + (int64_t)h0 * D;
	const uint32_t sm = smem_addr(att_smem);
	/* [DEC_WARPS][DEC_HEADS][DEC_OS_STRIDE(D)] after the ring is done */
	float *os = (float *)att_smem;
	/* With a rope, in the ring's last stage until the loop first loads it:
	 * the CTA's roped q heads [DEC_HEADS][D] and the cos/sin table */
	float *qs = (float *)(att_smem + (STAGES - 1) * SB), *cs = qs + DEC_HEADS * D;
	float *sn = cs + CUDA_MAX_HEAD_DIM / 2;
	static_assert((DEC_HEADS * D + CUDA_MAX_HEAD_DIM) * 4 <= SB, "rope area fits a stage");
	/* In a cluster, the split's results for the merge, in the ring's last
	 * stage (os, before them, fits in the first): o [DEC_HEADS][D], (m, l)
	 * [DEC_HEADS] */
	float *cpo = (float *)(att_smem + (STAGES - 1) * SB);
	float2 *cml = (float2 *)(cpo + DEC_HEADS * D);
	static_assert(DEC_HEADS * (D + 2) * 4 <= SB && DEC_WARPS * DEC_HEADS * DEC_OS_STRIDE(D) * 4 <=
			      (STAGES - 1) * SB, "a cluster's results fit the last stage");
	warp_rows<D> w;
	int len, start, end, n_tiles, n_act, r, own;
	int32_t pos = 0;
	const int32_t *blocks;

	/* With a rope, the row's tables, the tiles of the keys before its own
	 * and its cos/sin table come before the wait: the rope_store is left
	 * for this launch only right after a product (cuda_rope.cu), which
	 * writes none of them, and the ops before that product have finished
	 * (cuda_pdl.cuh). */
	if constexpr (ROPE) {
		blocks = token_blocks_l2(a.kv, t, a.max_pos, &pos);
	} else {
		pdl_wait();
		pdl_launch_dependents();
		blocks = token_blocks(a.kv, t, a.max_pos);
	}
	if (!blocks) {
		if constexpr (ROPE) {
			pdl_wait();
			pdl_launch_dependents();
			if (split == 0 && hc == 0)
				decode_rope_bad_row<D, RW>(a, t, kvh, cs, sn);
		}
		if (split == 0)
			for (int i = threadIdx.x; i < nh * D; i += cfg::threads)
				a.out.put(at + i, NAN);
		if (threadIdx.x == 0 && split == 0)
			atomicOr(a.fault, CUDA_FAULT_ATTENTION);
		return;
	}
	len = (ROPE ? pos : a.kv.pos[t]) + 1;
	start = split * a.chunk;
	n_act = (len + a.chunk - 1) / a.chunk;
	if (start >= len) {
		if (CLUSTER && n_act > 1) {
			if constexpr (ROPE) {
				pdl_wait();
				pdl_launch_dependents();
			}
			decode_merge_cluster_idle();
		}
		return;
	}
	end = min(start + a.chunk, len);
	n_tiles = (end - start + ATT_TILE - 1) / ATT_TILE;
	r = lane >> 2;
	/* with a rope, the row's own key when this split holds it */
	own = ROPE && end == len ? len - 1 : -1;
	if constexpr (!ROPE)
		warp_rows_init<D>(w, r < nh ? a.q + at + (int64_t)r * D : NULL,
				  r + 8 < nh ? a.q + at + (int64_t)(r + 8) * D : NULL);
	/* With a rope, what its tasks read that no op before writes (the norm
	 * weights, the angles' frequencies, the cache row of the row's key),
	 * asked for before the first tiles. */
	const bool owner = ROPE && split == 0 && hc == 0;
	const int tasks = nh + (own >= 0 || owner ? 1 : 0);
	rope_regs_of<D> q_nw, k_nw;
	bool has_qw = false, has_kw = false;
	float freq = 0.0f;
	int64_t krow = -1;

	if constexpr (ROPE) {
		static_assert(D / 2 <= DEC_WARPS * 32, "a thread for each angle");
		const int n_pairs = a.rope.n_pairs;

		has_qw = decode_rope_w<D, RW>(q_nw, a.rope.q_norm, lane, n_pairs);
		/* the task loop's warps: k's is the one whose last task is nh */
		if (tasks > nh && warp == nh % DEC_WARPS)
			has_kw = decode_rope_w<D, RW>(k_nw, a.rope.k_norm, lane, n_pairs);
		if (threadIdx.x < n_pairs)
			freq = a.rope.inv_freq[threadIdx.x];
		if (owner)
			krow = cache_row(a.kv, blocks, len - 1);
	}
	if (threadIdx.x == 0)
		bad_from = INT_MAX;
	__syncthreads();
	{
		/* Keys of tile i into ring stage i % STAGES. */
		const auto load = [&](int i) {
			const uint32_t st = sm + (i % STAGES) * SB;

			load_kv_tile<D, cfg::threads>(st, st + TB, a.kc, a.vc, blocks, a.kv, kvh,
						      start + i * ATT_TILE, end, &bad_from, own);
		};

#pragma unroll
		for (int i = 0; i < STAGES - 1; i++) {
			if (i < n_tiles)
				load(i);
			cp_async_commit();
		}
		if constexpr (ROPE) {
			const decode_rope_tasks<D, RW> rt = { a, t, krow, h0, nh, kvh, cs, sn, qs,
							      own >= 0 ? row_new : NULL, owner };

			/* the cos/sin table of the row's position, in range here */
			if (threadIdx.x < a.rope.n_pairs)
				rope_angle(cs, sn, threadIdx.x, len - 1, freq);
			__syncthreads();
			pdl_wait();
			for (int task = warp; task < tasks; task += 2 * DEC_WARPS)
				rt.run2(task, task + DEC_WARPS < tasks ? task + DEC_WARPS : -1, has_qw,
					q_nw, has_kw, k_nw, lane);
			__syncthreads();
			/* In a cluster, a split whose tiles were all asked for before
			 * the wait reads nothing more from memory: the next kernel
			 * may be placed now, its weights streaming during the tiles
			 * and the merge, which no longer queues behind them. */
			if (CLUSTER && n_tiles <= STAGES - 1)
				pdl_launch_dependents();
			warp_rows_init<D>(w, r < nh ? qs + r * D : NULL,
					  r + 8 < nh ? qs + (r + 8) * D : NULL);
			__syncthreads(); /* qs is the stage the loop loads first */
		}
		for (int kt = 0; kt < n_tiles; kt++) {
			const int kw = start + kt * ATT_TILE + 16 * warp;
			const uint32_t stg = sm + (kt % STAGES) * SB + 16 * warp * RB;

			if (kt + STAGES - 1 < n_tiles)
				load(kt + STAGES - 1);
			cp_async_commit();
			cp_async_wait<STAGES - 1>();
			if (ROPE && own >= 0 && kt == n_tiles - 1)
				decode_put_row<D>(att_smem + (kt % STAGES) * SB,
						  own - (start + kt * ATT_TILE), row_new);
			__syncthreads();
			if (kw < end)
				warp_attend<D, 16, false>(w, stg, stg + TB, kw, end - 1, end - 1, a.sl2);
			__syncthreads();
		}
	}
	/* With a rope, the next kernel is placed only now, after the tiles:
	 * its first weight requests would queue ahead of theirs (see the top). */
	if (ROPE && !(CLUSTER && n_tiles <= STAGES - 1))
		pdl_launch_dependents();
	warp_rows_finish<D>(w);
	if ((lane & 3) == 0) {
		ms[warp][r] = w.m[0];
		ms[warp][r + 8] = w.m[1];
		ls[warp][r] = w.l[0];
		ls[warp][r + 8] = w.l[1];
	}
#pragma unroll
	for (int nd = 0; nd < D / 8; nd++) {
		const int c = 8 * nd + 2 * (lane & 3);

		float *o0 = os + (warp * DEC_HEADS + r) * DEC_OS_STRIDE(D) + c;

		*(float2 *)o0 = make_float2(w.o[nd][0], w.o[nd][1]);
		*(float2 *)(o0 + 8 * DEC_OS_STRIDE(D)) = make_float2(w.o[nd][2], w.o[nd][3]);
	}
	__syncthreads();
	for (int i = threadIdx.x; i < nh * D; i += cfg::threads) {
		const int row = i / D, d = i % D;
		float M = -INFINITY, L = 0.0f, O = 0.0f;

#pragma unroll
		for (int v = 0; v < DEC_WARPS; v++)
			M = fmaxf(M, ms[v][row]);
#pragma unroll
		for (int v = 0; v < DEC_WARPS; v++) {
			if (ms[v][row] == -INFINITY)
				continue;
			const float f = exp2_fast(ms[v][row] - M);

			L += ls[v][row] * f;
			O += os[(v * DEC_HEADS + row) * DEC_OS_STRIDE(D) + d] * f;
		}
		if (a.splits == 1) {
			a.out.put(at + i, bad_from != INT_MAX ? NAN : O / L);
		} else if (n_act == 1) {
			/* The merge's arithmetic over one split (weight 1, sum L):
			 * the same bits without the round trip through memory. */
			a.out.put(at + i, bad_from != INT_MAX ? NAN : O * (1.0f / L));
		} else if (CLUSTER) {
			cpo[i] = O;
			if (d == 0)
				cml[row] = make_float2(bad_from != INT_MAX ? NAN : M, L);
		} else {
			const int64_t slot = ((int64_t)t * a.n_heads + h0 + row) * a.splits + split;

			a.part_o[slot * D + d] = O;
			if (d == 0)
				a.part_ml[slot] = make_float2(bad_from != INT_MAX ? NAN : M, L);
		}
	}
	if (threadIdx.x == 0 && bad_from != INT_MAX)
		atomicOr(a.fault, CUDA_FAULT_ATTENTION);
	if (a.splits == 1 || n_act == 1)
		return;
	if constexpr (CLUSTER)
		decode_merge_cluster<D>(a, t, h0, nh, n_act, wts, inv_l, cpo, cml);
	else
		decode_merge_splits<D>(a, t, h0, nh, n_act, wts, inv_l, &last);
}

template <int D, int STAGES, typename RW = no_rope> static inline cudaError_t decode_setup(void)
{
	const cudaError_t e = cudaFuncSetAttribute(decode_kernel<D, STAGES, RW, false>,
						   cudaFuncAttributeMaxDynamicSharedMemorySize,
						   decode_cfg<D, STAGES>::smem);

	if constexpr (std::is_same<RW, no_rope>::value)
		return e;
	else
		return e ? e : cudaFuncSetAttribute(decode_kernel<D, STAGES, RW, true>,
						    cudaFuncAttributeMaxDynamicSharedMemorySize,
						    decode_cfg<D, STAGES>::smem);
}

/* CTAs of decode_kernel<D, STAGES> the device holds at once. */
template <int D, int STAGES> static inline int decode_slots(int n_sms)
{
	int per_sm = 0;

	typedef decode_cfg<D, STAGES> cfg;

	if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm,
							  decode_kernel<D, STAGES, no_rope, false>,
							  cfg::threads, cfg::smem))
		per_sm = 1;
	return (per_sm > 0 ? per_sm : 1) * n_sms;
}

/* Whether a launch of `splits` splits may merge them through clusters
 * (cuda_attention_merge.cuh), on a device that has them (cuda_attention.cu
 * says which launches do). */
static inline bool decode_clusters(bool has_clusters, int splits)
{
	return has_clusters && splits > 1 && splits <= DEC_CLUSTER_MAX_SPLITS;
}

/* Enqueue the decode of rows 0..rows-1 with a.splits, a.chunk, a.head_chunks
 * set (and a.rope, head_chunks 1, unless RW is no_rope); cluster (a launch
 * that takes a rope only): the splits of each row, kv head and head chunk
 * as one cluster (decode_clusters). */
template <int D, int STAGES, typename RW = no_rope>
static inline void decode_launch(bool pdl, const decode_args &a, int rows, int n_kv,
				 cudaStream_t s, bool cluster = false)
{
	typedef decode_cfg<D, STAGES> cfg;
	const dim3 grid((unsigned)rows, (unsigned)(n_kv * a.head_chunks), (unsigned)a.splits);

	if constexpr (!std::is_same<RW, no_rope>::value)
		if (cluster) {
			cu_launch_cluster(pdl, decode_kernel<D, STAGES, RW, true>,
					  dim3(1, 1, (unsigned)a.splits), grid, cfg::threads, cfg::smem,
					  s, a);
			return;
		}
	cu_launch(pdl, decode_kernel<D, STAGES, RW, false>, grid, cfg::threads, cfg::smem, s, a);
}

#endif
