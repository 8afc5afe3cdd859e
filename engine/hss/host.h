/* The host tier of the KV swap tier: a pool of block-sized slots in host
 * memory from the backend (pinned on cuda), one allocation, so that the disk
 * tier can register it for its I/O and a block moves with one copy each way.
 *
 * Not thread-safe: the engine thread owns it (engine.lock held).
 */
#ifndef ATLAS_ENGINE_HSS_HOST_H
#define ATLAS_ENGINE_HSS_HOST_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"

struct host_pool {
	struct kt_backend *be;      /* not owned */
	void *mem;                  /* [n_blocks * slot_bytes] from kt_host_alloc; owned */
	size_t slot_bytes;          /* one block, rounded up to KT_HOST_ALIGN */
	int n_blocks;
	int32_t *free_ids;          /* [n_blocks] stack of free slots */
	int n_free;
};

/* Slots of block_bytes each from a budget of bytes; a budget under one
 * block makes an empty pool (no host tier). */
int host_pool_init(struct host_pool *p, struct kt_backend *be, size_t block_bytes,
		   uint64_t budget, char *err, size_t errlen);
void host_pool_free(struct host_pool *p);
/* A free slot, or -ENOSPC. */
int host_slot_alloc(struct host_pool *p);
void host_slot_free(struct host_pool *p, int slot);

static inline void *host_slot(const struct host_pool *p, int slot)
{
	return (char *)p->mem + (size_t)slot * p->slot_bytes;
}

#endif
