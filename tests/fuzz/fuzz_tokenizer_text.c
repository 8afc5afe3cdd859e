/* Fuzz target: text through a fixed tokenizer (tests/tokenizer/small/added,
 * a byte-level BPE with added tokens). The input is encoded and decoded
 * (valid UTF-8 must come back unchanged where the tokenizer has no
 * normalizer), and read as token ids: decoded whole and streamed, whose
 * text must be the same. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/utf8.h"
#include "engine/tokenizer/tokenizer.h"
#include "fuzz.h"

static struct atlas_tokenizer *tok;

static void load(void)
{
	const char *root = getenv("ATLAS_SOURCE_ROOT");
	char dir[4096], err[512];
	snprintf(dir, sizeof dir, "%s/tests/tokenizer/small/added", root ? root : ".");
	if (tok_load(dir, &tok, err, sizeof err) != 0) {
		fprintf(stderr, "fuzz: %s (set ATLAS_SOURCE_ROOT)\n", err);
		abort();
	}
}

static void free_tok(void)
{
	tok_free(tok);
}

/* The bytes as ids (two bytes each, modulo the vocabulary): decoded whole
 * and streamed, the same text. */
static void decode_ids(const uint8_t *data, size_t size, bool skip)
{
	size_t n = size / 2;
	int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
	int vocab = tok_vocab_size(tok);
	for (size_t i = 0; i < n; i++)
		ids[i] = (int32_t)((data[2 * i] | data[2 * i + 1] << 8) % vocab);
	char *whole;
	size_t len;
	if (tok_decode(tok, ids, n, skip, &whole, &len) == 0) {
		struct tok_stream s = { 0 };
		size_t cap = len + 64, m = 0;
		char *streamed = malloc(cap);
		for (size_t i = 0; i < n; i++) {
			int r = tok_stream_push(tok, &s, ids[i], skip, streamed + m, cap - m);
			if (r < 0 || (size_t)r > cap - m)
				__builtin_trap();
			m += (size_t)r;
		}
		m += (size_t)tok_stream_flush(&s, streamed + m, cap - m);
		if (m != len || memcmp(streamed, whole, len) != 0)
			__builtin_trap();
		free(streamed);
		free(whole);
	}
	free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (!tok) {
		load();
		atexit(free_tok);
	}
	int32_t *ids;
	size_t n;
	if (tok_encode(tok, (const char *)data, size, size & 1, &ids, &n) == 0) {
		char *text;
		size_t len;
		if (tok_decode(tok, ids, n, false, &text, &len) != 0)
			__builtin_trap();
		free(text);
		free(ids);
	}
	decode_ids(data, size, size & 2);
	return 0;
}
