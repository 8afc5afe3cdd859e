/* The gated delta rule's kernels (kernels/backend.h, delta_rule), included by
 * cuda_delta_rule.cu and by the lab (dev/cuda/delta_rule_bench.cu).
 *
 * Per row t and value head h (q and k head h / (Hv / Hk)), S the [dk, dv]
 * f32 state of head h:
 *   q = l2(q) / sqrt(dk), k = l2(k), l2(x) = x / sqrt(sum x² + 1e-6)
 *   beta = sigmoid(b[h]), g = -exp(a_log[h]) · softplus(a[h] + dt_bias[h])
 *   S = exp(g) · S;  S = S + k ⊗ (beta · (v - Sᵀ k));  out[t, h] = Sᵀ q
 *
 * Column independence: column j of S evolves with k, beta, g and v[j] only,
 * so both kernels split dv into blocks of BV = min(dv, 32) columns, one CTA
 * per column block; each CTA recomputes the q/k norms and gates it needs.
 *
 * Layout: qkv [T, 2·Hk·dk + Hv·dv] (q heads, k heads, v heads), ba [T, 2·Hv]
 * (b then a), out [T, Hv·dv], a_log and dt_bias [1, Hv], state [n_slots, F]
 * with head h's S row-major (dv fastest) at float off + h·dk·dv of a row.
 *
 * dr_recurrent_kernel (decode, verify runs, short segments): grid (rows of
 * the range, Hv, dv / BV), DR_REC_P(DK, BV) · BV threads. The CTA of row t
 * works only if t starts a run (t is the range's first row, or row t - 1 has
 * another slot or position pos[t] - 1: found on the device, graph-safe) and
 * then takes the run's rows in order. Thread (j, p) holds rows p, p + P, ...
 * of column j in registers; Sᵀk and Sᵀq sum over the P lanes of a column
 * by shuffles.
 *
 * dr_chunk_kernel (a segment of one sequence, long): grid (Hv, dv / BV),
 * 256 threads, the state block [dk, BV] in shared memory, chunks of
 * DR_CHUNK = 64 rows in order. With G_r the within-chunk cumulative sum of
 * g (rows r = 0..63) and S0 the state before the chunk, unrolling the rule
 * gives S_r = e^{G_r} S0 + Σ_{s≤r} e^{G_r - G_s} k_s u_sᵀ, where
 *   u_s = beta_s (v_s - e^{G_s} S0ᵀ k_s) - Σ_{s'<s} A[s][s'] u_{s'},
 *   A[s][s'] = beta_s e^{G_s - G_s'} (k_s · k_s')
 * a unit lower-triangular system (I + A) U = RHS, solved by forward
 * substitution (the WY / UT-transform representation of the chunk's
 * Householder-like products). Then
 *   out_r = e^{G_r} S0ᵀ q_r + Σ_{s≤r} e^{G_r - G_s} (q_r · k_s) u_s
 *   S     = e^{G_63} S0 + Σ_s e^{G_63 - G_s} k_s u_sᵀ
 * Only differences G_r - G_s (r >= s) and G_r themselves reach exp, all
 * <= 0, so no factor overflows however strong the decay. Rows past the
 * segment's end in its last chunk are zeros with beta = g = 0: their u is 0
 * and they change nothing. All arithmetic is f32 on CUDA cores (register
 * tiles over shared memory); the result equals the recurrent rule's up to
 * rounding.
 *
 * Faults: a slot outside [0, n_slots) or a negative position sets
 * CUDA_FAULT_DELTA_RULE; the run's outputs are NaN and its state is left
 * alone. The chunk kernel also flags a segment whose rows are not one run.
 */
#ifndef ATLAS_KERNELS_CUDA_DELTA_RULE_CUH
#define ATLAS_KERNELS_CUDA_DELTA_RULE_CUH

#include <stdint.h>

#include "kernels/cuda/cuda_reduce.cuh"

#ifndef CUDA_FAULT_DELTA_RULE
#define CUDA_FAULT_DELTA_RULE (1u << 9)
#endif

/* Rows per chunk of the chunked kernel, and its threads. */
#define DR_CHUNK 64
#define DR_CHUNK_THREADS 256

/* Lanes that share a column in the recurrent kernel: a thread holds at
 * most 32 rows of S (registers), and a CTA has at least one warp. */
#define DR_REC_P(DK, BV) ((DK) / 32 > 32 / (BV) ? (DK) / 32 : 32 / (BV))

struct dr_args {
	float *out;
	const float *qkv, *ba, *a_log, *dt_bias;
	float *state;
	const int32_t *slot, *pos;
	int64_t qkv_cols, out_cols, F, off, n_slots;
	int Hk, Hv, dv;
	int r0, r1;      /* recurrent: the rows of this launch (runs do not cross them) */
	unsigned *fault;
};

__device__ __forceinline__ float dr_nan(void)
{
	return __int_as_float(0x7fc00000);
}

/* beta and g of row t, value head h, as the contract writes them. */
__device__ __forceinline__ void dr_gates(const dr_args &a, int64_t t, int h, float *beta,
					 float *g)
{
	const float b = a.ba[t * 2 * a.Hv + h];
	const float x = a.ba[t * 2 * a.Hv + a.Hv + h] + a.dt_bias[h];
	const float sp = x > 20.0f ? x : log1pf(expf(x));

	*beta = 1.0f / (1.0f + expf(-b));
	*g = -expf(a.a_log[h]) * sp;
}

/* Row t continues row t - 1's run. */
__device__ __forceinline__ bool dr_continues(const dr_args &a, int64_t t)
{
	return a.slot[t - 1] == a.slot[t] && a.pos[t - 1] == a.pos[t] - 1;
}

__device__ __forceinline__ bool dr_slot_ok(const dr_args &a, int64_t t)
{
	return a.slot[t] >= 0 && a.slot[t] < a.n_slots && a.pos[t] >= 0;
}

template <int DK, int BV>
__global__ void __launch_bounds__(BV * DR_REC_P(DK, BV))
dr_recurrent_kernel(dr_args a)
{
	constexpr int P = DR_REC_P(DK, BV), NR = DK / P, NT = BV * P;
	__shared__ float qs[DK], ks[DK], vs[BV];
	const int h = blockIdx.y, hk = h / (a.Hv / a.Hk), j0 = blockIdx.z * BV;
	const int tid = threadIdx.x, part = tid % P, j = tid / P, lane = tid & 31;
	const float scale = 1.0f / sqrtf((float)DK);
	const int64_t t0 = a.r0 + (int64_t)blockIdx.x;
	int64_t t_end = t0 + 1;
	float S[NR];
	float *sp;
	bool ok;

	if (t0 > a.r0 && dr_continues(a, t0))
		return;
	while (t_end < a.r1 && dr_continues(a, t_end))
		t_end++;
	ok = dr_slot_ok(a, t0);
	if (!ok) {
		if (tid == 0)
			atomicOr(a.fault, CUDA_FAULT_DELTA_RULE);
		for (int64_t t = t0; t < t_end; t++)
			if (part == 0)
				a.out[t * a.out_cols + (int64_t)h * a.dv + j0 + j] = dr_nan();
		return;
	}
	sp = a.state + (int64_t)a.slot[t0] * a.F + a.off + (int64_t)h * DK * a.dv + j0 + j;
	/* A run at position 0 starts from the zero state, whatever the row holds. */
#pragma unroll
	for (int r = 0; r < NR; r++)
		S[r] = a.pos[t0] == 0 ? 0.0f : sp[(int64_t)(part + P * r) * a.dv];
	for (int64_t t = t0; t < t_end; t++) {
		const float *row = a.qkv + t * a.qkv_cols;
		float ssq = 0.0f, ssk = 0.0f, rq, rk, beta, g, decay, kv = 0.0f, o = 0.0f, delta;

		__syncthreads(); /* the previous row's reads of qs, ks, vs are done */
		for (int i = tid; i < DK; i += NT) {
			qs[i] = row[(int64_t)hk * DK + i];
			ks[i] = row[(int64_t)(a.Hk + hk) * DK + i];
		}
		for (int i = tid; i < BV; i += NT)
			vs[i] = row[(int64_t)2 * a.Hk * DK + (int64_t)h * a.dv + j0 + i];
		__syncthreads();
		/* Every warp sums the squares itself: no further barrier. */
		for (int i = lane; i < DK; i += 32) {
			ssq += qs[i] * qs[i];
			ssk += ks[i] * ks[i];
		}
		ssq = warp_reduce(ssq, op_sum());
		ssk = warp_reduce(ssk, op_sum());
		rq = scale / sqrtf(ssq + 1e-6f);
		rk = 1.0f / sqrtf(ssk + 1e-6f);
		dr_gates(a, t, h, &beta, &g);
		decay = expf(g);
#pragma unroll
		for (int r = 0; r < NR; r++) {
			S[r] *= decay;
			kv = fmaf(S[r], ks[part + P * r] * rk, kv);
		}
#pragma unroll
		for (int m = 1; m < P; m <<= 1)
			kv += __shfl_xor_sync(FULL_WARP, kv, m);
		delta = beta * (vs[j] - kv);
#pragma unroll
		for (int r = 0; r < NR; r++) {
			S[r] = fmaf(ks[part + P * r] * rk, delta, S[r]);
			o = fmaf(S[r], qs[part + P * r] * rq, o);
		}
#pragma unroll
		for (int m = 1; m < P; m <<= 1)
			o += __shfl_xor_sync(FULL_WARP, o, m);
		if (part == 0)
			a.out[t * a.out_cols + (int64_t)h * a.dv + j0 + j] = o;
	}
#pragma unroll
	for (int r = 0; r < NR; r++)
		sp[(int64_t)(part + P * r) * a.dv] = S[r];
}

/* Shared memory of dr_chunk_kernel<DK, BV>, in floats. */
#define DR_LDK(DK) ((DK) + 1) /* row stride of the q and k tiles: no bank conflicts */
#define DR_CHUNK_FLOATS(DK, BV)                                                    \
	(2 * DR_CHUNK * DR_LDK(DK) + 2 * DR_CHUNK * (BV) + 2 * DR_CHUNK * DR_CHUNK + \
	 (DK) * (BV) + 3 * DR_CHUNK)

/* One segment of rows [row0, row0 + n) of one sequence. */
template <int DK, int BV>
__global__ void __launch_bounds__(DR_CHUNK_THREADS)
dr_chunk_kernel(dr_args a, int row0, int n)
{
	constexpr int C = DR_CHUNK, LD = DR_LDK(DK), NT = DR_CHUNK_THREADS;
	constexpr int TN = BV / 16, TS = DK / 16; /* tile cols of [C, BV], tile rows of [DK, BV] */
	extern __shared__ float sm[];
	float *Qs = sm, *Ks = Qs + C * LD, *Us = Ks + C * LD, *Os = Us + C * BV;
	float *Am = Os + C * BV, *QK = Am + C * C, *Ss = QK + C * C;
	float *beta = Ss + DK * BV, *G = beta + C, *dec = G + C;
	const int h = blockIdx.x, hk = h / (a.Hv / a.Hk), j0 = blockIdx.y * BV;
	const int tid = threadIdx.x, tr = tid / 16, tc = tid % 16, warp = tid / 32, lane = tid % 32;
	const float scale = 1.0f / sqrtf((float)DK);
	const int32_t s0 = a.slot[row0], p0 = a.pos[row0];
	float *sp;

	static_assert(BV == 16 || BV == 32, "column blocks of 16 or 32");
	static_assert(DK % 16 == 0 && DK <= 128, "dk of 16..128");
	if (s0 < 0 || s0 >= a.n_slots || p0 < 0) {
		if (tid == 0)
			atomicOr(a.fault, CUDA_FAULT_DELTA_RULE);
		for (int e = tid; e < n * BV; e += NT)
			a.out[(int64_t)(row0 + e / BV) * a.out_cols + (int64_t)h * a.dv + j0 +
			      e % BV] = dr_nan();
		return;
	}
	sp = a.state + (int64_t)s0 * a.F + a.off + (int64_t)h * DK * a.dv + j0;
	for (int e = tid; e < DK * BV; e += NT)
		Ss[e] = p0 == 0 ? 0.0f : sp[(int64_t)(e / BV) * a.dv + e % BV];
	for (int c0 = 0; c0 < n; c0 += C) {
		const int L = n - c0 < C ? n - c0 : C;

		__syncthreads(); /* the previous chunk is done with every tile */
		/* Load: q, k, v of the chunk's rows (zeros past the end), gates. */
		for (int e = tid; e < C * DK; e += NT) {
			const int r = e / DK, i = e % DK;
			const float *row = a.qkv + (int64_t)(row0 + c0 + r) * a.qkv_cols;

			Qs[r * LD + i] = r < L ? row[(int64_t)hk * DK + i] : 0.0f;
			Ks[r * LD + i] = r < L ? row[(int64_t)(a.Hk + hk) * DK + i] : 0.0f;
		}
		for (int e = tid; e < C * BV; e += NT) {
			const int r = e / BV, jj = e % BV;

			Us[e] = r < L ? a.qkv[(int64_t)(row0 + c0 + r) * a.qkv_cols +
					      (int64_t)2 * a.Hk * DK + (int64_t)h * a.dv + j0 + jj]
				      : 0.0f;
		}
		if (tid < C) {
			float bt = 0.0f, g = 0.0f;

			if (tid < L) {
				const int64_t t = row0 + c0 + tid;

				dr_gates(a, t, h, &bt, &g);
				if (a.slot[t] != s0 || a.pos[t] != p0 + c0 + tid)
					atomicOr(a.fault, CUDA_FAULT_DELTA_RULE);
			}
			beta[tid] = bt;
			G[tid] = g;
		}
		__syncthreads();
		/* l2 norms, a warp per row; the cumulative decay by one thread
		 * (64 adds, in row order like the recurrence's products). */
		for (int r = warp; r < C; r += NT / 32) {
			float ssq = 0.0f, ssk = 0.0f, rq, rk;

			for (int i = lane; i < DK; i += 32) {
				ssq += Qs[r * LD + i] * Qs[r * LD + i];
				ssk += Ks[r * LD + i] * Ks[r * LD + i];
			}
			ssq = warp_reduce(ssq, op_sum());
			ssk = warp_reduce(ssk, op_sum());
			rq = scale / sqrtf(ssq + 1e-6f);
			rk = 1.0f / sqrtf(ssk + 1e-6f);
			for (int i = lane; i < DK; i += 32) {
				Qs[r * LD + i] *= rq;
				Ks[r * LD + i] *= rk;
			}
		}
		if (tid == 0)
			for (int r = 1; r < C; r++)
				G[r] += G[r - 1];
		__syncthreads();
		if (tid < C)
			dec[tid] = expf(G[C - 1] - G[tid]);
		/* A = strictly lower beta_s e^{G_s - G_s'} k_s·k_s', QK = lower
		 * (with the diagonal) e^{G_r - G_s} q_r·k_s: 4×4 tiles, rows
		 * tr + 16·x, cols tc + 16·y. */
		{
			float kk[4][4] = {}, qk[4][4] = {};

			for (int i = 0; i < DK; i++) {
				float ka[4], qa[4], kb[4];

#pragma unroll
				for (int x = 0; x < 4; x++) {
					ka[x] = Ks[(tr + 16 * x) * LD + i];
					qa[x] = Qs[(tr + 16 * x) * LD + i];
					kb[x] = Ks[(tc + 16 * x) * LD + i];
				}
#pragma unroll
				for (int x = 0; x < 4; x++)
#pragma unroll
					for (int y = 0; y < 4; y++) {
						kk[x][y] = fmaf(ka[x], kb[y], kk[x][y]);
						qk[x][y] = fmaf(qa[x], kb[y], qk[x][y]);
					}
			}
#pragma unroll
			for (int x = 0; x < 4; x++)
#pragma unroll
				for (int y = 0; y < 4; y++) {
					const int r = tr + 16 * x, s = tc + 16 * y;
					const float d = expf(G[r] - G[s > r ? r : s]);

					Am[r * C + s] = s < r ? beta[r] * d * kk[x][y] : 0.0f;
					QK[r * C + s] = s <= r ? d * qk[x][y] : 0.0f;
				}
		}
		/* RHS = beta_s (v_s - e^{G_s} S0ᵀk_s) over Us (v), and the
		 * output's state part e^{G_r} S0ᵀq_r into Os: 4×TN tiles. */
		{
			float kS[4][TN] = {}, qS[4][TN] = {};

			for (int i = 0; i < DK; i++) {
				float ka[4], qa[4], sb[TN];

#pragma unroll
				for (int x = 0; x < 4; x++) {
					ka[x] = Ks[(tr + 16 * x) * LD + i];
					qa[x] = Qs[(tr + 16 * x) * LD + i];
				}
#pragma unroll
				for (int y = 0; y < TN; y++)
					sb[y] = Ss[i * BV + tc + 16 * y];
#pragma unroll
				for (int x = 0; x < 4; x++)
#pragma unroll
					for (int y = 0; y < TN; y++) {
						kS[x][y] = fmaf(ka[x], sb[y], kS[x][y]);
						qS[x][y] = fmaf(qa[x], sb[y], qS[x][y]);
					}
			}
#pragma unroll
			for (int x = 0; x < 4; x++)
#pragma unroll
				for (int y = 0; y < TN; y++) {
					const int r = tr + 16 * x, jj = tc + 16 * y;
					const float e = expf(G[r]);

					Us[r * BV + jj] = beta[r] * (Us[r * BV + jj] - e * kS[x][y]);
					Os[r * BV + jj] = e * qS[x][y];
				}
		}
		__syncthreads();
		/* Forward substitution, a lane per column, U held in registers
		 * (fully unrolled: the indices must be constants). */
		if (warp == 0 && lane < BV) {
			float u[C];

#pragma unroll
			for (int s = 0; s < C; s++) {
				float acc = Us[s * BV + lane];

#pragma unroll
				for (int q = 0; q < s; q++)
					acc = fmaf(-Am[s * C + q], u[q], acc);
				u[s] = acc;
				Us[s * BV + lane] = acc;
			}
		}
		__syncthreads();
		/* Outputs: out_r = Os_r + Σ_s QK[r][s] u_s, 4×TN tiles. */
		{
			float o[4][TN];

#pragma unroll
			for (int x = 0; x < 4; x++)
#pragma unroll
				for (int y = 0; y < TN; y++)
					o[x][y] = Os[(tr + 16 * x) * BV + tc + 16 * y];
			for (int s = 0; s < C; s++) {
				float qa[4], ub[TN];

#pragma unroll
				for (int x = 0; x < 4; x++)
					qa[x] = QK[(tr + 16 * x) * C + s];
#pragma unroll
				for (int y = 0; y < TN; y++)
					ub[y] = Us[s * BV + tc + 16 * y];
#pragma unroll
				for (int x = 0; x < 4; x++)
#pragma unroll
					for (int y = 0; y < TN; y++)
						o[x][y] = fmaf(qa[x], ub[y], o[x][y]);
			}
#pragma unroll
			for (int x = 0; x < 4; x++)
#pragma unroll
				for (int y = 0; y < TN; y++) {
					const int r = tr + 16 * x;

					if (r < L)
						a.out[(int64_t)(row0 + c0 + r) * a.out_cols +
						      (int64_t)h * a.dv + j0 + tc + 16 * y] = o[x][y];
				}
		}
		/* State: S = e^{G_63} S0 + Σ_s k_s (dec_s u_s)ᵀ, TS×TN tiles of
		 * [DK, BV]; each element is this thread's alone, so in place. */
		{
			const float e = expf(G[C - 1]);
			float st[TS][TN];

#pragma unroll
			for (int x = 0; x < TS; x++)
#pragma unroll
				for (int y = 0; y < TN; y++)
					st[x][y] = e * Ss[(tr + 16 * x) * BV + tc + 16 * y];
			for (int s = 0; s < C; s++) {
				float ka[TS], ub[TN];

#pragma unroll
				for (int x = 0; x < TS; x++)
					ka[x] = Ks[s * LD + tr + 16 * x];
#pragma unroll
				for (int y = 0; y < TN; y++)
					ub[y] = dec[s] * Us[s * BV + tc + 16 * y];
#pragma unroll
				for (int x = 0; x < TS; x++)
#pragma unroll
					for (int y = 0; y < TN; y++)
						st[x][y] = fmaf(ka[x], ub[y], st[x][y]);
			}
#pragma unroll
			for (int x = 0; x < TS; x++)
#pragma unroll
				for (int y = 0; y < TN; y++)
					Ss[(tr + 16 * x) * BV + tc + 16 * y] = st[x][y];
		}
	}
	__syncthreads();
	for (int e = tid; e < DK * BV; e += NT)
		sp[(int64_t)(e / BV) * a.dv + e % BV] = Ss[e];
}

#endif
