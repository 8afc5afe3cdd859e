/* Prompt lookup (ngram.h): the index of a context's n-grams and drafting
 * from the newest earlier occurrence of its last n tokens. */
#include "engine/spec/ngram.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

/* The first table: entries for about 1k positions of three lengths. */
#define NGRAM_MIN_CAP 4096u

struct ngram_entry_view {
	uint32_t end;               /* the n-gram is tokens[end - n, end) */
	int n;
};

static uint32_t entry_of(uint32_t end, int n)
{
	return (uint32_t)n << 27 | (end + 1);
}

static struct ngram_entry_view view(uint32_t v)
{
	return (struct ngram_entry_view){ .end = (v & ((1u << 27) - 1)) - 1, .n = (int)(v >> 27) };
}

void ngram_init(struct ngram_index *x, int min_n, int max_n)
{
	memset(x, 0, sizeof *x);
	x->min_n = min_n;
	x->max_n = max_n;
}

void ngram_free(struct ngram_index *x)
{
	free(x->ends);
	x->ends = NULL;
	x->cap = x->used = 0;
	x->indexed = 0;
}

void ngram_reset(struct ngram_index *x)
{
	if (x->cap)
		memset(x->ends, 0, (size_t)x->cap * sizeof *x->ends);
	x->used = 0;
	x->indexed = 0;
}

static uint64_t hash(const int32_t *tokens, uint32_t end, int n)
{
	return XXH3_64bits_withSeed(tokens + end - n, (size_t)n * sizeof *tokens, (uint64_t)n);
}

static bool same(const int32_t *tokens, uint32_t a, uint32_t b, int n)
{
	return !memcmp(tokens + a - n, tokens + b - n, (size_t)n * sizeof *tokens);
}

/* Put (n, end) in table t of cap entries, replacing an older end of the
 * same n-gram; whether it took a new entry. */
static bool put(uint32_t *t, uint32_t cap, const int32_t *tokens, uint32_t end, int n)
{
	for (uint32_t i = (uint32_t)hash(tokens, end, n) & (cap - 1);; i = (i + 1) & (cap - 1)) {
		if (!t[i]) {
			t[i] = entry_of(end, n);
			return true;
		}
		const struct ngram_entry_view v = view(t[i]);
		if (v.n == n && same(tokens, v.end, end, n)) {
			t[i] = entry_of(end, n);
			return false;
		}
	}
}

static int grow(struct ngram_index *x, const int32_t *tokens)
{
	const uint32_t cap = x->cap ? 2 * x->cap : NGRAM_MIN_CAP;
	uint32_t *t = calloc(cap, sizeof *t);
	if (!t)
		return -ENOMEM;
	for (uint32_t i = 0; i < x->cap; i++)
		if (x->ends[i]) {
			const struct ngram_entry_view v = view(x->ends[i]);
			put(t, cap, tokens, v.end, v.n);
		}
	free(x->ends);
	x->ends = t;
	x->cap = cap;
	return 0;
}

/* The newest end before n_tokens of the n-gram that ends at n_tokens, or -1. */
static long find(const struct ngram_index *x, const int32_t *tokens, uint32_t n_tokens, int n)
{
	const uint32_t mask = x->cap - 1;
	for (uint32_t i = (uint32_t)hash(tokens, n_tokens, n) & mask; x->ends[i];
	     i = (i + 1) & mask) {
		const struct ngram_entry_view v = view(x->ends[i]);
		if (v.n == n && same(tokens, v.end, n_tokens, n))
			return v.end;
	}
	return -1;
}

int ngram_propose(struct ngram_index *x, const int32_t *tokens, size_t n, int k, int32_t *out)
{
	/* Positions fit the entry's 27 bits; contexts of 128M tokens draft nothing. */
	if (n >= (1u << 27) - 1 || k <= 0)
		return 0;
	if (n <= x->indexed)
		ngram_reset(x);
	for (size_t e = x->indexed + 1; e < n; e++)
		for (int g = x->min_n; g <= x->max_n && (size_t)g <= e; g++) {
			if (2 * (x->used + 1) > x->cap) {
				int rc = grow(x, tokens);
				if (rc)
					return rc;
			}
			x->used += put(x->ends, x->cap, tokens, (uint32_t)e, g);
		}
	if (n > x->indexed + 1)
		x->indexed = n - 1;
	if (!x->cap)
		return 0;
	for (int g = x->max_n; g >= x->min_n; g--) {
		if ((size_t)g > n)
			continue;
		const long end = find(x, tokens, (uint32_t)n, g);
		if (end < 0)
			continue;
		/* Continue from the drafts themselves past the context's end. */
		for (int j = 0; j < k; j++) {
			const size_t src = (size_t)end + (size_t)j;
			out[j] = src < n ? tokens[src] : out[src - n];
		}
		return k;
	}
	return 0;
}
