/* The fake engine's scripts (what a prompt makes a turn do) and the range
 * check of its session settings; their text form is the engine's own
 * (engine/api_text.c). */
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
