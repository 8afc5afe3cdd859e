/* Unit tests of config/: defaults, INI loading and its errors, flags, the
 * text form and its round trip, and the shipped config/atlas.conf. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/err.h"
#include "config/config.h"

/* Write text to a fresh temporary file; returns its path (static buffer). */
static const char *temp_file(const char *text)
{
	static char path[64];
	snprintf(path, sizeof path, "/tmp/atlas-config-test-XXXXXX");
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	size_t len = strlen(text);
	assert_int_equal(write(fd, text, len), (ssize_t)len);
	close(fd);
	return path;
}

static int load_text(struct atlas_config *c, const char *text, char *err, size_t errlen)
{
	const char *path = temp_file(text);
	int rc = atlas_config_load(c, path, err, errlen);
	unlink(path);
	return rc;
}

static char *format(const struct atlas_config *c, bool documented)
{
	size_t n = atlas_config_format(c, documented, NULL, 0);
	char *buf = malloc(n + 1);
	assert_non_null(buf);
	assert_int_equal(atlas_config_format(c, documented, buf, n + 1), n);
	assert_int_equal(strlen(buf), n);
	return buf;
}

static void test_defaults(void **state)
{
	struct atlas_config c;
	char err[ATLAS_ERRLEN];
	atlas_config_defaults(&c);
	assert_string_equal(c.model, "");
	assert_string_equal(c.backend, "auto");
	assert_int_equal(c.device, 0);
	assert_int_equal(c.threads, 0);
	assert_int_equal(c.max_batch, 8);
	assert_int_equal(c.chunk_size, 0);
	assert_int_equal(c.context, 0);
	assert_int_equal(c.kv_block_size, 16);
	assert_true(c.kv_memory == 0);
	assert_int_equal(c.sessions, 4);
	assert_int_equal(c.max_sessions, 64);
	assert_int_equal(c.mode, ATLAS_MODE_AUTO);
	assert_true(c.temperature == 0.7f);
	assert_true(c.top_p == 0.9f);
	assert_int_equal(c.top_k, 40);
	assert_int_equal(c.max_tokens, 512);
	assert_true(c.seed == 0);
	assert_string_equal(c.system, "");
	assert_string_equal(c.mountpoint, "");
	assert_false(c.allow_other);
	assert_false(c.default_permissions);
	assert_true(c.attr_timeout == 1.0);
	assert_string_equal(c.log_level, "info");
	assert_int_equal(atlas_config_validate(&c, err, sizeof err), 0);

	/* An empty model key means the directory chosen at build time. */
	assert_true(atlas_config_model_dir(&c)[0] == '/');
	strcpy(c.model, "/m/qwen3");
	assert_string_equal(atlas_config_model_dir(&c), "/m/qwen3");
}

static void test_load_good(void **state)
{
	struct atlas_config c;
	char err[ATLAS_ERRLEN] = "";
	atlas_config_defaults(&c);
	int rc = load_text(&c,
		"# a comment\n"
		"; another\n"
		"[model]\n"
		"model = /models/qwen3-0.6b\n"
		"\n"
		"[engine]\n"
		"backend = cpu\n"
		"threads=2   ; inline comment\n"
		"kv_memory = 256M\n"
		"max_batch : 16\n"
		"[sessions]\n"
		"mode = raw\n"
		"temperature = 0\n"
		"seed = 18446744073709551615\n"
		"system = Be brief.\\nAnswer in English\\; \n"
		"\t and only then stop.\n"
		"[fs]\n"
		"allow_other = yes\n"
		"attr_timeout = 0.25\n"
		"[log]\n"
		"log_level = debug\n",
		err, sizeof err);
	assert_int_equal(rc, 0);
	assert_string_equal(c.model, "/models/qwen3-0.6b");
	assert_string_equal(c.backend, "cpu");
	assert_int_equal(c.threads, 2);
	assert_true(c.kv_memory == 256ull << 20);
	assert_int_equal(c.max_batch, 16);
	assert_int_equal(c.mode, ATLAS_MODE_RAW);
	assert_true(c.temperature == 0.0f);
	assert_true(c.seed == UINT64_MAX);
	assert_string_equal(c.system, "Be brief.\nAnswer in English;and only then stop.");
	assert_true(c.allow_other);
	assert_true(c.attr_timeout == 0.25);
	assert_string_equal(c.log_level, "debug");
	/* untouched keys keep their defaults */
	assert_int_equal(c.chunk_size, 0);
	assert_int_equal(c.top_k, 40);
}

struct bad_case {
	const char *text;
	const char *where;    /* ":LINE: " expected after the path */
	const char *words;    /* expected in the message */
};

static void test_load_errors(void **state)
{
	static const struct bad_case cases[] = {
		{ "[engine]\nmax_batch = 999\n", ":2: ", "key 'max_batch': 999 is out of range 1..256" },
		{ "[engine]\nmax_batch = 0\n", ":2: ", "key 'max_batch'" },
		{ "[engine]\n\nmax_batch = lots\n", ":3: ", "key 'max_batch': 'lots' is not an integer" },
		{ "[engine]\nthreads = 2x\n", ":2: ", "key 'threads'" },
		{ "[engine]\nkv_memory = 1T\n", ":2: ", "key 'kv_memory'" },
		{ "[engine]\nbackend = gpu\n", ":2: ", "key 'backend': 'gpu' is not one of auto, cpu, cuda" },
		{ "[sessions]\ntop_p = 1.5\n", ":2: ", "key 'top_p'" },
		{ "[sessions]\ntop_p = 0\n", ":2: ", "key 'top_p'" },
		{ "[sessions]\ntemperature = inf\n", ":2: ", "key 'temperature'" },
		{ "[sessions]\nmode = chatty\n", ":2: ", "key 'mode'" },
		{ "[fs]\nallow_other = maybe\n", ":2: ", "key 'allow_other'" },
		{ "[log]\nlog_level = loud\n", ":2: ", "key 'log_level'" },
		{ "[sessions]\nsystem = a\\qb\n", ":2: ", "key 'system': bad escape" },
		{ "[engine]\nmax_batchx = 3\n", ":2: ", "unknown key 'max_batchx'" },
		{ "[engine]\nthreads = 1\n[engin]\nthreads = 1\n", ":3: ", "unknown section [engin]" },
		{ "[sessions]\nmax_batch = 3\n", ":2: ", "key 'max_batch' belongs in section [engine]" },
		{ "max_batch = 3\n", ":1: ", "key 'max_batch' comes before any [section]" },
		{ "[engine]\nthreads = 1\nthreads = 2\n", ":3: ", "key 'threads' is already set on line 2" },
		{ "[engine]\nthreads = 1\n  chunk_size = 2\n", ":3: ", "key 'threads': an indented line" },
		{ "[engine]\nthreads\n", ":2: ", "expected [section]" },
		{ "[engine\nthreads = 1\n", ":1: ", "expected [section]" },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		struct atlas_config c;
		char err[ATLAS_ERRLEN] = "";
		atlas_config_defaults(&c);
		const char *path = temp_file(cases[i].text);
		int rc = atlas_config_load(&c, path, err, sizeof err);
		unlink(path);
		if (rc >= 0 || strncmp(err, path, strlen(path)) ||
		    strncmp(err + strlen(path), cases[i].where, strlen(cases[i].where)) ||
		    !strstr(err, cases[i].words))
			fail_msg("case %zu: rc %d, message '%s'", i, rc, err);
	}
}

static void test_load_long_line(void **state)
{
	struct atlas_config c;
	char err[ATLAS_ERRLEN] = "";
	char text[600] = "# a long comment is fine: ";
	memset(text + strlen(text), 'c', 300);
	strcat(text, "\n[sessions]\nsystem = ");
	memset(text + strlen(text), 'x', 250);
	strcat(text, "\n");
	atlas_config_defaults(&c);
	assert_true(load_text(&c, text, err, sizeof err) < 0);
	assert_non_null(strstr(err, ":3: line is longer than"));
}

static void test_missing_file(void **state)
{
	struct atlas_config c;
	char err[ATLAS_ERRLEN] = "";
	atlas_config_defaults(&c);
	assert_int_equal(atlas_config_load(&c, "/nonexistent/atlas.conf", err, sizeof err), -ENOENT);
	assert_non_null(strstr(err, "/nonexistent/atlas.conf"));
}

static void test_flags(void **state)
{
	struct atlas_config c;
	char err[ATLAS_ERRLEN] = "";
	atlas_config_defaults(&c);
	assert_int_equal(load_text(&c, "[engine]\nmax_batch = 4\n", err, sizeof err), 0);
	assert_int_equal(atlas_config_set(&c, "max_batch", "16", err, sizeof err), 0);
	assert_int_equal(c.max_batch, 16);
	assert_int_equal(atlas_config_set(&c, "system", "one\\ntwo", err, sizeof err), 0);
	assert_string_equal(c.system, "one\ntwo");

	/* a refused value changes nothing */
	assert_int_equal(atlas_config_set(&c, "max_batch", "300", err, sizeof err), -ERANGE);
	assert_non_null(strstr(err, "key 'max_batch'"));
	assert_int_equal(c.max_batch, 16);
	assert_int_equal(atlas_config_set(&c, "system", "bad\\", err, sizeof err), -EINVAL);
	assert_string_equal(c.system, "one\ntwo");
	assert_int_equal(atlas_config_set(&c, "backend", "tpu", err, sizeof err), -EINVAL);
	assert_string_equal(c.backend, "auto");

	assert_int_equal(atlas_config_set(&c, "nosuchkey", "1", err, sizeof err), -ENOENT);
	assert_non_null(strstr(err, "'nosuchkey'"));
}

static void test_validate(void **state)
{
	struct atlas_config c;
	char err[ATLAS_ERRLEN] = "";
	atlas_config_defaults(&c);
	c.sessions = 10;
	c.max_sessions = 5;
	assert_true(atlas_config_validate(&c, err, sizeof err) < 0);
	assert_non_null(strstr(err, "key 'sessions'"));

	atlas_config_defaults(&c);
	c.kv_block_size = 24;
	assert_true(atlas_config_validate(&c, err, sizeof err) < 0);
	assert_non_null(strstr(err, "key 'kv_block_size'"));
	c.kv_block_size = 256;
	assert_int_equal(atlas_config_validate(&c, err, sizeof err), 0);

	/* fields set by code get the table's ranges too */
	c.max_batch = 257;
	assert_true(atlas_config_validate(&c, err, sizeof err) < 0);
	assert_non_null(strstr(err, "key 'max_batch'"));
	atlas_config_defaults(&c);
	strcpy(c.backend, "gpu");
	assert_true(atlas_config_validate(&c, err, sizeof err) < 0);
	assert_non_null(strstr(err, "key 'backend'"));
	atlas_config_defaults(&c);
	c.mode = (enum atlas_mode)7;
	assert_true(atlas_config_validate(&c, err, sizeof err) < 0);
	atlas_config_defaults(&c);
	c.top_p = 0;
	assert_true(atlas_config_validate(&c, err, sizeof err) < 0);
	assert_non_null(strstr(err, "key 'top_p'"));

	/* Owners are users by name or uid. */
	atlas_config_defaults(&c);
	strcpy(c.ctl_owner, "no-such-user-atlas");
	assert_int_equal(atlas_config_validate(&c, err, sizeof err), -ENOENT);
	assert_non_null(strstr(err, "key 'ctl_owner'"));
	assert_non_null(strstr(err, "no-such-user-atlas"));
	atlas_config_defaults(&c);
	strcpy(c.session_owner, "12x");
	assert_true(atlas_config_validate(&c, err, sizeof err) < 0);
	assert_non_null(strstr(err, "key 'session_owner'"));
	strcpy(c.session_owner, "4294967295");
	assert_true(atlas_config_validate(&c, err, sizeof err) < 0);
	strcpy(c.session_owner, "root");
	strcpy(c.ctl_owner, "123456");
	assert_int_equal(atlas_config_validate(&c, err, sizeof err), 0);
	uid_t uid;
	gid_t gid;
	assert_int_equal(atlas_config_user("root", &uid, &gid, err, sizeof err), 0);
	assert_int_equal(uid, 0);
	assert_int_equal(gid, 0);
	assert_int_equal(atlas_config_user("123456", &uid, NULL, err, sizeof err), 0);
	assert_int_equal(uid, 123456);
	assert_int_equal(atlas_config_user("", &uid, &gid, err, sizeof err), 0);
	assert_int_equal(uid, getuid());
	assert_int_equal(gid, getgid());
}

/* A config unlike the defaults in every key, with text that needs escapes. */
static void odd_config(struct atlas_config *c)
{
	static const char *const settings[][2] = {
		{ "model", "/models/with space/and;semicolon #x" },
		{ "backend", "cuda" }, { "device", "3" }, { "threads", "7" }, { "max_batch", "256" },
		{ "chunk_size", "33" }, { "context", "40960" }, { "kv_block_size", "32" },
		{ "kv_memory", "1234567" }, { "sessions", "0" }, { "max_sessions", "4096" },
		{ "mode", "raw" }, { "temperature", "0.1" }, { "top_p", "0.333333343" },
		{ "top_k", "0" }, { "max_tokens", "1" }, { "seed", "18446744073709551615" },
		{ "mountpoint", " /mnt/atlas " }, { "allow_other", "on" },
		{ "default_permissions", "1" }, { "attr_timeout", "0.1" }, { "log_level", "error" },
		{ "session_owner", "0" }, { "ctl_owner", "root" },
	};
	char err[ATLAS_ERRLEN];
	atlas_config_defaults(c);
	for (size_t i = 0; i < sizeof settings / sizeof settings[0]; i++)
		if (atlas_config_set(c, settings[i][0], settings[i][1], err, sizeof err))
			fail_msg("%s", err);
	/* A system prompt longer than inih's lines, with every character
	 * class that the text form must escape, and multi-byte UTF-8. */
	char *p = c->system;
	p += sprintf(p, " lead; #hash\\ tab\t cr\r nl\n ctrl\x01 del\x7f a ; b ");
	for (int i = 0; i < 120; i++)
		p += sprintf(p, "w%d \xc3\xa9\xe2\x82\xac ", i);
	for (int i = 0; i < 100; i++)
		p += sprintf(p, "\xe2\x82\xac\xf0\x9f\x98\x80");
	sprintf(p, "#;trailing  ");
}

static void test_round_trip(void **state)
{
	for (int documented = 0; documented < 2; documented++) {
		struct atlas_config a, b;
		char err[ATLAS_ERRLEN] = "";
		odd_config(&a);
		assert_int_equal(atlas_config_validate(&a, err, sizeof err), 0);
		char *text = format(&a, documented);
		atlas_config_defaults(&b);
		int rc = load_text(&b, text, err, sizeof err);
		if (rc)
			fail_msg("%s", err);
		assert_string_equal(a.system, b.system);
		assert_memory_equal(&a, &b, sizeof a);
		/* continuation lines never begin inside a UTF-8 character */
		for (const char *line = strstr(text, "\n\t"); line; line = strstr(line + 1, "\n\t"))
			assert_false((line[2] & 0xc0) == 0x80);
		free(text);

		atlas_config_defaults(&a);
		text = format(&a, documented);
		memset(&b, 0x5a, sizeof b);
		atlas_config_defaults(&b);
		b.max_batch = 1;
		assert_int_equal(load_text(&b, text, err, sizeof err), 0);
		assert_memory_equal(&a, &b, sizeof a);
		free(text);
	}
}

static void test_format_truncates(void **state)
{
	struct atlas_config c;
	atlas_config_defaults(&c);
	char *full = format(&c, false);
	char small[40];
	size_t n = atlas_config_format(&c, false, small, sizeof small);
	assert_int_equal(n, strlen(full));
	assert_int_equal(strlen(small), sizeof small - 1);
	assert_memory_equal(small, full, sizeof small - 1);
	assert_non_null(strstr(full, "[engine]\nbackend = auto\n"));
	assert_non_null(strstr(full, "kv_memory = 0\n"));
	assert_null(strstr(full, "#"));
	free(full);
}

static void test_shipped_file(void **state)
{
	const char *root = getenv("ATLAS_SOURCE_ROOT");
	if (!root)
		skip();
	char path[4096];
	snprintf(path, sizeof path, "%s/config/atlas.conf", root);
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	static char shipped[1 << 16];
	size_t n = fread(shipped, 1, sizeof shipped - 1, f);
	fclose(f);
	shipped[n] = '\0';

	struct atlas_config c;
	atlas_config_defaults(&c);
	char *text = format(&c, true);
	if (strcmp(shipped, text))
		fail_msg("config/atlas.conf differs from the key table: regenerate it with "
			 "`atlas config --defaults > config/atlas.conf`");
	free(text);
	/* it carries no path of the machine that built it */
	assert_null(strstr(shipped, "/work/"));
	assert_null(strstr(shipped, "/home/"));
}

static void test_parse_size(void **state)
{
	static const struct { const char *text; uint64_t value; } good[] = {
		{ "0", 0 }, { "512", 512 }, { "64K", 64 << 10 }, { "64k", 64 << 10 },
		{ "2M", 2 << 20 }, { "1G", 1ull << 30 }, { "1g", 1ull << 30 },
		{ "17179869183G", 17179869183ull << 30 },
		{ "18446744073709551615", UINT64_MAX },
	};
	static const struct { const char *text; int rc; } bad[] = {
		{ "", -EINVAL }, { "K", -EINVAL }, { "1.5G", -EINVAL }, { "1KB", -EINVAL },
		{ "1T", -EINVAL }, { "-1", -EINVAL }, { " 1", -EINVAL }, { "1 G", -EINVAL },
		{ "+1", -EINVAL }, { "0x10", -EINVAL }, { "17179869184G", -ERANGE },
		{ "18014398509481984M", -ERANGE }, { "18446744073709551616", -ERANGE },
	};
	for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
		uint64_t v = 1;
		assert_int_equal(atlas_parse_size(good[i].text, &v), 0);
		assert_true(v == good[i].value);
	}
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		uint64_t v = 7;
		if (atlas_parse_size(bad[i].text, &v) != bad[i].rc)
			fail_msg("'%s' should fail with %d", bad[i].text, bad[i].rc);
		assert_true(v == 7);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_defaults),
		cmocka_unit_test(test_load_good),
		cmocka_unit_test(test_load_errors),
		cmocka_unit_test(test_load_long_line),
		cmocka_unit_test(test_missing_file),
		cmocka_unit_test(test_flags),
		cmocka_unit_test(test_validate),
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_format_truncates),
		cmocka_unit_test(test_shipped_file),
		cmocka_unit_test(test_parse_size),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
