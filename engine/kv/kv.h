/* The paged KV block pool: the device memory of every attention layer's K
 * and V, cut into fixed-size blocks, and a refcounting block allocator.
 *
 * The pool owns one tensor in backend memory, block-major: block b is the
 * block_rows = n_layers * 2 * block_size rows from row b * block_rows and
 * holds, in order, layer 0's K rows, layer 0's V rows, layer 1's K rows, and
 * so on, block_size rows each. A block is thus one contiguous region, so that
 * copying or moving it (a fork's copy, the swap tier) is one copy, not
 * 2 * n_layers strided ones. k[l] and v[l] are the views the kernels address:
 * from layer l's K (V) rows of block 0 to the end of the allocation, with
 * blocks block_rows apart (kt_batch.kv_block_rows). The extra block at the
 * end (pad_block) is never handed out: padding rows of graphed steps write
 * there. Which sequence owns which block, and in what order, is the
 * sequence state's business (engine/seq/); this layer counts references.
 *
 * A block lives in one tier: the device (this pool), host memory
 * (engine/hss/host.h) or disk (engine/hss/disk.h); engine/seq/ moves blocks
 * between them.
 *
 * Not thread-safe: the engine thread changes the allocator while planning,
 * under engine.lock, which is also what a stats reader holds.
 */
#ifndef ATLAS_ENGINE_KV_H
#define ATLAS_ENGINE_KV_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"

enum kv_tier { KV_TIER_DEVICE, KV_TIER_HOST, KV_TIER_DISK, KV_TIERS };

/* Where one block of a sequence is: a tier and an index in that tier. While
 * a move between tiers is in flight (engine/seq/move.c), tier and index
 * still name where the data is; the move holds its destination. */
struct kv_ref {
	uint8_t tier;      /* enum kv_tier: where the block's data is */
	uint8_t moving;    /* a move is in flight: not readable, not movable */
	int32_t move;      /* while moving: the move's index in seq_pool.moves */
	uint32_t index;    /* block index within that tier's pool */
};

/* A block id in a block table that names slot s of the host tier instead of
 * a device block (seq_resolve, the step command): negative, and back. */
#define KV_HOST_ID(s) (-1 - (int32_t)(s))
#define KV_HOST_SLOT(id) (-1 - (int32_t)(id))

/* Device copies recorded for repeating elsewhere: expert parallelism's
 * workers keep the same KV as the head by running its command stream, and
 * the copies the scheduler makes between steps (copy-on-write of a shared
 * block, a recurrent state's snapshot) travel with the next command. A pool
 * with a journal appends each copy it makes; the owner empties it. */
enum kv_copy_kind { KV_COPY_BLOCK, KV_COPY_STATE };

struct kv_copy {
	int32_t kind;               /* enum kv_copy_kind */
	int32_t dst, src;           /* block ids, or state slots */
};

struct kv_journal {
	struct kv_copy *ops;        /* [cap] owned by whoever set the journal */
	int n, cap;
};

struct kv_pool {
	struct kt_backend *be;      /* not owned */
	int n_layers;               /* attention layers: one K and one V cache each */
	int block_size;             /* positions per block */
	int row_cols;               /* n_kv_heads * head_dim */
	int n_blocks;               /* device blocks handed to sequences */
	int pad_block;              /* n_blocks: one more block, the target of padding rows */
	struct kt_tensor blocks;    /* [(n_blocks + 1) * block_rows, row_cols]: every block; owned */
	struct kt_tensor *k, *v;    /* [n_layers] views into blocks (see the top); the arrays owned */
	int block_rows;             /* rows of one block: n_layers * 2 * block_size */
	uint16_t *refs;             /* [n_blocks]: sequences holding each block, 0 = free */
	int32_t *free_ids;          /* [n_blocks]: stack of free block indices */
	int n_free;
	uint64_t bytes_per_block;   /* K and V of all layers */
	struct kv_journal *journal; /* NULL, or where kv_block_copy records its copies */
};

/* Size the pool from a byte budget (at least one block). A model without
 * attention layers (n_layers 0) gets an empty pool. */
int kv_pool_init(struct kv_pool *p, struct kt_backend *be, int n_layers, int n_kv_heads,
		 int head_dim, int block_size, uint64_t budget_bytes, char *err, size_t errlen);
void kv_pool_free(struct kv_pool *p);

static inline int kv_blocks_for(const struct kv_pool *p, int n_tokens)
{
	return (n_tokens + p->block_size - 1) / p->block_size;
}

/* Append a copy to j (NULL: nothing to do); -ENOSPC when it is full. */
int kv_journal_add(struct kv_journal *j, enum kv_copy_kind kind, int dst, int src);

/* A free device block with one reference, or -ENOSPC. */
int kv_block_alloc(struct kv_pool *p);
void kv_block_ref(struct kv_pool *p, int block);
/* Drop a reference; the last one frees the block. */
void kv_block_unref(struct kv_pool *p, int block);
/* Copy block src over block dst, every layer's K and V in one copy (on the
 * device, ordered with the backend's other ops). */
int kv_block_copy(struct kv_pool *p, int dst, int src);

#endif
