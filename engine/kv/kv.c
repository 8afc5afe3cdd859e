/* The KV block pool (kv.h): sizing, allocation and the block allocator. */
#include "engine/kv/kv.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

int kv_pool_init(struct kv_pool *p, struct kt_backend *be, int n_layers, int n_kv_heads,
		 int head_dim, int block_size, uint64_t budget_bytes, char *err, size_t errlen)
{
	memset(p, 0, sizeof *p);
	p->be = be;
	p->n_layers = n_layers;
	p->block_size = block_size;
	p->row_cols = n_kv_heads * head_dim;
	if (n_layers == 0)
		return 0;
	enum kt_dtype dt = be->info.kv_dtype;
	p->bytes_per_block = 2ull * (uint64_t)n_layers * (uint64_t)block_size *
			     (uint64_t)p->row_cols * kt_dtype_size(dt);
	uint64_t n = budget_bytes / p->bytes_per_block;
	if (n < 1)
		return atlas_errf(err, errlen, -ENOMEM,
				  "kv_memory: %llu bytes hold no KV block (one block needs %llu bytes)",
				  (unsigned long long)budget_bytes,
				  (unsigned long long)p->bytes_per_block);
	if (n > INT32_MAX / (uint64_t)block_size - 1)
		n = INT32_MAX / (uint64_t)block_size - 1;
	p->n_blocks = (int)n;

	p->k = calloc((size_t)n_layers, sizeof *p->k);
	p->v = calloc((size_t)n_layers, sizeof *p->v);
	p->refs = calloc((size_t)p->n_blocks, sizeof *p->refs);
	p->free_ids = malloc((size_t)p->n_blocks * sizeof *p->free_ids);
	if (!p->k || !p->v || !p->refs || !p->free_ids) {
		kv_pool_free(p);
		return atlas_errf(err, errlen, -ENOMEM, "kv: out of host memory for %d blocks",
				  p->n_blocks);
	}
	/* One more block than the budget holds: the pad block, which padding
	 * rows of graphed steps write to and which no sequence ever gets. */
	p->pad_block = p->n_blocks;
	p->block_rows = n_layers * 2 * block_size;
	int64_t rows = ((int64_t)p->n_blocks + 1) * p->block_rows;
	int rc = kt_alloc(be, dt, rows, p->row_cols, &p->blocks);
	if (rc) {
		kv_pool_free(p);
		return atlas_errf(err, errlen, rc,
				  "kv: cannot allocate %d blocks (%llu bytes) on the %s backend",
				  (int)n, (unsigned long long)(n * p->bytes_per_block),
				  be->info.backend);
	}
	for (int l = 0; l < n_layers; l++) {
		int64_t k0 = (int64_t)l * 2 * block_size, v0 = k0 + block_size;
		p->k[l] = kt_rows(p->blocks, k0, rows - k0);
		p->v[l] = kt_rows(p->blocks, v0, rows - v0);
	}
	/* Low block ids on top of the stack: a fresh pool hands out 0, 1, 2, ... */
	for (int i = 0; i < p->n_blocks; i++)
		p->free_ids[i] = p->n_blocks - 1 - i;
	p->n_free = p->n_blocks;
	return 0;
}

void kv_pool_free(struct kv_pool *p)
{
	if (p->blocks.data)
		kt_free(p->be, &p->blocks);
	free(p->k);
	free(p->v);
	free(p->refs);
	free(p->free_ids);
	memset(p, 0, sizeof *p);
}

int kv_block_alloc(struct kv_pool *p)
{
	if (!p->n_free)
		return -ENOSPC;
	int32_t id = p->free_ids[--p->n_free];
	p->refs[id] = 1;
	return id;
}

void kv_block_ref(struct kv_pool *p, int block)
{
	p->refs[block]++;
}

void kv_block_unref(struct kv_pool *p, int block)
{
	if (--p->refs[block] == 0)
		p->free_ids[p->n_free++] = block;
}

int kv_journal_add(struct kv_journal *j, enum kv_copy_kind kind, int dst, int src)
{
	if (!j)
		return 0;
	if (j->n == j->cap)
		return -ENOSPC;
	j->ops[j->n++] = (struct kv_copy){ .kind = kind, .dst = dst, .src = src };
	return 0;
}

int kv_block_copy(struct kv_pool *p, int dst, int src)
{
	int rc = kv_journal_add(p->journal, KV_COPY_BLOCK, dst, src);
	if (rc)
		return rc;
	const struct kt_tensor d = kt_rows(p->blocks, (int64_t)dst * p->block_rows, p->block_rows);
	const struct kt_tensor s = kt_rows(p->blocks, (int64_t)src * p->block_rows, p->block_rows);
	return kt_copy(p->be, &d, &s);
}
