/* Shared by the fs test programs: the program's mount D (atlasd with the
 * scripted model, engine/model/script/script.h, on the cpu backend),
 * helpers that assert, and a main that mounts, runs the tests, and checks
 * a clean SIGTERM unmount. */
#ifndef ATLAS_TESTS_FS_CLIENT_H
#define ATLAS_TESTS_FS_CLIENT_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

static struct daemon D;

static inline void submit(const char *session, const char *prompt)
{
	assert_int_equal(put_file(mpath(&D, "%s/in", session), prompt), 0);
}

/* The whole output of the newest turn of session; rc: how the last read ended. */
static inline char *answer(const char *session, int *rc)
{
	char *text;
	size_t len;
	int r = get_file(mpath(&D, "%s/out", session), &text, &len);
	if (rc)
		*rc = r;
	else
		assert_int_equal(r, 0);
	return text;
}

static inline void ctl(const char *session, const char *text)
{
	assert_int_equal(put_file(mpath(&D, "%s/ctl", session), text), 0);
}

/* The value of `key` in a flat key-value file, or NULL. */
static inline char *value_of(const char *path, const char *key)
{
	char *text;
	size_t len;
	if (get_file(path, &text, &len) != 0)
		return NULL;
	char *v = NULL;
	size_t k = strlen(key);
	for (char *line = strtok(text, "\n"); line && !v; line = strtok(NULL, "\n"))
		if (!strncmp(line, key, k) && (line[k] == ' ' || line[k] == 0))
			v = strdup(line[k] ? line + k + 1 : "");
	free(text);
	return v;
}

static inline void assert_value(const char *path, const char *key, const char *want)
{
	char *v = value_of(path, key);
	assert_non_null(v);
	assert_string_equal(v, want);
	free(v);
}

/* Mount D (with the -o options of `more` too, when not NULL), run the
 * tests, stop atlasd with SIGTERM: it must exit 0 and leave nothing
 * mounted. */
static inline int run_mounted_with(int argc, char **argv, const char *name,
				   const struct CMUnitTest *tests, size_t n, const char *more)
{
	int rc = harness_args(argc, argv);
	if (rc)
		return rc;
	/* A model path that label values of ctl/metrics must escape. */
	if (daemon_prepare(&D, "script \"model\" \\ dir") != 0)
		return 1;
	char model[1000];
	model_option(&D, model, sizeof model);
	/* One cpu worker and a small KV pool: the tests share the machine. */
	const char *args[] = {
		"-o", model, "-o", "backend=cpu,threads=1,kv_memory=1M",
		"-o", "sessions=2,max_sessions=5,max_batch=3,temperature=0.5,attr_timeout=0.1",
		"-o", "prompt_memory=40M",
		more ? "-o" : NULL, more,
		NULL,
	};
	rc = daemon_start(&D, args);
	if (rc) {
		daemon_cleanup(&D);
		return rc == SKIP ? SKIP : 1;
	}
	rc = _cmocka_run_group_tests(name, tests, n, NULL, NULL);
	int status = daemon_stop(&D);
	if (status != 0) {
		char *log = daemon_log(&D);
		fprintf(stderr, "atlasd ended with %d after SIGTERM:\n%s\n", status, log ? log : "");
		free(log);
		rc = rc ? rc : 1;
	}
	if (is_mounted(D.mnt)) {
		fprintf(stderr, "still mounted after SIGTERM\n");
		rc = rc ? rc : 1;
	}
	daemon_cleanup(&D);
	return rc;
}

static inline int run_mounted(int argc, char **argv, const char *name,
			      const struct CMUnitTest *tests, size_t n)
{
	return run_mounted_with(argc, argv, name, tests, n, NULL);
}

#endif
