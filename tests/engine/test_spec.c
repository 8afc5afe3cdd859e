/* Speculative decoding (DESIGN §9), through the public API: with prompt
 * lookup or a draft model drafting at every step, the tokens are bitwise
 * those of plain decoding at batch 1 and N, for K = 1, 3 and 8, with the
 * swap tier streaming most of each context through staging, greedy and
 * sampled with a seed; drafts were proposed, and some accepted and some
 * rejected, so the comparisons cover both outcomes. The draft model is the
 * model itself (it drafts what the model says: nearly every draft is
 * accepted) and a model of other weights with the same vocabulary (most
 * are rejected), in a KV pool too small for every session at once; one
 * whose vocabulary differs stops the engine at open. With sampling, the tokens that
 * verify rows draw follow the model's own distribution (a chi-square test
 * against atlas_engine_logits on a model of 384 tokens). With the gate on,
 * whatever it decides, the tokens are the same.
 *
 * The model's own MTP head drafts too, on a model that has one.
 *
 * Usage: test_spec MODEL_DIR OTHER_MODEL_DIR OTHER_VOCAB_DIR MTP_DIR
 *   (the second of MODEL_DIR's vocabulary, the third of another, the
 *   fourth MODEL_DIR's sizes with an MTP head; exit 77 when the first is
 *   missing)
 * ATLAS_TEST_BACKEND=cuda runs the same checks on another backend, where
 * greedy tokens agree on these prompts (tools/gpu-check.sh).
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

static const char *model_dir, *other_dir, *other_vocab_dir, *mtp_dir;
static int vocab;
static uint64_t block_bytes;        /* K and V of one block, all layers */

#define SESSIONS 4
#define MAX_TOKENS 40
#define PERIOD 9                    /* a prompt is a run of PERIOD ids said 3.5 times */

struct opts {
	int batch;
	enum atlas_spec spec;
	int k;
	bool gate;
	bool tiers;                 /* a device share of 2 blocks, the rest on the host tier */
	float temperature;
	uint64_t seed;
	int chunk;                  /* chunk_size, 0: 64 */
	bool tight;                 /* a device pool of 12 blocks and no host tier: sessions
				     * are preempted and recompute their KV */
	const char *draft;          /* the draft model's directory, NULL: none */
	int draft_blocks;           /* its KV pool in blocks, 0: 16 MiB */
	const char *model;          /* NULL: MODEL_DIR */
	int mtp_blocks;             /* the MTP head's KV pool in blocks of the model, 0: 16 MiB */
};

struct run {
	int32_t ids[SESSIONS][2][MAX_TOKENS];   /* two turns of each session */
	struct atlas_spec_stats spec;
	uint64_t staged, preemptions;
	char slot_spec[SESSIONS][8];            /* ctl/slots' spec column while running */
};

static struct atlas_engine *open_engine(const struct opts *o)
{
	struct atlas_config c;
	et_config(&c, o->model ? o->model : model_dir);
	c.max_batch = o->batch;
	c.mtp_kv_memory = o->mtp_blocks ? (uint64_t)o->mtp_blocks * block_bytes : 16u << 20;
	c.chunk_size = o->chunk ? o->chunk : 64;
	c.context = 512;
	c.spec = o->spec;
	c.spec_k = o->k ? o->k : 4;
	c.spec_gate = o->gate;
	c.kv_memory = 16u << 20;
	if (o->draft) {
		snprintf(c.draft_model, sizeof c.draft_model, "%s", o->draft);
		c.draft_kv_memory = o->draft_blocks ? (uint64_t)o->draft_blocks * block_bytes
						    : 16u << 20;
	}
	if (o->tight)
		c.kv_memory = 12 * block_bytes;
	if (o->tiers) {
		c.kv_memory = 24 * block_bytes;
		c.kv_host_memory = 128 * ((block_bytes + 4095) / 4096 * 4096);
		c.kv_device_blocks_per_seq = 2;
		c.kv_block_size = 16;
	}
	struct atlas_engine *e;
	char err[ATLAS_ERRLEN];
	if (atlas_engine_open(&c, &e, err, sizeof err))
		fail_msg("atlas_engine_open: %s", err);
	atlas_engine_set_notify(e, et_on_notify, NULL);
	return e;
}

/* A prompt that prompt lookup finds matches in: a run said 3.5 times. */
static int repeating_prompt(int32_t *ids, uint32_t seed)
{
	int32_t run[PERIOD];
	et_prompt_ids(run, PERIOD, seed, vocab);
	int n = 0;
	for (int r = 0; r < 3 * PERIOD + PERIOD / 2; r++)
		ids[n++] = run[r % PERIOD];
	return n;
}

static void set_params(struct atlas_session *s, const struct opts *o)
{
	char v[32];
	et_set(s, "ignore_eos", "1");
	snprintf(v, sizeof v, "%d", MAX_TOKENS);
	et_set(s, "max_tokens", v);
	snprintf(v, sizeof v, "%g", o->temperature);
	et_set(s, "temperature", v);
	et_set(s, "top_p", "1");
	et_set(s, "top_k", "0");
	snprintf(v, sizeof v, "%llu", (unsigned long long)o->seed);
	et_set(s, "seed", v);
}

/* SESSIONS sessions, two turns each: the first all at once, the second one
 * after another (prompt lookup then also finds the first turn's text). */
static void run_sessions(const struct opts *o, struct run *out)
{
	struct atlas_engine *e = open_engine(o);
	struct atlas_session *s[SESSIONS];
	char err[ATLAS_ERRLEN], name[16];
	struct atlas_engine_stats *st = malloc(sizeof *st);
	memset(out, 0, sizeof *out);
	for (int i = 0; i < SESSIONS; i++) {
		snprintf(name, sizeof name, "p%d", i);
		assert_int_equal(atlas_session_open(e, name, &s[i], err, sizeof err), 0);
		set_params(s[i], o);
	}
	for (int i = 0; i < SESSIONS; i++) {
		int32_t ids[64];
		const int n = repeating_prompt(ids, 40u + (uint32_t)i);
		assert_int_equal(atlas_session_submit_tokens(s[i], ids, (size_t)n, err, sizeof err),
				 1);
	}
	for (int i = 0; i < SESSIONS; i++) {
		assert_int_equal(et_wait_turn(s[i], 1, NULL, 0, 0), 0);
		et_turn_ids(s[i], 1, out->ids[i][0], MAX_TOKENS);
	}
	for (int i = 0; i < SESSIONS; i++) {
		int32_t ids[64];
		const int n = repeating_prompt(ids, 70u + (uint32_t)i) - PERIOD;
		assert_int_equal(atlas_session_submit_tokens(s[i], ids, (size_t)n, err, sizeof err),
				 2);
		/* Some decode step of the turn: what ctl/slots says meanwhile. */
		assert_true(et_wait_turn(s[i], 2, NULL, 0, 4 * 6) == 0);
		atlas_engine_stats(e, st);
		for (int j = 0; j < st->n_slots; j++)
			if (!strcmp(st->slots[j].session, atlas_session_name(s[i])))
				snprintf(out->slot_spec[i], sizeof out->slot_spec[i], "%s",
					 st->slots[j].spec);
		assert_int_equal(et_wait_turn(s[i], 2, NULL, 0, 0), 0);
		et_turn_ids(s[i], 2, out->ids[i][1], MAX_TOKENS);
	}
	atlas_engine_stats(e, st);
	out->spec = st->spec;
	out->staged = st->kv.staged_blocks_total;
	out->preemptions = st->kv.preemptions_total;
	for (int i = 0; i < SESSIONS; i++)
		atlas_session_close(s[i]);
	free(st);
	atlas_engine_close(e);
}

static void assert_same(const struct run *a, const struct run *b, const char *what)
{
	for (int i = 0; i < SESSIONS; i++)
		for (int t = 0; t < 2; t++)
			for (int j = 0; j < MAX_TOKENS; j++)
				if (a->ids[i][t][j] != b->ids[i][t][j])
					fail_msg("%s: session %d turn %d token %d: %d vs %d", what, i,
						 t + 1, j, a->ids[i][t][j], b->ids[i][t][j]);
}

static struct run reference;           /* greedy, plain decoding */

static int setup(void **state)
{
	struct opts o = { .batch = SESSIONS, .spec = ATLAS_SPEC_OFF };
	struct atlas_config c;
	et_config(&c, model_dir);
	c.kv_memory = 16u << 20;
	struct atlas_engine *e;
	char err[ATLAS_ERRLEN];
	if (atlas_engine_open(&c, &e, err, sizeof err))
		return -1;
	struct atlas_engine_stats *st = malloc(sizeof *st);
	atlas_engine_stats(e, st);
	block_bytes = st->kv.bytes_per_block;
	vocab = st->vocab_size;
	free(st);
	atlas_engine_close(e);
	run_sessions(&o, &reference);
	assert_int_equal(reference.spec.drafts_total, 0);
	return 0;
}

/* Greedy: every batch size and K gives plain decoding's tokens, and over
 * the matrix drafts were both accepted and rejected. */
static void test_greedy_matrix(void **state)
{
	static const int batches[] = { 1, SESSIONS };
	static const int ks[] = { 1, 3, 8 };
	uint64_t drafted = 0, accepted = 0;
	for (size_t b = 0; b < ATLAS_ARRAY_LEN(batches); b++)
		for (size_t k = 0; k < ATLAS_ARRAY_LEN(ks); k++) {
			struct opts o = { .batch = batches[b], .spec = ATLAS_SPEC_NGRAM, .k = ks[k] };
			struct run got;
			char what[64];
			run_sessions(&o, &got);
			snprintf(what, sizeof what, "batch %d, k %d", batches[b], ks[k]);
			assert_same(&got, &reference, what);
			assert_true(got.spec.drafts_total > 0);
			assert_true(got.spec.acceptance_by_position[ks[k] - 1] <= 1.0);
			drafted += got.spec.draft_tokens_total;
			accepted += got.spec.accepted_tokens_total;
			print_message("batch %d k %d: %llu drafts, %llu of %llu draft tokens accepted\n",
				      batches[b], ks[k], (unsigned long long)got.spec.drafts_total,
				      (unsigned long long)got.spec.accepted_tokens_total,
				      (unsigned long long)got.spec.draft_tokens_total);
		}
	assert_true(accepted > 0);
	assert_true(accepted < drafted);
}

/* Verify rows read the history the swap tier holds: a device share of two
 * blocks puts most of each context on the host tier, read through staging. */
static void test_swap_tier(void **state)
{
	struct opts o = { .batch = SESSIONS, .spec = ATLAS_SPEC_NGRAM, .k = 4, .tiers = true };
	struct run got;
	run_sessions(&o, &got);
	assert_same(&got, &reference, "host tier, k 4");
	assert_true(got.staged > 0);
	assert_true(got.spec.accepted_tokens_total > 0);
}

/* Sampled with a seed: the same text with drafts as without. */
static void test_sampled_same_text(void **state)
{
	struct opts plain = { .batch = SESSIONS, .spec = ATLAS_SPEC_OFF, .temperature = 0.8f,
			      .seed = 11 };
	struct opts spec = plain;
	spec.spec = ATLAS_SPEC_NGRAM;
	spec.k = 5;
	struct run a, b;
	run_sessions(&plain, &a);
	run_sessions(&spec, &b);
	assert_same(&b, &a, "sampled, k 5");
	assert_true(b.spec.drafts_total > 0);
}

/* The gate on, as shipped: the same tokens, whatever it decides from the
 * step times it measures (its decisions are checked in test_engine_units). */
static void test_gate(void **state)
{
	struct opts o = { .batch = SESSIONS, .spec = ATLAS_SPEC_AUTO, .k = 4, .gate = true };
	struct run got;
	run_sessions(&o, &got);
	assert_same(&got, &reference, "gated");
	/* ctl/slots' column, where the session was in its slot when looked at. */
	for (int i = 0; i < SESSIONS; i++)
		assert_true(!got.slot_spec[i][0] || !strcmp(got.slot_spec[i], "ngram") ||
			    !strcmp(got.slot_spec[i], "gated") || !strcmp(got.slot_spec[i], "off"));
	assert_true(got.spec.drafts_total + got.spec.gated_total > 0);
	assert_true(got.spec.step_seconds_decode > 0);
	print_message("decode step %.3g s; verify steps of 1..8 drafts:", got.spec.step_seconds_decode);
	for (int k = 0; k < 8; k++)
		print_message(" %.3g", got.spec.step_seconds_verify[k]);
	print_message("; %llu gated, %llu drafts, %llu of %llu accepted\n",
		      (unsigned long long)got.spec.gated_total,
		      (unsigned long long)got.spec.drafts_total,
		      (unsigned long long)got.spec.accepted_tokens_total,
		      (unsigned long long)got.spec.draft_tokens_total);
}

/* The draft model's share of the drafts and of the accepted tokens. */
static void print_draft(const struct run *r, const char *what)
{
	print_message("%s: %llu draft-model drafts, %llu of %llu draft tokens accepted\n", what,
		      (unsigned long long)r->spec.by_drafter[1].drafts_total,
		      (unsigned long long)r->spec.by_drafter[1].accepted_tokens_total,
		      (unsigned long long)r->spec.by_drafter[1].draft_tokens_total);
	assert_string_equal(r->spec.by_drafter[1].name, "draft");
	assert_true(r->spec.by_drafter[1].drafts_total > 0);
	assert_int_equal(r->spec.draft_errors_total, 0);
}

/* The model drafting for itself: plain decoding's tokens at batch 1 and N
 * and K 1, 3, 8, and its drafts are what the model says, so nearly all of
 * them are accepted (a turn's end cuts a few short). */
static void test_draft_self(void **state)
{
	static const int batches[] = { 1, SESSIONS };
	static const int ks[] = { 1, 3, 8 };
	for (size_t b = 0; b < ATLAS_ARRAY_LEN(batches); b++)
		for (size_t k = 0; k < ATLAS_ARRAY_LEN(ks); k++) {
			struct opts o = { .batch = batches[b], .spec = ATLAS_SPEC_DRAFT, .k = ks[k],
					  .draft = model_dir };
			struct run got;
			char what[64];
			run_sessions(&o, &got);
			snprintf(what, sizeof what, "self-draft, batch %d, k %d", batches[b], ks[k]);
			assert_same(&got, &reference, what);
			print_draft(&got, what);
			assert_int_equal(got.spec.by_drafter[0].drafts_total, 0);
			assert_true(got.spec.accepted_tokens_total * 10 >=
				    got.spec.draft_tokens_total * 9);
		}
}

/* Another model's drafts, mostly wrong, from a pool of 12 blocks for four
 * sessions of up to 9 blocks each (sessions take each other's draft KV);
 * with the swap tier; sampled with a seed; auto with the gate on. */
static void test_draft_other(void **state)
{
	struct opts o = { .batch = SESSIONS, .spec = ATLAS_SPEC_DRAFT, .k = 4,
			  .draft = other_dir, .draft_blocks = 12 };
	struct run got, a, b;
	run_sessions(&o, &got);
	assert_same(&got, &reference, "other draft model");
	print_draft(&got, "other draft model");
	assert_true(got.spec.accepted_tokens_total < got.spec.draft_tokens_total);

	o.tiers = true;
	run_sessions(&o, &got);
	assert_same(&got, &reference, "other draft model, host tier");
	assert_true(got.staged > 0);
	print_draft(&got, "host tier");

	struct opts plain = { .batch = SESSIONS, .spec = ATLAS_SPEC_OFF, .temperature = 0.8f,
			      .seed = 11 };
	struct opts spec = plain;
	spec.spec = ATLAS_SPEC_DRAFT;
	spec.k = 3;
	spec.draft = model_dir;
	run_sessions(&plain, &a);
	run_sessions(&spec, &b);
	assert_same(&b, &a, "sampled, self-draft, k 3");
	print_draft(&b, "sampled");
	assert_true(b.spec.accepted_tokens_total < b.spec.draft_tokens_total);
	assert_true(b.spec.accepted_tokens_total * 10 >= b.spec.draft_tokens_total * 9);

	struct opts gate = { .batch = SESSIONS, .spec = ATLAS_SPEC_AUTO, .k = 4, .gate = true,
			     .draft = other_dir };
	run_sessions(&gate, &got);
	assert_same(&got, &reference, "auto, gate on, other draft model");
	for (int i = 0; i < SESSIONS; i++)
		assert_true(!got.slot_spec[i][0] || !strcmp(got.slot_spec[i], "ngram") ||
			    !strcmp(got.slot_spec[i], "draft") ||
			    !strcmp(got.slot_spec[i], "gated") || !strcmp(got.slot_spec[i], "off"));
}

/* The other paths of the matrix, for each drafter: prefill chunks of 8
 * rows (the draft model catches up over several steps), and a device pool
 * too small for the four sessions with no swap tier (they are preempted
 * and recompute their KV, drafts and all). After a rejected draft the
 * draft model's KV is rolled back: the model drafting for itself under
 * sampling keeps nearly every draft. */
static void test_paths(void **state)
{
	const enum atlas_spec methods[] = { ATLAS_SPEC_NGRAM, ATLAS_SPEC_DRAFT };
	for (size_t m = 0; m < ATLAS_ARRAY_LEN(methods); m++) {
		struct opts o = { .batch = SESSIONS, .spec = methods[m], .k = 4, .chunk = 8,
				  .draft = methods[m] == ATLAS_SPEC_DRAFT ? model_dir : NULL };
		struct run got;
		char what[64];
		run_sessions(&o, &got);
		snprintf(what, sizeof what, "%s, chunk 8", atlas_spec_name(methods[m]));
		assert_same(&got, &reference, what);
		assert_true(got.spec.accepted_tokens_total > 0);
		o.chunk = 0;
		o.tight = true;
		run_sessions(&o, &got);
		snprintf(what, sizeof what, "%s, preempted", atlas_spec_name(methods[m]));
		assert_same(&got, &reference, what);
		print_message("%s: %llu preemptions, %llu of %llu accepted\n", what,
			      (unsigned long long)got.preemptions,
			      (unsigned long long)got.spec.accepted_tokens_total,
			      (unsigned long long)got.spec.draft_tokens_total);
		assert_true(got.preemptions > 0);
		assert_true(got.spec.accepted_tokens_total > 0);
	}
}

/* The model's MTP head drafting (a model of MTP_DIR, which has one, and
 * the same sizes as MODEL_DIR): plain decoding's tokens at batch 1 and N,
 * K 1, 3 and 8; with the swap tier; sampled with a seed; prefill chunks of
 * 8 rows; preempted sessions that recompute their KV; a head pool too small
 * for every session (some lose their head KV and stop drafting); auto with
 * the gate on. The head's random weights guess badly (on these prompts
 * the model rejects every draft it makes): test_mtp checks the head's
 * drafts after accepted ones. */
static void test_mtp(void **state)
{
	struct opts plain = { .batch = SESSIONS, .spec = ATLAS_SPEC_OFF, .model = mtp_dir };
	struct run ref, got, a, b;
	run_sessions(&plain, &ref);
	assert_int_equal(ref.spec.drafts_total, 0);
	static const int batches[] = { 1, SESSIONS };
	static const int ks[] = { 1, 3, 8 };
	for (size_t i = 0; i < ATLAS_ARRAY_LEN(batches); i++)
		for (size_t k = 0; k < ATLAS_ARRAY_LEN(ks); k++) {
			struct opts o = { .batch = batches[i], .spec = ATLAS_SPEC_MTP, .k = ks[k],
					  .model = mtp_dir };
			char what[64];
			run_sessions(&o, &got);
			snprintf(what, sizeof what, "mtp, batch %d, k %d", batches[i], ks[k]);
			assert_same(&got, &ref, what);
			const uint64_t d = got.spec.by_drafter[2].drafts_total;
			print_message("%s: %llu drafts, %llu of %llu draft tokens accepted\n", what,
				      (unsigned long long)d,
				      (unsigned long long)got.spec.accepted_tokens_total,
				      (unsigned long long)got.spec.draft_tokens_total);
			assert_string_equal(got.spec.by_drafter[2].name, "mtp");
			assert_true(got.spec.mtp_head);
			assert_true(d > 0 && d == got.spec.drafts_total);
			assert_int_equal(got.spec.draft_errors_total, 0);
		}

	struct opts o = { .batch = SESSIONS, .spec = ATLAS_SPEC_MTP, .k = 4, .model = mtp_dir,
			  .tiers = true };
	run_sessions(&o, &got);
	assert_same(&got, &ref, "mtp, host tier");
	assert_true(got.staged > 0 && got.spec.drafts_total > 0);
	o.tiers = false;
	o.chunk = 8;
	run_sessions(&o, &got);
	assert_same(&got, &ref, "mtp, chunk 8");
	assert_true(got.spec.drafts_total > 0);
	o.chunk = 0;
	o.tight = true;
	run_sessions(&o, &got);
	assert_same(&got, &ref, "mtp, preempted");
	assert_true(got.preemptions > 0 && got.spec.drafts_total > 0);
	o.tight = false;
	o.mtp_blocks = 12;
	run_sessions(&o, &got);
	assert_same(&got, &ref, "mtp, a small head pool");
	assert_true(got.spec.drafts_total > 0);
	o.mtp_blocks = 0;
	o.gate = true;
	o.spec = ATLAS_SPEC_AUTO;
	run_sessions(&o, &got);
	assert_same(&got, &ref, "auto, gate on, mtp");
	for (int i = 0; i < SESSIONS; i++)
		assert_true(!got.slot_spec[i][0] || !strcmp(got.slot_spec[i], "ngram") ||
			    !strcmp(got.slot_spec[i], "mtp") ||
			    !strcmp(got.slot_spec[i], "gated") || !strcmp(got.slot_spec[i], "off"));

	plain.temperature = 0.8f;
	plain.seed = 11;
	struct opts spec = plain;
	spec.spec = ATLAS_SPEC_MTP;
	spec.k = 3;
	run_sessions(&plain, &a);
	run_sessions(&spec, &b);
	assert_same(&b, &a, "mtp, sampled, k 3");
	assert_true(b.spec.drafts_total > 0);
}

/* A draft model of another vocabulary is a clear error at open; without a
 * draft model, a session cannot ask for one, nor for mtp on a model
 * without a head; spec = mtp in the config of such a model stops it. */
static void test_draft_refused(void **state)
{
	struct atlas_config c;
	struct atlas_engine *e;
	char err[ATLAS_ERRLEN];
	et_config(&c, model_dir);
	c.kv_memory = 16u << 20;
	snprintf(c.draft_model, sizeof c.draft_model, "%s", other_vocab_dir);
	assert_int_equal(atlas_engine_open(&c, &e, err, sizeof err), -EINVAL);
	print_message("%s\n", err);
	assert_non_null(strstr(err, "vocab"));

	struct opts o = { .batch = 1, .spec = ATLAS_SPEC_NGRAM };
	struct atlas_session *s;
	e = open_engine(&o);
	assert_int_equal(atlas_session_open(e, "x", &s, err, sizeof err), 0);
	struct atlas_params p;
	atlas_session_get_params(s, &p);
	assert_int_equal(atlas_params_parse(&p, "spec", "draft", NULL, err, sizeof err), 0);
	assert_int_equal(atlas_session_set_params(s, &p, err, sizeof err), -EINVAL);
	print_message("%s\n", err);
	assert_non_null(strstr(err, "draft_model"));
	assert_int_equal(atlas_params_parse(&p, "spec", "mtp", NULL, err, sizeof err), 0);
	assert_int_equal(atlas_session_set_params(s, &p, err, sizeof err), -EINVAL);
	print_message("%s\n", err);
	assert_non_null(strstr(err, "has none"));
	atlas_session_close(s);
	atlas_engine_close(e);

	et_config(&c, model_dir);
	c.kv_memory = 16u << 20;
	c.spec = ATLAS_SPEC_MTP;
	assert_int_equal(atlas_engine_open(&c, &e, err, sizeof err), -EINVAL);
	print_message("%s\n", err);
	assert_non_null(strstr(err, "multi-token-prediction"));
}

/* The sampling test: a flat distribution (temperature 3), and a prompt
 * that ends with the model's likeliest token twice, so that about half of
 * the drafts are accepted. */
#define TEMP 3.0
#define REPEATS 2

/* A chi-square statistic's critical value at significance 0.001
 * (Wilson-Hilferty). */
static double chi2_critical(int df)
{
	const double z = 3.0902, a = 2.0 / (9.0 * df);
	return df * pow(1 - a + z * sqrt(a), 3);
}

/* Softmax of logits / t over the vocabulary. */
static void softmax(const float *logits, double t, double *p)
{
	double mx = -INFINITY, sum = 0;
	for (int v = 0; v < vocab; v++)
		mx = fmax(mx, logits[v] / t);
	for (int v = 0; v < vocab; v++)
		sum += p[v] = exp(logits[v] / t - mx);
	for (int v = 0; v < vocab; v++)
		p[v] /= sum;
}

/* The model's distribution after ids[0, n) at temperature t. */
static void target(struct atlas_engine *e, const int32_t *ids, int n, double t, double *p)
{
	float *lg = malloc(sizeof(float) * (size_t)n * (size_t)vocab);
	char err[ATLAS_ERRLEN];
	assert_int_equal(atlas_engine_logits(e, ids, (size_t)n, lg, err, sizeof err), 0);
	softmax(lg + (size_t)(n - 1) * (size_t)vocab, t, p);
	free(lg);
}

/* Chi-square of counts[vocab] (n draws) against p: cells of expected count
 * 5 or more, the rest pooled. Fails the test above the 0.001 critical value. */
static void chi_square(const int *counts, int n, const double *p, const char *what)
{
	double x2 = 0, pool_e = 0;
	int pool_o = 0, cells = 0;
	for (int v = 0; v < vocab; v++) {
		const double ex = p[v] * n;
		if (ex >= 5) {
			x2 += (counts[v] - ex) * (counts[v] - ex) / ex;
			cells++;
		} else {
			pool_e += ex;
			pool_o += counts[v];
		}
	}
	if (pool_e >= 5) {
		x2 += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
		cells++;
	}
	print_message("%s: %d draws, %d cells, chi-square %.1f (critical %.1f)\n", what, n, cells,
		      x2, chi2_critical(cells - 1));
	assert_true(cells >= 3);
	assert_true(x2 < chi2_critical(cells - 1));
}

/* Sampled at temperature 1 over many seeds: the first decode step is a
 * verify whose rows draw tokens 2 and 3. Given the modal token 1, token 2
 * follows the model's distribution; given the modal tokens 1 and 2 (the
 * draft of row 1 was what row 0 drew when they equal it), so does token 3. */
static void test_sampling_distribution(void **state)
{
	enum { SEEDS = 1600 };
	struct opts o = { .batch = SESSIONS, .spec = ATLAS_SPEC_NGRAM, .k = 4, .temperature = TEMP };
	struct atlas_engine *e = open_engine(&o);
	struct atlas_session *s[SESSIONS];
	char err[ATLAS_ERRLEN], name[16], seed[24];
	int32_t prompt[72], (*got)[3] = calloc(SEEDS, sizeof *got);
	double *p = malloc(sizeof(double) * (size_t)vocab);
	int n = repeating_prompt(prompt, 5);
	/* Then the model's likeliest token, said a few times: prompt lookup
	 * drafts it again, and the model often but not always agrees. */
	target(e, prompt, n, TEMP, p);
	int likely = 0;
	for (int v = 1; v < vocab; v++)
		if (p[v] > p[likely])
			likely = v;
	for (int j = 0; j < REPEATS; j++)
		prompt[n++] = likely;
	for (int i = 0; i < SESSIONS; i++) {
		snprintf(name, sizeof name, "d%d", i);
		assert_int_equal(atlas_session_open(e, name, &s[i], err, sizeof err), 0);
		set_params(s[i], &o);
		et_set(s[i], "max_tokens", "3");
	}
	for (int d = 0; d < SEEDS; d += SESSIONS) {
		for (int i = 0; i < SESSIONS; i++) {
			atlas_session_reset(s[i]);
			snprintf(seed, sizeof seed, "%d", d + i + 1);
			et_set(s[i], "seed", seed);
			assert_true(atlas_session_submit_tokens(s[i], prompt, (size_t)n, err,
								sizeof err) > 0);
		}
		for (int i = 0; i < SESSIONS; i++) {
			const uint64_t turn = atlas_session_newest_turn(s[i]);
			int32_t *pr, *gen;
			size_t np, ng;
			assert_int_equal(et_wait_turn(s[i], turn, NULL, 0, 0), 0);
			assert_int_equal(atlas_session_turn_tokens(s[i], turn, &pr, &np, &gen, &ng), 0);
			assert_int_equal(ng, 3);
			memcpy(got[d + i], gen, sizeof got[0]);
			free(pr);
			free(gen);
		}
	}
	struct atlas_engine_stats *st = malloc(sizeof *st);
	atlas_engine_stats(e, st);
	print_message("%llu drafts, %llu of %llu draft tokens accepted\n",
		      (unsigned long long)st->spec.drafts_total,
		      (unsigned long long)st->spec.accepted_tokens_total,
		      (unsigned long long)st->spec.draft_tokens_total);
	assert_true(st->spec.accepted_tokens_total > 0);
	assert_true(st->spec.accepted_tokens_total < st->spec.draft_tokens_total);
	free(st);

	int *counts = calloc((size_t)vocab, sizeof *counts);
	int32_t ctx[72];
	memcpy(ctx, prompt, sizeof(int32_t) * (size_t)n);
	for (int pos = 1; pos < 3; pos++) {
		/* The modal prefix of the tokens before pos. */
		int m = 0;
		for (int j = 0; j < pos; j++) {
			memset(counts, 0, sizeof(int) * (size_t)vocab);
			for (int d = 0; d < SEEDS; d++)
				if (!memcmp(got[d], ctx + n, sizeof(int32_t) * (size_t)j))
					counts[got[d][j]]++;
			int best = 0;
			for (int v = 1; v < vocab; v++)
				if (counts[v] > counts[best])
					best = v;
			ctx[n + j] = best;
		}
		memset(counts, 0, sizeof(int) * (size_t)vocab);
		for (int d = 0; d < SEEDS; d++)
			if (!memcmp(got[d], ctx + n, sizeof(int32_t) * (size_t)pos)) {
				counts[got[d][pos]]++;
				m++;
			}
		target(e, ctx, n + pos, TEMP, p);
		char what[64];
		snprintf(what, sizeof what, "token %d given the modal %d before it", pos + 1, pos);
		chi_square(counts, m, p, what);
	}
	free(counts);
	free(p);
	free(got);
	for (int i = 0; i < SESSIONS; i++)
		atlas_session_close(s[i]);
	atlas_engine_close(e);
}

int main(int argc, char **argv)
{
	int rc = et_model_arg(argc, argv, &model_dir);
	if (rc)
		return rc;
	if (argc < 5) {
		fprintf(stderr, "usage: %s MODEL_DIR OTHER_MODEL_DIR OTHER_VOCAB_DIR MTP_DIR\n",
			argv[0]);
		return 2;
	}
	other_dir = argv[2];
	other_vocab_dir = argv[3];
	mtp_dir = argv[4];
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_greedy_matrix),
		cmocka_unit_test(test_swap_tier),
		cmocka_unit_test(test_sampled_same_text),
		cmocka_unit_test(test_gate),
		cmocka_unit_test(test_draft_self),
		cmocka_unit_test(test_draft_other),
		cmocka_unit_test(test_draft_refused),
		cmocka_unit_test(test_mtp),
		cmocka_unit_test(test_paths),
		cmocka_unit_test(test_sampling_distribution),
	};
	return cmocka_run_group_tests(tests, setup, NULL);
}
