/* atlas' tokenizer against Hugging Face tokenizers, id for id.
 *
 *   test_tokenizer_ref qwen3   Qwen3's tokenizer ($ATLAS_BUILD_ROOT/testdata/
 *                              qwen3-tokenizer) against tests/tokenizer/
 *                              qwen3_ref.json: ids, decodes, chat template
 *   test_tokenizer_ref small   the small tokenizers of tests/tokenizer/small/
 *                              against tests/tokenizer/small_ref.json
 *
 * The references come from tools/ref/tokenizer_ref.py; a missing input makes
 * the test exit 77 (skipped). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tok_testutil.h"

static json_t *ref;
static char *qwen3_dir;

static bool ids_match(json_t *got, json_t *want)
{
	return got && json_equal(got, want);
}

static bool text_match(const struct atlas_tokenizer *t, json_t *ids, bool skip, json_t *want)
{
	size_t n = json_array_size(ids);
	int32_t *v = malloc((n + 1) * sizeof *v);
	for (size_t i = 0; i < n; i++)
		v[i] = (int32_t)json_integer_value(json_array_get(ids, i));
	char *text = NULL;
	size_t len;
	bool ok = tok_decode(t, v, n, skip, &text, &len) == 0 &&
		  len == json_string_length(want) && memcmp(text, json_string_value(want), len) == 0;
	free(text);
	free(v);
	return ok;
}

/* Every case of a reference: the mismatches are printed, their count returned. */
static int compare_cases(const struct atlas_tokenizer *t, const char *name, json_t *cases)
{
	int bad = 0;
	size_t i;
	json_t *c;
	json_array_foreach(cases, i, c) {
		json_t *text = json_object_get(c, "text");
		json_t *ids = json_object_get(c, "ids");
		const char *what = NULL;
		json_t *got = tt_encode(t, json_string_value(text), json_string_length(text), false);
		json_t *got_sp = tt_encode(t, json_string_value(text), json_string_length(text), true);
		if (!ids_match(got, ids))
			what = "ids";
		else if (!ids_match(got_sp, json_object_get(c, "ids_special")))
			what = "ids_special";
		else if (!text_match(t, ids, false, json_object_get(c, "decode")))
			what = "decode";
		else if (!text_match(t, ids, true, json_object_get(c, "decode_skip")))
			what = "decode_skip";
		if (what) {
			char *s = json_dumps(text, JSON_ENCODE_ANY);
			fprintf(stderr, "%s case %zu: %s differ for %s\n", name, i, what, s);
			tt_print_ids("  atlas", got);
			tt_print_ids("  reference", ids);
			free(s);
			bad++;
		}
		json_decref(got);
		json_decref(got_sp);
	}
	return bad;
}

static void test_qwen3_cases(void **state)
{
	struct atlas_tokenizer *t;
	char err[512];
	assert_int_equal(tok_load(qwen3_dir, &t, err, sizeof err), 0);
	assert_int_equal(compare_cases(t, "qwen3", json_object_get(ref, "cases")), 0);
	json_t *bos = json_object_get(ref, "bos_token_id"), *eos = json_object_get(ref, "eos_token_id");
	assert_int_equal(tok_bos_id(t), json_is_integer(bos) ? json_integer_value(bos) : -1);
	assert_int_equal(tok_eos_id(t), json_is_integer(eos) ? json_integer_value(eos) : -1);
	tok_free(t);
}

/* texts.json and the reference must hold the same texts, or the reference
 * is stale. */
static void test_qwen3_texts_current(void **state)
{
	char *file = tt_source_path("tests/tokenizer/texts.json");
	json_t *texts = json_load_file(file, JSON_ALLOW_NUL, NULL);
	json_t *cases = json_object_get(ref, "cases");
	assert_non_null(texts);
	bool same = json_array_size(texts) == json_array_size(cases);
	for (size_t i = 0; same && i < json_array_size(texts); i++)
		same = json_equal(json_array_get(texts, i),
				  json_object_get(json_array_get(cases, i), "text"));
	if (!same)
		fprintf(stderr, "%s changed: rerun tools/ref/tokenizer_ref.py\n", file);
	assert_true(same);
	json_decref(texts);
	free(file);
}

static const char *content_of(json_t *messages, size_t i, const char *role)
{
	json_t *m = json_array_get(messages, i);
	const char *r = json_string_value(json_object_get(m, "role"));
	return r && strcmp(r, role) == 0 ? json_string_value(json_object_get(m, "content")) : NULL;
}

static char *turn(const struct atlas_tokenizer *t, bool first, const char *system,
		  const char *user)
{
	int n = tok_chat_turn(t, first, system, user, strlen(user), NULL, 0);
	assert_true(n > 0);
	char *buf = malloc((size_t)n + 1);
	assert_int_equal(tok_chat_turn(t, first, system, user, strlen(user), buf, (size_t)n + 1), n);
	return buf;
}

static bool ends_with(const char *s, const char *suffix)
{
	size_t a = strlen(s), b = strlen(suffix);
	return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* One conversation: [system] user, or [system] user assistant user. The
 * first turn alone is the whole render. With a second turn, the engine's
 * context after the first answer (closed by the end-of-turn token and
 * tok_chat_close) must be the template's rendering of that history, and the
 * second turn what the template appends for the last user message. (Beyond
 * two turns Qwen3's template drops the empty think blocks of older answers,
 * which an engine that keeps its context cannot do.) */
static void check_chat(const struct atlas_tokenizer *t, json_t *c)
{
	json_t *msgs = json_object_get(c, "messages");
	const char *name = json_string_value(json_object_get(c, "name"));
	const char *rendered = json_string_value(json_object_get(c, "rendered"));
	const char *history = json_string_value(json_object_get(c, "history"));
	const char *system = content_of(msgs, 0, "system");
	size_t i = system ? 1 : 0, n = json_array_size(msgs);
	assert_true(n == i + 1 || n == i + 3);
	char *first = turn(t, true, system, content_of(msgs, i, "user"));
	if (n == i + 1) {
		if (strcmp(first, rendered) != 0)
			fprintf(stderr, "chat %s:\natlas     [%s]\nreference [%s]\n", name, first,
				rendered);
		assert_string_equal(first, rendered);
		free(first);
		return;
	}
	const char *answer = content_of(msgs, i + 1, "assistant");
	const char *user = content_of(msgs, i + 2, "user");
	char eot[64];
	int eot_len = tok_token_bytes(t, tok_chat_eot_id(t), eot, sizeof eot - 1);
	assert_non_null(answer);
	assert_non_null(user);
	assert_non_null(history);
	assert_true(eot_len > 0);
	eot[eot_len] = '\0';
	char *context = NULL;
	assert_true(asprintf(&context, "%s%s%s%s", first, answer, eot, tok_chat_close(t, true)) > 0);
	char *second = turn(t, false, NULL, user);
	if (strcmp(context, history) != 0 || !ends_with(rendered, second))
		fprintf(stderr, "chat %s:\natlas history [%s]\nreference     [%s]\n"
				"atlas turn [%s]\nreference  [%s]\n",
			name, context, history, second, rendered);
	assert_string_equal(context, history);
	assert_true(ends_with(rendered, second));
	free(second);
	free(context);
	free(first);
}

static void test_qwen3_chat(void **state)
{
	struct atlas_tokenizer *t;
	char err[512];
	assert_int_equal(tok_load(qwen3_dir, &t, err, sizeof err), 0);
	json_t *chat = json_object_get(ref, "chat");
	assert_true(json_array_size(chat) > 0);
	size_t i;
	json_t *c;
	json_array_foreach(chat, i, c)
		check_chat(t, c);
	tok_free(t);
}

static void test_small(void **state)
{
	const char *name;
	json_t *entry;
	int bad = 0, count = 0;
	json_object_foreach(json_object_get(ref, "tokenizers"), name, entry) {
		char *rel = NULL, *dir;
		assert_true(asprintf(&rel, "tests/tokenizer/small/%s", name) > 0);
		dir = tt_source_path(rel);
		struct atlas_tokenizer *t;
		char err[512];
		int r = tok_load(dir, &t, err, sizeof err);
		if (r < 0)
			fprintf(stderr, "%s\n", err);
		assert_int_equal(r, 0);
		bad += compare_cases(t, name, json_object_get(entry, "cases"));
		count++;
		tok_free(t);
		free(dir);
		free(rel);
	}
	assert_true(count > 0);
	assert_int_equal(bad, 0);
}

static int skipped(const char *what, const char *how)
{
	printf("%s is missing (%s): skipped\n", what, how);
	return 77;
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "";
	bool qwen3 = strcmp(mode, "qwen3") == 0;
	if (!qwen3 && strcmp(mode, "small") != 0) {
		fprintf(stderr, "usage: %s qwen3|small\n", argv[0]);
		return 2;
	}
	char *ref_file = tt_source_path(qwen3 ? "tests/tokenizer/qwen3_ref.json"
					      : "tests/tokenizer/small_ref.json");
	qwen3_dir = tt_build_path("testdata/qwen3-tokenizer");
	char *tok_file = tt_build_path("testdata/qwen3-tokenizer/tokenizer.json");
	int rc;
	if (qwen3 && !tt_exists(tok_file)) {
		rc = skipped(tok_file, "tools/fetch-tokenizer fetches it");
	} else if (!tt_exists(ref_file)) {
		rc = skipped(ref_file, "tools/ref/tokenizer_ref.py writes it");
	} else {
		json_error_t jerr;
		ref = json_load_file(ref_file, JSON_ALLOW_NUL, &jerr);
		if (!ref) {
			fprintf(stderr, "%s: line %d: %s\n", ref_file, jerr.line, jerr.text);
			return 1;
		}
		const struct CMUnitTest qwen3_tests[] = {
			cmocka_unit_test(test_qwen3_texts_current),
			cmocka_unit_test(test_qwen3_cases),
			cmocka_unit_test(test_qwen3_chat),
		};
		const struct CMUnitTest small_tests[] = {
			cmocka_unit_test(test_small),
		};
		rc = qwen3 ? cmocka_run_group_tests_name("qwen3", qwen3_tests, NULL, NULL)
			   : cmocka_run_group_tests_name("small", small_tests, NULL, NULL);
		json_decref(ref);
	}
	free(ref_file);
	free(tok_file);
	free(qwen3_dir);
	return rc;
}
