/* Fuzz target: tokenizer.json through tok_load (the file is written to a
 * scratch directory; no tokenizer_config.json). A tokenizer it accepts
 * must encode and decode a fixed text and every id without faults. */
#include <stdlib.h>

#include "engine/tokenizer/tokenizer.h"
#include "fuzz.h"

static const char text[] = "Hello, world! <|im_end|> caf\xc3\xa9 123 \xe2\x82\xac\n\t  end";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char dir[600], err[512];
	struct atlas_tokenizer *t;
	if (fuzz_write("tokenizer.json", data, size) != 0)
		return 0;
	if (tok_load(fuzz_path("", dir, sizeof dir), &t, err, sizeof err) != 0)
		return 0;
	int32_t *ids;
	size_t n, len;
	char *out;
	if (tok_encode(t, text, sizeof text - 1, true, &ids, &n) == 0) {
		if (tok_decode(t, ids, n, false, &out, &len) == 0)
			free(out);
		free(ids);
	}
	int vocab = tok_vocab_size(t);
	for (int32_t id = 0; id < vocab && id < 4096; id++) {
		char buf[64];
		tok_token_bytes(t, id, buf, sizeof buf);
		if (tok_decode(t, &id, 1, true, &out, &len) == 0)
			free(out);
	}
	tok_free(t);
	return 0;
}
