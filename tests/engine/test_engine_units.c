/* Unit tests of engine parts that need no model: stop-string scanning,
 * position-keyed random numbers, session settings, prompt lookup, the
 * speculation gate and the chunk size by backend. */
#include <errno.h>
#include <math.h>
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
#include "engine/spec/gate.h"
#include "engine/spec/ngram.h"
#include "engine/text/stop.h"
#include "kernels/backend.h"

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
				  .max_tokens = 64, .seed = 1, .mode = ATLAS_MODE_RAW,
				  .spec = ATLAS_SPEC_AUTO, .spec_k = 4 };
	char err[ATLAS_ERRLEN];
	bool stop_seen = false;
	assert_int_equal(atlas_params_parse(&p, "spec", "ngram", &stop_seen, err, sizeof err), 0);
	assert_int_equal(atlas_params_parse(&p, "spec_k", "7", &stop_seen, err, sizeof err), 0);
	assert_int_equal(atlas_params_parse(&p, "spec_k", "9", &stop_seen, err, sizeof err),
			 -EINVAL);
	assert_int_equal(atlas_params_parse(&p, "spec", "fast", &stop_seen, err, sizeof err),
			 -EINVAL);
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

/* Prompt lookup: the longest suffix that occurred before wins, at its
 * newest occurrence; a short period drafts past the context's end; nothing
 * matches, nothing is drafted; a replaced context is indexed anew. */
static void test_ngram(void **state)
{
	struct ngram_index x;
	int32_t out[8];
	ngram_init(&x, 1, 3);
	/* "1 2 3 9 ... 5 2 3 7 ... 2 3": the 2-gram "2 3" occurs twice, newest
	 * before 7; the 3-gram "x 2 3" of the end does not occur. */
	const int32_t a[] = { 1, 2, 3, 9, 8, 5, 2, 3, 7, 6, 4, 2, 3 };
	assert_int_equal(ngram_propose(&x, a, 13, 3, out), 3);
	assert_int_equal(out[0], 7);
	assert_int_equal(out[1], 6);
	assert_int_equal(out[2], 4);
	/* The longest match beats a newer shorter one: "5 2 3" ends at 8. */
	const int32_t b[] = { 1, 2, 3, 9, 8, 5, 2, 3, 7, 6, 4, 2, 3, 1, 5, 2, 3 };
	ngram_reset(&x);
	assert_int_equal(ngram_propose(&x, b, 17, 2, out), 2);
	assert_int_equal(out[0], 7);
	assert_int_equal(out[1], 6);
	/* Period 2: "4 5 4 5 4" drafts 5 4 5 4 5 past the end. */
	const int32_t c[] = { 4, 5, 4, 5, 4 };
	ngram_reset(&x);
	assert_int_equal(ngram_propose(&x, c, 5, 5, out), 5);
	for (int j = 0; j < 5; j++)
		assert_int_equal(out[j], j % 2 ? 4 : 5);
	/* No earlier occurrence of the last token. */
	const int32_t d[] = { 1, 2, 3, 4 };
	ngram_reset(&x);
	assert_int_equal(ngram_propose(&x, d, 4, 3, out), 0);
	/* Growing the same context keeps the index; a shorter one starts over. */
	assert_int_equal(ngram_propose(&x, c, 3, 2, out), 2);
	assert_int_equal(out[0], 5);
	ngram_free(&x);

	/* Thousands of positions: the table grows and still finds the newest. */
	enum { N = 20000 };
	static int32_t big[N];
	for (int i = 0; i < N; i++)
		big[i] = (int32_t)((i * 7919u) % 1000u);
	big[N - 2] = big[500];
	big[N - 1] = big[501];
	ngram_init(&x, 2, 4);
	for (int n = 100; n <= N; n += 1000)
		ngram_propose(&x, big, (size_t)n, 1, out);
	assert_int_equal(ngram_propose(&x, big, N, 1, out), 1);
	assert_int_equal(out[0], big[502]);
	ngram_free(&x);
}

/* The gate: on a device where rows are nearly free (a GPU at batch 1)
 * drafts pay at a modest acceptance; where each row costs what a decode
 * step does (a small cpu) they never do; beside 31 other rows they must
 * earn the whole batch's slowdown; where each verify segment costs a
 * launch-bound extra (a GPU at batch 8) they do not pay beside others'
 * segments; a shape never measured is tried. */
static void test_gate_choice(void **state)
{
	struct spec_cost gpu, cpu;
	assert_int_equal(spec_cost_init(&gpu, 64, 8), 0);
	assert_int_equal(spec_cost_init(&cpu, 64, 8), 0);
	assert_int_equal(spec_gate_k(&gpu, 0.5, 0, 0, 4, 0), 4);
	spec_cost_add(&gpu, 1, 0, 1e-3);
	spec_cost_add(&cpu, 1, 0, 1e-3);
	for (int k = 1; k <= 8; k++) {
		spec_cost_add(&gpu, 1 + k, 1, 1e-3 * (1 + 0.03 * k));
		spec_cost_add(&cpu, 1 + k, 1, 1e-3 * (1 + k));
	}
	spec_cost_add(&gpu, 32, 0, 2e-3);
	spec_cost_add(&gpu, 40, 0, 2.1e-3);
	assert_true(spec_gate_k(&gpu, 0.5, 0, 0, 8, 0) >= 2);
	assert_int_equal(spec_gate_k(&gpu, 0.02, 0, 0, 8, 0), 0);
	assert_int_equal(spec_gate_k(&cpu, 0.9, 0, 0, 8, 0), 0);
	assert_int_equal(spec_gate_k(&gpu, 0.5, 31, 0, 8, 0), 0);
	assert_true(spec_gate_k(&gpu, 0.99, 31, 0, 8, 0) > 0);
	/* A draft that costs half a decode step each: fewer drafts pay. */
	assert_true(spec_gate_k(&gpu, 0.5, 0, 0, 8, 0.5e-3) < spec_gate_k(&gpu, 0.5, 0, 0, 8, 0));
	assert_int_equal(spec_gate_k(&gpu, 0.5, 0, 0, 8, 1e-3), 0);
	/* Between measured shapes, the cost is interpolated; more segments
	 * never cost less than fewer. */
	assert_true(fabs(spec_cost_at(&gpu, 36, 0) - 2.05e-3) < 1e-9);
	assert_true(fabs(spec_cost_at(&gpu, 60, 0) - 2.1e-3) < 1e-9);
	assert_true(spec_cost_at(&gpu, 36, 1) >= spec_cost_at(&gpu, 36, 0));
	/* Batch 8: 8 decode rows cost 1 ms. A verify segment's cost is not
	 * known yet: the first one is tried. It cost 2.5 ms: now no verify
	 * pays, and a step of two segments, never measured, costs its rows
	 * plus twice the 1.5 ms a segment was seen to add. */
	struct spec_cost b8;
	assert_int_equal(spec_cost_init(&b8, 64, 8), 0);
	spec_cost_add(&b8, 8, 0, 1e-3);
	assert_true(spec_gate_k(&b8, 0.8, 7, 0, 4, 0) > 0);
	spec_cost_add(&b8, 12, 1, 2.5e-3);
	assert_int_equal(spec_gate_k(&b8, 0.8, 7, 0, 4, 0), 0);
	assert_int_equal(spec_gate_k(&b8, 0.8, 11, 1, 4, 0), 0);
	assert_true(fabs(spec_cost_at(&b8, 16, 2) - 4e-3) < 1e-9);
	/* A step of four segments cost 2.25 ms over its rows: 1.25 ms per step
	 * (the lost graph) and 0.25 ms per segment. */
	spec_cost_add(&b8, 20, 4, 3.25e-3);
	assert_true(fabs(spec_cost_at(&b8, 40, 8) - 4.25e-3) < 1e-9);
	spec_cost_free(&b8);
	spec_cost_free(&gpu);
	spec_cost_free(&cpu);

	/* Acceptance follows the recent outcomes. */
	struct spec_accept a;
	spec_accept_init(&a);
	assert_true(fabs(spec_accept_rate(&a) - 0.5) < 1e-9);
	for (int i = 0; i < 30; i++)
		spec_accept_add(&a, 4, false);
	assert_true(spec_accept_rate(&a) > 0.95);
	for (int i = 0; i < 30; i++)
		spec_accept_add(&a, 0, true);
	assert_true(spec_accept_rate(&a) < 0.05);
}

/* chunk_size 0 is the backend's default, resolved as the backend will be
 * opened; any other value is kept. */
static void test_chunk_size_by_backend(void **state)
{
	(void)state;
	struct atlas_config c;
	atlas_config_defaults(&c);
	assert_int_equal(c.chunk_size, 0);
	snprintf(c.backend, sizeof c.backend, "cpu");
	assert_int_equal(atlas_chunk_size(&c), ATLAS_CHUNK_SIZE_CPU_AUTO);
	snprintf(c.backend, sizeof c.backend, "cuda");
	assert_int_equal(atlas_chunk_size(&c), ATLAS_CHUNK_SIZE_GPU_AUTO);
	snprintf(c.backend, sizeof c.backend, "auto");
	assert_int_equal(atlas_chunk_size(&c), strcmp(kt_backend_resolve("auto"), "cuda")
						       ? ATLAS_CHUNK_SIZE_CPU_AUTO
						       : ATLAS_CHUNK_SIZE_GPU_AUTO);
	assert_string_equal(kt_backend_resolve("cpu"), "cpu");
	assert_string_equal(kt_backend_resolve("cuda"), "cuda");
	c.chunk_size = 100;
	snprintf(c.backend, sizeof c.backend, "cuda");
	assert_int_equal(atlas_chunk_size(&c), 100);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_stop_scan),
		cmocka_unit_test(test_uniform_is_keyed_and_spread),
		cmocka_unit_test(test_params_parse_format_round_trip),
		cmocka_unit_test(test_params_errors_name_the_key),
		cmocka_unit_test(test_ngram),
		cmocka_unit_test(test_gate_choice),
		cmocka_unit_test(test_chunk_size_by_backend),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
