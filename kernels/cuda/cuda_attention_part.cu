/* Attention over the parts of a context (backend.h: attention_part,
 * attention_staged, attention_finish): the path of a sequence whose older
 * KV blocks are streamed from the host tier through a staging buffer
 * (DESIGN §8), folded part by part into an online-softmax state.
 *
 * A part is split over positions: grid (rows × heads, splits), one block of
 * PART_WARPS warps per (token, head, split). A split takes a contiguous run
 * of the token's positions; its warps take tiles of 32 keys in turn, lane j
 * scoring key j with a whole dot product over D (q in shared memory, keys
 * read 16 bytes at a time), and keep an online softmax (running max m, sum l,
 * an f32 accumulator with D/32 values per lane). The warps merge through
 * shared memory and the split writes (m, l, acc) to the backend's split
 * workspace (att_part_o, att_part_ml). A second kernel folds the splits,
 * and the state before them unless first, into the state:
 * M = max m_i, l = Σ l_i e^(m_i - M), acc = Σ acc_i e^(m_i - M).
 * finish divides acc by l. All arithmetic is f32 with expf.
 *
 * The positions of a token: paged, from[seq[t]] .. pos[t] through the block
 * table (a bad slot, position or block id sets CUDA_FAULT_ATTENTION and
 * makes the token's state NaN); staged, span[t] = (row0, n) rows of the
 * staging buffer. Tokens go in launches of as many rows as the workspace
 * holds at the split count the step's longest part asks for.
 */
#include <errno.h>
#include <math.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_attention_common.cuh"
#include "kernels/cuda/cuda_impl.h"
#include "kernels/cuda/cuda_reduce.cuh"

#define PART_WARPS 4
/* Positions per split the split count aims at, and the most splits. */
#define PART_SPLIT_KEYS 512
#define PART_MAX_SPLITS 64

struct part_args {
	const float *q;        /* [T, n_heads * D] */
	const void *kc, *vc;   /* paged caches, or staging rows: CT */
	paged_kv kv;           /* paged: the step metadata; staged: row_len only */
	const int32_t *from;   /* paged: [bt_rows] first position per slot; NULL: staged */
	const int32_t *span;   /* staged: [T, 2] (row0, n) */
	int64_t staged_rows;   /* staged: rows of the staging buffer */
	int n_heads, group, D;
	int t0, splits;        /* first token of this launch; splits per (token, head) */
	int max_pos;           /* paged: largest valid position */
	float scale;
	float *ws_o;           /* [rows * n_heads * splits, D] */
	float2 *ws_ml;         /* [rows * n_heads * splits] */
	unsigned *fault;
};

__device__ __forceinline__ float part_dot(const float *qs, const float *k, int D)
{
	float s = 0.0f;

	for (int d = 0; d < D; d++)
		s += qs[d] * __ldg(k + d);
	return s;
}

__device__ __forceinline__ float part_dot(const float *qs, const __nv_bfloat16 *k, int D)
{
	float s = 0.0f;

	if (D % 8 == 0 && ((uintptr_t)k & 15) == 0) {
		const uint4 *k8 = (const uint4 *)k;

		for (int i = 0; i < D / 8; i++) {
			const uint4 u = __ldg(k8 + i);
			const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;

#pragma unroll
			for (int j = 0; j < 4; j++) {
				const float2 f = __bfloat1622float2(h[j]);

				s += qs[8 * i + 2 * j] * f.x + qs[8 * i + 2 * j + 1] * f.y;
			}
		}
		return s;
	}
	for (int d = 0; d < D; d++)
		s += qs[d] * widen(k[d]);
	return s;
}

/* The token's positions [lo, hi) and where their rows are: *blocks (paged)
 * or *row0 (staged). False on a bad slot, position, start or span. */
__device__ __forceinline__ bool part_range(const part_args &a, int64_t t, int *lo, int *hi,
					   const int32_t **blocks, int64_t *row0)
{
	if (a.from) {
		*blocks = token_blocks(a.kv, t, a.max_pos);
		if (!*blocks)
			return false;
		*lo = a.from[a.kv.seq[t]];
		*hi = a.kv.pos[t] + 1;
		return *lo >= 0 && *lo % a.kv.bs == 0;
	}
	*row0 = a.span[2 * t];
	*lo = 0;
	*hi = a.span[2 * t + 1];
	return *row0 >= 0 && *hi >= 0 && *row0 + *hi <= a.staged_rows;
}

template <typename CT, int NPL>
__global__ void __launch_bounds__(PART_WARPS * 32) part_kernel(part_args a)
{
	__shared__ __align__(16) float qs[CUDA_MAX_HEAD_DIM];
	__shared__ float s_acc[PART_WARPS][CUDA_MAX_HEAD_DIM];
	__shared__ float s_m[PART_WARPS], s_l[PART_WARPS];
	const int64_t t = a.t0 + blockIdx.x / a.n_heads;
	const int h = blockIdx.x % a.n_heads, k = blockIdx.y;
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int64_t koff = (int64_t)(h / a.group) * a.D, ld = a.kv.row_len;
	const int64_t slot = (int64_t)blockIdx.x * a.splits + k;
	const int32_t *blocks = NULL;
	int64_t row0 = 0;
	int lo, hi;
	const CT *kc = (const CT *)a.kc, *vc = (const CT *)a.vc;
	bool ok = part_range(a, t, &lo, &hi, &blocks, &row0);
	float m = -INFINITY, l = 0.0f, acc[NPL] = {};

	for (int d = threadIdx.x; d < a.D; d += blockDim.x)
		qs[d] = a.q[(t * a.n_heads + h) * a.D + d];
	__syncthreads();
	if (ok) {
		const int len = hi - lo, chunk = ((len + a.splits - 1) / a.splits + 31) / 32 * 32;
		const int b0 = lo + k * chunk, b1 = min(hi, b0 + chunk);

		for (int base = b0 + warp * 32; base < b1; base += PART_WARPS * 32) {
			const int p = base + lane, cnt = min(32, b1 - base);
			int64_t row = -1;
			float sc = -INFINITY;

			if (p < b1) {
				row = blocks ? cache_row(a.kv, blocks, p) : row0 + p;
				if (row < 0)
					ok = false;
				else
					sc = part_dot(qs, kc + row * ld + koff, a.D) * a.scale;
			}
			const float m_new = fmaxf(m, warp_reduce(sc, op_max()));
			if (m_new == -INFINITY)
				continue;
			const float corr = m == -INFINITY ? 0.0f : expf(m - m_new);
			const float pj = row >= 0 ? expf(sc - m_new) : 0.0f;

			l = l * corr + warp_reduce(pj, op_sum());
#pragma unroll
			for (int i = 0; i < NPL; i++)
				acc[i] *= corr;
			for (int j = 0; j < cnt; j++) {
				const float w = __shfl_sync(FULL_WARP, pj, j);
				const int64_t r = __shfl_sync(FULL_WARP, row, j);

				if (w == 0.0f)
					continue;
				const CT *vr = vc + r * ld + koff;
#pragma unroll
				for (int i = 0; i < NPL; i++)
					if (lane + 32 * i < a.D)
						acc[i] += w * widen(vr[lane + 32 * i]);
			}
			m = m_new;
		}
	}
	ok = __syncthreads_and(ok);
	if (lane == 0) {
		s_m[warp] = m;
		s_l[warp] = l;
	}
#pragma unroll
	for (int i = 0; i < NPL; i++)
		if (lane + 32 * i < a.D)
			s_acc[warp][lane + 32 * i] = acc[i];
	__syncthreads();
	float M = -INFINITY;

	for (int w = 0; w < PART_WARPS; w++)
		M = fmaxf(M, s_m[w]);
	for (int d = threadIdx.x; d < a.D; d += blockDim.x) {
		float o = 0.0f;

		for (int w = 0; w < PART_WARPS; w++)
			if (s_m[w] != -INFINITY)
				o += s_acc[w][d] * expf(s_m[w] - M);
		a.ws_o[slot * a.D + d] = ok ? o : NAN;
	}
	if (threadIdx.x == 0) {
		float L = 0.0f;

		for (int w = 0; w < PART_WARPS; w++)
			if (s_m[w] != -INFINITY)
				L += s_l[w] * expf(s_m[w] - M);
		a.ws_ml[slot] = ok ? make_float2(M, L) : make_float2(NAN, NAN);
		if (!ok)
			atomicOr(a.fault, CUDA_FAULT_ATTENTION);
	}
}

/* Fold the splits of (token t0 + blockIdx.x / n_heads, head) into the state. */
__global__ void part_combine(float *st_acc, float *st_ml, const float *ws_o, const float2 *ws_ml,
			     int n_heads, int D, int t0, int splits, bool first)
{
	const int64_t t = t0 + blockIdx.x / n_heads, slot0 = (int64_t)blockIdx.x * splits;
	const int h = blockIdx.x % n_heads;
	float *acc = st_acc + (t * n_heads + h) * D, *ml = st_ml + (t * n_heads + h) * 2;
	const float m0 = first ? -INFINITY : ml[0], l0 = first ? 0.0f : ml[1];
	float M = m0, L = 0.0f;

	for (int k = 0; k < splits; k++)
		M = fmaxf(M, ws_ml[slot0 + k].x);
	if (M == -INFINITY || isnan(M)) {
		/* Nothing folded yet (or a fault): keep the state, or make it NaN. */
		if (threadIdx.x == 0 && (first || isnan(M))) {
			ml[0] = isnan(M) ? NAN : -INFINITY;
			ml[1] = isnan(M) ? NAN : 0.0f;
		}
		for (int d = threadIdx.x; d < D && (first || isnan(M)); d += blockDim.x)
			acc[d] = isnan(M) ? NAN : 0.0f;
		return;
	}
	const float f0 = m0 == -INFINITY ? 0.0f : expf(m0 - M);

	L = l0 * f0;
	for (int k = 0; k < splits; k++) {
		const float2 p = ws_ml[slot0 + k];

		if (p.x != -INFINITY)
			L += p.y * expf(p.x - M);
	}
	for (int d = threadIdx.x; d < D; d += blockDim.x) {
		float o = first ? 0.0f : acc[d] * f0;

		for (int k = 0; k < splits; k++) {
			const float2 p = ws_ml[slot0 + k];

			if (p.x != -INFINITY)
				o += ws_o[(slot0 + k) * D + d] * expf(p.x - M);
		}
		acc[d] = o;
	}
	__syncthreads();
	if (threadIdx.x == 0) {
		ml[0] = M;
		ml[1] = L;
	}
}

__global__ void part_finish(att_out out, const float *acc, const float *ml, int n_heads, int D)
{
	const int64_t t = blockIdx.x;
	const int64_t n = (int64_t)n_heads * D;

	for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
		out.put(t * n + i, acc[t * n + i] / ml[(t * n_heads + i / D) * 2 + 1]);
}

static int check_state(const struct kt_att_state *st, const struct kt_tensor *q, int n_heads)
{
	if (!st || !cu_shape(&st->acc, KT_F32, q->rows, q->cols) ||
	    !cu_shape(&st->ml, KT_F32, q->rows, 2 * (int64_t)n_heads) ||
	    cu_overlap(&st->acc, &st->ml) || cu_overlap(&st->acc, q) || cu_overlap(&st->ml, q))
		return -EINVAL;
	return 0;
}

static int check_heads(const struct cuda_backend *cu, const struct kt_tensor *q, int n_heads,
		       int n_kv_heads, int head_dim, float scale)
{
	if (n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads || head_dim <= 0 ||
	    head_dim > cu->max_head_dim || !isfinite(scale) || !cu->att_ws_rows ||
	    n_heads > cu->att_heads)
		return -EINVAL;
	if (!cu_valid(q, KT_F32) || q->cols != (int64_t)n_heads * head_dim ||
	    q->rows * n_heads > INT32_MAX)
		return -EINVAL;
	return 0;
}

template <typename CT>
static int launch(struct cuda_backend *cu, part_args a, const struct kt_att_state *st, int64_t T,
		  int longest, bool first)
{
	/* The workspace holds att_ws_rows * att_heads splits of up to ws_dim values. */
	const int ws_dim = cu->max_head_dim < 128 ? cu->max_head_dim : 128;
	const int64_t heads_ws = (int64_t)cu->att_ws_rows * cu->att_heads;
	const int64_t slots = a.D <= ws_dim ? heads_ws : heads_ws * ws_dim / a.D;
	int splits = (longest + PART_SPLIT_KEYS - 1) / PART_SPLIT_KEYS;
	int64_t rows;

	splits = splits < 1 ? 1 : splits > PART_MAX_SPLITS ? PART_MAX_SPLITS : splits;
	if (splits > slots / a.n_heads)
		splits = (int)(slots / a.n_heads);
	if (splits < 1)
		return -EINVAL;
	rows = slots / ((int64_t)a.n_heads * splits);
	a.splits = splits;
	a.ws_o = cu->att_part_o;
	a.ws_ml = cu->att_part_ml;
	a.fault = cu->fault;
	CU_CHECK(cu_enter(cu));
	for (int64_t t0 = 0; t0 < T; t0 += rows) {
		const int64_t n = T - t0 < rows ? T - t0 : rows;
		const dim3 grid((unsigned)(n * a.n_heads), (unsigned)splits);

		a.t0 = (int)t0;
		switch ((a.D + 31) / 32) {
		case 1: part_kernel<CT, 1><<<grid, PART_WARPS * 32, 0, cu->stream>>>(a); break;
		case 2: part_kernel<CT, 2><<<grid, PART_WARPS * 32, 0, cu->stream>>>(a); break;
		case 3: part_kernel<CT, 3><<<grid, PART_WARPS * 32, 0, cu->stream>>>(a); break;
		case 4: part_kernel<CT, 4><<<grid, PART_WARPS * 32, 0, cu->stream>>>(a); break;
		case 5: part_kernel<CT, 5><<<grid, PART_WARPS * 32, 0, cu->stream>>>(a); break;
		case 6: part_kernel<CT, 6><<<grid, PART_WARPS * 32, 0, cu->stream>>>(a); break;
		case 7: part_kernel<CT, 7><<<grid, PART_WARPS * 32, 0, cu->stream>>>(a); break;
		default: part_kernel<CT, 8><<<grid, PART_WARPS * 32, 0, cu->stream>>>(a); break;
		}
		CU_LAUNCHED();
		part_combine<<<(unsigned)(n * a.n_heads), 128, 0, cu->stream>>>(
			(float *)st->acc.data, (float *)st->ml.data, cu->att_part_o, cu->att_part_ml,
			a.n_heads, a.D, (int)t0, splits, first);
		CU_LAUNCHED();
	}
	return 0;
}

int cuda_attention_part(struct kt_backend *be, const struct kt_att_state *st,
			const struct kt_tensor *q, const struct kt_tensor *kcache,
			const struct kt_tensor *vcache, const struct kt_batch *b,
			const struct kt_tensor *from, int n_heads, int n_kv_heads, int head_dim,
			float scale, bool first)
{
	struct cuda_backend *cu = cu_of(be);
	part_args a = {};
	paged_kv kv;
	int rc, longest;

	if ((rc = check_heads(cu, q, n_heads, n_kv_heads, head_dim, scale)) ||
	    (rc = check_state(st, q, n_heads)))
		return rc;
	if ((rc = paged_kv_init(&kv, b, q->rows, kcache, vcache)))
		return rc;
	if (kv.row_len != (int64_t)n_kv_heads * head_dim ||
	    !cu_shape(from, KT_I32, b->block_tables.rows, 1))
		return -EINVAL;
	if (!q->rows)
		return 0;
	longest = b->max_kv_len > 0 && b->max_kv_len < cu->max_context ? b->max_kv_len
									  : cu->max_context;
	a.q = (const float *)q->data;
	a.kv = kv;
	a.from = (const int32_t *)from->data;
	a.n_heads = n_heads;
	a.group = n_heads / n_kv_heads;
	a.D = head_dim;
	a.max_pos = longest - 1;
	a.scale = scale;
	a.kc = kcache->data;
	a.vc = vcache->data;
	if (kcache->dtype == KT_BF16)
		return launch<__nv_bfloat16>(cu, a, st, q->rows, longest, first);
	return launch<float>(cu, a, st, q->rows, longest, first);
}

int cuda_attention_staged(struct kt_backend *be, const struct kt_att_state *st,
			  const struct kt_tensor *q, const struct kt_tensor *ks,
			  const struct kt_tensor *vs, const struct kt_tensor *span, int block_size,
			  int n_heads, int n_kv_heads, int head_dim, float scale, bool first)
{
	struct cuda_backend *cu = cu_of(be);
	part_args a = {};
	int rc;

	if ((rc = check_heads(cu, q, n_heads, n_kv_heads, head_dim, scale)) ||
	    (rc = check_state(st, q, n_heads)))
		return rc;
	if (block_size <= 0 || !ks || (ks->dtype != KT_F32 && ks->dtype != KT_BF16) ||
	    !cu_valid(ks, ks->dtype) || !cu_shape(vs, ks->dtype, ks->rows, ks->cols) ||
	    ks->cols != (int64_t)n_kv_heads * head_dim || ks->rows > INT32_MAX ||
	    !cu_shape(span, KT_I32, q->rows, 2))
		return -EINVAL;
	if (!q->rows)
		return 0;
	a.q = (const float *)q->data;
	a.kv.row_len = ks->cols;
	a.span = (const int32_t *)span->data;
	a.staged_rows = ks->rows;
	a.n_heads = n_heads;
	a.group = n_heads / n_kv_heads;
	a.D = head_dim;
	a.scale = scale;
	a.kc = ks->data;
	a.vc = vs->data;
	if (ks->dtype == KT_BF16)
		return launch<__nv_bfloat16>(cu, a, st, q->rows, (int)ks->rows, first);
	return launch<float>(cu, a, st, q->rows, (int)ks->rows, first);
}

int cuda_attention_finish(struct kt_backend *be, const struct kt_tensor *out,
			  const struct kt_att_state *st, int n_heads, int head_dim)
{
	struct cuda_backend *cu = cu_of(be);
	int64_t T;

	if (!st || n_heads <= 0 || head_dim <= 0 || !out ||
	    (out->dtype != KT_F32 && out->dtype != KT_BF16) || !cu_valid(out, out->dtype) ||
	    out->cols != (int64_t)n_heads * head_dim)
		return -EINVAL;
	T = out->rows;
	/* An f32 out may be acc itself: each value is read before it is written. */
	if (!cu_shape(&st->acc, KT_F32, T, out->cols) ||
	    !cu_shape(&st->ml, KT_F32, T, 2 * (int64_t)n_heads) || cu_overlap(&st->ml, out) ||
	    ((out->dtype == KT_BF16 || out->data != st->acc.data) && cu_overlap(out, &st->acc)) ||
	    T > INT32_MAX)
		return -EINVAL;
	if (!T)
		return 0;
	CU_CHECK(cu_enter(cu));
	part_finish<<<(unsigned)T, CUDA_THREADS, 0, cu->stream>>>(
		att_out{ out->data, out->dtype == KT_BF16 }, (const float *)st->acc.data, (const float *)st->ml.data, n_heads,
		head_dim);
	CU_LAUNCHED();
	return 0;
}
