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
 * split, o · (1 / l), so the bits are the merge's. Otherwise it writes its
 * unnormalised output and (m, l) to the workspace, fences, and counts
 * itself done on its (row, kv head, head chunk) counter; the CTA that counts last merges the splits of its heads,
 * out = Σ o_s 2^(m_s - M) / Σ l_s 2^(m_s - M), and puts the counter back to
 * 0 for the next launch (no second kernel).
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
 */
#ifndef ATLAS_KERNELS_CUDA_ATTENTION_DECODE_CUH
#define ATLAS_KERNELS_CUDA_ATTENTION_DECODE_CUH

#include <limits.h>

#include "kernels/cuda/cuda_attention_common.cuh"

#define DEC_WARPS 4
#define DEC_HEADS 16       /* q heads per CTA: the m16 rows of the tiles */
#define DEC_MAX_SPLITS 64
#define DEC_MIN_CHUNK 64   /* fewest keys worth a split of their own */
#define DEC_STAGES 3
/* Row stride in floats of the warps' outputs in the epilogue: D + 8, so
 * that the 8 rows a float2 store spreads over fall in different banks (a
 * stride of D put them all in one: an 8-way conflict on every store). */
#define DEC_OS_STRIDE(D) ((D) + 8)

static_assert(DEC_MAX_SPLITS <= 64, "the merge weighs 2 splits per lane");

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
};

/* The launch shape of a decode step. */
struct decode_plan {
	int splits, chunk, head_chunks;
};

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

/* After a CTA wrote its split of row t, heads h0..h0+nh-1: count it done;
 * the last of the n_act splits that ran merges them all into out and resets
 * the counter. Called by every thread of the CTA. */
template <int D>
__device__ __forceinline__ void decode_merge_splits(const decode_args &a, int t, int h0, int nh,
						    int n_act, float (*wts)[DEC_MAX_SPLITS],
						    float *inv_l, int *last)
{
	int *count = a.count + (int64_t)t * gridDim.y + blockIdx.y;
	const int64_t slot0 = ((int64_t)t * a.n_heads + h0) * a.splits;
	const int64_t o0 = ((int64_t)t * a.n_heads + h0) * D;

	__threadfence();
	__syncthreads();
	if (threadIdx.x == 0) {
		*last = atomicAdd(count, 1) == n_act - 1;
		if (*last)
			*count = 0;
	}
	__syncthreads();
	if (!*last)
		return;
	__threadfence();
	/* Warp w weighs the splits of rows w, w + 4, ...: lane s holds splits s and s + 32. */
	for (int row = threadIdx.x >> 5; row < nh; row += DEC_WARPS) {
		const float2 *ml = a.part_ml + slot0 + (int64_t)row * a.splits;
		const int lane = threadIdx.x & 31;
		const float2 none = make_float2(-INFINITY, 0.0f);
		const float2 v0 = lane < n_act ? __ldcg(&ml[lane]) : none;
		const float2 v1 = lane + 32 < n_act ? __ldcg(&ml[lane + 32]) : none;
		const bool bad = __any_sync(FULL_WARP, isnan(v0.x) || isnan(v1.x));
		const float M = warp_reduce(fmaxf(isnan(v0.x) ? -INFINITY : v0.x,
						  isnan(v1.x) ? -INFINITY : v1.x), op_max());
		const float f0 = exp2_fast(v0.x - M), f1 = exp2_fast(v1.x - M);
		const float L = warp_reduce(v0.y * f0 + v1.y * f1, op_sum());

		if (lane < n_act)
			wts[row][lane] = f0;
		if (lane + 32 < n_act)
			wts[row][lane + 32] = f1;
		if (lane == 0)
			inv_l[row] = bad ? NAN : 1.0f / L;
	}
	__syncthreads();
	/* Each thread merges 4 consecutive dims of a row (float4), with the
	 * loads of 8 splits in flight at a time. */
	for (int i = 4 * (int)threadIdx.x; i < nh * D; i += 4 * DEC_WARPS * 32) {
		const int row = i / D;
		const float *p0 = a.part_o + (slot0 + (int64_t)row * a.splits) * D + i % D;
		const float4 *po = (const float4 *)p0;
		const float *w = wts[row];
		float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
		int s = 0;

		for (; s + 8 <= n_act; s += 8) {
			float4 v[8];

#pragma unroll
			for (int u = 0; u < 8; u++)
				v[u] = __ldcg(po + (int64_t)(s + u) * (D / 4));
#pragma unroll
			for (int u = 0; u < 8; u++) {
				acc.x += v[u].x * w[s + u];
				acc.y += v[u].y * w[s + u];
				acc.z += v[u].z * w[s + u];
				acc.w += v[u].w * w[s + u];
			}
		}
		for (; s < n_act; s++) {
			const float4 v = __ldcg(po + (int64_t)s * (D / 4));

			acc.x += v.x * w[s];
			acc.y += v.y * w[s];
			acc.z += v.z * w[s];
			acc.w += v.w * w[s];
		}
		a.out.put4(o0 + i, make_float4(acc.x * inv_l[row], acc.y * inv_l[row],
					       acc.z * inv_l[row], acc.w * inv_l[row]));
	}
}

template <int D, int STAGES>
__global__ void __launch_bounds__(DEC_WARPS * 32) decode_kernel(decode_args a)
{
	typedef decode_cfg<D, STAGES> cfg;
	constexpr int SB = att_geom<D>::stage_bytes, TB = att_geom<D>::tile_bytes;
	constexpr int RB = att_geom<D>::row_bytes;
	extern __shared__ __align__(16) unsigned char att_smem[];
	__shared__ float ms[DEC_WARPS][DEC_HEADS], ls[DEC_WARPS][DEC_HEADS];
	__shared__ float wts[DEC_HEADS][DEC_MAX_SPLITS], inv_l[DEC_HEADS];
	__shared__ int bad_from, last;
	const int t = blockIdx.x, split = blockIdx.z, hc = blockIdx.y % a.head_chunks;
	const int kvh = blockIdx.y / a.head_chunks, h0 = kvh * a.group + hc * DEC_HEADS;
	const int nh = min(DEC_HEADS, a.group - hc * DEC_HEADS);
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const int64_t ld = (int64_t)a.n_heads * D, at = (int64_t)t * ld + (int64_t)h0 * D;
	const uint32_t sm = smem_addr(att_smem);
	/* [DEC_WARPS][DEC_HEADS][DEC_OS_STRIDE(D)] after the ring is done */
	float *os = (float *)att_smem;
	warp_rows<D> w;
	int len, start, end, n_tiles, n_act, r;

	pdl_wait();
	pdl_launch_dependents();
	if (!token_blocks(a.kv, t, a.max_pos)) {
		if (split == 0)
			for (int i = threadIdx.x; i < nh * D; i += cfg::threads)
				a.out.put(at + i, NAN);
		if (threadIdx.x == 0 && split == 0)
			atomicOr(a.fault, CUDA_FAULT_ATTENTION);
		return;
	}
	len = a.kv.pos[t] + 1;
	start = split * a.chunk;
	if (start >= len)
		return;
	end = min(start + a.chunk, len);
	n_act = (len + a.chunk - 1) / a.chunk;
	n_tiles = (end - start + ATT_TILE - 1) / ATT_TILE;
	r = lane >> 2;
	warp_rows_init<D>(w, r < nh ? a.q + at + (int64_t)r * D : NULL,
			  r + 8 < nh ? a.q + at + (int64_t)(r + 8) * D : NULL);
	if (threadIdx.x == 0)
		bad_from = INT_MAX;
	__syncthreads();
	{
		const int32_t *blocks = a.kv.bt + (int64_t)a.kv.seq[t] * a.kv.bt_cols;
		/* Keys of tile i into ring stage i % STAGES. */
		const auto load = [&](int i) {
			const uint32_t st = sm + (i % STAGES) * SB;

			load_kv_tile<D, cfg::threads>(st, st + TB, a.kc, a.vc, blocks, a.kv, kvh,
						      start + i * ATT_TILE, end, &bad_from);
		};

#pragma unroll
		for (int i = 0; i < STAGES - 1; i++) {
			if (i < n_tiles)
				load(i);
			cp_async_commit();
		}
		for (int kt = 0; kt < n_tiles; kt++) {
			const int kw = start + kt * ATT_TILE + 16 * warp;
			const uint32_t stg = sm + (kt % STAGES) * SB + 16 * warp * RB;

			if (kt + STAGES - 1 < n_tiles)
				load(kt + STAGES - 1);
			cp_async_commit();
			cp_async_wait<STAGES - 1>();
			__syncthreads();
			if (kw < end)
				warp_attend<D, 16>(w, stg, stg + TB, kw, end - 1, end - 1, a.sl2);
			__syncthreads();
		}
	}
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
	decode_merge_splits<D>(a, t, h0, nh, n_act, wts, inv_l, &last);
}

template <int D, int STAGES> static inline cudaError_t decode_setup(void)
{
	return cudaFuncSetAttribute(decode_kernel<D, STAGES>,
				    cudaFuncAttributeMaxDynamicSharedMemorySize,
				    decode_cfg<D, STAGES>::smem);
}

/* CTAs of decode_kernel<D, STAGES> the device holds at once. */
template <int D, int STAGES> static inline int decode_slots(int n_sms)
{
	int per_sm = 0;

	typedef decode_cfg<D, STAGES> cfg;

	if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, decode_kernel<D, STAGES>,
							  cfg::threads, cfg::smem))
		per_sm = 1;
	return (per_sm > 0 ? per_sm : 1) * n_sms;
}

/* Enqueue the decode of rows 0..rows-1 with a.splits, a.chunk, a.head_chunks set. */
template <int D, int STAGES>
static inline void decode_launch(bool pdl, const decode_args &a, int rows, int n_kv,
				 cudaStream_t s)
{
	typedef decode_cfg<D, STAGES> cfg;
	const dim3 grid((unsigned)rows, (unsigned)(n_kv * a.head_chunks), (unsigned)a.splits);

	cu_launch(pdl, decode_kernel<D, STAGES>, grid, cfg::threads, cfg::smem, s, a);
}

#endif
