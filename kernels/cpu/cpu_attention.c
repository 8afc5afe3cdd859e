/* Paged KV cache: kv_store writes each token's k and v rows, attention reads
 * them back, both only through the block table (DESIGN §4.2).
 *
 * Layout: kcache, vcache views of n_kv * D cols, f32 (or bf16 under
 * cpu_precision bf16: kv_store rounds to nearest even, attention widens
 * exactly in registers; half the bytes a long context reads), whose block j starts at
 * row j * stride (kv_block_rows, or bs); position p of the sequence in slot
 * s lives in row block_tables[s][p / bs] * stride + p % bs. q, out
 * [T, n_heads * D]; head h reads kv head h / (n_heads / n_kv).
 *
 * A work item is one token and up to CPU_ATT_HEADS query heads of one GQA
 * group: each key and value row is loaded once for all of them. The keys go
 * a block (block_size positions) at a time, in position order, through an
 * online softmax in f32: scores of the block (4 key rows at a time) into the
 * worker's scratch; the running max m rises to the block's, the sum l and
 * the accumulator acc are scaled by exp(m_old - m_new); the block's
 * exp(score - m) are added to l and, weighting its value rows, to acc. The
 * output is acc * (1 / l). With bf16 caches (the fast path) two heads of
 * the group share each widened key and value row, the scores sum in one
 * reduction tree and the weights come from a vector exp
 * (cpu_attention_bf16.h); where the backend has AMX and head_dim allows,
 * bf16 caches go to the tiles of cpu_attention_amx.c instead, several
 * tokens of a prompt together. f32 caches keep the arithmetic above, the
 * reference. out is f32, or bf16 rounded to nearest even as stored (the
 * x of the next product). q is read whole before out is written, so an f32
 * out may be q. A token's result depends only on its own q, position and
 * sequence, never on the rest of the batch (DESIGN §4.1).
 *
 * attention is the fold of positions 0..pos[t] and the finish; the parts
 * ops (backend.h) run the same fold over part of the positions and keep
 * (m, l, acc) in a state tensor between calls. Since every part starts at a
 * block boundary, splitting a context into parts folds the same blocks in
 * the same order with the same arithmetic: the result is bitwise that of
 * one attention call, which is what makes a context streamed through
 * staging (the swap tier) give the same tokens as one on the device.
 *
 * Threads: kv_store splits tokens, attention the work items (dynamic
 * schedule: causal rows differ in length) over the OpenMP team.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "common/err.h"
#include "kernels/cpu/cpu_attention.h"
#include "kernels/cpu/cpu_attention_bf16.h"
#include "kernels/cpu/cpu_simd.h"

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
	if (!kc || (kc->dtype != KT_F32 && kc->dtype != KT_BF16) || !cpu_valid(kc, kc->dtype) ||
	    !cpu_valid(vc, kc->dtype) || vc->cols != kc->cols)
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
		const float *ks = (const float *)k->data + t * kv.row_len;
		const float *vs = (const float *)v->data + t * kv.row_len;

		if (kcache->dtype == KT_BF16) {
			uint16_t *kd = (uint16_t *)kcache->data + row * kv.row_len;
			uint16_t *vd = (uint16_t *)vcache->data + row * kv.row_len;

			for (int64_t i = 0; i < kv.row_len; i++) {
				kd[i] = narrow1(ks[i]);
				vd[i] = narrow1(vs[i]);
			}
			continue;
		}
		memcpy((float *)kcache->data + row * kv.row_len, ks,
		       (size_t)kv.row_len * sizeof(float));
		memcpy((float *)vcache->data + row * kv.row_len, vs,
		       (size_t)kv.row_len * sizeof(float));
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

/* Fold len (<= bs) key rows k and value rows v (ld elements apart, f32 or
 * bf16) into the state of the item's heads. sc: scratch for nh * bs scores. */
CPU_INLINE void fold_block(const struct att_item *a, const void *k, const void *v,
			   const bool bf16, int32_t len, float *sc)
{
	const int64_t ld = a->ld;

	for (int32_t r = 0; bf16 && r < len; r += 4) {
		const int nr = len - r < 4 ? len - r : 4;
		const uint16_t *kr = (const uint16_t *)k + r * ld;

		for (int h = 0; h < a->nh; h += 2) {
			const int nq = a->nh - h < 2 ? a->nh - h : 2;
			const float *q = a->q + (int64_t)(a->h0 + h) * a->D;
			float *out = sc + h * a->bs + r;

			TILE_CASES(score_tile, nr, nq, q, q + a->D, kr, ld, a->D, a->scale, out,
				   out + a->bs)
		}
	}
	for (int32_t r = 0; !bf16 && r < len; r += 4) {
		int nr = len - r < 4 ? len - r : 4;

		for (int h = 0; h < a->nh; h++) {
			const float *q = a->q + (int64_t)(a->h0 + h) * a->D;
			const float *kr = (const float *)k + r * ld;
			float *out = sc + h * a->bs + r;

			switch (nr) {
			case 4: score_rows(4, q, kr, ld, a->D, a->scale, out); break;
			case 3: score_rows(3, q, kr, ld, a->D, a->scale, out); break;
			case 2: score_rows(2, q, kr, ld, a->D, a->scale, out); break;
			default: score_rows(1, q, kr, ld, a->D, a->scale, out); break;
			}
		}
	}
	for (int h = 0; h < a->nh; h++) {
		float *w = sc + h * a->bs, *acc = a->acc + h * a->acc_stride;
		float *m = a->m + h * a->ml_stride, *l = a->l + h * a->ml_stride;
		float m_new = *m, corr, sum = 0.0f;

		for (int32_t j = 0; j < len; j++)
			m_new = w[j] > m_new ? w[j] : m_new;
		corr = *m == -INFINITY ? 0.0f : expf(*m - m_new);
		if (bf16)
			exp_block(w, len, m_new);
		for (int32_t j = 0; j < len; j++) {
			if (!bf16)
				w[j] = expf(w[j] - m_new);
			sum += w[j];
		}
		*m = m_new;
		*l = *l * corr + sum;
		for (int d = 0; d < a->D; d++)
			acc[d] *= corr;
		for (int32_t r = 0; !bf16 && r < len; r += 4) {
			int nr = len - r < 4 ? len - r : 4;
			const float *vr = (const float *)v + r * ld;

			switch (nr) {
			case 4: accumulate_rows(4, acc, vr, ld, a->D, w + r); break;
			case 3: accumulate_rows(3, acc, vr, ld, a->D, w + r); break;
			case 2: accumulate_rows(2, acc, vr, ld, a->D, w + r); break;
			default: accumulate_rows(1, acc, vr, ld, a->D, w + r); break;
			}
		}
	}
	/* bf16: every head's weights first, then each value row once for two heads */
	for (int32_t r = 0; bf16 && r < len; r += 4) {
		const int nr = len - r < 4 ? len - r : 4;
		const uint16_t *vr = (const uint16_t *)v + r * ld;

		for (int h = 0; h < a->nh; h += 2) {
			const int nq = a->nh - h < 2 ? a->nh - h : 2;
			float *acc = a->acc + h * a->acc_stride, *w = sc + h * a->bs + r;

			TILE_CASES(acc_tile, nr, nq, acc, acc + a->acc_stride, vr, ld, a->D, w,
				   w + a->bs)
		}
	}
}

/* fold_block, compiled for f32 and for bf16 rows (each with its clones). */
CPU_CLONES static void fold_block_f32(const struct att_item *a, const void *k, const void *v,
				      int32_t len, float *sc)
{
	fold_block(a, k, v, false, len, sc);
}

CPU_CLONES static void fold_block_bf16(const struct att_item *a, const void *k, const void *v,
				       int32_t len, float *sc)
{
	fold_block(a, k, v, true, len, sc);
}

/* Fold the item's positions, a block at a time. */
static void fold(const struct att_item *a, struct cpu_scratch *s)
{
	const int64_t off = (int64_t)a->kvh * a->D;
	const size_t es = a->bf16 ? sizeof(uint16_t) : sizeof(float);

	for (int32_t j0 = a->from; j0 < a->n; j0 += a->bs) {
		const int32_t len = a->n - j0 < a->bs ? a->n - j0 : a->bs;
		int64_t base = j0 * a->ld + off;
		const char *k, *v;

		if (a->kv)
			base = (int64_t)seq_blocks(a->kv, a->t)[j0 / a->bs] * a->kv->stride * a->ld + off;
		k = (const char *)a->kc + (size_t)base * es;
		v = (const char *)a->vc + (size_t)base * es;
		if (a->bf16)
			fold_block_bf16(a, k, v, len, s->scores);
		else
			fold_block_f32(a, k, v, len, s->scores);
	}
}

static void state_empty(const struct att_item *a)
{
	for (int h = 0; h < a->nh; h++) {
		a->m[h * a->ml_stride] = -INFINITY;
		a->l[h * a->ml_stride] = 0.0f;
		memset(a->acc + h * a->acc_stride, 0, (size_t)a->D * sizeof(float));
	}
}

/* The row of out at element row0, head h0 + h = acc / l, for the item's heads. */
static void finish_heads(const struct att_item *a, struct att_out out, int64_t row0)
{
	for (int h = 0; h < a->nh; h++)
		att_out_row(out, row0 + (int64_t)(a->h0 + h) * a->D, a->acc + h * a->acc_stride,
			    1.0f / a->l[h * a->ml_stride], a->D);
}

/* out (NULL: none) is f32 or bf16 [T, cols]; an f32 out may be `alias`
 * itself, a bf16 one is apart from it. */
static bool out_ok(const struct kt_tensor *out, int64_t T, int64_t cols,
		   const struct kt_tensor *alias)
{
	if (!out)
		return true;
	if ((out->dtype != KT_F32 && out->dtype != KT_BF16) || !cpu_shape(out, out->dtype, T, cols))
		return false;
	return !((out->dtype == KT_BF16 || out->data != alias->data) && cpu_overlap(out, alias));
}

static struct att_split att_split(const struct cpu_backend *cpu, int64_t T, int n_heads,
				  int n_kv_heads)
{
	struct att_split p = { .group = n_heads / n_kv_heads, .per = CPU_ATT_HEADS };

	/* Fewer heads per item when there would be fewer items than threads (a
	 * lone decode token): each head's arithmetic is the same either way. */
	while (p.per > 1 && T * n_kv_heads * ((p.group + p.per - 1) / p.per) < cpu->threads)
		p.per = (p.per + 1) / 2;
	p.chunks = (p.group + p.per - 1) / p.per;
	p.items = T * n_kv_heads * p.chunks;
	return p;
}

/* Item it's token, kv head and heads. */
static void att_place(struct att_item *a, const struct att_split *p, int64_t it, int n_kv_heads)
{
	const int rest = (int)(it % ((int64_t)n_kv_heads * p->chunks));
	const int c = rest % p->chunks;

	a->t = it / ((int64_t)n_kv_heads * p->chunks);
	a->kvh = rest / p->chunks;
	a->h0 = a->kvh * p->group + c * p->per;
	a->nh = ATLAS_MIN(p->per, p->group - c * p->per);
}

/* The item's state: the worker's scratch (alone), or rows of st. */
static void att_state_at(struct att_item *a, const struct kt_att_state *st, struct cpu_scratch *s)
{
	if (!st) {
		a->m = s->ml;
		a->l = s->ml + 1;
		a->ml_stride = 2;
		a->acc = s->acc;
		a->acc_stride = a->D;
		return;
	}
	a->m = (float *)st->ml.data + a->t * st->ml.cols + 2 * a->h0;
	a->l = a->m + 1;
	a->ml_stride = 2;
	a->acc = (float *)st->acc.data + a->t * st->acc.cols + (int64_t)a->h0 * a->D;
	a->acc_stride = a->D;
}

static int check_heads(const struct cpu_backend *cpu, const struct kt_tensor *q, int n_heads,
		       int n_kv_heads, int head_dim, float scale)
{
	if (n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads || head_dim <= 0 ||
	    head_dim > cpu->max_head_dim || !isfinite(scale))
		return -EINVAL;
	if (!cpu_valid(q, KT_F32) || q->cols != (int64_t)n_heads * head_dim)
		return -EINVAL;
	return 0;
}

static int check_state(const struct kt_att_state *st, const struct kt_tensor *q, int n_heads)
{
	if (!st || !cpu_shape(&st->acc, KT_F32, q->rows, q->cols) ||
	    !cpu_shape(&st->ml, KT_F32, q->rows, 2 * (int64_t)n_heads) ||
	    cpu_overlap(&st->acc, &st->ml) || cpu_overlap(&st->acc, q) || cpu_overlap(&st->ml, q))
		return -EINVAL;
	return 0;
}

/* attention (out) or attention_part (st): the fold of from[seq[t]] .. pos[t]. */
static int paged(struct kt_backend *be, const struct kt_tensor *out,
		 const struct kt_att_state *st, const struct kt_tensor *q,
		 const struct kt_tensor *kcache, const struct kt_tensor *vcache,
		 const struct kt_batch *b, const struct kt_tensor *from, int n_heads,
		 int n_kv_heads, int head_dim, float scale, bool first)
{
	struct cpu_backend *cpu = cpu_of(be);
	struct kv_view kv;
	int64_t T, keys;
	int rc;

	if ((rc = check_heads(cpu, q, n_heads, n_kv_heads, head_dim, scale)))
		return rc;
	T = q->rows;
	if (!out_ok(out, T, q->cols, q))
		return -EINVAL;
	if (st && (rc = check_state(st, q, n_heads)))
		return rc;
	rc = kv_view_init(&kv, b, T, kcache, vcache, true, cpu->max_context, &keys);
	if (rc)
		return rc;
	if (kv.row_len != (int64_t)n_kv_heads * head_dim || (out && cpu_overlap(out, kcache)) ||
	    (out && cpu_overlap(out, vcache)) || kv.bs > cpu->max_context)
		return -EINVAL;
	if (from && !cpu_shape(from, KT_I32, b->block_tables.rows, 1))
		return -EINVAL;
	for (int64_t t = 0; from && t < T; t++) {
		const int32_t f = ((const int32_t *)from->data)[kv.seq[t]];

		if (f < 0 || f % kv.bs)
			return -EINVAL;
	}
	if (cpu_attention_amx_path(cpu, kcache->dtype, head_dim)) {
		const struct att_item a = { .kv = &kv, .D = head_dim, .scale = scale,
					    .kc = kcache->data, .vc = vcache->data, .bf16 = true,
					    .ld = kv.row_len, .bs = kv.bs };
		const struct cpu_amx_src src = { .id = kv.seq, .end = kv.pos, .stride = 1, .add = 1,
					     .from = from ? from->data : NULL };

		cpu_attention_amx_run(cpu, &a, &src, T, n_heads, n_kv_heads, st, first,
				      att_out_of(out), q->data, q->cols,
				      keys * n_heads * head_dim);
		return 0;
	}
	const struct att_split p = att_split(cpu, T, n_heads, n_kv_heads);
#pragma omp parallel for num_threads(cpu->threads) schedule(dynamic, 1) \
	if (keys * n_heads * head_dim > CPU_PAR_MIN)
	for (int64_t it = 0; it < p.items; it++) {
		struct cpu_scratch *s = cpu_scratch_self(cpu);
		struct att_item a = {
			.kv = &kv, .D = head_dim, .scale = scale, .kc = kcache->data,
			.vc = vcache->data, .bf16 = kcache->dtype == KT_BF16, .ld = kv.row_len,
			.bs = kv.bs,
		};

		att_place(&a, &p, it, n_kv_heads);
		a.q = (const float *)q->data + a.t * q->cols;
		a.from = from ? ((const int32_t *)from->data)[kv.seq[a.t]] : 0;
		a.n = kv.pos[a.t] + 1;
		att_state_at(&a, st, s);
		if (first || !st)
			state_empty(&a);
		fold(&a, s);
		if (out)
			finish_heads(&a, att_out_of(out), a.t * q->cols);
	}
	return 0;
}

int cpu_attention(struct kt_backend *be, const struct kt_tensor *out, const struct kt_tensor *q,
		  const struct kt_tensor *kcache, const struct kt_tensor *vcache,
		  const struct kt_batch *b, int n_heads, int n_kv_heads, int head_dim, float scale)
{
	if (!out)
		return -EINVAL;
	return paged(be, out, NULL, q, kcache, vcache, b, NULL, n_heads, n_kv_heads, head_dim,
		     scale, true);
}

int cpu_attention_part(struct kt_backend *be, const struct kt_att_state *st,
		       const struct kt_tensor *q, const struct kt_tensor *kcache,
		       const struct kt_tensor *vcache, const struct kt_batch *b,
		       const struct kt_tensor *from, int n_heads, int n_kv_heads, int head_dim,
		       float scale, bool first)
{
	if (!st || !from)
		return -EINVAL;
	return paged(be, NULL, st, q, kcache, vcache, b, from, n_heads, n_kv_heads, head_dim,
		     scale, first);
}

int cpu_attention_staged(struct kt_backend *be, const struct kt_att_state *st,
			 const struct kt_tensor *q, const struct kt_tensor *ks,
			 const struct kt_tensor *vs, const struct kt_tensor *span, int block_size,
			 int n_heads, int n_kv_heads, int head_dim, float scale, bool first)
{
	struct cpu_backend *cpu = cpu_of(be);
	const int32_t *sp;
	int64_t T, keys = 0;
	int rc;

	if ((rc = check_heads(cpu, q, n_heads, n_kv_heads, head_dim, scale)) ||
	    (rc = check_state(st, q, n_heads)))
		return rc;
	T = q->rows;
	if (block_size <= 0 || block_size > cpu->max_context || !ks ||
	    (ks->dtype != KT_F32 && ks->dtype != KT_BF16) || !cpu_valid(ks, ks->dtype) ||
	    !cpu_shape(vs, ks->dtype, ks->rows, ks->cols) ||
	    ks->cols != (int64_t)n_kv_heads * head_dim || !cpu_shape(span, KT_I32, T, 2))
		return -EINVAL;
	sp = span->data;
	for (int64_t t = 0; t < T; t++) {
		if (sp[2 * t] < 0 || sp[2 * t + 1] < 0 || sp[2 * t] > ks->rows - sp[2 * t + 1])
			return -EINVAL;
		keys += sp[2 * t + 1];
	}
	if (cpu_attention_amx_path(cpu, ks->dtype, head_dim)) {
		const struct att_item a = { .D = head_dim, .scale = scale, .kc = ks->data,
					    .vc = vs->data, .bf16 = true, .ld = ks->cols,
					    .bs = block_size };
		const struct cpu_amx_src src = { .id = sp, .end = sp + 1, .stride = 2 };

		cpu_attention_amx_run(cpu, &a, &src, T, n_heads, n_kv_heads, st, first,
				      att_out_of(NULL), q->data, q->cols, keys * n_heads * head_dim);
		return 0;
	}
	const struct att_split p = att_split(cpu, T, n_heads, n_kv_heads);
#pragma omp parallel for num_threads(cpu->threads) schedule(dynamic, 1) \
	if (keys * n_heads * head_dim > CPU_PAR_MIN)
	for (int64_t it = 0; it < p.items; it++) {
		struct cpu_scratch *s = cpu_scratch_self(cpu);
		const size_t es = kt_dtype_size(ks->dtype);
		struct att_item a = { .D = head_dim, .scale = scale, .ld = ks->cols, .bs = block_size,
				      .bf16 = ks->dtype == KT_BF16 };

		att_place(&a, &p, it, n_kv_heads);
		a.q = (const float *)q->data + a.t * q->cols;
		/* Rows row0 .. row0 + n, addressed from row0. */
		a.kc = (const char *)ks->data + (size_t)((int64_t)sp[2 * a.t] * ks->cols) * es;
		a.vc = (const char *)vs->data + (size_t)((int64_t)sp[2 * a.t] * vs->cols) * es;
		a.from = 0;
		a.n = sp[2 * a.t + 1];
		att_state_at(&a, st, s);
		if (first)
			state_empty(&a);
		fold(&a, s);
	}
	return 0;
}

int cpu_attention_finish(struct kt_backend *be, const struct kt_tensor *out,
			 const struct kt_att_state *st, int n_heads, int head_dim)
{
	struct cpu_backend *cpu = cpu_of(be);
	int64_t T;

	if (!st || n_heads <= 0 || head_dim <= 0 || !out || out->rows < 0)
		return -EINVAL;
	T = out->rows;
	/* An f32 out may be acc itself: each value is read before it is written. */
	if (!out_ok(out, T, (int64_t)n_heads * head_dim, &st->acc) ||
	    !cpu_shape(&st->acc, KT_F32, T, out->cols) ||
	    !cpu_shape(&st->ml, KT_F32, T, 2 * (int64_t)n_heads) || cpu_overlap(&st->ml, out))
		return -EINVAL;
#pragma omp parallel for num_threads(cpu->threads) schedule(static) \
	if (T * out->cols > CPU_PAR_MIN)
	for (int64_t t = 0; t < T; t++) {
		struct att_item a = { .t = t, .h0 = 0, .nh = n_heads, .D = head_dim };

		att_state_at(&a, st, NULL);
		finish_heads(&a, att_out_of(out), t * out->cols);
	}
	return 0;
}
