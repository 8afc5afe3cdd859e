/* Internals of the cuda backend, shared by its .cu files (not for the engine).
 *
 * Ordering: every op is enqueued on the backend's one stream (non-blocking
 * with respect to the legacy default stream), so ops run in call order and
 * return before the device has run them. Only the sync points wait:
 * download, sample and synchronize (and, outside the step, weight and free).
 *
 * Device-side checks: an index that only the device sees (token ids, gather
 * indices, positions, sequence slots, block-table entries, a MoE plan's
 * order, offsets and slots) is checked by the kernel that reads it. A bad
 * one never causes an out-of-bounds access: the kernel skips the row or
 * writes NaN (or zeros), and sets its CUDA_FAULT_* bit in
 * cu->fault. The next sync point reads the bits, clears them, logs which ops
 * faulted and returns -EINVAL, so a step with bad metadata fails instead of
 * producing quiet garbage.
 *
 * No op allocates: the matmul activation workspace is made at open and grows
 * in weight() to the widest weight; the sampling buffers, the decode
 * attention's split partials and moe_route's chunk counts are sized at open
 * from kt_config; graphs are instantiated by kt_graph outside the replayed
 * steps.
 */
#ifndef ATLAS_KERNELS_CUDA_IMPL_H
#define ATLAS_KERNELS_CUDA_IMPL_H

#include <pthread.h>
#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

extern "C" {
#include "kernels/backend.h"
}

/* Largest head_dim the attention and rope kernels take (8 floats per lane). */
#define CUDA_MAX_HEAD_DIM 256

/* Threads of the generic row and elementwise kernels. */
#define CUDA_THREADS 256

/* Which op saw a bad device-side index since the last sync point. */
enum cuda_fault {
	CUDA_FAULT_EMBED = 1u << 0,
	CUDA_FAULT_GATHER = 1u << 1,
	CUDA_FAULT_ROPE = 1u << 2,
	CUDA_FAULT_KV_STORE = 1u << 3,
	CUDA_FAULT_ATTENTION = 1u << 4,
	CUDA_FAULT_KV_STAGE = 1u << 5,
	CUDA_FAULT_MOE_MATMUL = 1u << 6,
	CUDA_FAULT_MOE_COMBINE = 1u << 7,
	CUDA_FAULT_CONV1D = 1u << 8,
	CUDA_FAULT_DELTA_RULE = 1u << 9,
};

/* Most experts moe_route takes (E = logits cols): a warp holds a token's
 * logits in registers, 32 per lane at most (cuda_moe_route.cu). */
#define CUDA_MOE_MAX_E 1024

/* Assignments per chunk of moe_route's counting sort when T*k is large;
 * the workspace holds max_tokens * KT_MOE_MAX_K / CUDA_MOE_CHUNK chunks
 * and a larger T*k takes longer chunks. */
#define CUDA_MOE_CHUNK 256

/* Blocks of sample's max pass a row takes at most (cuda_sample.cu): the
 * size of a row's chunk maxima in cu->sample_part; the row's last block
 * reads them with one warp, two a lane. */
#define CUDA_SAMPLE_MAX_CHUNKS 64

/* sample's rows of a small top_k (cuda_sample.cu's topk_kernel): the
 * candidates a row keeps, and the rows a launch takes (cu->sample_cand
 * holds that many rows of candidates, 32 KB each). */
#define CUDA_SAMPLE_TOPK_CAND 4096
#define CUDA_SAMPLE_TOPK_ROWS 128

/* Copies of the swap tier in flight at once (cuda_transfer.cu): one event each. */
#define CUDA_COPY_RING 1024

/* Most graphs kept (kernels/cuda/cuda_graph.cu). */
#define CUDA_MAX_GRAPHS 128

/* One recorded graph: the ops of a step shape (key), ready to replay. */
struct cuda_graph_entry {
	uint64_t key;
	cudaGraphExec_t exec;       /* owned; NULL when not recorded */
	bool broken;                /* recording failed: the key runs op by op */
};

/* A norm that rmsnorm_product left for the product after it (cuda_norm.cu):
 * the GEMV of that product takes it (cuda_gemv_norm.cuh); any other op
 * first launches it as rmsnorm (cu_enter). The tensors are copies of the
 * call's views. */
struct cuda_norm_pending {
	bool set;
	struct kt_tensor out, x, res, w;  /* res.data NULL: no residual */
	float eps;
};

/* A rope_store of one decode row that asked to run inside the attention
 * after it (kt_rope_store_args.attend_next; cuda_rope.cu): that attention's
 * decode kernel takes it (cuda_attention_decode.cuh); any other op first
 * launches it as rope_store (cu_enter). args points into the copies here. */
struct cuda_rope_pending {
	bool set;
	struct kt_rope_store_args args;
	struct kt_tensor qkv, q, k, v, inv_freq, q_norm, k_norm, kcache, vcache;
	struct kt_batch batch;       /* n_single 1, no segments */
	bool after_bulk;             /* the product before it ran on the bulk GEMV */
};

struct cuda_backend {
	struct kt_backend base;     /* first member: the engine's handle */
	int device;                 /* CUDA device index */
	int max_tokens;             /* matmul workspace rows (bigger T runs in chunks) */
	int max_context;            /* attention: positions per sequence */
	int max_head_dim;           /* attention and rope */
	bool pdl;                   /* cu_launch may overlap kernels (cuda_pdl.cuh): kt_config's
				     * cuda_pdl on a device of compute capability 9 or later */
	cudaStream_t stream;        /* every op and copy of this backend */
	cublasHandle_t blas;        /* bound to stream, workspace blas_ws */
	void *blas_ws;              /* device, CUDA_BLAS_WS_BYTES, so cuBLAS allocates nothing */
	pthread_mutex_t lock;       /* guards owned, xbf16 and stage (loaders may be threads) */
	void **owned;               /* [n_owned] device pointers this backend allocated */
	size_t n_owned, cap_owned;
	__nv_bfloat16 *xbf16;       /* device [max_tokens, xbf16_cols]: matmul x rounded to bf16 */
	int64_t xbf16_cols;         /* largest K of a bf16 weight so far */
	void *stage;                /* device, CUDA_STAGE_BYTES: weight() conversion staging */
	unsigned *fault;            /* device: enum cuda_fault bits since the last sync point */
	unsigned *fault_host;       /* pinned, mapped: where a sync point reads them */
	unsigned *fault_map;        /* fault_host as kernels write it (sampling's) */
	struct kt_sample_row *rows_host, *rows_dev; /* [sample_cap] pinned, device */
	int32_t *ids_host;          /* [sample_cap] pinned, mapped: sampled ids */
	int32_t *ids_map;           /* ids_host as sampling's kernels write it */
	int sample_cap;             /* rows per sampling launch (more run in chunks) */
	struct kt_sample_row *draw_host; /* [sample_cap] pinned, mapped: a draw's staged requests */
	struct kt_sample_row *draw_map;  /* draw_host as the draw's kernels read it */
	int draw_n, draw_kind;      /* rows staged (0 before any) and their kind (cuda_sample.cu) */
	int64_t draw_v;             /* columns of the logits they were staged for */
	uint64_t *sample_part;      /* device [sample_cap, CUDA_SAMPLE_MAX_CHUNKS]: a row's chunk maxima */
	unsigned *sample_count;     /* device [sample_cap]: a row's chunks done, 0 at rest */
	uint64_t *sample_cand;      /* device [CUDA_SAMPLE_TOPK_ROWS, CUDA_SAMPLE_TOPK_CAND]:
				     * a row's candidates, rank-ordered keys */
	struct cuda_norm_pending norm_pending; /* set by rmsnorm_product, until the next op */
	struct cuda_rope_pending rope_pending; /* set by rope_store, until the next op */
	bool after_product;         /* the last op was a product (matmul, matmul_n,
				     * matmul_swiglu), whose kernels write only its
				     * outs: a rope_store may be left pending then */
	bool product_on_bulk;       /* that product ran on the bulk GEMV */
	unsigned *norm_count;       /* device [1]: a normed GEMV's blocks past their norm, 0 at rest */
	int gemv_bulk_blocks;       /* the bulk GEMV's grid (cuda_gemv_bulk.cuh): blocks the
				     * device holds at once; 0 where it has no bulk copies */
	struct cuda_graph_entry graphs[CUDA_MAX_GRAPHS]; /* [n_graphs] used, by kt_graph() key */
	int n_graphs, next_evict;
	/* Attention (cuda_attention.cu), made by cuda_attention_open: the
	 * split-K workspace of the decode kernel, sized from kt_config, and how
	 * many decode CTAs the device holds at once (for the split count). */
	bool att_ready;             /* open succeeded: the tensor-core kernels may run */
	float *att_part_o;          /* device [att_ws_rows * att_heads * min(max_head_dim, 128)] */
	float2 *att_part_ml;        /* device [att_ws_rows * att_heads]: split (max, sum) */
	int *att_count;             /* device [att_ws_rows * att_heads]: splits done, 0 at rest */
	int att_ws_rows;            /* rows × splits the workspace holds per head */
	int att_heads;              /* heads the workspace holds per row-split */
	int att_slots64, att_slots128; /* resident decode CTAs for head_dim 64, 128 */
	int att_sms;                /* multiprocessors: what a wide prefill grid must fill */
	bool att_wgmma;             /* head_dim-128 prefill on wgmma: sm_90a code, a 9.0 GPU */
	bool att_clusters;          /* decode splits may merge through clusters (Hopper on) */
	/* Copies of the swap tier (cuda_transfer.cu): their own stream, which
	 * waits for what the main stream had enqueued when each copy started,
	 * and one event per copy in a ring; copy t is event t % CUDA_COPY_RING. */
	cudaStream_t copy_stream;
	cudaEvent_t copy_mark;      /* recorded on stream before each copy */
	cudaEvent_t copy_events[CUDA_COPY_RING];
	uint64_t copies_issued;     /* tickets handed out, 1.. */
	uint64_t copies_done;       /* every ticket up to this one has finished */
	/* MoE (cuda_moe_*.cu), made by cuda_moe_open: moe_route's per-chunk
	 * expert counts, then each chunk's first sorted position per expert. */
	int32_t *moe_hist;          /* device [moe_chunks, CUDA_MOE_MAX_E] */
	int moe_chunks;             /* max_tokens * KT_MOE_MAX_K / CUDA_MOE_CHUNK, rounded up */
	/* Expert parallelism (cuda_comm.cu): the NCCL communicator of
	 * comm_open, and how long a sync point waits for a step whose
	 * collectives a peer never joins. The device counts the collectives
	 * (graph replays too) in comm_clock; each sync point reads them into
	 * base.comm. */
	struct ncclComm *nccl;      /* owned; NULL before comm_open and once aborted */
	int nccl_timeout_ms;        /* spec.timeout_ms of the last comm_open */
	struct cuda_comm_clock *comm_clock;      /* device, made by the first comm_open */
	struct cuda_comm_clock *comm_clock_host; /* pinned: where a sync point reads it */
};

/* The collectives as the device saw them, summed since the first comm_open:
 * kernels before and after each allreduce read the global timer. */
struct cuda_comm_clock {
	unsigned long long start;   /* the running allreduce's start, ns */
	unsigned long long ns;      /* device time inside allreduces (waiting for peers too) */
	unsigned long long calls, bytes;
};

#define CUDA_BLAS_WS_BYTES ((size_t)32 << 20)
#define CUDA_STAGE_BYTES ((size_t)32 << 20)

static inline struct cuda_backend *cu_of(struct kt_backend *be)
{
	return (struct cuda_backend *)be;
}

/* t has data, dtype dt and a non-negative shape. */
static inline bool cu_valid(const struct kt_tensor *t, enum kt_dtype dt)
{
	return t && t->data && t->dtype == dt && t->rows >= 0 && t->cols >= 0;
}

/* t has data, dtype dt and exactly rows × cols. */
static inline bool cu_shape(const struct kt_tensor *t, enum kt_dtype dt, int64_t rows,
			    int64_t cols)
{
	return cu_valid(t, dt) && t->rows == rows && t->cols == cols;
}

/* t is f32 or bf16 (a weight as kt_weight stores it, or an f32 tensor). */
static inline bool cu_float(const struct kt_tensor *t)
{
	return t && t->data && (t->dtype == KT_F32 || t->dtype == KT_BF16) && t->rows >= 0 &&
	       t->cols >= 0;
}

/* The byte ranges of a and b intersect. */
static inline bool cu_overlap(const struct kt_tensor *a, const struct kt_tensor *b)
{
	return kt_overlap(a, b);
}

/* a and b are the same memory or do not touch. */
static inline bool cu_same_or_apart(const struct kt_tensor *a, const struct kt_tensor *b)
{
	return a->data == b->data || !cu_overlap(a, b);
}

/* Launch the norm rmsnorm_product left pending, as rmsnorm (cuda_norm.cu). */
cudaError_t cuda_norm_flush(struct cuda_backend *cu);

/* Launch the rope_store left pending for an attention (cuda_rope.cu). */
cudaError_t cuda_rope_flush(struct cuda_backend *cu);

/* Make the backend's device current on the calling thread (the engine may
 * run ops on another thread than the one that opened the backend). */
static inline cudaError_t cu_device(const struct cuda_backend *cu)
{
	return cudaSetDevice(cu->device);
}

/* What the products that may take a pending norm do first: the device
 * current and a pending rope_store launched, the norm kept. */
static inline cudaError_t cu_keep_norm(struct cuda_backend *cu)
{
	cudaError_t e = cu_device(cu);

	cu->after_product = false;
	cu->product_on_bulk = false;
	if (e == cudaSuccess && cu->rope_pending.set)
		e = cuda_rope_flush(cu);
	return e;
}

/* What the attention, which may take a pending rope_store, does first: the
 * device current and a pending norm launched, the rope_store kept. */
static inline cudaError_t cu_keep_rope(struct cuda_backend *cu)
{
	cudaError_t e = cu_device(cu);

	cu->after_product = false;
	if (e == cudaSuccess && cu->norm_pending.set)
		e = cuda_norm_flush(cu);
	return e;
}

/* What every op does first: the device current, then a pending rope_store
 * or norm launched (what it writes is written before this op runs). At
 * most one is pending: each is left by an op that called this first. */
static inline cudaError_t cu_enter(struct cuda_backend *cu)
{
	cudaError_t e = cu_keep_norm(cu);

	if (e == cudaSuccess && cu->norm_pending.set)
		e = cuda_norm_flush(cu);
	return e;
}

/* An element of an f32 or bf16 tensor as f32. */
__device__ __forceinline__ float widen(float v)
{
	return v;
}

__device__ __forceinline__ float widen(__nv_bfloat16 v)
{
	return __bfloat162float(v);
}

/* v stored into an f32 or bf16 tensor (bf16: nearest even, as the products
 * round x): the out of an op that may write either. */
__device__ __forceinline__ void narrow_to(float *p, float v)
{
	*p = v;
}

__device__ __forceinline__ void narrow_to(__nv_bfloat16 *p, float v)
{
	*p = __float2bfloat16_rn(v);
}

/* Four consecutive values at p + 4i (16- or 8-byte aligned). */
__device__ __forceinline__ void narrow4_to(float *p, int64_t i, float4 v)
{
	reinterpret_cast<float4 *>(p)[i] = v;
}

__device__ __forceinline__ void narrow4_to(__nv_bfloat16 *p, int64_t i, float4 v)
{
	__nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
	uint2 u;

	u.x = *reinterpret_cast<uint32_t *>(&lo);
	u.y = *reinterpret_cast<uint32_t *>(&hi);
	reinterpret_cast<uint2 *>(p)[i] = u;
}

/* Blocks of CUDA_THREADS for a grid-stride loop over n elements. */
static inline unsigned cu_blocks(int64_t n)
{
	int64_t b = (n + CUDA_THREADS - 1) / CUDA_THREADS;
	return (unsigned)(b < 1 ? 1 : b > 65536 ? 65536 : b);
}

/* Wait for the stream, then report and clear device-side faults: 0, -EINVAL
 * after a fault, or the CUDA error. */
int cuda_sync_point(struct cuda_backend *cu);

/* cuda_sync_point after a kernel that copied the fault word into
 * fault_host itself (through fault_map, as the stream's last op, when
 * every op before it had finished): no copy of it first. */
int cuda_sync_published(struct cuda_backend *cu);

/* Memory (cuda_memory.cu) */
int cuda_alloc(struct kt_backend *be, enum kt_dtype dtype, int64_t rows, int64_t cols,
	       struct kt_tensor *out);
void cuda_free(struct kt_backend *be, struct kt_tensor *t);
void cuda_free_all(struct cuda_backend *cu);
int cuda_upload(struct kt_backend *be, const struct kt_tensor *dst, size_t offset,
		const void *src, size_t bytes);
int cuda_download(struct kt_backend *be, void *dst, const struct kt_tensor *src, size_t offset,
		  size_t bytes);
int cuda_weight(struct kt_backend *be, enum kt_dtype src_dtype, const void *src, int64_t rows,
		int64_t cols, bool src_outlives, struct kt_tensor *out);
int cuda_synchronize(struct kt_backend *be);
/* Make the matmul workspace hold max_tokens rows of `cols` bf16 values (never
 * shrinks); at open and from weight(), under cu->lock once the backend is out. */
int cuda_grow_xbf16(struct cuda_backend *cu, int64_t cols);

/* Ops, one file per family; contracts in kernels/backend.h. */
int cuda_embed(struct kt_backend *be, const struct kt_tensor *out, const struct kt_tensor *table,
	       const struct kt_tensor *ids);
int cuda_gather_rows(struct kt_backend *be, const struct kt_tensor *out,
		     const struct kt_tensor *x, const struct kt_tensor *idx);
int cuda_swiglu(struct kt_backend *be, const struct kt_tensor *out, const struct kt_tensor *gate,
		const struct kt_tensor *up);
int cuda_add(struct kt_backend *be, const struct kt_tensor *y, const struct kt_tensor *x);
int cuda_rmsnorm(struct kt_backend *be, const struct kt_tensor *out, const struct kt_tensor *x,
		 const struct kt_tensor *residual, const struct kt_tensor *w, float eps);
int cuda_rmsnorm_product(struct kt_backend *be, const struct kt_tensor *out,
			 const struct kt_tensor *x, const struct kt_tensor *residual,
			 const struct kt_tensor *w, float eps);
int cuda_matmul(struct kt_backend *be, const struct kt_tensor *y, const struct kt_tensor *x,
		const struct kt_tensor *w, const struct kt_tensor *bias);
int cuda_matmul_n(struct kt_backend *be, int n, const struct kt_tensor *const *ys,
		  const struct kt_tensor *x, const struct kt_tensor *const *ws,
		  const struct kt_tensor *const *biases);
int cuda_rope(struct kt_backend *be, const struct kt_tensor *x, const struct kt_tensor *pos,
	      const struct kt_tensor *inv_freq, int n_heads, int head_dim,
	      const struct kt_tensor *norm_w, float eps);
int cuda_kv_store(struct kt_backend *be, const struct kt_tensor *kcache,
		  const struct kt_tensor *vcache, const struct kt_tensor *k,
		  const struct kt_tensor *v, const struct kt_batch *b);
int cuda_rope_store(struct kt_backend *be, const struct kt_rope_store_args *a,
		    const struct kt_batch *b);
int cuda_matmul_swiglu(struct kt_backend *be, const struct kt_tensor *act,
		       const struct kt_tensor *gu, const struct kt_tensor *x,
		       const struct kt_tensor *w);
/* Whether the decode attention can take rope_store a over b (checked by
 * rope_store_takes already) inside its blocks: one decode row, a bf16
 * cache, head_dim 64 or 128, a GQA group of at most one CTA's heads. */
bool cuda_decode_takes_rope(const struct cuda_backend *cu, const struct kt_rope_store_args *a,
			    const struct kt_batch *b);
int cuda_attention(struct kt_backend *be, const struct kt_tensor *out, const struct kt_tensor *q,
		   const struct kt_tensor *kcache, const struct kt_tensor *vcache,
		   const struct kt_batch *b, int n_heads, int n_kv_heads, int head_dim,
		   float scale);
int cuda_attention_part(struct kt_backend *be, const struct kt_att_state *st,
			const struct kt_tensor *q, const struct kt_tensor *kcache,
			const struct kt_tensor *vcache, const struct kt_batch *b,
			const struct kt_tensor *from, int n_heads, int n_kv_heads, int head_dim,
			float scale, bool first);
int cuda_attention_staged(struct kt_backend *be, const struct kt_att_state *st,
			  const struct kt_tensor *q, const struct kt_tensor *ks,
			  const struct kt_tensor *vs, const struct kt_tensor *span, int block_size,
			  int n_heads, int n_kv_heads, int head_dim, float scale, bool first);
int cuda_attention_finish(struct kt_backend *be, const struct kt_tensor *out,
			  const struct kt_att_state *st, int n_heads, int head_dim);
int cuda_kv_stage(struct kt_backend *be, const struct kt_tensor *dst,
		  const struct kt_tensor *pool, size_t pool_block_bytes, const void *host,
		  size_t host_slot_bytes, int64_t host_slots, const struct kt_tensor *src,
		  const int32_t *src_host, size_t off, size_t bytes, uint64_t *ticket);
int cuda_copy_wait(struct kt_backend *be, uint64_t ticket);
/* The GEMV's state (cuda_gemv.cu): call cuda_gemv_open at open, after the
 * stream exists; it sets gemv_bulk_blocks and lets the bulk GEMV's kernels
 * have their shared memory. */
int cuda_gemv_open(struct cuda_backend *cu);

/* Attention state of the backend: call cuda_attention_open at open, after
 * the stream exists (0 or a negative errno), and cuda_attention_close at
 * close (safe after a failed or missing open). */
int cuda_attention_open(struct cuda_backend *cu, const struct kt_config *c);
void cuda_attention_close(struct cuda_backend *cu);
int cuda_sample(struct kt_backend *be, const struct kt_tensor *logits,
		const struct kt_sample_row *rows, int n, int32_t *ids);
int cuda_draw_rows(struct kt_backend *be, const struct kt_sample_row *rows, int n, int64_t V);
int cuda_draw(struct kt_backend *be, const struct kt_tensor *logits);
int cuda_drawn(struct kt_backend *be, int32_t *ids, int n);

/* Mixture of experts (cuda_moe_route.cu, cuda_moe_matmul.cu,
 * cuda_moe_combine.cu). cuda_moe_open, at open after the stream exists,
 * makes moe_route's workspace from kt_config and raises the grouped GEMM's
 * shared-memory limit; cuda_moe_close frees it (safe after a failed or
 * missing open). */
int cuda_moe_open(struct cuda_backend *cu, const struct kt_config *c);
void cuda_moe_close(struct cuda_backend *cu);
/* The grouped GEMM's shared-memory limit (cuda_moe_matmul.cu), for cuda_moe_open. */
cudaError_t cuda_moe_gemm_prepare(void);
int cuda_moe_route(struct kt_backend *be, const struct kt_tensor *ids, const struct kt_tensor *w,
		   const struct kt_tensor *order, const struct kt_tensor *slot,
		   const struct kt_tensor *offsets, const struct kt_tensor *logits, bool norm);
int cuda_moe_matmul(struct kt_backend *be, const struct kt_tensor *y, const struct kt_tensor *x,
		    const struct kt_tensor *w, const struct kt_tensor *order,
		    const struct kt_tensor *offsets, int k, int e0);
int cuda_moe_combine(struct kt_backend *be, const struct kt_tensor *out,
		     const struct kt_tensor *y, const struct kt_tensor *w,
		     const struct kt_tensor *slot);

/* Gated DeltaNet (cuda_gdn_conv.cu, cuda_delta_rule.cu; rmsnorm_gated in
 * cuda_norm.cu, sigmoid_mul in cuda_elementwise.cu). */
int cuda_conv1d(struct kt_backend *be, const struct kt_tensor *out, const struct kt_tensor *x,
		const struct kt_tensor *w, const struct kt_tensor *state,
		const struct kt_tensor *slot, const struct kt_batch *b);
int cuda_delta_rule(struct kt_backend *be, const struct kt_tensor *out,
		    const struct kt_tensor *qkv, const struct kt_tensor *ba,
		    const struct kt_tensor *a_log, const struct kt_tensor *dt_bias,
		    const struct kt_tensor *state, int64_t off, const struct kt_tensor *slot,
		    const struct kt_batch *b, int n_k_heads, int n_v_heads, int k_dim, int v_dim);
int cuda_rmsnorm_gated(struct kt_backend *be, const struct kt_tensor *out,
		       const struct kt_tensor *x, const struct kt_tensor *z,
		       const struct kt_tensor *w, float eps);
int cuda_sigmoid_mul(struct kt_backend *be, const struct kt_tensor *out,
		     const struct kt_tensor *x, const struct kt_tensor *g);

/* Expert parallelism's communicator (cuda_comm.cu); cuda_comm_close
 * destroys it at close (safe when none was opened). */
int cuda_comm_open(struct kt_backend *be, const struct kt_comm_spec *spec, char *err,
		   size_t errlen);
int cuda_allreduce(struct kt_backend *be, const struct kt_tensor *x);
int cuda_comm_id(struct kt_backend *be, unsigned char *id);
void cuda_comm_close(struct cuda_backend *cu);
/* kt_backend's comm_close: end the communicator, keep the counters. */
void cuda_comm_end(struct kt_backend *be);
/* A sync point with a communicator open: wait for the stream, at most
 * nccl_timeout_ms, aborting the communicator when a peer is gone (0,
 * -ETIMEDOUT or -EPIPE; the communicator is broken after either), then
 * read the device's collective counts into base.comm. */
int cuda_comm_wait(struct cuda_backend *cu);

/* Graphs (cuda_graph.cu): kt_graph(), and freeing them all at close. */
int cuda_graph(struct kt_backend *be, uint64_t key, int (*record)(void *ctx), void *ctx);
void cuda_graphs_free(struct cuda_backend *cu);
int cuda_memory(struct kt_backend *be, uint64_t *free_bytes, uint64_t *total_bytes);
int cuda_copy(struct kt_backend *be, const struct kt_tensor *dst, const struct kt_tensor *src);

/* Host memory and the swap tier's copies (cuda_transfer.cu); the stream
 * and events are made at open and destroyed at close. */
cudaError_t cuda_transfer_open(struct cuda_backend *cu);
void cuda_transfer_close(struct cuda_backend *cu);
int cuda_host_alloc(struct kt_backend *be, size_t bytes, void **out);
void cuda_host_free(struct kt_backend *be, void *p);
int cuda_copy_async(struct kt_backend *be, void *host, const struct kt_tensor *t, size_t off,
		    size_t bytes, bool to_host, uint64_t *ticket);
int cuda_copy_done(struct kt_backend *be, uint64_t ticket);

/* cudaSuccess when the kernels of this build run on the current device
 * (cuda_memory.cu). */
cudaError_t cuda_probe_kernels(void);

#endif
