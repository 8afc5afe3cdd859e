/* The host tier's slots (host.h). */
#include "engine/hss/host.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

int host_pool_init(struct host_pool *p, struct kt_backend *be, size_t block_bytes,
		   uint64_t budget, char *err, size_t errlen)
{
	memset(p, 0, sizeof *p);
	p->be = be;
	p->slot_bytes = (block_bytes + KT_HOST_ALIGN - 1) / KT_HOST_ALIGN * KT_HOST_ALIGN;
	uint64_t n = p->slot_bytes ? budget / p->slot_bytes : 0;
	if (n > INT32_MAX)
		n = INT32_MAX;
	if (n == 0)
		return 0;
	p->free_ids = malloc((size_t)n * sizeof *p->free_ids);
	int rc = p->free_ids ? kt_host_alloc(be, (size_t)n * p->slot_bytes, &p->mem) : -ENOMEM;
	if (rc) {
		free(p->free_ids);
		p->free_ids = NULL;
		return atlas_errf(err, errlen, rc,
				  "kv_host_memory: cannot allocate %llu bytes of host memory for %llu "
				  "blocks on the %s backend", (unsigned long long)(n * p->slot_bytes),
				  (unsigned long long)n, be->info.backend);
	}
	p->n_blocks = (int)n;
	for (int i = 0; i < p->n_blocks; i++)
		p->free_ids[i] = p->n_blocks - 1 - i;
	p->n_free = p->n_blocks;
	return 0;
}

void host_pool_free(struct host_pool *p)
{
	if (p->mem)
		kt_host_free(p->be, p->mem);
	free(p->free_ids);
	memset(p, 0, sizeof *p);
}

int host_slot_alloc(struct host_pool *p)
{
	return p->n_free ? p->free_ids[--p->n_free] : -ENOSPC;
}

void host_slot_free(struct host_pool *p, int slot)
{
	p->free_ids[p->n_free++] = slot;
}
