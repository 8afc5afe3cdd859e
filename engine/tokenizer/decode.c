/* Ids back to text: whole (tok_decode, as tokenizers' ByteLevel decoder and
 * String::from_utf8_lossy) or as a stream that only ever hands out whole
 * characters (tok_stream_push). */
#include "engine/tokenizer/internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static bool known(const struct atlas_tokenizer *t, int32_t id)
{
	return id >= 0 && id < t->n_ids && (t->flags[id] & TOK_EXISTS);
}

static bool skipped(const struct atlas_tokenizer *t, int32_t id, bool skip_special)
{
	return skip_special && (t->flags[id] & TOK_SPECIAL);
}

int tok_decode(const struct atlas_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
	       char **text, size_t *len)
{
	size_t total = 0;
	*text = NULL;
	*len = 0;
	for (size_t i = 0; i < n; i++) {
		if (!known(t, ids[i]))
			return -EINVAL;
		if (!skipped(t, ids[i], skip_special))
			total += t->bytes[ids[i]].len;
	}
	char *raw = malloc(total ? total : 1);
	char *out = malloc(3 * total + 1); /* each invalid byte may become U+FFFD */
	if (!raw || !out) {
		free(raw);
		free(out);
		return -ENOMEM;
	}
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		if (skipped(t, ids[i], skip_special))
			continue;
		const struct tok_span *b = &t->bytes[ids[i]];
		memcpy(raw + k, t->strs.buf + b->off, b->len);
		k += b->len;
	}
	size_t o = tok_utf8_lossy((const uint8_t *)raw, total, out);
	free(raw);
	out[o] = '\0';
	*text = out;
	*len = o;
	return 0;
}

int tok_token_bytes(const struct atlas_tokenizer *t, int32_t id, char *buf, size_t len)
{
	if (!known(t, id))
		return -EINVAL;
	const struct tok_span *b = &t->bytes[id];
	if (len)
		memcpy(buf, t->strs.buf + b->off, b->len < len ? b->len : len);
	return (int)b->len;
}

/* An output cursor that refuses to run past cap. */
struct sink {
	char *out;
	size_t cap, n;
	bool full;
};

static void put(struct sink *k, const uint8_t *p, size_t n)
{
	if (k->n + n > k->cap) {
		k->full = true;
		return;
	}
	memcpy(k->out + k->n, p, n);
	k->n += n;
}

static const uint8_t replacement[3] = { 0xef, 0xbf, 0xbd };

/* Emit the character (or U+FFFD) at p; 0 when p[0..n) is an unfinished
 * character, else the bytes it used. */
static size_t emit_one(struct sink *k, const uint8_t *p, size_t n)
{
	int r = p[0] < 0x80 ? 1 : tok_utf8_step(p, n);
	if (r == 0)
		return 0;
	if (r > 0)
		put(k, p, (size_t)r);
	else
		put(k, replacement, sizeof replacement);
	return r > 0 ? (size_t)r : (size_t)-r;
}

int tok_stream_push(const struct atlas_tokenizer *t, struct tok_stream *s, int32_t id,
		    bool skip_special, char *out, size_t cap)
{
	if (!known(t, id) || s->n_pending < 0 || s->n_pending > 3)
		return -EINVAL;
	if (skipped(t, id, skip_special))
		return 0;
	const uint8_t *tok = (const uint8_t *)t->strs.buf + t->bytes[id].off;
	size_t tn = t->bytes[id].len, np = (size_t)s->n_pending;
	struct sink k = { .out = out, .cap = cap };
	uint8_t pending[4];
	size_t new_np = 0, i = 0;

	if (np) {
		/* The unfinished character and the start of this token: the
		 * character is decided within four bytes, and ends at or past
		 * the pending bytes (they were a valid beginning). */
		uint8_t head[8];
		size_t hn = np + (tn < 4 ? tn : 4);
		memcpy(head, s->pending, np);
		memcpy(head + np, tok, hn - np);
		size_t used = emit_one(&k, head, hn);
		if (used == 0) {
			memcpy(pending, head, hn);
			new_np = hn;
			i = tn;
		} else {
			i = used - np;
		}
	}
	while (i < tn && !k.full) {
		size_t used = emit_one(&k, tok + i, tn - i);
		if (used == 0) {
			new_np = tn - i;
			memcpy(pending, tok + i, new_np);
			break;
		}
		i += used;
	}
	if (k.full)
		return -ENOSPC; /* nothing consumed: the caller may retry with room */
	memcpy(s->pending, pending, new_np);
	s->n_pending = (int)new_np;
	return (int)k.n;
}

int tok_stream_flush(struct tok_stream *s, char *out, size_t cap)
{
	if (s->n_pending <= 0)
		return 0;
	if (cap < sizeof replacement)
		return -ENOSPC;
	memcpy(out, replacement, sizeof replacement);
	s->n_pending = 0;
	return (int)sizeof replacement;
}
