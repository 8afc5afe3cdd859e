/* Paged KV: kv_store and attention of the cpu backend against a naive
 * double-precision attention over each sequence's logical K/V arrays.
 *
 * Every scenario has several sequences in shuffled, non-contiguous blocks of
 * a poisoned cache, sitting in shuffled block-table rows; a first step stores
 * their history, a second step mixes prefill chunks and decode tokens of all
 * sequences in one shuffled batch, stores them and attends. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kt_testutil.h"

#define MAX_SEQS 6

struct scenario {
	const char *name;
	int n_heads, n_kv, D, bs;
	int n_seqs;
	int hist[MAX_SEQS], add[MAX_SEQS]; /* positions stored before, and new this step */
	float qmag;                        /* magnitude of q and k: large means peaky softmax */
	bool in_place;                     /* out = q */
	double tol;                        /* error over sum_j softmax_j |v_j| */
};

/* A scenario's state on host and backend. */
struct world {
	const struct scenario *sc;
	int C, len[MAX_SEQS], slot[MAX_SEQS];
	int n_slots, bt_cols, n_blocks;
	int32_t *bt;              /* [n_slots, bt_cols], -1 where unassigned */
	float *K[MAX_SEQS], *V[MAX_SEQS]; /* logical [len, C] per sequence */
	struct kt_tensor kc, vc, btt;
};

/* One step of tokens (sequence index, position). */
struct step {
	int T;
	int s[4096];
	int32_t p[4096];
};

static void world_init(struct kt_backend *be, struct world *w, const struct scenario *sc)
{
	int32_t perm[4096], rows[MAX_SEQS + 2];
	int next = 0;

	memset(w, 0, sizeof(*w));
	w->sc = sc;
	w->C = sc->n_kv * sc->D;
	w->n_slots = sc->n_seqs + 2;
	for (int s = 0; s < sc->n_seqs; s++) {
		int blocks;

		w->len[s] = sc->hist[s] + sc->add[s];
		blocks = (w->len[s] + sc->bs - 1) / sc->bs;
		w->bt_cols = blocks + 1 > w->bt_cols ? blocks + 1 : w->bt_cols;
		w->n_blocks += blocks;
	}
	w->n_blocks += 3; /* never used: must stay poisoned */
	assert_true(w->n_blocks <= 4096);
	for (int i = 0; i < w->n_blocks; i++)
		perm[i] = i;
	tu_shuffle(perm, w->n_blocks);
	for (int i = 0; i < w->n_slots; i++)
		rows[i] = i;
	tu_shuffle(rows, w->n_slots);
	w->bt = malloc(sizeof(int32_t) * w->n_slots * w->bt_cols);
	for (int i = 0; i < w->n_slots * w->bt_cols; i++)
		w->bt[i] = -1;
	for (int s = 0; s < sc->n_seqs; s++) {
		w->slot[s] = rows[s];
		for (int b = 0; b * sc->bs < w->len[s]; b++)
			w->bt[w->slot[s] * w->bt_cols + b] = perm[next++];
		w->K[s] = malloc(sizeof(float) * w->len[s] * w->C + 1);
		w->V[s] = malloc(sizeof(float) * w->len[s] * w->C + 1);
		tu_fill(w->K[s], (size_t)w->len[s] * w->C, sc->qmag);
		tu_fill(w->V[s], (size_t)w->len[s] * w->C, 1.0f);
	}
	w->kc = tu_tensor(be, KT_F32, (int64_t)w->n_blocks * sc->bs, w->C, NULL);
	w->vc = tu_tensor(be, KT_F32, (int64_t)w->n_blocks * sc->bs, w->C, NULL);
	w->btt = tu_tensor(be, KT_I32, w->n_slots, w->bt_cols, w->bt);
}

static void world_free(struct kt_backend *be, struct world *w)
{
	for (int s = 0; s < w->sc->n_seqs; s++) {
		free(w->K[s]);
		free(w->V[s]);
	}
	free(w->bt);
	kt_free(be, &w->kc);
	kt_free(be, &w->vc);
	kt_free(be, &w->btt);
}

/* The tokens of positions [from(s), to(s)) of every sequence, shuffled. */
static void step_make(struct step *st, const struct world *w, bool history)
{
	st->T = 0;
	for (int s = 0; s < w->sc->n_seqs; s++) {
		int from = history ? 0 : w->sc->hist[s], to = history ? w->sc->hist[s] : w->len[s];

		for (int p = from; p < to; p++) {
			assert_true(st->T < 4096);
			st->s[st->T] = s;
			st->p[st->T++] = p;
		}
	}
	for (int i = st->T - 1; i > 0; i--) {
		int j = tu_randint(i + 1), ts = st->s[i];
		int32_t tp = st->p[i];

		st->s[i] = st->s[j];
		st->p[i] = st->p[j];
		st->s[j] = ts;
		st->p[j] = tp;
	}
}

/* Batch tensors of a step (freed by batch_free). */
static struct kt_batch batch_make(struct kt_backend *be, const struct world *w,
				  const struct step *st)
{
	struct kt_batch b = { .n_tokens = st->T, .block_size = w->sc->bs, .block_tables = w->btt };
	int32_t seq[4096];

	for (int t = 0; t < st->T; t++) {
		seq[t] = w->slot[st->s[t]];
		b.max_kv_len = st->p[t] + 1 > b.max_kv_len ? st->p[t] + 1 : b.max_kv_len;
	}
	b.pos = tu_tensor(be, KT_I32, st->T, 1, st->p);
	b.seq = tu_tensor(be, KT_I32, st->T, 1, seq);
	return b;
}

static void batch_free(struct kt_backend *be, struct kt_batch *b)
{
	kt_free(be, &b->pos);
	kt_free(be, &b->seq);
}

/* kv_store the step's rows of the logical K/V. */
static void store_step(struct kt_backend *be, const struct world *w, const struct step *st)
{
	size_t n = (size_t)st->T * w->C;
	float *k = malloc(n * sizeof(float) + 1), *v = malloc(n * sizeof(float) + 1);
	struct kt_batch b = batch_make(be, w, st);
	struct kt_tensor kt, vt;

	for (int t = 0; t < st->T; t++) {
		memcpy(k + (size_t)t * w->C, w->K[st->s[t]] + (size_t)st->p[t] * w->C,
		       w->C * sizeof(float));
		memcpy(v + (size_t)t * w->C, w->V[st->s[t]] + (size_t)st->p[t] * w->C,
		       w->C * sizeof(float));
	}
	kt = tu_tensor(be, KT_F32, st->T, w->C, k);
	vt = tu_tensor(be, KT_F32, st->T, w->C, v);
	assert_int_equal(kt_kv_store(be, &w->kc, &w->vc, &kt, &vt, &b), 0);
	batch_free(be, &b);
	kt_free(be, &kt);
	kt_free(be, &vt);
	free(k);
	free(v);
}

/* The caches hold positions [0, upto(s)) of each sequence exactly where the
 * block table puts them, and every other row is still poison. */
static void check_cache(struct kt_backend *be, const struct world *w, bool history)
{
	size_t rows = (size_t)w->kc.rows, n = rows * w->C;
	float *kc = malloc(n * sizeof(float)), *vc = malloc(n * sizeof(float));
	char *hit = calloc(rows, 1);

	tu_get(be, &w->kc, kc);
	tu_get(be, &w->vc, vc);
	for (int s = 0; s < w->sc->n_seqs; s++) {
		int upto = history ? w->sc->hist[s] : w->len[s];

		for (int p = 0; p < upto; p++) {
			int32_t block = w->bt[w->slot[s] * w->bt_cols + p / w->sc->bs];
			size_t row = (size_t)block * w->sc->bs + p % w->sc->bs;

			assert_memory_equal(kc + row * w->C, w->K[s] + (size_t)p * w->C,
					    w->C * sizeof(float));
			assert_memory_equal(vc + row * w->C, w->V[s] + (size_t)p * w->C,
					    w->C * sizeof(float));
			hit[row] = 1;
		}
	}
	for (size_t r = 0; r < rows; r++)
		for (int c = 0; !hit[r] && c < w->C; c++)
			assert_true(isnan(kc[r * w->C + c]) && isnan(vc[r * w->C + c]));
	free(kc);
	free(vc);
	free(hit);
}

/* Naive attention of token (s, p), head h, in double over the logical arrays. */
static void reference(const struct world *w, int s, int p, int h, const float *q, double scale,
		      double *out, double *mag)
{
	const struct scenario *sc = w->sc;
	int kvh = h / (sc->n_heads / sc->n_kv), D = sc->D;
	double *score = malloc(sizeof(double) * (p + 1)), m = -INFINITY, sum = 0.0;

	for (int j = 0; j <= p; j++) {
		const float *k = w->K[s] + (size_t)j * w->C + kvh * D;
		double d = 0.0;

		for (int i = 0; i < D; i++)
			d += (double)q[i] * k[i];
		score[j] = d * scale;
		m = fmax(m, score[j]);
	}
	for (int j = 0; j <= p; j++)
		sum += score[j] = exp(score[j] - m);
	for (int i = 0; i < D; i++)
		out[i] = mag[i] = 0.0;
	for (int j = 0; j <= p; j++) {
		const float *v = w->V[s] + (size_t)j * w->C + kvh * D;

		for (int i = 0; i < D; i++) {
			out[i] += score[j] / sum * v[i];
			mag[i] += score[j] / sum * fabs(v[i]);
		}
	}
	free(score);
}

/* Every token attended alone (a batch of one) gives bitwise what it got in
 * the whole batch (DESIGN §4.1). */
static void check_alone(struct kt_backend *be, const struct world *w, const struct kt_batch *b,
			const struct kt_tensor *q, const float *batch_out)
{
	const struct scenario *sc = w->sc;
	int QC = sc->n_heads * sc->D;
	float *row = malloc(sizeof(float) * QC);
	struct kt_tensor out = tu_tensor(be, KT_F32, 1, QC, NULL);

	for (int t = 0; t < b->n_tokens; t++) {
		struct kt_batch one = *b;
		struct kt_tensor qt = kt_rows(*q, t, 1);

		one.n_tokens = 1;
		one.pos = kt_rows(b->pos, t, 1);
		one.seq = kt_rows(b->seq, t, 1);
		assert_int_equal(kt_attention(be, &out, &qt, &w->kc, &w->vc, &one, sc->n_heads,
					      sc->n_kv, sc->D, (float)(1.0 / sqrt(sc->D))), 0);
		tu_get(be, &out, row);
		assert_memory_equal(row, batch_out + (size_t)t * QC, sizeof(float) * QC);
	}
	kt_free(be, &out);
	free(row);
}

static void run_scenario(struct kt_backend *be, const struct scenario *sc)
{
	struct world w;
	struct step st;
	struct kt_batch b;
	struct kt_tensor qt, ot;
	int QC = sc->n_heads * sc->D;
	float *q, *got;
	double *ref, *mag, scale = 1.0 / sqrt(sc->D);
	char what[128];

	world_init(be, &w, sc);
	step_make(&st, &w, true);
	if (st.T) {
		store_step(be, &w, &st);
		check_cache(be, &w, true);
	}
	step_make(&st, &w, false);
	store_step(be, &w, &st);
	check_cache(be, &w, false);

	q = malloc(sizeof(float) * st.T * QC);
	got = malloc(sizeof(float) * st.T * QC);
	ref = malloc(sizeof(double) * st.T * QC);
	mag = malloc(sizeof(double) * st.T * QC);
	tu_fill(q, (size_t)st.T * QC, sc->qmag);
	b = batch_make(be, &w, &st);
	qt = tu_tensor(be, KT_F32, st.T, QC, q);
	ot = sc->in_place ? qt : tu_tensor(be, KT_F32, st.T, QC, NULL);
	assert_int_equal(kt_attention(be, &ot, &qt, &w.kc, &w.vc, &b, sc->n_heads, sc->n_kv, sc->D,
				      (float)scale), 0);
	for (int t = 0; t < st.T; t++)
		for (int h = 0; h < sc->n_heads; h++) {
			size_t at = (size_t)t * QC + (size_t)h * sc->D;

			reference(&w, st.s[t], st.p[t], h, q + at, (float)scale, ref + at, mag + at);
		}
	tu_get(be, &ot, got);
	snprintf(what, sizeof what, "attention %s (T=%d)", sc->name, st.T);
	tu_check(what, got, ref, mag, (size_t)st.T * QC, sc->tol);
	if (!sc->in_place)
		check_alone(be, &w, &b, &qt, got);

	batch_free(be, &b);
	if (!sc->in_place)
		kt_free(be, &ot);
	kt_free(be, &qt);
	world_free(be, &w);
	free(q);
	free(got);
	free(ref);
	free(mag);
}

/* tol: 1e-5, but the peaky case (scores beyond 88, where expf overflows
 * unless the max is subtracted) has f32 dot products of terms summing to ~300
 * in magnitude, whose rounding (~2e-5) shows up in the weights. */
static const struct scenario scenarios[] = {
	{ "MHA 4/4 D=64 bs=16", 4, 4, 64, 16, 4, { 0, 37, 16, 100 }, { 9, 1, 5, 1 }, 1.0f, false,
	  1e-5 },
	{ "GQA 8/2 D=128 bs=8", 8, 2, 128, 8, 3, { 250, 3, 0 }, { 1, 12, 1 }, 1.0f, false, 1e-5 },
	{ "GQA 6/3 D=72 bs=5 in-place", 6, 3, 72, 5, 5, { 7, 0, 33, 1, 64 }, { 1, 4, 3, 1, 1 },
	  1.0f, true, 1e-5 },
	{ "MQA 4/1 D=64 bs=32 long", 4, 1, 64, 32, 2, { 1000, 480 }, { 1, 40 }, 1.0f, false, 1e-5 },
	{ "GQA 20/2 D=36 bs=16 g=10", 20, 2, 36, 16, 3, { 30, 5, 0 }, { 1, 3, 6 }, 1.0f,
	  false, 1e-5 },
	{ "GQA 16/4 D=128 bs=16 peaky", 16, 4, 128, 16, 3, { 60, 0, 200 }, { 1, 20, 2 }, 10.0f,
	  false, 1e-4 },
};

static void test_attention_scenarios(void **state)
{
	struct kt_backend *be = *state;

	tu_seed(21);
	for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++)
		run_scenario(be, &scenarios[i]);
}

/* Batches that point outside the cache or the limits are refused before
 * anything is written. */
static void test_refusals(void **state)
{
	struct kt_backend *be = *state;
	const struct scenario sc = { "refusals", 4, 2, 64, 8, 2, { 0, 0 }, { 5, 3 }, 1.0f, false,
				     0.0 };
	struct world w;
	struct step st;
	struct kt_batch b;
	struct kt_tensor q, out, k;
	int32_t big[8];

	tu_seed(22);
	world_init(be, &w, &sc);
	step_make(&st, &w, false);
	b = batch_make(be, &w, &st);
	q = tu_tensor(be, KT_F32, st.T, 4 * 64, NULL);
	out = tu_tensor(be, KT_F32, st.T, 4 * 64, NULL);
	k = tu_tensor(be, KT_F32, st.T, 2 * 64, NULL);

	assert_int_equal(kt_attention(be, &out, &q, &w.kc, &w.vc, &b, 4, 3, 64, 0.125f), -EINVAL);
	assert_int_equal(kt_attention(be, &out, &q, &w.kc, &w.vc, &b, 4, 4, 64, 0.125f), -EINVAL);
	assert_int_equal(kt_attention(be, &out, &q, &w.kc, &w.vc, &b, 4, 2, 64, NAN), -EINVAL);
	b.n_tokens--;
	assert_int_equal(kt_attention(be, &out, &q, &w.kc, &w.vc, &b, 4, 2, 64, 0.125f), -EINVAL);
	assert_int_equal(kt_kv_store(be, &w.kc, &w.vc, &k, &k, &b), -EINVAL);
	b.n_tokens++;
	b.block_size = 16; /* no longer matches the table */
	assert_int_equal(kt_kv_store(be, &w.kc, &w.vc, &k, &k, &b), -EINVAL);
	b.block_size = 8;

	/* A block id outside the cache, then a position past max_context. */
	for (int t = 0; t < st.T; t++)
		big[t] = st.p[t];
	big[st.T - 1] = TU_MAX_CONTEXT;
	assert_int_equal(kt_upload(be, &b.pos, 0, big, st.T * sizeof(int32_t)), 0);
	assert_int_equal(kt_attention(be, &out, &q, &w.kc, &w.vc, &b, 4, 2, 64, 0.125f), -EINVAL);
	assert_int_equal(kt_kv_store(be, &w.kc, &w.vc, &k, &k, &b), -EINVAL);
	assert_int_equal(kt_upload(be, &b.pos, 0, st.p, st.T * sizeof(int32_t)), 0);
	int32_t bad_block = w.n_blocks;
	assert_int_equal(kt_upload(be, &w.btt, (size_t)w.slot[0] * w.bt_cols * sizeof(int32_t),
				   &bad_block, sizeof bad_block), 0);
	assert_int_equal(kt_attention(be, &out, &q, &w.kc, &w.vc, &b, 4, 2, 64, 0.125f), -EINVAL);
	assert_int_equal(kt_kv_store(be, &w.kc, &w.vc, &k, &k, &b), -EINVAL);

	/* Nothing was written anywhere. */
	float *got = malloc(kt_nbytes(&out));
	tu_get(be, &out, got);
	for (int i = 0; i < st.T * 4 * 64; i++)
		assert_true(isnan(got[i]));
	free(got);
	got = malloc(kt_nbytes(&w.kc));
	tu_get(be, &w.kc, got);
	for (int64_t i = 0; i < w.kc.rows * w.kc.cols; i++)
		assert_true(isnan(got[i]));
	free(got);

	batch_free(be, &b);
	kt_free(be, &q);
	kt_free(be, &out);
	kt_free(be, &k);
	world_free(be, &w);
}

static int setup(void **state)
{
	*state = tu_open(0);
	return 0;
}

static int teardown(void **state)
{
	kt_backend_close(*state);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_attention_scenarios),
		cmocka_unit_test(test_refusals),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
