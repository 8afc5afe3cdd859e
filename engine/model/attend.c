/* model_attend (model.h): the attention of one layer over a step's KV, the
 * one path through which every family reads its paged cache.
 *
 * All of the step's KV on the device: one attention op. Part of it staged
 * (s->staged, DESIGN §8): kv_stage gathers the layer's K rows and V rows of
 * the pieces (a layer's K and V rows are the two halves of its layer_bytes
 * in every block, device and host alike) into staging buffers, and
 * attention_staged folds them; then attention_part folds each token's
 * device-resident positions, and attention_finish writes out. The parts
 * start at block boundaries and go in position order, so the result is the
 * one attention op's (cpu: bitwise).
 *
 * One round (the pieces fit the buffers): layer c's gather goes beside the
 * ops into buffer c % 2 and the ops wait for it only at layer c's
 * attention; layer c + 1's gather starts when layer c's attention is
 * enqueued, after everything that still reads its buffer (layer c - 1's
 * attention), so that the bus streams the next layer while the device
 * computes this one. Several rounds: each is gathered and folded in turn.
 */
#include "engine/model/model.h"

#include <errno.h>

#include "common/err.h"
#include "engine/model/internal.h"

#define TRY(op) do { int rc_ = (op); if (rc_) return rc_; } while (0)

/* Gather layer `cache`'s rows of pieces [p0, p0 + n) into buffer `buf`;
 * beside the ops (a ticket) or as ops. */
static int gather(struct kt_backend *be, struct model_staging *g, int cache, int buf, int p0,
		  int n, bool beside)
{
	const size_t half = g->layer_bytes / 2, k_off = (size_t)cache * g->layer_bytes;
	const struct kt_tensor src = kt_rows(g->src, p0, n);
	uint64_t k_ticket; /* the V gather's ticket covers it: copies end in order */

	TRY(kt_kv_stage(be, &g->ks[buf], g->pool, g->block_bytes, g->host, g->host_slot_bytes,
			g->host_slots, &src, g->src_host + p0, k_off, half, beside ? &k_ticket : NULL));
	return kt_kv_stage(be, &g->vs[buf], g->pool, g->block_bytes, g->host, g->host_slot_bytes,
			   g->host_slots, &src, g->src_host + p0, k_off + half, half,
			   beside ? &g->ticket[buf] : NULL);
}

int model_attend(struct model *m, const struct model_step *s, int cache,
		 const struct kt_tensor *out, const struct kt_tensor *q, int n_heads,
		 int n_kv_heads, int head_dim, float scale)
{
	struct kt_backend *be = m->be;
	const struct kt_batch *b = &s->batch;
	struct model_staging *g = s->staged;
	const struct kt_tensor *kc = &s->kcache[cache], *vc = &s->vcache[cache];

	if (!g || !g->n_pieces)
		return kt_attention(be, out, q, kc, vc, b, n_heads, n_kv_heads, head_dim, scale);

	const int64_t T = b->n_tokens;
	const struct kt_att_state st = { kt_rows(g->st.acc, 0, T), kt_rows(g->st.ml, 0, T) };

	if (g->n_rounds < 1 || (int64_t)g->n_rounds * g->slots < g->n_pieces ||
	    cache >= g->n_caches)
		return -EINVAL;
	if (g->n_rounds == 1) {
		const int buf = cache % 2;
		if (cache == 0)
			TRY(gather(be, g, 0, 0, 0, g->n_pieces, true));
		if (cache + 1 < g->n_caches)
			TRY(gather(be, g, cache + 1, 1 - buf, 0, g->n_pieces, true));
		TRY(kt_copy_wait(be, g->ticket[buf]));
		const struct kt_tensor span = kt_rows(g->span, 0, T);

		TRY(kt_attention_staged(be, &st, q, &g->ks[buf], &g->vs[buf], &span,
					b->block_size, n_heads, n_kv_heads, head_dim, scale, true));
	} else {
		for (int r = 0; r < g->n_rounds; r++) {
			const int p0 = r * g->slots, n = ATLAS_MIN(g->slots, g->n_pieces - p0);
			const struct kt_tensor span = kt_rows(g->span, r * T, T);

			TRY(gather(be, g, cache, 0, p0, n, false));
			TRY(kt_attention_staged(be, &st, q, &g->ks[0], &g->vs[0], &span,
						b->block_size, n_heads, n_kv_heads, head_dim, scale,
						r == 0));
		}
	}
	TRY(kt_attention_part(be, &st, q, kc, vc, b, &g->from, n_heads, n_kv_heads, head_dim,
			      scale, false));
	return kt_attention_finish(be, out, &st, n_heads, head_dim);
}
