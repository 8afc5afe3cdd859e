/* tokenizer.json's pipeline around the model: normalizer, pre-tokenizer,
 * post-processor and decoder. Every type outside the supported set fails the
 * load with a message that names it. */
#include "engine/tokenizer/internal.h"

#include "common/err.h"
#include "common/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The pattern of the ByteLevel pre-tokenizer with use_regex (GPT-2's). */
static const char gpt2_pattern[] =
	"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static pthread_once_t onig_once = PTHREAD_ONCE_INIT;
static int onig_status;

static void onig_setup(void)
{
	OnigEncoding enc[] = { ONIG_ENCODING_UTF8 };
	onig_status = onig_initialize(enc, 1);
}

static const char *type_of(json_t *obj)
{
	json_t *type = json_object_get(obj, "type");
	return json_is_string(type) ? json_string_value(type) : "(none)";
}

static int load_normalizer(struct atlas_tokenizer *t, json_t *n, const char *file, char *err,
			   size_t errlen)
{
	if (!n || json_is_null(n))
		return 0;
	const char *type = type_of(n);
	if (strcmp(type, "NFC") == 0) {
		t->nfc = true;
		return 0;
	}
	if (strcmp(type, "Sequence") == 0) {
		json_t *list = json_object_get(n, "normalizers");
		for (size_t i = 0; i < json_array_size(list); i++) {
			int r = load_normalizer(t, json_array_get(list, i), file, err, errlen);
			if (r < 0)
				return r;
		}
		return 0;
	}
	return atlas_errf(err, errlen, -ENOTSUP,
			  "file %s: normalizer: type %s is not supported (only NFC)", file, type);
}

/* A String pattern of Split matches itself: escape what is not a letter or
 * a digit. */
static char *escape_literal(const char *s, size_t n, size_t *out_len)
{
	char *p = malloc(2 * n + 1);
	if (!p)
		return NULL;
	size_t o = 0;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		bool plain = c >= 0x80 || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
			     (c >= 'A' && c <= 'Z');
		if (!plain)
			p[o++] = '\\';
		p[o++] = (char)c;
	}
	*out_len = o;
	return p;
}

static int compile(OnigRegex *re, const char *pat, size_t len, const char *what, const char *file,
		   char *err, size_t errlen)
{
	pthread_once(&onig_once, onig_setup);
	if (onig_status != ONIG_NORMAL)
		return atlas_errf(err, errlen, -EIO, "file %s: %s: cannot initialize Oniguruma",
				  file, what);
	OnigErrorInfo einfo;
	int r = onig_new(re, (const OnigUChar *)pat, (const OnigUChar *)pat + len,
			 ONIG_OPTION_NONE, ONIG_ENCODING_UTF8, ONIG_SYNTAX_ONIGURUMA, &einfo);
	if (r != ONIG_NORMAL) {
		OnigUChar msg[ONIG_MAX_ERROR_MESSAGE_LEN];
		onig_error_code_to_str(msg, r, &einfo);
		*re = NULL;
		return atlas_errf(err, errlen, -EINVAL, "file %s: %s: bad pattern: %s", file, what,
				  (const char *)msg);
	}
	return 0;
}

static int load_split(struct atlas_tokenizer *t, json_t *p, const char *file, char *err,
		      size_t errlen)
{
	json_t *behavior = json_object_get(p, "behavior");
	if (!json_is_string(behavior) || strcmp(json_string_value(behavior), "Isolated") != 0)
		return atlas_errf(err, errlen, -ENOTSUP,
				  "file %s: pre_tokenizer: Split behavior %s is not supported (only Isolated)",
				  file, json_is_string(behavior) ? json_string_value(behavior) : "?");
	if (json_is_true(json_object_get(p, "invert")))
		return atlas_errf(err, errlen, -ENOTSUP,
				  "file %s: pre_tokenizer: Split with invert is not supported", file);
	json_t *pattern = json_object_get(p, "pattern");
	json_t *regex = json_object_get(pattern, "Regex");
	json_t *literal = json_object_get(pattern, "String");
	struct tok_pre *pre = &t->pre[t->n_pre];
	pre->kind = TOK_PRE_SPLIT;
	if (json_is_string(regex)) {
		int r = compile(&pre->re, json_string_value(regex), json_string_length(regex),
				"pre_tokenizer: Split", file, err, errlen);
		if (r < 0)
			return r;
	} else if (json_is_string(literal)) {
		size_t len;
		char *pat = escape_literal(json_string_value(literal), json_string_length(literal),
					   &len);
		if (!pat)
			return atlas_errf(err, errlen, -ENOMEM, "file %s: out of memory", file);
		int r = compile(&pre->re, pat, len, "pre_tokenizer: Split", file, err, errlen);
		free(pat);
		if (r < 0)
			return r;
	} else {
		return atlas_errf(err, errlen, -EINVAL,
				  "file %s: pre_tokenizer: Split needs a Regex or String pattern",
				  file);
	}
	t->n_pre++;
	return 0;
}

static int load_pre(struct atlas_tokenizer *t, json_t *p, const char *file, char *err,
		    size_t errlen)
{
	const char *type = type_of(p);
	if (strcmp(type, "Sequence") == 0) {
		json_t *list = json_object_get(p, "pretokenizers");
		for (size_t i = 0; i < json_array_size(list); i++) {
			int r = load_pre(t, json_array_get(list, i), file, err, errlen);
			if (r < 0)
				return r;
		}
		return 0;
	}
	if (t->n_pre == TOK_MAX_PRE)
		return atlas_errf(err, errlen, -ENOTSUP,
				  "file %s: pre_tokenizer: more than %d steps", file, TOK_MAX_PRE);
	if (t->n_pre > 0 && t->pre[t->n_pre - 1].kind == TOK_PRE_BYTELEVEL)
		return atlas_errf(err, errlen, -ENOTSUP,
				  "file %s: pre_tokenizer: %s after ByteLevel is not supported",
				  file, type);
	if (strcmp(type, "Split") == 0)
		return load_split(t, p, file, err, errlen);
	if (strcmp(type, "ByteLevel") == 0) {
		struct tok_pre *pre = &t->pre[t->n_pre];
		pre->kind = TOK_PRE_BYTELEVEL;
		pre->add_prefix_space = json_is_true(json_object_get(p, "add_prefix_space"));
		json_t *use_regex = json_object_get(p, "use_regex");
		if (!use_regex || json_is_true(use_regex)) {
			int r = compile(&pre->re, gpt2_pattern, sizeof gpt2_pattern - 1,
					"pre_tokenizer: ByteLevel", file, err, errlen);
			if (r < 0)
				return r;
		}
		t->n_pre++;
		return 0;
	}
	return atlas_errf(err, errlen, -ENOTSUP,
			  "file %s: pre_tokenizer: type %s is not supported (Split, ByteLevel, Sequence)",
			  file, type);
}

/* TemplateProcessing "single": special tokens around the sequence "A". */
static int load_template(struct atlas_tokenizer *t, json_t *p, const char *file, char *err,
			 size_t errlen)
{
	json_t *single = json_object_get(p, "single");
	json_t *specials = json_object_get(p, "special_tokens");
	if (t->tmpl)
		return atlas_errf(err, errlen, -ENOTSUP,
				  "file %s: post_processor: two TemplateProcessing steps", file);
	if (!json_is_array(single))
		return atlas_errf(err, errlen, -EINVAL,
				  "file %s: post_processor: TemplateProcessing needs \"single\"", file);
	size_t cap = 0, n_seq = 0;
	for (size_t i = 0; i < json_array_size(single); i++) {
		json_t *item = json_array_get(single, i);
		json_t *seq = json_object_get(item, "Sequence");
		const char *name = json_string_value(json_object_get(json_object_get(item, "SpecialToken"), "id"));
		json_t *ids = json_object_get(json_object_get(specials, name ?: ""), "ids");
		if (seq) {
			json_t *which = json_object_get(seq, "id");
			if (!json_is_string(which) || strcmp(json_string_value(which), "A") != 0)
				return atlas_errf(err, errlen, -ENOTSUP,
						  "file %s: post_processor: TemplateProcessing single uses a sequence other than A",
						  file);
			n_seq++;
			cap++;
		} else if (name && json_is_array(ids)) {
			cap += json_array_size(ids);
		} else {
			return atlas_errf(err, errlen, -EINVAL,
					  "file %s: post_processor: TemplateProcessing single[%zu]: no such special token",
					  file, i);
		}
	}
	if (n_seq != 1)
		return atlas_errf(err, errlen, -EINVAL,
				  "file %s: post_processor: TemplateProcessing single must hold sequence A once",
				  file);
	t->tmpl = malloc(cap * sizeof *t->tmpl);
	if (!t->tmpl)
		return atlas_errf(err, errlen, -ENOMEM, "file %s: out of memory", file);
	for (size_t i = 0; i < json_array_size(single); i++) {
		json_t *item = json_array_get(single, i);
		if (json_object_get(item, "Sequence")) {
			t->tmpl[t->n_tmpl++] = TOK_TMPL_SEQ;
			continue;
		}
		const char *name = json_string_value(json_object_get(json_object_get(item, "SpecialToken"), "id"));
		json_t *ids = json_object_get(json_object_get(specials, name), "ids");
		for (size_t k = 0; k < json_array_size(ids); k++) {
			json_t *v = json_array_get(ids, k);
			json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
			if (id < 0 || id >= t->n_ids || !(t->flags[id] & TOK_EXISTS))
				return atlas_errf(err, errlen, -EINVAL,
						  "file %s: post_processor: special token %s: id %lld names no token",
						  file, name, (long long)id);
			t->tmpl[t->n_tmpl++] = (int32_t)id;
		}
	}
	return 0;
}

static int load_post(struct atlas_tokenizer *t, json_t *p, const char *file, char *err,
		     size_t errlen)
{
	if (!p || json_is_null(p))
		return 0;
	const char *type = type_of(p);
	if (strcmp(type, "ByteLevel") == 0)
		return 0; /* it changes offsets only */
	if (strcmp(type, "TemplateProcessing") == 0)
		return load_template(t, p, file, err, errlen);
	if (strcmp(type, "Sequence") == 0) {
		json_t *list = json_object_get(p, "processors");
		for (size_t i = 0; i < json_array_size(list); i++) {
			int r = load_post(t, json_array_get(list, i), file, err, errlen);
			if (r < 0)
				return r;
		}
		return 0;
	}
	return atlas_errf(err, errlen, -ENOTSUP,
			  "file %s: post_processor: type %s is not supported (ByteLevel, TemplateProcessing)",
			  file, type);
}

int tok_load_pipeline(struct atlas_tokenizer *t, json_t *root, const char *file, char *err,
		      size_t errlen)
{
	static const char *const ignored[] = { "truncation", "padding" };
	for (size_t i = 0; i < ATLAS_ARRAY_LEN(ignored); i++) {
		json_t *v = json_object_get(root, ignored[i]);
		if (v && !json_is_null(v))
			log_warn("file %s: %s is ignored: atlas never cuts nor pads a prompt", file,
				 ignored[i]);
	}
	int r = load_normalizer(t, json_object_get(root, "normalizer"), file, err, errlen);
	if (r < 0)
		return r;
	json_t *pre = json_object_get(root, "pre_tokenizer");
	if (pre && !json_is_null(pre)) {
		r = load_pre(t, pre, file, err, errlen);
		if (r < 0)
			return r;
	}
	if (t->n_pre == 0 || t->pre[t->n_pre - 1].kind != TOK_PRE_BYTELEVEL)
		return atlas_errf(err, errlen, -ENOTSUP,
				  "file %s: pre_tokenizer: no ByteLevel step: only byte-level BPE is supported",
				  file);
	json_t *dec = json_object_get(root, "decoder");
	if (!json_is_object(dec) || strcmp(type_of(dec), "ByteLevel") != 0)
		return atlas_errf(err, errlen, -ENOTSUP,
				  "file %s: decoder: type %s is not supported (only ByteLevel)", file,
				  json_is_object(dec) ? type_of(dec) : "null");
	return 0;
}

int tok_load_post(struct atlas_tokenizer *t, json_t *root, const char *file, char *err,
		  size_t errlen)
{
	return load_post(t, json_object_get(root, "post_processor"), file, err, errlen);
}

void tok_free_pipeline(struct atlas_tokenizer *t)
{
	for (int i = 0; i < t->n_pre; i++) {
		if (t->pre[i].re)
			onig_free(t->pre[i].re);
	}
	free(t->tmpl);
}
