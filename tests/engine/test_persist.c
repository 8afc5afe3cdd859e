/* Kept sessions (kv_persist, DESIGN §8) on the cpu backend, through the
 * public API: a session's history, settings and KV survive closing the
 * engine and opening another on the same kv_dir, and its next turn computes
 * only its new tokens, with the tokens of a run that never stopped. A block
 * file whose data changed (checksums), a different model and a different
 * tokenizer are detected: the first two recompute the context and give the
 * same tokens, the last brings nothing back and sets the manifest aside.
 *
 * A model with linear-attention layers (Qwen3-Next) keeps no KV: its
 * sessions come back with their history and settings and recompute their
 * contexts, to the same tokens (the second argument says so).
 *
 * Usage: test_persist MODEL_DIR [recompute]   (exit 77 when the directory
 * is missing)
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
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

static const char *model_dir;
static bool keeps_no_kv;            /* "recompute": the model's sessions keep no KV */
static char kv_dir[256], other_dir[256];
static uint64_t block_bytes;
static int vocab;                   /* prompt ids stay below it */

#define TURNS 5
#define MAX_TOKENS 8
static const int prompt_len[TURNS] = { 40, 9, 12, 5, 7 };
/* Session a's tokens in a run that never stops. */
static int32_t reference[TURNS][MAX_TOKENS];

static struct atlas_engine *open_engine(const char *model, bool persist)
{
	struct atlas_config c;
	et_config(&c, model);
	c.kv_memory = block_bytes ? 32 * block_bytes : 8u << 20;
	c.kv_host_memory = 4 * ((block_bytes + 4095) / 4096 * 4096);
	c.kv_disk_memory = 256 * (block_bytes ? block_bytes : 8192);
	snprintf(c.kv_dir, sizeof c.kv_dir, "%s", kv_dir);
	c.kv_persist = persist;
	c.context = 256;
	struct atlas_engine *e;
	char err[ATLAS_ERRLEN];
	if (atlas_engine_open(&c, &e, err, sizeof err))
		fail_msg("atlas_engine_open: %s", err);
	atlas_engine_set_notify(e, et_on_notify, NULL);
	vocab = atlas_engine_vocab_size(e) < 1000 ? atlas_engine_vocab_size(e) : 1000;
	if (!block_bytes) {
		struct atlas_engine_stats *st = malloc(sizeof *st);
		atlas_engine_stats(e, st);
		block_bytes = st->kv.bytes_per_block;
		free(st);
	}
	return e;
}

static struct atlas_session *open_session(struct atlas_engine *e, const char *name)
{
	struct atlas_session *s;
	char err[ATLAS_ERRLEN];
	if (atlas_session_open(e, name, &s, err, sizeof err))
		fail_msg("atlas_session_open: %s", err);
	return s;
}

/* Turn t of session a (numbered from 0): its prompt, then its tokens. */
static void run_turn(struct atlas_session *s, int t, int32_t *out)
{
	int32_t ids[64], *prompt, *gen;
	size_t np, ng;
	char err[ATLAS_ERRLEN];
	et_prompt_ids(ids, prompt_len[t], 500u + (uint32_t)t, vocab);
	assert_int_equal(atlas_session_submit_tokens(s, ids, (size_t)prompt_len[t], err,
						     sizeof err), (int)atlas_session_newest_turn(s) + 1);
	const uint64_t turn = atlas_session_newest_turn(s);
	assert_int_equal(et_wait_turn(s, turn, NULL, 0, 0), 0);
	assert_int_equal(atlas_session_turn_tokens(s, turn, &prompt, &np, &gen, &ng), 0);
	assert_int_equal(ng, MAX_TOKENS);
	memcpy(out, gen, sizeof(int32_t) * MAX_TOKENS);
	free(prompt);
	free(gen);
}

/* Rows the engine computed, but the drafts that verification rejected
 * (speculative decoding computes those too, and they leave no KV). */
static uint64_t step_tokens(struct atlas_engine *e)
{
	struct atlas_engine_stats *st = malloc(sizeof *st);
	atlas_engine_stats(e, st);
	uint64_t n = st->step_tokens_total - st->spec.draft_tokens_total +
		     st->spec.accepted_tokens_total;
	free(st);
	return n;
}

static uint64_t context_tokens(struct atlas_session *s)
{
	struct atlas_session_status st;
	atlas_session_status(s, &st);
	return st.context_tokens;
}

static void setup_session(struct atlas_session *s)
{
	et_set(s, "ignore_eos", "1");
	et_set(s, "max_tokens", "8");
	/* A hybrid model feeds a rejected draft's kept rows again: the rows
	 * counted would be more than the context. */
	if (keeps_no_kv)
		et_set(s, "spec", "off");
}

static void test_reference(void **state)
{
	struct atlas_engine *e = open_engine(model_dir, false);
	struct atlas_session *a = open_session(e, "a");
	setup_session(a);
	for (int t = 0; t < TURNS; t++)
		run_turn(a, t, reference[t]);
	atlas_engine_close(e);
}

static void stop(struct atlas_engine *e)
{
	char err[ATLAS_ERRLEN];
	if (atlas_engine_persist(e, err, sizeof err))
		fail_msg("atlas_engine_persist: %s", err);
	atlas_engine_close(e);
}

/* Turn t after a restart: the tokens of the reference, and the rows the
 * engine computed for it (its new tokens, or the whole context). */
static uint64_t resume(struct atlas_engine *e, struct atlas_session *a, int t)
{
	int32_t ids[MAX_TOKENS];
	const uint64_t before = step_tokens(e);
	run_turn(a, t, ids);
	assert_memory_equal(ids, reference[t], sizeof ids);
	return step_tokens(e) - before;
}

static void flip_every_page(const char *path)
{
	int fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	struct stat sb;
	assert_int_equal(fstat(fd, &sb), 0);
	assert_true(sb.st_size > 0);
	for (off_t off = 100; off < sb.st_size; off += 4096) {
		unsigned char b;
		assert_int_equal(pread(fd, &b, 1, off), 1);
		b ^= 0x5a;
		assert_int_equal(pwrite(fd, &b, 1, off), 1);
	}
	close(fd);
}

/* A copy of the model directory (links to its files) with one file
 * changed: text appended to a JSON file keeps it valid JSON. */
static void model_copy_with(const char *changed)
{
	char from[1024], to[1024], *abs = realpath(model_dir, NULL);
	DIR *d = opendir(model_dir);
	assert_non_null(abs);
	struct dirent *de;
	assert_non_null(d);
	while ((de = readdir(d)))
		if (de->d_name[0] != '.') {
			snprintf(from, sizeof from, "%s/%s", abs, de->d_name);
			snprintf(to, sizeof to, "%s/%s", other_dir, de->d_name);
			unlink(to);
			if (strcmp(de->d_name, changed) == 0) {
				char cmd[3200];
				snprintf(cmd, sizeof cmd, "cp '%s' '%s' && echo ' ' >> '%s'", from, to,
					 to);
				assert_int_equal(system(cmd), 0);
			} else {
				assert_int_equal(symlink(from, to), 0);
			}
		}
	closedir(d);
	free(abs);
}

static void test_sessions_survive_a_restart(void **state)
{
	char err[ATLAS_ERRLEN], names[4][64], path[600];
	int32_t ids[MAX_TOKENS];

	/* First life: two sessions, one turn each, then a stop. */
	struct atlas_engine *e = open_engine(model_dir, true);
	struct atlas_session *a = open_session(e, "a"), *b = open_session(e, "b");
	setup_session(a);
	et_set(b, "max_tokens", "5");
	et_set(b, "stop", "never-seen");
	run_turn(a, 0, ids);
	assert_memory_equal(ids, reference[0], sizeof ids);
	int32_t pb[20];
	et_prompt_ids(pb, 20, 77, vocab);
	assert_int_equal(atlas_session_submit_tokens(b, pb, 20, err, sizeof err), 1);
	assert_int_equal(et_wait_turn(b, 1, NULL, 0, 0), 0);
	char out_a[256];
	struct atlas_read rd;
	assert_true(atlas_session_read(a, 1, 0, out_a, sizeof out_a - 1, &rd) >= 0);
	out_a[rd.n] = 0;
	stop(e);
	snprintf(path, sizeof path, "%s/atlas-sessions.json", kv_dir);
	assert_int_equal(access(path, F_OK), 0);

	/* Second life: both come back, with their turns and settings, and a's
	 * next turn computes its new tokens only. */
	e = open_engine(model_dir, true);
	assert_int_equal(atlas_engine_kept(e, names, 4), 2);
	assert_int_equal(step_tokens(e), 0);
	a = open_session(e, "a");
	b = open_session(e, "b");
	assert_int_equal(atlas_engine_kept(e, names, 4), 0);
	assert_int_equal(atlas_session_open(e, "a", &a, err, sizeof err), -EEXIST);
	assert_int_equal(atlas_session_newest_turn(a), 1);
	char again[256];
	assert_true(atlas_session_read(a, 1, 0, again, sizeof again - 1, &rd) >= 0);
	again[rd.n] = 0;
	assert_string_equal(again, out_a);
	struct atlas_params pb_params;
	atlas_session_get_params(b, &pb_params);
	assert_int_equal(pb_params.max_tokens, 5);
	assert_int_equal(pb_params.n_stop, 1);
	assert_string_equal(pb_params.stop[0], "never-seen");
	struct atlas_session_status st;
	atlas_session_status(a, &st);
	assert_true(keeps_no_kv ? st.kv_blocks[ATLAS_TIER_DISK] == 0
				: st.kv_blocks[ATLAS_TIER_DISK] > 0);
	const uint64_t ctx1 = context_tokens(a);
	uint64_t rows = resume(e, a, 1);
	printf("after a restart: turn 2 computed %llu rows for a context of %llu\n",
	       (unsigned long long)rows, (unsigned long long)context_tokens(a));
	assert_int_equal(rows, keeps_no_kv ? context_tokens(a) - 1 : context_tokens(a) - ctx1);
	stop(e);

	/* Third life: the block file changed under the manifest: the checksum
	 * catches it and a recomputes its context, to the same tokens. */
	snprintf(path, sizeof path, "%s/atlas-kv.blocks", kv_dir);
	if (!keeps_no_kv)
		flip_every_page(path);
	e = open_engine(model_dir, true);
	a = open_session(e, "a");
	rows = resume(e, a, 2);
	printf("after a corrupted block file: turn 3 computed %llu rows for a context of %llu\n",
	       (unsigned long long)rows, (unsigned long long)context_tokens(a));
	assert_int_equal(rows, context_tokens(a) - 1);
	atlas_session_status(a, &st);
	if (!keeps_no_kv)
		assert_non_null(strstr(st.last_error, "checksum"));
	stop(e);

	/* Fourth life, another model (its config differs): the KV is not used. */
	model_copy_with("config.json");
	e = open_engine(other_dir, true);
	a = open_session(e, "a");
	assert_int_equal(atlas_session_newest_turn(a), 3);
	rows = resume(e, a, 3);
	assert_int_equal(rows, context_tokens(a) - 1);
	stop(e);

	/* Fifth life, back on the model: turn 4's KV was computed by the other
	 * one, so it is recomputed too; then another tokenizer brings nothing
	 * back and keeps the manifest aside. */
	e = open_engine(model_dir, true);
	a = open_session(e, "a");
	rows = resume(e, a, 4);
	assert_int_equal(rows, context_tokens(a) - 1);
	stop(e);
	snprintf(path, sizeof path, "%s/tokenizer.json", model_dir);
	if (access(path, F_OK)) {
		printf("%s has no tokenizer: another tokenizer is not tried\n", model_dir);
		return;
	}
	model_copy_with("tokenizer.json");
	e = open_engine(other_dir, true);
	assert_int_equal(atlas_engine_kept(e, names, 4), 0);
	a = open_session(e, "a");
	assert_int_equal(atlas_session_newest_turn(a), 0);
	atlas_engine_close(e);
	snprintf(path, sizeof path, "%s/atlas-sessions.json.stale", kv_dir);
	assert_int_equal(access(path, F_OK), 0);
}

static int remove_all(const char *dir)
{
	char cmd[600];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	return system(cmd);
}

int main(int argc, char **argv)
{
	int status = et_model_arg(argc, argv, &model_dir);
	if (status)
		return status;
	keeps_no_kv = argc > 2 && !strcmp(argv[2], "recompute");
	const char *build = getenv("ATLAS_BUILD_ROOT");
	snprintf(kv_dir, sizeof kv_dir, "%s/persist-XXXXXX", build ? build : "/tmp");
	snprintf(other_dir, sizeof other_dir, "%s/model-XXXXXX", build ? build : "/tmp");
	if (!mkdtemp(kv_dir) || !mkdtemp(other_dir)) {
		perror("mkdtemp");
		return 1;
	}
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reference),
		cmocka_unit_test(test_sessions_survive_a_restart),
	};
	int rc = cmocka_run_group_tests_name("persist", tests, NULL, NULL);
	remove_all(kv_dir);
	remove_all(other_dir);
	return rc;
}
