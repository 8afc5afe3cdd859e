/* tokenizer.json "model": a BPE vocabulary and its merges. */
#include "engine/tokenizer/internal.h"

#include "common/err.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int tok_set_bytes(struct atlas_tokenizer *t, int32_t id, struct tok_span text)
{
	char small[256];
	char *buf = text.len <= sizeof small ? small : malloc(text.len);
	if (!buf)
		return -ENOMEM;
	size_t n = 0, i = 0;
	bool mapped = true;
	while (i < text.len) {
		int len;
		int32_t cp = tok_utf8_cp(t->strs.buf + text.off + i, text.len - i, &len);
		int b = tok_cp_to_byte(cp);
		if (b < 0) {
			mapped = false;
			break;
		}
		buf[n++] = (char)b;
		i += (size_t)len;
	}
	int r = 0;
	if (!mapped || (n == text.len && memcmp(buf, t->strs.buf + text.off, n) == 0))
		t->bytes[id] = text; /* the same bytes: share them */
	else
		r = tok_arena_put(&t->strs, buf, n, &t->bytes[id]);
	if (buf != small)
		free(buf);
	return r;
}

/* Give id its text, as a model token or an added token. */
int tok_set_token(struct atlas_tokenizer *t, int32_t id, const char *s, size_t n)
{
	int r = tok_arena_put(&t->strs, s, n, &t->text[id]);
	if (r < 0)
		return r;
	t->flags[id] |= TOK_EXISTS;
	return tok_set_bytes(t, id, t->text[id]);
}

static int check_options(json_t *model, const char *file, char *err, size_t errlen)
{
	json_t *v = json_object_get(model, "dropout");
	if (v && !json_is_null(v) && !(json_is_number(v) && json_number_value(v) == 0))
		return atlas_errf(err, errlen, -ENOTSUP, "file %s: model: BPE dropout is not supported",
				  file);
	v = json_object_get(model, "byte_fallback");
	if (v && json_is_true(v))
		return atlas_errf(err, errlen, -ENOTSUP,
				  "file %s: model: BPE byte_fallback is not supported", file);
	static const char *const affixes[] = { "continuing_subword_prefix", "end_of_word_suffix" };
	for (size_t i = 0; i < ATLAS_ARRAY_LEN(affixes); i++) {
		v = json_object_get(model, affixes[i]);
		if (v && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0))
			return atlas_errf(err, errlen, -ENOTSUP,
					  "file %s: model: BPE %s is not supported", file,
					  affixes[i]);
	}
	return 0;
}

static int load_vocab(struct atlas_tokenizer *t, json_t *vocab, const char *file, char *err,
		      size_t errlen)
{
	int r = tok_strmap_init(&t->vocab, json_object_size(vocab));
	if (r < 0)
		return atlas_errf(err, errlen, r, "file %s: model.vocab: out of memory", file);
	void *it;
	for (it = json_object_iter(vocab); it; it = json_object_iter_next(vocab, it)) {
		const char *key = json_object_iter_key(it);
		size_t key_len = json_object_iter_key_len(it);
		json_t *v = json_object_iter_value(it);
		json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
		if (id < 0 || id >= t->n_ids)
			return atlas_errf(err, errlen, -EINVAL,
					  "file %s: model.vocab: token \"%s\" has no valid id", file,
					  key);
		if (t->flags[id] & TOK_EXISTS)
			return atlas_errf(err, errlen, -EINVAL,
					  "file %s: model.vocab: id %lld is given twice", file,
					  (long long)id);
		r = tok_set_token(t, (int32_t)id, key, key_len);
		if (r < 0)
			return atlas_errf(err, errlen, r, "file %s: model.vocab: out of memory", file);
		tok_strmap_put(&t->vocab, t, (int32_t)id);
	}
	return 0;
}

/* One merge: "a b" (the older spelling) or ["a", "b"]. */
static int merge_parts(json_t *m, const char **a, size_t *na, const char **b, size_t *nb)
{
	if (json_is_string(m)) {
		const char *s = json_string_value(m);
		size_t n = json_string_length(m);
		const char *sp = memchr(s, ' ', n);
		if (!sp)
			return -EINVAL;
		*a = s;
		*na = (size_t)(sp - s);
		*b = sp + 1;
		*nb = n - *na - 1;
		return 0;
	}
	if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
	    json_is_string(json_array_get(m, 1))) {
		*a = json_string_value(json_array_get(m, 0));
		*na = json_string_length(json_array_get(m, 0));
		*b = json_string_value(json_array_get(m, 1));
		*nb = json_string_length(json_array_get(m, 1));
		return 0;
	}
	return -EINVAL;
}

static int load_merges(struct atlas_tokenizer *t, json_t *merges, const char *file, char *err,
		       size_t errlen)
{
	size_t n = json_array_size(merges);
	if (n > INT32_MAX)
		return atlas_errf(err, errlen, -E2BIG, "file %s: model.merges: too many", file);
	int r = tok_pairmap_init(&t->merges, n);
	if (r < 0)
		return atlas_errf(err, errlen, r, "file %s: model.merges: out of memory", file);
	char *joined = NULL;
	size_t joined_cap = 0;
	for (size_t i = 0; i < n; i++) {
		const char *a, *b;
		size_t na, nb;
		if (merge_parts(json_array_get(merges, i), &a, &na, &b, &nb) < 0) {
			r = atlas_errf(err, errlen, -EINVAL,
				       "file %s: model.merges[%zu]: not \"a b\" nor [\"a\", \"b\"]",
				       file, i);
			break;
		}
		if (na + nb > joined_cap) {
			joined_cap = 2 * (na + nb);
			char *p = realloc(joined, joined_cap);
			if (!p) {
				r = atlas_errf(err, errlen, -ENOMEM, "file %s: out of memory", file);
				break;
			}
			joined = p;
		}
		memcpy(joined, a, na);
		memcpy(joined + na, b, nb);
		int32_t ia = tok_strmap_get(&t->vocab, t, a, na);
		int32_t ib = tok_strmap_get(&t->vocab, t, b, nb);
		int32_t ij = tok_strmap_get(&t->vocab, t, joined, na + nb);
		if (ia < 0 || ib < 0 || ij < 0) {
			r = atlas_errf(err, errlen, -EINVAL,
				       "file %s: model.merges[%zu]: \"%.*s\" + \"%.*s\": a token that is not in the vocabulary",
				       file, i, (int)na, a, (int)nb, b);
			break;
		}
		tok_pairmap_put(&t->merges, ia, ib, (int32_t)i, ij);
	}
	free(joined);
	return r;
}

int tok_load_model(struct atlas_tokenizer *t, json_t *root, const char *file, char *err,
		   size_t errlen)
{
	json_t *model = json_object_get(root, "model");
	if (!json_is_object(model))
		return atlas_errf(err, errlen, -EINVAL, "file %s: no \"model\" object", file);
	json_t *type = json_object_get(model, "type");
	if (type && (!json_is_string(type) || strcmp(json_string_value(type), "BPE") != 0))
		return atlas_errf(err, errlen, -ENOTSUP,
				  "file %s: model: type %s is not supported (only BPE)", file,
				  json_is_string(type) ? json_string_value(type) : "?");
	json_t *vocab = json_object_get(model, "vocab");
	json_t *merges = json_object_get(model, "merges");
	if (!json_is_object(vocab) || (merges && !json_is_array(merges)))
		return atlas_errf(err, errlen, -EINVAL,
				  "file %s: model: BPE needs a \"vocab\" object and a \"merges\" array",
				  file);
	int r = check_options(model, file, err, errlen);
	if (r < 0)
		return r;
	t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
	t->fuse_unk = json_is_true(json_object_get(model, "fuse_unk"));

	r = load_vocab(t, vocab, file, err, errlen);
	if (r < 0)
		return r;
	r = load_merges(t, merges, file, err, errlen); /* none: a vocabulary of whole words */
	if (r < 0)
		return r;

	for (int b = 0; b < 256; b++) {
		char ch[2];
		uint16_t cp = tok_byte_to_cp((uint8_t)b);
		size_t n = 1;
		if (cp < 0x80) {
			ch[0] = (char)cp;
		} else {
			ch[0] = (char)(0xc0 | cp >> 6);
			ch[1] = (char)(0x80 | (cp & 0x3f));
			n = 2;
		}
		t->byte_id[b] = tok_strmap_get(&t->vocab, t, ch, n);
	}

	t->unk_id = -1;
	json_t *unk = json_object_get(model, "unk_token");
	if (unk && !json_is_null(unk)) {
		if (json_is_string(unk))
			t->unk_id = tok_strmap_get(&t->vocab, t, json_string_value(unk),
						   json_string_length(unk));
		if (t->unk_id < 0)
			return atlas_errf(err, errlen, -EINVAL,
					  "file %s: model: unk_token is not in the vocabulary", file);
	}
	return 0;
}
