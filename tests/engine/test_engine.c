/* The engine's invariants on the cpu backend (DESIGN §4), through its public
 * API: greedy tokens are identical alone or batched, for any prefill chunk
 * size, with or without preemption; a second turn continues on the KV of the
 * first; bad input fails one turn and leaves the engine working; text
 * prompts are tokenized on the engine's own thread.
 *
 * Usage: test_engine MODEL_DIR   (exit 77 when the directory is missing)
 * ATLAS_TEST_BACKEND=cuda runs the same checks on another backend.
 */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "engine/engine.h"
#include "engine_testutil.h"

static const char *model_dir;
static bool graphs = true; /* cuda_graphs of the engines opened next */
static bool pdl = true;    /* cuda_pdl of the engines opened next */

static enum atlas_spec spec = ATLAS_SPEC_AUTO;   /* spec of the engines opened next */

static struct atlas_engine *open_engine(int max_batch, int chunk, uint64_t kv_memory)
{
	struct atlas_config c;
	et_config(&c, model_dir);
	c.max_batch = max_batch;
	c.chunk_size = chunk;
	c.kv_memory = kv_memory;
	c.context = 512;
	c.cuda_graphs = graphs;
	c.cuda_pdl = pdl;
	/* Drafts at every step where prompt lookup has some: the gate's choices
	 * follow measured times, and these tests want the same steps each run. */
	c.spec_gate = false;
	c.spec = spec;
	struct atlas_engine *e;
	char err[ATLAS_ERRLEN];
	int rc = atlas_engine_open(&c, &e, err, sizeof err);
	if (rc)
		fail_msg("atlas_engine_open: %s", err);
	atlas_engine_set_notify(e, et_on_notify, NULL);
	return e;
}

struct gen {
	int32_t *ids;
	size_t n;
};

static struct gen generated(struct atlas_session *s, uint64_t turn)
{
	int32_t *prompt;
	size_t np;
	struct gen g;
	assert_int_equal(atlas_session_turn_tokens(s, turn, &prompt, &np, &g.ids, &g.n), 0);
	free(prompt);
	return g;
}

static void free_gens(struct gen *g, int n)
{
	for (int i = 0; i < n; i++)
		free(g[i].ids);
}

/* The first turn of sessions s[0, n), each max_tokens long, into out; the
 * sessions are closed. */
static void collect_first_turns(struct atlas_session **s, int n, struct gen *out,
				int max_tokens)
{
	for (int i = 0; i < n; i++) {
		assert_int_equal(et_wait_turn(s[i], 1, NULL, 0, 0), 0);
		out[i] = generated(s[i], 1);
		assert_int_equal(out[i].n, (size_t)max_tokens);
		atlas_session_close(s[i]);
	}
}

static void assert_same(struct gen a, struct gen b, const char *what)
{
	if (a.n != b.n)
		fail_msg("%s: %zu tokens vs %zu", what, a.n, b.n);
	for (size_t i = 0; i < a.n; i++)
		if (a.ids[i] != b.ids[i])
			fail_msg("%s: token %zu differs: %d vs %d", what, i, a.ids[i], b.ids[i]);
}

#define N_PROMPTS 4
static const int prompt_len[N_PROMPTS] = { 37, 5, 90, 1 };

/* Greedy continuations of N_PROMPTS prompts, all submitted at once; with
 * sampled, beside one more session that samples (temperature 1.5) as many
 * tokens, so that every step has a row above temperature 0. */
static void run_batch_beside(struct atlas_engine *e, struct gen *out, int max_tokens,
			     bool sampled)
{
	struct atlas_session *s[N_PROMPTS], *other = NULL;
	char err[ATLAS_ERRLEN], name[16], mt[16];
	int vocab = atlas_engine_vocab_size(e);
	snprintf(mt, sizeof mt, "%d", max_tokens);
	if (sampled) {
		int32_t ids[7];
		et_prompt_ids(ids, 7, 77u, vocab);
		assert_int_equal(atlas_session_open(e, "sampled", &other, err, sizeof err), 0);
		et_set(other, "mode", "raw");
		et_set(other, "temperature", "1.5");
		et_set(other, "seed", "5");
		et_set(other, "max_tokens", mt);
		et_set(other, "ignore_eos", "1");
		assert_int_equal(atlas_session_submit_tokens(other, ids, 7, err, sizeof err), 1);
	}
	for (int i = 0; i < N_PROMPTS; i++) {
		snprintf(name, sizeof name, "b%d", i);
		assert_int_equal(atlas_session_open(e, name, &s[i], err, sizeof err), 0);
		et_set(s[i], "mode", "raw");
		et_set(s[i], "temperature", "0");
		et_set(s[i], "max_tokens", mt);
		/* every turn runs max_tokens steps, whatever model is given */
		et_set(s[i], "ignore_eos", "1");
	}
	for (int i = 0; i < N_PROMPTS; i++) {
		int32_t ids[128];
		et_prompt_ids(ids, prompt_len[i], 1000u + (uint32_t)i, vocab);
		assert_int_equal(atlas_session_submit_tokens(s[i], ids, (size_t)prompt_len[i], err,
							     sizeof err), 1);
	}
	collect_first_turns(s, N_PROMPTS, out, max_tokens);
	if (other) {
		assert_int_equal(et_wait_turn(other, 1, NULL, 0, 0), 0);
		atlas_session_close(other);
	}
}

static void run_batch(struct atlas_engine *e, struct gen *out, int max_tokens)
{
	run_batch_beside(e, out, max_tokens, false);
}

static struct gen reference[N_PROMPTS];

static void test_batch_of_one_is_the_reference(void **state)
{
	struct atlas_engine *e = open_engine(1, 256, 64ull << 20);
	run_batch(e, reference, 12);
	atlas_engine_close(e);
}

static void test_batched_equals_alone(void **state)
{
	struct gen g[N_PROMPTS];
	struct atlas_engine *e = open_engine(8, 256, 64ull << 20);
	run_batch(e, g, 12);
	for (int i = 0; i < N_PROMPTS; i++)
		assert_same(g[i], reference[i], "batch of 4 vs alone");
	free_gens(g, N_PROMPTS);
	atlas_engine_close(e);
}

/* A step draws its sampled rows in the forward pass (kt_draw, inside the
 * graph on cuda), by kernels that its rows' kind picks: greedy rows alone
 * take the greedy kernel, beside a row above temperature 0 the sampling
 * ones. Greedy rows get the same tokens either way. */
static void test_greedy_beside_sampled_equals_alone(void **state)
{
	struct gen g[N_PROMPTS];
	struct atlas_engine *e = open_engine(8, 256, 64ull << 20);
	run_batch_beside(e, g, 12, true);
	for (int i = 0; i < N_PROMPTS; i++)
		assert_same(g[i], reference[i], "greedy beside a sampled row vs alone");
	free_gens(g, N_PROMPTS);
	atlas_engine_close(e);
}

/* Engines with *key true and then false (chunk_size chunk, max_tokens
 * tokens a turn) give the same tokens; *key is true again after. */
static void assert_key_changes_nothing(bool *key, int chunk, int tokens, const char *what)
{
	struct gen on[N_PROMPTS], off[N_PROMPTS];
	struct atlas_engine *e = open_engine(8, chunk, 64ull << 20);
	run_batch(e, on, tokens);
	atlas_engine_close(e);
	*key = false;
	e = open_engine(8, chunk, 64ull << 20);
	run_batch(e, off, tokens);
	atlas_engine_close(e);
	*key = true;
	for (int i = 0; i < N_PROMPTS; i++) {
		assert_same(on[i], off[i], what);
		free(on[i].ids);
		free(off[i].ids);
	}
}

/* Decode steps replayed from CUDA graphs (padded to the graph's batch,
 * crossing from the 256-position context bucket into the next) give the
 * tokens of steps launched op by op. On cpu both are op by op. */
static void test_graphs_on_and_off_agree(void **state)
{
	assert_key_changes_nothing(&graphs, 256, 200, "graphs on vs off");
}

/* Seeded sessions that sample: one at top_k 40 and top_p 0.9 beside a
 * greedy one (cuda: steps that draw on topk_kernel), and with full, one
 * more at top_k 0 (steps on sample_kernel). max_tokens tokens each, all
 * submitted at once; out[0..2] (the last only with full). */
static void run_sampled(struct atlas_engine *e, struct gen *out, int max_tokens, bool full)
{
	static const char *const temps[] = { "0.7", "0", "1" }, *const top_ks[] = { "40", "0", "0" },
				 *const top_ps[] = { "0.9", "1", "1" };
	const int n = full ? 3 : 2, vocab = atlas_engine_vocab_size(e);
	struct atlas_session *s[3];
	char err[ATLAS_ERRLEN], name[16], mt[16];
	snprintf(mt, sizeof mt, "%d", max_tokens);
	for (int i = 0; i < n; i++) {
		int32_t ids[32];
		snprintf(name, sizeof name, "d%d", i);
		assert_int_equal(atlas_session_open(e, name, &s[i], err, sizeof err), 0);
		et_set(s[i], "mode", "raw");
		et_set(s[i], "temperature", temps[i]);
		et_set(s[i], "top_k", top_ks[i]);
		et_set(s[i], "top_p", top_ps[i]);
		et_set(s[i], "seed", "31");
		et_set(s[i], "max_tokens", mt);
		et_set(s[i], "ignore_eos", "1");
		et_prompt_ids(ids, 9 + 11 * i, 300u + (uint32_t)i, vocab);
		assert_int_equal(atlas_session_submit_tokens(s[i], ids, (size_t)(9 + 11 * i), err,
							     sizeof err), 1);
	}
	collect_first_turns(s, n, out, max_tokens);
}

/* Sampled steps draw inside their CUDA graphs, a replay reading the
 * requests (each row's u) staged for it: the tokens of steps launched op
 * by op, for both draw kernels. On cpu both are op by op. */
static void test_sampled_graphs_on_and_off_agree(void **state)
{
	for (int full = 0; full < 2; full++) {
		struct gen on[3], off[3];
		struct atlas_engine *e = open_engine(4, 64, 64ull << 20);
		run_sampled(e, on, 40, full);
		atlas_engine_close(e);
		graphs = false;
		e = open_engine(4, 64, 64ull << 20);
		run_sampled(e, off, 40, full);
		atlas_engine_close(e);
		graphs = true;
		for (int i = 0; i < 2 + full; i++)
			assert_same(on[i], off[i], "sampled, graphs on vs off");
		free_gens(on, 2 + full);
		free_gens(off, 2 + full);
	}
}

/* Kernels that overlap their neighbours' start and end (programmatic
 * dependent launch, prefill in chunks of 64 and decode, in graphs and op
 * by op) give the tokens of kernels that run strictly one after another.
 * On cpu and on GPUs before Hopper the key changes nothing. */
static void test_pdl_on_and_off_agree(void **state)
{
	assert_key_changes_nothing(&pdl, 64, 80, "pdl on vs off");
	graphs = false;
	assert_key_changes_nothing(&pdl, 64, 80, "pdl on vs off, op by op");
	graphs = true;
}

static void test_chunk_sizes_agree(void **state)
{
	static const int chunks[] = { 1, 7, 64 };
	for (size_t c = 0; c < ATLAS_ARRAY_LEN(chunks); c++) {
		struct gen g[N_PROMPTS];
		struct atlas_engine *e = open_engine(3, chunks[c], 64ull << 20);
		run_batch(e, g, 12);
		for (int i = 0; i < N_PROMPTS; i++)
			assert_same(g[i], reference[i], "chunked prefill vs whole");
		free_gens(g, N_PROMPTS);
		atlas_engine_close(e);
	}
}

static void test_preemption_recomputes_the_same(void **state)
{
	/* A pool that holds one long sequence but not all four at once. Without
	 * drafts: accepted ones finish sequences in fewer steps, and on a busy
	 * machine the four may then not overlap enough to fill the pool. */
	spec = ATLAS_SPEC_OFF;
	struct atlas_engine *e = open_engine(4, 16, 64ull << 20);
	struct atlas_engine_stats *st = malloc(sizeof *st);
	atlas_engine_stats(e, st);
	uint64_t per_block = st->kv.bytes_per_block;
	atlas_engine_close(e);

	/* 7 blocks: the longest (90 + 12 tokens) alone; any overlap with it
	 * takes a block from someone. */
	e = open_engine(4, 16, per_block * 7);
	struct gen g[N_PROMPTS];
	run_batch(e, g, 12);
	for (int i = 0; i < N_PROMPTS; i++)
		assert_same(g[i], reference[i], "preempted vs not");
	free_gens(g, N_PROMPTS);
	atlas_engine_stats(e, st);
	assert_true(st->kv.preemptions_total + st->kv.evictions_total > 0);
	spec = ATLAS_SPEC_AUTO;
	free(st);
	atlas_engine_close(e);
}

/* The cuda backend's logits of one position may differ with the step's
 * shape: a chunk of a few rows takes the bandwidth-bound matmul kernel and a
 * bigger one cuBLAS, both on bf16-rounded activations, and attention rounds
 * its probabilities to bf16 in tiles that follow the chunks. Seen on an H100
 * (2026-11-22): up to 0.0106 between chunks of 32 and of 3, where the logits
 * differ from transformers' f32 ones by up to 0.15. A mixture-of-experts
 * model adds its router, whose choice between nearly tied experts the last
 * bits decide: where a token's k-th and (k+1)-th experts are nearly tied
 * the chunking can swap them, its output moves by that expert's share, and
 * the K and V it writes carry the change to every later position.
 * qwen3moe_bf16_v5 (bf16, 16 experts, top 4 without renormalising; its
 * smallest router gap in transformers' f32 run is 0.4 %) differs past 0.05
 * from row 42 on, by up to 0.85 at row 59, between chunks of 64 and of 3
 * (H100, 2026-11-24, the same in every run); the f32 MoE model stays
 * within 0.05. So an MoE model's logits are not held to a tolerance
 * element by element; their argmax must agree wherever the top two are
 * further apart than CUDA_MOE_ARGMAX_GAP, and a dense model's wherever they
 * are further apart than twice its tolerance. */
#define CUDA_CHUNK_LOGITS_TOL 0.05f
#define CUDA_MOE_ARGMAX_GAP 1.0f

static void assert_logits_agree(const float *a, const float *b, int n, int vocab, bool moe)
{
	const char *backend = getenv("ATLAS_TEST_BACKEND");
	const float gap = moe ? CUDA_MOE_ARGMAX_GAP : 2 * CUDA_CHUNK_LOGITS_TOL;
	if (!backend || !strcmp(backend, "cpu")) {
		assert_memory_equal(a, b, sizeof(float) * (size_t)n * (size_t)vocab);
		return;
	}
	for (int r = 0; r < n; r++) {
		const float *x = a + (size_t)r * (size_t)vocab, *y = b + (size_t)r * (size_t)vocab;
		int best_a = 0, best_b = 0;
		float top = -INFINITY, second = -INFINITY;
		for (int i = 0; i < vocab; i++) {
			if (!moe && fabsf(x[i] - y[i]) > CUDA_CHUNK_LOGITS_TOL)
				fail_msg("row %d logit %d: %g vs %g", r, i, x[i], y[i]);
			best_a = x[i] > x[best_a] ? i : best_a;
			best_b = y[i] > y[best_b] ? i : best_b;
			if (x[i] > top) {
				second = top;
				top = x[i];
			} else if (x[i] > second) {
				second = x[i];
			}
		}
		if (top - second > gap && best_a != best_b)
			fail_msg("row %d: argmax %d vs %d", r, best_a, best_b);
	}
}

static void test_logits_independent_of_chunking(void **state)
{
	struct atlas_engine *e = open_engine(2, 64, 64ull << 20);
	int vocab = atlas_engine_vocab_size(e);
	int32_t ids[70];
	struct atlas_engine_stats *st = malloc(sizeof *st);
	assert_int_equal(atlas_engine_stats(e, st), 0);
	const bool moe = st->experts > 0;
	free(st);
	et_prompt_ids(ids, 70, 77, vocab);
	float *a = malloc(sizeof(float) * 70 * (size_t)vocab);
	float *b = malloc(sizeof(float) * 70 * (size_t)vocab);
	char err[ATLAS_ERRLEN];
	assert_int_equal(atlas_engine_logits(e, ids, 70, a, err, sizeof err), 0);
	atlas_engine_close(e);
	e = open_engine(2, 3, 64ull << 20);
	assert_int_equal(atlas_engine_logits(e, ids, 70, b, err, sizeof err), 0);
	assert_logits_agree(a, b, 70, vocab, moe);
	/* The sequence's last logits decide its first generated token. */
	struct atlas_session *s;
	assert_int_equal(atlas_session_open(e, "x", &s, err, sizeof err), 0);
	et_set(s, "max_tokens", "1");
	atlas_session_submit_tokens(s, ids, 70, err, sizeof err);
	assert_int_equal(et_wait_turn(s, 1, NULL, 0, 0), 0);
	struct gen g = generated(s, 1);
	const float *last = a + (size_t)69 * (size_t)vocab;
	int best = 0;
	for (int i = 1; i < vocab; i++)
		if (last[i] > last[best])
			best = i;
	assert_int_equal(g.ids[0], best);
	free(g.ids);
	atlas_session_close(s);
	atlas_engine_close(e);
	free(a);
	free(b);
}

static void test_second_turn_continues_on_kv(void **state)
{
	/* Rows counted below are those of plain decoding: no drafts (a model
	 * with an MTP head would draft, and a rejected draft through linear
	 * layers feeds its kept rows again). */
	spec = ATLAS_SPEC_OFF;
	struct atlas_engine *e = open_engine(2, 32, 64ull << 20);
	spec = ATLAS_SPEC_AUTO;
	int vocab = atlas_engine_vocab_size(e);
	char err[ATLAS_ERRLEN];
	int32_t p1[40], p2[9];
	et_prompt_ids(p1, 40, 5, vocab);
	et_prompt_ids(p2, 9, 6, vocab);

	struct atlas_session *s;
	assert_int_equal(atlas_session_open(e, "multi", &s, err, sizeof err), 0);
	et_set(s, "max_tokens", "6");
	assert_int_equal(atlas_session_submit_tokens(s, p1, 40, err, sizeof err), 1);
	assert_int_equal(et_wait_turn(s, 1, NULL, 0, 0), 0);
	struct gen g1 = generated(s, 1);

	struct atlas_engine_stats *st = malloc(sizeof *st);
	atlas_engine_stats(e, st);
	uint64_t before = st->step_tokens_total;
	assert_int_equal(atlas_session_submit_tokens(s, p2, 9, err, sizeof err), 2);
	assert_int_equal(et_wait_turn(s, 2, NULL, 0, 0), 0);
	struct gen g2 = generated(s, 2);
	atlas_engine_stats(e, st);
	/* Only the last sampled token of turn 1, the 9 new tokens and 5 decode
	 * steps ran: the history was not recomputed. */
	assert_int_equal(st->step_tokens_total - before, 1 + 9 + 5);

	/* The same context as one prompt in a fresh session gives the same tokens. */
	int32_t all[64];
	size_t n = 0;
	memcpy(all, p1, sizeof p1);
	n = 40;
	memcpy(all + n, g1.ids, g1.n * sizeof *all);
	n += g1.n;
	memcpy(all + n, p2, sizeof p2);
	n += 9;
	struct atlas_session *f;
	assert_int_equal(atlas_session_open(e, "fresh", &f, err, sizeof err), 0);
	et_set(f, "max_tokens", "6");
	assert_int_equal(atlas_session_submit_tokens(f, all, n, err, sizeof err), 1);
	assert_int_equal(et_wait_turn(f, 1, NULL, 0, 0), 0);
	struct gen fresh = generated(f, 1);
	assert_same(fresh, g2, "turn 2 vs one fresh prompt");
	free(fresh.ids);
	free(g1.ids);
	free(g2.ids);

	struct atlas_session_status ss;
	atlas_session_status(s, &ss);
	assert_int_equal(ss.turns, 2);
	assert_int_equal(ss.context_tokens, 40 + 6 + 9 + 6);
	assert_true(ss.kv_blocks[ATLAS_TIER_DEVICE] > 0);
	free(st);
	atlas_session_close(s);
	atlas_session_close(f);
	atlas_engine_close(e);
}

static void test_overflow_fails_one_turn_only(void **state)
{
	struct atlas_engine *e = open_engine(2, 64, 64ull << 20);
	char err[ATLAS_ERRLEN];
	struct atlas_session *s, *ok;
	assert_int_equal(atlas_session_open(e, "big", &s, err, sizeof err), 0);
	assert_int_equal(atlas_session_open(e, "ok", &ok, err, sizeof err), 0);
	et_set(ok, "max_tokens", "3");
	int32_t *ids = calloc(600, sizeof *ids);
	assert_int_equal(atlas_session_submit_tokens(s, ids, 600, err, sizeof err), 1);
	assert_int_equal(atlas_session_submit_tokens(ok, ids, 10, err, sizeof err), 1);
	assert_int_equal(et_wait_turn(s, 1, NULL, 0, 0), -EIO);
	struct atlas_session_status st;
	atlas_session_status(s, &st);
	assert_string_equal(atlas_state_name(st.state), "error");
	assert_non_null(strstr(st.last_error, "does not fit the context"));
	assert_int_equal(et_wait_turn(ok, 1, NULL, 0, 0), 0);
	/* Out-of-vocabulary ids are refused at submit. */
	ids[0] = atlas_engine_vocab_size(e);
	assert_int_equal(atlas_session_submit_tokens(s, ids, 1, err, sizeof err), -EINVAL);
	/* The failed session takes a fitting prompt afterwards. */
	ids[0] = 1;
	et_set(s, "max_tokens", "2");
	assert_int_equal(atlas_session_submit_tokens(s, ids, 4, err, sizeof err), 2);
	assert_int_equal(et_wait_turn(s, 2, NULL, 0, 0), 0);
	free(ids);
	atlas_session_close(s);
	atlas_session_close(ok);
	atlas_engine_close(e);
}

static void test_cancel_reset_and_busy(void **state)
{
	struct atlas_engine *e = open_engine(2, 64, 64ull << 20);
	char err[ATLAS_ERRLEN];
	struct atlas_session *s;
	assert_int_equal(atlas_session_open(e, "c", &s, err, sizeof err), 0);
	et_set(s, "max_tokens", "100000");
	int32_t ids[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
	assert_int_equal(atlas_session_submit_tokens(s, ids, 8, err, sizeof err), 1);
	assert_int_equal(atlas_session_submit_tokens(s, ids, 8, err, sizeof err), -EBUSY);
	atlas_session_cancel(s);
	assert_int_equal(et_wait_turn(s, 1, NULL, 0, 0), -ECANCELED);
	struct atlas_session_status st;
	atlas_session_status(s, &st);
	assert_string_equal(st.finish, "cancelled");

	atlas_session_reset(s);
	assert_int_equal(atlas_session_newest_turn(s), 0);
	/* A reader of a forgotten turn ends; the next turn gets a new number. */
	assert_int_equal(et_wait_turn(s, 1, NULL, 0, 0), -ECANCELED);
	et_set(s, "max_tokens", "2");
	assert_int_equal(atlas_session_submit_tokens(s, ids, 8, err, sizeof err), 2);
	assert_int_equal(et_wait_turn(s, 2, NULL, 0, 0), 0);
	atlas_session_status(s, &st);
	assert_int_equal(st.context_tokens, 8 + 2);
	atlas_session_close(s);
	atlas_engine_close(e);
}

static void test_seeded_sampling_is_reproducible(void **state)
{
	struct atlas_engine *e = open_engine(4, 64, 64ull << 20);
	char err[ATLAS_ERRLEN];
	struct atlas_session *s[3];
	const char *names[] = { "s1", "s2", "s3" }, *seeds[] = { "11", "11", "12" };
	int32_t ids[6] = { 3, 1, 4, 1, 5, 9 };
	for (int i = 0; i < 3; i++) {
		assert_int_equal(atlas_session_open(e, names[i], &s[i], err, sizeof err), 0);
		et_set(s[i], "temperature", "1.5");
		/* 24 draws whatever the model (a tiny one may end at once). */
		et_set(s[i], "ignore_eos", "1");
		et_set(s[i], "top_k", "0");
		et_set(s[i], "top_p", "1");
		et_set(s[i], "seed", seeds[i]);
		et_set(s[i], "max_tokens", "24");
		atlas_session_submit_tokens(s[i], ids, 6, err, sizeof err);
	}
	struct gen g[3];
	for (int i = 0; i < 3; i++) {
		assert_int_equal(et_wait_turn(s[i], 1, NULL, 0, 0), 0);
		g[i] = generated(s[i], 1);
	}
	assert_same(g[0], g[1], "same seed");
	bool differ = false;
	for (size_t i = 0; i < g[0].n && i < g[2].n; i++)
		differ |= g[0].ids[i] != g[2].ids[i];
	assert_true(differ);
	free_gens(g, 3);
	for (int i = 0; i < 3; i++)
		atlas_session_close(s[i]);
	atlas_engine_close(e);
}

/* Text prompts are tokenized on the engine's intake thread: a submit
 * returns at once with its turn queued; a cancel, a reset or a close while
 * the prompt waits there drops it; a prompt the context cannot hold fails
 * its turn, and its text is not kept. (Without a tokenizer the text is a
 * list of ids, parsed there too.) */
static void test_text_prompts_tokenize_later(void **state)
{
	struct atlas_engine *e = open_engine(2, 64, 64ull << 20);
	const bool tok = atlas_engine_tokenizer(e) != NULL;
	const size_t big = 256u << 10;
	char *text = malloc(big + 1), err[ATLAS_ERRLEN];
	assert_non_null(text);
	const char *word = tok ? "the quick brown fox " : "1 ";
	for (size_t i = 0; i < big; i++)
		text[i] = word[i % strlen(word)];
	text[big] = 0;
	struct atlas_session *s, *u;
	assert_int_equal(atlas_session_open(e, "t", &s, err, sizeof err), 0);
	assert_int_equal(atlas_session_submit(s, text, big, err, sizeof err), 1);
	struct atlas_session_status st;
	/* Tokenizing takes far longer than these calls; parsing ids may not. */
	if (tok) {
		atlas_session_status(s, &st);
		assert_string_equal(atlas_state_name(st.state), "queued");
		assert_int_equal(st.prompt_tokens, 0);
		assert_int_equal(atlas_session_submit(s, "x", 1, err, sizeof err), -EBUSY);
	}
	atlas_session_cancel(s);
	const int end = et_wait_turn(s, 1, NULL, 0, 0);
	assert_true(end == -ECANCELED || (!tok && end == -EIO));

	assert_int_equal(atlas_session_submit(s, text, big, err, sizeof err), 2);
	atlas_session_reset(s);
	assert_int_equal(et_wait_turn(s, 2, NULL, 0, 0), -ECANCELED);

	assert_int_equal(atlas_session_submit(s, text, big, err, sizeof err), 3);
	assert_int_equal(et_wait_turn(s, 3, NULL, 0, 0), -EIO);
	atlas_session_status(s, &st);
	assert_non_null(strstr(st.last_error, "does not fit the context"));
	char *history;
	size_t len;
	assert_int_equal(atlas_session_history(s, &history, &len), 0);
	assert_true(len < 256);
	free(history);
	/* The session takes the next prompt. */
	et_set(s, "max_tokens", "2");
	int32_t ids[4] = { 1, 2, 3, 4 };
	assert_int_equal(atlas_session_submit_tokens(s, ids, 4, err, sizeof err), 4);
	assert_int_equal(et_wait_turn(s, 4, NULL, 0, 0), 0);

	/* Closed with prompts still waiting: nothing leaks or runs late. */
	assert_int_equal(atlas_session_submit(s, text, big, err, sizeof err), 5);
	atlas_session_close(s);
	assert_int_equal(atlas_session_open(e, "u", &u, err, sizeof err), 0);
	assert_int_equal(atlas_session_submit(u, text, big, err, sizeof err), 1);
	atlas_session_close(u);
	atlas_engine_close(e);
	free(text);
}

static void test_session_names_and_limits(void **state)
{
	struct atlas_engine *e = open_engine(2, 64, 64ull << 20);
	char err[ATLAS_ERRLEN];
	struct atlas_session *a, *b;
	assert_int_equal(atlas_session_open(e, "dup", &a, err, sizeof err), 0);
	assert_int_equal(atlas_session_open(e, "dup", &b, err, sizeof err), -EEXIST);
	assert_int_equal(atlas_session_open(e, "bad/name", &b, err, sizeof err), -EINVAL);
	assert_int_equal(atlas_session_open(e, "..", &b, err, sizeof err), -EINVAL);
	atlas_session_close(a);
	/* A closed name can be used again. */
	assert_int_equal(atlas_session_open(e, "dup", &a, err, sizeof err), 0);
	atlas_session_close(a);
	atlas_engine_close(e);
}

/* The weight files truncated under a running engine (DESIGN §4.6): the
 * engine holds copies of every weight, so the logits stay what they were
 * and nothing faults (an alias of the mapping would take SIGBUS). */
static void test_weights_truncated_under_the_engine(void **state)
{
	char dir[] = "/tmp/atlas-trunc-XXXXXX", cmd[8192], err[ATLAS_ERRLEN];
	assert_non_null(mkdtemp(dir));
	snprintf(cmd, sizeof cmd, "cp -r '%s'/. '%s'/", model_dir, dir);
	assert_int_equal(system(cmd), 0);
	const char *saved = model_dir;
	model_dir = dir;
	struct atlas_engine *e = open_engine(2, 64, 8u << 20);
	model_dir = saved;
	const int vocab = atlas_engine_vocab_size(e);
	int32_t ids[9];
	et_prompt_ids(ids, 9, 5, vocab);
	float *before = malloc(sizeof(float) * 9 * (size_t)vocab);
	float *after = malloc(sizeof(float) * 9 * (size_t)vocab);
	assert_non_null(before);
	assert_non_null(after);
	assert_int_equal(atlas_engine_logits(e, ids, 9, before, err, sizeof err), 0);
	snprintf(cmd, sizeof cmd, "for f in '%s'/*.safetensors; do : > \"$f\"; done", dir);
	assert_int_equal(system(cmd), 0);
	assert_int_equal(atlas_engine_logits(e, ids, 9, after, err, sizeof err), 0);
	assert_memory_equal(before, after, sizeof(float) * 9 * (size_t)vocab);
	atlas_engine_close(e);
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	assert_int_equal(system(cmd), 0);
	free(before);
	free(after);
}

int main(int argc, char **argv)
{
	int status = et_model_arg(argc, argv, &model_dir);
	if (status)
		return status;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_batch_of_one_is_the_reference),
		cmocka_unit_test(test_batched_equals_alone),
		cmocka_unit_test(test_greedy_beside_sampled_equals_alone),
		cmocka_unit_test(test_graphs_on_and_off_agree),
		cmocka_unit_test(test_pdl_on_and_off_agree),
		cmocka_unit_test(test_chunk_sizes_agree),
		cmocka_unit_test(test_preemption_recomputes_the_same),
		cmocka_unit_test(test_logits_independent_of_chunking),
		cmocka_unit_test(test_second_turn_continues_on_kv),
		cmocka_unit_test(test_overflow_fails_one_turn_only),
		cmocka_unit_test(test_cancel_reset_and_busy),
		cmocka_unit_test(test_seeded_sampling_is_reproducible),
		cmocka_unit_test(test_sampled_graphs_on_and_off_agree),
		cmocka_unit_test(test_text_prompts_tokenize_later),
		cmocka_unit_test(test_session_names_and_limits),
		cmocka_unit_test(test_weights_truncated_under_the_engine),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
