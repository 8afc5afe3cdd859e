/* Prompt lookup: draft tokens from the session's own context (DESIGN §9).
 *
 * The context's last n tokens (n from max_n down to min_n, longest first)
 * are looked up among the earlier n-grams of the same context; at the
 * newest earlier occurrence, the tokens that followed it are the drafts. A
 * pattern that repeats with a short period drafts past the end of the
 * context by continuing from its own drafts. No model runs: drafting costs
 * a hash lookup per n, which is why the gate (gate.h) can keep checking
 * drafts it did not send to verification.
 *
 * The index maps (n, the n tokens before position e) to the newest such e,
 * in an open-addressing table keyed by XXH3 of the tokens; a hit is checked
 * against the tokens themselves, so a collision never drafts the wrong run.
 * It grows by doubling as the context does (amortised: a lookup itself
 * allocates nothing), and is rebuilt when the context was replaced.
 */
#ifndef ATLAS_ENGINE_SPEC_NGRAM_H
#define ATLAS_ENGINE_SPEC_NGRAM_H

#include <stddef.h>
#include <stdint.h>

struct ngram_index {
	int min_n, max_n;           /* n-gram lengths it indexes */
	uint32_t *ends;             /* [cap] an entry: the position e an n-gram ends before,
				     * plus one (0: empty), its n in the top byte; owned */
	uint32_t cap;               /* a power of two, or 0 before the first use */
	uint32_t used;              /* entries in use */
	size_t indexed;             /* n-grams ending before positions <= indexed are in */
};

void ngram_init(struct ngram_index *x, int min_n, int max_n);
void ngram_free(struct ngram_index *x);
/* Forget everything (the context was reset). */
void ngram_reset(struct ngram_index *x);

/* Up to k drafts for the context tokens[0, n): predictions of tokens[n],
 * tokens[n + 1], ... into out. Returns how many (0: no earlier match), or
 * -ENOMEM when the index could not grow (no drafts then). */
int ngram_propose(struct ngram_index *x, const int32_t *tokens, size_t n, int k, int32_t *out);

#endif
