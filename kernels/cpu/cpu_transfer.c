/* Host memory for the KV swap tier and copies between it and backend
 * memory (backend.h: host_alloc, copy_async, copy_done). On the cpu both
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
