/* Properties of atlas' tokenizer on Qwen3's real tokenizer that need no
 * reference output: decode(encode(x)) == NFC(x) for every test text, streaming
 * decode that never hands out half a character (token by token, and byte by
 * byte through the single-byte tokens), bad input, concurrent encodes. Also
 * prints (no assertion) how long loading and encoding take.
 *
 * Input: $ATLAS_BUILD_ROOT/testdata/qwen3-tokenizer (tools/fetch-tokenizer);
 * without it the test exits 77 (skipped). */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/clock.h"
#include "tok_testutil.h"

static struct atlas_tokenizer *tok;
static json_t *texts;

static const char *text_at(size_t i, size_t *len)
{
	json_t *v = json_array_get(texts, i);
	*len = json_string_length(v);
	return json_string_value(v);
}

static void test_basics(void **state)
{
	assert_int_equal(tok_vocab_size(tok), 151669);
	assert_int_equal(tok_token_id(tok, "<|endoftext|>"), 151643);
	assert_int_equal(tok_token_id(tok, "<|im_start|>"), 151644);
	assert_int_equal(tok_token_id(tok, "<|im_end|>"), 151645);
	assert_int_equal(tok_token_id(tok, "<think>"), 151667);
	assert_true(tok_is_special(tok, 151644));
	assert_false(tok_is_special(tok, 151667)); /* <think> is added, not special */
	assert_int_equal(tok_bos_id(tok), -1);     /* bos_token is null */
	assert_int_equal(tok_eos_id(tok), 151645);
	assert_int_equal(tok_chat_style(tok), TOK_CHAT_CHATML);
	assert_int_equal(tok_chat_eot_id(tok), 151645);
}

static void test_round_trip(void **state)
{
	for (size_t i = 0; i < json_array_size(texts); i++) {
		size_t len, nfc_len, out_len, n;
		const char *text = text_at(i, &len);
		int32_t *ids;
		char *out;
		assert_int_equal(tok_encode(tok, text, len, false, &ids, &n), 0);
		assert_int_equal(tok_decode(tok, ids, n, false, &out, &out_len), 0);
		char *nfc = tt_nfc(text, len, &nfc_len);
		assert_non_null(nfc);
		if (out_len != nfc_len || memcmp(out, nfc, nfc_len) != 0)
			fprintf(stderr, "text %zu: %s\n", i, text);
		assert_int_equal(out_len, nfc_len);
		assert_memory_equal(out, nfc, nfc_len);
		free(nfc);
		free(out);
		free(ids);
	}
}

/* Push ids; every chunk must be whole characters; returns all of it. */
static char *stream(const int32_t *ids, size_t n, bool skip, size_t *len)
{
	struct tok_stream s = { 0 };
	size_t cap = 64, total = 0;
	char *all = malloc(cap);
	char chunk[1024];
	for (size_t i = 0; i <= n; i++) {
		int r = i < n ? tok_stream_push(tok, &s, ids[i], skip, chunk, sizeof chunk)
			      : tok_stream_flush(&s, chunk, sizeof chunk);
		assert_true(r >= 0);
		assert_true(tt_utf8_valid(chunk, (size_t)r));
		while (total + (size_t)r > cap)
			all = realloc(all, cap *= 2);
		memcpy(all + total, chunk, (size_t)r);
		total += (size_t)r;
	}
	*len = total;
	return all;
}

static void test_stream_tokens(void **state)
{
	for (size_t i = 0; i < json_array_size(texts); i++) {
		for (int skip = 0; skip < 2; skip++) {
			size_t len, n, want_len, got_len;
			const char *text = text_at(i, &len);
			int32_t *ids;
			char *want;
			assert_int_equal(tok_encode(tok, text, len, false, &ids, &n), 0);
			assert_int_equal(tok_decode(tok, ids, n, skip, &want, &want_len), 0);
			char *got = stream(ids, n, skip, &got_len);
			assert_int_equal(got_len, want_len);
			assert_memory_equal(got, want, want_len);
			free(got);
			free(want);
			free(ids);
		}
	}
}

/* Every text again, one byte per token: multi-byte characters and emoji are
 * then always split across tokens. */
static void test_stream_bytes(void **state)
{
	int32_t byte_id[256];
	for (int b = 0; b < 256; b++) {
		char c[3];
		tt_byte_char((uint8_t)b, c);
		byte_id[b] = tok_token_id(tok, c);
		assert_true(byte_id[b] >= 0);
	}
	for (size_t i = 0; i < json_array_size(texts); i++) {
		size_t len, got_len;
		const char *text = text_at(i, &len);
		int32_t *ids = malloc((len + 1) * sizeof *ids);
		for (size_t k = 0; k < len; k++)
			ids[k] = byte_id[(uint8_t)text[k]];
		char *got = stream(ids, len, false, &got_len);
		assert_int_equal(got_len, len);
		assert_memory_equal(got, text, len);
		free(got);
		free(ids);
	}
}

static void test_bad_input(void **state)
{
	int32_t *ids;
	size_t n;
	char *text;
	assert_int_equal(tok_encode(tok, "ok \xe4\xb8", 5, false, &ids, &n), -EINVAL);
	assert_int_equal(tok_encode(tok, "\xfe", 1, true, &ids, &n), -EINVAL);
	assert_int_equal(tok_decode(tok, (int32_t[]){ 9707, 151669 }, 2, false, &text, &n), -EINVAL);
	assert_int_equal(tok_decode(tok, (int32_t[]){ -1 }, 1, true, &text, &n), -EINVAL);
	char buf[8];
	assert_int_equal(tok_token_bytes(tok, 1 << 30, buf, sizeof buf), -EINVAL);
	struct tok_stream s = { 0 };
	assert_int_equal(tok_stream_push(tok, &s, 151669, false, buf, sizeof buf), -EINVAL);
}

struct worker {
	json_t *ids; /* [text][id] */
	bool same;
};

static json_t *encode_all(void)
{
	json_t *all = json_array();
	for (size_t i = 0; i < json_array_size(texts); i++) {
		size_t len;
		const char *text = text_at(i, &len);
		json_array_append_new(all, tt_encode(tok, text, len, true));
	}
	return all;
}

static void *work(void *arg)
{
	struct worker *w = arg;
	w->same = true;
	for (int round = 0; round < 3; round++) {
		json_t *mine = encode_all();
		w->same = w->same && json_equal(mine, w->ids);
		json_decref(mine);
	}
	return NULL;
}

static void test_threads(void **state)
{
	json_t *ref = encode_all();
	struct worker w[4];
	pthread_t th[4];
	for (int i = 0; i < 4; i++) {
		w[i].ids = ref;
		assert_int_equal(pthread_create(&th[i], NULL, work, &w[i]), 0);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		assert_true(w[i].same);
	}
	json_decref(ref);
}

static void benchmark(const char *dir)
{
	double t0 = atlas_now_s();
	struct atlas_tokenizer *t;
	char err[512];
	if (tok_load(dir, &t, err, sizeof err) < 0)
		return;
	double t1 = atlas_now_s();
	size_t bytes = 0, count = 0;
	for (size_t i = 0; i < json_array_size(texts); i++) {
		size_t len, n;
		const char *text = text_at(i, &len);
		int32_t *ids;
		if (tok_encode(t, text, len, false, &ids, &n) == 0) {
			bytes += len;
			count += n;
			free(ids);
		}
	}
	double t2 = atlas_now_s();
	printf("benchmark: load Qwen3 tokenizer %.3f s; encode texts.json (%zu bytes, %zu tokens) "
	       "%.2f ms, %.1f MB/s\n",
	       t1 - t0, bytes, count, (t2 - t1) * 1e3, bytes / (t2 - t1) / 1e6);
	tok_free(t);
}

int main(void)
{
	char *dir = tt_build_path("testdata/qwen3-tokenizer");
	char *file = tt_build_path("testdata/qwen3-tokenizer/tokenizer.json");
	char *texts_file = tt_source_path("tests/tokenizer/texts.json");
	if (!tt_exists(file)) {
		printf("%s is missing (tools/fetch-tokenizer %s fetches it): skipped\n", file, dir);
		return 77;
	}
	json_error_t jerr;
	texts = json_load_file(texts_file, JSON_ALLOW_NUL, &jerr);
	if (!json_is_array(texts)) {
		fprintf(stderr, "%s: line %d: %s\n", texts_file, jerr.line, jerr.text);
		return 1;
	}
	benchmark(dir);
	char err[512];
	if (tok_load(dir, &tok, err, sizeof err) < 0) {
		fprintf(stderr, "%s\n", err);
		return 1;
	}
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_basics),
		cmocka_unit_test(test_round_trip),
		cmocka_unit_test(test_stream_tokens),
		cmocka_unit_test(test_stream_bytes),
		cmocka_unit_test(test_bad_input),
		cmocka_unit_test(test_threads),
	};
	int failed = cmocka_run_group_tests(tests, NULL, NULL);
	tok_free(tok);
	json_decref(texts);
	free(dir);
	free(file);
	free(texts_file);
	return failed;
}
