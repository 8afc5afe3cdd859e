/* Unit tests of engine parts that need no model: stop-string scanning,
 * position-keyed random numbers, session settings. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "engine/engine.h"
#include "engine/sched/rng.h"
#include "engine/text/stop.h"

static void test_stop_scan(void **state)
{
	char stops[3][ATLAS_STOP_LEN] = { "END", "\n\n", "abcd" };
	size_t ok;
	assert_int_equal(stop_scan("hello", 5, stops, 3, &ok), -1);
	assert_int_equal(ok, 5);
	/* A suffix that may become a stop string is held back. */
	assert_int_equal(stop_scan("hello E", 7, stops, 3, &ok), -1);
	assert_int_equal(ok, 6);
	assert_int_equal(stop_scan("hello EN", 8, stops, 3, &ok), -1);
	assert_int_equal(ok, 6);
	assert_int_equal(stop_scan("hello ENX", 9, stops, 3, &ok), -1);
	assert_int_equal(ok, 9);
	assert_int_equal(stop_scan("hi\n", 3, stops, 3, &ok), -1);
	assert_int_equal(ok, 2);
	/* The earliest complete match wins; text from it on is not released. */
	assert_int_equal(stop_scan("one\n\ntwo END", 12, stops, 3, &ok), 3);
	assert_int_equal(ok, 3);
	assert_int_equal(stop_scan("xxabc", 5, stops, 3, &ok), -1);
	assert_int_equal(ok, 2);
	assert_int_equal(stop_scan("anything", 8, stops, 0, &ok), -1);
	assert_int_equal(ok, 8);
}

static void test_uniform_is_keyed_and_spread(void **state)
{
	assert_true(rng_uniform(7, 100) == rng_uniform(7, 100));
	assert_true(rng_uniform(7, 100) != rng_uniform(7, 101));
	assert_true(rng_uniform(7, 100) != rng_uniform(8, 100));
	int buckets[10] = { 0 };
	double sum = 0;
	for (int i = 0; i < 100000; i++) {
		float u = rng_uniform(42, (uint64_t)i);
		assert_true(u >= 0.0f && u < 1.0f);
		buckets[(int)(u * 10)]++;
		sum += u;
	}
	for (int i = 0; i < 10; i++)
		assert_in_range(buckets[i], 9500, 10500);
	assert_true(sum / 100000 > 0.49 && sum / 100000 < 0.51);
}

static void test_params_parse_format_round_trip(void **state)
{
	struct atlas_params p = { .temperature = 0.7f, .top_p = 0.9f, .top_k = 40,
				  .max_tokens = 64, .seed = 1, .mode = ATLAS_MODE_RAW };
	char err[ATLAS_ERRLEN];
	bool stop_seen = false;
	assert_int_equal(atlas_params_parse(&p, "temperature", "0.25", &stop_seen, err, sizeof err), 0);
	assert_int_equal(atlas_params_parse(&p, "stop", "\\n\\n", &stop_seen, err, sizeof err), 0);
	assert_int_equal(atlas_params_parse(&p, "stop", "END", &stop_seen, err, sizeof err), 0);
	assert_int_equal(atlas_params_parse(&p, "system", "Be brief.\\tOK\\\\", &stop_seen, err,
					    sizeof err), 0);
	assert_int_equal(atlas_params_parse(&p, "seed", "18446744073709551615", &stop_seen, err,
					    sizeof err), 0);
	assert_int_equal(p.n_stop, 2);
	assert_string_equal(p.stop[0], "\n\n");
	assert_string_equal(p.system, "Be brief.\tOK\\");
	assert_true(p.seed == UINT64_MAX);

	char text[4096];
	atlas_params_format(&p, text, sizeof text);
	assert_non_null(strstr(text, "stop \\n\\n\nstop END\n"));

	/* Reading the rendered text back gives the same settings. */
	struct atlas_params q = { 0 };
	stop_seen = false;
	char *save, *line = strtok_r(text, "\n", &save);
	for (; line; line = strtok_r(NULL, "\n", &save)) {
		char *sp = strchr(line, ' ');
		const char *value = sp ? sp + 1 : "";
		if (sp)
			*sp = 0;
		assert_int_equal(atlas_params_parse(&q, line, value, &stop_seen, err, sizeof err), 0);
	}
	assert_true(q.temperature == p.temperature && q.top_p == p.top_p);
	assert_int_equal(q.top_k, p.top_k);
	assert_int_equal(q.max_tokens, p.max_tokens);
	assert_true(q.seed == p.seed);
	assert_int_equal(q.mode, p.mode);
	assert_int_equal(q.n_stop, 2);
	assert_string_equal(q.stop[1], "END");
	assert_string_equal(q.system, p.system);

	/* A new batch of lines replaces the stop list; an empty value clears it. */
	stop_seen = false;
	assert_int_equal(atlas_params_parse(&q, "stop", "", &stop_seen, err, sizeof err), 0);
	assert_int_equal(q.n_stop, 0);
}

static void test_params_errors_name_the_key(void **state)
{
	struct atlas_params p = { 0 };
	char err[ATLAS_ERRLEN];
	struct { const char *key, *value; } bad[] = {
		{ "temperature", "warm" }, { "top_k", "-1" }, { "max_tokens", "0" },
		{ "seed", "-5" }, { "mode", "poetry" }, { "system", "bad \\q escape" },
		{ "max_tokens", "12abc" },
	};
	for (size_t i = 0; i < ATLAS_ARRAY_LEN(bad); i++) {
		err[0] = 0;
		assert_int_equal(atlas_params_parse(&p, bad[i].key, bad[i].value, NULL, err,
						    sizeof err), -EINVAL);
		assert_non_null(strstr(err, bad[i].key));
	}
	assert_int_equal(atlas_params_parse(&p, "colour", "blue", NULL, err, sizeof err), -EINVAL);
	assert_non_null(strstr(err, "colour"));
	char longstop[200];
	memset(longstop, 'x', sizeof longstop - 1);
	longstop[sizeof longstop - 1] = 0;
	assert_int_equal(atlas_params_parse(&p, "stop", longstop, NULL, err, sizeof err), -EINVAL);
	bool seen = false;
	for (int i = 0; i < ATLAS_STOP_MAX; i++)
		assert_int_equal(atlas_params_parse(&p, "stop", "x", &seen, err, sizeof err), 0);
	assert_int_equal(atlas_params_parse(&p, "stop", "y", &seen, err, sizeof err), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_stop_scan),
		cmocka_unit_test(test_uniform_is_keyed_and_spread),
		cmocka_unit_test(test_params_parse_format_round_trip),
		cmocka_unit_test(test_params_errors_name_the_key),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
