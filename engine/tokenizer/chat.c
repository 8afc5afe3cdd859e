/* tokenizer_config.json: the BOS/EOS tokens and the chat template.
 *
 * atlas does not run Jinja. It recognises the two template families it
 * serves, ChatML (Qwen) and Llama 3, and renders their turns the way Hugging
 * Face's apply_chat_template(add_generation_prompt=True) renders them, with
 * the few variations those templates carry read from the template text:
 * a default system message (Qwen2.5), enable_thinking (Qwen3: rendered as
 * enable_thinking=False, an appliance answers directly), bos_token and the
 * dated system block (Llama 3.1 and later). */
#include "engine/tokenizer/internal.h"

#include "common/err.h"
#include "common/file.h"
#include "common/log.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A token's content: "<s>", {"content": "<s>", ...} or null. */
static const char *token_content(json_t *v)
{
	if (json_is_object(v))
		v = json_object_get(v, "content");
	return json_is_string(v) ? json_string_value(v) : NULL;
}

static int32_t config_token(struct atlas_tokenizer *t, json_t *cfg, const char *key,
			    const char *file)
{
	const char *content = token_content(json_object_get(cfg, key));
	if (!content)
		return -1;
	int32_t id = tok_token_id(t, content);
	if (id < 0)
		log_warn("file %s: %s \"%s\" is not a token", file, key, content);
	return id;
}

/* chat_template: a string, or a list of named templates ("default" wins). */
static const char *pick_template(json_t *v)
{
	if (json_is_string(v))
		return json_string_value(v);
	const char *first = NULL;
	size_t i;
	json_t *item;
	json_array_foreach(v, i, item) {
		const char *name = json_string_value(json_object_get(item, "name"));
		const char *tmpl = json_string_value(json_object_get(item, "template"));
		if (tmpl && name && strcmp(name, "default") == 0)
			return tmpl;
		if (tmpl && !first)
			first = tmpl;
	}
	return first;
}

static char *read_text_file(const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return NULL;
	char *buf = NULL;
	size_t len = 0;
	FILE *mem = open_memstream(&buf, &len);
	char chunk[4096];
	size_t n;
	while (mem && (n = fread(chunk, 1, sizeof chunk, f)) > 0)
		fwrite(chunk, 1, n, mem);
	if (mem)
		fclose(mem);
	fclose(f);
	return buf;
}

/* The text of a piece of a Jinja string literal: only escapes of newline,
 * tab, backslash and quotes occur in the ones we read. */
static char *unescape(const char *s, size_t n)
{
	char *out = malloc(n + 1), *o = out;
	if (!out)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		if (s[i] == '\\' && i + 1 < n) {
			i++;
			*o++ = s[i] == 'n' ? '\n' : s[i] == 't' ? '\t' : s[i];
		} else {
			*o++ = s[i];
		}
	}
	*o = '\0';
	return out;
}

/* Qwen2 and Qwen2.5 insert a system message of their own when the
 * conversation has none: '<|im_start|>system\nYou are ...<|im_end|>\n'. */
static char *chatml_default_system(const char *tmpl)
{
	static const char marker[] = "<|im_start|>system\\n";
	for (const char *p = strstr(tmpl, marker); p; p = strstr(p + 1, marker)) {
		const char *text = p + sizeof marker - 1;
		const char *end = strstr(text, "<|im_end|>");
		if (!end || p == tmpl || (p[-1] != '\'' && p[-1] != '"'))
			continue;
		size_t n = (size_t)(end - text);
		if (n == 0 || memchr(text, p[-1], n) || memmem(text, n, "{{", 2))
			continue;
		return unescape(text, n);
	}
	return NULL;
}

/* Llama 3.1+: {%- set date_string = "26 Jul 2024" %} as the fallback date. */
static void llama_default_date(struct tok_chat *c, const char *tmpl)
{
	snprintf(c->date_default, sizeof c->date_default, "26 Jul 2024");
	const char *p = strstr(tmpl, "date_string = ");
	for (; p; p = strstr(p + 1, "date_string = ")) {
		const char *v = p + strlen("date_string = ");
		if (*v != '"' && *v != '\'')
			continue;
		const char *end = strchr(v + 1, *v);
		if (end && (size_t)(end - v - 1) < sizeof c->date_default) {
			snprintf(c->date_default, sizeof c->date_default, "%.*s",
				 (int)(end - v - 1), v + 1);
			return;
		}
	}
}

static int setup_chat(struct atlas_tokenizer *t, const char *tmpl, const char *bos)
{
	struct tok_chat *c = &t->chat;
	if (strstr(tmpl, "<|im_start|>")) {
		c->style = TOK_CHAT_CHATML;
		c->eot_id = tok_token_id(t, "<|im_end|>");
		c->no_think = strstr(tmpl, "enable_thinking") &&
			      strstr(tmpl, "<think>\\n\\n</think>\\n\\n");
		c->default_system = chatml_default_system(tmpl);
	} else if (strstr(tmpl, "<|start_header_id|>")) {
		c->style = TOK_CHAT_LLAMA3;
		c->eot_id = tok_token_id(t, "<|eot_id|>");
		if (bos && strstr(tmpl, "bos_token")) {
			c->bos = strdup(bos);
			if (!c->bos)
				return -ENOMEM;
		}
		c->date_preamble = strstr(tmpl, "Cutting Knowledge Date:") != NULL;
		c->date_today = strstr(tmpl, "strftime_now") != NULL;
		llama_default_date(c, tmpl);
	}
	return 0;
}

int tok_load_config(struct atlas_tokenizer *t, const char *dir, char *err, size_t errlen)
{
	char file[PATH_MAX];
	snprintf(file, sizeof file, "%s/tokenizer_config.json", dir);
	FILE *f = file_fopen_regular(file, err, errlen);
	if (!f)
		return errno == ENOENT ? 0 : -errno;
	json_error_t jerr;
	json_t *cfg = json_loadf(f, JSON_ALLOW_NUL, &jerr);
	fclose(f);
	if (!json_is_object(cfg)) {
		json_decref(cfg);
		return atlas_errf(err, errlen, -EINVAL, "file %s: line %d: %s", file, jerr.line,
				  cfg ? "not a JSON object" : jerr.text);
	}
	t->bos_id = config_token(t, cfg, "bos_token", file);
	t->eos_id = config_token(t, cfg, "eos_token", file);

	int r = 0;
	const char *tmpl = pick_template(json_object_get(cfg, "chat_template"));
	char *from_file = NULL;
	if (!tmpl) {
		char path[PATH_MAX];
		snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
		tmpl = from_file = read_text_file(path);
	}
	if (tmpl)
		r = setup_chat(t, tmpl, token_content(json_object_get(cfg, "bos_token")));
	free(from_file);
	json_decref(cfg);
	if (r < 0)
		return atlas_errf(err, errlen, r, "file %s: out of memory", file);
	return 0;
}

void tok_free_config(struct atlas_tokenizer *t)
{
	free(t->chat.default_system);
	free(t->chat.bos);
}

/* snprintf-style output: writes what fits, counts everything. */
struct out {
	char *buf;
	size_t cap, n;
};

static void add(struct out *o, const char *s, size_t n)
{
	if (o->n < o->cap) {
		size_t room = o->cap - o->n;
		memcpy(o->buf + o->n, s, n < room ? n : room);
	}
	o->n += n;
}

static void adds(struct out *o, const char *s)
{
	add(o, s, strlen(s));
}

/* Python's str.isspace, which Jinja's trim filter strips. */
static bool py_space(int32_t cp)
{
	return tok_is_space(cp) || (cp >= 0x1c && cp <= 0x1f);
}

/* Jinja's |trim. */
static void add_trimmed(struct out *o, const char *s, size_t n)
{
	int len;
	while (n > 0 && py_space(tok_utf8_cp(s, n, &len))) {
		s += len;
		n -= (size_t)len;
	}
	while (n > 0) {
		size_t i = n - 1;
		while (i > 0 && ((uint8_t)s[i] & 0xc0) == 0x80)
			i--;
		if (!py_space(tok_utf8_cp(s + i, n - i, &len)))
			break;
		n = i;
	}
	add(o, s, n);
}

static void chatml_turn(const struct tok_chat *c, bool first, const char *system, const char *user,
			size_t user_len, struct out *o)
{
	const char *sys = system && *system ? system : c->default_system;
	if (first && sys) {
		adds(o, "<|im_start|>system\n");
		adds(o, sys);
		adds(o, "<|im_end|>\n");
	}
	adds(o, "<|im_start|>user\n");
	add(o, user, user_len);
	adds(o, "<|im_end|>\n<|im_start|>assistant\n");
	if (c->no_think)
		adds(o, "<think>\n\n</think>\n\n");
}

static void llama3_turn(const struct tok_chat *c, bool first, const char *system, const char *user,
			size_t user_len, struct out *o)
{
	bool has_system = system && *system;
	if (first) {
		if (c->bos)
			adds(o, c->bos);
		if (c->date_preamble || has_system)
			adds(o, "<|start_header_id|>system<|end_header_id|>\n\n");
		if (c->date_preamble) {
			char date[64] = "";
			if (c->date_today) {
				time_t now = time(NULL);
				struct tm tm;
				localtime_r(&now, &tm);
				strftime(date, sizeof date, "%d %b %Y", &tm);
			} else {
				snprintf(date, sizeof date, "%s", c->date_default);
			}
			adds(o, "Cutting Knowledge Date: December 2023\nToday Date: ");
			adds(o, date);
			adds(o, "\n\n");
		}
		if (has_system)
			add_trimmed(o, system, strlen(system));
		if (c->date_preamble || has_system)
			adds(o, "<|eot_id|>");
	}
	adds(o, "<|start_header_id|>user<|end_header_id|>\n\n");
	add_trimmed(o, user, user_len);
	adds(o, "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
}

enum tok_chat_style tok_chat_style(const struct atlas_tokenizer *t)
{
	return t->chat.style;
}

int tok_chat_turn(const struct atlas_tokenizer *t, bool first, const char *system,
		  const char *user, size_t user_len, char *buf, size_t len)
{
	struct out o = { .buf = buf, .cap = len ? len - 1 : 0 };
	switch (t->chat.style) {
	case TOK_CHAT_CHATML:
		chatml_turn(&t->chat, first, system, user, user_len, &o);
		break;
	case TOK_CHAT_LLAMA3:
		llama3_turn(&t->chat, first, system, user, user_len, &o);
		break;
	default:
		return -ENOTSUP;
	}
	if (len)
		buf[o.n < o.cap ? o.n : o.cap] = '\0';
	return o.n > INT_MAX ? -EOVERFLOW : (int)o.n;
}

const char *tok_chat_close(const struct atlas_tokenizer *t, bool ended_with_eot)
{
	switch (t->chat.style) {
	case TOK_CHAT_CHATML:
		return ended_with_eot ? "\n" : "<|im_end|>\n";
	case TOK_CHAT_LLAMA3:
		return ended_with_eot ? "" : "<|eot_id|>";
	default:
		return "";
	}
}

int32_t tok_chat_eot_id(const struct atlas_tokenizer *t)
{
	return t->chat.style == TOK_CHAT_NONE ? -1 : t->chat.eot_id;
}
