/* tokenizer.json "added_tokens": tokens matched in the text before the model
 * sees it (special tokens such as <|im_start|>, and plain added tokens). */
#include "engine/tokenizer/internal.h"

#include "common/err.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

static bool flag(json_t *tok, const char *key, bool dflt)
{
	json_t *v = json_object_get(tok, key);
	return json_is_boolean(v) ? json_is_true(v) : dflt;
}

/* The text that a normalized added token is matched as: its content through
 * the normalizer, as tokenizers builds its normalized trie. */
static int set_pattern(struct atlas_tokenizer *t, struct tok_added *a, const char *s, size_t n)
{
	if (!a->normalized || !t->nfc)
		return tok_arena_put(&t->strs, s, n, &a->pat);
	utf8proc_uint8_t *nfc = NULL;
	utf8proc_ssize_t len = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &nfc,
					    UTF8PROC_STABLE | UTF8PROC_COMPOSE);
	if (len < 0)
		return -EINVAL;
	int r = tok_arena_put(&t->strs, nfc, (size_t)len, &a->pat);
	free(nfc);
	return r;
}

static int load_one(struct atlas_tokenizer *t, json_t *tok, size_t i, const char *file, char *err,
		    size_t errlen)
{
	json_t *content = json_object_get(tok, "content");
	json_t *jid = json_object_get(tok, "id");
	if (!json_is_string(content) || !json_is_integer(jid) || json_integer_value(jid) < 0 ||
	    json_integer_value(jid) >= t->n_ids)
		return atlas_errf(err, errlen, -EINVAL,
				  "file %s: added_tokens[%zu]: needs a string \"content\" and an \"id\"",
				  file, i);
	const char *s = json_string_value(content);
	size_t n = json_string_length(content);
	if (n == 0)
		return 0; /* tokenizers ignores an empty added token */
	if (!tok_utf8_valid(s, n))
		return atlas_errf(err, errlen, -EINVAL, "file %s: added_tokens[%zu]: bad UTF-8",
				  file, i);
	if (tok_strmap_get(&t->added_map, t, s, n) >= 0)
		return atlas_errf(err, errlen, -EINVAL,
				  "file %s: added_tokens[%zu]: \"%s\" is listed twice", file, i, s);

	/* A content that the model knows keeps the model's id, as in tokenizers. */
	int32_t id = tok_strmap_get(&t->vocab, t, s, n);
	if (id < 0) {
		id = (int32_t)json_integer_value(jid);
		if (t->flags[id] & TOK_EXISTS)
			return atlas_errf(err, errlen, -EINVAL,
					  "file %s: added_tokens[%zu]: \"%s\": id %d is taken", file,
					  i, s, id);
		int r = tok_set_token(t, id, s, n);
		if (r < 0)
			return atlas_errf(err, errlen, r, "file %s: out of memory", file);
	}

	struct tok_added *a = &t->added[t->n_added++];
	a->id = id;
	a->special = flag(tok, "special", false);
	a->lstrip = flag(tok, "lstrip", false);
	a->rstrip = flag(tok, "rstrip", false);
	a->single_word = flag(tok, "single_word", false);
	a->normalized = flag(tok, "normalized", !a->special);
	int r = set_pattern(t, a, s, n);
	if (r < 0)
		return atlas_errf(err, errlen, r, "file %s: added_tokens[%zu]: cannot normalize", file,
				  i);
	t->flags[id] |= TOK_ADDED | (a->special ? TOK_SPECIAL_DEF : 0);
	tok_strmap_put(&t->added_map, t, id);
	return 0;
}

static bool same_text(const struct atlas_tokenizer *t, struct tok_span a, struct tok_span b)
{
	return a.len == b.len && memcmp(t->strs.buf + a.off, t->strs.buf + b.off, a.len) == 0;
}

/* tokenizers decodes a normalized added token as its normalized form (its
 * decoder inverts what the normalizer did on the way in), and decides
 * whether to skip it by looking that form up among the special tokens'
 * contents. */
static int set_decoding(struct atlas_tokenizer *t)
{
	for (size_t i = 0; i < t->n_added; i++) {
		const struct tok_added *a = &t->added[i];
		struct tok_span as = a->normalized ? a->pat : t->text[a->id];
		if (!same_text(t, as, t->text[a->id])) {
			int r = tok_set_bytes(t, a->id, as);
			if (r < 0)
				return r;
		}
		int32_t owner = tok_strmap_get(&t->added_map, t, t->strs.buf + as.off, as.len);
		if (owner >= 0 && (t->flags[owner] & TOK_SPECIAL_DEF))
			t->flags[a->id] |= TOK_SPECIAL;
	}
	return 0;
}

int tok_load_added(struct atlas_tokenizer *t, json_t *root, const char *file, char *err,
		   size_t errlen)
{
	json_t *list = json_object_get(root, "added_tokens");
	if (list && !json_is_array(list) && !json_is_null(list))
		return atlas_errf(err, errlen, -EINVAL, "file %s: added_tokens is not an array", file);
	size_t n = json_array_size(list);
	t->added = calloc(n ? n : 1, sizeof *t->added);
	int r = tok_strmap_init(&t->added_map, n);
	if (!t->added || r < 0)
		return atlas_errf(err, errlen, -ENOMEM, "file %s: out of memory", file);
	for (size_t i = 0; i < n; i++) {
		r = load_one(t, json_array_get(list, i), i, file, err, errlen);
		if (r < 0)
			return r;
	}
	r = set_decoding(t);
	if (r == 0)
		r = tok_build_matchers(t);
	if (r < 0)
		return atlas_errf(err, errlen, r, "file %s: added_tokens: out of memory", file);
	return 0;
}
