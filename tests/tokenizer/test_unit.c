/* Tokenizer behaviour on a tiny byte-level BPE tokenizer written by the test
 * (tok_testutil.c): merge order, the pipeline options, added tokens, decoding
 * with from_utf8_lossy's replacement rules, and streaming decode. Every
 * expected value here is worked out by hand from the BPE rules and the
 * Unicode standard, not produced by the code under test. */
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

#define IDS(...) ((const int32_t[]){ __VA_ARGS__ }), sizeof((const int32_t[]){ __VA_ARGS__ }) / sizeof(int32_t)

static void expect_ids(const struct atlas_tokenizer *t, const char *text, bool special,
		       const int32_t *want, size_t n)
{
	json_t *got = tt_encode(t, text, strlen(text), special);
	if (!tt_ids_equal(got, want, n)) {
		fprintf(stderr, "text \"%s\"\n", text);
		tt_print_ids("got", got);
	}
	assert_true(tt_ids_equal(got, want, n));
	json_decref(got);
}

static struct atlas_tokenizer *load(const struct tt_tiny *opt, char **dir)
{
	struct atlas_tokenizer *t = tt_tiny_load(opt, NULL, dir);
	assert_non_null(t);
	return t;
}

static void test_merge_order(void **state)
{
	char *dir;
	struct atlas_tokenizer *t = load(&(struct tt_tiny){ 0 }, &dir);
	expect_ids(t, "hello world", false, IDS(TT_HELLO, TT_SP_W, 'o', 'r', 'l', 'd'));
	expect_ids(t, "hell", false, IDS(258));
	expect_ids(t, "hel", false, IDS(256, 'l'));
	expect_ids(t, "lll", false, IDS(257, 'l')); /* equal ranks: the leftmost first */
	expect_ids(t, "llo", false, IDS(257, 'o'));
	expect_ids(t, "ehello", false, IDS('e', TT_HELLO));
	expect_ids(t, "\xf0\x9f\x98\x80", false, IDS(TT_EMOJI));
	expect_ids(t, "", false, NULL, 0);
	assert_int_equal(tok_vocab_size(t), TT_BOS + 1);
	tok_free(t);
	tt_rmdir(dir);
}

static void test_merges_as_strings(void **state)
{
	char *dir;
	struct atlas_tokenizer *t = load(&(struct tt_tiny){ .merges_as_strings = true }, &dir);
	expect_ids(t, "hello world", false, IDS(TT_HELLO, TT_SP_W, 'o', 'r', 'l', 'd'));
	expect_ids(t, "\xf0\x9f\x98\x80\xc3\xa9", false, IDS(TT_EMOJI, TT_E_ACUTE));
	tok_free(t);
	tt_rmdir(dir);
}

static void test_nfc(void **state)
{
	char *dir;
	struct atlas_tokenizer *t = load(&(struct tt_tiny){ .nfc = true }, &dir);
	expect_ids(t, "e\xcc\x81", false, IDS(TT_E_ACUTE));
	tok_free(t);
	tt_rmdir(dir);
	t = load(&(struct tt_tiny){ .nfc = false }, &dir);
	/* Unnormalized, U+0301 is no letter: it is a piece of its own. */
	expect_ids(t, "e\xcc\x81", false, IDS('e', 0xcc, 0x81));
	tok_free(t);
	tt_rmdir(dir);
}

static void test_ignore_merges(void **state)
{
	char *dir;
	struct tt_tiny opt = { .ignore_merges = true, .extra_vocab = json_pack("{s:i}", "ab", 280) };
	struct atlas_tokenizer *t = load(&opt, &dir);
	expect_ids(t, "ab", false, IDS(280));
	expect_ids(t, "abb", false, IDS('a', 'b', 'b'));
	tok_free(t);
	tt_rmdir(dir);
	opt = (struct tt_tiny){ .extra_vocab = json_pack("{s:i}", "ab", 280) };
	t = load(&opt, &dir);
	expect_ids(t, "ab", false, IDS('a', 'b')); /* no merge makes "ab" */
	tok_free(t);
	tt_rmdir(dir);
}

static void test_gpt2_prefix_space(void **state)
{
	char *dir;
	struct atlas_tokenizer *t = load(&(struct tt_tiny){ .gpt2_regex = true, .prefix_space = true },
					 &dir);
	expect_ids(t, "hello world", false, IDS(' ', TT_HELLO, TT_SP_W, 'o', 'r', 'l', 'd'));
	expect_ids(t, " hello", false, IDS(' ', TT_HELLO));
	/* The prefix goes on every piece between added tokens. */
	expect_ids(t, "<|end|>hello", false, IDS(TT_END, ' ', TT_HELLO));
	tok_free(t);
	tt_rmdir(dir);
}

static void test_template_bos(void **state)
{
	char *dir;
	struct atlas_tokenizer *t = load(&(struct tt_tiny){ .bos_template = true }, &dir);
	expect_ids(t, "hello", true, IDS(TT_BOS, TT_HELLO));
	expect_ids(t, "hello", false, IDS(TT_HELLO));
	expect_ids(t, "", true, IDS(TT_BOS));
	tok_free(t);
	tt_rmdir(dir);
}

static json_t *added(int id, const char *content, bool lstrip, bool rstrip, bool single_word)
{
	return json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", id, "content", content,
			 "single_word", single_word, "lstrip", lstrip, "rstrip", rstrip,
			 "normalized", 0, "special", 0);
}

static void test_added_tokens(void **state)
{
	char *dir;
	json_t *extra = json_array();
	json_array_append_new(extra, added(302, "<m>", true, false, false));
	json_array_append_new(extra, added(303, "<r>", false, true, false));
	json_array_append_new(extra, added(304, "<w>", false, false, true));
	json_array_append_new(extra, added(305, "<|end|>x", false, false, false));
	struct atlas_tokenizer *t = load(&(struct tt_tiny){ .extra_added = extra }, &dir);
	expect_ids(t, "hi<|end|>there", false, IDS('h', 'i', TT_END, 't', 256, 'r', 'e'));
	expect_ids(t, "<|end|><|end|>", false, IDS(TT_END, TT_END));
	expect_ids(t, "<|end|>xhello", false, IDS(305, TT_HELLO)); /* the longest match */
	expect_ids(t, "<|end", false, IDS('<', '|', 'e', 'n', 'd'));
	expect_ids(t, "a  <m>b", false, IDS('a', 302, 'b'));
	expect_ids(t, "<r>  x", false, IDS(303, 'x'));
	expect_ids(t, "x<w>", false, IDS('x', '<', 'w', '>'));
	expect_ids(t, "x <w> y", false, IDS('x', ' ', 304, ' ', 'y'));
	assert_int_equal(tok_token_id(t, "<|end|>"), TT_END);
	assert_int_equal(tok_token_id(t, "hello"), TT_HELLO);
	assert_int_equal(tok_token_id(t, "no such token"), -1);
	assert_true(tok_is_special(t, TT_END));
	assert_false(tok_is_special(t, 302));
	assert_false(tok_is_special(t, TT_HELLO));
	assert_false(tok_is_special(t, -1));
	tok_free(t);
	tt_rmdir(dir);
}

static void test_invalid_input(void **state)
{
	char *dir;
	struct atlas_tokenizer *t = load(&(struct tt_tiny){ 0 }, &dir);
	static const char *const bad[] = { "\xff", "abc\xc3", "\xed\xa0\x80", "\xc0\x80",
					   "\xf4\x90\x80\x80", "\x80" };
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		int32_t *ids = (int32_t *)1;
		size_t n = 7;
		assert_int_equal(tok_encode(t, bad[i], strlen(bad[i]), false, &ids, &n), -EINVAL);
		assert_null(ids);
		assert_int_equal(n, 0);
	}
	tok_free(t);
	tt_rmdir(dir);
}

static void expect_decode(const struct atlas_tokenizer *t, const int32_t *ids, size_t n,
			  bool skip, const char *want)
{
	char *text;
	size_t len;
	assert_int_equal(tok_decode(t, ids, n, skip, &text, &len), 0);
	assert_int_equal(len, strlen(want));
	assert_string_equal(text, want);
	free(text);
}

#define FFFD "\xef\xbf\xbd"

static void test_decode(void **state)
{
	char *dir;
	struct atlas_tokenizer *t = load(&(struct tt_tiny){ 0 }, &dir);
	expect_decode(t, IDS(TT_HELLO, TT_SP_W, 'o'), false, "hello wo");
	expect_decode(t, IDS('h', TT_END, 'i'), false, "h<|end|>i");
	expect_decode(t, IDS('h', TT_END, 'i'), true, "hi");
	expect_decode(t, IDS(TT_EMOJI_A, TT_EMOJI_B), false, "\xf0\x9f\x98\x80");
	/* from_utf8_lossy: one U+FFFD per maximal invalid subpart */
	expect_decode(t, IDS(0xe4, 'A'), false, FFFD "A");
	expect_decode(t, IDS(0xf0, 0x9f), false, FFFD);
	expect_decode(t, IDS(TT_EMOJI_A, 'A'), false, FFFD "A");
	expect_decode(t, IDS(0xc0, 0x80), false, FFFD FFFD);
	expect_decode(t, IDS(0xed, 0xa0, 0x80), false, FFFD FFFD FFFD);
	expect_decode(t, IDS(0xe0, 0x80, 'x'), false, FFFD FFFD "x");
	expect_decode(t, IDS(0xff, 0xe4, 0xb8, 0xad), false, FFFD "\xe4\xb8\xad");
	expect_decode(t, IDS(0xe4, TT_END, 0xb8, 0xad), false, FFFD "<|end|>" FFFD FFFD);
	expect_decode(t, IDS(0xe4, TT_END, 0xb8, 0xad), true, "\xe4\xb8\xad");
	expect_decode(t, NULL, 0, false, "");

	char *text = (char *)1;
	size_t len;
	assert_int_equal(tok_decode(t, IDS(TT_HELLO, 280), false, &text, &len), -EINVAL);
	assert_int_equal(tok_decode(t, IDS(-1), false, &text, &len), -EINVAL);
	assert_int_equal(tok_decode(t, IDS(TT_BOS + 1), false, &text, &len), -EINVAL);

	char buf[8];
	memset(buf, '#', sizeof buf);
	assert_int_equal(tok_token_bytes(t, TT_HELLO, buf, 2), 5);
	assert_memory_equal(buf, "he######", 8);
	assert_int_equal(tok_token_bytes(t, TT_END, buf, sizeof buf), 7);
	assert_memory_equal(buf, "<|end|>", 7);
	assert_int_equal(tok_token_bytes(t, TT_SP_W, buf, sizeof buf), 2);
	assert_memory_equal(buf, " w", 2);
	assert_int_equal(tok_token_bytes(t, 280, buf, sizeof buf), -EINVAL);
	tok_free(t);
	tt_rmdir(dir);
}

/* Push ids one by one; every chunk must be whole characters, and all of it
 * (with the flush) must equal tok_decode of the same ids. */
static void stream_matches_decode(const struct atlas_tokenizer *t, const int32_t *ids, size_t n,
				  bool skip)
{
	struct tok_stream s = { 0 };
	char all[256] = "", chunk[64];
	size_t total = 0;
	for (size_t i = 0; i < n; i++) {
		int r = tok_stream_push(t, &s, ids[i], skip, chunk, sizeof chunk);
		assert_true(r >= 0);
		assert_true(tt_utf8_valid(chunk, (size_t)r));
		memcpy(all + total, chunk, (size_t)r);
		total += (size_t)r;
	}
	int r = tok_stream_flush(&s, chunk, sizeof chunk);
	assert_true(r >= 0);
	memcpy(all + total, chunk, (size_t)r);
	total += (size_t)r;
	char *text;
	size_t len;
	assert_int_equal(tok_decode(t, ids, n, skip, &text, &len), 0);
	assert_int_equal(total, len);
	assert_memory_equal(all, text, len);
	free(text);
}

static void test_stream_bytes(void **state)
{
	char *dir;
	struct atlas_tokenizer *t = load(&(struct tt_tiny){ 0 }, &dir);
	static const char text[] = "a\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80!";
	/* What each pushed byte releases: nothing until a character is whole. */
	static const char *const want[] = { "a", "", "\xc3\xa9", "", "", "\xe4\xb8\xad",
					    "", "", "", "\xf0\x9f\x98\x80", "!" };
	struct tok_stream s = { 0 };
	for (size_t i = 0; i < sizeof text - 1; i++) {
		char out[16];
		int r = tok_stream_push(t, &s, (uint8_t)text[i], false, out, sizeof out);
		assert_int_equal(r, strlen(want[i]));
		assert_memory_equal(out, want[i], (size_t)r);
	}
	char out[8];
	assert_int_equal(tok_stream_flush(&s, out, sizeof out), 0);

	/* An emoji split across two tokens. */
	assert_int_equal(tok_stream_push(t, &s, TT_EMOJI_A, false, out, sizeof out), 0);
	assert_int_equal(tok_stream_push(t, &s, TT_EMOJI_B, false, out, sizeof out), 4);
	assert_memory_equal(out, "\xf0\x9f\x98\x80", 4);

	stream_matches_decode(t, IDS(0xe4, 'A'), false);
	stream_matches_decode(t, IDS(TT_EMOJI_A, 'A'), false);
	stream_matches_decode(t, IDS(0xf0, 0x9f, 0x98), false);
	stream_matches_decode(t, IDS(0xc0, 0x80, 0xed, 0xa0, 0x80), false);
	stream_matches_decode(t, IDS(0xe0, 0x80, 'x', 0x80, 0xbf), false);
	stream_matches_decode(t, IDS(0xe4, 0xb8, TT_HELLO, 0xf4, 0x8f, 0xbf, 0xbf), false);
	stream_matches_decode(t, IDS(0xe4, TT_END, 0xb8, 0xad), false);
	stream_matches_decode(t, IDS(0xe4, TT_END, 0xb8, 0xad), true);
	stream_matches_decode(t, IDS(0xf0, TT_EMOJI_B, TT_E_ACUTE), false);
	tok_free(t);
	tt_rmdir(dir);
}

static void test_stream_limits(void **state)
{
	char *dir;
	struct atlas_tokenizer *t = load(&(struct tt_tiny){ 0 }, &dir);
	struct tok_stream s = { 0 };
	char out[8];
	assert_int_equal(tok_stream_push(t, &s, 0xc3, false, out, sizeof out), 0);
	/* No room: nothing is consumed, the same push works with room. */
	assert_int_equal(tok_stream_push(t, &s, 0xa9, false, out, 1), -ENOSPC);
	assert_int_equal(tok_stream_push(t, &s, 0xa9, false, out, sizeof out), 2);
	assert_memory_equal(out, "\xc3\xa9", 2);
	assert_int_equal(tok_stream_push(t, &s, 280, false, out, sizeof out), -EINVAL);
	assert_int_equal(tok_stream_push(t, &s, -5, false, out, sizeof out), -EINVAL);
	/* Special tokens are skipped when asked, and keep a pending character. */
	assert_int_equal(tok_stream_push(t, &s, 0xe4, true, out, sizeof out), 0);
	assert_int_equal(tok_stream_push(t, &s, TT_END, true, out, sizeof out), 0);
	assert_int_equal(tok_stream_push(t, &s, 0xb8, true, out, sizeof out), 0);
	assert_int_equal(tok_stream_flush(&s, out, 2), -ENOSPC);
	assert_int_equal(tok_stream_flush(&s, out, sizeof out), 3);
	assert_memory_equal(out, FFFD, 3);
	assert_int_equal(s.n_pending, 0);
	tok_free(t);
	tt_rmdir(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_merge_order),
		cmocka_unit_test(test_merges_as_strings),
		cmocka_unit_test(test_nfc),
		cmocka_unit_test(test_ignore_merges),
		cmocka_unit_test(test_gpt2_prefix_space),
		cmocka_unit_test(test_template_bos),
		cmocka_unit_test(test_added_tokens),
		cmocka_unit_test(test_invalid_input),
		cmocka_unit_test(test_decode),
		cmocka_unit_test(test_stream_bytes),
		cmocka_unit_test(test_stream_limits),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
