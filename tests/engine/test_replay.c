/* Replay (DESIGN §7.1): the step commands of a multi-session run, recorded
 * in their byte form, run again on a second executor loaded from the same
 * model give the same tokens and bitwise the same logits (cpu backend).
 *
 * The run has what makes a scheduler's life hard: prompts prefilled in
 * chunks beside decode rows, batched decode, a pool too small for every
 * session (preemption), a cancelled turn, sampling as well as greedy, and a
 * tools request (atlas_engine_logits) between the steps of sessions. The
 * recorder keeps every command's bytes and its result; the replay decodes
 * each, runs it through exec_run and compares. This is the stream that
 * expert-parallel workers will execute.
 *
 * Usage: test_replay MODEL_DIR   (exit 77 when the directory is missing)
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "common/err.h"
#include "engine/internal.h"
#include "engine_testutil.h"

static const char *model_dir;

struct record {
	unsigned char *bytes;       /* the command's byte form; owned */
	size_t n_bytes;
	int n_out, n_keep;
	int32_t *tokens;            /* [n_out] */
	float *logits;              /* [n_keep, vocab] */
};

struct recorder {
	int vocab;
	struct record *recs;
	size_t n, cap;
	int multi_row, batched_decode, keep_all;  /* what the stream held */
	int first_multi_row;        /* the first step with a prefill chunk */
};

static void record_step(void *ctx, const struct step_cmd *cmd, const struct step_result *res)
{
	struct recorder *rec = ctx;
	if (rec->n == rec->cap) {
		rec->cap = rec->cap ? 2 * rec->cap : 256;
		rec->recs = realloc(rec->recs, rec->cap * sizeof *rec->recs);
		assert_non_null(rec->recs);
	}
	struct record *r = &rec->recs[rec->n++];
	r->n_bytes = step_wire_size(cmd);
	r->bytes = malloc(r->n_bytes);
	assert_int_equal(step_encode(cmd, r->bytes, r->n_bytes), (long)r->n_bytes);
	r->n_out = cmd->n_out;
	r->n_keep = res->n_keep;
	r->tokens = malloc((size_t)(cmd->n_out + 1) * sizeof *r->tokens);
	memcpy(r->tokens, res->tokens, (size_t)cmd->n_out * sizeof *r->tokens);
	size_t lb = (size_t)res->n_keep * (size_t)rec->vocab * sizeof(float);
	r->logits = malloc(lb + 1);
	memcpy(r->logits, res->logits, lb);
	int decode = 0;
	if (!rec->multi_row)
		rec->first_multi_row = (int)rec->n - 1;
	for (int i = 0; i < cmd->n_seqs; i++) {
		decode += cmd->seqs[i].n_rows == 1;
		rec->multi_row += cmd->seqs[i].n_rows > 1;
	}
	rec->batched_decode += decode > 1;
	rec->keep_all += cmd->n_out && cmd->out[0].keep && !cmd->out[0].sample;
}

static struct atlas_config config(uint64_t kv_memory)
{
	struct atlas_config c;
	et_config(&c, model_dir);
	snprintf(c.backend, sizeof c.backend, "cpu");   /* bitwise: the cpu backend */
	c.max_batch = 3;
	c.chunk_size = 16;
	c.kv_memory = kv_memory;
	c.context = 256;
	return c;
}

#define SESSIONS 4

static void run_sessions(struct atlas_engine *e, int vocab)
{
	static const int prompt_len[SESSIONS] = { 45, 3, 70, 20 };
	struct atlas_session *s[SESSIONS];
	char err[ATLAS_ERRLEN], name[16];
	for (int i = 0; i < SESSIONS; i++) {
		snprintf(name, sizeof name, "r%d", i);
		assert_int_equal(atlas_session_open(e, name, &s[i], err, sizeof err), 0);
		et_set(s[i], "mode", "raw");
		et_set(s[i], "ignore_eos", "1");
		et_set(s[i], "max_tokens", i == 3 ? "150" : "20");
		et_set(s[i], "temperature", i % 2 ? "0.9" : "0");
		et_set(s[i], "seed", "11");
	}
	for (int i = 0; i < SESSIONS; i++) {
		int32_t ids[128];
		uint32_t x = 77u + (uint32_t)i;
		for (int k = 0; k < prompt_len[i]; k++) {
			x = x * 1664525u + 1013904223u;
			ids[k] = (int32_t)((x >> 8) % (uint32_t)vocab);
		}
		assert_int_equal(atlas_session_submit_tokens(s[i], ids, (size_t)prompt_len[i], err,
							     sizeof err), 1);
	}
	/* The long turn is cancelled once it has produced some output. */
	assert_int_equal(et_wait_turn(s[3], 1, NULL, 0, 12), 0);
	atlas_session_cancel(s[3]);
	assert_int_equal(et_wait_turn(s[3], 1, NULL, 0, 0), -ECANCELED);
	/* A tools request while the others run. */
	int32_t probe[40];
	for (int k = 0; k < 40; k++)
		probe[k] = (k * 31) % vocab;
	float *logits = malloc(40 * (size_t)vocab * sizeof *logits);
	assert_int_equal(atlas_engine_logits(e, probe, 40, logits, err, sizeof err), 0);
	free(logits);
	for (int i = 0; i < 3; i++)
		assert_int_equal(et_wait_turn(s[i], 1, NULL, 0, 0), 0);
	/* A second turn of the first session continues on its KV. */
	int32_t more[9] = { 1, 2, 3, 4, 5, 6, 7, 8, 9 };
	assert_int_equal(atlas_session_submit_tokens(s[0], more, 9, err, sizeof err), 2);
	assert_int_equal(et_wait_turn(s[0], 2, NULL, 0, 0), 0);
	for (int i = 0; i < SESSIONS; i++)
		atlas_session_close(s[i]);
}

/* Run the recorded stream (all but step `skip`) on a fresh executor opened
 * from c: the number of steps whose tokens or logits differ. */
static int replay(const struct atlas_config *c, const struct recorder *rec, int skip)
{
	char err[ATLAS_ERRLEN];
	struct step_limits lim;
	struct exec *x;
	engine_step_limits(c, &lim);
	assert_int_equal(exec_open(c, EXEC_MODEL, engine_seq_slots(c), &lim, &x, err, sizeof err), 0);
	struct step_cmd cmd;
	assert_int_equal(step_cmd_alloc(&cmd, &x->lim), 0);
	int differ = 0;
	for (size_t i = 0; i < rec->n; i++) {
		const struct record *r = &rec->recs[i];
		struct step_result res;
		if ((int)i == skip)
			continue;
		assert_int_equal(step_decode(r->bytes, r->n_bytes, &x->lim, &cmd), 0);
		if (exec_run(x, &cmd, &res, err, sizeof err))
			fail_msg("replay of step %zu: %s", i, err);
		assert_int_equal(res.n_keep, r->n_keep);
		differ += memcmp(res.tokens, r->tokens, (size_t)r->n_out * sizeof *r->tokens) ||
			  memcmp(res.logits, r->logits,
				 (size_t)r->n_keep * (size_t)rec->vocab * sizeof(float));
	}
	step_cmd_free(&cmd);
	exec_close(x);
	return differ;
}

static void test_replay_is_bitwise(void **state)
{
	struct stat sb;
	if (stat(model_dir, &sb) != 0)
		skip();
	/* The pool's block size, then a pool that cannot hold all sessions. */
	struct atlas_config c = config(1 << 20);
	struct atlas_engine *e;
	char err[ATLAS_ERRLEN];
	assert_int_equal(atlas_engine_open(&c, &e, err, sizeof err), 0);
	struct atlas_engine_stats *st = malloc(sizeof *st);
	atlas_engine_stats(e, st);
	atlas_engine_close(e);
	c = config(st->kv.bytes_per_block * 10);

	struct recorder rec = { 0 };
	assert_int_equal(atlas_engine_open(&c, &e, err, sizeof err), 0);
	rec.vocab = atlas_engine_vocab_size(e);
	engine_on_step(e, record_step, &rec);
	atlas_engine_set_notify(e, et_on_notify, NULL);
	run_sessions(e, rec.vocab);
	atlas_engine_stats(e, st);
	atlas_engine_close(e);
	printf("recorded %zu steps: %d prefill chunks, %d batched decode steps, %d tools steps, "
	       "%llu preemptions, %llu evictions\n", rec.n, rec.multi_row, rec.batched_decode,
	       rec.keep_all, (unsigned long long)st->kv.preemptions_total,
	       (unsigned long long)st->kv.evictions_total);
	assert_true(rec.multi_row > 0 && rec.batched_decode > 0 && rec.keep_all > 0);
	assert_true(st->kv.preemptions_total > 0);
	free(st);

	/* A second instance: the executor alone, as a worker would have it. */
	assert_int_equal(replay(&c, &rec, -1), 0);
	/* The comparison sees the device state: leave out the first prefill
	 * chunk and the steps that read its KV differ. */
	int mismatches = replay(&c, &rec, rec.first_multi_row);
	printf("without step %d: %d steps differ\n", rec.first_multi_row, mismatches);
	assert_true(mismatches > 0);
	for (size_t i = 0; i < rec.n; i++) {
		free(rec.recs[i].bytes);
		free(rec.recs[i].tokens);
		free(rec.recs[i].logits);
	}
	free(rec.recs);
}

int main(int argc, char **argv)
{
	int status = et_model_arg(argc, argv, &model_dir);
	if (status)
		return status;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_replay_is_bitwise),
	};
	return cmocka_run_group_tests_name("replay", tests, NULL, NULL);
}
