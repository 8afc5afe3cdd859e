/* The engine's notifications and the turns they start: a client that
 * submits its next turn as soon as the notification of the last one's end
 * reaches it (atlas bench, a shell loop over `out` and `in`) finds it run.
 * The engine thread lets its lock go to run the callbacks, during a step
 * and before it sleeps; a turn submitted meanwhile signals no one, and the
 * thread must look for work again before it sleeps (engine.c, deliver).
 *
 * Usage: test_notify MODEL_DIR   (exit 77 when the directory is missing)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "common/err.h"
#include "engine/engine.h"
#include "engine_testutil.h"

static const char *model_dir;

/* Turns a session runs one after the other: enough that the submit lands
 * in the window of the callbacks in most runs of a build that loses it
 * (the engine's sleep then never ends, and the test times out). */
#define BACK_TO_BACK_TURNS 400

static void run_back_to_back(int max_batch, int sessions)
{
	struct atlas_config c;
	struct atlas_engine *e;
	struct atlas_session *s[2];
	char err[ATLAS_ERRLEN], name[16];
	et_config(&c, model_dir);
	c.max_batch = max_batch;
	c.context = 2 * BACK_TO_BACK_TURNS + 64;
	c.spec = ATLAS_SPEC_OFF;
	if (atlas_engine_open(&c, &e, err, sizeof err))
		fail_msg("atlas_engine_open: %s", err);
	atlas_engine_set_notify(e, et_on_notify, NULL);
	const int vocab = atlas_engine_vocab_size(e);
	for (int i = 0; i < sessions; i++) {
		snprintf(name, sizeof name, "b%d", i);
		assert_int_equal(atlas_session_open(e, name, &s[i], err, sizeof err), 0);
		et_set(s[i], "max_tokens", "1");
	}
	for (int t = 1; t <= BACK_TO_BACK_TURNS; t++) {
		int32_t id;
		et_prompt_ids(&id, 1, (uint32_t)t, vocab);
		for (int i = 0; i < sessions; i++)
			assert_int_equal(atlas_session_submit_tokens(s[i], &id, 1, err, sizeof err),
					 t);
		for (int i = 0; i < sessions; i++) {
			int32_t out;
			assert_int_equal(et_wait_turn(s[i], (uint64_t)t, NULL, 0, 0), 0);
			et_turn_ids(s[i], (uint64_t)t, &out, 1);
		}
	}
	for (int i = 0; i < sessions; i++)
		atlas_session_close(s[i]);
	atlas_engine_close(e);
}

static void test_one_session_back_to_back(void **state)
{
	run_back_to_back(1, 1);
}

/* Two sessions in one batch: their two notifications per step. */
static void test_two_sessions_back_to_back(void **state)
{
	run_back_to_back(2, 2);
}

int main(int argc, char **argv)
{
	int rc = et_model_arg(argc, argv, &model_dir);
	if (rc)
		return rc;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_one_session_back_to_back),
		cmocka_unit_test(test_two_sessions_back_to_back),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
