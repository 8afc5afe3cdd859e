/* Backend memory of the cpu backend: tensors are 64-byte aligned host
 * allocations; weights are converted to f32 once at load, but for bf16
 * matrices (more than one row) under cpu_precision bf16, which stay bf16:
 * the ops that read matrices (matmul, moe_matmul, embed, conv1d) widen them
 * in registers. Vectors (norm weights, biases, gates of one row) are f32
 * either way.
 *
 * Ownership: every allocation the backend makes is recorded in a pointer set
 * (cpu->owned, under cpu->lock because loaders may run on several threads).
 * kt_free frees only pointers found there, so aliased f32 weights (zero copy
 * of a source that outlives the backend), views and repeated frees of a copied
 * tensor struct are left alone. close frees whatever is still recorded.
 *
 * Threads: f16/bf16 conversion runs on the backend's OpenMP team.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "kernels/cpu/cpu_impl.h"

#define CPU_ALIGN 64

static size_t ptr_slot(const void *p, size_t mask)
{
	uint64_t x = (uint64_t)(uintptr_t)p;

	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdULL;
	x ^= x >> 33;
	return (size_t)x & mask;
}

static void ptrset_put(void **slots, size_t mask, void *p)
{
	size_t i = ptr_slot(p, mask);

	while (slots[i])
		i = (i + 1) & mask;
	slots[i] = p;
}

static int ptrset_add(struct cpu_ptrset *s, void *p)
{
	if ((s->count + 1) * 2 > s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 256;
		void **slots = calloc(cap, sizeof(*slots));

		if (!slots)
			return -ENOMEM;
		for (size_t i = 0; i < s->cap; i++)
			if (s->slots[i])
				ptrset_put(slots, cap - 1, s->slots[i]);
		free(s->slots);
		s->slots = slots;
		s->cap = cap;
	}
	ptrset_put(s->slots, s->cap - 1, p);
	s->count++;
	return 0;
}

/* Remove p; false when it is not in the set. Deletion shifts later members of
 * the probe run back so that lookups never need tombstones. */
static bool ptrset_remove(struct cpu_ptrset *s, const void *p)
{
	size_t mask = s->cap - 1, i, j;

	if (!s->cap)
		return false;
	for (i = ptr_slot(p, mask); s->slots[i] != p; i = (i + 1) & mask)
		if (!s->slots[i])
			return false;
	for (j = i;;) {
		size_t home;

		j = (j + 1) & mask;
		if (!s->slots[j])
			break;
		home = ptr_slot(s->slots[j], mask);
		/* The member at j may stay if its home lies cyclically in (i, j]. */
		if (i <= j ? (i < home && home <= j) : (i < home || home <= j))
			continue;
		s->slots[i] = s->slots[j];
		i = j;
	}
	s->slots[i] = NULL;
	s->count--;
	return true;
}

int cpu_alloc(struct kt_backend *be, enum kt_dtype dtype, int64_t rows, int64_t cols,
	      struct kt_tensor *out)
{
	struct cpu_backend *cpu = cpu_of(be);
	size_t elem = kt_dtype_size(dtype), bytes;
	void *p;
	int rc;

	if (!out || !elem || rows < 0 || cols < 0)
		return -EINVAL;
	if (cols && (uint64_t)rows > (SIZE_MAX - CPU_ALIGN) / elem / (uint64_t)cols)
		return -ENOMEM;
	bytes = (size_t)rows * (size_t)cols * elem;
	/* Never zero bytes: every tensor gets a distinct pointer. */
	bytes = (bytes + CPU_ALIGN) & ~(size_t)(CPU_ALIGN - 1);
	p = aligned_alloc(CPU_ALIGN, bytes);
	if (!p)
		return -ENOMEM;
	pthread_mutex_lock(&cpu->lock);
	rc = ptrset_add(&cpu->owned, p);
	pthread_mutex_unlock(&cpu->lock);
	if (rc) {
		free(p);
		return rc;
	}
	*out = (struct kt_tensor){ .data = p, .dtype = dtype, .rows = rows, .cols = cols };
	return 0;
}

void cpu_free(struct kt_backend *be, struct kt_tensor *t)
{
	struct cpu_backend *cpu = cpu_of(be);
	bool owned;

	if (!t || !t->data)
		return;
	pthread_mutex_lock(&cpu->lock);
	owned = ptrset_remove(&cpu->owned, t->data);
	pthread_mutex_unlock(&cpu->lock);
	if (owned)
		free(t->data);
	*t = (struct kt_tensor){ 0 };
}

void cpu_free_all(struct cpu_backend *cpu)
{
	for (size_t i = 0; i < cpu->owned.cap; i++)
		free(cpu->owned.slots[i]);
	free(cpu->owned.slots);
	cpu->owned = (struct cpu_ptrset){ 0 };
}

/* [offset, offset + bytes) lies inside t. */
static bool byte_range_ok(const struct kt_tensor *t, size_t offset, size_t bytes)
{
	size_t n;

	if (!t || !t->data || t->rows < 0 || t->cols < 0 || !kt_dtype_size(t->dtype))
		return false;
	n = kt_nbytes(t);
	return offset <= n && bytes <= n - offset;
}

int cpu_upload(struct kt_backend *be, const struct kt_tensor *dst, size_t offset,
	       const void *src, size_t bytes)
{
	if (!byte_range_ok(dst, offset, bytes) || (bytes && !src))
		return -EINVAL;
	if (bytes)
		memcpy((char *)dst->data + offset, src, bytes);
	return 0;
}

int cpu_download(struct kt_backend *be, void *dst, const struct kt_tensor *src, size_t offset,
		 size_t bytes)
{
	if (!byte_range_ok(src, offset, bytes) || (bytes && !dst))
		return -EINVAL;
	if (bytes)
		memcpy(dst, (const char *)src->data + offset, bytes);
	return 0;
}

/* Convert n elements of src (any alignment) into dst f32. */
static void convert_to_f32(const struct cpu_backend *cpu, enum kt_dtype src_dtype,
			   const void *src, float *dst, size_t n)
{
	const unsigned char *s = src;

	if (src_dtype == KT_F32) {
		memcpy(dst, src, n * sizeof(float));
		return;
	}
	/* the loader's thread alone (cpu_impl.h, Threads) */
	for (size_t i = 0; i < n; i++) {
		uint16_t h;
		uint32_t bits;

		memcpy(&h, s + 2 * i, sizeof(h));
		bits = src_dtype == KT_F16 ? half_f16_bits(h) : half_bf16_bits(h);
		memcpy(&dst[i], &bits, sizeof(bits));
	}
}

int cpu_weight(struct kt_backend *be, enum kt_dtype src_dtype, const void *src, int64_t rows,
	       int64_t cols, bool src_outlives, struct kt_tensor *out)
{
	struct kt_tensor t;
	int rc;

	if (!out || !src || rows < 0 || cols < 0)
		return -EINVAL;
	if (src_dtype != KT_F32 && src_dtype != KT_F16 && src_dtype != KT_BF16)
		return -EINVAL;
	/* Alias only a float-aligned source: ops read it as float *. */
	if (src_dtype == KT_F32 && src_outlives && (uintptr_t)src % _Alignof(float) == 0) {
		*out = (struct kt_tensor){ .data = (void *)src, .dtype = KT_F32,
					   .rows = rows, .cols = cols };
		return 0;
	}
	if (src_dtype == KT_BF16 && rows > 1 && cpu_of(be)->bf16) {
		rc = cpu_alloc(be, KT_BF16, rows, cols, &t);
		if (rc)
			return rc;
		memcpy(t.data, src, (size_t)rows * (size_t)cols * sizeof(uint16_t));
		*out = t;
		return 0;
	}
	rc = cpu_alloc(be, KT_F32, rows, cols, &t);
	if (rc)
		return rc;
	convert_to_f32(cpu_of(be), src_dtype, src, t.data, (size_t)rows * (size_t)cols);
	*out = t;
	return 0;
}
