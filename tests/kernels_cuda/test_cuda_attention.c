/* kv_store and paged attention, cuda against cpu.
 *
 * Each case builds a step like the engine's: several sequences whose blocks
 * are scattered over the cache in shuffled order (block tables), rows of
 * prefill chunks and decode tokens mixed in one batch in shuffled order, one
 * sequence at its first position, an unused slot whose table is all -1. The
 * history is stored first, then the step's k/v, then attention runs (into
 * its own buffer, and in place over q). Tolerances: caches bitwise equal;
 * attention max_abs <= 2e-5 and NMSE <= 1e-10 (outputs are convex
 * combinations of values in [-1, 1]; online softmax in f32 on the device
 * against two-pass softmax on the cpu).
 *
 * The last test checks the device-side index checks: a bad block id, slot
 * or token id makes the next sync point fail with -EINVAL, and the backend
 * works normally afterwards.
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

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	assert_non_null(p);
	return p;
}

/* The sequences of a step: slot s has history positions [0, hist[s]) already
 * in the cache and step positions [hist[s], hist[s] + step[s]). */
#define N_SLOTS 5
static const int hist[N_SLOTS] = { 0, 300, 40, 0, 0 };
static const int step[N_SLOTS] = { 13, 1, 10, 0, 1 }; /* slot 3 unused */

struct kv_case {
	int n_heads, n_kv, D, bs;
	int64_t row_len, n_blocks, bt_cols;
	struct ct_pair kc, vc, bt;
	int32_t *table; /* [CT_MAX_SEQS, bt_cols] host copy */
};

static void case_init(struct kv_case *c)
{
	int32_t *perm;
	int64_t need = 0, next = 0, rows;
	float *init;

	c->row_len = (int64_t)c->n_kv * c->D;
	c->bt_cols = (CT_MAX_CONTEXT + c->bs - 1) / c->bs;
	for (int s = 0; s < N_SLOTS; s++)
		need += (hist[s] + step[s] + c->bs - 1) / c->bs;
	c->n_blocks = need + 7;
	perm = xmalloc((size_t)c->n_blocks * 4);
	for (int64_t i = 0; i < c->n_blocks; i++)
		perm[i] = (int32_t)i;
	ct_shuffle(perm, (int)c->n_blocks);
	c->table = xmalloc((size_t)CT_MAX_SEQS * c->bt_cols * 4);
	for (int64_t i = 0; i < CT_MAX_SEQS * c->bt_cols; i++)
		c->table[i] = -1;
	for (int s = 0; s < N_SLOTS; s++)
		for (int b = 0; b < (hist[s] + step[s] + c->bs - 1) / c->bs; b++)
			c->table[s * c->bt_cols + b] = perm[next++];
	rows = c->n_blocks * c->bs;
	init = xmalloc((size_t)rows * c->row_len * 4);
	ct_fill(init, (size_t)rows * c->row_len, 1.0f);
	c->kc = ct_pair_new(KT_F32, rows, c->row_len, init);
	ct_fill(init, (size_t)rows * c->row_len, 1.0f);
	c->vc = ct_pair_new(KT_F32, rows, c->row_len, init);
	c->bt = ct_pair_new(KT_I32, CT_MAX_SEQS, c->bt_cols, c->table);
	free(init);
	free(perm);
}

static void case_free(struct kv_case *c)
{
	ct_pair_free(&c->kc);
	ct_pair_free(&c->vc);
	ct_pair_free(&c->bt);
	free(c->table);
}

/* A batch of T tokens with the given slots and positions, on both backends. */
struct batch_pair {
	struct kt_batch c, g;
	struct ct_pair pos, seq;
};

static struct batch_pair batch_new(struct kv_case *kc, const int32_t *seq, const int32_t *pos,
				   int T)
{
	struct batch_pair b;
	int max_len = 0;

	for (int t = 0; t < T; t++)
		max_len = pos[t] + 1 > max_len ? pos[t] + 1 : max_len;
	b.pos = ct_pair_new(KT_I32, T, 1, pos);
	b.seq = ct_pair_new(KT_I32, T, 1, seq);
	b.c = (struct kt_batch){ .n_tokens = T, .block_size = kc->bs, .max_kv_len = max_len,
				 .pos = b.pos.c, .seq = b.seq.c, .block_tables = kc->bt.c };
	b.g = b.c;
	b.g.pos = b.pos.g;
	b.g.seq = b.seq.g;
	b.g.block_tables = kc->bt.g;
	return b;
}

static void batch_free(struct batch_pair *b)
{
	ct_pair_free(&b->pos);
	ct_pair_free(&b->seq);
}

/* Store random k/v rows for the tokens (seq, pos) on both backends. */
static void store(struct kv_case *c, const int32_t *seq, const int32_t *pos, int T)
{
	float *k = xmalloc((size_t)T * c->row_len * 4), *v = xmalloc((size_t)T * c->row_len * 4);
	struct batch_pair b = batch_new(c, seq, pos, T);
	struct ct_pair pk, pv;

	ct_fill(k, (size_t)T * c->row_len, 1.0f);
	ct_fill(v, (size_t)T * c->row_len, 1.0f);
	pk = ct_pair_new(KT_F32, T, c->row_len, k);
	pv = ct_pair_new(KT_F32, T, c->row_len, v);
	assert_int_equal(kt_kv_store(ct_cpu, &c->kc.c, &c->vc.c, &pk.c, &pv.c, &b.c), 0);
	assert_int_equal(kt_kv_store(ct_gpu, &c->kc.g, &c->vc.g, &pk.g, &pv.g, &b.g), 0);
	ct_pair_free(&pk);
	ct_pair_free(&pv);
	batch_free(&b);
	free(k);
	free(v);
}

static void compare_caches(struct kv_case *c, const char *what)
{
	size_t n = (size_t)c->n_blocks * c->bs * c->row_len;
	float *a = xmalloc(n * 4), *b = xmalloc(n * 4);
	char name[128];

	ct_pair_get(&c->kc, a, b);
	snprintf(name, sizeof name, "%s: k cache", what);
	ct_compare_exact(name, b, a, n);
	ct_pair_get(&c->vc, a, b);
	snprintf(name, sizeof name, "%s: v cache", what);
	ct_compare_exact(name, b, a, n);
	free(a);
	free(b);
}

/* The step's tokens in shuffled order; returns T. */
static int step_tokens(int32_t *seq, int32_t *pos)
{
	int32_t s0[64], p0[64], order[64];
	int T = 0;

	for (int s = 0; s < N_SLOTS; s++)
		for (int i = 0; i < step[s]; i++) {
			s0[T] = s;
			p0[T++] = hist[s] + i;
		}
	for (int t = 0; t < T; t++)
		order[t] = t;
	ct_shuffle(order, T);
	for (int t = 0; t < T; t++) {
		seq[t] = s0[order[t]];
		pos[t] = p0[order[t]];
	}
	return T;
}

static void run_case(int n_heads, int n_kv, int D, int bs)
{
	struct kv_case c = { .n_heads = n_heads, .n_kv = n_kv, .D = D, .bs = bs };
	int32_t seq[512], pos[512];
	int T = 0, cols = n_heads * D;
	float *q, *oc, *og;
	struct ct_pair pq, po;
	struct batch_pair b;
	float scale = 1.0f / sqrtf((float)D);
	char what[96], name[160];

	case_init(&c);
	for (int s = 0; s < N_SLOTS; s++)
		for (int p = 0; p < hist[s]; p++) {
			seq[T] = s;
			pos[T++] = p;
		}
	store(&c, seq, pos, T);
	T = step_tokens(seq, pos);
	store(&c, seq, pos, T);
	snprintf(what, sizeof what, "heads %d/%d, head_dim %d, block %d", n_heads, n_kv, D, bs);
	compare_caches(&c, what);

	q = xmalloc((size_t)T * cols * 4);
	oc = xmalloc((size_t)T * cols * 4);
	og = xmalloc((size_t)T * cols * 4);
	ct_fill(q, (size_t)T * cols, 2.0f);
	pq = ct_pair_new(KT_F32, T, cols, q);
	po = ct_pair_new(KT_F32, T, cols, NULL);
	b = batch_new(&c, seq, pos, T);
	assert_int_equal(kt_attention(ct_cpu, &po.c, &pq.c, &c.kc.c, &c.vc.c, &b.c, n_heads, n_kv,
				      D, scale), 0);
	assert_int_equal(kt_attention(ct_gpu, &po.g, &pq.g, &c.kc.g, &c.vc.g, &b.g, n_heads, n_kv,
				      D, scale), 0);
	ct_pair_get(&po, oc, og);
	snprintf(name, sizeof name, "attention %s, %d tokens", what, T);
	ct_compare(name, og, oc, (size_t)T * cols, 2e-5, 1e-10);
	/* in place: out == q */
	assert_int_equal(kt_attention(ct_cpu, &pq.c, &pq.c, &c.kc.c, &c.vc.c, &b.c, n_heads, n_kv,
				      D, scale), 0);
	assert_int_equal(kt_attention(ct_gpu, &pq.g, &pq.g, &c.kc.g, &c.vc.g, &b.g, n_heads, n_kv,
				      D, scale), 0);
	ct_pair_get(&pq, oc, og);
	ct_compare("  same, in place over q", og, oc, (size_t)T * cols, 2e-5, 1e-10);
	batch_free(&b);
	ct_pair_free(&pq);
	ct_pair_free(&po);
	case_free(&c);
	free(q);
	free(oc);
	free(og);
}

static void test_gqa(void **state)
{
	ct_seed(11);
	run_case(8, 2, 128, 16);
	run_case(16, 2, 64, 16);
	run_case(2, 1, 256, 32);
}

static void test_mha(void **state)
{
	ct_seed(12);
	run_case(4, 4, 64, 16);
	run_case(4, 4, 128, 64);
}

static void test_odd_shapes(void **state)
{
	ct_seed(13);
	run_case(6, 3, 80, 5);  /* head_dim not a multiple of 32, odd block size */
	run_case(3, 3, 34, 7);  /* head_dim not a multiple of 4: scalar loads */
	run_case(5, 1, 96, 1);  /* one position per block */
}

static void expect_sync(int want, const char *what)
{
	int rc = kt_synchronize(ct_gpu);

	printf("  %-44s sync point returned %d (want %d)\n", what, rc, want);
	assert_int_equal(rc, want);
}

static void test_device_index_checks(void **state)
{
	struct kv_case c = { .n_heads = 4, .n_kv = 2, .D = 64, .bs = 16 };
	int32_t seq[64], pos[64], bad;
	int T, cols = 4 * 64;
	float *q, *out;
	struct ct_pair pq, po, ids, kv;
	struct kt_tensor row;
	struct batch_pair b;

	ct_seed(14);
	case_init(&c);
	T = step_tokens(seq, pos);
	q = xmalloc((size_t)T * cols * 4);
	out = xmalloc((size_t)T * cols * 4);
	ct_fill(q, (size_t)T * cols, 1.0f);
	pq = ct_pair_new(KT_F32, T, cols, q);
	po = ct_pair_new(KT_F32, T, cols, NULL);
	b = batch_new(&c, seq, pos, T);

	/* slot 1's first block id points past the cache */
	bad = (int32_t)c.n_blocks + 3;
	assert_int_equal(kt_upload(ct_gpu, &c.bt.g, (size_t)c.bt_cols * 4, &bad, 4), 0);
	assert_int_equal(kt_attention(ct_gpu, &po.g, &pq.g, &c.kc.g, &c.vc.g, &b.g, 4, 2, 64,
				      0.125f), 0);
	expect_sync(-22, "attention with a bad block id");
	assert_int_equal(kt_download(ct_gpu, out, &po.g, 0, kt_nbytes(&po.g)), 0);
	for (int t = 0; t < T; t++)
		assert_true(seq[t] == 1 ? isnan(out[(size_t)t * cols])
					: isfinite(out[(size_t)t * cols]));
	printf("  %-44s NaN rows exactly for the bad sequence\n", "");
	assert_int_equal(kt_upload(ct_gpu, &c.bt.g, 0, c.table, kt_nbytes(&c.bt.g)), 0);
	assert_int_equal(kt_attention(ct_gpu, &po.g, &pq.g, &c.kc.g, &c.vc.g, &b.g, 4, 2, 64,
				      0.125f), 0);
	expect_sync(0, "attention again with the table fixed");

	/* a slot outside the block table */
	bad = CT_MAX_SEQS;
	assert_int_equal(kt_upload(ct_gpu, &b.seq.g, 0, &bad, 4), 0);
	kv = ct_pair_new(KT_F32, T, c.row_len, NULL);
	assert_int_equal(kt_kv_store(ct_gpu, &c.kc.g, &c.vc.g, &kv.g, &kv.g, &b.g), 0);
	expect_sync(-22, "kv_store with a bad sequence slot");
	expect_sync(0, "nothing enqueued since");

	/* a token id past the table (kv's T rows serve as a table) */
	bad = 1000;
	ids = ct_pair_new(KT_I32, 1, 1, &bad);
	row = kt_reshape(kt_rows(po.g, 0, 1), 1, c.row_len);
	assert_int_equal(kt_embed(ct_gpu, &row, &kv.g, &ids.g), 0);
	assert_int_equal(kt_download(ct_gpu, out, &po.g, 0, 4), -22);
	printf("  %-44s download returned -22\n", "embed with a token id past the table");
	expect_sync(0, "nothing enqueued since");

	ct_pair_free(&ids);
	ct_pair_free(&kv);
	batch_free(&b);
	ct_pair_free(&pq);
	ct_pair_free(&po);
	case_free(&c);
	free(q);
	free(out);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_gqa),
		cmocka_unit_test(test_mha),
		cmocka_unit_test(test_odd_shapes),
		cmocka_unit_test(test_device_index_checks),
	};

	ct_require_device();
	return cmocka_run_group_tests(tests, ct_setup, ct_teardown);
}
