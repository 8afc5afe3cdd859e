/* Paged KV cache: kv_store writes each token's k and v rows, attention reads
 * them back, both only through the block table (DESIGN §4.2).
 *
 * Layout: kcache, vcache views of n_kv * D cols, bf16 (what the backend asks
 * the engine for) or f32, whose block j starts at row j * block_rows
 * (kv_block_rows, or bs); position p of the sequence in slot s lives in row
 * block_tables[s][p / bs] * block_rows + p % bs. q [T, n_heads * D] f32, out
 * the same shape in f32 or bf16 (att_out); head h reads kv head
 * h / (n_heads / n_kv).
 *
 * kv_store: one block per token copies its k and v rows, rounding to bf16
 * (nearest even) for a bf16 cache.
 *
 * attention picks kernels by the step's host-side shape (kt_batch):
 *  - bf16 caches, head_dim 64 or 128: the decode rows [0, n_single) go to the
 *    split-K decode kernel (cuda_attention_decode.cuh), whose launch depends
 *    only on n_single and max_kv_len, so it can be captured in a graph; each
 *    segment gets one launch of the prefill kernel
 *    (cuda_attention_prefill.cuh). Both run on tensor cores with q and P
 *    rounded to bf16 and f32 accumulation.
 *  - anything else (f32 caches, other head_dim, a batch that gives no step
 *    shape: n_single = n_segments = 0) runs the generic kernel over every
 *    row (cuda_attention_generic.cuh), all in f32.
 * pos, seq and block_tables are device memory, so their values are checked
 * by the kernels (a bad one sets a fault bit, see cuda_impl.h): kv_store then
 * skips the token, attention writes NaN for it. Segment fields are host
 * values and are checked here. An f32 out may be q; a bf16 one is apart.
 *
 * A rope_store left pending for this attention (cu->rope_pending, one
 * decode row, cuda_rope.cu) is taken by the decode kernel when the call is
 * its q over its caches and batch on the decode path; otherwise it is
 * launched first, as before any other op.
 */
#include <errno.h>
#include <math.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_attention_decode.cuh"
#include "kernels/cuda/cuda_attention_generic.cuh"
#include "kernels/cuda/cuda_attention_prefill.cuh"
#include "kernels/cuda/cuda_attention_wgmma.cuh"
#include "kernels/cuda/cuda_impl.h"

/* The prefill variants in use per head_dim: warps, ring depth, CTAs per SM,
 * softmax step, m-tiles a warp (dev/cuda/attention_prefill.cu measures the
 * alternatives). On a 9.0 GPU with sm_90a code (cu->att_wgmma), a segment
 * of head_dim 128 takes the wgmma kernel (cuda_attention_wgmma.cuh: two
 * warpgroups, 128 rows a CTA, as many as the narrow variant), at two CTAs a
 * multiprocessor where prefill_wgmma_pair says they pay, else at one:
 * Qwen3-8B's prompt of 8,192 tokens in chunks of 2,048 at 356 TFLOP/s
 * against the wide variant's 254, and in chunks of 512 at 168 against the
 * narrow one's 131 (H200, 2026-12-02).
 *
 * Elsewhere it takes the wide variant (two m-tiles a warp, 256 rows a CTA)
 * when prefill_wide_pays estimates it ends sooner. On an H200 it read the
 * Qwen3-8B prompt of 8,192 tokens in chunks of 2,048 (256 CTAs a chunk) at
 * 239 TFLOP/s against 183, but a grid smaller than the GPU was slower: 86
 * against 126 TFLOP/s in chunks of 512 (64 CTAs); taken for every segment,
 * Qwen3-0.6B's prompt of 2,048 (128 CTAs, the latest of them with twice the
 * rows of keys) lost 14 % of its prefill (docs/perf.md). All of them give
 * the same bits, so which one a segment takes changes no result. */
#define PREFILL_64 4, 2, 2, 64, 1
#define PREFILL_128 8, 2, 1, 64, 1
#define PREFILL_128_WIDE 8, 2, 1, 64, 2
#define PREFILL_WGMMA 2, 2

/* Row-splits per head of the decode workspace: up to 64 splits for a lone
 * row, 2 for 256 rows. */
#define ATT_WS_ROWS 512

__device__ __forceinline__ float narrow_to(float v, float *)
{
	return v;
}

__device__ __forceinline__ __nv_bfloat16 narrow_to(float v, __nv_bfloat16 *)
{
	return __float2bfloat16_rn(v);
}

template <typename CT>
__global__ void kv_store_kernel(CT *kc, CT *vc, const float *k, const float *v, paged_kv kv,
				unsigned *fault)
{
	const int64_t t = blockIdx.x;

	pdl_wait();
	pdl_launch_dependents();

	const int32_t *blocks = token_blocks(kv, t, INT32_MAX);
	const int64_t row = blocks ? cache_row(kv, blocks, kv.pos[t]) : -1;

	if (row < 0) {
		if (threadIdx.x == 0)
			atomicOr(fault, CUDA_FAULT_KV_STORE);
		return;
	}
	for (int64_t c = threadIdx.x; c < kv.row_len; c += blockDim.x) {
		kc[row * kv.row_len + c] = narrow_to(k[t * kv.row_len + c], kc);
		vc[row * kv.row_len + c] = narrow_to(v[t * kv.row_len + c], vc);
	}
}

/* Check b for T tokens over caches kc and vc (shapes only: the values are on
 * the device) and describe it for the kernels, which check each block id
 * against the blocks both caches hold whole. */
int paged_kv_init(paged_kv *kv, const struct kt_batch *b, int64_t T,
			 const struct kt_tensor *kc, const struct kt_tensor *vc)
{
	int64_t k_blocks, v_blocks;

	if (!b || b->n_tokens != T || b->block_size <= 0 || T > INT32_MAX)
		return -EINVAL;
	if (!kc || (kc->dtype != KT_F32 && kc->dtype != KT_BF16) || !cu_valid(kc, kc->dtype) ||
	    !cu_valid(vc, kc->dtype) || vc->cols != kc->cols)
		return -EINVAL;
	/* None also when the stride is below block_size: blocks would overlap. */
	k_blocks = kt_kv_blocks(b, kc->rows);
	v_blocks = kt_kv_blocks(b, vc->rows);
	if (!k_blocks || !v_blocks || !kt_kv_apart(b, kc, vc))
		return -EINVAL;
	if (!cu_shape(&b->pos, KT_I32, T, 1) || !cu_shape(&b->seq, KT_I32, T, 1) ||
	    !cu_valid(&b->block_tables, KT_I32))
		return -EINVAL;
	kv->pos = (const int32_t *)b->pos.data;
	kv->seq = (const int32_t *)b->seq.data;
	kv->bt = (const int32_t *)b->block_tables.data;
	kv->bt_rows = b->block_tables.rows;
	kv->bt_cols = b->block_tables.cols;
	kv->n_blocks = k_blocks < v_blocks ? k_blocks : v_blocks;
	kv->row_len = kc->cols;
	kv->bs = b->block_size;
	kv->block_rows = (int)kt_kv_block_rows(b);
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
	if (kcache->dtype == KT_BF16)
		cu_launch(cu->pdl, kv_store_kernel<__nv_bfloat16>, (unsigned)T, CUDA_THREADS, 0,
			  cu->stream, (__nv_bfloat16 *)kcache->data, (__nv_bfloat16 *)vcache->data,
			  (const float *)k->data, (const float *)v->data, kv, cu->fault);
	else
		cu_launch(cu->pdl, kv_store_kernel<float>, (unsigned)T, CUDA_THREADS, 0, cu->stream,
			  (float *)kcache->data, (float *)vcache->data, (const float *)k->data,
			  (const float *)v->data, kv, cu->fault);
	CU_LAUNCHED();
	return 0;
}

/* The step's host-side shape is consistent with T rows and the block table:
 * 0, 1 when it gives no shape at all, or -EINVAL. */
static int check_step_shape(const struct kt_batch *b, int64_t T, const paged_kv &kv,
			    int max_context)
{
	int64_t row;

	if (b->n_single == 0 && b->n_segments == 0)
		return 1;
	if (b->n_single < 0 || b->n_single > T || b->n_segments < 0 ||
	    (b->n_segments > 0 && !b->segments) || (b->n_single > 0 && b->max_kv_len < 1))
		return -EINVAL;
	row = b->n_single;
	for (int i = 0; i < b->n_segments; i++) {
		const struct kt_segment *g = &b->segments[i];
		const int64_t last = (int64_t)g->pos0 + g->n_rows - 1;

		if (g->row != row || g->n_rows <= 0 || g->n_rows > T - row || g->seq < 0 ||
		    g->seq >= kv.bt_rows || g->pos0 < 0 || last >= max_context ||
		    last / kv.bs >= kv.bt_cols)
			return -EINVAL;
		row += g->n_rows;
	}
	return row == T ? 0 : -EINVAL;
}

/* What every kernel of one attention call shares. */
struct att_call {
	struct cuda_backend *cu;
	att_out out;
	const float *q;
	const void *kc, *vc;
	paged_kv kv;
	int n_heads, n_kv, D;
	float scale;
};

/* Every row by its device metadata; positions up to min(max_context,
 * max_kv_len) - 1 (max_kv_len <= 0: no bound of its own). */
static int run_generic(const att_call &c, int64_t T, enum kt_dtype dt, int max_kv_len)
{
	const int ctx = c.cu->max_context;
	const int max_pos = (max_kv_len > 0 && max_kv_len < ctx ? max_kv_len : ctx) - 1;

	if (dt == KT_BF16) {
		gen_args<__nv_bfloat16> a = { c.out, c.q, (const __nv_bfloat16 *)c.kc,
					      (const __nv_bfloat16 *)c.vc, c.kv, c.n_heads,
					      c.n_heads / c.n_kv, c.D, max_pos, c.scale, false,
					      c.cu->fault };

		gen_launch(a, (unsigned)(T * c.n_heads), c.cu->stream);
	} else {
		gen_args<float> a = { c.out, c.q, (const float *)c.kc, (const float *)c.vc, c.kv,
				      c.n_heads, c.n_heads / c.n_kv, c.D, max_pos, c.scale,
				      false, c.cu->fault };

		a.vec4 = c.D % 4 == 0 && (uintptr_t)c.kc % 16 == 0 && (uintptr_t)c.vc % 16 == 0;
		gen_launch(a, (unsigned)(T * c.n_heads), c.cu->stream);
	}
	CU_LAUNCHED();
	return 0;
}

/* The pending rope_store rp as the decode kernel takes it. */
static decode_rope decode_rope_of(const struct cuda_rope_pending *rp)
{
	const struct kt_rope_store_args *ra = &rp->args;
	const int64_t D = ra->head_dim;
	decode_rope r;

	if (ra->qkv) {
		r.q = (const float *)ra->qkv->data;
		r.k = r.q + ra->n_heads * D;
		r.v = r.k + ra->n_kv_heads * D;
		r.ld_q = r.ld_kv = ra->qkv->cols;
	} else {
		r.q = (const float *)ra->q->data;
		r.k = (const float *)ra->k->data;
		r.v = (const float *)ra->v->data;
		r.ld_q = ra->q->cols;
		r.ld_kv = ra->k->cols;
	}
	r.kc = (__nv_bfloat16 *)ra->kcache->data;
	r.vc = (__nv_bfloat16 *)ra->vcache->data;
	r.inv_freq = (const float *)ra->inv_freq->data;
	r.q_norm = ra->q_norm ? ra->q_norm->data : NULL;
	r.k_norm = ra->k_norm ? ra->k_norm->data : NULL;
	r.eps = ra->eps;
	r.n_pairs = (int)ra->inv_freq->cols;
	return r;
}

/* rp NULL: the decode of rows 0..rows-1; else, of one row with the
 * rope_store rp (cuda_decode_takes_rope held for it). */
template <int D>
static int run_decode(const att_call &c, int rows, int max_kv_len,
		      const struct cuda_rope_pending *rp)
{
	struct cuda_backend *cu = c.cu;
	const int L = max_kv_len < cu->max_context ? max_kv_len : cu->max_context;
	const int ws = c.n_heads <= cu->att_heads ? cu->att_ws_rows : 0;
	const decode_plan p = decode_plan_make(rows, c.n_heads / c.n_kv, c.n_kv, L,
					       D == 64 ? cu->att_slots64 : cu->att_slots128, ws,
					       decode_min_chunk(rows));
	decode_args a;

	a.out = c.out;
	a.q = c.q;
	a.kc = (const __nv_bfloat16 *)c.kc;
	a.vc = (const __nv_bfloat16 *)c.vc;
	a.kv = c.kv;
	a.n_heads = c.n_heads;
	a.group = c.n_heads / c.n_kv;
	a.head_chunks = p.head_chunks;
	a.max_pos = L - 1;
	a.chunk = p.chunk;
	a.splits = p.splits;
	a.sl2 = c.scale * ATT_LOG2E;
	a.part_o = cu->att_part_o;
	a.part_ml = cu->att_part_ml;
	a.count = cu->att_count;
	a.fault = cu->fault;
	/* The splits merge through clusters only in the launch where that was
	 * measured to pay (docs/perf.md, 2026-12-03, H200): one decode row that
	 * takes its rope right after a q/k/v product on gemv_kernel (Qwen3-0.6B
	 * at batch 1: +3.0 %, +4.0 % with the next kernel placed early). After
	 * the bulk GEMV (Qwen3-8B at batch 1) they lost 0.4 % and 0.8 %, and a
	 * launch of 4 rows at a context of 2,048 lost 13-27 %. */
	const bool cl = rp && !rp->after_bulk && decode_clusters(cu->att_clusters, p.splits);

	if (!rp)
		decode_launch<D, DEC_STAGES>(cu->pdl, a, rows, c.n_kv, cu->stream, cl);
	else if ((a.rope = decode_rope_of(rp)), rp->args.q_norm &&
						   rp->args.q_norm->dtype == KT_BF16)
		decode_launch<D, DEC_STAGES, __nv_bfloat16>(cu->pdl, a, rows, c.n_kv, cu->stream, cl);
	else
		decode_launch<D, DEC_STAGES, float>(cu->pdl, a, rows, c.n_kv, cu->stream, cl);
	CU_LAUNCHED();
	return 0;
}

static int run_segment(const att_call &c, const struct kt_segment *g)
{
	prefill_args a;

	a.out = c.out;
	a.q = c.q;
	a.kc = (const __nv_bfloat16 *)c.kc;
	a.vc = (const __nv_bfloat16 *)c.vc;
	a.blocks = c.kv.bt + (int64_t)g->seq * c.kv.bt_cols;
	a.kv = c.kv;
	a.row0 = g->row;
	a.n_rows = g->n_rows;
	a.pos0 = g->pos0;
	a.n_heads = c.n_heads;
	a.group = c.n_heads / c.n_kv;
	a.sl2 = c.scale * ATT_LOG2E;
	a.fault = c.cu->fault;
	if (c.D == 64) {
		if (!prefill_tiles(a, prefill_cfg<64, PREFILL_64>::rows))
			return -EINVAL;
		prefill_launch<64, PREFILL_64>(c.cu->pdl, a, c.n_kv, c.cu->stream);
	} else if (c.cu->att_wgmma) {
		const int tiles = prefill_tiles(a, wgmma_cfg<PREFILL_WGMMA, 1>::rows);

		if (!tiles)
			return -EINVAL;
		if (prefill_wgmma_pair(a, (int64_t)tiles * c.n_kv, c.cu->att_sms))
			prefill_wgmma_launch<PREFILL_WGMMA, 2>(c.cu->pdl, a, c.n_kv, c.cu->stream);
		else
			prefill_wgmma_launch<PREFILL_WGMMA, 1>(c.cu->pdl, a, c.n_kv, c.cu->stream);
	} else {
		const int narrow_rows = prefill_cfg<128, PREFILL_128>::rows;
		const int wide_rows = prefill_cfg<128, PREFILL_128_WIDE>::rows;

		if (prefill_tiles(a, wide_rows) &&
		    prefill_wide_pays(a, c.n_kv, c.cu->att_sms, narrow_rows, wide_rows))
			prefill_launch<128, PREFILL_128_WIDE>(c.cu->pdl, a, c.n_kv, c.cu->stream);
		else if (prefill_tiles(a, narrow_rows))
			prefill_launch<128, PREFILL_128>(c.cu->pdl, a, c.n_kv, c.cu->stream);
		else
			return -EINVAL;
	}
	CU_LAUNCHED();
	return 0;
}

template <int D> static int run_tensor_cores(const att_call &c, const struct kt_batch *b)
{
	int rc = 0;

	if (b->n_single > 0)
		rc = run_decode<D>(c, b->n_single, b->max_kv_len, NULL);
	for (int i = 0; !rc && i < b->n_segments; i++)
		rc = run_segment(c, &b->segments[i]);
	return rc;
}

/* The call is the attention the pending rope_store rp was left for: its q
 * over its caches and batch, by the decode kernel (one row, one head chunk). */
static bool rope_is_for(const struct cuda_rope_pending *rp, const struct kt_tensor *q,
			const struct kt_tensor *kc, const struct kt_tensor *vc,
			const struct kt_batch *b, const att_call &c)
{
	const struct kt_rope_store_args *ra = &rp->args;
	const struct kt_batch *rb = &rp->batch;

	return q->data == ra->q->data && q->rows == 1 && kc->data == ra->kcache->data &&
	       vc->data == ra->vcache->data && kc->rows == ra->kcache->rows &&
	       vc->rows == ra->vcache->rows && c.n_heads == ra->n_heads &&
	       c.n_kv == ra->n_kv_heads && c.D == ra->head_dim && b->n_single == 1 &&
	       b->n_segments == 0 && b->pos.data == rb->pos.data &&
	       b->seq.data == rb->seq.data && b->block_tables.data == rb->block_tables.data &&
	       b->block_tables.rows == rb->block_tables.rows &&
	       b->block_tables.cols == rb->block_tables.cols &&
	       b->block_size == rb->block_size && kt_kv_block_rows(b) == kt_kv_block_rows(rb);
}

int cuda_attention(struct kt_backend *be, const struct kt_tensor *out, const struct kt_tensor *q,
		   const struct kt_tensor *kcache, const struct kt_tensor *vcache,
		   const struct kt_batch *b, int n_heads, int n_kv_heads, int head_dim,
		   float scale)
{
	struct cuda_backend *cu = cu_of(be);
	att_call c;
	int64_t T;
	int rc, shape;
	bool tc;

	if (n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads || head_dim <= 0 ||
	    head_dim > cu->max_head_dim || !isfinite(scale))
		return -EINVAL;
	if (!cu_valid(q, KT_F32) || q->cols != (int64_t)n_heads * head_dim)
		return -EINVAL;
	T = q->rows;
	if (!out || (out->dtype != KT_F32 && out->dtype != KT_BF16) ||
	    !cu_shape(out, out->dtype, T, q->cols) ||
	    ((out->dtype == KT_BF16 || out->data != q->data) && cu_overlap(out, q)))
		return -EINVAL;
	rc = paged_kv_init(&c.kv, b, T, kcache, vcache);
	if (rc)
		return rc;
	if (c.kv.row_len != (int64_t)n_kv_heads * head_dim || cu_overlap(out, kcache) ||
	    cu_overlap(out, vcache) || T * n_heads > INT32_MAX)
		return -EINVAL;
	shape = check_step_shape(b, T, c.kv, cu->max_context);
	if (shape < 0)
		return shape;
	if (!T)
		return 0;
	c.cu = cu;
	c.out = { out->data, out->dtype == KT_BF16 };
	c.q = (const float *)q->data;
	c.kc = kcache->data;
	c.vc = vcache->data;
	c.n_heads = n_heads;
	c.n_kv = n_kv_heads;
	c.D = head_dim;
	c.scale = scale;
	tc = cu->att_ready && !shape && kcache->dtype == KT_BF16 &&
	     (head_dim == 64 || head_dim == 128) && (uintptr_t)c.kc % 16 == 0 &&
	     (uintptr_t)c.vc % 16 == 0 && (uintptr_t)c.q % 8 == 0 && (uintptr_t)c.out.p % 16 == 0;
	CU_CHECK(cu_keep_rope(cu));
	if (cu->rope_pending.set && tc && rope_is_for(&cu->rope_pending, q, kcache, vcache, b, c)) {
		cu->rope_pending.set = false;
		rc = head_dim == 64 ? run_decode<64>(c, 1, b->max_kv_len, &cu->rope_pending)
				    : run_decode<128>(c, 1, b->max_kv_len, &cu->rope_pending);
		return rc;
	}
	CU_CHECK(cu_enter(cu));
	if (!tc)
		return run_generic(c, T, kcache->dtype, b->max_kv_len);
	return head_dim == 64 ? run_tensor_cores<64>(c, b) : run_tensor_cores<128>(c, b);
}

bool cuda_decode_takes_rope(const struct cuda_backend *cu, const struct kt_rope_store_args *a,
			    const struct kt_batch *b)
{
	return cu->att_ready && a->q->rows == 1 && b->n_single == 1 && b->n_segments == 0 &&
	       b->max_kv_len >= 1 && a->kcache->dtype == KT_BF16 &&
	       (a->head_dim == 64 || a->head_dim == 128) && a->n_heads % a->n_kv_heads == 0 &&
	       a->n_heads / a->n_kv_heads <= DEC_HEADS;
}

int cuda_attention_open(struct cuda_backend *cu, const struct kt_config *c)
{
	const int dim = c->max_head_dim < 128 ? c->max_head_dim : 128;
	int n_sms = 0, major = 0, minor = 0, clusters = 0;

	cu->att_ready = false;
	CU_CHECK(cu_enter(cu));
	CU_CHECK(cudaDeviceGetAttribute(&n_sms, cudaDevAttrMultiProcessorCount, cu->device));
	CU_CHECK((decode_setup<64, DEC_STAGES>()));
	CU_CHECK((decode_setup<128, DEC_STAGES>()));
	CU_CHECK((decode_setup<64, DEC_STAGES, float>()));
	CU_CHECK((decode_setup<128, DEC_STAGES, float>()));
	CU_CHECK((decode_setup<64, DEC_STAGES, __nv_bfloat16>()));
	CU_CHECK((decode_setup<128, DEC_STAGES, __nv_bfloat16>()));
	CU_CHECK((prefill_setup<64, PREFILL_64>()));
	CU_CHECK((prefill_setup<128, PREFILL_128>()));
	CU_CHECK((prefill_setup<128, PREFILL_128_WIDE>()));
	CU_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, cu->device));
	CU_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, cu->device));
#ifdef ATLAS_CUDA_SM90A
	cu->att_wgmma = major == 9 && minor == 0;
#else
	cu->att_wgmma = false;
#endif
	CU_CHECK(cudaDeviceGetAttribute(&clusters, cudaDevAttrClusterLaunch, cu->device));
	cu->att_clusters = clusters != 0;
	if (cu->att_wgmma) {
		CU_CHECK((prefill_wgmma_setup<PREFILL_WGMMA, 1>()));
		CU_CHECK((prefill_wgmma_setup<PREFILL_WGMMA, 2>()));
	}
	cu->att_slots64 = decode_slots<64, DEC_STAGES>(n_sms);
	cu->att_slots128 = decode_slots<128, DEC_STAGES>(n_sms);
	cu->att_sms = n_sms;
	cu->att_heads = c->max_heads > 0 ? c->max_heads : 0;
	cu->att_ws_rows = cu->att_heads ? ATT_WS_ROWS : 0;
	if (cu->att_ws_rows) {
		const size_t slots = (size_t)cu->att_ws_rows * cu->att_heads;

		CU_CHECK(cudaMalloc((void **)&cu->att_part_o, slots * dim * sizeof(float)));
		CU_CHECK(cudaMalloc((void **)&cu->att_part_ml, slots * sizeof(float2)));
		CU_CHECK(cudaMalloc((void **)&cu->att_count, slots * sizeof(int)));
		CU_CHECK(cudaMemsetAsync(cu->att_count, 0, slots * sizeof(int), cu->stream));
	}
	cu->att_ready = true;
	return 0;
}

void cuda_attention_close(struct cuda_backend *cu)
{
	CU_WARN(cudaFree(cu->att_part_o));
	CU_WARN(cudaFree(cu->att_part_ml));
	CU_WARN(cudaFree(cu->att_count));
	cu->att_part_o = NULL;
	cu->att_part_ml = NULL;
	cu->att_count = NULL;
	cu->att_ready = false;
}
