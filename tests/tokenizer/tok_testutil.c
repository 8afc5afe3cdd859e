#include "tok_testutil.h"

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utf8proc.h>

static char *join(const char *env, const char *fallback, const char *rel)
{
	const char *root = getenv(env);
	char *p = NULL;
	if (asprintf(&p, "%s/%s", root ? root : fallback, rel) < 0)
		abort();
	return p;
}

char *tt_source_path(const char *rel)
{
	return join("ATLAS_SOURCE_ROOT", ".", rel);
}

char *tt_build_path(const char *rel)
{
	return join("ATLAS_BUILD_ROOT", ".", rel);
}

bool tt_exists(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0;
}

char *tt_tmpdir(void)
{
	char *dir = strdup("/tmp/atlas-tok-XXXXXX");
	if (!dir || !mkdtemp(dir))
		abort();
	return dir;
}

void tt_rmdir(char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	while (d && (e = readdir(d))) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		char *p = NULL;
		if (asprintf(&p, "%s/%s", dir, e->d_name) >= 0)
			unlink(p);
		free(p);
	}
	if (d)
		closedir(d);
	rmdir(dir);
	free(dir);
}

void tt_write(const char *dir, const char *name, const char *text)
{
	char *p = NULL;
	if (asprintf(&p, "%s/%s", dir, name) < 0)
		abort();
	FILE *f = fopen(p, "w");
	if (!f)
		abort();
	fputs(text, f);
	fclose(f);
	free(p);
}

void tt_write_json(const char *dir, const char *name, json_t *obj)
{
	char *text = json_dumps(obj, JSON_COMPACT);
	if (!text)
		abort();
	tt_write(dir, name, text);
	free(text);
	json_decref(obj);
}

/* GPT-2 keeps printable Latin-1 bytes as themselves and numbers the other 68
 * from U+0100 upwards, in byte order. */
void tt_byte_char(uint8_t b, char out[3])
{
	unsigned cp = b, k = 0;
	bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
	if (!printable) {
		for (unsigned c = 0; c < b; c++) {
			bool p = (c >= '!' && c <= '~') || (c >= 0xa1 && c <= 0xac) || c >= 0xae;
			k += !p;
		}
		cp = 256 + k;
	}
	if (cp < 0x80) {
		out[0] = (char)cp;
		out[1] = 0;
	} else {
		out[0] = (char)(0xc0 | cp >> 6);
		out[1] = (char)(0x80 | (cp & 0x3f));
		out[2] = 0;
	}
}

char *tt_byte_level(const char *raw)
{
	size_t n = strlen(raw);
	char *out = calloc(2 * n + 1, 1);
	if (!out)
		abort();
	for (size_t i = 0; i < n; i++) {
		char c[3];
		tt_byte_char((uint8_t)raw[i], c);
		strcat(out, c);
	}
	return out;
}

static void add_merge(json_t *vocab, json_t *merges, bool as_strings, const char *a, const char *b)
{
	char *la = tt_byte_level(a), *lb = tt_byte_level(b);
	char *joined = NULL;
	if (asprintf(&joined, "%s%s", la, lb) < 0)
		abort();
	json_object_set_new(vocab, joined, json_integer(256 + (json_int_t)json_array_size(merges)));
	if (as_strings) {
		char *m = NULL;
		if (asprintf(&m, "%s %s", la, lb) < 0)
			abort();
		json_array_append_new(merges, json_string(m));
		free(m);
	} else {
		json_array_append_new(merges, json_pack("[ss]", la, lb));
	}
	free(la);
	free(lb);
	free(joined);
}

static json_t *added_token(int id, const char *content, bool special)
{
	return json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", id, "content", content,
			 "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", !special,
			 "special", special);
}

json_t *tt_tiny_json(const struct tt_tiny *opt)
{
	json_t *vocab = json_object(), *merges = json_array();
	for (int b = 0; b < 256; b++) {
		char c[3];
		tt_byte_char((uint8_t)b, c);
		json_object_set_new(vocab, c, json_integer(b));
	}
	bool s = opt->merges_as_strings;
	add_merge(vocab, merges, s, "h", "e");
	add_merge(vocab, merges, s, "l", "l");
	add_merge(vocab, merges, s, "he", "ll");
	add_merge(vocab, merges, s, "hell", "o");
	add_merge(vocab, merges, s, " ", "w");
	add_merge(vocab, merges, s, "\xc3", "\xa9");
	add_merge(vocab, merges, s, "\xf0", "\x9f");
	add_merge(vocab, merges, s, "\x98", "\x80");
	add_merge(vocab, merges, s, "\xf0\x9f", "\x98\x80");
	if (opt->extra_vocab)
		json_object_update(vocab, opt->extra_vocab);
	json_decref(opt->extra_vocab);

	json_t *added = json_array();
	json_array_append_new(added, added_token(TT_END, "<|end|>", true));
	json_array_append_new(added, added_token(TT_BOS, "<s>", true));
	if (opt->extra_added)
		json_array_extend(added, opt->extra_added);
	json_decref(opt->extra_added);

	json_t *byte_level = json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel",
				       "add_prefix_space", opt->prefix_space, "trim_offsets", 0,
				       "use_regex", opt->gpt2_regex);
	json_t *pre = byte_level;
	if (!opt->gpt2_regex)
		pre = json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, o]}", "type", "Sequence",
				"pretokenizers", "type", "Split", "pattern", "Regex",
				" ?\\p{L}+| ?\\p{N}| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
				"behavior", "Isolated", "invert", 0, byte_level);
	json_t *post = json_pack("{s:s}", "type", "ByteLevel");
	if (opt->bos_template) {
		json_decref(post);
		post = json_pack("{s:s, s:[{s:{s:s, s:i}}, {s:{s:s, s:i}}], s:{s:{s:s, s:[i], s:[s]}}}",
				 "type", "TemplateProcessing", "single", "SpecialToken", "id", "<s>",
				 "type_id", 0, "Sequence", "id", "A", "type_id", 0, "special_tokens",
				 "<s>", "id", "<s>", "ids", TT_BOS, "tokens", "<s>");
	}
	json_t *model = json_pack("{s:s, s:n, s:n, s:s, s:s, s:b, s:b, s:b, s:o, s:o}", "type",
				  "BPE", "dropout", "unk_token", "continuing_subword_prefix", "",
				  "end_of_word_suffix", "", "fuse_unk", 0, "byte_fallback", 0,
				  "ignore_merges", opt->ignore_merges, "vocab", vocab, "merges",
				  merges);
	return json_pack("{s:s, s:n, s:n, s:o, s:o, s:o, s:o, s:{s:s}, s:o}", "version", "1.0",
			 "truncation", "padding", "added_tokens", added, "normalizer",
			 opt->nfc ? json_pack("{s:s}", "type", "NFC") : json_null(),
			 "pre_tokenizer", pre, "post_processor", post, "decoder", "type",
			 "ByteLevel", "model", model);
}

struct atlas_tokenizer *tt_tiny_load(const struct tt_tiny *opt, const char *config_json,
				     char **dir)
{
	*dir = tt_tmpdir();
	tt_write_json(*dir, "tokenizer.json", tt_tiny_json(opt));
	if (config_json)
		tt_write(*dir, "tokenizer_config.json", config_json);
	struct atlas_tokenizer *t = NULL;
	char err[512];
	if (tok_load(*dir, &t, err, sizeof err) < 0) {
		fprintf(stderr, "tiny tokenizer: %s\n", err);
		return NULL;
	}
	return t;
}

json_t *tt_encode(const struct atlas_tokenizer *t, const char *text, size_t len, bool special)
{
	int32_t *ids;
	size_t n;
	if (tok_encode(t, text, len, special, &ids, &n) < 0)
		return NULL;
	json_t *arr = json_array();
	for (size_t i = 0; i < n; i++)
		json_array_append_new(arr, json_integer(ids[i]));
	free(ids);
	return arr;
}

bool tt_ids_equal(json_t *got, const int32_t *want, size_t n)
{
	if (!got || json_array_size(got) != n)
		return false;
	for (size_t i = 0; i < n; i++) {
		if (json_integer_value(json_array_get(got, i)) != want[i])
			return false;
	}
	return true;
}

void tt_print_ids(const char *what, json_t *ids)
{
	char *s = ids ? json_dumps(ids, JSON_COMPACT) : NULL;
	fprintf(stderr, "%s: %s\n", what, s ? s : "(error)");
	free(s);
}

bool tt_utf8_valid(const char *s, size_t n)
{
	utf8proc_ssize_t i = 0;
	while ((size_t)i < n) {
		utf8proc_int32_t cp;
		utf8proc_ssize_t r = utf8proc_iterate((const utf8proc_uint8_t *)s + i,
						      (utf8proc_ssize_t)n - i, &cp);
		if (r <= 0)
			return false;
		i += r;
	}
	return true;
}

char *tt_nfc(const char *s, size_t n, size_t *out_len)
{
	utf8proc_uint8_t *out = NULL;
	utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &out,
					  UTF8PROC_STABLE | UTF8PROC_COMPOSE);
	if (r < 0)
		return NULL;
	*out_len = (size_t)r;
	return (char *)out;
}
