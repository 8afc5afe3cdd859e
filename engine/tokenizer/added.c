/* Splitting text on added tokens, as tokenizers' AddedVocabulary does: the
 * leftmost-longest match wins (Aho-Corasick's LeftmostLongest), matches do not
 * overlap, and a match's single_word/lstrip/rstrip options then decide
 * whether it counts and how much whitespace it swallows. */
#include "engine/tokenizer/internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static int by_first_byte_then_longest(const void *pa, const void *pb, void *ctx)
{
	const struct atlas_tokenizer *t = ctx;
	const struct tok_added *a = &t->added[*(const uint32_t *)pa];
	const struct tok_added *b = &t->added[*(const uint32_t *)pb];
	uint8_t fa = (uint8_t)t->strs.buf[a->pat.off];
	uint8_t fb = (uint8_t)t->strs.buf[b->pat.off];
	if (fa != fb)
		return fa < fb ? -1 : 1;
	if (a->pat.len != b->pat.len)
		return a->pat.len > b->pat.len ? -1 : 1;
	return 0;
}

static int build(struct atlas_tokenizer *t, struct tok_matcher *m, bool normalized)
{
	m->order = malloc((t->n_added ? t->n_added : 1) * sizeof *m->order);
	if (!m->order)
		return -ENOMEM;
	m->n = 0;
	for (size_t i = 0; i < t->n_added; i++) {
		if (t->added[i].normalized == normalized && t->added[i].pat.len > 0)
			m->order[m->n++] = (uint32_t)i;
	}
	qsort_r(m->order, m->n, sizeof *m->order, by_first_byte_then_longest, t);
	size_t k = 0;
	for (unsigned b = 0; b < 256; b++) {
		m->start[b] = (uint32_t)k;
		while (k < m->n && (uint8_t)t->strs.buf[t->added[m->order[k]].pat.off] == b)
			k++;
	}
	m->start[256] = (uint32_t)m->n;
	return 0;
}

int tok_build_matchers(struct atlas_tokenizer *t)
{
	int r = build(t, &t->match_raw, false);
	return r < 0 ? r : build(t, &t->match_norm, true);
}

/* The leftmost, then longest, added token in s[from..n): its index in
 * t->added, or -1; its start in *at. */
static int find(const struct atlas_tokenizer *t, const struct tok_matcher *m, const char *s,
		size_t n, size_t from, size_t *at)
{
	for (size_t i = from; i < n; i++) {
		uint8_t b = (uint8_t)s[i];
		for (uint32_t k = m->start[b]; k < m->start[b + 1]; k++) {
			const struct tok_added *a = &t->added[m->order[k]];
			if (a->pat.len <= n - i &&
			    memcmp(s + i, t->strs.buf + a->pat.off, a->pat.len) == 0) {
				*at = i;
				return (int)m->order[k];
			}
		}
	}
	return -1;
}

/* Where the whitespace that ends s[0..n) begins. */
static size_t trailing_space_start(const char *s, size_t n)
{
	while (n > 0) {
		size_t i = n - 1;
		while (i > 0 && ((uint8_t)s[i] & 0xc0) == 0x80)
			i--;
		int len;
		if (!tok_is_space(tok_utf8_cp(s + i, n - i, &len)))
			break;
		n = i;
	}
	return n;
}

/* How many bytes of whitespace begin s[0..n). */
static size_t leading_space_len(const char *s, size_t n)
{
	size_t i = 0;
	while (i < n) {
		int len;
		if (!tok_is_space(tok_utf8_cp(s + i, n - i, &len)))
			break;
		i += (size_t)len;
	}
	return i;
}

static bool is_single_word(const char *s, size_t n, size_t start, size_t stop)
{
	int len;
	bool word_before = start > 0 && tok_is_word(tok_utf8_last_cp(s, start));
	bool word_after = stop < n && tok_is_word(tok_utf8_cp(s + stop, n - stop, &len));
	return !word_before && !word_after;
}

int tok_split_added(const struct atlas_tokenizer *t, const struct tok_matcher *m, const char *s,
		    size_t n, struct tok_ids *out, tok_piece_fn piece, void *ctx)
{
	size_t done = 0; /* s[0..done) is handed out */
	size_t from = 0; /* where the matcher goes on: after the last match */
	int r;

	for (;;) {
		size_t start;
		int k = m->n ? find(t, m, s, n, from, &start) : -1;
		if (k < 0)
			break;
		const struct tok_added *a = &t->added[k];
		size_t stop = start + a->pat.len;
		from = stop;
		if (a->single_word && !is_single_word(s, n, start, stop))
			continue;
		if (a->lstrip) {
			size_t ws = trailing_space_start(s, start);
			start = ws > done ? ws : done;
		}
		if (a->rstrip)
			stop += leading_space_len(s + stop, n - stop);
		if (done < start) {
			r = piece(ctx, s + done, start - done);
			if (r < 0)
				return r;
		}
		r = tok_ids_push(out, a->id);
		if (r < 0)
			return r;
		done = stop;
	}
	if (done < n)
		return piece(ctx, s + done, n - done);
	return 0;
}
