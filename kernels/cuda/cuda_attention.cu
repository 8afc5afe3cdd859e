/* Paged KV cache: kv_store writes each token's k and v rows, attention reads
 * them back, both only through the block table (DESIGN §4.2).
 *
 * Layout: kcache, vcache [n_blocks * block_size, n_kv * D] f32; position p of
 * the sequence in slot s lives in row block_tables[s][p / bs] * bs + p % bs.
 * q, out [T, n_heads * D]; head h reads kv head h / (n_heads / n_kv).
 * pos, seq and block_tables are device memory, so their values are checked
 * by the kernels (a bad one sets a fault bit, see cuda_impl.h): kv_store then
 * skips the token, attention writes NaN for it.
 *
 * kv_store launch: one block of CUDA_THREADS per token, copying its k and v
 * rows.
 *
 * attention launch: one block of ATT_WARPS warps per (token, head); q goes to
 * shared memory. The keys 0..pos[t] are split in tiles of 32, tile i going to
 * warp i % ATT_WARPS. In a tile, lane j scores key j (a whole dot product
 * over D, q broadcast from shared memory), the warp updates its online
 * softmax state (running max m, sum l, f32 accumulator acc with D/32 values
 * per lane) and adds the 32 value rows, lane d of the warp reading column d
 * (coalesced). At the end the warps' states are merged through shared
 * memory: out = Σ acc_w e^(m_w - M) / Σ l_w e^(m_w - M). Softmax uses expf
 * (not __expf). q is read whole before out is written, so out may be q.
 */
#include <errno.h>
#include <math.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_impl.h"
#include "kernels/cuda/cuda_reduce.cuh"

#define ATT_WARPS 4

/* Where the rows of one step live, as the kernels see them. */
struct paged_kv {
	const int32_t *pos, *seq; /* [T] */
	const int32_t *bt;        /* [bt_rows, bt_cols] */
	int64_t bt_rows, bt_cols;
	int64_t n_blocks;         /* cache rows / bs */
	int64_t row_len;          /* cache cols: n_kv * D */
	int bs;                   /* block_size */
};

/* Token t's sequence blocks, or NULL when its slot or position is out of
 * range (position at most max_pos). */
__device__ __forceinline__ const int32_t *token_blocks(const paged_kv &kv, int64_t t,
						       int32_t max_pos)
{
	const int32_t p = kv.pos[t], s = kv.seq[t];

	if (s < 0 || s >= kv.bt_rows || p < 0 || p > max_pos || p / kv.bs >= kv.bt_cols)
		return NULL;
	return kv.bt + (int64_t)s * kv.bt_cols;
}

/* Cache row of position p, or -1 when its block id is out of range. */
__device__ __forceinline__ int64_t cache_row(const paged_kv &kv, const int32_t *blocks,
					     int32_t p)
{
	const int32_t blk = blocks[p / kv.bs];

	if (blk < 0 || blk >= kv.n_blocks)
		return -1;
	return (int64_t)blk * kv.bs + p % kv.bs;
}

__global__ void kv_store_kernel(float *kc, float *vc, const float *k, const float *v,
				paged_kv kv, unsigned *fault)
{
	const int64_t t = blockIdx.x;
	const int32_t *blocks = token_blocks(kv, t, INT32_MAX);
	const int64_t row = blocks ? cache_row(kv, blocks, kv.pos[t]) : -1;

	if (row < 0) {
		if (threadIdx.x == 0)
			atomicOr(fault, CUDA_FAULT_KV_STORE);
		return;
	}
	for (int64_t c = threadIdx.x; c < kv.row_len; c += blockDim.x) {
		kc[row * kv.row_len + c] = k[t * kv.row_len + c];
		vc[row * kv.row_len + c] = v[t * kv.row_len + c];
	}
}

struct att_args {
	float *out;
	const float *q, *kc, *vc;
	paged_kv kv;
	int n_heads, group, D; /* group = n_heads / n_kv_heads */
	int max_context;
	float scale;
	bool vec4;             /* D % 4 == 0 and the caches are 16-byte aligned */
	unsigned *fault;
};

__device__ __forceinline__ float dot_row(const float *qs, const float *k, int D, bool vec4)
{
	float s = 0.0f;

	if (vec4) {
		const float4 *q4 = (const float4 *)qs, *k4 = (const float4 *)k;

		for (int i = 0; i < D / 4; i++) {
			const float4 a = q4[i], b = __ldg(k4 + i);

			s += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
		}
	} else {
		for (int d = 0; d < D; d++)
			s += qs[d] * __ldg(k + d);
	}
	return s;
}

/* One warp's online-softmax state: running max, sum and NPL output values per lane. */
template <int NPL> struct att_state {
	float m, l, acc[NPL];
};

/* Fold the tile of keys [base, base + 32) ∩ [0, n) into st. Sets *bad on a
 * block id out of range. */
template <int NPL>
__device__ __forceinline__ void att_tile(const att_args &a, const int32_t *blocks, int64_t koff,
					 const float *qs, int base, int n, att_state<NPL> &st,
					 int *bad)
{
	const int lane = threadIdx.x & 31, j = base + lane;
	const int cnt = n - base < 32 ? n - base : 32;
	int64_t row = j < n ? cache_row(a.kv, blocks, j) : -1;
	float sc = -INFINITY, m_new, corr, pj;

	if (j < n && row < 0)
		*bad = 1;
	if (row >= 0)
		sc = dot_row(qs, a.kc + row * a.kv.row_len + koff, a.D, a.vec4) * a.scale;
	m_new = fmaxf(st.m, warp_reduce(sc, op_max()));
	if (m_new == -INFINITY)
		return;
	corr = st.m == -INFINITY ? 0.0f : expf(st.m - m_new);
	pj = row >= 0 ? expf(sc - m_new) : 0.0f;
	st.l = st.l * corr + warp_reduce(pj, op_sum());
#pragma unroll
	for (int i = 0; i < NPL; i++)
		st.acc[i] *= corr;
	for (int jj = 0; jj < cnt; jj++) {
		const float w = __shfl_sync(FULL_WARP, pj, jj);
		const int64_t r = __shfl_sync(FULL_WARP, row, jj);
		const float *vr = a.vc + r * a.kv.row_len + koff;

		if (w == 0.0f)
			continue;
#pragma unroll
		for (int i = 0; i < NPL; i++)
			if (lane + 32 * i < a.D)
				st.acc[i] += w * __ldg(vr + lane + 32 * i);
	}
	st.m = m_new;
}

template <int NPL>
__global__ void __launch_bounds__(ATT_WARPS * 32) attention_kernel(att_args a)
{
	__shared__ __align__(16) float qs[CUDA_MAX_HEAD_DIM];
	__shared__ float part_acc[ATT_WARPS][CUDA_MAX_HEAD_DIM];
	__shared__ float part_m[ATT_WARPS], part_l[ATT_WARPS];
	__shared__ int bad;
	const int64_t t = blockIdx.x / a.n_heads, at = (int64_t)blockIdx.x * a.D;
	const int h = blockIdx.x % a.n_heads, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int64_t koff = (int64_t)(h / a.group) * a.D;
	const int32_t *blocks = token_blocks(a.kv, t, a.max_context - 1);
	att_state<NPL> st = { -INFINITY, 0.0f, {} };
	float M = -INFINITY;

	if (threadIdx.x == 0)
		bad = !blocks;
	for (int d = threadIdx.x; d < a.D; d += blockDim.x)
		qs[d] = a.q[at + d];
	__syncthreads();
	if (blocks) {
		const int n = a.kv.pos[t] + 1;

		for (int base = warp * 32; base < n; base += ATT_WARPS * 32)
			att_tile<NPL>(a, blocks, koff, qs, base, n, st, &bad);
	}
	if (lane == 0) {
		part_m[warp] = st.m;
		part_l[warp] = st.l;
	}
#pragma unroll
	for (int i = 0; i < NPL; i++)
		if (lane + 32 * i < a.D)
			part_acc[warp][lane + 32 * i] = st.acc[i];
	__syncthreads();
	if (bad) {
		for (int d = threadIdx.x; d < a.D; d += blockDim.x)
			a.out[at + d] = __int_as_float(0x7fc00000);
		if (threadIdx.x == 0)
			atomicOr(a.fault, CUDA_FAULT_ATTENTION);
		return;
	}
	for (int w = 0; w < ATT_WARPS; w++)
		M = fmaxf(M, part_m[w]);
	for (int d = threadIdx.x; d < a.D; d += blockDim.x) {
		float L = 0.0f, o = 0.0f;

		for (int w = 0; w < ATT_WARPS; w++) {
			if (part_m[w] == -INFINITY)
				continue;
			const float f = expf(part_m[w] - M);

			L += part_l[w] * f;
			o += part_acc[w][d] * f;
		}
		a.out[at + d] = o / L;
	}
}

/* Check b for T tokens over caches kc and vc (shapes only: the values are on
 * the device) and describe it for the kernels. */
static int paged_kv_init(paged_kv *kv, const struct kt_batch *b, int64_t T,
			 const struct kt_tensor *kc, const struct kt_tensor *vc)
{
	if (!b || b->n_tokens != T || b->block_size <= 0 || T > INT32_MAX)
		return -EINVAL;
	if (!cu_valid(kc, KT_F32) || !cu_shape(vc, KT_F32, kc->rows, kc->cols) ||
	    kc->rows % b->block_size || cu_overlap(kc, vc))
		return -EINVAL;
	if (!cu_shape(&b->pos, KT_I32, T, 1) || !cu_shape(&b->seq, KT_I32, T, 1) ||
	    !cu_valid(&b->block_tables, KT_I32))
		return -EINVAL;
	kv->pos = (const int32_t *)b->pos.data;
	kv->seq = (const int32_t *)b->seq.data;
	kv->bt = (const int32_t *)b->block_tables.data;
	kv->bt_rows = b->block_tables.rows;
	kv->bt_cols = b->block_tables.cols;
	kv->n_blocks = kc->rows / b->block_size;
	kv->row_len = kc->cols;
	kv->bs = b->block_size;
	return 0;
}

int cuda_kv_store(struct kt_backend *be, const struct kt_tensor *kcache,
		  const struct kt_tensor *vcache, const struct kt_tensor *k,
		  const struct kt_tensor *v, const struct kt_batch *b)
{
	struct cuda_backend *cu = cu_of(be);
	paged_kv kv;
	int64_t T;
	int rc;

	if (!cu_valid(k, KT_F32))
		return -EINVAL;
	T = k->rows;
	rc = paged_kv_init(&kv, b, T, kcache, vcache);
	if (rc)
		return rc;
	if (k->cols != kv.row_len || !cu_shape(v, KT_F32, T, kv.row_len))
		return -EINVAL;
	if (cu_overlap(kcache, k) || cu_overlap(kcache, v) || cu_overlap(vcache, k) ||
	    cu_overlap(vcache, v))
		return -EINVAL;
	if (!T || !kv.row_len)
		return 0;
	CU_CHECK(cu_enter(cu));
	kv_store_kernel<<<(unsigned)T, CUDA_THREADS, 0, cu->stream>>>(
		(float *)kcache->data, (float *)vcache->data, (const float *)k->data,
		(const float *)v->data, kv, cu->fault);
	CU_LAUNCHED();
	return 0;
}

static void launch_attention(const att_args &a, unsigned blocks, cudaStream_t s)
{
	const int npl = (a.D + 31) / 32;

	switch (npl) {
	case 1: attention_kernel<1><<<blocks, ATT_WARPS * 32, 0, s>>>(a); break;
	case 2: attention_kernel<2><<<blocks, ATT_WARPS * 32, 0, s>>>(a); break;
	case 3: attention_kernel<3><<<blocks, ATT_WARPS * 32, 0, s>>>(a); break;
	case 4: attention_kernel<4><<<blocks, ATT_WARPS * 32, 0, s>>>(a); break;
	case 5: attention_kernel<5><<<blocks, ATT_WARPS * 32, 0, s>>>(a); break;
	case 6: attention_kernel<6><<<blocks, ATT_WARPS * 32, 0, s>>>(a); break;
	case 7: attention_kernel<7><<<blocks, ATT_WARPS * 32, 0, s>>>(a); break;
	default: attention_kernel<8><<<blocks, ATT_WARPS * 32, 0, s>>>(a); break;
	}
}

int cuda_attention(struct kt_backend *be, const struct kt_tensor *out, const struct kt_tensor *q,
		   const struct kt_tensor *kcache, const struct kt_tensor *vcache,
		   const struct kt_batch *b, int n_heads, int n_kv_heads, int head_dim,
		   float scale)
{
	struct cuda_backend *cu = cu_of(be);
	att_args a;
	int64_t T;
	int rc;

	if (n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads || head_dim <= 0 ||
	    head_dim > cu->max_head_dim || !isfinite(scale))
		return -EINVAL;
	if (!cu_valid(q, KT_F32) || q->cols != (int64_t)n_heads * head_dim)
		return -EINVAL;
	T = q->rows;
	if (!cu_shape(out, KT_F32, T, q->cols) || (out->data != q->data && cu_overlap(out, q)))
		return -EINVAL;
	rc = paged_kv_init(&a.kv, b, T, kcache, vcache);
	if (rc)
		return rc;
	if (a.kv.row_len != (int64_t)n_kv_heads * head_dim || cu_overlap(out, kcache) ||
	    cu_overlap(out, vcache) || T * n_heads > INT32_MAX)
		return -EINVAL;
	if (!T)
		return 0;
	a.out = (float *)out->data;
	a.q = (const float *)q->data;
	a.kc = (const float *)kcache->data;
	a.vc = (const float *)vcache->data;
	a.n_heads = n_heads;
	a.group = n_heads / n_kv_heads;
	a.D = head_dim;
	a.max_context = cu->max_context;
	a.scale = scale;
	a.vec4 = head_dim % 4 == 0 && (uintptr_t)a.kc % 16 == 0 && (uintptr_t)a.vc % 16 == 0;
	a.fault = cu->fault;
	CU_CHECK(cu_enter(cu));
	launch_attention(a, (unsigned)(T * n_heads), cu->stream);
	CU_LAUNCHED();
	return 0;
}
