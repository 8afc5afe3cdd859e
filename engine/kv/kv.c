/* Paged KV: pool sizing, the refcounting block allocator and block tables. */
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
	int64_t rows = ((int64_t)p->n_blocks + 1) * block_size;
	for (int l = 0; l < n_layers; l++) {
		int rc = kt_alloc(be, dt, rows, p->row_cols, &p->k[l]);
		if (rc == 0)
			rc = kt_alloc(be, dt, rows, p->row_cols, &p->v[l]);
		if (rc) {
			kv_pool_free(p);
			return atlas_errf(err, errlen, rc,
					  "kv: cannot allocate %d blocks (%llu bytes) on the %s backend",
					  (int)n, (unsigned long long)(n * p->bytes_per_block),
					  be->info.backend);
		}
	}
	/* Low block ids on top of the stack: a fresh pool hands out 0, 1, 2, ... */
	for (int i = 0; i < p->n_blocks; i++)
		p->free_ids[i] = p->n_blocks - 1 - i;
	p->n_free = p->n_blocks;
	return 0;
}

void kv_pool_free(struct kv_pool *p)
{
	if (p->k || p->v)
		for (int l = 0; l < p->n_layers; l++) {
			if (p->k && p->k[l].data)
				kt_free(p->be, &p->k[l]);
			if (p->v && p->v[l].data)
				kt_free(p->be, &p->v[l]);
		}
	free(p->k);
	free(p->v);
	free(p->refs);
	free(p->free_ids);
	memset(p, 0, sizeof *p);
}

static int seq_grow(struct kv_seq *seq, int cap)
{
	if (cap <= seq->cap)
		return 0;
	int want = seq->cap ? seq->cap : 8;
	while (want < cap)
		want *= 2;
	struct kv_ref *b = realloc(seq->blocks, (size_t)want * sizeof *b);
	if (!b)
		return -ENOMEM;
	seq->blocks = b;
	seq->cap = want;
	return 0;
}

int kv_seq_reserve(struct kv_pool *p, struct kv_seq *seq, int n_tokens)
{
	int need = kv_blocks_for(p, n_tokens) - seq->n_blocks;
	if (need <= 0)
		return 0;
	if (need > p->n_free)
		return -ENOSPC;
	int rc = seq_grow(seq, seq->n_blocks + need);
	if (rc)
		return rc;
	for (int i = 0; i < need; i++) {
		int32_t id = p->free_ids[--p->n_free];
		p->refs[id] = 1;
		seq->blocks[seq->n_blocks++] = (struct kv_ref){ .tier = ATLAS_TIER_HBM,
								.index = (uint32_t)id };
	}
	return 0;
}

void kv_seq_release(struct kv_pool *p, struct kv_seq *seq)
{
	for (int i = 0; i < seq->n_blocks; i++) {
		struct kv_ref r = seq->blocks[i];
		if (r.tier != ATLAS_TIER_HBM)
			continue;
		if (--p->refs[r.index] == 0)
			p->free_ids[p->n_free++] = (int32_t)r.index;
	}
	seq->n_blocks = 0;
	seq->n_tokens = 0;
}

void kv_seq_free(struct kv_pool *p, struct kv_seq *seq)
{
	kv_seq_release(p, seq);
	free(seq->blocks);
	memset(seq, 0, sizeof *seq);
}

int kv_seq_share_prefix(struct kv_pool *p, struct kv_seq *dst, const struct kv_seq *src,
			int n_tokens)
{
	if (dst->n_blocks)
		return -EINVAL;
	if (n_tokens > src->n_tokens)
		n_tokens = src->n_tokens;
	int full = n_tokens / p->block_size;
	int rc = seq_grow(dst, full);
	if (rc)
		return rc;
	for (int i = 0; i < full; i++) {
		struct kv_ref r = src->blocks[i];
		if (r.tier == ATLAS_TIER_HBM)
			p->refs[r.index]++;
		dst->blocks[i] = r;
	}
	dst->n_blocks = full;
	dst->n_tokens = full * p->block_size;
	return dst->n_tokens;
}

int kv_seq_resolve(struct kv_pool *p, const struct kv_seq *seq, int32_t *ids, int max_ids)
{
	if (seq->n_blocks > max_ids)
		return -E2BIG;
	for (int i = 0; i < seq->n_blocks; i++) {
		struct kv_ref r = seq->blocks[i];
		if (r.tier != ATLAS_TIER_HBM || r.index >= (uint32_t)p->n_blocks)
			return -EFAULT;
		ids[i] = (int32_t)r.index;
	}
	return seq->n_blocks;
}

void kv_seq_count(const struct kv_seq *seq, uint32_t counts[ATLAS_TIERS])
{
	for (int t = 0; t < ATLAS_TIERS; t++)
		counts[t] = 0;
	for (int i = 0; i < seq->n_blocks; i++)
		counts[seq->blocks[i].tier]++;
}
