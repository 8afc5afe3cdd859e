/* Every way a tokenizer directory can be broken or use a piece atlas does not
 * support must fail tok_load with a negative code and a message that names
 * the file and the piece. The broken files are the tiny tokenizer of
 * tok_testutil.c with one part replaced. */
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

/* Load dir and expect failure with every needle (and the file name) in the
 * message. */
static void expect_error(const char *dir, int code, const char *file, const char *needle1,
			 const char *needle2)
{
	struct atlas_tokenizer *t = (struct atlas_tokenizer *)1;
	char err[512] = "";
	int r = tok_load(dir, &t, err, sizeof err);
	if (r >= 0 || !strstr(err, file) || !strstr(err, needle1) ||
	    (needle2 && !strstr(err, needle2)))
		fprintf(stderr, "rc %d, message: %s\n", r, err);
	assert_null(t);
	assert_true(r < 0);
	if (code)
		assert_int_equal(r, code);
	assert_non_null(strstr(err, file));
	assert_non_null(strstr(err, needle1));
	if (needle2)
		assert_non_null(strstr(err, needle2));
}

/* The tiny tokenizer with root[key] (or root[key][sub]) replaced by value. */
static void expect_broken(const char *key, const char *sub, json_t *value, int code,
			  const char *needle1, const char *needle2)
{
	json_t *root = tt_tiny_json(&(struct tt_tiny){ 0 });
	if (sub)
		json_object_set_new(json_object_get(root, key), sub, value);
	else
		json_object_set_new(root, key, value);
	char *dir = tt_tmpdir();
	tt_write_json(dir, "tokenizer.json", root);
	expect_error(dir, code, "tokenizer.json", needle1, needle2);
	tt_rmdir(dir);
}

static void test_missing_and_not_json(void **state)
{
	char *dir = tt_tmpdir();
	expect_error(dir, -ENOENT, "tokenizer.json", "tokenizer.json", NULL);
	tt_write(dir, "tokenizer.json", "{\"model\": {\"vocab\": ");
	expect_error(dir, -EINVAL, "tokenizer.json", "line 1", NULL);
	tt_write(dir, "tokenizer.json", "[1, 2, 3]");
	expect_error(dir, -EINVAL, "tokenizer.json", "not a JSON object", NULL);
	tt_rmdir(dir);
}

static void test_unsupported_pieces(void **state)
{
	expect_broken("normalizer", NULL, json_pack("{s:s}", "type", "NFKC"), -ENOTSUP,
		      "normalizer", "NFKC");
	expect_broken("normalizer", NULL,
		      json_pack("{s:s, s:[{s:s}, {s:s}]}", "type", "Sequence", "normalizers",
				"type", "NFC", "type", "Lowercase"),
		      -ENOTSUP, "normalizer", "Lowercase");
	expect_broken("pre_tokenizer", NULL,
		      json_pack("{s:s, s:s, s:s}", "type", "Metaspace", "replacement", "_",
				"prepend_scheme", "always"),
		      -ENOTSUP, "pre_tokenizer", "Metaspace");
	expect_broken("pre_tokenizer", NULL, json_null(), -ENOTSUP, "pre_tokenizer", "ByteLevel");
	expect_broken("pre_tokenizer", NULL,
		      json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "Regex",
				"\\s+", "behavior", "Removed", "invert", 0),
		      -ENOTSUP, "Split", "Removed");
	expect_broken("pre_tokenizer", NULL,
		      json_pack("{s:s, s:[{s:s, s:b, s:b}, {s:s, s:{s:s}, s:s, s:b}]}", "type",
				"Sequence", "pretokenizers", "type", "ByteLevel", "add_prefix_space",
				0, "use_regex", 1, "type", "Split", "pattern", "Regex", "x",
				"behavior", "Isolated", "invert", 0),
		      -ENOTSUP, "pre_tokenizer", "after ByteLevel");
	expect_broken("post_processor", NULL,
		      json_pack("{s:s, s:[s, i], s:[s, i]}", "type", "RobertaProcessing", "sep",
				"</s>", 2, "cls", "<s>", 0),
		      -ENOTSUP, "post_processor", "RobertaProcessing");
	expect_broken("decoder", NULL, json_pack("{s:s}", "type", "WordPiece"), -ENOTSUP,
		      "decoder", "WordPiece");
	expect_broken("decoder", NULL, json_null(), -ENOTSUP, "decoder", NULL);
	expect_broken("model", "type", json_string("Unigram"), -ENOTSUP, "model", "Unigram");
	expect_broken("model", "byte_fallback", json_true(), -ENOTSUP, "model", "byte_fallback");
	expect_broken("model", "dropout", json_real(0.1), -ENOTSUP, "model", "dropout");
	expect_broken("model", "continuing_subword_prefix", json_string("##"), -ENOTSUP, "model",
		      "continuing_subword_prefix");
}

static void test_bad_values(void **state)
{
	expect_broken("pre_tokenizer", NULL,
		      json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "Regex",
				"(unclosed", "behavior", "Isolated", "invert", 0),
		      -EINVAL, "Split", "bad pattern");
	expect_broken("model", "merges", json_pack("[s]", "h zz"), -EINVAL, "model.merges[0]",
		      "zz");
	expect_broken("model", "merges", json_pack("[i]", 5), -EINVAL, "model.merges[0]", NULL);
	expect_broken("model", "vocab", json_pack("{s:s}", "a", "x"), -EINVAL, "model.vocab",
		      "\"a\"");
	expect_broken("model", "unk_token", json_string("<unk>"), -EINVAL, "unk_token", NULL);
	/* One absurd id would size every per-id table by it (found by the
	 * fuzzer: 2,000,000,029 asked for 2 GB). */
	expect_broken("added_tokens", NULL,
		      json_pack("[{s:i, s:s, s:b}]", "id", 2000000029, "content", "<x>", "special", 1),
		      -EINVAL, "token id 2000000029", "largest");
	expect_broken("added_tokens", NULL, json_pack("[{s:s}]", "content", "<x>"), -EINVAL,
		      "added_tokens[0]", NULL);
	expect_broken("added_tokens", NULL,
		      json_pack("[{s:i, s:s, s:b}, {s:i, s:s, s:b}]", "id", 300, "content", "<x>",
				"special", 1, "id", 301, "content", "<x>", "special", 1),
		      -EINVAL, "added_tokens[1]", "twice");
	expect_broken("post_processor", NULL,
		      json_pack("{s:s, s:[{s:{s:s, s:i}}], s:{}}", "type", "TemplateProcessing",
				"single", "SpecialToken", "id", "<s>", "type_id", 0,
				"special_tokens"),
		      -EINVAL, "TemplateProcessing", NULL);
}

static void test_bad_config(void **state)
{
	char *dir = tt_tmpdir();
	tt_write_json(dir, "tokenizer.json", tt_tiny_json(&(struct tt_tiny){ 0 }));
	tt_write(dir, "tokenizer_config.json", "{\"bos_token\": ");
	expect_error(dir, -EINVAL, "tokenizer_config.json", "line", NULL);
	tt_rmdir(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_missing_and_not_json),
		cmocka_unit_test(test_unsupported_pieces),
		cmocka_unit_test(test_bad_values),
		cmocka_unit_test(test_bad_config),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
