/* Rotary position embedding in place, rotate-half pairing (GPT-NeoX, Hugging
 * Face), over the first R = 2 * inv_freq.cols dims of each head (R < D is
 * partial rotary: the other D - R dims pass unchanged), with Qwen3's
 * per-head RMSNorm (q_norm, k_norm) fused in front, as the cpu backend
 * computes them.
 *
 * Norm (when norm_w): each head's D values as cpu_rmsnorm does a row: the
 * sum of squares in double, var = (float)(ss / D), inv = 1/sqrtf(var + eps),
 * x = w * (x * inv). The squares of f32 values are exact in double, so only
 * the order of the double sum differs from the cpu, which almost never shows
 * in the f32 var.
 *
 * Rotation: x[i] and x[i + R/2] rotated by the f32 angle (float)pos *
 * inv_freq[i], with cosf/sinf (the accurate library functions, not the
 * __cosf intrinsics) and unfused products (__fmul_rn), so the result matches
 * the cpu within the last bits of cosf/sinf.
 *
 * Layout: x [T, n_heads * D] f32, pos [T, 1] i32 (device), inv_freq
 * [1, R/2] f32 (0 < R <= D), norm_w NULL or [1, D] f32 or bf16 (a weight as
 * kt_weight stores it).
 *
 * Launch: one block of CUDA_THREADS per token. The block first puts the
 * token's R/2 cos/sin pairs in shared memory; then each warp takes whole
 * heads (warp v: heads v, v + 8, ...), lane l holding pairs l, l + 32, ...
 * and the unrotated tail dims R + l, R + l + 32, ... in registers from load
 * through norm and rotation to store, the head's sum of squares reduced by a
 * butterfly shuffle. With R == D the tail is empty and the kernel does what
 * it did before partial rotary, operation for operation. A negative
 * position leaves the token alone and sets CUDA_FAULT_ROPE.
 *
 * rope_store (a layer's rope of q, rope of k, then kv_store of k and v):
 * one launch of a block per token and group of 8 heads (grid y), the q
 * heads and then the k heads, a warp per head through rope_load and
 * rope_finish, the two halves of rope's rope_head. A warp reads its head
 * (and for a k head also v's head and the key's cache row) before the
 * cos/sin table: each of those loads after the table, or after a store the
 * compiler cannot separate from it, was a round trip of its own (on an
 * H100, decode at 8 rows +0.8 to +4.4 %, prefill +0.4 to +6.0 %:
 * docs/perf.md). A k head's warp then rounds the values it holds into the
 * cache row, as kv_store rounds what rope left in k, and puts v's head
 * beside it. At batch 1 this is one launch of 5 blocks (Qwen3-8B's 32 + 8
 * heads) for three launches of one block each. A negative position sets
 * CUDA_FAULT_ROPE and CUDA_FAULT_KV_STORE (the three ops' faults) and
 * leaves the token alone; a bad slot or block id ropes q and k and stores
 * nothing, with CUDA_FAULT_KV_STORE. Calls the kernel does not take (norms
 * of two dtypes, one norm) run the three ops.
 *
 * A rope_store with attend_next that the decode attention can take (one
 * decode row; cuda_decode_takes_rope), called right after a product (the q,
 * k, v product: cu->after_product), launches nothing: it waits in
 * cu->rope_pending, and the attention after it ropes the row in its own
 * blocks (cuda_attention_decode.cuh) through cuda_rope.cuh's rope_load,
 * rope_apply and rope_put, the steps this file's kernels share. At one row
 * a decode step spent about 4 us a layer on this launch alone on an H100,
 * nearly all of it the chain of dependent memory round trips after its
 * wait. The product before is what lets that kernel read the row's tables
 * and older keys before its wait: a product writes neither. Any other op
 * launches the pending one first (cu_enter).
 */
#include <errno.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_attention_common.cuh"
#include "kernels/cuda/cuda_impl.h"
#include "kernels/cuda/cuda_pdl.cuh"
#include "kernels/cuda/cuda_reduce.cuh"
#include "kernels/cuda/cuda_rope.cuh"

/* Heads of at most this many dims (every Qwen3's 128) take rope_store_kernel
 * with registers for that many, not for CUDA_MAX_HEAD_DIM: the larger
 * arrays' unused parts are only predicated off, and they took 64 registers
 * a thread against 46, 4 blocks a multiprocessor against 5. Its blocks are
 * short chains of round trips (loads, the table, the norm's sum, stores),
 * so more of them side by side is what speeds it up: Qwen3-8B's
 * 8,192-token prefill spent 7.1 ms in it against 9.4 (H200, 2026-12-02).
 * Two tokens a block (more work a block, 64 registers) was slower. */
#define ROPE_STORE_SMALL_D 128

/* n_pairs = R/2 rotated pairs of each head of D dims. */
template <typename W>
__global__ void rope_kernel(float *x, const int32_t *pos, const float *inv_freq, const W *norm_w,
			    float eps, int n_heads, int D, int n_pairs, unsigned *fault)
{
	__shared__ float cs[CUDA_MAX_HEAD_DIM / 2], sn[CUDA_MAX_HEAD_DIM / 2];
	const int half = n_pairs, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const int tail = D - 2 * half;
	float *xt = x + (int64_t)blockIdx.x * n_heads * D;
	rope_regs r;

	pdl_wait();
	pdl_launch_dependents();
	if (!rope_table(cs, sn, pos[blockIdx.x], inv_freq, half, fault, CUDA_FAULT_ROPE))
		return;
	for (int h = warp; h < n_heads; h += blockDim.x >> 5)
		rope_head(xt + (int64_t)h * D, xt + (int64_t)h * D, r, cs, sn, norm_w, eps, lane,
			  half, tail);
}

/* rope_store: what the three ops do, for one token (grid x) and the heads
 * [8·y, 8·y + 8) (grid y, a warp each) of the q heads followed by the k
 * heads. A k head's warp writes the rotated values it holds into the cache
 * row (rounded as kv_store rounds them) and copies the head of v there.
 * With qkv, q, k and v are read from its rows: q and k are written roped
 * to q and k, v is not copied out (the contract leaves k and v scratch). */
template <typename W, typename CT>
struct rope_store_args {
	const float *qkv;             /* NULL or [T, (n_heads + 2 n_kv) * D] */
	float *q, *k;                 /* [T, n_heads * D], [T, n_kv * D] */
	const float *v;               /* [T, n_kv * D] */
	CT *kc, *vc;                  /* paged caches of n_kv * D cols */
	paged_kv kv;                  /* pos: rope's positions too */
	const float *inv_freq;        /* [n_pairs] */
	const W *q_norm, *k_norm;     /* NULL or [D], both or neither */
	float eps;
	int n_heads, n_kv, D, n_pairs;
	unsigned *fault;
};

template <int MAXD, typename W, typename CT>
__global__ void rope_store_kernel(const __grid_constant__ rope_store_args<W, CT> a)
{
	__shared__ float cs[CUDA_MAX_HEAD_DIM / 2], sn[CUDA_MAX_HEAD_DIM / 2];
	const int half = a.n_pairs, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const int tail = a.D - 2 * half, h = blockIdx.y * (CUDA_THREADS / 32) + warp;
	const int64_t t = blockIdx.x;
	/* token t's packed row: q's heads, k's, v's */
	const float *packed = a.qkv ? a.qkv + t * (a.n_heads + 2 * a.n_kv) * a.D : NULL;
	const bool is_q = h < a.n_heads, is_k = !is_q && h < a.n_heads + a.n_kv;
	const int kh = h - a.n_heads;
	const int64_t at = is_q ? (t * a.n_heads + h) * a.D : t * a.kv.row_len + (int64_t)kh * a.D;
	float *dst = is_q ? a.q + at : a.k + at;
	const float *src = packed ? packed + (int64_t)h * a.D : dst;
	const W *norm_w = is_q ? a.q_norm : a.k_norm;
	float v[MAXD / 32];
	int64_t row = -1;
	rope_regs_of<MAXD> r;

	pdl_wait();
	pdl_launch_dependents();
	/* Every load of the warp's head (and of v and the cache row for a k
	 * head) before the table: each one after it, or after a store, would
	 * be a round trip of its own. */
	if (is_q || is_k)
		rope_load(r, src, lane, half, tail);
	if (is_k) {
		const float *vh =
			packed ? packed + (int64_t)(a.n_heads + a.n_kv + kh) * a.D : a.v + at;
		const int32_t *blocks = token_blocks(a.kv, t, INT32_MAX);

#pragma unroll
		for (int j = 0; j < MAXD / 32; j++)
			v[j] = lane + 32 * j < a.D ? vh[lane + 32 * j] : 0.0f;
		row = blocks ? cache_row(a.kv, blocks, a.kv.pos[t]) : -1;
	}
	if (!rope_table(cs, sn, a.kv.pos[t], a.inv_freq, half, a.fault,
			CUDA_FAULT_ROPE | CUDA_FAULT_KV_STORE))
		return;
	if (!is_q && !is_k)
		return;
	rope_finish(src, dst, r, cs, sn, norm_w, a.eps, lane, half, tail);
	if (is_q)
		return;
	if (row < 0) {
		if (lane == 0)
			atomicOr(a.fault, CUDA_FAULT_KV_STORE);
		return;
	}

	CT *kr = a.kc + row * a.kv.row_len + (int64_t)kh * a.D, *vr = a.vc + (kr - a.kc);

	rope_put(kr, r, lane, half, tail, true);
#pragma unroll
	for (int j = 0; j < MAXD / 32; j++)
		if (lane + 32 * j < a.D)
			narrow_to(&vr[lane + 32 * j], v[j]);
}

static bool rope_args_ok(const struct cuda_backend *cu, const struct kt_tensor *x,
			 const struct kt_tensor *pos, const struct kt_tensor *inv_freq,
			 int n_heads, int head_dim, const struct kt_tensor *norm_w, float eps)
{
	if (n_heads <= 0 || head_dim <= 0 || head_dim % 2 || head_dim > cu->max_head_dim)
		return false;
	if (!cu_valid(x, KT_F32) || x->rows > INT32_MAX)
		return false;
	if (x->cols != (int64_t)n_heads * head_dim || !cu_shape(pos, KT_I32, x->rows, 1) ||
	    !cu_valid(inv_freq, KT_F32) || inv_freq->rows != 1 || inv_freq->cols < 1 ||
	    2 * inv_freq->cols > head_dim)
		return false;
	if (cu_overlap(x, pos) || cu_overlap(x, inv_freq))
		return false;
	if (norm_w && (!cu_float(norm_w) || norm_w->rows != 1 || norm_w->cols != head_dim ||
		       cu_overlap(x, norm_w) || !(eps >= 0.0f)))
		return false;
	return true;
}

int cuda_rope(struct kt_backend *be, const struct kt_tensor *x, const struct kt_tensor *pos,
	      const struct kt_tensor *inv_freq, int n_heads, int head_dim,
	      const struct kt_tensor *norm_w, float eps)
{
	struct cuda_backend *cu = cu_of(be);
	const unsigned T = (unsigned)(x && x->rows > 0 ? x->rows : 0);
	float *xd;
	const int32_t *pd;
	const float *fd;

	if (!rope_args_ok(cu, x, pos, inv_freq, n_heads, head_dim, norm_w, eps))
		return -EINVAL;
	if (!T)
		return 0;
	xd = (float *)x->data;
	pd = (const int32_t *)pos->data;
	fd = (const float *)inv_freq->data;
	CU_CHECK(cu_enter(cu));
	if (norm_w && norm_w->dtype == KT_BF16)
		cu_launch(cu->pdl, rope_kernel<__nv_bfloat16>, T, CUDA_THREADS, 0, cu->stream, xd, pd, fd,
			  (const __nv_bfloat16 *)norm_w->data, eps, n_heads, head_dim,
			  (int)inv_freq->cols, cu->fault);
	else
		cu_launch(cu->pdl, rope_kernel<float>, T, CUDA_THREADS, 0, cu->stream, xd, pd, fd,
			  norm_w ? (const float *)norm_w->data : (const float *)NULL, eps, n_heads,
			  head_dim, (int)inv_freq->cols, cu->fault);
	CU_LAUNCHED();
	return 0;
}

/* Whether rope_store_kernel takes the call (kv filled in): everything the
 * three ops check, norms of one dtype (or none), and q, k, v and the caches
 * apart. Otherwise the three ops run and refuse what they refuse. */
static bool rope_store_takes(const struct cuda_backend *cu, const struct kt_rope_store_args *a,
			     const struct kt_batch *b, paged_kv *kv)
{
	const struct kt_tensor *t[] = { a->q, a->k, a->v, a->qkv };

	if (!rope_args_ok(cu, a->q, &b->pos, a->inv_freq, a->n_heads, a->head_dim, a->q_norm,
			  a->eps) ||
	    !rope_args_ok(cu, a->k, &b->pos, a->inv_freq, a->n_kv_heads, a->head_dim, a->k_norm,
			  a->eps))
		return false;
	if (!a->q_norm != !a->k_norm || (a->q_norm && a->q_norm->dtype != a->k_norm->dtype))
		return false;
	if (a->q->rows != a->k->rows || paged_kv_init(kv, b, a->k->rows, a->kcache, a->vcache) ||
	    a->k->cols != kv->row_len || !cu_shape(a->v, KT_F32, a->k->rows, kv->row_len))
		return false;
	if (a->qkv && !cu_shape(a->qkv, KT_F32, a->q->rows, a->q->cols + 2 * a->k->cols))
		return false;
	for (int i = 0; i < 4; i++)
		if (t[i] && (cu_overlap(t[i], a->kcache) || cu_overlap(t[i], a->vcache)))
			return false;
	return (a->n_heads + a->n_kv_heads + 7) / 8 <= 65535;
}

template <typename W, typename CT>
static void launch_rope_store(const struct cuda_backend *cu, const struct kt_rope_store_args *a,
			      const paged_kv &kv)
{
	const rope_store_args<W, CT> args = {
		a->qkv ? (const float *)a->qkv->data : NULL, (float *)a->q->data, (float *)a->k->data, (const float *)a->v->data,
		(CT *)a->kcache->data, (CT *)a->vcache->data, kv, (const float *)a->inv_freq->data,
		a->q_norm ? (const W *)a->q_norm->data : NULL,
		a->k_norm ? (const W *)a->k_norm->data : NULL, a->eps, a->n_heads, a->n_kv_heads,
		a->head_dim, (int)a->inv_freq->cols, cu->fault,
	};
	const dim3 grid((unsigned)a->q->rows,
			(unsigned)((a->n_heads + a->n_kv_heads + CUDA_THREADS / 32 - 1) /
				   (CUDA_THREADS / 32)));

	if (a->head_dim <= ROPE_STORE_SMALL_D)
		cu_launch(cu->pdl, rope_store_kernel<ROPE_STORE_SMALL_D, W, CT>, grid, CUDA_THREADS, 0,
			  cu->stream, args);
	else
		cu_launch(cu->pdl, rope_store_kernel<CUDA_MAX_HEAD_DIM, W, CT>, grid, CUDA_THREADS, 0,
			  cu->stream, args);
}

template <typename W>
static void launch_rope_store(const struct cuda_backend *cu, const struct kt_rope_store_args *a,
			      const paged_kv &kv)
{
	if (a->kcache->dtype == KT_BF16)
		launch_rope_store<W, __nv_bfloat16>(cu, a, kv);
	else
		launch_rope_store<W, float>(cu, a, kv);
}

static void launch_rope_store(const struct cuda_backend *cu, const struct kt_rope_store_args *a,
			      const paged_kv &kv)
{
	if (a->q_norm && a->q_norm->dtype == KT_BF16)
		launch_rope_store<__nv_bfloat16>(cu, a, kv);
	else
		launch_rope_store<float>(cu, a, kv);
}

/* Leave the call pending for the attention after it: copies of its
 * tensors, which its args then point to. */
static void defer_rope_store(struct cuda_backend *cu, const struct kt_rope_store_args *a,
			     const struct kt_batch *b)
{
	struct cuda_rope_pending *p = &cu->rope_pending;
	const struct kt_tensor none = {};

	p->args = *a;
	p->qkv = a->qkv ? *a->qkv : none;
	p->q = *a->q;
	p->k = *a->k;
	p->v = *a->v;
	p->inv_freq = *a->inv_freq;
	p->q_norm = a->q_norm ? *a->q_norm : none;
	p->k_norm = a->k_norm ? *a->k_norm : none;
	p->kcache = *a->kcache;
	p->vcache = *a->vcache;
	p->args.qkv = a->qkv ? &p->qkv : NULL;
	p->args.q = &p->q;
	p->args.k = &p->k;
	p->args.v = &p->v;
	p->args.inv_freq = &p->inv_freq;
	p->args.q_norm = a->q_norm ? &p->q_norm : NULL;
	p->args.k_norm = a->k_norm ? &p->k_norm : NULL;
	p->args.kcache = &p->kcache;
	p->args.vcache = &p->vcache;
	p->batch = *b;
	p->batch.segments = NULL;
	p->set = true;
}

/* q, k and v taken out of the rows of a->qkv (the three ops' way). */
static int unpack_qkv(struct cuda_backend *cu, const struct kt_rope_store_args *a)
{
	const struct kt_tensor *parts[] = { a->q, a->k, a->v };
	const int64_t T = a->q->rows, ld = a->qkv->cols;
	int64_t c0 = 0;

	if (!cu_shape(a->qkv, KT_F32, T, ld) || !cu_valid(a->q, KT_F32) ||
	    !cu_valid(a->k, KT_F32) || !cu_valid(a->v, KT_F32))
		return -EINVAL;
	if (!T)
		return 0;
	CU_CHECK(cu_enter(cu));
	for (int i = 0; i < 3; i++) {
		const int64_t n = parts[i]->cols;

		CU_CHECK(cudaMemcpy2DAsync(parts[i]->data, (size_t)n * sizeof(float),
					   (const float *)a->qkv->data + c0, (size_t)ld * sizeof(float),
					   (size_t)n * sizeof(float), (size_t)T,
					   cudaMemcpyDeviceToDevice, cu->stream));
		c0 += n;
	}
	return 0;
}

int cuda_rope_store(struct kt_backend *be, const struct kt_rope_store_args *a,
		    const struct kt_batch *b)
{
	struct cuda_backend *cu = cu_of(be);
	paged_kv kv;
	bool after_product, after_bulk;
	int rc;

	if (!rope_store_takes(cu, a, b, &kv)) {
		if (a->qkv && (rc = unpack_qkv(cu, a)))
			return rc;
		if ((rc = cuda_rope(be, a->q, &b->pos, a->inv_freq, a->n_heads, a->head_dim,
				    a->q_norm, a->eps)) ||
		    (rc = cuda_rope(be, a->k, &b->pos, a->inv_freq, a->n_kv_heads, a->head_dim,
				    a->k_norm, a->eps)))
			return rc;
		return cuda_kv_store(be, a->kcache, a->vcache, a->k, a->v, b);
	}
	if (!a->q->rows)
		return 0;
	after_product = cu->after_product;
	after_bulk = cu->product_on_bulk;
	CU_CHECK(cu_enter(cu));
	if (a->attend_next && after_product && cuda_decode_takes_rope(cu, a, b)) {
		defer_rope_store(cu, a, b);
		cu->rope_pending.after_bulk = after_bulk;
		return 0;
	}
	launch_rope_store(cu, a, kv);
	CU_LAUNCHED();
	return 0;
}

cudaError_t cuda_rope_flush(struct cuda_backend *cu)
{
	struct cuda_rope_pending *p = &cu->rope_pending;
	paged_kv kv;

	p->set = false;
	if (paged_kv_init(&kv, &p->batch, p->k.rows, &p->kcache, &p->vcache))
		return cudaErrorInvalidValue; /* checked when it was left pending */
	launch_rope_store(cu, &p->args, kv);
	return cudaGetLastError();
}
