/* Hugging Face `tokenizer.json` byte-level BPE, equal to the `tokenizers`
 * library id for id, plus the chat template of `tokenizer_config.json`.
 *
 * Supported pipeline pieces (anything else fails loading with a message that
 * names the piece): normalizer NFC or none; pre-tokenizers Split (regex,
 * Isolated), ByteLevel (with or without its own regex) and Sequence of these;
 * model BPE (merges as "a b" strings or [a, b] pairs, ignore_merges);
 * added tokens (special or not, lstrip/rstrip/single_word/normalized); post
 * processors ByteLevel and TemplateProcessing (single); decoder ByteLevel.
 *
 * The struct is immutable after loading: every function is thread-safe.
 */
#ifndef ATLAS_ENGINE_TOKENIZER_H
#define ATLAS_ENGINE_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct atlas_tokenizer;

/* Load dir/tokenizer.json and, if present, dir/tokenizer_config.json.
 * -ENOENT if dir has no tokenizer.json (the caller may then work with ids). */
int tok_load(const char *dir, struct atlas_tokenizer **out, char *err, size_t errlen);
void tok_free(struct atlas_tokenizer *t);

int tok_vocab_size(const struct atlas_tokenizer *t);  /* highest id + 1, added tokens included */

/* Encode UTF-8 text. add_special applies the post-processor (e.g. a BOS
 * token), as `encode(text, add_special_tokens=True)` does. *ids is malloc'd.
 * -EINVAL for text that is not valid UTF-8. */
int tok_encode(const struct atlas_tokenizer *t, const char *text, size_t len, bool add_special,
	       int32_t **ids, size_t *n);

/* Decode ids to text (malloc'd, NUL-terminated), as `decode(ids,
 * skip_special_tokens=skip_special)`. Invalid UTF-8 that byte-level tokens
 * can form decodes to U+FFFD as in `tokenizers`. -EINVAL for an unknown id. */
int tok_decode(const struct atlas_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
	       char **text, size_t *len);

/* The raw bytes one token stands for (byte-level undone; an added token's
 * content). Returns the byte count (may exceed len: nothing then written
 * past len), -EINVAL for an unknown id. */
int tok_token_bytes(const struct atlas_tokenizer *t, int32_t id, char *buf, size_t len);

/* Id of a token given its exact content ("<|im_end|>"), -1 if none. */
int32_t tok_token_id(const struct atlas_tokenizer *t, const char *content);
bool tok_is_special(const struct atlas_tokenizer *t, int32_t id);

/* Token ids from tokenizer_config.json (bos_token, eos_token), -1 if unset. */
int32_t tok_bos_id(const struct atlas_tokenizer *t);
int32_t tok_eos_id(const struct atlas_tokenizer *t);

/* ---- streaming decode: bytes out only in whole UTF-8 characters ---- */

struct tok_stream {
	char pending[8];   /* bytes of an unfinished character */
	int n_pending;
};
/* Append the text of token `id` to out (capacity cap) and return the number of
 * bytes written: the complete characters so far; an unfinished character stays
 * in s->pending. Bytes that can never form a character become U+FFFD.
 * skip_special: special tokens produce nothing. */
int tok_stream_push(const struct atlas_tokenizer *t, struct tok_stream *s, int32_t id,
		    bool skip_special, char *out, size_t cap);
/* At end of stream: what is pending, as U+FFFD. */
int tok_stream_flush(struct tok_stream *s, char *out, size_t cap);

/* ---- chat template ---- */

enum tok_chat_style {
	TOK_CHAT_NONE,    /* no chat template */
	TOK_CHAT_CHATML,  /* <|im_start|>role\n...<|im_end|>\n (Qwen) */
	TOK_CHAT_LLAMA3,  /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
};
enum tok_chat_style tok_chat_style(const struct atlas_tokenizer *t);

/* The text of one chat turn, ready to encode (special tokens appear as their
 * content and are matched as added tokens): with `first`, the system message
 * (if system is non-empty) and any prefix the template starts with; then the
 * user message and the header that opens the assistant's answer. Returns the
 * length written (snprintf semantics), -ENOTSUP for TOK_CHAT_NONE. */
int tok_chat_turn(const struct atlas_tokenizer *t, bool first, const char *system,
		  const char *user, size_t user_len, char *buf, size_t len);
/* The text that closes the assistant's answer in the context, so that the next
 * turn follows the template: after the end-of-turn token was generated, what
 * the template puts after it ("\n" for ChatML); after an answer that ended
 * otherwise (length, stop string, cancel), the whole close ("<|im_end|>\n"). */
const char *tok_chat_close(const struct atlas_tokenizer *t, bool ended_with_eot);
/* The token that ends an assistant's answer in this template, -1 if none. */
int32_t tok_chat_eot_id(const struct atlas_tokenizer *t);

#endif
