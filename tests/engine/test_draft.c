/* The draft-model drafter alone (engine/spec/draft.c), through its ops:
 * whatever a session's history of accepted and rejected drafts, its drafts
 * for a context are the ones a drafter that never saw that session makes
 * for the same context (its KV is rolled back to what is still the
 * context, and what it has not seen is fed). The model drafts for itself
 * on the cpu backend, where a row's result does not depend on the rows
 * beside it.
 *
 * Usage: test_draft MODEL_DIR   (exit 77 when the directory is missing)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "engine/spec/drafter.h"
#include "engine/step/step.h"
#include "engine_testutil.h"

static const char *model_dir;

#define VOCAB 384                   /* the test model's */
#define ROUNDS 40                   /* the context grows to at most 24 + 40 * 7 */
#define K 4

/* Drafts of a fresh state for tokens[0, n). */
static int fresh_drafts(void *m, const int32_t *tokens, size_t n, int32_t *out)
{
	const struct drafter_ops *ops = &draft_model_ops;
	void *st = ops->session_new(m);
	assert_non_null(st);
	struct draft_req q = { .state = st, .tokens = tokens, .n_tokens = n, .k = K };
	struct draft_req *list[] = { &q };
	char err[ATLAS_ERRLEN];
	bool recorded;
	assert_int_equal(ops->prepare(m, &q), 1);
	assert_int_equal(ops->run(m, list, 1, &recorded, err, sizeof err), 0);
	memcpy(out, q.drafts, sizeof(int32_t) * (size_t)q.n_drafts);
	const int nd = q.n_drafts;
	ops->session_free(m, st);
	return nd;
}

/* Rounds of: draft K tokens, accept a varying number of them, then tokens
 * that are not the next drafts; the drafts always equal a fresh
 * drafter's. */
static void test_rollback(void **state)
{
	const struct drafter_ops *ops = &draft_model_ops;
	struct atlas_config c;
	char err[ATLAS_ERRLEN];
	bool recorded;
	void *m;
	et_config(&c, model_dir);
	snprintf(c.draft_model, sizeof c.draft_model, "%s", model_dir);
	c.draft_kv_memory = 16u << 20;
	c.max_batch = 2;
	c.chunk_size = 512;
	c.context = 512;
	const struct step_limits lim = { .max_seqs = 2, .max_rows = 514, .max_out = 2 };
	assert_int_equal(ops->open(&c, &lim, &m, err, sizeof err), 0);
	assert_non_null(m);
	void *st = ops->session_new(m);
	int32_t ctx[512], want[K], noise[ROUNDS];
	size_t n = 24;
	et_prompt_ids(ctx, (int)n, 7, VOCAB);
	et_prompt_ids(noise, ROUNDS, 99, VOCAB);
	int rejected = 0;
	for (int r = 0; r < ROUNDS; r++) {
		struct draft_req q = { .state = st, .tokens = ctx, .n_tokens = n, .k = K };
		struct draft_req *list[] = { &q };
		assert_int_equal(ops->prepare(m, &q), 1);
		assert_int_equal(ops->run(m, list, 1, &recorded, err, sizeof err), 0);
		const int nd = fresh_drafts(m, ctx, n, want);
		assert_int_equal(q.n_drafts, K);
		assert_int_equal(nd, K);
		for (int j = 0; j < K; j++)
			if (q.drafts[j] != want[j])
				fail_msg("round %d: draft %d is %d, a fresh drafter's %d", r, j,
					 q.drafts[j], want[j]);
		/* Accept r % (K + 1) drafts, then 1 to 3 tokens of our own (a
		 * rejection, or a new prompt after a turn that ended there). */
		const int a = r % (K + 1), own = 1 + r % 3;
		memcpy(ctx + n, q.drafts, sizeof(int32_t) * (size_t)a);
		n += (size_t)a;
		for (int j = 0; j < own; j++, n++) {
			const int32_t t = noise[(r * 3 + j) % ROUNDS];
			ctx[n] = a + j < K && t == q.drafts[a + j] ? (t + 1) % VOCAB : t;
		}
		rejected += a < K;
	}
	assert_true(rejected > ROUNDS / 2);
	ops->session_free(m, st);
	ops->close(m);
}

int main(int argc, char **argv)
{
	int rc = et_model_arg(argc, argv, &model_dir);
	if (rc)
		return rc;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_rollback),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
