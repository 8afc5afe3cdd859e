/* The scripted family (engine/model/script/script.h) apart from the engine
 * and FUSE: its rules on hand-made contexts, and its forward pass on the
 * cpu backend (ATLAS_TEST_BACKEND=cuda for another one) over paged caches
 * with shuffled block tables, prompts in chunks of several sizes and two
 * sequences batched in one step, which must give the tokens each sequence
 * gives alone. Also: a broken config.json names the file and the key.
 *
 *     test_script MODEL_DIR      (tests/fs/script-model)
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/clock.h"
#include "common/err.h"
#include "engine/model/model.h"
#include "engine/model/script/script.h"
#include "fake_model.h"

#define MAX_CTX 256
#define BLOCK 4
#define N_BLOCKS (2 * MAX_CTX / BLOCK)
#define MAX_TOKENS 24
#define MAX_OUT 4

static const char *model_dir;

/* ---- contexts ---- */

struct ctx {
	int32_t t[MAX_CTX];
	int n;
};

static void add_text(struct ctx *c, const char *s)
{
	for (; *s; s++)
		c->t[c->n++] = (unsigned char)*s;
}

static void add(struct ctx *c, int32_t token)
{
	c->t[c->n++] = token;
}

/* A ChatML turn as the engine writes it: the user text, then the header
 * that opens the answer. */
static void add_chat_turn(struct ctx *c, const char *user)
{
	add(c, SCRIPT_IM_START);
	add_text(c, "user\n");
	add_text(c, user);
	add(c, SCRIPT_IM_END);
	add_text(c, "\n");
	add(c, SCRIPT_IM_START);
	add_text(c, "assistant\n");
}

/* Run the rules to the end of the answer (or max tokens), appending to c:
 * the tokens, and the sleep the last step asked for. */
static int answer(struct ctx *c, int max, int32_t *out, unsigned *sleep_ms)
{
	int k = 0;
	while (k < max) {
		struct script_next nx;
		script_next(c->t, c->n, &nx);
		*sleep_ms = nx.sleep_ms;
		out[k++] = nx.token;
		if (nx.token < 0 || nx.token == SCRIPT_EOS || nx.token == SCRIPT_IM_END)
			break;
		add(c, nx.token);
	}
	return k;
}

/* The answer's bytes as a string, its last token apart. */
static void expect_answer(struct ctx *c, const char *text, int32_t last, unsigned sleep_ms)
{
	int32_t got[MAX_CTX];
	unsigned slept = 0;
	int n = answer(c, (int)strlen(text) + 1, got, &slept);
	char s[MAX_CTX] = "";
	for (int i = 0; i < n - 1; i++)
		s[i] = (char)got[i];
	assert_string_equal(s, text);
	assert_int_equal(got[n - 1], last);
	assert_int_equal(slept, sleep_ms);
	if (last >= 0)
		add(c, last);
}

static void test_rules_chat(void **state)
{
	struct ctx c = { .n = 0 };
	/* A system message first; its text is not the question. */
	add(&c, SCRIPT_IM_START);
	add_text(&c, "system\nbe brief");
	add(&c, SCRIPT_IM_END);
	add_text(&c, "\n");
	add_chat_turn(&c, "ab\xc3\xa9\xe2\x82\xac");   /* abé€ */
	expect_answer(&c, "\xe2\x82\xac\xc3\xa9" "ba", SCRIPT_IM_END, 0);
	/* The next turn follows the template's close of the previous answer. */
	add_text(&c, "\n");
	add_chat_turn(&c, "second");
	expect_answer(&c, "dnoces", SCRIPT_IM_END, 0);
	/* An empty question is answered at once. */
	add_text(&c, "\n");
	add_chat_turn(&c, "");
	expect_answer(&c, "", SCRIPT_IM_END, 0);
}

static void test_rules_raw(void **state)
{
	struct ctx c = { .n = 0 };
	add_text(&c, "hello\n");
	struct script_next nx;
	script_next(c.t, c.n, &nx);
	assert_int_equal(nx.token, SCRIPT_ANSWER);
	add(&c, SCRIPT_ANSWER);
	expect_answer(&c, "olleh", SCRIPT_EOS, 0);
	/* The next raw prompt is the text after that end. */
	add_text(&c, "xyz");
	script_next(c.t, c.n, &nx);
	assert_int_equal(nx.token, SCRIPT_ANSWER);
	add(&c, SCRIPT_ANSWER);
	expect_answer(&c, "zyx", SCRIPT_EOS, 0);
	/* After a chat answer, raw text is a raw prompt. */
	add_chat_turn(&c, "q");
	expect_answer(&c, "q", SCRIPT_IM_END, 0);
	add_text(&c, "r\n");
	script_next(c.t, c.n, &nx);
	assert_int_equal(nx.token, SCRIPT_ANSWER);
}

static void test_rules_scripts(void **state)
{
	struct ctx c = { .n = 0 };
	add_chat_turn(&c, "SLEEP 30 xy");
	expect_answer(&c, "yx", SCRIPT_IM_END, 30);   /* the end's step sleeps too */

	/* Not a script: no number, too long, no TEXT separator. */
	const char *plain[] = { "SLEEP x", "SLEEP 10001 x", "SLEEP 5", "FAILab", "sleep 5 x" };
	for (size_t i = 0; i < ATLAS_ARRAY_LEN(plain); i++) {
		char want[32];
		size_t n = strlen(plain[i]);
		for (size_t k = 0; k < n; k++)
			want[k] = plain[i][n - 1 - k];
		want[n] = 0;
		add_text(&c, "\n");
		add_chat_turn(&c, plain[i]);
		expect_answer(&c, want, SCRIPT_IM_END, 0);
	}

	add_text(&c, "\n");
	add_chat_turn(&c, "FAIL ab");
	expect_answer(&c, "ba", -1, 0);

	struct ctx s = { .n = 0 };
	add_chat_turn(&s, "SLOW ab");
	int32_t got[8];
	unsigned slept = 0;
	assert_int_equal(answer(&s, 8, got, &slept), 8);
	assert_int_equal(got[0], 'b');
	assert_int_equal(got[1], 'a');
	for (int i = 2; i < 8; i++)
		assert_int_equal(got[i], SCRIPT_WAIT);
	assert_int_equal(slept, SCRIPT_WAIT_MS);

	/* Raw SLEEP: the question loses its trailing newline first. */
	struct ctx r = { .n = 0 };
	add_text(&r, "SLEEP 7 ok\n");
	add(&r, SCRIPT_ANSWER);
	expect_answer(&r, "ko", SCRIPT_EOS, 7);
}

/* ---- the forward pass ---- */

struct fixture {
	struct kt_backend *be;
	struct model *m;
	struct kt_tensor kcache, vcache, tables, ids, pos, seq, out_rows, logits;
};

/* A sequence being generated: its context, how much of it has K/V, and its
 * slot's block table. */
struct seq {
	struct ctx c;
	int fed;
	int slot;
	int chunk;                      /* prompt rows per step */
	int32_t blocks[MAX_CTX / BLOCK];
	int n_generated;
	bool ended;
};

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof *f);
	const char *backend = getenv("ATLAS_TEST_BACKEND");
	struct kt_config kc = { .backend = backend ? backend : "cpu", .threads = 1,
				.max_tokens = MAX_TOKENS, .max_seqs = 2, .max_context = MAX_CTX,
				.max_heads = 1, .max_head_dim = 2 };
	char err[ATLAS_ERRLEN];
	if (!f || kt_backend_open(&kc, &f->be, err, sizeof err) ||
	    model_load(model_dir, f->be, MAX_TOKENS, MAX_OUT, &f->m, err, sizeof err)) {
		fprintf(stderr, "%s\n", err);
		return -1;
	}
	const struct model_config *mc = model_get_config(f->m);
	assert_int_equal(mc->n_attention_layers, 1);
	assert_int_equal(mc->vocab_size, SCRIPT_VOCAB);
	enum kt_dtype kv = f->be->info.kv_dtype;
	struct kt_backend *be = f->be;
	if (kt_alloc(be, kv, N_BLOCKS * BLOCK, 2, &f->kcache) ||
	    kt_alloc(be, kv, N_BLOCKS * BLOCK, 2, &f->vcache) ||
	    kt_alloc(be, KT_I32, 2, MAX_CTX / BLOCK, &f->tables) ||
	    kt_alloc(be, KT_I32, MAX_TOKENS, 1, &f->ids) ||
	    kt_alloc(be, KT_I32, MAX_TOKENS, 1, &f->pos) ||
	    kt_alloc(be, KT_I32, MAX_TOKENS, 1, &f->seq) ||
	    kt_alloc(be, KT_I32, MAX_OUT, 1, &f->out_rows) ||
	    kt_alloc(be, KT_F32, MAX_OUT, SCRIPT_VOCAB, &f->logits))
		return -1;
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	struct kt_tensor *t[] = { &f->kcache, &f->vcache, &f->tables, &f->ids, &f->pos, &f->seq,
				  &f->out_rows, &f->logits };
	for (size_t i = 0; i < ATLAS_ARRAY_LEN(t); i++)
		kt_free(f->be, t[i]);
	model_free(f->m);
	kt_backend_close(f->be);
	free(f);
	return 0;
}

/* Give the sequences blocks of the pool in a shuffled order (seeded). */
static void shuffle_blocks(struct seq *s, int n, unsigned seed)
{
	int32_t perm[N_BLOCKS];
	for (int i = 0; i < N_BLOCKS; i++)
		perm[i] = i;
	for (int i = N_BLOCKS - 1; i > 0; i--) {
		seed = seed * 1103515245u + 12345u;
		int j = (int)((seed >> 8) % (unsigned)(i + 1));
		int32_t t = perm[i];
		perm[i] = perm[j];
		perm[j] = t;
	}
	for (int k = 0; k < n; k++)
		for (int b = 0; b < MAX_CTX / BLOCK; b++)
			s[k].blocks[b] = perm[k * (MAX_CTX / BLOCK) + b];
}

static int argmax(const float *row)
{
	int best = 0;
	for (int v = 1; v < SCRIPT_VOCAB; v++)
		if (row[v] > row[best])
			best = v;
	return best;
}

/* One step over the sequences that are not done: one decode row for each
 * with one token to feed (first), then a prompt chunk of each other one.
 * Returns model_forward's result; sampled tokens are appended. */
static int step(struct fixture *f, struct seq *s, int n)
{
	int32_t ids[MAX_TOKENS], pos[MAX_TOKENS], slot[MAX_TOKENS], out[MAX_OUT];
	struct kt_segment segs[2];
	struct seq *owner[MAX_OUT];
	int T = 0, n_out = 0, n_single = 0, n_segs = 0;
	for (int pass = 0; pass < 2; pass++)
		for (int k = 0; k < n; k++) {
			struct seq *q = &s[k];
			int pending = q->c.n - q->fed;
			if (q->ended || !pending || (pending == 1) != (pass == 0))
				continue;
			int rows = ATLAS_MIN(pending, q->chunk);
			if (pass == 1)
				segs[n_segs++] = (struct kt_segment){ .row = T, .n_rows = rows,
								      .pos0 = q->fed,
								      .seq = q->slot };
			else
				n_single++;
			for (int r = 0; r < rows; r++, T++) {
				ids[T] = q->c.t[q->fed + r];
				pos[T] = q->fed + r;
				slot[T] = q->slot;
			}
			q->fed += rows;
			if (q->fed == q->c.n) {
				owner[n_out] = q;
				out[n_out++] = T - 1;
			}
		}
	struct kt_backend *be = f->be;
	struct kt_batch b = {
		.n_tokens = T, .block_size = BLOCK, .max_kv_len = MAX_CTX,
		.pos = kt_rows(f->pos, 0, T), .seq = kt_rows(f->seq, 0, T),
		.block_tables = f->tables, .n_single = n_single, .n_segments = n_segs,
		.segments = segs,
	};
	for (int k = 0; k < n; k++)
		assert_int_equal(kt_upload(be, &f->tables, (size_t)s[k].slot * sizeof s[k].blocks,
					   s[k].blocks, sizeof s[k].blocks), 0);
	struct model_step ms = { .ids = kt_rows(f->ids, 0, T), .batch = b, .kcache = &f->kcache,
				 .vcache = &f->vcache, .out_rows = kt_rows(f->out_rows, 0, n_out),
				 .logits = kt_rows(f->logits, 0, n_out) };
	assert_int_equal(kt_upload(be, &ms.ids, 0, ids, (size_t)T * 4), 0);
	assert_int_equal(kt_upload(be, &b.pos, 0, pos, (size_t)T * 4), 0);
	assert_int_equal(kt_upload(be, &b.seq, 0, slot, (size_t)T * 4), 0);
	assert_int_equal(kt_upload(be, &ms.out_rows, 0, out, (size_t)n_out * 4), 0);
	int rc = model_forward(f->m, &ms);
	if (rc || !n_out)
		return rc;
	float logits[MAX_OUT][SCRIPT_VOCAB];
	assert_int_equal(kt_download(be, logits, &f->logits, 0, sizeof logits[0] * (size_t)n_out),
			 0);
	for (int i = 0; i < n_out; i++) {
		int next = argmax(logits[i]);
		/* A margin that no temperature undoes. */
		for (int v = 0; v < SCRIPT_VOCAB; v++)
			if (v != next)
				assert_true(logits[i][next] - logits[i][v] >= SCRIPT_LOGIT_MARGIN);
		struct seq *q = owner[i];
		add(&q->c, next);
		q->n_generated++;
		q->ended = next == SCRIPT_EOS || next == SCRIPT_IM_END || q->c.n == MAX_CTX;
	}
	return 0;
}

/* Generate until every sequence ended: 0, or the forward's error. */
static int run(struct fixture *f, struct seq *s, int n)
{
	for (int steps = 0; steps < 4 * MAX_CTX; steps++) {
		bool all = true;
		for (int k = 0; k < n; k++)
			all = all && s[k].ended;
		if (all)
			return 0;
		int rc = step(f, s, n);
		if (rc)
			return rc;
	}
	fail_msg("the sequences did not end");
	return -1;
}

/* The generated part of s as a string (the end token left out). */
static void expect_generated(const struct seq *s, const char *text, int32_t end)
{
	char got[MAX_CTX] = "";
	int start = s->c.n - s->n_generated;
	for (int i = start; i < s->c.n - 1; i++)
		got[i - start] = s->c.t[i] < 256 ? (char)s->c.t[i] : '#';
	assert_string_equal(got, text);
	assert_int_equal(s->c.t[s->c.n - 1], end);
}

static void test_forward_alone_and_batched(void **state)
{
	struct fixture *f = *state;
	struct seq chat = { .slot = 0 }, raw = { .slot = 1 };
	add_chat_turn(&chat.c, "the quick brown fox \xf0\x9f\xa6\x8a");
	add_text(&raw.c, "a raw prompt that is longer than a chunk\n");
	const char *chat_answer = "\xf0\x9f\xa6\x8a xof nworb kciuq eht";
	const char *raw_answer = "#knuhc a naht regnol si taht tpmorp war a";

	/* Each alone, in chunks of several sizes (1 is a token per step). */
	const int chunks[] = { 1, 3, 7, MAX_TOKENS / 2 };
	for (size_t i = 0; i < ATLAS_ARRAY_LEN(chunks); i++) {
		struct seq a = chat, b = raw;
		a.chunk = b.chunk = chunks[i];
		shuffle_blocks(&a, 1, (unsigned)i + 1);
		assert_int_equal(run(f, &a, 1), 0);
		expect_generated(&a, chat_answer, SCRIPT_IM_END);
		shuffle_blocks(&b, 1, (unsigned)i + 7);
		assert_int_equal(run(f, &b, 1), 0);
		expect_generated(&b, raw_answer, SCRIPT_EOS);
	}

	/* Both in the same steps: one prefills while the other decodes, with
	 * their blocks interleaved in the pool. */
	struct seq both[2] = { chat, raw };
	both[0].chunk = 5;
	both[1].chunk = 11;
	shuffle_blocks(both, 2, 42);
	assert_int_equal(run(f, both, 2), 0);
	expect_generated(&both[0], chat_answer, SCRIPT_IM_END);
	expect_generated(&both[1], raw_answer, SCRIPT_EOS);

	/* A second turn on the same sequence, its earlier KV kept. */
	add_text(&both[0].c, "\n");
	add_chat_turn(&both[0].c, "next");
	both[0].ended = false;
	both[0].n_generated = 0;
	assert_int_equal(run(f, both, 1), 0);
	expect_generated(&both[0], "txen", SCRIPT_IM_END);
}

static void test_forward_scripts(void **state)
{
	struct fixture *f = *state;
	struct seq s = { .slot = 1, .chunk = 4 };
	shuffle_blocks(&s, 1, 3);
	add_chat_turn(&s.c, "SLEEP 25 ab");
	double t0 = atlas_now_s();
	assert_int_equal(run(f, &s, 1), 0);
	expect_generated(&s, "ba", SCRIPT_IM_END);
	assert_true(atlas_now_s() - t0 >= 3 * 0.025);   /* b, a and the end */

	/* FAIL: the text, then the step fails. */
	struct seq bad = { .slot = 0, .chunk = 8 };
	shuffle_blocks(&bad, 1, 5);
	add_chat_turn(&bad.c, "FAIL xy");
	assert_int_equal(run(f, &bad, 1), -EIO);
	assert_int_equal(bad.n_generated, 2);
	assert_int_equal(bad.c.t[bad.c.n - 2], 'y');
	assert_int_equal(bad.c.t[bad.c.n - 1], 'x');
}

static void test_config_errors(void **state)
{
	char *dir = fake_tmpdir();
	assert_non_null(dir);
	const char *files[] = { "tokenizer.json", "tokenizer_config.json", "model.safetensors" };
	char src[4096], dst[4096];
	for (size_t i = 0; i < ATLAS_ARRAY_LEN(files); i++) {
		snprintf(src, sizeof src, "%s/%s", model_dir, files[i]);
		snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
		FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
		assert_true(in && out);
		char buf[4096];
		size_t n;
		while ((n = fread(buf, 1, sizeof buf, in)) > 0)
			assert_int_equal(fwrite(buf, 1, n, out), n);
		fclose(in);
		fclose(out);
	}
	snprintf(src, sizeof src, "%s/config.json", model_dir);
	json_t *config = json_load_file(src, 0, NULL);
	assert_non_null(config);
	const char *keys[] = { "head_dim", "num_hidden_layers", "vocab_size" };
	for (size_t i = 0; i < ATLAS_ARRAY_LEN(keys); i++) {
		json_t *c = json_deep_copy(config);
		json_object_set_new(c, keys[i], json_integer(4));
		snprintf(dst, sizeof dst, "%s/config.json", dir);
		assert_int_equal(fake_write_json(dst, c), 0);
		json_decref(c);
		struct model_config mc;
		char err[ATLAS_ERRLEN] = "";
		assert_int_equal(model_config_load(dir, &mc, err, sizeof err), -EINVAL);
		printf("  %s\n", err);
		assert_non_null(strstr(err, dst));
		assert_non_null(strstr(err, keys[i]));
	}
	json_decref(config);
	fake_rmtree(dir);
	free(dir);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s MODEL_DIR\n", argv[0]);
		return 1;
	}
	model_dir = argv[1];
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_rules_chat),
		cmocka_unit_test(test_rules_raw),
		cmocka_unit_test(test_rules_scripts),
		cmocka_unit_test(test_forward_alone_and_batched),
		cmocka_unit_test(test_forward_scripts),
		cmocka_unit_test(test_config_errors),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
