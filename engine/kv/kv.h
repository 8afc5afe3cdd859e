/* The paged KV cache: fixed-size blocks, a block table per sequence, a
 * refcounting allocator, and a tier on every block (DESIGN §4.2).
 *
 * The pool owns, per layer, one K and one V tensor in backend memory of
 * n_blocks * block_size rows (the HBM tier). A sequence's block table lists
 * its blocks in position order; entry i covers positions
 * [i * block_size, (i + 1) * block_size). Each entry says which tier holds the
 * block. Today only the HBM tier exists; the swap tier (host RAM, disk) will
 * move blocks between tiers and back without changing attention, because
 * every attention path gets a sequence's device block ids from
 * kv_seq_resolve() and from nowhere else.
 *
 * A block may be shared by several sequences (refcount > 1). Sequences only
 * append, and kv_seq_share_prefix() shares only full blocks, so a shared block
 * is never written: a partially filled block is never shared (DESIGN §4.3).
 * Rewriting positions (rollback after speculation) must copy a shared block
 * first; that comes with the feature that needs it.
 *
 * Not thread-safe: the engine thread owns the pool.
 */
#ifndef ATLAS_ENGINE_KV_H
#define ATLAS_ENGINE_KV_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "kernels/backend.h"

struct kv_ref {
	uint8_t tier;      /* enum atlas_tier: where the block's data is */
	uint32_t index;    /* block index within that tier's pool */
};

struct kv_pool {
	struct kt_backend *be;      /* not owned */
	int n_layers;
	int block_size;             /* positions per block */
	int row_cols;               /* n_kv_heads * head_dim */
	int n_blocks;               /* HBM blocks handed to sequences */
	int pad_block;              /* n_blocks: one more block, the target of padding rows */
	struct kt_tensor *k, *v;    /* [n_layers], each [(n_blocks + 1) * block_size, row_cols]; owned */
	uint16_t *refs;             /* [n_blocks]: sequences holding each block, 0 = free */
	int32_t *free_ids;          /* [n_blocks]: stack of free block indices */
	int n_free;
	uint64_t bytes_per_block;   /* K and V of all layers */
};

struct kv_seq {
	struct kv_ref *blocks;      /* [cap] block table in position order; owned */
	int n_blocks, cap;
	int n_tokens;               /* positions whose K/V are written */
};

/* Size the pool from a byte budget (at least one block per layer set). */
int kv_pool_init(struct kv_pool *p, struct kt_backend *be, int n_layers, int n_kv_heads,
		 int head_dim, int block_size, uint64_t budget_bytes, char *err, size_t errlen);
void kv_pool_free(struct kv_pool *p);

static inline int kv_blocks_for(const struct kv_pool *p, int n_tokens)
{
	return (n_tokens + p->block_size - 1) / p->block_size;
}

/* Make the sequence's blocks cover positions [0, n_tokens), allocating what is
 * missing. All or nothing: -ENOSPC leaves seq unchanged. */
int kv_seq_reserve(struct kv_pool *p, struct kv_seq *seq, int n_tokens);
/* Drop the sequence's blocks (refcounts) and forget its positions. */
void kv_seq_release(struct kv_pool *p, struct kv_seq *seq);
/* Release and free the block table itself. */
void kv_seq_free(struct kv_pool *p, struct kv_seq *seq);
/* Make dst share the full blocks of src's first n_tokens positions (rounded
 * down to whole blocks); dst must be empty. Returns the positions shared. */
int kv_seq_share_prefix(struct kv_pool *p, struct kv_seq *dst, const struct kv_seq *src,
			int n_tokens);

/* The one way to read KV: the device block ids of the sequence's blocks, in
 * position order, into ids[0 .. n_blocks). Every block must be in the HBM
 * tier when the step runs; this is where the swap tier will bring the
 * others back. Returns n_blocks or a negative errno. */
int kv_seq_resolve(struct kv_pool *p, const struct kv_seq *seq, int32_t *ids, int max_ids);

/* Blocks of seq per tier. */
void kv_seq_count(const struct kv_seq *seq, uint32_t counts[ATLAS_TIERS]);

#endif
