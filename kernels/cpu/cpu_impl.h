/* Internals of the cpu backend, shared by its op files (not for the engine).
 *
 * Every op runs synchronously on the calling thread, which forks an OpenMP
 * team of `threads` workers for the parallel part (num_threads clause, so the
 * caller's OpenMP settings are left alone). Per-thread scratch is allocated
 * once at kt_cpu_open from the kt_config limits; ops never allocate.
 */
#ifndef ATLAS_KERNELS_CPU_IMPL_H
#define ATLAS_KERNELS_CPU_IMPL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"

struct comm_socket;

/* Ops with fewer elements than this run on one thread: forking a team costs
 * more than it saves. */
#define CPU_PAR_MIN 32768

/* Threads: only the compute ops fork OpenMP teams, and the engine calls them
 * from the one thread that runs its steps. Copies and conversions, which the
 * loader and others call from their own threads too, run on the caller's
 * thread alone. libgomp keeps a pool of workers for every thread that ever
 * forked a team; once the pools hold more workers than there are CPUs, it
 * has every worker sleep almost at once between regions instead of
 * spinning, and each of the hundred-odd regions of a decode step then pays
 * a futex wake-up (atlas-tiny's decode at batch 1: 535 tokens/s with the
 * loader's pool alive, 690 without). */

/* Tokens per sampling chunk (see cpu_sample.c): the first chunk of a row
 * without top-k holds CPU_SAMPLE_FIRST, later ones CPU_SAMPLE_CHUNK. */
#define CPU_SAMPLE_CHUNK 4096
#define CPU_SAMPLE_FIRST 256

/* Query heads of one GQA group that attention handles together. */
#define CPU_ATT_HEADS 8

/* One sampling candidate: a logit and its token id. */
struct cpu_cand {
	float logit;
	int32_t id;
};

/* Scratch of one OpenMP worker, carved from one allocation. */
struct cpu_scratch {
	float *scores;          /* [CPU_ATT_HEADS, max_context] attention scores */
	float *acc;             /* [CPU_ATT_HEADS, max_head_dim] attention accumulators */
	float *ml;              /* [CPU_ATT_HEADS, 2] attention running max and sum */
	float *cos, *sin;       /* [max_head_dim / 2] rope table of one token */
	struct cpu_cand *cands; /* [CPU_SAMPLE_CHUNK] sampling heap */
	float *gdn;             /* [3, max_head_dim] delta rule: one head's q, k and
				 * kv memory (cpu_gdn.c; k_dim, v_dim <= max_head_dim) */
	uint16_t *xbuf;         /* [CPU_XBUF_ROWS, CPU_DP_MAX_K] rows of x rounded to bf16
				 * by the dp and amx kernels; NULL under cpu_precision f32 */
};

/* Set of pointers the backend allocated and must free (aliased weights are
 * never in it). Open addressing with linear probing; slots NULL when empty. */
struct cpu_ptrset {
	void **slots;
	size_t cap;   /* power of two, or 0 before the first insert */
	size_t count;
};

/* Instruction sets of the bf16-weight matmul kernels, in order of preference. */
enum cpu_isa { CPU_ISA_GENERIC, CPU_ISA_AVX2, CPU_ISA_AVX512BF16, CPU_ISA_AMX };

struct cpu_backend {
	struct kt_backend base;    /* first member: the engine's handle */
	int threads;               /* OpenMP team size of every op */
	bool bf16;                 /* cpu_precision bf16: bf16 matrices stay bf16 (cpu_weight)
				    * and matmul may round x to bf16 */
	enum cpu_isa isa;          /* the bf16-weight kernels' instruction set */
	int max_context;           /* attention: positions per sequence the scratch holds */
	int max_head_dim;          /* attention, rope and delta_rule: head dims the
				    * scratch holds */
	void *scratch_mem;         /* owns every worker's scratch */
	struct cpu_scratch *scratch; /* [threads] */
	pthread_mutex_t lock;      /* guards owned (alloc and free may come from loader threads) */
	struct cpu_ptrset owned;   /* allocations to free at kt_free or close */
	uint64_t copies;           /* copy_async tickets handed out (each finishes at once) */
	struct comm_socket *comm;  /* expert parallelism's communicator; NULL before comm_open */
	struct kt_sample_row *draw_req; /* [draw_cap]: the staged requests (cpu_draw_rows) */
	int32_t *drawn_ids;        /* [draw_cap]: the last draw's ids (cpu_draw) */
	int draw_cap;              /* max(max_tokens, max_seqs) of the config */
	int draw_n;                /* rows staged, 0 before any */
	int64_t draw_v;            /* columns of the logits they were staged for */
};

static inline struct cpu_backend *cpu_of(struct kt_backend *be)
{
	return (struct cpu_backend *)be;
}

/* The scratch of the calling OpenMP worker (thread 0 outside a team). */
struct cpu_scratch *cpu_scratch_self(struct cpu_backend *cpu);

/* t has data, dtype dt and exactly rows × cols. */
static inline bool cpu_shape(const struct kt_tensor *t, enum kt_dtype dt, int64_t rows,
			     int64_t cols)
{
	return t && t->data && t->dtype == dt && t->rows == rows && t->cols == cols;
}

/* t has data, dtype dt and a non-negative shape. */
static inline bool cpu_valid(const struct kt_tensor *t, enum kt_dtype dt)
{
	return t && t->data && t->dtype == dt && t->rows >= 0 && t->cols >= 0;
}

/* The byte ranges of a and b intersect. */
static inline bool cpu_overlap(const struct kt_tensor *a, const struct kt_tensor *b)
{
	return kt_overlap(a, b);
}

/* Rows of x the matmul kernel reads per work item (cpu_matmul.c). */
#define CPU_MM_ROWS 64

/* The rows of x a matmul block reads: row t is x + src(t) * K, with
 * src(t) = t, or order[t] / k when order is given (moe_matmul's gather). */
struct cpu_xrows {
	const float *x;
	const int32_t *order;
	int k;
};

/* w rows per block of the matmul kernel for rows of K floats (K == 0: one
 * block of all N rows). */
int64_t cpu_matmul_wrows(int64_t K, int64_t N);
/* y rows [0, T) = x rows [t0, t0 + T) · w rows [0, nb)ᵀ (+ bias[0, nb)):
 * y's rows are N floats apart, and y, w and bias start at the block. Each y
 * element is a function of its x row, w row and bias alone, whatever T, t0
 * and nb: dot(x row, w row) in cpu_simd.h's one order for the f32 and the
 * widening bf16 kernels, cpu_matmul_dp.c's order for the dp kernel. */
typedef void cpu_mm_block_fn(const struct cpu_xrows *x, int64_t t0, int64_t T, const void *w,
			     int64_t nb, int64_t K, float *y, int64_t N, const float *bias,
			     uint16_t *xbuf);
/* f32 w (x86-64-v3 or baseline clones). */
cpu_mm_block_fn cpu_matmul_block;
/* bf16 w widened exactly to f32 in registers: portable, and AVX2 + FMA. */
cpu_mm_block_fn cpu_matmul_bf16_generic;
cpu_mm_block_fn cpu_matmul_bf16_avx2;
/* bf16 w and x rounded to bf16 into xbuf (the calling thread's scratch):
 * AVX512-BF16 dot products (cpu_matmul_dp.c) or AMX tiles
 * (cpu_matmul_amx.c); for K <= CPU_DP_MAX_K only. */
#define CPU_DP_MAX_K 16384
#define CPU_XBUF_ROWS 32
cpu_mm_block_fn cpu_matmul_bf16_dp;
cpu_mm_block_fn cpu_matmul_bf16_amx;
/* w rows per block for kernel (cpu_matmul_wrows but for the amx kernel,
 * whose blocks are larger: each block packs its rows of x once). */
int64_t cpu_matmul_kernel_wrows(cpu_mm_block_fn *kernel, int64_t K, int64_t N);
/* The block kernel for w of dtype dt (f32 or bf16) and rows of K: the one
 * function of the backend's precision and instruction set for that K. */
cpu_mm_block_fn *cpu_matmul_kernel(const struct cpu_backend *cpu, enum kt_dtype dt, int64_t K);
/* Whether this CPU runs isa's kernels. */
bool cpu_isa_supported(enum cpu_isa isa);
/* The CPU has AMX-BF16 and Linux gave this process the tile state. */
bool cpu_amx_usable(void);

/* Memory (cpu_memory.c) */
int cpu_alloc(struct kt_backend *be, enum kt_dtype dtype, int64_t rows, int64_t cols,
	      struct kt_tensor *out);
void cpu_free(struct kt_backend *be, struct kt_tensor *t);
void cpu_free_all(struct cpu_backend *cpu);
int cpu_upload(struct kt_backend *be, const struct kt_tensor *dst, size_t offset,
	       const void *src, size_t bytes);
int cpu_download(struct kt_backend *be, void *dst, const struct kt_tensor *src, size_t offset,
		 size_t bytes);
int cpu_weight(struct kt_backend *be, enum kt_dtype src_dtype, const void *src, int64_t rows,
	       int64_t cols, bool src_outlives, struct kt_tensor *out);

/* Host memory and copies to and from it (cpu_transfer.c). */
int cpu_host_alloc(struct kt_backend *be, size_t bytes, void **out);
void cpu_host_free(struct kt_backend *be, void *p);
int cpu_copy_async(struct kt_backend *be, void *host, const struct kt_tensor *t, size_t off,
		   size_t bytes, bool to_host, uint64_t *ticket);
int cpu_copy_done(struct kt_backend *be, uint64_t ticket);

/* Ops, one file per family; contracts in kernels/backend.h. */
int cpu_matmul(struct kt_backend *be, const struct kt_tensor *y, const struct kt_tensor *x,
	       const struct kt_tensor *w, const struct kt_tensor *bias);
int cpu_rmsnorm(struct kt_backend *be, const struct kt_tensor *out, const struct kt_tensor *x,
		const struct kt_tensor *residual, const struct kt_tensor *w, float eps);
int cpu_rope(struct kt_backend *be, const struct kt_tensor *x, const struct kt_tensor *pos,
	     const struct kt_tensor *inv_freq, int n_heads, int head_dim,
	     const struct kt_tensor *norm_w, float eps);
int cpu_kv_store(struct kt_backend *be, const struct kt_tensor *kcache,
		 const struct kt_tensor *vcache, const struct kt_tensor *k,
		 const struct kt_tensor *v, const struct kt_batch *b);
int cpu_rope_store(struct kt_backend *be, const struct kt_rope_store_args *a,
		   const struct kt_batch *b);
int cpu_attention(struct kt_backend *be, const struct kt_tensor *out, const struct kt_tensor *q,
		  const struct kt_tensor *kcache, const struct kt_tensor *vcache,
		  const struct kt_batch *b, int n_heads, int n_kv_heads, int head_dim, float scale);
int cpu_attention_part(struct kt_backend *be, const struct kt_att_state *st,
		       const struct kt_tensor *q, const struct kt_tensor *kcache,
		       const struct kt_tensor *vcache, const struct kt_batch *b,
		       const struct kt_tensor *from, int n_heads, int n_kv_heads, int head_dim,
		       float scale, bool first);
int cpu_attention_staged(struct kt_backend *be, const struct kt_att_state *st,
			 const struct kt_tensor *q, const struct kt_tensor *ks,
			 const struct kt_tensor *vs, const struct kt_tensor *span, int block_size,
			 int n_heads, int n_kv_heads, int head_dim, float scale, bool first);
int cpu_attention_finish(struct kt_backend *be, const struct kt_tensor *out,
			 const struct kt_att_state *st, int n_heads, int head_dim);
int cpu_kv_stage(struct kt_backend *be, const struct kt_tensor *dst, const struct kt_tensor *pool,
		 size_t pool_block_bytes, const void *host, size_t host_slot_bytes,
		 int64_t host_slots, const struct kt_tensor *src, const int32_t *src_host,
		 size_t off, size_t bytes, uint64_t *ticket);
int cpu_copy_wait(struct kt_backend *be, uint64_t ticket);
int cpu_embed(struct kt_backend *be, const struct kt_tensor *out, const struct kt_tensor *table,
	      const struct kt_tensor *ids);
int cpu_swiglu(struct kt_backend *be, const struct kt_tensor *out, const struct kt_tensor *gate,
	       const struct kt_tensor *up);
int cpu_add(struct kt_backend *be, const struct kt_tensor *y, const struct kt_tensor *x);
int cpu_gather_rows(struct kt_backend *be, const struct kt_tensor *out,
		    const struct kt_tensor *x, const struct kt_tensor *idx);
int cpu_moe_route(struct kt_backend *be, const struct kt_tensor *ids, const struct kt_tensor *w,
		  const struct kt_tensor *order, const struct kt_tensor *slot,
		  const struct kt_tensor *offsets, const struct kt_tensor *logits, bool norm);
int cpu_moe_matmul(struct kt_backend *be, const struct kt_tensor *y, const struct kt_tensor *x,
		   const struct kt_tensor *w, const struct kt_tensor *order,
		   const struct kt_tensor *offsets, int k, int e0);
int cpu_moe_combine(struct kt_backend *be, const struct kt_tensor *out,
		    const struct kt_tensor *y, const struct kt_tensor *w,
		    const struct kt_tensor *slot);
int cpu_comm_open(struct kt_backend *be, const struct kt_comm_spec *spec, char *err,
		  size_t errlen);
int cpu_comm_id(struct kt_backend *be, unsigned char id[KT_COMM_ID_BYTES]);
void cpu_comm_close(struct kt_backend *be);
int cpu_allreduce(struct kt_backend *be, const struct kt_tensor *x);
int cpu_conv1d(struct kt_backend *be, const struct kt_tensor *out, const struct kt_tensor *x,
	       const struct kt_tensor *w, const struct kt_tensor *state,
	       const struct kt_tensor *slot, const struct kt_batch *b);
int cpu_delta_rule(struct kt_backend *be, const struct kt_tensor *out,
		   const struct kt_tensor *qkv, const struct kt_tensor *ba,
		   const struct kt_tensor *a_log, const struct kt_tensor *dt_bias,
		   const struct kt_tensor *state, int64_t off, const struct kt_tensor *slot,
		   const struct kt_batch *b, int n_k_heads, int n_v_heads, int k_dim, int v_dim);
int cpu_rmsnorm_gated(struct kt_backend *be, const struct kt_tensor *out,
		      const struct kt_tensor *x, const struct kt_tensor *z,
		      const struct kt_tensor *w, float eps);
int cpu_sigmoid_mul(struct kt_backend *be, const struct kt_tensor *out, const struct kt_tensor *x,
		    const struct kt_tensor *g);
int cpu_sample(struct kt_backend *be, const struct kt_tensor *logits,
	       const struct kt_sample_row *rows, int n, int32_t *ids);
int cpu_draw_rows(struct kt_backend *be, const struct kt_sample_row *rows, int n, int64_t V);
int cpu_draw(struct kt_backend *be, const struct kt_tensor *logits);
int cpu_drawn(struct kt_backend *be, int32_t *ids, int n);

#endif
