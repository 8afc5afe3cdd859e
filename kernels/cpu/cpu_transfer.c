/* Host memory for the KV swap tier and copies between it and backend
 * memory (backend.h: host_alloc, copy_async, copy_done), and the gather of
 * KV blocks into a staging buffer (kv_stage). On the cpu both
 * sides are RAM: a copy is a memcpy done before copy_async returns, so every
 * ticket has finished when it is handed out; the swap tier still goes through
 * the same steps as on a GPU, which is what lets CI exercise them. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_impl.h"

int cpu_host_alloc(struct kt_backend *be, size_t bytes, void **out)
{
	size_t n = (bytes + KT_HOST_ALIGN - 1) / KT_HOST_ALIGN * KT_HOST_ALIGN;
	void *p = n ? aligned_alloc(KT_HOST_ALIGN, n) : NULL;
	(void)be;
	if (!p)
		return -ENOMEM;
	*out = p;
	return 0;
}

void cpu_host_free(struct kt_backend *be, void *p)
{
	(void)be;
	free(p);
}

int cpu_copy_async(struct kt_backend *be, void *host, const struct kt_tensor *t, size_t off,
		   size_t bytes, bool to_host, uint64_t *ticket)
{
	struct cpu_backend *cpu = cpu_of(be);
	if (!host || !t || !t->data || off > kt_nbytes(t) || bytes > kt_nbytes(t) - off)
		return -EINVAL;
	char *dev = (char *)t->data + off;
	if (to_host)
		memcpy(host, dev, bytes);
	else
		memcpy(dev, host, bytes);
	*ticket = ++cpu->copies;
	return 0;
}

int cpu_copy_done(struct kt_backend *be, uint64_t ticket)
{
	return ticket <= cpu_of(be)->copies ? 1 : -EINVAL;
}

int cpu_kv_stage(struct kt_backend *be, const struct kt_tensor *dst, const struct kt_tensor *pool,
		 size_t pool_block_bytes, const void *host, size_t host_slot_bytes,
		 int64_t host_slots, const struct kt_tensor *src, const int32_t *src_host,
		 size_t off, size_t bytes, uint64_t *ticket)
{
	struct cpu_backend *cpu = cpu_of(be);
	const int32_t *ids;
	int64_t n;

	if (!dst || !dst->data || !pool || !pool->data || !cpu_valid(src, KT_I32) ||
	    src->cols != 1 || !pool_block_bytes || off > pool_block_bytes ||
	    bytes > pool_block_bytes - off || (host_slots && (!host || off > host_slot_bytes ||
							    bytes > host_slot_bytes - off)))
		return -EINVAL;
	n = src->rows;
	if ((size_t)n * bytes > kt_nbytes(dst))
		return -EINVAL;
	ids = src->data;
	for (int64_t i = 0; i < n; i++)
		if (ids[i] >= 0 ? (size_t)ids[i] >= kt_nbytes(pool) / pool_block_bytes
				: -1 - (int64_t)ids[i] >= host_slots)
			return -EINVAL;
	/* the caller's thread alone (cpu_impl.h, Threads) */
	for (int64_t i = 0; i < n; i++) {
		const char *from = ids[i] >= 0
			? (const char *)pool->data + (size_t)ids[i] * pool_block_bytes
			: (const char *)host + (size_t)(-1 - (int64_t)ids[i]) * host_slot_bytes;

		memcpy((char *)dst->data + (size_t)i * bytes, from + off, bytes);
	}
	if (ticket)
		*ticket = ++cpu->copies;
	return 0;
}

int cpu_copy_wait(struct kt_backend *be, uint64_t ticket)
{
	return ticket <= cpu_of(be)->copies ? 0 : -EINVAL;
}
