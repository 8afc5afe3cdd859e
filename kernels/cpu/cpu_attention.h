/* What cpu_attention.c shares with the AMX path of cpu_attention_amx.c:
 * the step's view of a paged cache, a work item, and how items split a
 * step. Private to those two files.
 */
#ifndef ATLAS_KERNELS_CPU_ATTENTION_H
#define ATLAS_KERNELS_CPU_ATTENTION_H

#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/cpu_simd.h"

/* The step metadata, checked against the cache it addresses. */
struct kv_view {
	const int32_t *pos, *seq; /* [T] */
	const int32_t *bt;        /* [n_seqs, bt_cols] */
	int64_t bt_cols;
	int bs;                   /* block_size */
	int64_t stride;           /* cache rows from one block to the next */
	int64_t row_len;          /* cache cols: n_kv * D */
};

static inline const int32_t *seq_blocks(const struct kv_view *v, int64_t t)
{
	return v->bt + (int64_t)v->seq[t] * v->bt_cols;
}

static inline int64_t cache_row(const struct kv_view *v, const int32_t *blocks, int32_t p)
{
	return (int64_t)blocks[p / v->bs] * v->stride + p % v->bs;
}

/* Where one work item's keys and values are: the paged cache through the
 * block table (positions from .. pos[t]), or staged rows (row0 .. row0 + n). */
struct att_item {
	const struct kv_view *kv;   /* paged: the step metadata; NULL: staged rows */
	int64_t t;
	int kvh, h0, nh, D;
	float scale;
	const float *q;             /* row t of q */
	const void *kc, *vc;        /* caches (paged) or staging rows (staged) */
	bool bf16;                  /* kc and vc hold bf16 (else f32) */
	int64_t ld;                 /* floats from one cache row to the next */
	int bs;                     /* positions folded at a time */
	int32_t from, n;            /* paged: first position, and pos[t] + 1; staged: rows */
	float *m, *l;               /* [nh] the state, in the worker's scratch or ml */
	int64_t ml_stride;          /* floats between one head's m and the next's (l follows m) */
	float *acc;                 /* [nh, acc_stride] accumulators */
	int64_t acc_stride;
};

/* Where attention writes its output [T, n_heads * D]: f32, or bf16 with
 * each value rounded to nearest even as it is stored (the x of the next
 * product, as the cuda backend writes it for matmul_x_bf16); p NULL: no
 * output (attention_part). */
struct att_out {
	void *p;
	bool bf16;
};

/* out elements [off, off + D) = acc[d] * inv */
static inline void att_out_row(struct att_out o, int64_t off, const float *acc, float inv, int D)
{
	if (o.bf16) {
		uint16_t *r = (uint16_t *)o.p + off;

		for (int d = 0; d < D; d++)
			r[d] = narrow1(acc[d] * inv);
	} else {
		float *r = (float *)o.p + off;

		for (int d = 0; d < D; d++)
			r[d] = acc[d] * inv;
	}
}

/* out, given as a tensor or NULL, as att_out. */
static inline struct att_out att_out_of(const struct kt_tensor *out)
{
	return (struct att_out){ out ? out->data : NULL, out && out->dtype == KT_BF16 };
}

/* Items of T tokens: heads per item, chunks per kv head, the item count. */
struct att_split {
	int group, per, chunks;
	int64_t items;
};

/* The AMX path: a backend with bf16 caches and AMX runs all its attention
 * there when head_dim allows (cpu_attention_amx.c). */
bool cpu_attention_amx_path(const struct cpu_backend *cpu, enum kt_dtype kv, int D);

/* Where the AMX path's tokens find their keys: token t's key source is
 * id[t * stride] (tokens of one source are folded together) and it folds
 * positions [from, end[t * stride] + add); the item's kc and vc advance by
 * id * ld elements where its kv is NULL (staged rows). */
struct cpu_amx_src {
	const int32_t *id, *end;
	int stride, add;
	const int32_t *from;  /* [sources] first position; NULL: 0 */
};

/* T tokens through the AMX path: tmpl gives the source (kv, kc, vc, ld,
 * bs), D and scale. The state is st's rows (reset where empty), or (st
 * NULL) the threads' scratch, finished into out [T, qcols]. work sizes
 * the step for the thread team's threshold. */
void cpu_attention_amx_run(struct cpu_backend *cpu, const struct att_item *tmpl,
			   const struct cpu_amx_src *src, int64_t T, int n_heads, int n_kv_heads,
			   const struct kt_att_state *st, bool empty, struct att_out out,
			   const float *q, int64_t qcols, int64_t work);

#endif
