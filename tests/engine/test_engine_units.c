/* Unit tests of engine parts that need no model: the paged KV allocator,
 * stop-string scanning, position-keyed random numbers, session settings. */
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
#include "engine/kv/kv.h"
#include "engine/sampler/sampler.h"

static struct kt_backend *cpu(void)
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

/* 2 layers x 16 positions x 8 cols x f32 x (K+V) = 2048 bytes per block. */
static void pool(struct kv_pool *p, int blocks)
{
	char err[ATLAS_ERRLEN];
	assert_int_equal(kv_pool_init(p, cpu(), 2, 2, 4, 16, (uint64_t)blocks * 2048, err,
				      sizeof err), 0);
	assert_int_equal(p->bytes_per_block, 2048);
	assert_int_equal(p->n_blocks, blocks);
}

static void test_kv_reserve_and_release(void **state)
{
	struct kv_pool p;
	pool(&p, 8);
	struct kv_seq a = { 0 }, b = { 0 };
	assert_int_equal(kv_seq_reserve(&p, &a, 1), 0);
	assert_int_equal(a.n_blocks, 1);
	assert_int_equal(kv_seq_reserve(&p, &a, 16), 0);
	assert_int_equal(a.n_blocks, 1);
	assert_int_equal(kv_seq_reserve(&p, &a, 17), 0);
	assert_int_equal(a.n_blocks, 2);
	assert_int_equal(kv_seq_reserve(&p, &b, 6 * 16), 0);
	assert_int_equal(p.n_free, 0);
	/* All or nothing: a failing reservation changes neither table nor pool. */
	assert_int_equal(kv_seq_reserve(&p, &a, 3 * 16), -ENOSPC);
	assert_int_equal(a.n_blocks, 2);
	assert_int_equal(p.n_free, 0);

	/* Every block is held by exactly one sequence, none twice. */
	int seen[8] = { 0 };
	int32_t ids[8];
	int n = kv_seq_resolve(&p, &a, ids, 8);
	assert_int_equal(n, 2);
	for (int i = 0; i < n; i++)
		seen[ids[i]]++;
	n = kv_seq_resolve(&p, &b, ids, 8);
	assert_int_equal(n, 6);
	for (int i = 0; i < n; i++)
		seen[ids[i]]++;
	for (int i = 0; i < 8; i++)
		assert_int_equal(seen[i], 1);
	assert_int_equal(kv_seq_resolve(&p, &b, ids, 5), -E2BIG);

	kv_seq_release(&p, &b);
	assert_int_equal(p.n_free, 6);
	assert_int_equal(kv_seq_reserve(&p, &a, 8 * 16), 0);
	assert_int_equal(p.n_free, 0);
	kv_seq_free(&p, &a);
	kv_seq_free(&p, &b);
	assert_int_equal(p.n_free, 8);
	kv_pool_free(&p);
}

static void test_kv_share_prefix_refcounts(void **state)
{
	struct kv_pool p;
	pool(&p, 8);
	struct kv_seq a = { 0 }, b = { 0 };
	assert_int_equal(kv_seq_reserve(&p, &a, 40), 0); /* 3 blocks, the last partial */
	a.n_tokens = 40;
	/* Only whole blocks are shared: the partial third block is not. */
	assert_int_equal(kv_seq_share_prefix(&p, &b, &a, 40), 32);
	assert_int_equal(b.n_blocks, 2);
	assert_int_equal(p.n_free, 5);
	int32_t ia[8], ib[8];
	kv_seq_resolve(&p, &a, ia, 8);
	kv_seq_resolve(&p, &b, ib, 8);
	assert_int_equal(ia[0], ib[0]);
	assert_int_equal(ia[1], ib[1]);
	/* b grows into a block of its own. */
	assert_int_equal(kv_seq_reserve(&p, &b, 33), 0);
	kv_seq_resolve(&p, &b, ib, 8);
	assert_int_not_equal(ib[2], ia[2]);
	assert_int_equal(p.n_free, 4);
	/* Releasing a keeps the shared blocks alive for b. */
	kv_seq_release(&p, &a);
	assert_int_equal(p.n_free, 5);
	kv_seq_release(&p, &b);
	assert_int_equal(p.n_free, 8);
	kv_seq_free(&p, &a);
	kv_seq_free(&p, &b);
	kv_pool_free(&p);
}

static void test_kv_budget_too_small(void **state)
{
	struct kv_pool p;
	char err[ATLAS_ERRLEN] = "";
	assert_int_equal(kv_pool_init(&p, cpu(), 2, 2, 4, 16, 1000, err, sizeof err), -ENOMEM);
	assert_non_null(strstr(err, "kv_memory"));
}

static void test_kv_counts_tiers(void **state)
{
	struct kv_pool p;
	pool(&p, 4);
	struct kv_seq a = { 0 };
	assert_int_equal(kv_seq_reserve(&p, &a, 33), 0);
	uint32_t c[ATLAS_TIERS];
	kv_seq_count(&a, c);
	assert_int_equal(c[ATLAS_TIER_HBM], 3);
	assert_int_equal(c[ATLAS_TIER_HOST], 0);
	assert_int_equal(c[ATLAS_TIER_DISK], 0);
	/* A block in another tier cannot be resolved to a device id (yet). */
	a.blocks[1].tier = ATLAS_TIER_HOST;
	int32_t ids[4];
	assert_int_equal(kv_seq_resolve(&p, &a, ids, 4), -EFAULT);
	a.blocks[1].tier = ATLAS_TIER_HBM;
	kv_seq_free(&p, &a);
	kv_pool_free(&p);
}

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
	assert_true(sampler_uniform(7, 100) == sampler_uniform(7, 100));
	assert_true(sampler_uniform(7, 100) != sampler_uniform(7, 101));
	assert_true(sampler_uniform(7, 100) != sampler_uniform(8, 100));
	int buckets[10] = { 0 };
	double sum = 0;
	for (int i = 0; i < 100000; i++) {
		float u = sampler_uniform(42, (uint64_t)i);
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
		cmocka_unit_test(test_kv_reserve_and_release),
		cmocka_unit_test(test_kv_share_prefix_refcounts),
		cmocka_unit_test(test_kv_budget_too_small),
		cmocka_unit_test(test_kv_counts_tiers),
		cmocka_unit_test(test_stop_scan),
		cmocka_unit_test(test_uniform_is_keyed_and_spread),
		cmocka_unit_test(test_params_parse_format_round_trip),
		cmocka_unit_test(test_params_errors_name_the_key),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
