/* The helpers of engine_testutil.h. */
#include "engine_testutil.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <setjmp.h>
#include <stdarg.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"

int et_model_arg(int argc, char **argv, const char **dir)
{
	struct stat st;
	if (argc < 2) {
		fprintf(stderr, "usage: %s MODEL_DIR ...\n", argv[0]);
		return 1;
	}
	if (stat(argv[1], &st) != 0) {
		printf("skip: %s is missing (tools/check.sh makes it)\n", argv[1]);
		return 77;
	}
	*dir = argv[1];
	return 0;
}

void et_config(struct atlas_config *c, const char *dir)
{
	const char *backend = getenv("ATLAS_TEST_BACKEND");
	const char *precision = getenv("ATLAS_TEST_CPU_PRECISION");
	atlas_config_defaults(c);
	snprintf(c->cpu_precision, sizeof c->cpu_precision, "%s", precision ? precision : "f32");
	snprintf(c->model, sizeof c->model, "%s", dir);
	snprintf(c->backend, sizeof c->backend, "%s", backend ? backend : "cpu");
	c->threads = 2;
	c->temperature = 0;
	c->mode = ATLAS_MODE_RAW;
}

/* Waiting for turns: the notify callback broadcasts a condition variable. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static uint64_t wakeups;

void et_on_notify(void *ctx, struct atlas_session *s)
{
	pthread_mutex_lock(&mu);
	wakeups++;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
}

int et_wait_turn(struct atlas_session *s, uint64_t turn, char *text, size_t cap, size_t until)
{
	size_t off = 0;
	for (;;) {
		pthread_mutex_lock(&mu);
		uint64_t seen = wakeups;
		pthread_mutex_unlock(&mu);
		struct atlas_read r;
		char buf[256];
		atlas_session_read(s, turn, off, buf, sizeof buf, &r);
		if (text && off + r.n < cap)
			memcpy(text + off, buf, r.n);
		off += r.n;
		if (!r.more || (until && off >= until)) {
			if (text)
				text[ATLAS_MIN(off, cap - 1)] = 0;
			return r.more ? 0 : r.error;
		}
		if (r.n)
			continue;
		pthread_mutex_lock(&mu);
		while (wakeups == seen)
			pthread_cond_wait(&cv, &mu);
		pthread_mutex_unlock(&mu);
	}
}

void et_turn_ids(struct atlas_session *s, uint64_t turn, int32_t *out, size_t n)
{
	int32_t *prompt, *gen;
	size_t np, ng;
	assert_int_equal(atlas_session_turn_tokens(s, turn, &prompt, &np, &gen, &ng), 0);
	assert_int_equal(ng, n);
	memcpy(out, gen, sizeof(int32_t) * n);
	free(prompt);
	free(gen);
}

void et_set(struct atlas_session *s, const char *key, const char *value)
{
	struct atlas_params p;
	char err[ATLAS_ERRLEN];
	atlas_session_get_params(s, &p);
	assert_int_equal(atlas_params_parse(&p, key, value, NULL, err, sizeof err), 0);
	assert_int_equal(atlas_session_set_params(s, &p, err, sizeof err), 0);
}

void et_prompt_ids(int32_t *ids, int n, uint32_t seed, int vocab)
{
	for (int i = 0; i < n; i++) {
		seed = seed * 1664525u + 1013904223u;
		ids[i] = (int32_t)((seed >> 8) % (uint32_t)vocab);
	}
}

struct kt_backend *et_cpu(void)
{
	static struct kt_backend *be;
	if (!be) {
		struct kt_config c = { .backend = "cpu", .threads = 1, .max_tokens = 16,
				       .max_seqs = 4, .max_context = 256, .max_heads = 4,
				       .max_head_dim = 8 };
		char err[ATLAS_ERRLEN];
		assert_int_equal(kt_backend_open(&c, &be, err, sizeof err), 0);
	}
	return be;
}
