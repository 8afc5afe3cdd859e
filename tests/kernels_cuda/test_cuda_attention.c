/* kv_store and paged attention, cuda against cpu.
 *
 * Each case builds steps like the engine's: up to 8 sequences whose blocks
 * are scattered over the cache in shuffled order (block tables), one unused
 * slot whose table is all -1. Their history is stored first (kv_store), then
 * the step's own k/v, then attention runs (into its own buffer, and in place
 * over q). A step gives its shape on the host as the engine does: decode
 * rows first (shuffled), then one segment per prompt chunk (shuffled slot
 * order). The sequences cross block boundaries, start on them, sit at
 * position 0, and reach lengths that cross and meet the decode kernel's
 * split boundaries; max_kv_len is the truth, or a larger bucket (as in a
 * replayed graph), or larger than max_context.
 *
 * The cpu backend keeps f32 caches; the cuda one f32 or bf16 (its own
 * choice, kv_dtype). With bf16 caches the cpu gets k, v and q already
 * rounded to bf16, so both sides hold the same values:
 *  - caches: bitwise equal (cuda rounds f32 to bf16 to nearest even);
 *  - attention: max_abs <= 4e-3, NMSE <= 2e-5. The tensor-core kernels round
 *    the softmax weights P to bf16 for the P·V product (relative error at
 *    most 2^-8 each) and divide by the f32 sum, so |out - ref| <=
 *    2^-8 · max|v| = 3.9e-3 with values in [-1, 1]; the NMSE bound is about
 *    20x the mean square of that rounding (about 2^-20).
 * With f32 caches (the generic kernel, all f32): max_abs <= 2e-5, NMSE <=
 * 1e-10 (online softmax in f32 against two-pass softmax on the cpu).
 *
 * The last tests check the step-shape validation (-EINVAL) and the
 * device-side index checks: a bad block id, slot, position past max_kv_len
 * or token id makes the next sync point fail with -EINVAL and exactly the
 * affected rows NaN, and the backend works normally afterwards.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ct_util.h"

#define MAX_T 256

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	assert_non_null(p);
	return p;
}

/* Slot s has history positions [0, hist) in the cache before the step and
 * step positions [hist, hist + step): one is a decode row, more a segment. */
struct slot {
	int hist, step;
};

#define N_SLOTS CT_MAX_SEQS

static const struct slot mixed[N_SLOTS] = {
	{ 300, 1 },  /* decode over several blocks */
	{ 0, 1 },    /* decode at position 0 */
	{ 40, 10 },  /* prompt chunk after history, inside one block or two */
	{ 0, 13 },   /* first prompt chunk */
	{ 0, 0 },    /* unused: table all -1 */
	{ 1100, 1 }, /* decode over several splits */
	{ 2047, 1 }, /* decode of length 2048: ends on a split boundary */
	{ 16, 70 },  /* chunk that starts on a block boundary, 5 blocks long */
};

static const struct slot decode_only[N_SLOTS] = {
	{ 3000, 1 }, { 0, 1 }, { 17, 1 }, { 255, 1 }, { 256, 1 }, { 1023, 1 }, { 64, 1 }, { 4, 1 },
};

struct world {
	int n_heads, n_kv, D, bs;
	enum kt_dtype dt;           /* cuda cache dtype (cpu: f32) */
	const struct slot *slots;
	int64_t row_len, n_blocks, bt_cols;
	struct kt_tensor kc_c, vc_c, kc_g, vc_g;
	struct ct_pair bt;
	int32_t *table;             /* [CT_MAX_SEQS, bt_cols] host copy */
};

/* Values as the cuda cache will hold them: rounded when it is bf16. */
static void as_cached(const struct world *w, float *x, size_t n)
{
	if (w->dt == KT_BF16)
		ct_round_bf16(x, n);
}

/* Upload f32 host values into a cuda tensor of dtype dt. */
static void upload_as(const struct kt_tensor *t, const float *x, size_t n)
{
	if (t->dtype == KT_BF16) {
		uint16_t *h = xmalloc(n * 2);

		for (size_t i = 0; i < n; i++)
			h[i] = ct_bf16_bits(x[i]);
		assert_int_equal(kt_upload(ct_gpu, t, 0, h, n * 2), 0);
		free(h);
	} else {
		assert_int_equal(kt_upload(ct_gpu, t, 0, x, n * 4), 0);
	}
}

static void download_as_f32(const struct kt_tensor *t, float *x, size_t n)
{
	if (t->dtype == KT_BF16) {
		uint16_t *h = xmalloc(n * 2);

		assert_int_equal(kt_download(ct_gpu, h, t, 0, n * 2), 0);
		for (size_t i = 0; i < n; i++)
			x[i] = ct_bf16_value(h[i]);
		free(h);
	} else {
		assert_int_equal(kt_download(ct_gpu, x, t, 0, n * 4), 0);
	}
}

static void world_init(struct world *w)
{
	int32_t *perm;
	int64_t need = 0, next = 0, rows;
	size_t n;
	float *init;

	w->row_len = (int64_t)w->n_kv * w->D;
	w->bt_cols = (CT_MAX_CONTEXT + w->bs - 1) / w->bs;
	for (int s = 0; s < N_SLOTS; s++)
		need += (w->slots[s].hist + w->slots[s].step + w->bs - 1) / w->bs;
	w->n_blocks = need + 7;
	perm = xmalloc((size_t)w->n_blocks * 4);
	for (int64_t i = 0; i < w->n_blocks; i++)
		perm[i] = (int32_t)i;
	ct_shuffle(perm, (int)w->n_blocks);
	w->table = xmalloc((size_t)CT_MAX_SEQS * w->bt_cols * 4);
	for (int64_t i = 0; i < CT_MAX_SEQS * w->bt_cols; i++)
		w->table[i] = -1;
	for (int s = 0; s < N_SLOTS; s++)
		for (int b = 0; b < (w->slots[s].hist + w->slots[s].step + w->bs - 1) / w->bs; b++)
			w->table[s * w->bt_cols + b] = perm[next++];
	rows = w->n_blocks * w->bs;
	n = (size_t)rows * w->row_len;
	assert_int_equal(kt_alloc(ct_cpu, KT_F32, rows, w->row_len, &w->kc_c), 0);
	assert_int_equal(kt_alloc(ct_cpu, KT_F32, rows, w->row_len, &w->vc_c), 0);
	assert_int_equal(kt_alloc(ct_gpu, w->dt, rows, w->row_len, &w->kc_g), 0);
	assert_int_equal(kt_alloc(ct_gpu, w->dt, rows, w->row_len, &w->vc_g), 0);
	init = xmalloc(n * 4);
	for (int i = 0; i < 2; i++) {
		ct_fill(init, n, 1.0f);
		as_cached(w, init, n);
		assert_int_equal(kt_upload(ct_cpu, i ? &w->vc_c : &w->kc_c, 0, init, n * 4), 0);
		upload_as(i ? &w->vc_g : &w->kc_g, init, n);
	}
	w->bt = ct_pair_new(KT_I32, CT_MAX_SEQS, w->bt_cols, w->table);
	free(init);
	free(perm);
}

static void world_free(struct world *w)
{
	kt_free(ct_cpu, &w->kc_c);
	kt_free(ct_cpu, &w->vc_c);
	kt_free(ct_gpu, &w->kc_g);
	kt_free(ct_gpu, &w->vc_g);
	ct_pair_free(&w->bt);
	free(w->table);
}

/* A step: tokens, their host-side shape, and the batch on both backends. */
struct step {
	int T, n_single, n_segments, max_len;
	int32_t seq[MAX_T], pos[MAX_T];
	struct kt_segment segs[N_SLOTS];
	struct kt_batch c, g;
	struct ct_pair dpos, dseq;
};

/* Decode rows (shuffled), then one segment per multi-token slot (shuffled). */
static void step_build(struct step *st, const struct slot *slots)
{
	int32_t order[N_SLOTS];

	memset(st, 0, sizeof(*st));
	for (int s = 0; s < N_SLOTS; s++)
		order[s] = s;
	ct_shuffle(order, N_SLOTS);
	for (int i = 0; i < N_SLOTS; i++)
		if (slots[order[i]].step == 1) {
			st->seq[st->T] = order[i];
			st->pos[st->T++] = slots[order[i]].hist;
		}
	st->n_single = st->T;
	ct_shuffle(order, N_SLOTS);
	for (int i = 0; i < N_SLOTS; i++) {
		const struct slot *sl = &slots[order[i]];

		if (sl->step < 2)
			continue;
		st->segs[st->n_segments++] = (struct kt_segment){ .row = st->T, .n_rows = sl->step,
								  .pos0 = sl->hist,
								  .seq = order[i] };
		for (int j = 0; j < sl->step; j++) {
			st->seq[st->T] = order[i];
			st->pos[st->T++] = sl->hist + j;
		}
	}
	for (int t = 0; t < st->T; t++)
		st->max_len = st->pos[t] + 1 > st->max_len ? st->pos[t] + 1 : st->max_len;
}

/* Tokens without step shape (history stores, the generic path). */
static void step_plain(struct step *st, const int32_t *seq, const int32_t *pos, int T)
{
	memset(st, 0, sizeof(*st));
	st->T = T;
	memcpy(st->seq, seq, (size_t)T * 4);
	memcpy(st->pos, pos, (size_t)T * 4);
	for (int t = 0; t < T; t++)
		st->max_len = pos[t] + 1 > st->max_len ? pos[t] + 1 : st->max_len;
}

/* Upload the step's metadata and make both batches (max_kv_len as given). */
static void step_upload(struct step *st, const struct world *w, int max_kv_len)
{
	st->dpos = ct_pair_new(KT_I32, st->T, 1, st->pos);
	st->dseq = ct_pair_new(KT_I32, st->T, 1, st->seq);
	st->c = (struct kt_batch){ .n_tokens = st->T, .block_size = w->bs,
				   .max_kv_len = max_kv_len, .pos = st->dpos.c,
				   .seq = st->dseq.c, .block_tables = w->bt.c,
				   .n_single = st->n_single, .n_segments = st->n_segments,
				   .segments = st->segs };
	st->g = st->c;
	st->g.pos = st->dpos.g;
	st->g.seq = st->dseq.g;
	st->g.block_tables = w->bt.g;
}

static void step_free(struct step *st)
{
	ct_pair_free(&st->dpos);
	ct_pair_free(&st->dseq);
}

/* Store random k/v rows for the step's tokens on both backends. */
static void store(const struct world *w, struct step *st)
{
	size_t n = (size_t)st->T * w->row_len;
	float *k = xmalloc(n * 4), *v = xmalloc(n * 4), *kr = xmalloc(n * 4), *vr = xmalloc(n * 4);
	struct ct_pair pk, pv;

	step_upload(st, w, st->max_len);
	ct_fill(k, n, 1.0f);
	ct_fill(v, n, 1.0f);
	memcpy(kr, k, n * 4);
	memcpy(vr, v, n * 4);
	as_cached(w, kr, n);
	as_cached(w, vr, n);
	pk = ct_pair_new(KT_F32, st->T, w->row_len, NULL);
	pv = ct_pair_new(KT_F32, st->T, w->row_len, NULL);
	assert_int_equal(kt_upload(ct_cpu, &pk.c, 0, kr, n * 4), 0);
	assert_int_equal(kt_upload(ct_cpu, &pv.c, 0, vr, n * 4), 0);
	assert_int_equal(kt_upload(ct_gpu, &pk.g, 0, k, n * 4), 0);
	assert_int_equal(kt_upload(ct_gpu, &pv.g, 0, v, n * 4), 0);
	assert_int_equal(kt_kv_store(ct_cpu, &w->kc_c, &w->vc_c, &pk.c, &pv.c, &st->c), 0);
	assert_int_equal(kt_kv_store(ct_gpu, &w->kc_g, &w->vc_g, &pk.g, &pv.g, &st->g), 0);
	ct_pair_free(&pk);
	ct_pair_free(&pv);
	step_free(st);
	free(k);
	free(v);
	free(kr);
	free(vr);
}

/* Store every slot's history, MAX_T tokens at a time. */
static void store_history(const struct world *w)
{
	int32_t seq[MAX_T], pos[MAX_T];
	struct step st;
	int T = 0;

	for (int s = 0; s < N_SLOTS; s++)
		for (int p = 0; p < w->slots[s].hist; p++) {
			seq[T] = s;
			pos[T++] = p;
			if (T == MAX_T || (s == N_SLOTS - 1 && p == w->slots[s].hist - 1)) {
				step_plain(&st, seq, pos, T);
				store(w, &st);
				T = 0;
			}
		}
	if (T) {
		step_plain(&st, seq, pos, T);
		store(w, &st);
	}
}

static void compare_caches(const struct world *w, const char *what)
{
	size_t n = (size_t)w->n_blocks * w->bs * w->row_len;
	float *a = xmalloc(n * 4), *b = xmalloc(n * 4);
	char name[160];

	for (int i = 0; i < 2; i++) {
		assert_int_equal(kt_download(ct_cpu, a, i ? &w->vc_c : &w->kc_c, 0, n * 4), 0);
		download_as_f32(i ? &w->vc_g : &w->kc_g, b, n);
		snprintf(name, sizeof name, "%s: %s cache", what, i ? "v" : "k");
		ct_compare_exact(name, b, a, n);
	}
	free(a);
	free(b);
}

static void compare_attention(const struct world *w, const char *what, const float *got,
			      const float *ref, size_t n)
{
	if (w->dt == KT_BF16)
		ct_compare(what, got, ref, n, 4e-3, 2e-5);
	else
		ct_compare(what, got, ref, n, 2e-5, 1e-10);
}

/* Attention of the step (already stored) on both backends, out of place and in place. */
static void attend(const struct world *w, struct step *st, int max_kv_len, const char *what)
{
	const int cols = w->n_heads * w->D;
	const size_t n = (size_t)st->T * cols;
	const float scale = 1.0f / sqrtf((float)w->D);
	float *q = xmalloc(n * 4), *oc = xmalloc(n * 4), *og = xmalloc(n * 4);
	struct ct_pair pq, po;
	char name[200];

	ct_fill(q, n, 2.0f);
	as_cached(w, q, n);
	pq = ct_pair_new(KT_F32, st->T, cols, q);
	po = ct_pair_new(KT_F32, st->T, cols, NULL);
	step_upload(st, w, max_kv_len);
	assert_int_equal(kt_attention(ct_cpu, &po.c, &pq.c, &w->kc_c, &w->vc_c, &st->c,
				      w->n_heads, w->n_kv, w->D, scale), 0);
	assert_int_equal(kt_attention(ct_gpu, &po.g, &pq.g, &w->kc_g, &w->vc_g, &st->g,
				      w->n_heads, w->n_kv, w->D, scale), 0);
	ct_pair_get(&po, oc, og);
	snprintf(name, sizeof name, "%s, max_kv_len %d", what, max_kv_len);
	compare_attention(w, name, og, oc, n);
	assert_int_equal(kt_attention(ct_cpu, &pq.c, &pq.c, &w->kc_c, &w->vc_c, &st->c,
				      w->n_heads, w->n_kv, w->D, scale), 0);
	assert_int_equal(kt_attention(ct_gpu, &pq.g, &pq.g, &w->kc_g, &w->vc_g, &st->g,
				      w->n_heads, w->n_kv, w->D, scale), 0);
	ct_pair_get(&pq, oc, og);
	compare_attention(w, "  same, in place over q", og, oc, n);
	step_free(st);
	ct_pair_free(&pq);
	ct_pair_free(&po);
	free(q);
	free(oc);
	free(og);
}

static void run_case(int n_heads, int n_kv, int D, int bs, enum kt_dtype dt,
		     const struct slot *slots)
{
	struct world w = { .n_heads = n_heads, .n_kv = n_kv, .D = D, .bs = bs, .dt = dt,
			   .slots = slots };
	struct step st;
	char what[128];

	world_init(&w);
	store_history(&w);
	step_build(&st, slots);
	store(&w, &st);
	snprintf(what, sizeof what, "%s heads %d/%d, D %d, block %d", kt_dtype_name(dt), n_heads,
		 n_kv, D, bs);
	compare_caches(&w, what);
	snprintf(what, sizeof what, "%s heads %d/%d, D %d, block %d: %d decode + %d rows",
		 kt_dtype_name(dt), n_heads, n_kv, D, bs, st.n_single, st.T - st.n_single);
	attend(&w, &st, st.max_len, what);
	attend(&w, &st, st.max_len + 300, "  same, bucket above the longest row");
	if (dt == KT_BF16)
		attend(&w, &st, CT_MAX_CONTEXT + 1000, "  same, bucket past max_context");
	world_free(&w);
}

static void test_bf16_gqa(void **state)
{
	ct_seed(11);
	run_case(32, 8, 128, 16, KT_BF16, mixed); /* Qwen3-8B */
	run_case(8, 2, 128, 16, KT_BF16, mixed);
	run_case(16, 2, 64, 16, KT_BF16, mixed);  /* group 8 */
	run_case(8, 4, 64, 16, KT_BF16, mixed);   /* atlas-tiny */
	run_case(32, 1, 128, 32, KT_BF16, mixed); /* group 32: two head chunks */
	run_case(2, 1, 256, 32, KT_BF16, mixed);  /* head_dim 256: generic kernel */
}

static void test_bf16_mha_and_odd(void **state)
{
	ct_seed(12);
	run_case(4, 4, 64, 16, KT_BF16, mixed);
	run_case(4, 4, 128, 64, KT_BF16, mixed);
	run_case(10, 2, 64, 5, KT_BF16, mixed);  /* group 5, odd block size */
	run_case(3, 3, 128, 1, KT_BF16, mixed);  /* one position per block */
	run_case(6, 3, 80, 7, KT_BF16, mixed);   /* head_dim 80: generic kernel */
}

static void test_bf16_decode_steps(void **state)
{
	ct_seed(13);
	run_case(32, 8, 128, 16, KT_BF16, decode_only);
	run_case(8, 4, 64, 16, KT_BF16, decode_only);
}

static void test_f32_caches(void **state)
{
	ct_seed(14);
	run_case(8, 2, 128, 16, KT_F32, mixed);
	run_case(3, 3, 34, 7, KT_F32, mixed); /* head_dim not a multiple of 4: scalar loads */
	run_case(5, 1, 96, 1, KT_F32, mixed);
}

/* Without step shape every row runs the generic kernel by its device metadata. */
static void test_no_step_shape(void **state)
{
	struct world w = { .n_heads = 8, .n_kv = 2, .D = 128, .bs = 16, .dt = KT_BF16,
			   .slots = mixed };
	struct step st, plain;

	ct_seed(15);
	world_init(&w);
	store_history(&w);
	step_build(&st, mixed);
	store(&w, &st);
	step_plain(&plain, st.seq, st.pos, st.T);
	attend(&w, &plain, plain.max_len, "bf16 8/2 D 128, no step shape");
	world_free(&w);
}

static void expect_attention(const struct world *w, struct step *st, int max_kv_len, int want,
			     const char *what)
{
	struct ct_pair pq = ct_pair_new(KT_F32, st->T, w->n_heads * w->D, NULL);

	step_upload(st, w, max_kv_len);
	assert_int_equal(kt_attention(ct_gpu, &pq.g, &pq.g, &w->kc_g, &w->vc_g, &st->g,
				      w->n_heads, w->n_kv, w->D, 0.125f), want);
	printf("  %-52s returned %d\n", what, want);
	step_free(st);
	ct_pair_free(&pq);
}

static void test_step_shape_checks(void **state)
{
	struct world w = { .n_heads = 4, .n_kv = 2, .D = 64, .bs = 16, .dt = KT_BF16,
			   .slots = mixed };
	struct step st;

	ct_seed(16);
	world_init(&w);
	step_build(&st, mixed);
	st.segs[0].n_rows--;
	expect_attention(&w, &st, st.max_len, -22, "segments that leave a row out");
	step_build(&st, mixed);
	st.segs[1].row++;
	expect_attention(&w, &st, st.max_len, -22, "a segment not where the last ended");
	step_build(&st, mixed);
	st.segs[0].seq = CT_MAX_SEQS;
	expect_attention(&w, &st, st.max_len, -22, "a segment's slot outside the table");
	step_build(&st, mixed);
	st.segs[0].pos0 = CT_MAX_CONTEXT - 1;
	expect_attention(&w, &st, st.max_len, -22, "a segment past max_context");
	step_build(&st, mixed);
	expect_attention(&w, &st, 0, -22, "decode rows with max_kv_len 0");
	step_build(&st, mixed);
	st.n_single = st.T + 1;
	expect_attention(&w, &st, st.max_len, -22, "more decode rows than tokens");
	assert_int_equal(kt_synchronize(ct_gpu), 0);
	world_free(&w);
}

static void expect_sync(int want, const char *what)
{
	int rc = kt_synchronize(ct_gpu);

	printf("  %-52s sync point returned %d (want %d)\n", what, rc, want);
	assert_int_equal(rc, want);
}

/* Attention of the step in place over random q, the sync point's answer
 * checked; returns out on the host ([T, n_heads * D]). */
static float *attend_gpu(const struct world *w, struct step *st, int max_kv_len, int want,
			 const char *what)
{
	const size_t n = (size_t)st->T * w->n_heads * w->D;
	float *q = xmalloc(n * 4), *out = xmalloc(n * 4);
	struct ct_pair pq = ct_pair_new(KT_F32, st->T, w->n_heads * w->D, NULL);

	ct_fill(q, n, 1.0f);
	assert_int_equal(kt_upload(ct_gpu, &pq.g, 0, q, n * 4), 0);
	step_upload(st, w, max_kv_len);
	assert_int_equal(kt_attention(ct_gpu, &pq.g, &pq.g, &w->kc_g, &w->vc_g, &st->g,
				      w->n_heads, w->n_kv, w->D, 0.125f), 0);
	expect_sync(want, what);
	assert_int_equal(kt_download(ct_gpu, out, &pq.g, 0, n * 4), 0);
	step_free(st);
	ct_pair_free(&pq);
	free(q);
	return out;
}

static void expect_nan_rows(const struct world *w, const struct step *st, const float *out,
			    int (*bad)(int seq, int pos, int max_kv_len), int max_kv_len,
			    const char *what)
{
	const size_t cols = (size_t)w->n_heads * w->D;

	for (int t = 0; t < st->T; t++)
		for (size_t i = 0; i < cols; i++)
			if (bad(st->seq[t], st->pos[t], max_kv_len) ? !isnan(out[t * cols + i])
								   : !isfinite(out[t * cols + i]))
				fail_msg("%s: row %d (slot %d, position %d) col %zu: %g", what, t,
					 st->seq[t], st->pos[t], i, out[t * cols + i]);
	printf("  %-52s NaN exactly in the affected rows\n", what);
}

/* Slot 0's first block and slot 7's fourth (positions 48..63) are bad. */
static int bad_blocks(int seq, int pos, int max_kv_len)
{
	return seq == 0 || (seq == 7 && pos >= 48);
}

static int past_bucket(int seq, int pos, int max_kv_len)
{
	return seq != 7 && seq != 2 && seq != 3 && pos >= max_kv_len;
}

static void index_checks(enum kt_dtype dt, int D)
{
	struct world w = { .n_heads = 4, .n_kv = 2, .D = D, .bs = 16, .dt = dt, .slots = mixed };
	struct step st;
	struct ct_pair kv, ids, po;
	struct kt_tensor row;
	int32_t bad;
	float *out;

	world_init(&w);
	store_history(&w);
	step_build(&st, mixed);
	store(&w, &st);
	printf(" %s caches, head_dim %d\n", kt_dtype_name(dt), D);

	bad = (int32_t)w.n_blocks + 3;
	assert_int_equal(kt_upload(ct_gpu, &w.bt.g, 0, &bad, 4), 0);
	bad = -2;
	assert_int_equal(kt_upload(ct_gpu, &w.bt.g, ((size_t)7 * w.bt_cols + 3) * 4, &bad, 4), 0);
	out = attend_gpu(&w, &st, st.max_len, -22, "attention with bad block ids");
	expect_nan_rows(&w, &st, out, bad_blocks, st.max_len, "  rows");
	free(out);
	assert_int_equal(kt_upload(ct_gpu, &w.bt.g, 0, w.table, kt_nbytes(&w.bt.g)), 0);
	out = attend_gpu(&w, &st, st.max_len, 0, "attention again with the table fixed");
	expect_nan_rows(&w, &st, out, past_bucket, INT32_MAX, "  rows");
	free(out);
	out = attend_gpu(&w, &st, 200, -22, "decode rows at positions >= max_kv_len 200");
	expect_nan_rows(&w, &st, out, past_bucket, 200, "  rows");
	free(out);

	bad = CT_MAX_SEQS;
	kv = ct_pair_new(KT_F32, st.T, w.row_len, NULL);
	step_upload(&st, &w, st.max_len);
	assert_int_equal(kt_upload(ct_gpu, &st.dseq.g, 0, &bad, 4), 0);
	assert_int_equal(kt_kv_store(ct_gpu, &w.kc_g, &w.vc_g, &kv.g, &kv.g, &st.g), 0);
	expect_sync(-22, "kv_store with a bad sequence slot");
	expect_sync(0, "nothing enqueued since");
	step_free(&st);

	bad = 1000;
	ids = ct_pair_new(KT_I32, 1, 1, &bad);
	po = ct_pair_new(KT_F32, 1, w.row_len, NULL);
	row = kt_reshape(kt_rows(po.g, 0, 1), 1, w.row_len);
	assert_int_equal(kt_embed(ct_gpu, &row, &kv.g, &ids.g), 0);
	out = xmalloc(4);
	assert_int_equal(kt_download(ct_gpu, out, &po.g, 0, 4), -22);
	printf("  %-52s download returned -22\n", "embed with a token id past the table");
	expect_sync(0, "nothing enqueued since");
	free(out);
	ct_pair_free(&ids);
	ct_pair_free(&po);
	ct_pair_free(&kv);
	world_free(&w);
}

static void test_device_index_checks(void **state)
{
	ct_seed(17);
	index_checks(KT_BF16, 64);
	index_checks(KT_BF16, 80);
	index_checks(KT_F32, 64);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bf16_gqa),
		cmocka_unit_test(test_bf16_mha_and_odd),
		cmocka_unit_test(test_bf16_decode_steps),
		cmocka_unit_test(test_f32_caches),
		cmocka_unit_test(test_no_step_shape),
		cmocka_unit_test(test_step_shape_checks),
		cmocka_unit_test(test_device_index_checks),
	};

	ct_require_device();
	return cmocka_run_group_tests(tests, ct_setup, ct_teardown);
}
