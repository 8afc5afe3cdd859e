/* Helpers of the engine tests: waiting for a turn through the notify
 * callback, a set of session settings by name, and a small cpu backend for
 * the tests of the core's parts that need no model. */
#ifndef ATLAS_TESTS_ENGINE_TESTUTIL_H
#define ATLAS_TESTS_ENGINE_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "kernels/backend.h"

/* The model directory of argv[1] (a test may take more arguments after
 * it), or the status main must return: 1 for usage, 77 (skipped) when the
 * directory is missing. */
int et_model_arg(int argc, char **argv, const char **dir);
/* The defaults with model dir, the backend of ATLAS_TEST_BACKEND (cpu when
 * unset), the cpu_precision of ATLAS_TEST_CPU_PRECISION (f32, the reference
 * that goldens hold, when unset), two cpu threads, greedy, raw mode: what
 * every engine test opens. */
void et_config(struct atlas_config *c, const char *dir);

/* The notify callback to install (atlas_engine_set_notify) before waiting. */
void et_on_notify(void *ctx, struct atlas_session *s);
/* Read turn `turn` until it ends, or with until > 0 until that many bytes
 * came (then 0). Copies its text into text[cap] when text is not NULL.
 * Returns the final atlas_read error. */
int et_wait_turn(struct atlas_session *s, uint64_t turn, char *text, size_t cap, size_t until);
/* The n tokens turn `turn` generated into out; fails the test when it
 * generated another number. */
void et_turn_ids(struct atlas_session *s, uint64_t turn, int32_t *out, size_t n);
/* Set one session setting from its text form; fails the test on error. */
void et_set(struct atlas_session *s, const char *key, const char *value);
/* n pseudo-random token ids below vocab, the same for the same seed. */
void et_prompt_ids(int32_t *ids, int n, uint32_t seed, int vocab);
/* A cpu backend (one thread, small limits), opened once per process. */
struct kt_backend *et_cpu(void);

#endif
