/* The backend interface: device memory and the ops of a transformer forward pass.
 *
 * The engine reaches a device only through this header. A backend is a table
 * of function pointers (`struct kt_ops`) behind `struct kt_backend`; the cpu
 * implementation (kernels/cpu/) is the reference and the cuda one
 * (kernels/cuda/) the production path. Callers use the kt_* inline wrappers.
 *
 * Conventions
 *  - A tensor is a contiguous row-major matrix `rows × cols` in backend memory.
 *    Views of consecutive rows share the allocation (kt_rows()); reshaping is
 *    writing other rows/cols over the same data (kt_reshape()).
 *  - Activations are f32. Weights are stored in the dtype the backend chooses
 *    in kt_weight() (cpu: f32, or bf16 matrices with cpu_precision bf16;
 *    cuda: bf16). Token ids and indices are i32.
 *  - Ops are ordered: each runs after the previous op of the same backend has
 *    finished (cpu: synchronously; cuda: on one stream). kt_download() and
 *    kt_sample() return only when their result is on the host.
 *  - Ops return 0 or a negative errno. An op never allocates: workspaces are
 *    sized at open from `struct kt_config` limits.
 *
 * Paged KV (DESIGN §4.2): the K and V caches of one layer are views of
 * `n_kv_heads * head_dim` cols in which block j is the `block_size` rows
 * starting at row `j * kv_block_rows` (kt_batch; 0 means block_size: blocks
 * back to back). A stride above block_size lets the caches of every layer
 * share one allocation block-major, so that a block is one contiguous region
 * that moves with one copy (engine/kv/kv.h): a layer's K (V) view then starts
 * at that layer's K (V) rows of block 0 and runs to the end of the
 * allocation, and K and V views may share memory as long as no block's K
 * rows meet any block's V rows. Token t of a step belongs to sequence slot
 * `seq[t]` at position `pos[t]`; its cache row is
 * `block_tables[seq[t]][pos[t] / block_size] * kv_block_rows + pos[t] % block_size`.
 * A block id is valid when its rows lie within both views (kt_kv_blocks());
 * the ops check every block id they use against that. Attention reads keys
 * only through the block table, never by position alone.
 */
#ifndef ATLAS_KERNELS_BACKEND_H
#define ATLAS_KERNELS_BACKEND_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum kt_dtype { KT_F32, KT_F16, KT_BF16, KT_I32 };

size_t kt_dtype_size(enum kt_dtype t);
const char *kt_dtype_name(enum kt_dtype t);

struct kt_tensor {
	void *data;          /* backend memory: host pointer on cpu, device pointer on cuda */
	enum kt_dtype dtype;
	int64_t rows, cols;  /* row-major, contiguous */
};

static inline size_t kt_nbytes(const struct kt_tensor *t)
{
	return (size_t)t->rows * (size_t)t->cols * kt_dtype_size(t->dtype);
}

/* The byte ranges of a and b intersect (any backend: one address space of
 * its memory). */
static inline bool kt_overlap(const struct kt_tensor *a, const struct kt_tensor *b)
{
	const char *a0 = (const char *)a->data, *b0 = (const char *)b->data;
	return a0 < b0 + kt_nbytes(b) && b0 < a0 + kt_nbytes(a);
}

/* Rows [r0, r0 + n) of t, sharing its memory. */
static inline struct kt_tensor kt_rows(struct kt_tensor t, int64_t r0, int64_t n)
{
	t.data = (char *)t.data + (size_t)r0 * (size_t)t.cols * kt_dtype_size(t.dtype);
	t.rows = n;
	return t;
}

/* The same memory seen as rows × cols (rows * cols must not exceed the original). */
static inline struct kt_tensor kt_reshape(struct kt_tensor t, int64_t rows, int64_t cols)
{
	t.rows = rows;
	t.cols = cols;
	return t;
}

/* Rows [row, row + n_rows) of a step: positions pos0, pos0 + 1, ... of the
 * sequence in slot seq (a prompt chunk). */
struct kt_segment {
	int32_t row, n_rows, pos0, seq;
};

/* Step metadata for kv_store and attention. The tensors live in backend
 * memory and are filled by the engine with kt_upload() before the step.
 *
 * The step's shape is also given on the host so that a backend can pick a
 * kernel per part without reading device memory: rows [0, n_single) are
 * decode rows, each attending on its own by its position (a sequence may
 * have several, a verify's rows at consecutive positions, whose keys all
 * are stored before any row attends), and the segments cover the rows
 * n_single..n_tokens-1 exactly, in order. A step replayed from a CUDA
 * graph (kt_graph) has only decode rows, and max_kv_len is then the bound of
 * the graph's bucket: kernels must be correct for any true length below it. */
struct kt_batch {
	int n_tokens;                  /* T: tokens in this step */
	int block_size;                /* KV rows per block */
	int kv_block_rows;             /* rows from a block's first cache row to the next
					* block's, within one layer's K (or V) view: at least
					* block_size; 0 means block_size (see the top of this file) */
	int max_kv_len;                /* an upper bound on pos + 1 over the tokens */
	struct kt_tensor pos;          /* [T, 1] i32: position of each token in its sequence */
	struct kt_tensor seq;          /* [T, 1] i32: sequence slot of each token (row of block_tables) */
	struct kt_tensor block_tables; /* [max_seqs, max_blocks_per_seq] i32: device block ids per slot */
	int n_single;                  /* decode rows, first in the step */
	int n_segments;
	const struct kt_segment *segments; /* [n_segments] host memory, owned by the caller */
};

/* The stride of b's cache blocks in rows: kv_block_rows, or block_size for 0. */
static inline int64_t kt_kv_block_rows(const struct kt_batch *b)
{
	return b->kv_block_rows ? b->kv_block_rows : b->block_size;
}

/* The blocks a cache view of `rows` rows holds whole at b's stride: block
 * ids below this name rows inside the view. */
static inline int64_t kt_kv_blocks(const struct kt_batch *b, int64_t rows)
{
	const int64_t stride = kt_kv_block_rows(b);

	if (b->block_size <= 0 || stride < b->block_size || rows < b->block_size)
		return 0;
	return (rows - b->block_size) / stride + 1;
}

/* No block's rows of cache view x meet any block's rows of view y (same
 * cols and dtype) at b's stride: the views do not overlap at all, or they
 * interleave, y's blocks sitting in the gaps between x's. */
static inline bool kt_kv_apart(const struct kt_batch *b, const struct kt_tensor *x,
			       const struct kt_tensor *y)
{
	const char *x0 = (const char *)x->data, *y0 = (const char *)y->data;
	const int64_t row = x->cols * (int64_t)kt_dtype_size(x->dtype);
	const int64_t span = kt_kv_block_rows(b) * row, blk = (int64_t)b->block_size * row;
	int64_t gap;

	if (!(x0 < y0 + kt_nbytes(y) && y0 < x0 + kt_nbytes(x)))
		return true;
	if (blk <= 0 || span < 2 * blk)
		return false;
	/* Overlapping views: y's blocks start gap bytes past one of x's (mod
	 * the stride) and must end before the next one starts. */
	gap = (int64_t)(y0 - x0) % span;
	gap += gap < 0 ? span : 0;
	return gap >= blk && gap <= span - blk;
}

/* Kinds of a draw (draw_rows): at most this many, 0 to KT_DRAW_KINDS - 1. */
#define KT_DRAW_KINDS 4

/* Per-row sampling request. temperature 0 means greedy (argmax, lowest id on ties). */
struct kt_sample_row {
	float temperature;
	float top_p;     /* 1 disables */
	int32_t top_k;   /* 0 disables */
	float u;         /* uniform random number in [0, 1) chosen by the caller */
};

/* The online-softmax state of attention over the parts of a context folded
 * so far, per token and head: the running max m of the scores, the sum l of
 * exp(score - m), and acc = sum of exp(score - m) * v. */
struct kt_att_state {
	struct kt_tensor acc;    /* [T, n_heads * D] f32 */
	struct kt_tensor ml;     /* [T, n_heads * 2] f32: m, l of each head */
};

struct kt_device_info {
	char name[128];          /* "cpu (2 threads, OpenBLAS)", "NVIDIA H100 80GB HBM3" */
	char backend[16];        /* "cpu" or "cuda" */
	char pci_bus_id[16];     /* cuda: the device's PCI address, "0000:3b:00.0", by which
				  * tools find the same GPU through NVML (atlas bench's
				  * energy); "" on cpu */
	uint64_t memory_total;   /* bytes of device memory (cpu: physical RAM) */
	uint64_t memory_free;    /* at open */
	enum kt_dtype kv_dtype;  /* dtype the backend wants for the KV cache */
	bool graphs;             /* kt_graph records and replays (else it only runs record) */
	bool queued;             /* ops are queued on a device and run while the caller goes
				  * on until a sync point (cuda); else each runs in its call */
	bool att_p_bf16;         /* attention on bf16 caches rounds the softmax weights to
				  * bf16 for P·V (cpu with AMX, cuda's tensor cores) */
	bool matmul_x_bf16;      /* matmul rounds x to bf16 before every product with bf16
				  * weights, on every path (cuda): a model may hand it x
				  * already in bf16 (rmsnorm, swiglu and attention write
				  * it) and gets the same bits for half the activation
				  * traffic */
};

struct kt_config {
	const char *backend;  /* "auto", "cpu" or "cuda" */
	int threads;          /* cpu: worker threads, 0 = all online cores */
	int device;           /* cuda: device index */
	int max_tokens;       /* most tokens in one step */
	int max_seqs;         /* most sequences in one step */
	int max_context;      /* most positions in one sequence */
	int max_heads;        /* most attention heads of the model */
	int max_head_dim;     /* largest head_dim of the model */
	const char *cpu_precision; /* cpu: "f32" (NULL too): weights widened to f32, exact
				    * products; "bf16": bf16 weights stay bf16 and matmul
				    * may round x to bf16 (kernels/cpu/cpu_matmul_amx.c) */
	const char *cpu_isa;  /* cpu: instruction set of the bf16-weight kernels, "auto"
			       * (NULL too: the best this CPU has), "amx", "avx512bf16",
			       * "avx2" or "generic"; one the CPU lacks fails the open */
	bool cuda_pdl;        /* cuda: a kernel may be placed while the one before it
			       * ends (programmatic dependent launch, compute
			       * capability 9 and later; kernels/cuda/cuda_pdl.cuh) */
};

/* How a rank of expert parallelism reaches the others (comm_open): the
 * engine's bootstrap (engine/ep/) connects them and hands over what the
 * communicator needs. */
#define KT_COMM_MAX_RANKS 16
#define KT_COMM_ID_BYTES 128

enum kt_comm_kind {
	KT_COMM_SOCKET,  /* stream sockets, rank 0 in the middle (cpu) */
	KT_COMM_NCCL,    /* NCCL on the backend's stream (cuda) */
};

struct kt_comm_spec {
	enum kt_comm_kind kind;
	int rank, n_ranks;            /* 0 is the head; n_ranks <= KT_COMM_MAX_RANKS */
	int fds[KT_COMM_MAX_RANKS];   /* socket: connected stream sockets, which the
				       * communicator then owns: rank 0 holds fds[r] to
				       * each rank r > 0, rank r > 0 holds fds[0] */
	unsigned char id[KT_COMM_ID_BYTES]; /* nccl: rank 0's ncclUniqueId, on every rank */
	int timeout_ms;               /* socket: a peer silent this long fails a collective */
};

/* What the collectives have cost so far (kt_backend.comm). */
struct kt_comm_stats {
	int rank, n_ranks;            /* 0, 0 before comm_open */
	uint64_t calls;               /* allreduce calls */
	uint64_t bytes;               /* bytes of x reduced, summed over calls */
	uint64_t ns;                  /* time inside them (cuda: host time to enqueue) */
	int broken;                   /* 0, or the errno that broke the communicator */
	int broken_rank;              /* rank 0 of a socket communicator: the peer whose
				       * connection failed (-1: not known) */
};

struct kt_backend;

/* What rope_store takes: one layer's q, k and v of a step, and where its k
 * and v go. The tensors are the engine's; the struct is only the call's.
 * With qkv (one product of the three weights stacked), each row of q, k
 * and v is first taken from it; q then ends as without qkv, and k and v
 * are scratch whose contents the call leaves unspecified. */
struct kt_rope_store_args {
	const struct kt_tensor *qkv;      /* NULL, or [T, (n_heads + 2 n_kv_heads) * D] f32:
					   * each row q's heads, then k's, then v's */
	const struct kt_tensor *q;        /* [T, n_heads * D] f32, roped in place */
	const struct kt_tensor *k;        /* [T, n_kv_heads * D] f32, roped in place, stored */
	const struct kt_tensor *v;        /* [T, n_kv_heads * D] f32, stored */
	const struct kt_tensor *inv_freq; /* [1, R/2] f32, as rope takes it */
	const struct kt_tensor *q_norm;   /* NULL or [1, D]: q's per-head RMSNorm (rope's norm_w) */
	const struct kt_tensor *k_norm;   /* NULL or [1, D]: k's */
	const struct kt_tensor *kcache;   /* the layer's caches, as kv_store takes them */
	const struct kt_tensor *vcache;
	int n_heads, n_kv_heads, head_dim;
	float eps;                        /* of both norms */
	bool attend_next;                 /* the op after this one reads q as its q in an
					   * attention over these caches, and nothing reads
					   * q or k after that: q too may be left
					   * unspecified, and a backend may run this op
					   * inside that attention (cuda: one decode row) */
};

struct kt_ops {
	void (*close)(struct kt_backend *be);

	int (*alloc)(struct kt_backend *be, enum kt_dtype dtype, int64_t rows, int64_t cols,
		     struct kt_tensor *out);
	void (*free)(struct kt_backend *be, struct kt_tensor *t);
	int (*upload)(struct kt_backend *be, const struct kt_tensor *dst, size_t offset,
		      const void *src, size_t bytes);
	int (*download)(struct kt_backend *be, void *dst, const struct kt_tensor *src, size_t offset,
			size_t bytes);
	/* Store a weight given in src_dtype (f32, f16 or bf16) as the backend likes it.
	 * src_outlives: src stays mapped while the backend runs, so it may be aliased. */
	int (*weight)(struct kt_backend *be, enum kt_dtype src_dtype, const void *src, int64_t rows,
		      int64_t cols, bool src_outlives, struct kt_tensor *out);
	int (*synchronize)(struct kt_backend *be);

	/* out[t, :] = table[ids[t], :]   out [T, H] f32, table [V, H], ids [T, 1] i32 */
	int (*embed)(struct kt_backend *be, const struct kt_tensor *out, const struct kt_tensor *table,
		     const struct kt_tensor *ids);
	/* If residual: x += residual. Then out = x / rms(x) * w, per row.
	 * x, residual [R, D] f32; w [1, D]; out [R, D] f32 (may be x) or bf16
	 * (apart from x and residual; each value rounded to nearest even as it
	 * is stored: the x of the next product, see matmul_x_bf16). */
	int (*rmsnorm)(struct kt_backend *be, const struct kt_tensor *out, const struct kt_tensor *x,
		       const struct kt_tensor *residual, const struct kt_tensor *w, float eps);
	/* y = x · wᵀ (+ bias)   y [T, N] f32, x [T, K] f32 or bf16 (bf16: with a
	 * w from kt_weight), w [N, K], bias NULL or [1, N]. A backend with
	 * matmul_x_bf16 rounds an f32 x to bf16 first, so that x rounded to bf16
	 * beforehand gives the same y. */
	int (*matmul)(struct kt_backend *be, const struct kt_tensor *y, const struct kt_tensor *x,
		      const struct kt_tensor *w, const struct kt_tensor *bias);
	/* Rotary embedding in place, rotate-half (GPT-NeoX / Hugging Face) pairing
	 * over the first R = 2 * inv_freq.cols dims of each head (R <= D, even;
	 * R < D is partial rotary, the other D - R dims pass unchanged):
	 * (x[i], x[i + R/2]) rotated by pos[t] * inv_freq[i], angle in f32.
	 * If norm_w: each head's D values are first RMS-normalised as rmsnorm
	 * does (eps) and scaled by norm_w [1, D] (Qwen3's q_norm and k_norm).
	 * x [T, n_heads * D] f32, pos [T, 1] i32, inv_freq [1, R/2] f32. */
	int (*rope)(struct kt_backend *be, const struct kt_tensor *x, const struct kt_tensor *pos,
		    const struct kt_tensor *inv_freq, int n_heads, int head_dim,
		    const struct kt_tensor *norm_w, float eps);
	/* Write each token's k and v rows into the paged caches (see the top of this file).
	 * kcache, vcache: views of n_kv * D cols, block j at row j * kv_block_rows;
	 * k, v [T, n_kv * D] f32. */
	int (*kv_store)(struct kt_backend *be, const struct kt_tensor *kcache,
			const struct kt_tensor *vcache, const struct kt_tensor *k,
			const struct kt_tensor *v, const struct kt_batch *b);
	/* Causal attention of each token over positions 0..pos[t] of its sequence,
	 * read through the block table; GQA: head h uses kv head h / (n_heads / n_kv_heads).
	 * q [T, n_heads * D] f32; out the same shape, f32 (may be q) or bf16
	 * (apart from q; each value rounded to nearest even as it is stored:
	 * the x of the next product, see matmul_x_bf16). */
	int (*attention)(struct kt_backend *be, const struct kt_tensor *out,
			 const struct kt_tensor *q, const struct kt_tensor *kcache,
			 const struct kt_tensor *vcache, const struct kt_batch *b, int n_heads,
			 int n_kv_heads, int head_dim, float scale);
	/* Attention over part of each token's context, for a context whose older
	 * blocks are not on the device (DESIGN §8): the parts are folded one
	 * after another, in position order, into an online-softmax state
	 * (kt_att_state), which attention_finish turns into the output. A
	 * backend computes attention() itself as one part and the finish, so
	 * that splitting a context into parts at block boundaries changes
	 * nothing (cpu: bitwise).
	 *
	 * attention_part: token t folds positions from[seq[t]] .. pos[t] of its
	 * sequence, read through b's block table as attention does; from
	 * [block_tables rows, 1] i32, multiples of block_size. first: st starts
	 * empty, else it holds the parts before. */
	int (*attention_part)(struct kt_backend *be, const struct kt_att_state *st,
			      const struct kt_tensor *q, const struct kt_tensor *kcache,
			      const struct kt_tensor *vcache, const struct kt_batch *b,
			      const struct kt_tensor *from, int n_heads, int n_kv_heads, int head_dim,
			      float scale, bool first);
	/* attention_staged: token t folds rows span[t] = (row0, n) of ks and vs
	 * [rows, n_kv * D] (a staging buffer that kv_stage filled: consecutive
	 * positions, all before the token's own), block_size rows at a time from
	 * row0; n 0 leaves its state as it was. span [T, 2] i32. */
	int (*attention_staged)(struct kt_backend *be, const struct kt_att_state *st,
				const struct kt_tensor *q, const struct kt_tensor *ks,
				const struct kt_tensor *vs, const struct kt_tensor *span,
				int block_size, int n_heads, int n_kv_heads, int head_dim, float scale,
				bool first);
	/* out = acc / l per head: the attention output of the folded parts.
	 * out [T, n_heads * D] f32 (may be st's acc) or bf16 (apart from it),
	 * stored as attention stores it. */
	int (*attention_finish)(struct kt_backend *be, const struct kt_tensor *out,
				const struct kt_att_state *st, int n_heads, int head_dim);
	/* Gather one layer's K (or V) rows of KV blocks into a staging buffer:
	 * piece i is the `bytes` bytes at offset off of block src[i], written at
	 * dst + i * bytes. src [n, 1] i32: an id >= 0 is a block of pool
	 * (pool_block_bytes apart), an id < 0 the slot -1 - id of host memory
	 * from host_alloc (host_slot_bytes apart, host_slots of them); host
	 * memory is read where it is (cuda: over the bus, by the device).
	 * src_host, when given, is src's ids on the host: a backend may use it
	 * to copy runs of consecutive blocks with its copy engines (cuda, up to
	 * KT_STAGE_MAX_RUNS runs) instead of reading them with kernels.
	 * ticket NULL: ordered like an op. Else it runs beside the ops enqueued
	 * after it, like copy_async (cuda: on the copy stream, after the ops
	 * enqueued before it), and *ticket names it for copy_done and
	 * copy_wait (0: it ran ordered like an op after all, too many copies
	 * being in flight): this is how a step gathers the next layer's blocks
	 * while the device computes. */
	int (*kv_stage)(struct kt_backend *be, const struct kt_tensor *dst,
			const struct kt_tensor *pool, size_t pool_block_bytes, const void *host,
			size_t host_slot_bytes, int64_t host_slots, const struct kt_tensor *src,
			const int32_t *src_host, size_t off, size_t bytes, uint64_t *ticket);
	/* The ops enqueued after this run after the copy named ticket (and every
	 * copy before it) has finished; ticket 0 is a no-op. Never waits on the
	 * host. */
	int (*copy_wait)(struct kt_backend *be, uint64_t ticket);
	/* out = silu(gate) * up   all [T, I] f32 (out may be gate). up NULL:
	 * gate [T, 2I] holds each row's gate in its first I columns and its up
	 * in the last I (a fused gate_up product), out [T, I] apart from it.
	 * out may be bf16 (apart from gate and up; rounded to nearest even as
	 * it is stored, like rmsnorm's). */
	int (*swiglu)(struct kt_backend *be, const struct kt_tensor *out, const struct kt_tensor *gate,
		      const struct kt_tensor *up);
	/* y += x   both [R, D] f32 */
	int (*add)(struct kt_backend *be, const struct kt_tensor *y, const struct kt_tensor *x);
	/* out[i, :] = x[idx[i], :]   out [n, D], x [T, D] f32, idx [n, 1] i32 */
	int (*gather_rows)(struct kt_backend *be, const struct kt_tensor *out,
			   const struct kt_tensor *x, const struct kt_tensor *idx);
	/* Mixture-of-experts routing (DESIGN §11): per token t of logits
	 * [T, E] f32 (the router's), the k experts of the highest logits in
	 * descending order (equal logits: the lower expert id first) into ids
	 * [T, k] i32, and their softmax probabilities over all E experts into
	 * w [T, k] f32, divided by their sum over the k when norm. Then the
	 * plan of the T*k assignments a = t*k + j sorted by expert, stable in a:
	 * order [T*k, 1] i32 is the assignment at each sorted position, slot
	 * [T*k, 1] i32 the sorted position of each assignment (order's
	 * inverse), offsets [E + 1, 1] i32 where expert e's sorted positions
	 * start (offsets[E] = T*k). Everything stays on the device: safe in a
	 * graph. */
	int (*moe_route)(struct kt_backend *be, const struct kt_tensor *ids,
			 const struct kt_tensor *w, const struct kt_tensor *order,
			 const struct kt_tensor *slot, const struct kt_tensor *offsets,
			 const struct kt_tensor *logits, bool norm);
	/* The experts' product over a routing plan, one expert's rows at a
	 * time: for each sorted position i of expert e (offsets[e] <= i <
	 * offsets[e + 1]), y[i] = x[src(i)] · w_eᵀ with src(i) = order[i] / k
	 * when k > 0 (x [T, K] token rows) and src(i) = i when k == 0 (x
	 * [T*k, K] rows already in sorted order, a previous moe_matmul's).
	 * w [n_local * N, K] holds experts e0 .. e0 + n_local - 1 back to back
	 * (expert e's weight is rows (e - e0) * N ..); rows of experts outside
	 * that range are written 0, exactly, so that a sum over ranks that
	 * hold the other experts completes y. y [T*k, N] f32, order [T*k, 1],
	 * offsets [E + 1, 1] i32 from moe_route. Reads offsets on the device:
	 * safe in a graph. */
	int (*moe_matmul)(struct kt_backend *be, const struct kt_tensor *y,
			  const struct kt_tensor *x, const struct kt_tensor *w,
			  const struct kt_tensor *order, const struct kt_tensor *offsets, int k,
			  int e0);
	/* out[t] = sum over j = 0, 1, .. k-1 in that order of w[t, j] ·
	 * y[slot[t*k + j]], accumulated in f32 from zero: the experts' outputs
	 * of each token weighted and added in a fixed order whatever the
	 * batch or the ranks. out [T, N], y [T*k, N], w [T, k] f32, slot
	 * [T*k, 1] i32. */
	int (*moe_combine)(struct kt_backend *be, const struct kt_tensor *out,
			   const struct kt_tensor *y, const struct kt_tensor *w,
			   const struct kt_tensor *slot);
	/* Join the ranks of expert parallelism (DESIGN §10) as spec says,
	 * before any collective; called again (the group's next epoch, after
	 * a rank was lost), the new communicator replaces the old. -ENOTSUP:
	 * this backend has no communicator of that kind (cuda: NCCL only). */
	int (*comm_open)(struct kt_backend *be, const struct kt_comm_spec *spec, char *err,
			 size_t errlen);
	/* Rank 0 makes the id that every rank's comm_open spec carries
	 * (KT_COMM_NCCL's unique id). -ENOTSUP for a backend without one. */
	int (*comm_id)(struct kt_backend *be, unsigned char id[KT_COMM_ID_BYTES]);
	/* x = the sum of every rank's x, in place, on every rank, ordered like
	 * an op. A row that one rank holds and the others hold as exact zeros
	 * comes out exactly that rank's (how moe_matmul's shards meet), so the
	 * result does not depend on the number of ranks. -EPIPE or -ETIMEDOUT
	 * when a peer is gone or silent past spec.timeout_ms: the communicator
	 * is broken from then on and every later collective fails at once.
	 * x [R, C] f32. */
	int (*allreduce)(struct kt_backend *be, const struct kt_tensor *x);
	/* End the communicator of comm_open: the group's epoch is over. A rank
	 * that keeps its own while the others end theirs can hold up their
	 * teardown (NCCL's), so each ends its own at once. Collectives fail
	 * until the next comm_open; without a communicator it does nothing. */
	void (*comm_close)(struct kt_backend *be);
	/* Sample one id per row of logits [n, V] f32 into ids (host memory, n entries).
	 * Order: temperature scaling, top-k, top-p over the softmax, then inverse-CDF
	 * with rows[i].u. Returns when ids are on the host: the sync point of a step. */
	int (*sample)(struct kt_backend *be, const struct kt_tensor *logits,
		      const struct kt_sample_row *rows, int n, int32_t *ids);
	/* A draw: the ids sample() gives, enqueued without waiting, so that a
	 * graph may record it (cuda: its kernels follow lm_head's under PDL
	 * inside the step's graph, instead of being launched after it).
	 * draw_rows stages the requests of the next draws: rows [n] (host
	 * memory, copied; n from 1 to kt_config.max_tokens or max_seqs,
	 * whichever is larger) for logits of V columns. It returns their kind,
	 * 0 to KT_DRAW_KINDS - 1 (0: every row greedy; which kernels a draw of
	 * them takes), on which a graph that records a draw must be keyed; or
	 * -EINVAL where sample() would refuse them. Staging is not an op: a
	 * graph's draw, replayed, reads the rows staged last, so they are
	 * staged before the graph is replayed and not again until drawn() has
	 * returned. */
	int (*draw_rows)(struct kt_backend *be, const struct kt_sample_row *rows, int n,
			 int64_t V);
	/* Enqueue the draw of every row of logits [n, V] f32 with the staged
	 * requests (the n and V they were staged for). */
	int (*draw)(struct kt_backend *be, const struct kt_tensor *logits);
	/* Wait for the last draw and copy the ids of its first n rows (n at
	 * most its rows) to ids (host memory): the sync point of a step, as
	 * sample() is; -EINVAL when n is more than any draw has. No sample()
	 * may come between a draw and drawn() (cuda's share the ids' buffer). */
	int (*drawn)(struct kt_backend *be, int32_t *ids, int n);

	/* Run record(ctx), which enqueues ops, as the graph called key: the
	 * first call records the ops into a graph and replays it, later calls
	 * with the same key only replay it (record is not called). The ops
	 * must then touch the same tensors with the same shapes every time;
	 * only the contents of device memory may change. A backend without
	 * graphs (cpu) calls record every time. */
	int (*graph)(struct kt_backend *be, uint64_t key, int (*record)(void *ctx), void *ctx);
	/* dst = src, byte for byte (same size, any dtypes; they must not overlap). */
	int (*copy)(struct kt_backend *be, const struct kt_tensor *dst, const struct kt_tensor *src);
	/* Bytes of device memory free now and in total (cpu: available and physical RAM). */
	int (*memory)(struct kt_backend *be, uint64_t *free_bytes, uint64_t *total_bytes);

	/* Host memory the backend copies to and from at full speed (cuda:
	 * pinned; cpu: ordinary), aligned to KT_HOST_ALIGN: the KV swap tier's
	 * host pool and the buffers of its disk I/O. Not for use during a step. */
	int (*host_alloc)(struct kt_backend *be, size_t bytes, void **out);
	void (*host_free)(struct kt_backend *be, void *p);
	/* Start copying bytes between host memory from host_alloc and tensor t
	 * at byte offset off (to_host: t to host, else host to t), ordered after
	 * every op enqueued before it and beside the ops enqueued after it (cuda:
	 * on a stream of its own); *ticket names it. Until copy_done says so, the
	 * source must not change and the destination must not be read. -EAGAIN:
	 * too many copies in flight, try again after some finish. */
	int (*copy_async)(struct kt_backend *be, void *host, const struct kt_tensor *t, size_t off,
			  size_t bytes, bool to_host, uint64_t *ticket);
	/* Whether the copy named ticket, and every copy started before it, has
	 * finished: 1, 0 while it runs, or a negative errno if it failed. Never
	 * waits. */
	int (*copy_done)(struct kt_backend *be, uint64_t ticket);

	/* Gated DeltaNet (DESIGN §11): the linear-attention layers of the hybrid
	 * families. A sequence keeps one row of each such layer's state tensor
	 * state [n_slots, F] f32: the causal conv's last K - 1 inputs [K - 1, C]
	 * (oldest first) at float 0, then the delta rule's matrices [Hv, dk, dv]
	 * at float `off`. Row t of a step uses state row slot[t] (slot [T, 1]
	 * i32) at position b->pos[t]. A sequence's rows in a step are
	 * consecutive rows at consecutive positions (its decode or verify rows,
	 * or one segment) and no two sequences share a state row; a row at
	 * position 0 starts from the zero state whatever its row holds. Each op
	 * reads a sequence's state as it was before its first row and leaves it
	 * as it is after its last. b gives the step's shape on the host (a
	 * backend may pick kernels by it); graph-safe like attention.
	 *
	 * conv1d: out[t, c] = silu(sum over j < K of w[c, j] · in(pos[t] - K + 1 + j, c))
	 * where in(p, c) is x[row of t's sequence at position p, c] for a row of
	 * this step, the state's input of position p for one before them, and 0
	 * before position 0. out, x [T, C] f32 (apart), w [C, K] weight. */
	int (*conv1d)(struct kt_backend *be, const struct kt_tensor *out, const struct kt_tensor *x,
		      const struct kt_tensor *w, const struct kt_tensor *state,
		      const struct kt_tensor *slot, const struct kt_batch *b);
	/* delta_rule: the gated delta rule over qkv [T, 2 * Hk * dk + Hv * dv]
	 * f32 (Hk q heads, Hk k heads of dk, Hv v heads of dv: a conv1d's out)
	 * and ba [T, 2 * Hv] f32 (Hv b, then Hv a). Per row t and value head h,
	 * whose q and k head is h / (Hv / Hk), with S the [dk, dv] matrix of
	 * head h in t's state:
	 *   q = l2(q) / sqrt(dk), k = l2(k)      l2(x) = x / sqrt(sum x² + 1e-6)
	 *   beta = sigmoid(b[h])                 g = -exp(a_log[h]) · softplus(a[h] + dt_bias[h])
	 *   S = exp(g) · S;  S = S + k ⊗ (beta · (v - Sᵀ k));  out[t, h] = Sᵀ q
	 * softplus(x) = x above 20, else log(1 + exp(x)) (torch's threshold).
	 * out [T, Hv * dv] f32; a_log, dt_bias [1, Hv] f32; Hv a multiple of Hk. */
	int (*delta_rule)(struct kt_backend *be, const struct kt_tensor *out,
			  const struct kt_tensor *qkv, const struct kt_tensor *ba,
			  const struct kt_tensor *a_log, const struct kt_tensor *dt_bias,
			  const struct kt_tensor *state, int64_t off, const struct kt_tensor *slot,
			  const struct kt_batch *b, int n_k_heads, int n_v_heads, int k_dim,
			  int v_dim);
	/* out = x / rms(x) · w · silu(z), per row (rms as rmsnorm's, eps): the
	 * gated norm of the delta rule's heads. out, x, z [R, D] f32 (out may be
	 * x); w [1, D]. */
	int (*rmsnorm_gated)(struct kt_backend *be, const struct kt_tensor *out,
			     const struct kt_tensor *x, const struct kt_tensor *z,
			     const struct kt_tensor *w, float eps);
	/* out = x · sigmoid(g)   out, x [R, D] f32 (out may be x); g [R, D] f32, or
	 * [R, 1] f32: one gate per row (an attention output gate; a shared
	 * expert's gate). */
	int (*sigmoid_mul)(struct kt_backend *be, const struct kt_tensor *out,
			   const struct kt_tensor *x, const struct kt_tensor *g);
	/* Products of one x: ys[i] = x · ws[i]ᵀ (+ biases[i], NULL entries for
	 * none) for i < n <= KT_MATMUL_MAX_N, each exactly what matmul gives it
	 * alone (the same bits): a layer's q, k and v, or its gate and up; the
	 * ys apart from each other (kt_matmul_n refuses them otherwise). A
	 * backend may run them as one launch (cuda: the GEMV's blocks of all
	 * the weights in one grid); NULL: kt_matmul_n calls matmul n times. */
	int (*matmul_n)(struct kt_backend *be, int n, const struct kt_tensor *const *ys,
			const struct kt_tensor *x, const struct kt_tensor *const *ws,
			const struct kt_tensor *const *biases);
	/* A layer's rope of q, rope of k and kv_store of k and v as one op,
	 * each result exactly what the three ops give one after another (the
	 * same bits): rope(q, b->pos, ...q_norm), rope(k, b->pos, ...k_norm),
	 * kv_store(kcache, vcache, k, v, b); with a->qkv, after q, k and v are
	 * taken out of its rows. A backend may run them as one launch (cuda: a
	 * block per token and group of heads); NULL: kt_rope_store runs the
	 * three (and refuses a qkv). q, k, v and qkv apart from each other
	 * (kt_rope_store refuses them otherwise). With a->attend_next the
	 * caches hold the same bits once the attention after it has run, and
	 * that attention's out is the same bits. */
	int (*rope_store)(struct kt_backend *be, const struct kt_rope_store_args *a,
			  const struct kt_batch *b);
	/* act = silu(x · w_gateᵀ) * (x · w_upᵀ) for w [2I, K], the gate's rows
	 * stacked over the up's: exactly matmul(gu, x, w) then swiglu(act, gu,
	 * NULL) (the same bits), gu [T, 2I] f32 the product's scratch, whose
	 * contents after are unspecified. act [T, I] f32 or bf16. A backend
	 * may fuse them (cuda: swiglu in the GEMV's epilogue at decode sizes);
	 * NULL: kt_matmul_swiglu runs the two. */
	int (*matmul_swiglu)(struct kt_backend *be, const struct kt_tensor *act,
			     const struct kt_tensor *gu, const struct kt_tensor *x,
			     const struct kt_tensor *w);
	/* rmsnorm (the same arguments and results) for an out that only the
	 * product right after it reads: the next op is a matmul, matmul_n or
	 * matmul_swiglu with x = out (all of its rows), and out is not read
	 * again. A backend may then leave out unwritten and compute the norm
	 * inside that product (cuda: in the GEMV's blocks at one row), whose
	 * results are the bits of rmsnorm then the product; x (+= residual) is
	 * as rmsnorm leaves it once the product has run. Any other next op
	 * finds out written, as rmsnorm writes it. NULL: kt_rmsnorm_product
	 * runs rmsnorm. */
	int (*rmsnorm_product)(struct kt_backend *be, const struct kt_tensor *out,
			       const struct kt_tensor *x, const struct kt_tensor *residual,
			       const struct kt_tensor *w, float eps);
};

/* The most products of one matmul_n. */
#define KT_MATMUL_MAX_N 4

/* The most experts a token is routed to (moe_route's k = ids.cols,
 * moe_matmul's k, moe_combine's w.cols): k above it is -EINVAL on every
 * backend, so that a kernel may keep a token's k ids and weights in arrays
 * of fixed size. */
#define KT_MOE_MAX_K 16

/* Runs of consecutive blocks kv_stage copies with copy engines at most;
 * more fragmented pieces are read by a kernel. */
#define KT_STAGE_MAX_RUNS 64

/* Alignment of host_alloc memory: what O_DIRECT file I/O needs. */
#define KT_HOST_ALIGN 4096

struct kt_backend {
	const struct kt_ops *ops;
	struct kt_device_info info;
	struct kt_comm_stats comm;  /* the backend's thread writes, anyone may read */
	uint64_t graphs_recorded;  /* graphs kt_graph has recorded so far (the backend's
				    * thread counts, anyone may read) */
};

/* Open the backend that c->backend names ("auto": cuda when built with CUDA
 * and a GPU is present, else cpu). */
int kt_backend_open(const struct kt_config *c, struct kt_backend **out, char *err, size_t errlen);
/* The backend that name opens on this machine: "cuda" or "cpu" for
 * "auto" (NULL or empty too), else name itself. */
const char *kt_backend_resolve(const char *name);
/* The backends this build contains, space separated ("cpu cuda"). */
const char *kt_backends_built(void);

static inline void kt_backend_close(struct kt_backend *be) { if (be) be->ops->close(be); }

#define KT_OP(name, ...) (be->ops->name(be, __VA_ARGS__))
static inline int kt_alloc(struct kt_backend *be, enum kt_dtype dt, int64_t rows, int64_t cols,
			   struct kt_tensor *out) { return KT_OP(alloc, dt, rows, cols, out); }
static inline void kt_free(struct kt_backend *be, struct kt_tensor *t) { be->ops->free(be, t); }
static inline int kt_upload(struct kt_backend *be, const struct kt_tensor *dst, size_t off,
			    const void *src, size_t n) { return KT_OP(upload, dst, off, src, n); }
static inline int kt_download(struct kt_backend *be, void *dst, const struct kt_tensor *src,
			      size_t off, size_t n) { return KT_OP(download, dst, src, off, n); }
static inline int kt_weight(struct kt_backend *be, enum kt_dtype src_dt, const void *src,
			    int64_t rows, int64_t cols, bool outlives, struct kt_tensor *out)
{ return KT_OP(weight, src_dt, src, rows, cols, outlives, out); }
static inline int kt_synchronize(struct kt_backend *be) { return be->ops->synchronize(be); }
static inline int kt_embed(struct kt_backend *be, const struct kt_tensor *out,
			   const struct kt_tensor *table, const struct kt_tensor *ids)
{ return KT_OP(embed, out, table, ids); }
static inline int kt_rmsnorm(struct kt_backend *be, const struct kt_tensor *out,
			     const struct kt_tensor *x, const struct kt_tensor *residual,
			     const struct kt_tensor *w, float eps)
{ return KT_OP(rmsnorm, out, x, residual, w, eps); }
static inline int kt_rmsnorm_product(struct kt_backend *be, const struct kt_tensor *out,
				     const struct kt_tensor *x, const struct kt_tensor *residual,
				     const struct kt_tensor *w, float eps)
{
	if (be->ops->rmsnorm_product)
		return KT_OP(rmsnorm_product, out, x, residual, w, eps);
	return KT_OP(rmsnorm, out, x, residual, w, eps);
}
static inline int kt_matmul(struct kt_backend *be, const struct kt_tensor *y,
			    const struct kt_tensor *x, const struct kt_tensor *w,
			    const struct kt_tensor *bias) { return KT_OP(matmul, y, x, w, bias); }
static inline int kt_rope(struct kt_backend *be, const struct kt_tensor *x,
			  const struct kt_tensor *pos, const struct kt_tensor *inv_freq, int n_heads,
			  int head_dim, const struct kt_tensor *norm_w, float eps)
{ return KT_OP(rope, x, pos, inv_freq, n_heads, head_dim, norm_w, eps); }
static inline int kt_kv_store(struct kt_backend *be, const struct kt_tensor *kc,
			      const struct kt_tensor *vc, const struct kt_tensor *k,
			      const struct kt_tensor *v, const struct kt_batch *b)
{ return KT_OP(kv_store, kc, vc, k, v, b); }
static inline int kt_attention(struct kt_backend *be, const struct kt_tensor *out,
			       const struct kt_tensor *q, const struct kt_tensor *kc,
			       const struct kt_tensor *vc, const struct kt_batch *b, int n_heads,
			       int n_kv_heads, int head_dim, float scale)
{ return KT_OP(attention, out, q, kc, vc, b, n_heads, n_kv_heads, head_dim, scale); }
static inline int kt_attention_part(struct kt_backend *be, const struct kt_att_state *st,
				    const struct kt_tensor *q, const struct kt_tensor *kc,
				    const struct kt_tensor *vc, const struct kt_batch *b,
				    const struct kt_tensor *from, int n_heads, int n_kv_heads,
				    int head_dim, float scale, bool first)
{ return KT_OP(attention_part, st, q, kc, vc, b, from, n_heads, n_kv_heads, head_dim, scale, first); }
static inline int kt_attention_staged(struct kt_backend *be, const struct kt_att_state *st,
				      const struct kt_tensor *q, const struct kt_tensor *ks,
				      const struct kt_tensor *vs, const struct kt_tensor *span,
				      int block_size, int n_heads, int n_kv_heads, int head_dim,
				      float scale, bool first)
{ return KT_OP(attention_staged, st, q, ks, vs, span, block_size, n_heads, n_kv_heads, head_dim, scale, first); }
static inline int kt_attention_finish(struct kt_backend *be, const struct kt_tensor *out,
				      const struct kt_att_state *st, int n_heads, int head_dim)
{ return KT_OP(attention_finish, out, st, n_heads, head_dim); }
static inline int kt_kv_stage(struct kt_backend *be, const struct kt_tensor *dst,
			      const struct kt_tensor *pool, size_t pool_block_bytes,
			      const void *host, size_t host_slot_bytes, int64_t host_slots,
			      const struct kt_tensor *src, const int32_t *src_host, size_t off,
			      size_t bytes, uint64_t *ticket)
{ return KT_OP(kv_stage, dst, pool, pool_block_bytes, host, host_slot_bytes, host_slots, src, src_host, off, bytes, ticket); }
static inline int kt_copy_wait(struct kt_backend *be, uint64_t ticket)
{ return KT_OP(copy_wait, ticket); }
static inline int kt_swiglu(struct kt_backend *be, const struct kt_tensor *out,
			    const struct kt_tensor *gate, const struct kt_tensor *up)
{ return KT_OP(swiglu, out, gate, up); }
static inline int kt_add(struct kt_backend *be, const struct kt_tensor *y,
			 const struct kt_tensor *x) { return KT_OP(add, y, x); }
static inline int kt_gather_rows(struct kt_backend *be, const struct kt_tensor *out,
				 const struct kt_tensor *x, const struct kt_tensor *idx)
{ return KT_OP(gather_rows, out, x, idx); }
static inline int kt_moe_route(struct kt_backend *be, const struct kt_tensor *ids,
			       const struct kt_tensor *w, const struct kt_tensor *order,
			       const struct kt_tensor *slot, const struct kt_tensor *offsets,
			       const struct kt_tensor *logits, bool norm)
{ return KT_OP(moe_route, ids, w, order, slot, offsets, logits, norm); }
static inline int kt_moe_matmul(struct kt_backend *be, const struct kt_tensor *y,
				const struct kt_tensor *x, const struct kt_tensor *w,
				const struct kt_tensor *order, const struct kt_tensor *offsets,
				int k, int e0)
{ return KT_OP(moe_matmul, y, x, w, order, offsets, k, e0); }
static inline int kt_moe_combine(struct kt_backend *be, const struct kt_tensor *out,
				 const struct kt_tensor *y, const struct kt_tensor *w,
				 const struct kt_tensor *slot)
{ return KT_OP(moe_combine, out, y, w, slot); }
static inline int kt_comm_open(struct kt_backend *be, const struct kt_comm_spec *spec,
			       char *err, size_t errlen)
{ return KT_OP(comm_open, spec, err, errlen); }
static inline int kt_comm_id(struct kt_backend *be, unsigned char id[KT_COMM_ID_BYTES])
{ return KT_OP(comm_id, id); }
static inline int kt_allreduce(struct kt_backend *be, const struct kt_tensor *x)
{ return KT_OP(allreduce, x); }
static inline void kt_comm_close(struct kt_backend *be) { be->ops->comm_close(be); }
static inline int kt_sample(struct kt_backend *be, const struct kt_tensor *logits,
			    const struct kt_sample_row *rows, int n, int32_t *ids)
{ return KT_OP(sample, logits, rows, n, ids); }
static inline int kt_draw_rows(struct kt_backend *be, const struct kt_sample_row *rows, int n,
			       int64_t V)
{ return KT_OP(draw_rows, rows, n, V); }
static inline int kt_draw(struct kt_backend *be, const struct kt_tensor *logits)
{ return KT_OP(draw, logits); }
static inline int kt_drawn(struct kt_backend *be, int32_t *ids, int n)
{ return KT_OP(drawn, ids, n); }
static inline int kt_graph(struct kt_backend *be, uint64_t key, int (*record)(void *ctx),
			   void *ctx) { return KT_OP(graph, key, record, ctx); }
static inline int kt_copy(struct kt_backend *be, const struct kt_tensor *dst,
			  const struct kt_tensor *src) { return KT_OP(copy, dst, src); }
static inline int kt_memory(struct kt_backend *be, uint64_t *free_bytes, uint64_t *total_bytes)
{ return KT_OP(memory, free_bytes, total_bytes); }
static inline int kt_host_alloc(struct kt_backend *be, size_t bytes, void **out)
{ return KT_OP(host_alloc, bytes, out); }
static inline void kt_host_free(struct kt_backend *be, void *p) { be->ops->host_free(be, p); }
static inline int kt_copy_async(struct kt_backend *be, void *host, const struct kt_tensor *t,
				size_t off, size_t bytes, bool to_host, uint64_t *ticket)
{ return KT_OP(copy_async, host, t, off, bytes, to_host, ticket); }
static inline int kt_copy_done(struct kt_backend *be, uint64_t ticket)
{ return KT_OP(copy_done, ticket); }
static inline int kt_conv1d(struct kt_backend *be, const struct kt_tensor *out,
			    const struct kt_tensor *x, const struct kt_tensor *w,
			    const struct kt_tensor *state, const struct kt_tensor *slot,
			    const struct kt_batch *b) { return KT_OP(conv1d, out, x, w, state, slot, b); }
static inline int kt_delta_rule(struct kt_backend *be, const struct kt_tensor *out,
				const struct kt_tensor *qkv, const struct kt_tensor *ba,
				const struct kt_tensor *a_log, const struct kt_tensor *dt_bias,
				const struct kt_tensor *state, int64_t off,
				const struct kt_tensor *slot, const struct kt_batch *b,
				int n_k_heads, int n_v_heads, int k_dim, int v_dim)
{ return KT_OP(delta_rule, out, qkv, ba, a_log, dt_bias, state, off, slot, b, n_k_heads, n_v_heads, k_dim, v_dim); }
static inline int kt_rmsnorm_gated(struct kt_backend *be, const struct kt_tensor *out,
				   const struct kt_tensor *x, const struct kt_tensor *z,
				   const struct kt_tensor *w, float eps)
{ return KT_OP(rmsnorm_gated, out, x, z, w, eps); }
static inline int kt_sigmoid_mul(struct kt_backend *be, const struct kt_tensor *out,
				 const struct kt_tensor *x, const struct kt_tensor *g)
{ return KT_OP(sigmoid_mul, out, x, g); }
static inline int kt_matmul_n(struct kt_backend *be, int n, const struct kt_tensor *const *ys,
			      const struct kt_tensor *x, const struct kt_tensor *const *ws,
			      const struct kt_tensor *const *biases)
{
	if (n < 1 || n > KT_MATMUL_MAX_N || !ys || !ws || !x)
		return -EINVAL;
	/* The shapes and the outputs' overlaps for every backend, before any
	 * product runs: a refused call writes nothing. */
	for (int i = 0; i < n; i++) {
		if (!ys[i] || !ws[i] || ws[i]->cols != x->cols || ys[i]->rows != x->rows ||
		    ys[i]->cols != ws[i]->rows)
			return -EINVAL;
		for (int j = 0; j < i; j++)
			if (kt_overlap(ys[i], ys[j]))
				return -EINVAL;
	}
	if (be->ops->matmul_n)
		return KT_OP(matmul_n, n, ys, x, ws, biases);
	for (int i = 0; i < n; i++) {
		int rc = KT_OP(matmul, ys[i], x, ws[i], biases ? biases[i] : NULL);
		if (rc)
			return rc;
	}
	return 0;
}
static inline int kt_rope_store(struct kt_backend *be, const struct kt_rope_store_args *a,
				const struct kt_batch *b)
{
	int rc;

	/* The shapes for every backend, before any op runs: a refused call
	 * writes nothing (the ops check the rest). */
	if (!a || !b || !a->q || !a->k || !a->v || kt_overlap(a->q, a->k) ||
	    kt_overlap(a->q, a->v) || kt_overlap(a->k, a->v) || a->head_dim <= 0 ||
	    (a->qkv && (a->qkv->rows != a->q->rows ||
			a->qkv->cols != a->q->cols + 2 * a->k->cols || kt_overlap(a->qkv, a->q) ||
			kt_overlap(a->qkv, a->k) || kt_overlap(a->qkv, a->v))) ||
	    a->q->rows != a->k->rows || a->v->rows != a->k->rows || a->v->cols != a->k->cols ||
	    a->q->cols != (int64_t)a->n_heads * a->head_dim ||
	    a->k->cols != (int64_t)a->n_kv_heads * a->head_dim ||
	    (a->q_norm && a->q_norm->cols != a->head_dim) ||
	    (a->k_norm && a->k_norm->cols != a->head_dim))
		return -EINVAL;
	if (be->ops->rope_store)
		return KT_OP(rope_store, a, b);
	if (a->qkv)
		return -EOPNOTSUPP; /* the rows cannot be taken apart without the op */
	if ((rc = KT_OP(rope, a->q, &b->pos, a->inv_freq, a->n_heads, a->head_dim, a->q_norm,
			a->eps)) ||
	    (rc = KT_OP(rope, a->k, &b->pos, a->inv_freq, a->n_kv_heads, a->head_dim, a->k_norm,
			a->eps)))
		return rc;
	return KT_OP(kv_store, a->kcache, a->vcache, a->k, a->v, b);
}
static inline int kt_matmul_swiglu(struct kt_backend *be, const struct kt_tensor *act,
				   const struct kt_tensor *gu, const struct kt_tensor *x,
				   const struct kt_tensor *w)
{
	int rc;

	/* The shapes for every backend, before anything runs. */
	if (!act || !gu || !x || !w || w->rows % 2 || w->cols != x->cols ||
	    gu->rows != x->rows || gu->cols != w->rows || act->rows != x->rows ||
	    2 * act->cols != w->rows || kt_overlap(act, gu) || kt_overlap(act, x) ||
	    kt_overlap(gu, x))
		return -EINVAL;
	if (be->ops->matmul_swiglu)
		return KT_OP(matmul_swiglu, act, gu, x, w);
	if ((rc = KT_OP(matmul, gu, x, w, NULL)))
		return rc;
	return KT_OP(swiglu, act, gu, NULL);
}
#undef KT_OP

#endif
