/* The engine through linear-attention layers (a hybrid model's recurrent
 * state, DESIGN §7.3) on the cpu backend, bitwise:
 *
 *  - N sequences decoded in one batch produce exactly what each produces
 *    alone, for N = 1, 2, 7 and max_batch: every sequence's state row and
 *    scratch rows are its own (the seed bug: a conv scratch sized for one
 *    sequence, overrun by the second);
 *  - speculative decoding (prompt lookup, and the MTP head) gives the
 *    tokens of plain decoding while drafts are rejected: the state goes
 *    back to its snapshot and the kept rows are fed again;
 *
 * test_engine runs the other invariants (chunk sizes, preemption, a second
 * turn on the state the first left) on the hybrid test models.
 *
 * Usage: test_hybrid [SHAPE_OR_DIR]   (default: the dummy shape
 * qwen3-next-test; a directory loads its weights). ATLAS_TEST_BACKEND=cuda
 * runs the same checks on another backend (tokens there, not bits).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/err.h"
#include "engine/engine.h"
#include "engine_testutil.h"

#define MAX_BATCH 12
#define N_SEQS MAX_BATCH
#define GEN_TOKENS 10

static const char *model = "qwen3-next-test";

static struct atlas_engine *open_engine(int max_batch, int chunk, enum atlas_spec spec)
{
	struct atlas_config c;
	struct stat st;
	et_config(&c, model);
	if (stat(model, &st) != 0)
		snprintf(c.load_format, sizeof c.load_format, "dummy");
	c.max_batch = max_batch;
	c.chunk_size = chunk;
	c.kv_memory = 64ull << 20;
	c.context = 512;
	c.spec = spec;
	c.spec_gate = false;
	struct atlas_engine *e;
	char err[ATLAS_ERRLEN];
	if (atlas_engine_open(&c, &e, err, sizeof err))
		fail_msg("atlas_engine_open: %s", err);
	atlas_engine_set_notify(e, et_on_notify, NULL);
	return e;
}

/* Prompt i: its own length (1 .. 90) and tokens; odd ones repeat a phrase,
 * which prompt lookup drafts from. */
static int prompt(int i, int vocab, int32_t *ids)
{
	const int n = 1 + (i * 37) % 90;
	et_prompt_ids(ids, n, 500u + (uint32_t)i, vocab);
	for (int j = 8; i % 2 && j < n; j++)
		ids[j] = ids[j % 8];
	return n;
}

/* Greedy continuations of prompts first .. first + n - 1, submitted at once. */
static void run(struct atlas_engine *e, int first, int n, int32_t out[][GEN_TOKENS])
{
	struct atlas_session *s[N_SEQS];
	char err[ATLAS_ERRLEN], name[16];
	const int vocab = atlas_engine_vocab_size(e);
	for (int i = 0; i < n; i++) {
		snprintf(name, sizeof name, "h%d", first + i);
		assert_int_equal(atlas_session_open(e, name, &s[i], err, sizeof err), 0);
		et_set(s[i], "mode", "raw");
		et_set(s[i], "temperature", "0");
		et_set(s[i], "max_tokens", "10");
		et_set(s[i], "ignore_eos", "1");
	}
	for (int i = 0; i < n; i++) {
		int32_t ids[96];
		const int len = prompt(first + i, vocab, ids);
		assert_int_equal(atlas_session_submit_tokens(s[i], ids, (size_t)len, err, sizeof err),
				 1);
	}
	for (int i = 0; i < n; i++) {
		assert_int_equal(et_wait_turn(s[i], 1, NULL, 0, 0), 0);
		et_turn_ids(s[i], 1, out[i], GEN_TOKENS);
		atlas_session_close(s[i]);
	}
}

static int32_t alone[N_SEQS][GEN_TOKENS];

static void test_alone(void **state)
{
	(void)state;
	struct atlas_engine *e = open_engine(1, 64, ATLAS_SPEC_OFF);
	for (int i = 0; i < N_SEQS; i++)
		run(e, i, 1, &alone[i]);
	atlas_engine_close(e);
}

static void test_batched_equals_alone(void **state)
{
	static const int sizes[] = { 1, 2, 7, MAX_BATCH };
	(void)state;
	for (size_t k = 0; k < ATLAS_ARRAY_LEN(sizes); k++) {
		int32_t got[N_SEQS][GEN_TOKENS];
		struct atlas_engine *e = open_engine(MAX_BATCH, 64, ATLAS_SPEC_OFF);
		run(e, 0, sizes[k], got);
		atlas_engine_close(e);
		for (int i = 0; i < sizes[k]; i++)
			for (int t = 0; t < GEN_TOKENS; t++)
				if (got[i][t] != alone[i][t])
					fail_msg("batch of %d: sequence %d token %d: %d alone, %d "
						 "batched", sizes[k], i, t, alone[i][t], got[i][t]);
	}
}

/* Drafts through the recurrent state: the tokens of plain decoding; with
 * must_reject, some drafts were rejected (the rollback ran). */
static void check_spec(enum atlas_spec spec, const char *what, bool must_reject)
{
	int32_t got[N_SEQS][GEN_TOKENS];
	struct atlas_engine *e = open_engine(4, 64, spec);
	struct atlas_engine_stats *st = malloc(sizeof *st);
	run(e, 0, 4, got);
	assert_int_equal(atlas_engine_stats(e, st), 0);
	atlas_engine_close(e);
	for (int i = 0; i < 4; i++)
		for (int t = 0; t < GEN_TOKENS; t++)
			if (got[i][t] != alone[i][t])
				fail_msg("%s: sequence %d token %d: %d plain, %d speculated", what, i,
					 t, alone[i][t], got[i][t]);
	print_message("%s: %llu drafts, %llu draft tokens, %llu accepted\n", what,
		      (unsigned long long)st->spec.drafts_total,
		      (unsigned long long)st->spec.draft_tokens_total,
		      (unsigned long long)st->spec.accepted_tokens_total);
	assert_true(st->spec.drafts_total > 0);
	assert_true(!must_reject ||
		    st->spec.accepted_tokens_total < st->spec.draft_tokens_total);
	free(st);
}

static void test_prompt_lookup_rolls_back(void **state)
{
	(void)state;
	check_spec(ATLAS_SPEC_NGRAM, "prompt lookup", false);
}

static void test_mtp_rolls_back(void **state)
{
	(void)state;
	/* The dummy head's guesses are rejected: every verify rolls back. */
	check_spec(ATLAS_SPEC_MTP, "MTP head", true);
}

int main(int argc, char **argv)
{
	if (argc > 1)
		model = argv[1];
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_alone),
		cmocka_unit_test(test_batched_equals_alone),
		cmocka_unit_test(test_prompt_lookup_rolls_back),
		cmocka_unit_test(test_mtp_rolls_back),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
