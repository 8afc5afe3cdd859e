/* tok_encode: the pipeline of tokenizers' encode, in its order:
 *   1. split on added tokens that are not normalized (on the raw text);
 *   2. normalize the rest (NFC), split on the normalized added tokens;
 *   3. pre-tokenize each remaining piece (Split regexes, then ByteLevel);
 *   4. BPE on each pre-token; 5. the post-processor's template.
 * All state lives in this call's scratch, so calls may run concurrently. */
#include "engine/tokenizer/internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

struct enc {
	const struct atlas_tokenizer *t;
	struct tok_scratch s;
	struct tok_ids *out;
};

static int run_pre(struct enc *e, int stage, const char *s, size_t n);

/* tokenizers' Split with behavior Isolated: the matches and the text between
 * them are pieces. Empty matches follow the onig crate's find_iter: one right
 * after a match is skipped and the search moves on by a character. */
static int regex_split(struct enc *e, OnigRegex re, int next, const char *s, size_t n)
{
	const OnigUChar *str = (const OnigUChar *)s, *end = str + n;
	size_t prev = 0, from = 0, last_match_end = 0;
	bool have_match = false;
	int r;

	if (!e->s.region) {
		e->s.region = onig_region_new();
		if (!e->s.region)
			return -ENOMEM;
	}
	while (from <= n) {
		OnigRegion *reg = e->s.region;
		int pos = onig_search(re, str, end, str + from, end, reg, ONIG_OPTION_NONE);
		if (pos == ONIG_MISMATCH)
			break;
		if (pos < 0)
			return -ERANGE; /* Oniguruma gave up (its retry limits) */
		size_t ms = (size_t)reg->beg[0], me = (size_t)reg->end[0];
		if (ms == me && have_match && last_match_end == me) {
			int len = 1;
			if (from < n)
				tok_utf8_cp(s + from, n - from, &len);
			from += (size_t)len;
			continue;
		}
		from = me;
		have_match = true;
		last_match_end = me;
		if (prev < ms) {
			r = run_pre(e, next, s + prev, ms - prev);
			if (r < 0)
				return r;
		}
		r = run_pre(e, next, s + ms, me - ms);
		if (r < 0)
			return r;
		prev = me;
	}
	return prev < n ? run_pre(e, next, s + prev, n - prev) : 0;
}

/* ByteLevel's add_prefix_space: a piece that does not start with a space
 * gets one. */
static const char *prefix_space(struct tok_scratch *s, const char *p, size_t *n)
{
	if (*n + 1 > s->prefixed_cap) {
		char *buf = realloc(s->prefixed, 2 * (*n + 1));
		if (!buf)
			return NULL;
		s->prefixed = buf;
		s->prefixed_cap = 2 * (*n + 1);
	}
	s->prefixed[0] = ' ';
	memcpy(s->prefixed + 1, p, *n);
	++*n;
	return s->prefixed;
}

static int run_pre(struct enc *e, int stage, const char *s, size_t n)
{
	const struct atlas_tokenizer *t = e->t;
	if (n == 0)
		return 0; /* tokenizers drops empty pieces */
	if (stage == t->n_pre)
		return tok_bpe(t, &e->s, (const uint8_t *)s, n, e->out);
	const struct tok_pre *p = &t->pre[stage];
	if (p->kind == TOK_PRE_BYTELEVEL && p->add_prefix_space && s[0] != ' ') {
		s = prefix_space(&e->s, s, &n);
		if (!s)
			return -ENOMEM;
	}
	if (p->re)
		return regex_split(e, p->re, stage + 1, s, n);
	return run_pre(e, stage + 1, s, n);
}

static int on_normalized_piece(void *ctx, const char *s, size_t n)
{
	return run_pre(ctx, 0, s, n);
}

static bool is_ascii(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if ((uint8_t)s[i] >= 0x80)
			return false;
	}
	return true;
}

static int on_raw_piece(void *ctx, const char *s, size_t n)
{
	struct enc *e = ctx;
	const struct atlas_tokenizer *t = e->t;
	if (!t->nfc || is_ascii(s, n)) /* ASCII is its own NFC */
		return tok_split_added(t, &t->match_norm, s, n, e->out, on_normalized_piece, e);
	utf8proc_uint8_t *nfc = NULL;
	utf8proc_ssize_t len = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &nfc,
					    UTF8PROC_STABLE | UTF8PROC_COMPOSE);
	if (len < 0)
		return len == UTF8PROC_ERROR_NOMEM ? -ENOMEM : -EINVAL;
	int r = tok_split_added(t, &t->match_norm, (const char *)nfc, (size_t)len, e->out,
				on_normalized_piece, e);
	free(nfc);
	return r;
}

static int encode_text(struct enc *e, const char *text, size_t len)
{
	return tok_split_added(e->t, &e->t->match_raw, text, len, e->out, on_raw_piece, e);
}

int tok_encode(const struct atlas_tokenizer *t, const char *text, size_t len, bool add_special,
	       int32_t **ids, size_t *n)
{
	*ids = NULL;
	*n = 0;
	if (!tok_utf8_valid(text, len))
		return -EINVAL;
	struct tok_ids out = { 0 };
	struct enc e = { .t = t, .out = &out };
	int r = 0;
	if (add_special && t->tmpl) {
		for (size_t i = 0; i < t->n_tmpl && r == 0; i++) {
			if (t->tmpl[i] == TOK_TMPL_SEQ)
				r = encode_text(&e, text, len);
			else
				r = tok_ids_push(&out, t->tmpl[i]);
		}
	} else {
		r = encode_text(&e, text, len);
	}
	if (r == 0 && !out.v) {
		out.v = malloc(sizeof *out.v); /* something to free even for no ids */
		if (!out.v)
			r = -ENOMEM;
	}
	tok_scratch_free(&e.s);
	if (r < 0) {
		free(out.v);
		return r;
	}
	*ids = out.v;
	*n = out.n;
	return 0;
}
