/* The BPE model on one pre-token: start from one symbol per byte, then apply
 * the lowest-ranked merge among adjacent pairs (leftmost first on a tie) until
 * none applies, as tokenizers' Word::merge_all does. A binary heap of
 * candidate pairs keeps a long word at O(n log n); a stale candidate (one of
 * its symbols changed since) is recognised and dropped when popped. */
#include "engine/tokenizer/internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int tok_ids_push(struct tok_ids *ids, int32_t id)
{
	if (ids->n == ids->cap) {
		size_t cap = ids->cap ? 2 * ids->cap : 64;
		int32_t *v = realloc(ids->v, cap * sizeof *v);
		if (!v)
			return -ENOMEM;
		ids->v = v;
		ids->cap = cap;
	}
	ids->v[ids->n++] = id;
	return 0;
}

void tok_scratch_free(struct tok_scratch *s)
{
	free(s->sym);
	free(s->heap);
	free(s->word);
	free(s->prefixed);
	if (s->region)
		onig_region_free(s->region, 1);
	memset(s, 0, sizeof *s);
}

static int reserve(struct tok_scratch *s, size_t n)
{
	if (n <= s->cap)
		return 0;
	size_t cap = n < 256 ? 256 : 2 * n;
	struct tok_sym *sym = realloc(s->sym, cap * sizeof *sym);
	if (sym)
		s->sym = sym;
	/* Each merge pushes at most two candidates: 3n bounds the heap. */
	struct tok_cand *heap = realloc(s->heap, 3 * cap * sizeof *heap);
	if (heap)
		s->heap = heap;
	if (!sym || !heap)
		return -ENOMEM;
	s->cap = cap;
	return 0;
}

static bool before(const struct tok_cand *a, const struct tok_cand *b)
{
	return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(struct tok_cand *h, size_t *n, struct tok_cand c)
{
	size_t i = (*n)++;
	while (i > 0) {
		size_t parent = (i - 1) / 2;
		if (!before(&c, &h[parent]))
			break;
		h[i] = h[parent];
		i = parent;
	}
	h[i] = c;
}

static struct tok_cand heap_pop(struct tok_cand *h, size_t *n)
{
	struct tok_cand top = h[0], last = h[--*n];
	size_t i = 0;
	for (;;) {
		size_t child = 2 * i + 1;
		if (child >= *n)
			break;
		if (child + 1 < *n && before(&h[child + 1], &h[child]))
			child++;
		if (!before(&h[child], &last))
			break;
		h[i] = h[child];
		i = child;
	}
	if (*n)
		h[i] = last;
	return top;
}

static void push_pair(const struct atlas_tokenizer *t, struct tok_scratch *s, size_t *nh,
		      int32_t pos, int32_t a, int32_t b)
{
	const struct tok_merge *m = tok_pairmap_get(&t->merges, a, b);
	if (m)
		heap_push(s->heap, nh, (struct tok_cand){ .rank = m->rank, .pos = pos, .id = m->id });
}

/* ignore_merges: a word that is a token as a whole is that token. */
static int32_t whole_word(const struct atlas_tokenizer *t, struct tok_scratch *s,
			  const uint8_t *w, size_t n)
{
	if (2 * n > s->word_cap) {
		char *p = realloc(s->word, 2 * n);
		if (!p)
			return -ENOMEM;
		s->word = p;
		s->word_cap = 2 * n;
	}
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		uint16_t cp = tok_byte_to_cp(w[i]);
		if (cp < 0x80) {
			s->word[k++] = (char)cp;
		} else {
			s->word[k++] = (char)(0xc0 | cp >> 6);
			s->word[k++] = (char)(0x80 | (cp & 0x3f));
		}
	}
	return tok_strmap_get(&t->vocab, t, s->word, k);
}

/* One symbol per byte. A byte the vocabulary lacks becomes the unknown token
 * (runs of them fused into one with fuse_unk) or, with none, is dropped. */
static int32_t initial_symbols(const struct atlas_tokenizer *t, struct tok_sym *sym,
			       const uint8_t *w, size_t n)
{
	int32_t ns = 0;
	bool prev_unk = false;
	for (size_t i = 0; i < n; i++) {
		int32_t id = t->byte_id[w[i]];
		bool unk = id < 0;
		if (unk) {
			if (t->unk_id < 0)
				continue;
			if (t->fuse_unk && prev_unk) {
				sym[ns - 1].len++;
				continue;
			}
			id = t->unk_id;
		}
		prev_unk = unk;
		sym[ns] = (struct tok_sym){ .id = id, .prev = ns - 1, .next = ns + 1, .len = 1 };
		ns++;
	}
	if (ns)
		sym[ns - 1].next = -1;
	return ns;
}

int tok_bpe(const struct atlas_tokenizer *t, struct tok_scratch *s, const uint8_t *w, size_t n,
	    struct tok_ids *out)
{
	if (t->ignore_merges) {
		int32_t id = whole_word(t, s, w, n);
		if (id == -ENOMEM)
			return id;
		if (id >= 0)
			return tok_ids_push(out, id);
	}
	if (reserve(s, n) < 0)
		return -ENOMEM;
	struct tok_sym *sym = s->sym;
	int32_t ns = initial_symbols(t, sym, w, n);
	size_t nh = 0;
	for (int32_t i = 0; i + 1 < ns; i++)
		push_pair(t, s, &nh, i, sym[i].id, sym[i + 1].id);

	while (nh) {
		struct tok_cand c = heap_pop(s->heap, &nh);
		struct tok_sym *left = &sym[c.pos];
		if (left->len == 0 || left->next < 0)
			continue;
		struct tok_sym *right = &sym[left->next];
		const struct tok_merge *m = tok_pairmap_get(&t->merges, left->id, right->id);
		if (!m || m->id != c.id)
			continue; /* stale: a symbol of the pair has changed */
		left->id = c.id;
		left->len += right->len;
		left->next = right->next;
		right->len = 0;
		if (left->next >= 0)
			sym[left->next].prev = c.pos;
		if (left->prev >= 0)
			push_pair(t, s, &nh, left->prev, sym[left->prev].id, left->id);
		if (left->next >= 0)
			push_pair(t, s, &nh, c.pos, left->id, sym[left->next].id);
	}

	for (int32_t i = ns ? 0 : -1; i >= 0; i = sym[i].next) {
		int r = tok_ids_push(out, sym[i].id);
		if (r < 0)
			return r;
	}
	return 0;
}
