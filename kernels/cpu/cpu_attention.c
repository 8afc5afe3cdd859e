/* Paged KV cache: kv_store writes each token's k and v rows, attention reads
 * them back, both only through the block table (DESIGN §4.2).
 *
 * Layout: kcache, vcache views of n_kv * D cols, f32, whose block j starts at
 * row j * stride (kv_block_rows, or bs); position p of the sequence in slot
 * s lives in row block_tables[s][p / bs] * stride + p % bs. q, out
 * [T, n_heads * D]; head h reads kv head h / (n_heads / n_kv).
 *
 * A work item is one token and up to CPU_ATT_HEADS query heads of one GQA
 * group: each key and value row is loaded once for all of them. Two passes in
 * f32: scores for positions 0..pos[t] (4 key rows at a time) into the
 * worker's scratch, softmax with the max subtracted (sums in double), then
 * the weighted sum of value rows into scratch accumulators, divided by the
 * sum at the end. q is read whole before out is written, so out may be q.
 * A token's result depends only on its own q, position and sequence, never
 * on the rest of the batch (DESIGN §4.1).
 *
 * Threads: kv_store splits tokens, attention the work items (dynamic
 * schedule: causal rows differ in length) over the OpenMP team.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "common/err.h"
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

/* Check b for T tokens over caches kc and vc. With all_blocks, every block a
 * token's attention reads (0..pos/bs) must lie within both caches; otherwise
 * only the one its own row lands in. *keys receives the sum over tokens of
 * pos + 1. */
static int kv_view_init(struct kv_view *v, const struct kt_batch *b, int64_t T,
			const struct kt_tensor *kc, const struct kt_tensor *vc, bool all_blocks,
			int max_context, int64_t *keys)
{
	int64_t n_blocks, n_seqs;

	if (!b || b->n_tokens != T || b->block_size <= 0)
		return -EINVAL;
	if (!cpu_valid(kc, KT_F32) || !cpu_valid(vc, KT_F32) || vc->cols != kc->cols)
		return -EINVAL;
	/* None also when the stride is below block_size: blocks would overlap. */
	n_blocks = ATLAS_MIN(kt_kv_blocks(b, kc->rows), kt_kv_blocks(b, vc->rows));
	if (!n_blocks)
		return -EINVAL;
	if (!cpu_shape(&b->pos, KT_I32, T, 1) || !cpu_shape(&b->seq, KT_I32, T, 1) ||
	    !cpu_valid(&b->block_tables, KT_I32))
		return -EINVAL;
	v->pos = b->pos.data;
	v->seq = b->seq.data;
	v->bt = b->block_tables.data;
	v->bt_cols = b->block_tables.cols;
	v->bs = b->block_size;
	v->stride = kt_kv_block_rows(b);
	v->row_len = kc->cols;
	n_seqs = b->block_tables.rows;
	*keys = 0;
	for (int64_t t = 0; t < T; t++) {
		int32_t p = v->pos[t];
		const int32_t *blocks;

		if (v->seq[t] < 0 || v->seq[t] >= n_seqs || p < 0 || p >= max_context ||
		    p / v->bs >= v->bt_cols)
			return -EINVAL;
		blocks = seq_blocks(v, t);
		for (int32_t i = all_blocks ? 0 : p / v->bs; i <= p / v->bs; i++)
			if (blocks[i] < 0 || blocks[i] >= n_blocks)
				return -EINVAL;
		*keys += (int64_t)p + 1;
	}
	return 0;
}

int cpu_kv_store(struct kt_backend *be, const struct kt_tensor *kcache,
		 const struct kt_tensor *vcache, const struct kt_tensor *k,
		 const struct kt_tensor *v, const struct kt_batch *b)
{
	struct cpu_backend *cpu = cpu_of(be);
	struct kv_view kv;
	int64_t T, keys;
	int rc;

	if (!cpu_valid(k, KT_F32))
		return -EINVAL;
	T = k->rows;
	rc = kv_view_init(&kv, b, T, kcache, vcache, false, INT32_MAX, &keys);
	if (rc)
		return rc;
	if (k->cols != kv.row_len || !cpu_shape(v, KT_F32, T, kv.row_len))
		return -EINVAL;
	if (!kt_kv_apart(b, kcache, vcache) || cpu_overlap(kcache, k) || cpu_overlap(kcache, v) ||
	    cpu_overlap(vcache, k) || cpu_overlap(vcache, v))
		return -EINVAL;
#pragma omp parallel for num_threads(cpu->threads) schedule(static) if (T * kv.row_len > CPU_PAR_MIN)
	for (int64_t t = 0; t < T; t++) {
		int64_t row = cache_row(&kv, seq_blocks(&kv, t), kv.pos[t]);
		size_t bytes = (size_t)kv.row_len * sizeof(float);

		memcpy((float *)kcache->data + row * kv.row_len,
		       (const float *)k->data + t * kv.row_len, bytes);
		memcpy((float *)vcache->data + row * kv.row_len,
		       (const float *)v->data + t * kv.row_len, bytes);
	}
	return 0;
}

/* out[r] = scale * dot(q, k + r * ldk) for nr key rows. */
CPU_INLINE void score_rows(const int nr, const float *q, const float *k, int64_t ldk, int D,
			   float scale, float *out)
{
	v8f acc[4];
	int d;

#pragma GCC unroll 4
	for (int r = 0; r < nr; r++)
		acc[r] = (v8f){ 0 };
	for (d = 0; d + 8 <= D; d += 8) {
		v8f qv = load8(q + d);

#pragma GCC unroll 4
		for (int r = 0; r < nr; r++)
			acc[r] += qv * load8(k + r * ldk + d);
	}
#pragma GCC unroll 4
	for (int r = 0; r < nr; r++) {
		float s = hsum8(acc[r]);

		for (int i = d; i < D; i++)
			s += q[i] * k[r * ldk + i];
		out[r] = s * scale;
	}
}

/* acc[0..D) += sum over r of wts[r] * v[r * ldv + 0..D) for nr value rows. */
CPU_INLINE void accumulate_rows(const int nr, float *acc, const float *v, int64_t ldv, int D,
				const float *wts)
{
	int d;

	for (d = 0; d + 8 <= D; d += 8) {
		v8f a = load8(acc + d);

#pragma GCC unroll 4
		for (int r = 0; r < nr; r++)
			a += wts[r] * load8(v + r * ldv + d);
		store8(acc + d, a);
	}
	for (; d < D; d++)
		for (int r = 0; r < nr; r++)
			acc[d] += wts[r] * v[r * ldv + d];
}

/* One work item: token t, query heads h0 .. h0 + nh - 1 of kv head kvh. */
struct att_item {
	const struct kv_view *kv;
	int64_t t;
	int kvh, h0, nh, D;
	float scale;
	const float *q;  /* row t of q */
	float *out;      /* row t of out */
	const float *kc, *vc;
	int64_t max_context;
};

CPU_CLONES static void attend(const struct att_item *a, struct cpu_scratch *s)
{
	const struct kv_view *kv = a->kv;
	const int32_t *blocks = seq_blocks(kv, a->t);
	int32_t n = kv->pos[a->t] + 1, bs = kv->bs;
	int64_t off = (int64_t)a->kvh * a->D, ld = kv->row_len;
	double sum[CPU_ATT_HEADS];

	for (int32_t j0 = 0; j0 < n; j0 += bs) {
		int64_t base = (int64_t)blocks[j0 / bs] * kv->stride * ld + off;
		int32_t len = n - j0 < bs ? n - j0 : bs;

		for (int32_t r = 0; r < len; r += 4) {
			const float *k = a->kc + base + r * ld;
			int nr = len - r < 4 ? len - r : 4;

			for (int h = 0; h < a->nh; h++) {
				const float *q = a->q + (int64_t)(a->h0 + h) * a->D;
				float *sc = s->scores + h * a->max_context + j0 + r;

				switch (nr) {
				case 4: score_rows(4, q, k, ld, a->D, a->scale, sc); break;
				case 3: score_rows(3, q, k, ld, a->D, a->scale, sc); break;
				case 2: score_rows(2, q, k, ld, a->D, a->scale, sc); break;
				default: score_rows(1, q, k, ld, a->D, a->scale, sc); break;
				}
			}
		}
	}
	for (int h = 0; h < a->nh; h++) {
		float *sc = s->scores + h * a->max_context, m = -INFINITY;

		for (int32_t j = 0; j < n; j++)
			m = sc[j] > m ? sc[j] : m;
		sum[h] = 0.0;
		for (int32_t j = 0; j < n; j++) {
			sc[j] = expf(sc[j] - m);
			sum[h] += sc[j];
		}
		memset(s->acc + h * a->D, 0, (size_t)a->D * sizeof(float));
	}
	for (int32_t j0 = 0; j0 < n; j0 += bs) {
		int64_t base = (int64_t)blocks[j0 / bs] * kv->stride * ld + off;
		int32_t len = n - j0 < bs ? n - j0 : bs;

		for (int32_t r = 0; r < len; r += 4) {
			const float *v = a->vc + base + r * ld;
			int nr = len - r < 4 ? len - r : 4;

			for (int h = 0; h < a->nh; h++) {
				float *acc = s->acc + h * a->D;
				const float *w = s->scores + h * a->max_context + j0 + r;

				switch (nr) {
				case 4: accumulate_rows(4, acc, v, ld, a->D, w); break;
				case 3: accumulate_rows(3, acc, v, ld, a->D, w); break;
				case 2: accumulate_rows(2, acc, v, ld, a->D, w); break;
				default: accumulate_rows(1, acc, v, ld, a->D, w); break;
				}
			}
		}
	}
	for (int h = 0; h < a->nh; h++) {
		float inv = (float)(1.0 / sum[h]), *out = a->out + (int64_t)(a->h0 + h) * a->D;

		for (int d = 0; d < a->D; d++)
			out[d] = s->acc[h * a->D + d] * inv;
	}
}

int cpu_attention(struct kt_backend *be, const struct kt_tensor *out, const struct kt_tensor *q,
		  const struct kt_tensor *kcache, const struct kt_tensor *vcache,
		  const struct kt_batch *b, int n_heads, int n_kv_heads, int head_dim, float scale)
{
	struct cpu_backend *cpu = cpu_of(be);
	struct kv_view kv;
	int64_t T, keys, items;
	int group, per, chunks;
	int rc;

	if (n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads || head_dim <= 0 ||
	    head_dim > cpu->max_head_dim || !isfinite(scale))
		return -EINVAL;
	group = n_heads / n_kv_heads;
	if (!cpu_valid(q, KT_F32) || q->cols != (int64_t)n_heads * head_dim)
		return -EINVAL;
	T = q->rows;
	if (!cpu_shape(out, KT_F32, T, q->cols) || (out->data != q->data && cpu_overlap(out, q)))
		return -EINVAL;
	rc = kv_view_init(&kv, b, T, kcache, vcache, true, cpu->max_context, &keys);
	if (rc)
		return rc;
	if (kv.row_len != (int64_t)n_kv_heads * head_dim || cpu_overlap(out, kcache) ||
	    cpu_overlap(out, vcache))
		return -EINVAL;
	/* Fewer heads per item when there would be fewer items than threads (a
	 * lone decode token): each head's arithmetic is the same either way. */
	per = CPU_ATT_HEADS;
	while (per > 1 && T * n_kv_heads * ((group + per - 1) / per) < cpu->threads)
		per = (per + 1) / 2;
	chunks = (group + per - 1) / per;
	items = T * n_kv_heads * chunks;
#pragma omp parallel for num_threads(cpu->threads) schedule(dynamic, 1) \
	if (keys * n_heads * head_dim > CPU_PAR_MIN)
	for (int64_t it = 0; it < items; it++) {
		int64_t t = it / ((int64_t)n_kv_heads * chunks);
		int rest = (int)(it % ((int64_t)n_kv_heads * chunks));
		int kvh = rest / chunks, c = rest % chunks;
		struct att_item a = {
			.kv = &kv, .t = t, .kvh = kvh, .h0 = kvh * group + c * per,
			.nh = ATLAS_MIN(per, group - c * per), .D = head_dim,
			.scale = scale, .q = (const float *)q->data + t * q->cols,
			.out = (float *)out->data + t * q->cols, .kc = kcache->data,
			.vc = vcache->data, .max_context = cpu->max_context,
		};

		attend(&a, cpu_scratch_self(cpu));
	}
	return 0;
}
