/* Device memory of the cuda backend: allocation, copies, weights and the
 * sync points.
 *
 * Allocations are cudaMalloc'd (at least 256 bytes, so every tensor has a
 * distinct pointer) and recorded in cu->owned; kt_free frees only pointers
 * found there, so views and repeated frees of a copied struct are harmless.
 *
 * Copies run on the backend's stream: upload returns once the source has been
 * staged by the driver (pageable memory), so the caller may reuse it at once;
 * download waits for the copy and is a sync point.
 *
 * Weights are always bf16 on the device. A bf16 source is copied; f32 and f16
 * sources pass through a staging buffer (CUDA_STAGE_BYTES, allocated at the
 * first weight()) chunk by chunk and are rounded to bf16 (nearest even) by
 * convert_kernel, one thread per element, grid-stride. weight() waits for
 * its copies, so the source may go away when it returns.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_fp16.h>

extern "C" {
#include "common/log.h"
}
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_impl.h"

#define CUDA_ALLOC_ALIGN 256

template <typename S> __device__ __forceinline__ float to_f32(S v);
template <> __device__ __forceinline__ float to_f32<float>(float v)
{
	return v;
}
template <> __device__ __forceinline__ float to_f32<__half>(__half v)
{
	return __half2float(v);
}

/* dst[i] = bf16(src[i]) for i < n. */
template <typename S>
__global__ void convert_kernel(__nv_bfloat16 *dst, const S *src, int64_t n)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x)
		dst[i] = __float2bfloat16_rn(to_f32<S>(src[i]));
}

cudaError_t cuda_probe_kernels(void)
{
	cudaFuncAttributes attr;

	return cudaFuncGetAttributes(&attr, convert_kernel<float>);
}

static int owned_add(struct cuda_backend *cu, void *p)
{
	if (cu->n_owned == cu->cap_owned) {
		size_t cap = cu->cap_owned ? cu->cap_owned * 2 : 256;
		void **a = (void **)realloc(cu->owned, cap * sizeof(*a));

		if (!a)
			return -ENOMEM;
		cu->owned = a;
		cu->cap_owned = cap;
	}
	cu->owned[cu->n_owned++] = p;
	return 0;
}

/* Remove p; false when this backend did not allocate it (or freed it already). */
static bool owned_remove(struct cuda_backend *cu, const void *p)
{
	for (size_t i = 0; i < cu->n_owned; i++) {
		if (cu->owned[i] == p) {
			cu->owned[i] = cu->owned[--cu->n_owned];
			return true;
		}
	}
	return false;
}

int cuda_alloc(struct kt_backend *be, enum kt_dtype dtype, int64_t rows, int64_t cols,
	       struct kt_tensor *out)
{
	struct cuda_backend *cu = cu_of(be);
	size_t elem = kt_dtype_size(dtype), bytes;
	void *p = NULL;
	int rc;

	if (!out || !elem || rows < 0 || cols < 0)
		return -EINVAL;
	if (cols && (uint64_t)rows > (SIZE_MAX - CUDA_ALLOC_ALIGN) / elem / (uint64_t)cols)
		return -ENOMEM;
	bytes = (size_t)rows * (size_t)cols * elem;
	bytes = (bytes + CUDA_ALLOC_ALIGN) & ~(size_t)(CUDA_ALLOC_ALIGN - 1);
	CU_CHECK(cu_enter(cu));
	CU_CHECK(cudaMalloc(&p, bytes));
	pthread_mutex_lock(&cu->lock);
	rc = owned_add(cu, p);
	pthread_mutex_unlock(&cu->lock);
	if (rc) {
		CU_WARN(cudaFree(p));
		return rc;
	}
	*out = kt_tensor{ p, dtype, rows, cols };
	return 0;
}

void cuda_free(struct kt_backend *be, struct kt_tensor *t)
{
	struct cuda_backend *cu = cu_of(be);
	bool owned;

	if (!t || !t->data)
		return;
	pthread_mutex_lock(&cu->lock);
	owned = owned_remove(cu, t->data);
	pthread_mutex_unlock(&cu->lock);
	if (owned) {
		CU_WARN(cu_enter(cu));
		CU_WARN(cudaFree(t->data));
	}
	*t = kt_tensor{};
}

void cuda_free_all(struct cuda_backend *cu)
{
	for (size_t i = 0; i < cu->n_owned; i++)
		CU_WARN(cudaFree(cu->owned[i]));
	free(cu->owned);
	cu->owned = NULL;
	cu->n_owned = cu->cap_owned = 0;
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

int cuda_upload(struct kt_backend *be, const struct kt_tensor *dst, size_t offset,
		const void *src, size_t bytes)
{
	struct cuda_backend *cu = cu_of(be);

	if (!byte_range_ok(dst, offset, bytes) || (bytes && !src))
		return -EINVAL;
	CU_CHECK(cu_enter(cu));
	if (bytes)
		CU_CHECK(cudaMemcpyAsync((char *)dst->data + offset, src, bytes,
					 cudaMemcpyHostToDevice, cu->stream));
	return 0;
}

int cuda_download(struct kt_backend *be, void *dst, const struct kt_tensor *src, size_t offset,
		  size_t bytes)
{
	struct cuda_backend *cu = cu_of(be);

	if (!byte_range_ok(src, offset, bytes) || (bytes && !dst))
		return -EINVAL;
	CU_CHECK(cu_enter(cu));
	if (bytes)
		CU_CHECK(cudaMemcpyAsync(dst, (const char *)src->data + offset, bytes,
					 cudaMemcpyDeviceToHost, cu->stream));
	return cuda_sync_point(cu);
}

int cuda_copy(struct kt_backend *be, const struct kt_tensor *dst, const struct kt_tensor *src)
{
	struct cuda_backend *cu = cu_of(be);

	if (!dst->data || !src->data || kt_nbytes(dst) != kt_nbytes(src) || cu_overlap(dst, src))
		return -EINVAL;
	CU_CHECK(cu_enter(cu));
	CU_CHECK(cudaMemcpyAsync(dst->data, src->data, kt_nbytes(src), cudaMemcpyDeviceToDevice,
				 cu->stream));
	return 0;
}

int cuda_memory(struct kt_backend *be, uint64_t *free_bytes, uint64_t *total_bytes)
{
	size_t f = 0, t = 0;

	CU_CHECK(cu_enter(cu_of(be)));
	CU_CHECK(cudaMemGetInfo(&f, &t));
	*free_bytes = f;
	*total_bytes = t;
	return 0;
}

int cuda_synchronize(struct kt_backend *be)
{
	CU_CHECK(cu_enter(cu_of(be)));
	return cuda_sync_point(cu_of(be));
}

static void fault_names(unsigned f, char *buf, size_t len)
{
	static const char *const names[] = { "embed",    "gather_rows", "rope",
					     "kv_store", "attention",   "kv_stage",
					     "moe_matmul", "moe_combine", "conv1d",
					     "delta_rule" };
	size_t n = 0;

	buf[0] = 0;
	for (unsigned i = 0; i < sizeof names / sizeof names[0] && n < len; i++)
		if (f & (1u << i))
			n += (size_t)snprintf(buf + n, len - n, "%s%s", n ? ", " : "", names[i]);
}

int cuda_sync_point(struct cuda_backend *cu)
{
	CU_CHECK(cudaMemcpyAsync(cu->fault_host, cu->fault, sizeof(*cu->fault),
				 cudaMemcpyDeviceToHost, cu->stream));
	return cuda_sync_published(cu);
}

int cuda_sync_published(struct cuda_backend *cu)
{
	unsigned f;
	char names[128];
	int rc;

	/* With a communicator open a peer may never join a collective: the
	 * wait is bounded (cuda_comm.cu). */
	if (cu->nccl) {
		if ((rc = cuda_comm_wait(cu)))
			return rc;
	} else {
		CU_CHECK(cudaStreamSynchronize(cu->stream));
	}
	f = *cu->fault_host;
	if (!f)
		return 0;
	*cu->fault_host = 0;
	CU_CHECK(cudaMemsetAsync(cu->fault, 0, sizeof(*cu->fault), cu->stream));
	fault_names(f, names, sizeof names);
	log_error("cuda: out-of-range index in the inputs of %s since the last sync point "
		  "(ids, indices, positions, sequence slots, block tables or MoE plans)", names);
	return -EINVAL;
}

int cuda_grow_xbf16(struct cuda_backend *cu, int64_t cols)
{
	void *p = NULL;

	if (cols <= cu->xbf16_cols)
		return 0;
	CU_CHECK(cudaMalloc(&p, (size_t)cu->max_tokens * (size_t)cols * sizeof(__nv_bfloat16)));
	CU_WARN(cudaFree(cu->xbf16));
	cu->xbf16 = (__nv_bfloat16 *)p;
	cu->xbf16_cols = cols;
	return 0;
}

/* Convert n elements of src (host, f32 or f16) into dst (device bf16) through
 * the staging buffer; cu->lock held. */
template <typename S>
static int convert_chunks(struct cuda_backend *cu, __nv_bfloat16 *dst, const void *src, size_t n)
{
	const size_t chunk = CUDA_STAGE_BYTES / sizeof(S);

	if (!cu->stage)
		CU_CHECK(cudaMalloc(&cu->stage, CUDA_STAGE_BYTES));
	for (size_t off = 0; off < n; off += chunk) {
		size_t len = n - off < chunk ? n - off : chunk;

		CU_CHECK(cudaMemcpyAsync(cu->stage, (const S *)src + off, len * sizeof(S),
					 cudaMemcpyHostToDevice, cu->stream));
		convert_kernel<S><<<cu_blocks((int64_t)len), CUDA_THREADS, 0, cu->stream>>>(
			dst + off, (const S *)cu->stage, (int64_t)len);
		CU_LAUNCHED();
	}
	return 0;
}

static int fill_weight(struct cuda_backend *cu, enum kt_dtype src_dtype, const void *src,
		       const struct kt_tensor *t)
{
	size_t n = (size_t)t->rows * (size_t)t->cols;
	__nv_bfloat16 *dst = (__nv_bfloat16 *)t->data;
	int rc = cuda_grow_xbf16(cu, t->cols);

	if (rc || !n)
		return rc;
	if (src_dtype == KT_BF16)
		CU_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(*dst), cudaMemcpyHostToDevice,
					 cu->stream));
	else if (src_dtype == KT_F32)
		rc = convert_chunks<float>(cu, dst, src, n);
	else
		rc = convert_chunks<__half>(cu, dst, src, n);
	if (rc)
		return rc;
	CU_CHECK(cudaStreamSynchronize(cu->stream));
	return 0;
}

int cuda_weight(struct kt_backend *be, enum kt_dtype src_dtype, const void *src, int64_t rows,
		int64_t cols, bool src_outlives, struct kt_tensor *out)
{
	struct cuda_backend *cu = cu_of(be);
	struct kt_tensor t;
	int rc;

	(void)src_outlives; /* the device never aliases host memory: always a copy */
	if (!out || !src || rows < 0 || cols < 0)
		return -EINVAL;
	if (src_dtype != KT_F32 && src_dtype != KT_F16 && src_dtype != KT_BF16)
		return -EINVAL;
	rc = cuda_alloc(be, KT_BF16, rows, cols, &t);
	if (rc)
		return rc;
	pthread_mutex_lock(&cu->lock);
	rc = fill_weight(cu, src_dtype, src, &t);
	pthread_mutex_unlock(&cu->lock);
	if (rc) {
		cuda_free(be, &t);
		return rc;
	}
	*out = t;
	return 0;
}
