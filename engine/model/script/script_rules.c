/* The scripted family's rules (script.h): which token comes after a
 * context. Host code on token ids only; it allocates nothing, so that it
 * can run inside the forward pass. */
#include "engine/model/script/script.h"

#include <stdbool.h>
#include <string.h>

enum script_kind { PLAIN, SLEEP, FAIL, SLOW };

/* The open answer of a context: where it starts and the question it answers. */
struct open_answer {
	int start;                      /* first token after the opener */
	int q0, q1;                     /* the question: ctx[q0..q1) */
	int32_t end;                    /* the token that ends this answer */
};

static bool is_end(int32_t t)
{
	return t == SCRIPT_EOS || t == SCRIPT_IM_END;
}

static bool is_byte(int32_t t)
{
	return t >= 0 && t < 256;
}

/* Whether ctx[i..n) starts with <|im_start|> and the bytes of role. */
static bool header_at(const int32_t *ctx, int n, int i, const char *role)
{
	int len = (int)strlen(role);
	if (ctx[i] != SCRIPT_IM_START || n - i - 1 < len)
		return false;
	for (int k = 0; k < len; k++)
		if (ctx[i + 1 + k] != (unsigned char)role[k])
			return false;
	return true;
}

/* The user text of the ChatML turn whose assistant header is at h. */
static void chat_question(const int32_t *ctx, int h, struct open_answer *a)
{
	static const char user[] = "user\n";
	int u = h - 1;
	while (u >= 0 && !header_at(ctx, h, u, user))
		u--;
	a->q0 = u < 0 ? h : u + 1 + (int)strlen(user);
	a->q1 = a->q0;
	while (a->q1 < h && ctx[a->q1] != SCRIPT_IM_END)
		a->q1++;
}

/* Find the answer being written: scanning back from the end, an opener
 * before any end token. */
static bool find_answer(const int32_t *ctx, int n, struct open_answer *a)
{
	static const char assistant[] = "assistant\n";
	for (int i = n - 1; i >= 0; i--) {
		if (is_end(ctx[i]))
			return false;
		if (ctx[i] == SCRIPT_ANSWER) {
			a->start = i + 1;
			a->end = SCRIPT_EOS;
			a->q1 = i;
			a->q0 = i;
			while (a->q0 > 0 && !is_end(ctx[a->q0 - 1]))
				a->q0--;
			return true;
		}
		if (header_at(ctx, n, i, assistant)) {
			a->start = i + 1 + (int)strlen(assistant);
			a->end = SCRIPT_IM_END;
			chat_question(ctx, i, a);
			return true;
		}
	}
	return false;
}

/* Whether ctx[*i..end) starts with the bytes of word; if so, skip them. */
static bool take(const int32_t *ctx, int *i, int end, const char *word)
{
	int len = (int)strlen(word);
	if (end - *i < len)
		return false;
	for (int k = 0; k < len; k++)
		if (ctx[*i + k] != (unsigned char)word[k])
			return false;
	*i += len;
	return true;
}

/* The script word at the start of the question ctx[*i..end): its kind, and
 * *i moved to its TEXT. A malformed word leaves the question plain. */
static enum script_kind script_word(const int32_t *ctx, int *i, int end, unsigned *ms)
{
	int p = *i;
	if (take(ctx, &p, end, "FAIL ")) {
		*i = p;
		return FAIL;
	}
	if (take(ctx, &p, end, "SLOW ")) {
		*i = p;
		return SLOW;
	}
	if (!take(ctx, &p, end, "SLEEP "))
		return PLAIN;
	unsigned v = 0;
	int digits = 0;
	for (; p < end && ctx[p] >= '0' && ctx[p] <= '9' && v <= SCRIPT_SLEEP_MAX_MS; p++, digits++)
		v = v * 10 + (unsigned)(ctx[p] - '0');
	if (!digits || v > SCRIPT_SLEEP_MAX_MS || !take(ctx, &p, end, " "))
		return PLAIN;
	*ms = v;
	*i = p;
	return SLEEP;
}

/* Byte k of the bytes of t[0..n) reversed character by character, -1 past
 * the end. A character is a byte and the continuation bytes after it;
 * special tokens are not text and are left out. */
static int reversed_byte(const int32_t *t, int n, int k)
{
	int e = n;
	while (e > 0) {
		if (!is_byte(t[e - 1])) {
			e--;
			continue;
		}
		int s = e - 1;
		while (s > 0 && is_byte(t[s - 1]) && (t[s] & 0xC0) == 0x80)
			s--;
		if (k < e - s)
			return t[s + k];
		k -= e - s;
		e = s;
	}
	return -1;
}

void script_next(const int32_t *ctx, int n, struct script_next *out)
{
	struct open_answer a;
	out->sleep_ms = 0;
	if (!find_answer(ctx, n, &a)) {
		out->token = SCRIPT_ANSWER;
		return;
	}
	while (a.q1 > a.q0 && (ctx[a.q1 - 1] == '\n' || ctx[a.q1 - 1] == '\r'))
		a.q1--;
	int text = a.q0;
	unsigned ms = 0;
	enum script_kind kind = script_word(ctx, &text, a.q1, &ms);
	int b = reversed_byte(ctx + text, a.q1 - text, n - a.start);
	if (kind == SLEEP)
		out->sleep_ms = ms;
	if (b >= 0) {
		out->token = b;
	} else if (kind == FAIL) {
		out->token = -1;
	} else if (kind == SLOW) {
		out->token = SCRIPT_WAIT;
		out->sleep_ms = SCRIPT_WAIT_MS;
	} else {
		out->token = a.end;
	}
}
