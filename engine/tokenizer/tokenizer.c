/* Loading a tokenizer directory, and the lookups of the public API. */
#include "engine/tokenizer/internal.h"

#include "common/err.h"
#include "common/file.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

/* Highest id + 1 over the model's vocabulary and the added tokens. */
static int count_ids(json_t *root, const char *file, int32_t *n_ids, char *err, size_t errlen)
{
	json_int_t max = -1;
	json_t *vocab = json_object_get(json_object_get(root, "model"), "vocab");
	const char *key;
	json_t *v;
	json_object_foreach(vocab, key, v) {
		if (json_is_integer(v) && json_integer_value(v) > max)
			max = json_integer_value(v);
	}
	size_t i;
	json_array_foreach(json_object_get(root, "added_tokens"), i, v) {
		json_t *id = json_object_get(v, "id");
		if (json_is_integer(id) && json_integer_value(id) > max)
			max = json_integer_value(id);
	}
	if (max < 0)
		return atlas_errf(err, errlen, -EINVAL, "file %s: no usable vocabulary", file);
	if (max >= TOK_MAX_IDS)
		return atlas_errf(err, errlen, -EINVAL,
				  "file %s: token id %lld is past the largest atlas takes (%d)", file,
				  (long long)max, TOK_MAX_IDS - 1);
	*n_ids = (int32_t)(max + 1);
	return 0;
}

static int load_json(struct atlas_tokenizer *t, json_t *root, const char *file, char *err,
		     size_t errlen)
{
	if (!json_is_object(root))
		return atlas_errf(err, errlen, -EINVAL, "file %s: not a JSON object", file);
	int r = count_ids(root, file, &t->n_ids, err, errlen);
	if (r < 0)
		return r;
	t->flags = calloc((size_t)t->n_ids, sizeof *t->flags);
	t->text = calloc((size_t)t->n_ids, sizeof *t->text);
	t->bytes = calloc((size_t)t->n_ids, sizeof *t->bytes);
	if (!t->flags || !t->text || !t->bytes)
		return atlas_errf(err, errlen, -ENOMEM, "file %s: out of memory", file);
	/* The normalizer comes first: normalized added tokens are matched in
	 * normalized form. The post-processor comes last: it names tokens. */
	r = tok_load_pipeline(t, root, file, err, errlen);
	if (r == 0)
		r = tok_load_model(t, root, file, err, errlen);
	if (r == 0)
		r = tok_load_added(t, root, file, err, errlen);
	if (r == 0)
		r = tok_load_post(t, root, file, err, errlen);
	return r;
}

int tok_load(const char *dir, struct atlas_tokenizer **out, char *err, size_t errlen)
{
	char file[PATH_MAX];
	struct stat st;

	*out = NULL;
	if (snprintf(file, sizeof file, "%s/tokenizer.json", dir) >= (int)sizeof file)
		return atlas_errf(err, errlen, -ENAMETOOLONG, "%s: path too long", dir);
	if (stat(file, &st) < 0)
		return atlas_errf(err, errlen, -errno, "file %s: %s", file, strerror(errno));

	/* A stdio stream, not json_loadfd: that reads one byte a read(2), 11
	 * million calls for Qwen3's tokenizer.json, seconds where system
	 * calls are slow (a virtual machine's). */
	json_error_t jerr;
	FILE *fp = file_fopen_regular(file, err, errlen);
	if (!fp)
		return -errno;
	json_t *root = json_loadf(fp, JSON_ALLOW_NUL, &jerr);
	fclose(fp);
	if (!root)
		return atlas_errf(err, errlen, -EINVAL, "file %s: line %d: %s", file, jerr.line,
				  jerr.text);
	struct atlas_tokenizer *t = calloc(1, sizeof *t);
	if (!t) {
		json_decref(root);
		return atlas_errf(err, errlen, -ENOMEM, "file %s: out of memory", file);
	}
	t->bos_id = t->eos_id = -1;
	t->chat.eot_id = -1;
	int r = load_json(t, root, file, err, errlen);
	json_decref(root);
	if (r == 0)
		r = tok_load_config(t, dir, err, errlen);
	if (r < 0) {
		tok_free(t);
		return r;
	}
	*out = t;
	return 0;
}

void tok_free(struct atlas_tokenizer *t)
{
	if (!t)
		return;
	tok_free_pipeline(t);
	tok_free_config(t);
	free(t->match_raw.order);
	free(t->match_norm.order);
	free(t->added);
	free(t->merges.slot);
	free(t->added_map.slot);
	free(t->vocab.slot);
	free(t->strs.buf);
	free(t->bytes);
	free(t->text);
	free(t->flags);
	free(t);
}

int tok_vocab_size(const struct atlas_tokenizer *t)
{
	return t->n_ids;
}

int32_t tok_token_id(const struct atlas_tokenizer *t, const char *content)
{
	size_t n = strlen(content);
	int32_t id = tok_strmap_get(&t->added_map, t, content, n);
	return id >= 0 ? id : tok_strmap_get(&t->vocab, t, content, n);
}

bool tok_is_special(const struct atlas_tokenizer *t, int32_t id)
{
	return id >= 0 && id < t->n_ids && (t->flags[id] & TOK_SPECIAL);
}

int32_t tok_bos_id(const struct atlas_tokenizer *t)
{
	return t->bos_id;
}

int32_t tok_eos_id(const struct atlas_tokenizer *t)
{
	return t->eos_id;
}
