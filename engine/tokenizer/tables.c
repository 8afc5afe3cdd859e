/* The tokenizer's storage: one string arena and two open-addressing hash
 * tables (vocabulary text -> id, id pair -> merge), sized at load time and
 * read-only afterwards. */
#include "engine/tokenizer/internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int tok_arena_put(struct tok_arena *a, const void *p, size_t n, struct tok_span *out)
{
	if (a->len + n > UINT32_MAX)
		return -E2BIG;
	/* an empty first string allocates too: spans then always point into a
	 * buffer, and buf + off is never arithmetic on NULL */
	if (a->len + n > a->cap || !a->buf) {
		size_t cap = a->cap ? a->cap : 4096;
		while (cap < a->len + n)
			cap *= 2;
		char *buf = realloc(a->buf, cap);
		if (!buf)
			return -ENOMEM;
		a->buf = buf;
		a->cap = cap;
	}
	if (n)
		memcpy(a->buf + a->len, p, n);
	out->off = (uint32_t)a->len;
	out->len = (uint32_t)n;
	a->len += n;
	return 0;
}

/* FNV-1a, then a final mix so that the low bits (the slot index) depend on
 * every byte. */
uint32_t tok_hash(const void *p, size_t n)
{
	const uint8_t *s = p;
	uint32_t h = 2166136261u;
	for (size_t i = 0; i < n; i++) {
		h ^= s[i];
		h *= 16777619u;
	}
	h ^= h >> 16;
	h *= 0x7feb352du;
	h ^= h >> 15;
	return h;
}

static uint32_t table_size(size_t n_keys)
{
	uint32_t size = 16;
	while (size < n_keys * 2)
		size *= 2;
	return size;
}

int tok_strmap_init(struct tok_strmap *m, size_t n_keys)
{
	uint32_t size = table_size(n_keys);
	m->slot = malloc(size * sizeof *m->slot);
	if (!m->slot)
		return -ENOMEM;
	for (uint32_t i = 0; i < size; i++)
		m->slot[i].id = -1;
	m->mask = size - 1;
	return 0;
}

static bool text_is(const struct atlas_tokenizer *t, int32_t id, const char *key, size_t len)
{
	const struct tok_span *sp = &t->text[id];
	return sp->len == len && memcmp(t->strs.buf + sp->off, key, len) == 0;
}

int32_t tok_strmap_put(struct tok_strmap *m, const struct atlas_tokenizer *t, int32_t id)
{
	const char *key = t->strs.buf + t->text[id].off;
	size_t len = t->text[id].len;
	uint32_t h = tok_hash(key, len);
	for (uint32_t i = h & m->mask;; i = (i + 1) & m->mask) {
		struct tok_strslot *s = &m->slot[i];
		if (s->id < 0) {
			s->hash = h;
			s->id = id;
			return -1;
		}
		if (s->hash == h && text_is(t, s->id, key, len))
			return s->id;
	}
}

int32_t tok_strmap_get(const struct tok_strmap *m, const struct atlas_tokenizer *t, const char *key,
		       size_t len)
{
	if (!m->slot)
		return -1;
	uint32_t h = tok_hash(key, len);
	for (uint32_t i = h & m->mask;; i = (i + 1) & m->mask) {
		const struct tok_strslot *s = &m->slot[i];
		if (s->id < 0)
			return -1;
		if (s->hash == h && text_is(t, s->id, key, len))
			return s->id;
	}
}

int tok_pairmap_init(struct tok_pairmap *m, size_t n_keys)
{
	uint32_t size = table_size(n_keys);
	m->slot = malloc(size * sizeof *m->slot);
	if (!m->slot)
		return -ENOMEM;
	for (uint32_t i = 0; i < size; i++)
		m->slot[i].key = TOK_NO_PAIR;
	m->mask = size - 1;
	return 0;
}

static uint32_t pair_hash(uint64_t key)
{
	key ^= key >> 33;
	key *= 0xff51afd7ed558ccdull;
	key ^= key >> 33;
	return (uint32_t)key;
}

/* A pair listed twice keeps the later rank, as the HashMap that tokenizers
 * collects the merges into does. */
void tok_pairmap_put(struct tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id)
{
	uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
	for (uint32_t i = pair_hash(key) & m->mask;; i = (i + 1) & m->mask) {
		struct tok_merge *s = &m->slot[i];
		if (s->key == TOK_NO_PAIR || s->key == key) {
			s->key = key;
			s->rank = rank;
			s->id = id;
			return;
		}
	}
}

const struct tok_merge *tok_pairmap_get(const struct tok_pairmap *m, int32_t a, int32_t b)
{
	uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
	for (uint32_t i = pair_hash(key) & m->mask;; i = (i + 1) & m->mask) {
		const struct tok_merge *s = &m->slot[i];
		if (s->key == key)
			return s;
		if (s->key == TOK_NO_PAIR)
			return NULL;
	}
}
