/* Refusal and fault cases of kv_store and attention, on small worlds of
 * ops_paged.h (4 query heads over 2 kv heads, blocks of 16, the eight
 * sequences of a mixed step: decode rows and prompt chunks), with caches of
 * their own or block-major ones (the last of 3 layers, whose V view ends
 * with the allocation).
 *
 * Three kinds, each checked on every backend:
 *  - arguments the host sees (head counts, scale, shapes, block size,
 *    overlaps, a block stride below the block size, a cache view too short
 *    for one block, K and V views whose blocks meet): refused at the call,
 *    nothing written, nothing to report at the sync point;
 *  - indices only the device sees (positions, sequence slots and block ids
 *    in backend memory): refused at the call with nothing written, or run
 *    with the next sync point failing and exactly the affected rows NaN
 *    (kv_store: not stored), the other rows as a clean run gave them
 *    (op_check_fault). Cache views cut one row short of the last block are
 *    a bad block id of this kind for the rows that use that block. A bound
 *    max_kv_len that is not one may also be ignored by a backend that does
 *    not use it (cpu): then every row is as in the clean run;
 *  - a wrong host-side step shape (segments that leave a row out, skip one,
 *    name a slot outside the table or pass max_context; decode rows with
 *    max_kv_len 0 or more than the tokens): a backend that reads the shape
 *    refuses it, one that does not (cpu) gives the clean run's rows.
 * The clean run is the same step with good metadata on the same backend,
 * just before, so the comparisons are bitwise.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "tests/ops/ops_paged.h"

enum att_fault {
	/* refused at the call (host-visible) */
	ATT_KV_HEADS_NOT_DIVIDING, ATT_KV_HEADS_MISMATCH, ATT_SCALE_NAN, ATT_TOKENS_SHORT,
	ATT_OUT_SHIFTED, ATT_OUT_BF16_OVER_Q, ATT_BLOCK_SIZE, ATT_POS_ROWS, ATT_STRIDE_BELOW_BLOCK, ATT_V_NO_BLOCK,
	STORE_TOKENS_SHORT, STORE_BLOCK_SIZE, STORE_BLOCK_SIZE_ZERO, STORE_K_COLS, STORE_V_ROWS,
	STORE_STRIDE_BELOW_BLOCK, STORE_K_NO_BLOCK, STORE_KV_MEET,
	/* device-visible indices */
	ATT_POS_PAST_CONTEXT, ATT_SLOT_NEGATIVE, ATT_BAD_BLOCKS, ATT_PAST_BUCKET, ATT_VIEWS_SHORT,
	STORE_POS_PAST_TABLE, STORE_POS_NEGATIVE, STORE_SLOT_PAST_TABLE, STORE_BAD_BLOCKS,
	STORE_VIEWS_SHORT,
	/* wrong step shapes */
	SHAPE_ROW_LEFT_OUT, SHAPE_GAP, SHAPE_SLOT_PAST_TABLE, SHAPE_PAST_CONTEXT,
	SHAPE_DECODE_NO_BOUND, SHAPE_DECODE_PAST_TOKENS,
};

struct fault_params {
	enum att_fault fault;
	int D;
	enum paged_kv kv;
	bool block_major; /* the caches: the last of 3 layers block-major, else their own */
};

/* The world of every fault case: 4/2 heads, blocks of 16, a mixed step. */
static struct paged_params world_params(const struct fault_params *p)
{
	return (struct paged_params){
		.n_heads = 4, .n_kv = 2, .D = p->D, .bs = 16, .kv = p->kv, .shape = SHAPE_STEP,
		.qmag = 2.0f, .kmag = 1.0f, .n_seqs = 8,
		.seqs = { { 300, 1 }, { 0, 1 }, { 40, 10 }, { 0, 13 }, { 0, 0 }, { 1100, 1 },
			  { 2047, 1 }, { 16, 70 } },
		.layers = p->block_major ? 3 : 0, .layer = p->block_major ? 2 : 0,
	};
}

/* Sequences the bad block ids hit: block 0 of sequence 0 (a decode row over
 * 19 blocks), block 3 of sequence 7 (positions 48..63 of a prompt chunk).
 * Cut views miss the last block, which block 3 of sequence 7 is then. */
enum { BAD_SEQ_A = 0, BAD_SEQ_B = 7, BAD_BLOCK_B = 3 };

static bool views_short(enum att_fault f)
{
	return f == ATT_VIEWS_SHORT || f == STORE_VIEWS_SHORT;
}

/* Give block 3 of sequence B the world's last block (swapping ids with
 * whichever row held it): the block that views cut short leave out. */
static void last_block_to_b(struct paged_world *w)
{
	int32_t *b = &w->table[w->slot[BAD_SEQ_B] * w->bt_cols + BAD_BLOCK_B];

	for (int i = 0; i < w->n_slots * w->bt_cols; i++)
		if (w->table[i] == w->n_blocks - 1)
			w->table[i] = *b;
	*b = w->n_blocks - 1;
}

/* A cache view cut to end one row short of the world's last block at the
 * stride of the batches: every other block still lies within it. */
static struct kt_tensor cut_view(const struct paged_world *w, const struct paged_dev *d,
				 struct kt_tensor t)
{
	const int64_t stride = d->block_rows ? d->block_rows : w->p->bs;

	return kt_rows(t, 0, (w->n_blocks - 1) * stride + w->p->bs - 1);
}

struct fault_in {
	struct paged_params wp;
	struct paged_world w;
};

struct fault_out {
	int rc_clean, rc_call, rc_sync;
	float *clean;            /* attention: out of the clean run */
	float *before, *got;     /* attention: out before and after the call */
	float *caches;           /* kv_store: paged_snapshot after the call */
	bool *bad;               /* [step.T] the rows the fault affects */
	struct paged_tokens tok; /* the step's tokens as the case broke them */
	int32_t *table;          /* the block table as the case broke it */
};

static void *fault_build(struct op_run *r, const void *params, const struct op_backend *target)
{
	struct fault_in *in = op_alloc(r, sizeof(*in));

	in->wp = world_params(params);
	paged_build(r, &in->w, &in->wp, target);
	if (views_short(((const struct fault_params *)params)->fault))
		last_block_to_b(&in->w);
	return in;
}

static bool is_store(enum att_fault f)
{
	return f == STORE_TOKENS_SHORT || f == STORE_BLOCK_SIZE || f == STORE_BLOCK_SIZE_ZERO ||
	       f == STORE_K_COLS || f == STORE_V_ROWS || f == STORE_STRIDE_BELOW_BLOCK ||
	       f == STORE_K_NO_BLOCK || f == STORE_KV_MEET || f == STORE_POS_PAST_TABLE ||
	       f == STORE_POS_NEGATIVE || f == STORE_SLOT_PAST_TABLE || f == STORE_BAD_BLOCKS ||
	       f == STORE_VIEWS_SHORT;
}

static bool host_refusal(enum att_fault f)
{
	return f <= STORE_KV_MEET;
}

/* A copy of the step the case may break. */
static struct paged_tokens copy_tokens(struct op_run *r, const struct paged_tokens *t)
{
	struct paged_tokens c = *t;

	c.seq = op_dup(r, t->seq, (size_t)t->T * sizeof(int32_t));
	c.pos = op_dup(r, t->pos, (size_t)t->T * sizeof(int32_t));
	c.slot = op_dup(r, t->slot, (size_t)t->T * sizeof(int32_t));
	c.segs = op_dup(r, t->segs, PAGED_MAX_SEQS * sizeof(*t->segs));
	return c;
}

/* Which rows of the step the bad block ids reach: every row of sequence A
 * (with seq_a), the rows of B at or past its bad block (attention reads
 * blocks 0..pos/bs; kv_store writes only its own). */
static void mark_bad_blocks(const struct paged_world *w, const struct paged_tokens *t, bool store,
			    bool seq_a, bool *bad)
{
	const int bs = w->p->bs;

	for (int i = 0; i < t->T; i++) {
		int blk = t->pos[i] / bs;

		if (store)
			bad[i] = (seq_a && t->seq[i] == BAD_SEQ_A && blk == 0) ||
				 (t->seq[i] == BAD_SEQ_B && blk == BAD_BLOCK_B);
		else
			bad[i] = (seq_a && t->seq[i] == BAD_SEQ_A) ||
				 (t->seq[i] == BAD_SEQ_B && blk >= BAD_BLOCK_B);
	}
}

/* Break the step's metadata (host copy, and for device faults the table) as
 * the case says; marks the affected rows; returns the max_kv_len to use. */
static int break_step(const struct fault_params *p, const struct paged_world *w,
		      struct paged_tokens *t, int32_t *table, bool *bad)
{
	const int L = paged_max_len(&w->step);

	switch (p->fault) {
	case ATT_POS_PAST_CONTEXT: t->pos[0] = OP_MAX_CONTEXT; bad[0] = true; break;
	case ATT_SLOT_NEGATIVE: t->slot[0] = -1; bad[0] = true; break;
	case STORE_POS_PAST_TABLE: t->pos[0] = OP_MAX_CONTEXT; bad[0] = true; break;
	case STORE_POS_NEGATIVE: t->pos[1] = -1; bad[1] = true; break;
	case STORE_SLOT_PAST_TABLE: t->slot[0] = w->n_slots; bad[0] = true; break;
	case ATT_BAD_BLOCKS:
	case STORE_BAD_BLOCKS:
		table[w->slot[BAD_SEQ_A] * w->bt_cols] = w->n_blocks + 3;
		table[w->slot[BAD_SEQ_B] * w->bt_cols + BAD_BLOCK_B] = -2;
		mark_bad_blocks(w, t, p->fault == STORE_BAD_BLOCKS, true, bad);
		break;
	case ATT_VIEWS_SHORT:
	case STORE_VIEWS_SHORT:
		mark_bad_blocks(w, t, p->fault == STORE_VIEWS_SHORT, false, bad);
		break;
	case ATT_PAST_BUCKET:
		for (int i = 0; i < t->n_single; i++)
			bad[i] = t->pos[i] >= 200;
		return 200;
	case SHAPE_ROW_LEFT_OUT: t->segs[0].n_rows--; break;
	case SHAPE_GAP: t->segs[1].row++; break;
	case SHAPE_SLOT_PAST_TABLE: t->segs[0].seq = w->n_slots; break;
	case SHAPE_PAST_CONTEXT: t->segs[0].pos0 = OP_MAX_CONTEXT - 1; break;
	case SHAPE_DECODE_NO_BOUND: return 0;
	case SHAPE_DECODE_PAST_TOKENS: t->n_single = t->T + 1; break;
	default: break;
	}
	return L;
}

/* kv_store of the step's rows into fresh caches with broken metadata. */
static void run_store(struct op_run *r, const struct fault_params *p, const struct op_backend *b,
		      const struct paged_world *w, const struct paged_dev *d, struct fault_out *o,
		      int max_kv_len)
{
	struct kt_batch batch = paged_batch(r, b, w, d, &o->tok, max_kv_len);
	struct kt_tensor k, v, kc = d->kc, vc = d->vc;
	float *kh, *vh;

	paged_rows(r, w, d->kv, &w->step, &kh, &vh);
	k = op_tensor(r, b, KT_F32, w->step.T, w->C, kh);
	v = op_tensor(r, b, KT_F32, w->step.T, w->C, vh);
	switch (p->fault) {
	case STORE_TOKENS_SHORT: batch.n_tokens--; break;
	case STORE_BLOCK_SIZE: batch.block_size = w->n_blocks * w->p->bs + 1; break;
	case STORE_BLOCK_SIZE_ZERO: batch.block_size = 0; break;
	case STORE_K_COLS: k = kt_reshape(k, k.rows, k.cols - 1); break;
	case STORE_V_ROWS: v = kt_rows(v, 0, v.rows - 1); break;
	case STORE_STRIDE_BELOW_BLOCK: batch.kv_block_rows = w->p->bs - 1; break;
	case STORE_K_NO_BLOCK: kc = kt_rows(kc, 0, w->p->bs - 1); break;
	case STORE_KV_MEET: vc = kt_rows(kc, w->p->bs / 2, kc.rows - w->p->bs / 2); break;
	case STORE_VIEWS_SHORT:
		kc = cut_view(w, d, kc);
		vc = cut_view(w, d, vc);
		break;
	default: break;
	}
	o->rc_call = kt_kv_store(b->be, &kc, &vc, &k, &v, &batch);
	o->rc_sync = kt_synchronize(b->be);
	o->caches = paged_snapshot(r, b, w, d);
}

/* The clean step, then attention with the case's fault into a fresh out. */
static void run_attention(struct op_run *r, const struct fault_params *p,
			  const struct op_backend *b, const struct paged_world *w,
			  const struct paged_dev *d, struct fault_out *o, int max_kv_len)
{
	const int T = w->step.T;
	const struct paged_params *wp = w->p;
	struct kt_tensor qbig = op_tensor(r, b, KT_F32, T + 1, w->QC, NULL);
	struct kt_tensor q = kt_rows(qbig, 0, T), out = op_tensor(r, b, KT_F32, T, w->QC, NULL);
	struct kt_batch batch = paged_batch(r, b, w, d, &w->step, paged_max_len(&w->step));
	struct kt_tensor kc = d->kc, vc = d->vc;
	int n_kv = wp->n_kv;
	float scale = w->scale;

	op_ok(r, kt_upload(b->be, &q, 0, w->q, kt_nbytes(&q)), "kt_upload (q)");
	o->rc_clean = paged_store_all(r, b, w, d);
	if (!o->rc_clean)
		o->rc_clean = kt_attention(b->be, &out, &q, &d->kc, &d->vc, &batch, wp->n_heads,
					   n_kv, wp->D, scale);
	o->clean = op_get(r, b, &out);
	op_poison(r, b, &out);
	op_ok(r, kt_upload(b->be, &d->table, 0, o->table, kt_nbytes(&d->table)), "kt_upload");
	batch = paged_batch(r, b, w, d, &o->tok, max_kv_len);
	switch (p->fault) {
	case ATT_KV_HEADS_NOT_DIVIDING: n_kv = 3; break;
	case ATT_KV_HEADS_MISMATCH: n_kv = 4; break;
	case ATT_SCALE_NAN: scale = NAN; break;
	case ATT_TOKENS_SHORT: batch.n_tokens--; break;
	case ATT_OUT_SHIFTED: out = kt_rows(qbig, 1, T); break;
	case ATT_OUT_BF16_OVER_Q: /* in place is f32's alone */
		out = q;
		out.dtype = KT_BF16;
		break;
	case ATT_BLOCK_SIZE: batch.block_size = w->n_blocks * wp->bs + 1; break;
	case ATT_POS_ROWS: batch.pos = kt_rows(batch.pos, 0, T - 1); break;
	case ATT_STRIDE_BELOW_BLOCK: batch.kv_block_rows = wp->bs - 1; break;
	case ATT_V_NO_BLOCK: vc = kt_rows(vc, 0, wp->bs - 1); break;
	case ATT_VIEWS_SHORT:
		kc = cut_view(w, d, kc);
		vc = cut_view(w, d, vc);
		break;
	default: break;
	}
	o->before = op_get(r, b, &out);
	o->rc_call = kt_attention(b->be, &out, &q, &kc, &vc, &batch, wp->n_heads, n_kv, wp->D,
				  scale);
	o->rc_sync = kt_synchronize(b->be);
	o->got = op_get(r, b, &out);
}

static void *fault_run(struct op_run *r, const void *params, const void *input,
		       const struct op_backend *b)
{
	const struct fault_params *p = params;
	const struct fault_in *in = input;
	const struct paged_world *w = &in->w;
	struct fault_out *o = op_alloc(r, sizeof(*o));
	struct paged_dev d = paged_setup(r, b, w);
	int max_kv_len;

	o->tok = copy_tokens(r, &w->step);
	o->table = op_dup(r, w->table, (size_t)w->n_slots * w->bt_cols * sizeof(int32_t));
	o->bad = op_alloc(r, (size_t)w->step.T * sizeof(bool));
	max_kv_len = break_step(p, w, &o->tok, o->table, o->bad);
	if (is_store(p->fault)) {
		op_ok(r, kt_upload(b->be, &d.table, 0, o->table, kt_nbytes(&d.table)), "kt_upload");
		run_store(r, p, b, w, &d, o, max_kv_len);
	} else {
		run_attention(r, p, b, w, &d, o, max_kv_len);
	}
	return o;
}

/* a and b hold the same bits, or are both NaN. */
static bool same_value(float a, float b)
{
	return (isnan(a) && isnan(b)) || !memcmp(&a, &b, sizeof a);
}

/* Caches after a kv_store that may have refused or skipped the bad tokens:
 * the good tokens' rows stored (unless refused), every other row poison. */
static void check_store(struct op_run *r, const struct paged_world *w, const struct fault_out *g)
{
	const int bs = w->p->bs;
	const size_t rows = paged_snapshot_rows(w), row = (size_t)w->C * sizeof(float);
	const bool refused = g->rc_call != 0;
	char *hit = op_alloc(r, rows);
	size_t wrong = 0, written = 0;

	if (refused) {
		op_check_rc(r, g->rc_call, -EINVAL, "refused at the call");
		op_check_rc(r, g->rc_sync, 0, "refused, so nothing to report at the sync point");
	} else {
		op_check_rc(r, g->rc_sync, -EINVAL,
			    "accepted at the call, reported at the sync point");
	}
	for (int t = 0; !refused && t < w->step.T; t++) {
		int s = w->step.seq[t], q = w->step.pos[t];
		int32_t block = w->table[w->slot[s] * w->bt_cols + q / bs];
		size_t at_k = paged_snapshot_row(w, false, block, q % bs);
		size_t at_v = paged_snapshot_row(w, true, block, q % bs);

		if (g->bad[t])
			continue;
		wrong += memcmp(g->caches + at_k * w->C, w->k_f32[s] + (size_t)q * w->C, row) != 0;
		wrong += memcmp(g->caches + at_v * w->C, w->v_f32[s] + (size_t)q * w->C, row) != 0;
		hit[at_k] = hit[at_v] = 1;
	}
	for (size_t i = 0; i < rows; i++)
		for (int c = 0; !hit[i] && c < w->C; c++)
			written += !isnan(g->caches[i * w->C + c]);
	op_check(r, !wrong, "the good tokens' rows stored (%zu are not)", wrong);
	op_check(r, !written, "every other cache row still poison (%zu values are not)", written);
}

static void fault_check(struct op_run *r, const void *params, const void *input, const void *got,
			const void *cpu)
{
	const struct fault_params *p = params;
	const struct fault_in *in = input;
	const struct paged_world *w = &in->w;
	const struct fault_out *g = got;
	const size_t T = (size_t)w->step.T, QC = (size_t)w->QC;
	size_t changed = 0;

	if (is_store(p->fault) && !host_refusal(p->fault)) {
		check_store(r, w, g);
		return;
	}
	if (is_store(p->fault)) {
		op_check_rc(r, g->rc_call, -EINVAL, "refused at the call");
		op_check_rc(r, g->rc_sync, 0, "nothing to report at the sync point");
		op_check_poison(r, g->caches, paged_snapshot_rows(w) * w->C, "caches left alone");
		return;
	}
	op_check_rc(r, g->rc_clean, 0, "the clean step runs");
	for (size_t i = 0; i < T * QC; i++)
		changed += !same_value(g->got[i], g->before[i]);
	if (host_refusal(p->fault)) {
		op_check_rc(r, g->rc_call, -EINVAL, "refused at the call");
		op_check_rc(r, g->rc_sync, 0, "nothing to report at the sync point");
		op_check(r, !changed, "out left alone (%zu values were written)", changed);
		return;
	}
	if (p->fault >= SHAPE_ROW_LEFT_OUT) {
		op_check_rc(r, g->rc_sync, 0, "nothing to report at the sync point");
		if (g->rc_call) {
			op_check_rc(r, g->rc_call, -EINVAL, "refused at the call");
			op_check(r, !changed, "out left alone (%zu values were written)", changed);
		} else {
			op_check_bits(r, g->got, g->clean, T * QC,
				      "the shape is not read: out as with the right shape");
		}
		return;
	}
	if (p->fault == ATT_PAST_BUCKET && !g->rc_call && !g->rc_sync) {
		op_check_bits(r, g->got, g->clean, T * QC,
			      "the bound is not used: out as with the right bound");
		return;
	}
	if (!op_check_fault(r, g->rc_call, g->rc_sync, g->got, g->before, g->bad, T, QC,
			    OP_FAULT_NAN, "a bad index"))
		return;
	for (size_t t = 0; t < T; t++) {
		const float *row = g->got + t * QC, *clean = g->clean + t * QC;
		const int pos = w->step.pos[t];

		if (g->bad[t])
			continue;
		/* Another max_kv_len may split the decode rows' keys otherwise
		 * (cuda): then the other rows are as close as two backends. */
		if (p->fault == ATT_PAST_BUCKET && w->target_kv == KT_BF16)
			op_check_close(r, row, clean, QC, 4e-3, 2e-5,
				       "row %zu (position %d) as in the clean run", t, pos);
		else if (p->fault == ATT_PAST_BUCKET)
			op_check_close(r, row, clean, QC, 2e-5, 1e-10,
				       "row %zu (position %d) as in the clean run", t, pos);
		else
			op_check_bits(r, row, clean, QC,
				      "row %zu (position %d) as in the clean run", t, pos);
	}
}

static const struct op_family faults = { fault_build, fault_run, fault_check, true };

#define FAULT(name, op, f, d, kv_dtype) \
	{ name, op, &faults, &(const struct fault_params){ f, d, kv_dtype, false } }
/* A device-side fault on the four kernels' worlds: native caches of
 * head_dim 64 (cuda: mma.sync), 128 (cuda on a 9.0 GPU: wgmma, its own
 * K/V loader) and 80 (generic), f32 caches. */
#define DEVICE(name, op, f) \
	FAULT(name ", D=64", op, f, 64, KV_NATIVE), FAULT(name ", D=128", op, f, 128, KV_NATIVE), \
	FAULT(name ", D=80", op, f, 80, KV_NATIVE), FAULT(name ", D=64 f32 cache", op, f, 64, KV_F32)
/* The same over block-major caches. */
#define LAYERED(name, op, f, d, kv_dtype) \
	{ name, op, &faults, &(const struct fault_params){ f, d, kv_dtype, true } }
#define LAYERED_DEVICE(name, op, f) \
	LAYERED(name ", D=64", op, f, 64, KV_NATIVE), \
	LAYERED(name ", D=128", op, f, 128, KV_NATIVE), \
	LAYERED(name ", D=80", op, f, 80, KV_NATIVE), \
	LAYERED(name ", D=64 f32 cache", op, f, 64, KV_F32)

static const struct op_case cases[] = {
	FAULT("attention: kv heads that do not divide the heads", "attention",
	      ATT_KV_HEADS_NOT_DIVIDING, 64, KV_NATIVE),
	FAULT("attention: kv heads other than the cache's", "attention", ATT_KV_HEADS_MISMATCH, 64,
	      KV_NATIVE),
	FAULT("attention: scale NaN", "attention", ATT_SCALE_NAN, 64, KV_NATIVE),
	FAULT("attention: n_tokens one short of q", "attention", ATT_TOKENS_SHORT, 64, KV_NATIVE),
	FAULT("attention: out half over q", "attention", ATT_OUT_SHIFTED, 64, KV_NATIVE),
	FAULT("attention: bf16 out over q", "attention", ATT_OUT_BF16_OVER_Q, 128, KV_NATIVE),
	FAULT("attention: a block size that does not divide the cache", "attention",
	      ATT_BLOCK_SIZE, 64, KV_NATIVE),
	FAULT("attention: pos of other rows", "attention", ATT_POS_ROWS, 64, KV_NATIVE),
	FAULT("kv_store: n_tokens one short of k", "kv_store", STORE_TOKENS_SHORT, 64, KV_NATIVE),
	FAULT("kv_store: a block size that does not divide the cache", "kv_store",
	      STORE_BLOCK_SIZE, 64, KV_NATIVE),
	FAULT("kv_store: block size 0", "kv_store", STORE_BLOCK_SIZE_ZERO, 64, KV_NATIVE),
	FAULT("kv_store: k of other columns", "kv_store", STORE_K_COLS, 64, KV_NATIVE),
	FAULT("kv_store: v of other rows", "kv_store", STORE_V_ROWS, 64, KV_NATIVE),
	DEVICE("attention: a position past max_context", "attention", ATT_POS_PAST_CONTEXT),
	DEVICE("attention: a negative sequence slot", "attention", ATT_SLOT_NEGATIVE),
	DEVICE("attention: block ids outside the cache", "attention", ATT_BAD_BLOCKS),
	DEVICE("attention: decode rows past max_kv_len", "attention", ATT_PAST_BUCKET),
	DEVICE("kv_store: a position past the block table", "kv_store", STORE_POS_PAST_TABLE),
	DEVICE("kv_store: a negative position", "kv_store", STORE_POS_NEGATIVE),
	DEVICE("kv_store: a sequence slot past the table", "kv_store", STORE_SLOT_PAST_TABLE),
	DEVICE("kv_store: block ids outside the cache", "kv_store", STORE_BAD_BLOCKS),
	FAULT("attention: segments that leave a row out", "attention", SHAPE_ROW_LEFT_OUT, 64,
	      KV_NATIVE),
	FAULT("attention: a segment not where the last ended", "attention", SHAPE_GAP, 64,
	      KV_NATIVE),
	FAULT("attention: a segment's slot outside the table", "attention",
	      SHAPE_SLOT_PAST_TABLE, 64, KV_NATIVE),
	FAULT("attention: a segment past max_context", "attention", SHAPE_PAST_CONTEXT, 64,
	      KV_NATIVE),
	FAULT("attention: decode rows with max_kv_len 0", "attention", SHAPE_DECODE_NO_BOUND, 64,
	      KV_NATIVE),
	FAULT("attention: more decode rows than tokens", "attention", SHAPE_DECODE_PAST_TOKENS, 64,
	      KV_NATIVE),
	LAYERED("attention: block-major, a block stride below the block size", "attention",
		ATT_STRIDE_BELOW_BLOCK, 64, KV_NATIVE),
	LAYERED("attention: block-major, a V view too short for one block", "attention",
		ATT_V_NO_BLOCK, 64, KV_NATIVE),
	LAYERED("kv_store: block-major, a block stride below the block size", "kv_store",
		STORE_STRIDE_BELOW_BLOCK, 64, KV_NATIVE),
	LAYERED("kv_store: block-major, a K view too short for one block", "kv_store",
		STORE_K_NO_BLOCK, 64, KV_NATIVE),
	LAYERED("kv_store: block-major, V blocks that meet K blocks", "kv_store", STORE_KV_MEET,
		64, KV_NATIVE),
	LAYERED_DEVICE("attention: block-major views one row short of the last block",
		       "attention", ATT_VIEWS_SHORT),
	LAYERED_DEVICE("kv_store: block-major views one row short of the last block",
		       "kv_store", STORE_VIEWS_SHORT),
	FAULT("attention: views one row short of the last block", "attention", ATT_VIEWS_SHORT,
	      64, KV_NATIVE),
	FAULT("kv_store: views one row short of the last block", "kv_store", STORE_VIEWS_SHORT,
	      64, KV_NATIVE),
};

OP_LIST(ops_attention_faults, cases);
