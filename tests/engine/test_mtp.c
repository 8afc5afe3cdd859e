/* The MTP head and its drafter (engine/spec/mtp.c), below the engine, on
 * a random-weight model with a head made by tools/ref/make_mtp_model.py:
 *
 *   - the head's logits of every pair of a sequence (the model's final
 *     hidden row at p, the token at p + 1) match the reference's within
 *     1e-3, and the drafter's four chained drafts after a context are the
 *     reference's;
 *   - whatever a session's history of accepted and rejected drafts and of
 *     new tokens, the drafter's drafts for a context are the ones a fresh
 *     drafter makes for it (the head's chained positions are truncated,
 *     what it missed is fed).
 *
 * The model's steps are run here as the engine would run them, on the cpu
 * backend, where a row's result does not depend on the rows beside it.
 *
 * Usage: test_mtp MODEL_DIR [REF_DIR]   (exit 77 when the directory is
 * missing). REF_DIR holds mtp.json and the logits files it names (default
 * MODEL_DIR/ref; the shipped model's are in tests/default_model/golden).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/err.h"
#include "engine/spec/drafter.h"
#include "engine/step/exec.h"
#include "engine_testutil.h"

static const char *model_dir;
static char ref_dir[ATLAS_PATH_MAX];

#define CONTEXT 512
#define ROWS 520                    /* the model's step rows */
#define K 4
#define ROUNDS 40
#define TOLERANCE 1e-3

static const struct drafter_ops *ops = &mtp_drafter_ops;

/* The model's executor, keeping its hidden rows, and its step command. */
struct target {
	struct atlas_config c;
	struct step_limits lim;
	struct exec *x;
	struct step_cmd cmd;
	uint64_t steps;
};

static void target_open(struct target *t)
{
	char err[ATLAS_ERRLEN];
	et_config(&t->c, model_dir);
	t->c.mtp_head = true;
	t->c.max_batch = 2;
	t->c.chunk_size = ROWS - 2;
	t->c.context = CONTEXT;
	t->c.kv_memory = 16u << 20;
	t->lim = (struct step_limits){ .max_seqs = 2, .max_rows = ROWS, .max_out = 2 };
	if (exec_open(&t->c, EXEC_MODEL, 2, &t->lim, &t->x, err, sizeof err))
		fail_msg("exec_open: %s", err);
	assert_non_null(t->x->d_hidden.data);
	assert_int_equal(step_cmd_alloc(&t->cmd, &t->x->lim), 0);
}

static void target_close(struct target *t)
{
	step_cmd_free(&t->cmd);
	exec_close(t->x);
}

/* One step of the model: ids[0, n) at positions pos0.. of sequence s. */
static void target_step(struct target *t, struct seq *s, const int32_t *ids, int n, int pos0)
{
	struct step_cmd *c = &t->cmd;
	struct step_result res;
	char err[ATLAS_ERRLEN];
	assert_int_equal(seq_reserve(&t->x->pool, s, pos0 + n), 0);
	const int nb = seq_resolve(&t->x->pool, s, pos0 + n, c->tables, t->x->lim.max_table);
	assert_true(nb > 0);
	c->seqs[0] = (struct step_seq){ .slot = 0, .row = 0, .n_rows = n, .pos0 = pos0,
					.table = 0, .n_blocks = nb, .state_slot = s->state_slot };
	memcpy(c->ids, ids, sizeof(int32_t) * (size_t)n);
	c->n_seqs = 1;
	c->n_rows = n;
	c->n_table = nb;
	c->n_out = 0;
	c->number = ++t->steps;
	if (exec_run(t->x, c, &res, err, sizeof err))
		fail_msg("exec_run: %s", err);
	seq_commit(s, pos0 + n);
}

/* Tell the drafter what the model's last step did for state st (its
 * first n_rows rows are context now), and feed it as the engine does
 * before the model's next step. */
static void seen(void *m, struct target *t, void *st, int n_rows, int pos0, const int32_t *ctx,
		 size_t n)
{
	const struct draft_seen s = { .state = st, .row = 0, .n_rows = n_rows, .pos0 = (size_t)pos0,
				      .tokens = ctx, .n_tokens = n };
	ops->absorb(m, &s, 1, t->steps);
}

static void feed_pending(void *m)
{
	char err[ATLAS_ERRLEN];
	bool recorded;
	if (ops->pending(m) && ops->run(m, NULL, 0, &recorded, err, sizeof err))
		fail_msg("run: %s", err);
}

/* The drafts for ctx[0, n) of state st, whose pairs up to n - 2 are noted. */
static int drafts_of(void *m, void *st, const int32_t *ctx, size_t n, int32_t *out)
{
	struct draft_req q = { .state = st, .tokens = ctx, .n_tokens = n, .k = K };
	struct draft_req *list[] = { &q };
	char err[ATLAS_ERRLEN];
	bool recorded;
	assert_int_equal(ops->prepare(m, &q), 1);
	if (ops->run(m, list, 1, &recorded, err, sizeof err))
		fail_msg("run: %s", err);
	memcpy(out, q.drafts, sizeof(int32_t) * (size_t)q.n_drafts);
	return q.n_drafts;
}

/* A fresh state's drafts for ctx[0, n): the model computes positions
 * [0, n - 1) in one step of a sequence of its own. */
static int fresh_drafts(void *m, struct target *t, const int32_t *ctx, size_t n, int32_t *out)
{
	void *st = ops->session_new(m);
	struct seq s;
	assert_non_null(st);
	seq_init(&s);
	target_step(t, &s, ctx, (int)n - 1, 0);
	seen(m, t, st, (int)n - 1, 0, ctx, n);
	const int nd = drafts_of(m, st, ctx, n, out);
	ops->session_free(m, st);
	seq_free(&t->x->pool, &s);
	return nd;
}

static void *drafter_open(struct target *t)
{
	char err[ATLAS_ERRLEN];
	void *m;
	struct atlas_config c = t->c;
	c.mtp_kv_memory = 16u << 20;
	if (ops->open(&c, &t->lim, &m, err, sizeof err))
		fail_msg("open: %s", err);
	assert_non_null(m);
	if (ops->bind(m, t->x, NULL, err, sizeof err))
		fail_msg("bind: %s", err);
	return m;
}

struct ref_seq {
	int32_t ids[128];
	int n;
	int32_t drafts[K];
	float *logits;              /* [n - 1, vocab] */
};

static int load_ref(struct ref_seq *out, int cap, int *vocab)
{
	char path[2 * ATLAS_PATH_MAX];
	json_error_t je;
	snprintf(path, sizeof path, "%s/mtp.json", ref_dir);
	json_t *root = json_load_file(path, 0, &je);
	if (!root)
		fail_msg("%s: %s", path, je.text);
	*vocab = (int)json_integer_value(json_object_get(root, "vocab_size"));
	json_t *seqs = json_object_get(root, "sequences"), *s;
	size_t i;
	json_array_foreach(seqs, i, s) {
		assert_true((int)i < cap);
		struct ref_seq *r = &out[i];
		json_t *ids = json_object_get(s, "ids"), *v;
		size_t j;
		r->n = (int)json_array_size(ids);
		json_array_foreach(ids, j, v)
			r->ids[j] = (int32_t)json_integer_value(v);
		json_array_foreach(json_object_get(s, "drafts"), j, v)
			r->drafts[j] = (int32_t)json_integer_value(v);
		snprintf(path, sizeof path, "%s/%s", ref_dir,
			 json_string_value(json_object_get(s, "logits")));
		const size_t count = (size_t)(r->n - 1) * (size_t)*vocab;
		r->logits = malloc(count * sizeof(float));
		FILE *f = fopen(path, "rb");
		assert_non_null(f);
		assert_int_equal(fread(r->logits, sizeof(float), count, f), count);
		fclose(f);
	}
	const int n = (int)json_array_size(seqs);
	json_decref(root);
	return n;
}

/* The head's logits of every pair of each reference sequence, in one head
 * step each, against the reference. */
static void test_head_logits(void **state)
{
	struct ref_seq ref[4];
	int vocab;
	const int n_ref = load_ref(ref, 4, &vocab);
	struct target t;
	target_open(&t);
	struct exec *h;
	char err[ATLAS_ERRLEN];
	struct atlas_config hc = t.c;
	hc.kv_memory = 16u << 20;
	const struct step_limits hl = { .max_seqs = 1, .max_rows = 128, .max_out = 128 };
	if (exec_open(&hc, EXEC_MTP_HEAD, 1, &hl, &h, err, sizeof err))
		fail_msg("exec_open head: %s", err);
	assert_int_equal(h->mc->n_layers, 1);
	struct step_cmd cmd;
	assert_int_equal(step_cmd_alloc(&cmd, &h->lim), 0);
	for (int i = 0; i < n_ref; i++) {
		const struct ref_seq *r = &ref[i];
		struct seq s, hs;
		seq_init(&s);
		seq_init(&hs);
		target_step(&t, &s, r->ids, r->n, 0);
		const int n = r->n - 1;
		const struct kt_tensor dst = kt_rows(h->d_hidden, 0, n);
		const struct kt_tensor src = kt_rows(t.x->d_hidden, 0, n);
		assert_int_equal(kt_copy(h->be, &dst, &src), 0);
		assert_int_equal(seq_reserve(&h->pool, &hs, n), 0);
		const int nb = seq_resolve(&h->pool, &hs, n, cmd.tables, h->lim.max_table);
		cmd.seqs[0] = (struct step_seq){ .slot = 0, .row = 0, .n_rows = n, .pos0 = 0,
						 .table = 0, .n_blocks = nb, .state_slot = -1 };
		memcpy(cmd.ids, r->ids + 1, sizeof(int32_t) * (size_t)n);
		for (int j = 0; j < n; j++)
			cmd.out[j] = (struct step_out){ .row = j, .keep = 1, .params.top_p = 1 };
		cmd.n_seqs = 1;
		cmd.n_rows = cmd.n_out = n;
		cmd.n_table = nb;
		cmd.number = (uint64_t)i + 1;
		struct step_result res;
		if (exec_run(h, &cmd, &res, err, sizeof err))
			fail_msg("head step: %s", err);
		assert_int_equal(res.n_keep, n);
		double worst = 0;
		for (size_t j = 0; j < (size_t)n * (size_t)vocab; j++)
			worst = fmax(worst, fabs((double)res.logits[j] - (double)r->logits[j]));
		print_message("sequence of %d: head logits max-abs %.3g from the reference\n", r->n,
			      worst);
		assert_true(worst < TOLERANCE);
		seq_free(&t.x->pool, &s);
		seq_free(&h->pool, &hs);
	}
	step_cmd_free(&cmd);
	exec_close(h);
	target_close(&t);
	for (int i = 0; i < n_ref; i++)
		free(ref[i].logits);
}

/* The drafter's chained drafts after each reference sequence. */
static void test_drafts(void **state)
{
	struct ref_seq ref[4];
	int vocab;
	const int n_ref = load_ref(ref, 4, &vocab);
	struct target t;
	target_open(&t);
	void *m = drafter_open(&t);
	for (int i = 0; i < n_ref; i++) {
		int32_t got[K];
		assert_int_equal(fresh_drafts(m, &t, ref[i].ids, (size_t)ref[i].n, got), K);
		for (int j = 0; j < K; j++)
			if (got[j] != ref[i].drafts[j])
				fail_msg("sequence %d: draft %d is %d, the reference's %d", i, j,
					 got[j], ref[i].drafts[j]);
		free(ref[i].logits);
	}
	ops->close(m);
	target_close(&t);
}

/* Rounds of: draft K tokens, verify them in one step of the model, accept
 * a varying number, then 1 to 3 tokens of our own (a rejection, or a new
 * prompt whose tokens the model computes in a step of their own); the
 * drafts always equal a fresh drafter's. */
static void test_rollback(void **state)
{
	struct target t;
	target_open(&t);
	void *m = drafter_open(&t);
	void *st = ops->session_new(m);
	struct seq s;
	int32_t ctx[CONTEXT], drafts[K], want[K], noise[ROUNDS], rows[K + 1];
	size_t n = 24;
	const int vocab = t.x->geo.vocab;
	seq_init(&s);
	et_prompt_ids(ctx, (int)n, 7, vocab);
	et_prompt_ids(noise, ROUNDS, 99, vocab);
	target_step(&t, &s, ctx, (int)n - 1, 0);
	seen(m, &t, st, (int)n - 1, 0, ctx, n);
	int rejected = 0;
	const bool hybrid = t.x->pool.state.n_layers > 0;
	for (int r = 0; r < ROUNDS; r++) {
		assert_int_equal(drafts_of(m, st, ctx, n, drafts), K);
		assert_int_equal(fresh_drafts(m, &t, ctx, n, want), K);
		for (int j = 0; j < K; j++)
			if (drafts[j] != want[j])
				fail_msg("round %d: draft %d is %d, a fresh drafter's %d", r, j,
					 drafts[j], want[j]);
		/* The verify: the last token and the drafts. */
		rows[0] = ctx[n - 1];
		memcpy(rows + 1, drafts, sizeof drafts);
		if (hybrid)
			assert_int_equal(seq_snapshot(&t.x->pool, &s), 0);
		target_step(&t, &s, rows, K + 1, (int)n - 1);
		const int a = r % (K + 1), own = 1 + r % 3;
		memcpy(ctx + n, drafts, sizeof(int32_t) * (size_t)a);
		const size_t kept = n + (size_t)a;
		n = kept;
		for (int j = 0; j < own; j++, n++) {
			const int32_t tok = noise[(r * 3 + j) % ROUNDS];
			ctx[n] = a + j < K && tok == drafts[a + j] ? (tok + 1) % vocab : tok;
		}
		if (hybrid) {
			/* As the scheduler settles a verify through linear layers:
			 * back to the snapshot, the kept rows fed again. */
			assert_int_equal(seq_truncate(&t.x->pool, &s, (int)kept - a - 1), 0);
			target_step(&t, &s, rows, a + 1, (int)kept - a - 1);
		} else {
			assert_int_equal(seq_truncate(&t.x->pool, &s, (int)kept), 0);
		}
		seen(m, &t, st, a + 1, (int)kept - a - 1, ctx, n);
		rejected += a < K;
		if (own > 1) {
			/* A new prompt: its tokens but the last, in a step of their own. */
			feed_pending(m);
			target_step(&t, &s, ctx + kept, own - 1, (int)kept);
			seen(m, &t, st, own - 1, (int)kept, ctx, n);
		}
	}
	assert_true(rejected > ROUNDS / 2);
	ops->session_free(m, st);
	seq_free(&t.x->pool, &s);
	ops->close(m);
	target_close(&t);
}

int main(int argc, char **argv)
{
	int rc = et_model_arg(argc, argv, &model_dir);
	if (rc)
		return rc;
	if (argc > 2)
		snprintf(ref_dir, sizeof ref_dir, "%s", argv[2]);
	else
		snprintf(ref_dir, sizeof ref_dir, "%s/ref", model_dir);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_head_logits),
		cmocka_unit_test(test_drafts),
		cmocka_unit_test(test_rollback),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
