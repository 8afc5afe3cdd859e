/* Helpers shared by the tokenizer tests: paths of the test inputs, small
 * files in a temporary directory, a tiny byte-level tokenizer written from
 * parts, and UTF-8 checks that do not use the code under test. */
#ifndef ATLAS_TESTS_TOKENIZER_TESTUTIL_H
#define ATLAS_TESTS_TOKENIZER_TESTUTIL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/tokenizer/tokenizer.h"

/* $ATLAS_SOURCE_ROOT/rel or $ATLAS_BUILD_ROOT/rel (static buffer per call site
 * is not kept: the result is malloc'd). */
char *tt_source_path(const char *rel);
char *tt_build_path(const char *rel);
bool tt_exists(const char *path);

/* A fresh directory under /tmp; tt_rmdir removes it and what it holds. */
char *tt_tmpdir(void);
void tt_rmdir(char *dir);
void tt_write(const char *dir, const char *name, const char *text);
void tt_write_json(const char *dir, const char *name, json_t *obj); /* steals obj */

/* GPT-2's byte-level character of byte b, as UTF-8 (1 or 2 bytes + NUL). */
void tt_byte_char(uint8_t b, char out[3]);
/* A token's text in byte-level characters, from its raw bytes. */
char *tt_byte_level(const char *raw);

/* The tiny tokenizer of the unit tests. Its vocabulary: id b for each byte b,
 * then the merges below in order (id 256 + rank), then the added tokens. */
struct tt_tiny {
	bool nfc, ignore_merges, merges_as_strings, bos_template, gpt2_regex, prefix_space;
	json_t *extra_added; /* more added_tokens entries, or NULL (stolen) */
	json_t *extra_vocab; /* more vocab entries {text: id}, or NULL (stolen) */
};
#define TT_HELLO 259 /* "hello" */
#define TT_SP_W 260  /* " w" */
#define TT_E_ACUTE 261 /* "é" */
#define TT_EMOJI_A 262 /* F0 9F: the first half of 😀 */
#define TT_EMOJI_B 263 /* 98 80: its second half */
#define TT_EMOJI 264   /* 😀 */
#define TT_END 300     /* added special token <|end|> */
#define TT_BOS 301     /* added special token <s> */
json_t *tt_tiny_json(const struct tt_tiny *opt);
/* Write the tiny tokenizer (and config_json, if not NULL) into a new temp dir
 * and load it. */
struct atlas_tokenizer *tt_tiny_load(const struct tt_tiny *opt, const char *config_json,
				     char **dir);

/* Encode, returning the ids as a JSON array (for easy comparison). */
json_t *tt_encode(const struct atlas_tokenizer *t, const char *text, size_t len, bool special);
bool tt_ids_equal(json_t *got, const int32_t *want, size_t n);
void tt_print_ids(const char *what, json_t *ids);

/* UTF-8 checks written independently of the tokenizer's own. */
bool tt_utf8_valid(const char *s, size_t n);
/* NFC of s (malloc'd, length in *out_len). */
char *tt_nfc(const char *s, size_t n, size_t *out_len);

#endif
