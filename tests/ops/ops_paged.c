/* The paged KV world of the attention and graph cases (see ops_paged.h). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "tests/ops/ops_paged.h"

enum kt_dtype paged_kv_dtype(const struct paged_params *p, const struct op_backend *b)
{
	return p->kv == KV_F32 ? KT_F32 : b->be->info.kv_dtype;
}

static struct paged_tokens tokens_alloc(struct op_run *r, int T)
{
	struct paged_tokens t = { .T = T };

	t.seq = op_ints(r, (size_t)T);
	t.pos = op_ints(r, (size_t)T);
	t.slot = op_ints(r, (size_t)T);
	t.segs = op_alloc(r, PAGED_MAX_SEQS * sizeof(*t.segs));
	return t;
}

static void token_set(const struct paged_world *w, struct paged_tokens *t, int i, int s, int p)
{
	t->seq[i] = s;
	t->pos[i] = p;
	t->slot[i] = w->slot[s];
}

/* The history (or the step's) positions of every sequence, shuffled, in
 * chunks of at most `chunk` tokens without a step shape. */
static int plain_chunks(struct op_run *r, const struct paged_world *w, bool history, int chunk,
			struct paged_tokens **out)
{
	const struct paged_params *p = w->p;
	int n = 0, k = 0, n_chunks;
	int32_t *order;

	for (int s = 0; s < p->n_seqs; s++)
		n += history ? p->seqs[s].hist : p->seqs[s].step;
	order = op_ints(r, (size_t)n + 1);
	for (int s = 0; s < p->n_seqs; s++)
		for (int i = 0; i < (history ? p->seqs[s].hist : p->seqs[s].step); i++)
			order[k++] = s << 16 | (history ? i : p->seqs[s].hist + i);
	op_shuffle(r, order, n);
	n_chunks = (n + chunk - 1) / chunk;
	*out = op_alloc(r, (size_t)(n_chunks + 1) * sizeof(**out));
	for (int c = 0; c < n_chunks; c++) {
		int T = n - c * chunk < chunk ? n - c * chunk : chunk;

		(*out)[c] = tokens_alloc(r, T);
		for (int i = 0; i < T; i++) {
			int32_t e = order[c * chunk + i];

			token_set(w, &(*out)[c], i, e >> 16, e & 0xffff);
		}
	}
	return n_chunks;
}

/* The step as the engine gives it: decode rows (shuffled), then one segment
 * per multi-token sequence (shuffled order); or with all_decode, every
 * sequence's tokens as decode rows, sequences in shuffled order. */
static struct paged_tokens shaped_step(struct op_run *r, const struct paged_world *w,
				       bool all_decode)
{
	const struct paged_params *p = w->p;
	int32_t order[PAGED_MAX_SEQS];
	struct paged_tokens t;
	int T = 0;

	for (int s = 0; s < p->n_seqs; s++)
		T += p->seqs[s].step;
	t = tokens_alloc(r, T);
	t.T = 0;
	for (int s = 0; s < p->n_seqs; s++)
		order[s] = s;
	op_shuffle(r, order, p->n_seqs);
	for (int i = 0; i < p->n_seqs; i++) {
		const struct paged_seq *q = &p->seqs[order[i]];

		if (q->step == 1 || (all_decode && q->step > 1))
			for (int j = 0; j < q->step; j++)
				token_set(w, &t, t.T++, order[i], q->hist + j);
	}
	t.n_single = t.T;
	op_shuffle(r, order, p->n_seqs);
	for (int i = 0; i < p->n_seqs; i++) {
		const struct paged_seq *q = &p->seqs[order[i]];

		if (q->step < 2 || all_decode)
			continue;
		t.segs[t.n_segments++] = (struct kt_segment){ .row = t.T, .n_rows = q->step,
							      .pos0 = q->hist,
							      .seq = w->slot[order[i]] };
		for (int j = 0; j < q->step; j++)
			token_set(w, &t, t.T++, order[i], q->hist + j);
	}
	return t;
}

void paged_build(struct op_run *r, struct paged_world *w, const struct paged_params *p,
		 const struct op_backend *target)
{
	int32_t *perm, rows[PAGED_MAX_SEQS + 2];
	int next = 0;

	memset(w, 0, sizeof(*w));
	w->p = p;
	w->target_kv = paged_kv_dtype(p, target);
	w->tol_min = w->target_kv == KT_BF16 && target->be->info.att_p_bf16 ? 5e-3 : 0.0;
	w->C = p->n_kv * p->D;
	w->QC = p->n_heads * p->D;
	w->n_slots = p->n_seqs + 2; /* two rows of -1 that no token uses */
	for (int s = 0; s < p->n_seqs; s++) {
		int blocks;

		w->len[s] = p->seqs[s].hist + p->seqs[s].step;
		blocks = (w->len[s] + p->bs - 1) / p->bs;
		w->bt_cols = blocks + 1 > w->bt_cols ? blocks + 1 : w->bt_cols;
		w->n_blocks += blocks;
	}
	w->n_blocks += 3; /* never used: must stay poisoned */
	perm = op_ints(r, (size_t)w->n_blocks);
	for (int i = 0; i < w->n_blocks; i++)
		perm[i] = i;
	op_shuffle(r, perm, w->n_blocks);
	for (int i = 0; i < w->n_slots; i++)
		rows[i] = i;
	op_shuffle(r, rows, w->n_slots);
	w->table = op_ints(r, (size_t)w->n_slots * w->bt_cols);
	for (int i = 0; i < w->n_slots * w->bt_cols; i++)
		w->table[i] = -1;
	for (int s = 0; s < p->n_seqs; s++) {
		size_t n = (size_t)w->len[s] * w->C;

		w->slot[s] = rows[s];
		for (int b = 0; b * p->bs < w->len[s]; b++)
			w->table[w->slot[s] * w->bt_cols + b] = perm[next++];
		w->k[s] = op_floats(r, n);
		w->v[s] = op_floats(r, n);
		op_fill(r, w->k[s], n, p->kmag);
		op_fill(r, w->v[s], n, 1.0f);
		w->k_f32[s] = op_dup(r, w->k[s], n * sizeof(float));
		w->v_f32[s] = op_dup(r, w->v[s], n * sizeof(float));
		if (w->target_kv == KT_BF16) {
			op_round_bf16(w->k_f32[s], n);
			op_round_bf16(w->v_f32[s], n);
		}
	}
	w->n_hist = plain_chunks(r, w, true, OP_MAX_TOKENS, &w->hist);
	if (p->shape != SHAPE_PLAIN) {
		w->step = shaped_step(r, w, p->shape == SHAPE_DECODE_ROWS);
	} else {
		struct paged_tokens *chunks;

		plain_chunks(r, w, false, 1 << 20, &chunks);
		w->step = chunks[0];
	}
	w->q = op_floats(r, (size_t)w->step.T * w->QC);
	op_fill(r, w->q, (size_t)w->step.T * w->QC, p->qmag);
	if (w->target_kv == KT_BF16)
		op_round_bf16(w->q, (size_t)w->step.T * w->QC);
	w->scale = 1.0f / sqrtf((float)p->D);
}

/* Rows of one block of the block-major allocation. */
static int block_rows(const struct paged_params *p)
{
	return p->layers * 2 * p->bs;
}

struct paged_dev paged_setup(struct op_run *r, const struct op_backend *b,
			     const struct paged_world *w)
{
	const struct paged_params *p = w->p;
	struct paged_dev d = { .kv = paged_kv_dtype(p, b) };

	if (p->layers) {
		const int64_t rows = (int64_t)w->n_blocks * block_rows(p);
		const int64_t k0 = (int64_t)p->layer * 2 * p->bs, v0 = k0 + p->bs;

		d.block_rows = block_rows(p);
		d.all = op_tensor(r, b, d.kv, rows, w->C, NULL);
		d.kc = kt_rows(d.all, k0, rows - k0);
		d.vc = kt_rows(d.all, v0, rows - v0);
	} else {
		d.kc = op_tensor(r, b, d.kv, (int64_t)w->n_blocks * p->bs, w->C, NULL);
		d.vc = op_tensor(r, b, d.kv, (int64_t)w->n_blocks * p->bs, w->C, NULL);
	}
	d.table = op_tensor_raw(r, b, KT_I32, w->n_slots, w->bt_cols, w->table);
	return d;
}

size_t paged_snapshot_rows(const struct paged_world *w)
{
	const struct paged_params *p = w->p;

	return (size_t)w->n_blocks * (size_t)(p->layers ? block_rows(p) : 2 * p->bs);
}

size_t paged_snapshot_row(const struct paged_world *w, bool is_v, int32_t block, int off)
{
	const struct paged_params *p = w->p;

	if (p->layers)
		return (size_t)block * (size_t)block_rows(p) +
		       (size_t)(p->layer * 2 + is_v) * (size_t)p->bs + (size_t)off;
	return (is_v ? (size_t)w->n_blocks * p->bs : 0) + (size_t)block * p->bs + (size_t)off;
}

float *paged_snapshot(struct op_run *r, const struct op_backend *b, const struct paged_world *w,
		      const struct paged_dev *d)
{
	const size_t half = (size_t)w->n_blocks * w->p->bs * w->C;
	float *all;

	if (w->p->layers)
		return op_get(r, b, &d->all);
	all = op_floats(r, 2 * half);
	memcpy(all, op_get(r, b, &d->kc), half * sizeof(float));
	memcpy(all + half, op_get(r, b, &d->vc), half * sizeof(float));
	return all;
}

int paged_max_len(const struct paged_tokens *tok)
{
	int m = 0;

	for (int t = 0; t < tok->T; t++)
		m = tok->pos[t] + 1 > m ? tok->pos[t] + 1 : m;
	return m;
}

struct kt_batch paged_batch(struct op_run *r, const struct op_backend *b,
			    const struct paged_world *w, const struct paged_dev *d,
			    const struct paged_tokens *tok, int max_kv_len)
{
	return (struct kt_batch){
		.n_tokens = tok->T, .block_size = w->p->bs, .kv_block_rows = d->block_rows,
		.max_kv_len = max_kv_len,
		.pos = op_tensor_raw(r, b, KT_I32, tok->T, 1, tok->pos),
		.seq = op_tensor_raw(r, b, KT_I32, tok->T, 1, tok->slot),
		.block_tables = d->table, .n_single = tok->n_single,
		.n_segments = tok->n_segments, .segments = tok->segs,
	};
}

void paged_rows(struct op_run *r, const struct paged_world *w, enum kt_dtype kv,
		const struct paged_tokens *tok, float **k, float **v)
{
	size_t n = (size_t)tok->T * w->C, row = (size_t)w->C * sizeof(float);

	*k = op_floats(r, n);
	*v = op_floats(r, n);
	for (int t = 0; t < tok->T; t++) {
		int s = tok->seq[t];
		size_t at = (size_t)tok->pos[t] * w->C;

		memcpy(*k + (size_t)t * w->C, (kv == KT_F32 ? w->k_f32[s] : w->k[s]) + at, row);
		memcpy(*v + (size_t)t * w->C, (kv == KT_F32 ? w->v_f32[s] : w->v[s]) + at, row);
	}
}

int paged_store(struct op_run *r, const struct op_backend *b, const struct paged_world *w,
		const struct paged_dev *d, const struct paged_tokens *tok)
{
	struct kt_batch batch = paged_batch(r, b, w, d, tok, paged_max_len(tok));
	struct kt_tensor kt, vt;
	float *k, *v;

	paged_rows(r, w, d->kv, tok, &k, &v);
	kt = op_tensor(r, b, KT_F32, tok->T, w->C, k);
	vt = op_tensor(r, b, KT_F32, tok->T, w->C, v);
	return kt_kv_store(b->be, &d->kc, &d->vc, &kt, &vt, &batch);
}

int paged_store_all(struct op_run *r, const struct op_backend *b, const struct paged_world *w,
		    const struct paged_dev *d)
{
	int rc = 0;

	for (int c = 0; c < w->n_hist && !rc; c++)
		rc = paged_store(r, b, w, d, &w->hist[c]);
	return rc ? rc : paged_store(r, b, w, d, &w->step);
}

void paged_check_caches(struct op_run *r, const struct paged_world *w, const float *snap,
			bool upto_step, const char *when)
{
	const struct paged_params *p = w->p;
	size_t rows = paged_snapshot_rows(w), row = (size_t)w->C * sizeof(float);
	size_t wrong = 0, written = 0;
	char *hit = op_alloc(r, rows);

	for (int s = 0; s < p->n_seqs; s++) {
		int upto = upto_step ? w->len[s] : p->seqs[s].hist;

		for (int q = 0; q < upto; q++) {
			int32_t block = w->table[w->slot[s] * w->bt_cols + q / p->bs];
			size_t at_k = paged_snapshot_row(w, false, block, q % p->bs);
			size_t at_v = paged_snapshot_row(w, true, block, q % p->bs);

			wrong += memcmp(snap + at_k * w->C, w->k_f32[s] + (size_t)q * w->C, row) != 0;
			wrong += memcmp(snap + at_v * w->C, w->v_f32[s] + (size_t)q * w->C, row) != 0;
			hit[at_k] = hit[at_v] = 1;
		}
	}
	for (size_t i = 0; i < rows; i++)
		for (int c = 0; !hit[i] && c < w->C; c++)
			written += !isnan(snap[i * w->C + c]);
	op_check(r, !wrong, "%s: every stored k and v row where the table puts it (%zu are not)",
		 when, wrong);
	op_check(r, !written, "%s: every other cache row still poison (%zu values are not)", when,
		 written);
}

void paged_reference(struct op_run *r, const struct paged_world *w, double *ref, double *mag)
{
	const struct paged_params *p = w->p;
	int max_len = 1;
	double *score;

	for (int s = 0; s < p->n_seqs; s++)
		max_len = w->len[s] > max_len ? w->len[s] : max_len;
	score = op_doubles(r, (size_t)max_len);
	for (int t = 0; t < w->step.T; t++) {
		int s = w->step.seq[t], n = w->step.pos[t] + 1;

		for (int h = 0; h < p->n_heads; h++) {
			const int kvh = h / (p->n_heads / p->n_kv);
			const float *q = w->q + (size_t)t * w->QC + (size_t)h * p->D;
			double *out = ref + (size_t)t * w->QC + (size_t)h * p->D;
			double *m = mag + (out - ref), top = -INFINITY, sum = 0.0;

			for (int j = 0; j < n; j++) {
				const float *k = w->k_f32[s] + (size_t)j * w->C + kvh * p->D;
				double d = 0.0;

				for (int i = 0; i < p->D; i++)
					d += (double)q[i] * k[i];
				score[j] = d * (double)w->scale;
				top = fmax(top, score[j]);
			}
			for (int j = 0; j < n; j++)
				sum += score[j] = exp(score[j] - top);
			for (int i = 0; i < p->D; i++)
				out[i] = m[i] = 0.0;
			for (int j = 0; j < n; j++) {
				const float *v = w->v_f32[s] + (size_t)j * w->C + kvh * p->D;

				for (int i = 0; i < p->D; i++) {
					out[i] += score[j] / sum * v[i];
					m[i] += score[j] / sum * fabs(v[i]);
				}
			}
		}
	}
}
