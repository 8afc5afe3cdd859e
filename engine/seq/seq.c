/* The sequence state (seq.h): block tables with copy-on-write, recurrent
 * state slots with snapshots, forks and the resolve function. */
#include "engine/seq/seq.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/hss/disk.h"

int seq_pool_init(struct seq_pool *p, struct kt_backend *be, const struct model_config *mc,
		  int block_size, uint64_t kv_budget, int state_slots, char *err, size_t errlen)
{
	memset(p, 0, sizeof *p);
	int rc = kv_pool_init(&p->kv, be, mc->n_attention_layers, mc->n_kv_heads, mc->head_dim,
			      block_size, kv_budget, err, errlen);
	if (rc)
		return rc;
	rc = state_pool_init(&p->state, be, mc->n_linear_layers, mc->linear_state_floats,
			     state_slots, err, errlen);
	if (rc)
		kv_pool_free(&p->kv);
	return rc;
}

void seq_pool_free(struct seq_pool *p)
{
	seq_pool_tiers_free(p);
	state_pool_free(&p->state);
	kv_pool_free(&p->kv);
}

void seq_init(struct seq *s)
{
	memset(s, 0, sizeof *s);
	s->state_slot = s->snap_slot = -1;
}

int seq_table_grow(struct seq *s, int cap)
{
	if (cap <= s->cap)
		return 0;
	int want = s->cap ? s->cap : 8;
	while (want < cap)
		want *= 2;
	struct kv_ref *b = realloc(s->blocks, (size_t)want * sizeof *b);
	if (!b)
		return -ENOMEM;
	s->blocks = b;
	s->cap = want;
	return 0;
}

static bool has_state(const struct seq_pool *p)
{
	return p->state.n_layers > 0;
}

/* The block that position n_tokens (the next write) falls in, if the
 * sequence already has it and shares it: it must be copied first. */
static int shared_tail(const struct seq_pool *p, const struct seq *s)
{
	int b = s->n_tokens / p->kv.block_size;
	if (b >= s->n_blocks || s->blocks[b].tier != KV_TIER_DEVICE || s->blocks[b].moving)
		return -1;
	return p->kv.refs[s->blocks[b].index] > 1 ? b : -1;
}

int seq_reserve(struct seq_pool *p, struct seq *s, int n_tokens)
{
	struct kv_pool *kv = &p->kv;
	int add = kv->n_layers ? kv_blocks_for(kv, n_tokens) - s->n_blocks : 0;
	int cow = kv->n_layers && n_tokens > s->n_tokens ? shared_tail(p, s) : -1;
	bool slot = has_state(p) && s->state_slot < 0;
	int rc;

	if (add < 0)
		add = 0;
	if (add + (cow >= 0) > kv->n_free || (slot && !p->state.n_free))
		return -ENOSPC;
	if ((rc = seq_table_grow(s, s->n_blocks + add)))
		return rc;
	if (cow >= 0) {
		int fresh = kv_block_alloc(kv);
		if ((rc = kv_block_copy(kv, fresh, (int)s->blocks[cow].index))) {
			kv_block_unref(kv, fresh);
			return rc;
		}
		kv_block_unref(kv, (int)s->blocks[cow].index);
		s->blocks[cow].index = (uint32_t)fresh;
	}
	for (int i = 0; i < add; i++)
		s->blocks[s->n_blocks++] = (struct kv_ref){ .tier = KV_TIER_DEVICE,
							    .index = (uint32_t)kv_block_alloc(kv) };
	if (slot) {
		const int st = state_slot_alloc(&p->state);
		if (s->state_host && (rc = state_slot_load(&p->state, st, s->state_host))) {
			state_slot_free(&p->state, st);
			return rc;
		}
		free(s->state_host);
		s->state_host = NULL;
		s->state_slot = st;
	}
	return 0;
}

void seq_commit(struct seq *s, int n_tokens)
{
	s->n_tokens = n_tokens;
}

/* Let blocks [keep, n_blocks) go, wherever they are; a block on the move
 * is left to its move, which frees it when it ends. */
static void drop_blocks_from(struct seq_pool *p, struct seq *s, int keep)
{
	for (int i = keep; i < s->n_blocks; i++) {
		const struct kv_ref *r = &s->blocks[i];
		if (r->moving) {
			p->moves[r->move].seq = NULL;
			s->n_moving--;
		} else if (r->tier == KV_TIER_DEVICE) {
			kv_block_unref(&p->kv, (int)r->index);
		} else if (r->tier == KV_TIER_HOST) {
			host_slot_free(&p->host, (int)r->index);
		} else {
			disk_slot_free(p->disk, (int)r->index);
		}
	}
	if (keep < s->n_blocks)
		s->n_blocks = keep;
}

int seq_truncate(struct seq_pool *p, struct seq *s, int n_tokens)
{
	if (n_tokens < 0 || n_tokens > s->n_tokens)
		return -EINVAL;
	if (n_tokens == 0) {
		seq_release(p, s);
		return 0;
	}
	if (n_tokens == s->n_tokens)
		return 0;
	if (has_state(p)) {
		if (s->snap_slot < 0 || s->snap_pos != n_tokens)
			return -EINVAL;
		int rc = state_slot_copy(&p->state, s->state_slot, s->snap_slot);
		if (rc)
			return rc;
	}
	if (p->kv.n_layers)
		drop_blocks_from(p, s, kv_blocks_for(&p->kv, n_tokens));
	s->n_tokens = n_tokens;
	return 0;
}

int seq_snapshot(struct seq_pool *p, struct seq *s)
{
	if (!has_state(p) || s->state_slot < 0)
		return 0;
	if (s->snap_slot < 0) {
		int slot = state_slot_alloc(&p->state);
		if (slot < 0)
			return slot;
		s->snap_slot = slot;
	}
	int rc = state_slot_copy(&p->state, s->snap_slot, s->state_slot);
	if (rc)
		return rc;
	s->snap_pos = s->n_tokens;
	return 0;
}

void seq_forget_snapshot(struct seq_pool *p, struct seq *s)
{
	if (s->snap_slot >= 0)
		state_slot_free(&p->state, s->snap_slot);
	s->snap_slot = -1;
}

int seq_fork(struct seq_pool *p, struct seq *dst, const struct seq *src, int n_tokens)
{
	struct kv_pool *kv = &p->kv;
	int from_slot = -1, rc;

	if (dst->n_blocks || dst->n_tokens || dst->state_slot >= 0 || n_tokens < 0 ||
	    n_tokens > src->n_tokens)
		return -EINVAL;
	if (has_state(p) && n_tokens > 0) {
		from_slot = n_tokens == src->n_tokens ? src->state_slot
			  : n_tokens == src->snap_pos ? src->snap_slot : -1;
		if (from_slot < 0)
			return -EINVAL;
	}
	const int full = kv->n_layers ? n_tokens / kv->block_size : 0;
	const bool partial = kv->n_layers && n_tokens % kv->block_size;
	if (partial > kv->n_free || (from_slot >= 0 && !p->state.n_free))
		return -ENOSPC;
	if ((rc = seq_table_grow(dst, full + partial)))
		return rc;
	for (int i = 0; i < full + partial; i++)
		if (src->blocks[i].tier != KV_TIER_DEVICE || src->blocks[i].moving)
			return -EAGAIN;
	if (partial) {
		int fresh = kv_block_alloc(kv);
		if ((rc = kv_block_copy(kv, fresh, (int)src->blocks[full].index))) {
			kv_block_unref(kv, fresh);
			return rc;
		}
		dst->blocks[full] = (struct kv_ref){ .tier = KV_TIER_DEVICE,
						     .index = (uint32_t)fresh };
	}
	if (from_slot >= 0) {
		int slot = state_slot_alloc(&p->state);
		if ((rc = state_slot_copy(&p->state, slot, from_slot))) {
			state_slot_free(&p->state, slot);
			if (partial)
				kv_block_unref(kv, (int)dst->blocks[full].index);
			return rc;
		}
		dst->state_slot = slot;
	}
	for (int i = 0; i < full; i++) {
		kv_block_ref(kv, (int)src->blocks[i].index);
		dst->blocks[i] = src->blocks[i];
	}
	dst->n_blocks = full + partial;
	dst->n_tokens = n_tokens;
	return 0;
}

void seq_release(struct seq_pool *p, struct seq *s)
{
	drop_blocks_from(p, s, 0);
	if (s->state_slot >= 0)
		state_slot_free(&p->state, s->state_slot);
	if (s->snap_slot >= 0)
		state_slot_free(&p->state, s->snap_slot);
	s->state_slot = s->snap_slot = -1;
	free(s->state_host);
	s->state_host = NULL;
	s->snap_pos = 0;
	s->n_tokens = 0;
	s->lost = 0;
}

void seq_free(struct seq_pool *p, struct seq *s)
{
	seq_release(p, s);
	free(s->blocks);
	seq_init(s);
}

int seq_resolve(const struct seq_pool *p, const struct seq *s, int n_tokens, int32_t *ids,
		int max_ids)
{
	const int n = p->kv.n_layers ? kv_blocks_for(&p->kv, n_tokens) : 0;
	if (n > s->n_blocks)
		return -EINVAL;
	if (n > max_ids)
		return -E2BIG;
	for (int i = 0; i < n; i++) {
		struct kv_ref r = s->blocks[i];
		/* A block moving away from the device or the host is still
		 * whole where it was until the move ends (move.c). */
		if (r.tier == KV_TIER_DEVICE)
			ids[i] = (int32_t)r.index;
		else if (r.tier == KV_TIER_HOST && (int64_t)(i + 1) * p->kv.block_size <= s->n_tokens)
			ids[i] = KV_HOST_ID(r.index);
		else
			return -EAGAIN;
	}
	return n;
}

void seq_count(const struct seq *s, uint32_t counts[KV_TIERS])
{
	for (int t = 0; t < KV_TIERS; t++)
		counts[t] = 0;
	for (int i = 0; i < s->n_blocks; i++)
		counts[s->blocks[i].tier]++;
}
