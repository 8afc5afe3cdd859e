/* The fake engine's scripts (what a prompt makes a turn do) and its session
 * settings: atlas_params_parse/format with the escapes engine.h describes. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "fake_engine.h"

static bool utf8_valid(const char *s, size_t n)
{
	for (size_t i = 0; i < n;) {
		unsigned char c = (unsigned char)s[i];
		size_t k = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 :
			   (c & 0xF8) == 0xF0 ? 4 : 0;
		if (!k || i + k > n)
			return false;
		for (size_t j = 1; j < k; j++)
			if (((unsigned char)s[i + j] & 0xC0) != 0x80)
				return false;
		i += k;
	}
	return true;
}

/* dst = src reversed character by character. */
static void reverse_utf8(char *dst, const char *src, size_t n)
{
	size_t i = 0;
	while (i < n) {
		size_t k = 1;
		while (i + k < n && ((unsigned char)src[i + k] & 0xC0) == 0x80)
			k++;
		memcpy(dst + n - i - k, src + i, k);
		i += k;
	}
}

static bool take_word(const char **p, size_t *n, const char *word)
{
	size_t w = strlen(word);
	if (*n < w + 1 || strncmp(*p, word, w) != 0 || (*p)[w] != ' ')
		return false;
	*p += w + 1;
	*n -= w + 1;
	return true;
}

int fake_script(struct turn *t, const char *text, size_t len, char *err, size_t errlen)
{
	if (!utf8_valid(text, len))
		return atlas_errf(err, errlen, -EINVAL, "the prompt is not UTF-8");
	t->prompt = malloc(len + 1);
	if (!t->prompt)
		return -ENOMEM;
	memcpy(t->prompt, text, len);
	t->prompt_len = len;
	const char *p = text;
	size_t n = len;
	if (n && p[n - 1] == '\n')
		n--;
	if (take_word(&p, &n, "SLEEP")) {
		char *end;
		unsigned long ms = strtoul(p, &end, 10);
		if (end == p || *end != ' ' || ms > 10000) {
			free(t->prompt);
			return atlas_errf(err, errlen, -EINVAL, "SLEEP wants milliseconds");
		}
		t->delay_ms = (unsigned)ms;
		n -= (size_t)(end + 1 - p);
		p = end + 1;
	} else if (take_word(&p, &n, "FAIL")) {
		t->fail = true;
	} else if (take_word(&p, &n, "SLOW")) {
		t->hang = true;
	}
	t->text = malloc(n + 1);
	if (!t->text) {
		free(t->prompt);
		return -ENOMEM;
	}
	reverse_utf8(t->text, p, n);
	t->text_len = n;
	return 0;
}

int fake_params_validate(const struct atlas_params *p, char *err, size_t errlen)
{
	if (!(p->temperature >= 0 && p->temperature <= 10))
		return atlas_errf(err, errlen, -EINVAL, "temperature: out of 0..10");
	if (!(p->top_p > 0 && p->top_p <= 1))
		return atlas_errf(err, errlen, -EINVAL, "top_p: out of (0, 1]");
	if (p->top_k < 0 || p->max_tokens < 1)
		return atlas_errf(err, errlen, -EINVAL, "top_k or max_tokens out of range");
	return 0;
}

static int unescape(const char *in, char *out, size_t cap)
{
	size_t n = 0;
	for (; *in; in++) {
		char c = *in;
		if (c == '\\') {
			c = *++in;
			c = c == 'n' ? '\n' : c == 't' ? '\t' : c == '\\' ? '\\' : 0;
			if (!c)
				return -EINVAL;
		}
		if (n + 1 >= cap)
			return -E2BIG;
		out[n++] = c;
	}
	out[n] = 0;
	return 0;
}

static size_t escape(const char *in, char *out, size_t cap)
{
	size_t n = 0;
	for (; *in && n + 3 < cap; in++) {
		const char *e = *in == '\n' ? "\\n" : *in == '\t' ? "\\t" : *in == '\\' ? "\\\\" : NULL;
		if (e) {
			memcpy(out + n, e, 2);
			n += 2;
		} else {
			out[n++] = *in;
		}
	}
	out[n] = 0;
	return n;
}

static int number(const char *key, const char *v, double lo, double hi, double *out, char *err,
		  size_t errlen)
{
	char *end;
	errno = 0;
	double x = strtod(v, &end);
	if (!*v || *end || errno || x < lo || x > hi)
		return atlas_errf(err, errlen, -EINVAL, "%s: bad value '%s'", key, v);
	*out = x;
	return 0;
}

int atlas_params_parse(struct atlas_params *p, const char *key, const char *value,
		       bool *stop_seen, char *err, size_t errlen)
{
	double x;
	int rc = 0;
	if (!strcmp(key, "temperature")) {
		if (!(rc = number(key, value, 0, 10, &x, err, errlen)))
			p->temperature = (float)x;
	} else if (!strcmp(key, "top_p")) {
		if (!(rc = number(key, value, 1e-9, 1, &x, err, errlen)))
			p->top_p = (float)x;
	} else if (!strcmp(key, "top_k")) {
		if (!(rc = number(key, value, 0, 1 << 30, &x, err, errlen)))
			p->top_k = (int)x;
	} else if (!strcmp(key, "max_tokens")) {
		if (!(rc = number(key, value, 1, 1 << 30, &x, err, errlen)))
			p->max_tokens = (int)x;
	} else if (!strcmp(key, "seed")) {
		if (!(rc = number(key, value, 0, 1e18, &x, err, errlen)))
			p->seed = (uint64_t)x;
	} else if (!strcmp(key, "mode")) {
		if (!strcmp(value, "chat") || !strcmp(value, "raw"))
			p->mode = value[0] == 'c' ? ATLAS_MODE_CHAT : ATLAS_MODE_RAW;
		else
			rc = atlas_errf(err, errlen, -EINVAL, "mode: '%s' is not chat or raw", value);
	} else if (!strcmp(key, "system")) {
		if (unescape(value, p->system, sizeof p->system))
			rc = atlas_errf(err, errlen, -EINVAL, "system: bad value");
	} else if (!strcmp(key, "stop")) {
		if (stop_seen && !*stop_seen) {
			p->n_stop = 0;
			*stop_seen = true;
		}
		if (*value && p->n_stop >= ATLAS_STOP_MAX)
			rc = atlas_errf(err, errlen, -EINVAL, "stop: too many");
		else if (*value && unescape(value, p->stop[p->n_stop], ATLAS_STOP_LEN))
			rc = atlas_errf(err, errlen, -EINVAL, "stop: bad value");
		else if (*value)
			p->n_stop++;
	} else {
		rc = atlas_errf(err, errlen, -EINVAL, "unknown setting '%s'", key);
	}
	return rc;
}

size_t atlas_params_format(const struct atlas_params *p, char *buf, size_t len)
{
	char esc[2 * ATLAS_SYSTEM_MAX];
	size_t n = 0;
#define OUT(...) \
	n += (size_t)snprintf(buf + ATLAS_MIN(n, len), len - ATLAS_MIN(n, len), __VA_ARGS__)
	OUT("temperature %g\n", (double)p->temperature);
	OUT("top_p %g\n", (double)p->top_p);
	OUT("top_k %d\n", p->top_k);
	OUT("max_tokens %d\n", p->max_tokens);
	OUT("seed %" PRIu64 "\n", p->seed);
	OUT("mode %s\n", p->mode == ATLAS_MODE_CHAT ? "chat" : "raw");
	if (!p->n_stop)
		OUT("stop\n");
	for (int i = 0; i < p->n_stop; i++) {
		escape(p->stop[i], esc, sizeof esc);
		OUT("stop %s\n", esc);
	}
	escape(p->system, esc, sizeof esc);
	OUT(*esc ? "system %s\n" : "system\n", esc);
#undef OUT
	return n;
}
