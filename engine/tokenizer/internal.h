/* What the files of the tokenizer share: the loaded tokenizer and its tables.
 * Nothing here is visible outside engine/tokenizer/. */
#ifndef ATLAS_ENGINE_TOKENIZER_INTERNAL_H
#define ATLAS_ENGINE_TOKENIZER_INTERNAL_H

#include "engine/tokenizer/tokenizer.h"

#include <jansson.h>
#include <oniguruma.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A byte range in struct atlas_tokenizer.strs. */
struct tok_span {
	uint32_t off, len;
};

/* A growable byte buffer; spans into it stay valid when it grows. */
struct tok_arena {
	char *buf;
	size_t len, cap;
};

/* Open-addressing hash from a byte string to an id. The keys are not stored:
 * a slot holds the id, and the key is that id's text (struct atlas_tokenizer
 * .text), so one table costs 8 bytes a slot. */
struct tok_strslot {
	uint32_t hash;
	int32_t id; /* -1: empty */
};
struct tok_strmap {
	struct tok_strslot *slot; /* [mask + 1] */
	uint32_t mask;
};

/* Open-addressing hash from a pair of ids (a, b) to the merge that joins them. */
struct tok_merge {
	uint64_t key; /* a << 32 | b; TOK_NO_PAIR: empty */
	int32_t rank; /* position in the merges list: lower merges first */
	int32_t id;   /* the token a + b */
};
#define TOK_NO_PAIR UINT64_MAX
struct tok_pairmap {
	struct tok_merge *slot; /* [mask + 1] */
	uint32_t mask;
};

/* One pre-tokenizer of the pipeline. ByteLevel is always the last one. */
enum tok_pre_kind { TOK_PRE_SPLIT, TOK_PRE_BYTELEVEL };
struct tok_pre {
	enum tok_pre_kind kind;
	OnigRegex re;          /* Split: its pattern; ByteLevel: the GPT-2 pattern or NULL (use_regex false) */
	bool add_prefix_space; /* ByteLevel: prepend ' ' to a piece that lacks it */
};
#define TOK_MAX_PRE 8

/* The largest token id + 1 a tokenizer may use. The per-id tables are
 * sized by the highest id, so one absurd id in a file would otherwise ask
 * for gigabytes; published vocabularies stay under 300,000. */
#define TOK_MAX_IDS (1 << 22)

/* An added token (tokenizer.json "added_tokens"). */
struct tok_added {
	int32_t id;
	bool special, lstrip, rstrip, single_word, normalized;
	struct tok_span pat; /* what is matched: the content, NFC'd when normalized and the normalizer is NFC */
};

/* Leftmost-longest matching of a set of added tokens (those with one value of
 * `normalized`): candidates grouped by first byte, longest first. */
struct tok_matcher {
	uint32_t *order;     /* [n] indices into atlas_tokenizer.added */
	uint32_t start[257]; /* order[start[b] .. start[b + 1]) begin with byte b */
	size_t n;
};

#define TOK_TMPL_SEQ (-1) /* in atlas_tokenizer.tmpl: where the encoded text goes */

enum {
	TOK_EXISTS = 1,       /* the id names a token */
	TOK_ADDED = 2,        /* it is an added token */
	TOK_SPECIAL = 4,      /* decoding with skip_special drops it */
	TOK_SPECIAL_DEF = 8,  /* an added token marked special in tokenizer.json */
};

struct tok_chat {
	enum tok_chat_style style;
	char *default_system; /* ChatML: the system message the template inserts when none is given, or NULL */
	bool no_think;        /* ChatML: the template knows enable_thinking: answer with an empty think block */
	char *bos;            /* Llama 3: the template's bos_token text, or NULL */
	bool date_preamble;   /* Llama 3.1+: system block with knowledge and today's date, always */
	bool date_today;      /* ... today's date (strftime_now) rather than date_default */
	char date_default[32];
	int32_t eot_id;
};

struct atlas_tokenizer {
	int32_t n_ids;           /* highest id + 1 */
	uint8_t *flags;          /* [n_ids] TOK_* */
	struct tok_span *text;   /* [n_ids] the token as spelled in tokenizer.json (byte-level chars) */
	struct tok_span *bytes;  /* [n_ids] the raw bytes it decodes to */
	struct tok_arena strs;   /* storage of text and bytes */
	struct tok_strmap vocab; /* model vocabulary: text -> id */
	struct tok_strmap added_map; /* added tokens: content -> id */
	struct tok_pairmap merges;

	/* BPE model */
	int32_t byte_id[256]; /* the token of one byte, -1 if the vocabulary lacks it */
	int32_t unk_id;       /* -1: none (unknown bytes are dropped, as tokenizers does) */
	bool fuse_unk, ignore_merges;

	bool nfc; /* normalizer NFC (else none) */
	struct tok_pre pre[TOK_MAX_PRE];
	int n_pre;

	struct tok_added *added; /* [n_added] in tokenizer.json order */
	size_t n_added;
	struct tok_matcher match_raw, match_norm; /* normalized false / true */

	int32_t *tmpl; /* [n_tmpl] TemplateProcessing "single": ids and TOK_TMPL_SEQ; NULL if none */
	size_t n_tmpl;

	int32_t bos_id, eos_id; /* tokenizer_config.json, -1 if unset */
	struct tok_chat chat;
};

/* ---- tables.c: arena and hash maps ---- */
int tok_arena_put(struct tok_arena *a, const void *p, size_t n, struct tok_span *out);
uint32_t tok_hash(const void *p, size_t n);
int tok_strmap_init(struct tok_strmap *m, size_t n_keys);
/* Insert id under its text; the id already there with the same text, or -1. */
int32_t tok_strmap_put(struct tok_strmap *m, const struct atlas_tokenizer *t, int32_t id);
int32_t tok_strmap_get(const struct tok_strmap *m, const struct atlas_tokenizer *t, const char *key,
		       size_t len);
int tok_pairmap_init(struct tok_pairmap *m, size_t n_keys);
void tok_pairmap_put(struct tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id);
const struct tok_merge *tok_pairmap_get(const struct tok_pairmap *m, int32_t a, int32_t b);

/* ---- utf8.c: UTF-8 and character classes ---- */
/* Classify the bytes at s[0..n) (n >= 1): > 0, a whole character of that many
 * bytes; 0, a valid but unfinished character (all n bytes); < 0, an invalid
 * sequence of -r bytes, which from_utf8_lossy replaces by one U+FFFD. */
int tok_utf8_step(const uint8_t *s, size_t n);
bool tok_utf8_valid(const char *s, size_t n);
/* Decode the character at s (valid UTF-8); its length in *len. */
int32_t tok_utf8_cp(const char *s, size_t n, int *len);
/* The code point that ends s[0..n), or -1 if n is 0. */
int32_t tok_utf8_last_cp(const char *s, size_t n);
/* Unicode White_Space (Rust's char::is_whitespace, regex \s). */
bool tok_is_space(int32_t cp);
/* Unicode word character (regex \w: alphabetic, marks, digits, connector punctuation, joiners). */
bool tok_is_word(int32_t cp);
/* Write s with invalid sequences replaced as from_utf8_lossy does; out holds
 * at least 3 * n bytes. Returns the length written. */
size_t tok_utf8_lossy(const uint8_t *s, size_t n, char *out);
/* GPT-2's byte <-> character map of the ByteLevel pieces. */
uint16_t tok_byte_to_cp(uint8_t b);
int tok_cp_to_byte(int32_t cp); /* -1 if cp stands for no byte */

/* ---- load_model.c ---- */
/* Give id its text (and the bytes that text decodes to); marks it existing. */
int tok_set_token(struct atlas_tokenizer *t, int32_t id, const char *s, size_t n);
/* Set the bytes id decodes to from text (a span of t->strs): its characters
 * through GPT-2's byte map, or, when one of them stands for no byte, its
 * UTF-8 as it is (what the ByteLevel decoder of tokenizers does). */
int tok_set_bytes(struct atlas_tokenizer *t, int32_t id, struct tok_span text);
int tok_load_model(struct atlas_tokenizer *t, json_t *root, const char *file, char *err,
		   size_t errlen);
/* ---- load_added.c ---- */
int tok_load_added(struct atlas_tokenizer *t, json_t *root, const char *file, char *err,
		   size_t errlen);
/* ---- load_pipeline.c: normalizer, pre-tokenizer and decoder; then, once
 * the tokens are known, the post-processor ---- */
int tok_load_pipeline(struct atlas_tokenizer *t, json_t *root, const char *file, char *err,
		      size_t errlen);
int tok_load_post(struct atlas_tokenizer *t, json_t *root, const char *file, char *err,
		  size_t errlen);
void tok_free_pipeline(struct atlas_tokenizer *t);
/* ---- chat.c: tokenizer_config.json ---- */
int tok_load_config(struct atlas_tokenizer *t, const char *dir, char *err, size_t errlen);
void tok_free_config(struct atlas_tokenizer *t);

/* ---- encode ---- */
struct tok_ids {
	int32_t *v;
	size_t n, cap;
};
int tok_ids_push(struct tok_ids *ids, int32_t id);

/* Scratch space of one tok_encode call (so the tokenizer stays immutable). */
struct tok_sym {
	int32_t id;
	int32_t prev, next; /* neighbours in the word, -1 at the ends */
	uint32_t len;       /* bytes covered; 0 once merged into the left neighbour */
};
struct tok_cand { /* a possible merge of the symbol at pos and its right neighbour */
	int32_t rank, pos, id;
};
struct tok_scratch {
	struct tok_sym *sym;
	struct tok_cand *heap;
	size_t cap;        /* of sym and heap */
	char *word;        /* a word in byte-level characters (ignore_merges) */
	size_t word_cap;
	char *prefixed;    /* a piece with the space ByteLevel prepends */
	size_t prefixed_cap;
	OnigRegion *region;
};
void tok_scratch_free(struct tok_scratch *s);
/* bpe.c: the BPE model on one pre-token of raw bytes; appends its ids. */
int tok_bpe(const struct atlas_tokenizer *t, struct tok_scratch *s, const uint8_t *w, size_t n,
	    struct tok_ids *out);
/* added.c: build the matchers; split text on added tokens. */
int tok_build_matchers(struct atlas_tokenizer *t);
typedef int (*tok_piece_fn)(void *ctx, const char *s, size_t n);
/* Call piece() for the text between added tokens and push the added tokens'
 * ids to out, in order, as tokenizers' AddedVocabulary splits. */
int tok_split_added(const struct atlas_tokenizer *t, const struct tok_matcher *m, const char *s,
		    size_t n, struct tok_ids *out, tok_piece_fn piece, void *ctx);

#endif
