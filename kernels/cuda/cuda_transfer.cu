/* Host memory for the KV swap tier and copies between it and device memory
 * (backend.h: host_alloc, copy_async, copy_done), and kv_stage: the gather
 * of KV blocks, from the device pool or from pinned host memory read in
 * place (mapped), into a staging buffer, on the main stream like an op.
 *
 * Host memory is pinned, so a copy runs at the link's speed and truly
 * asynchronously. Copies run on a stream of their own, beside the steps:
 * each first waits for an event recorded on the main stream at the moment it
 * starts, so it sees every kernel enqueued before it (a block is copied down
 * only after the step that wrote it; a block is overwritten by a copy up only
 * after the kernels that still read its previous owner's data). What the
 * main stream enqueues later is not ordered with the copy: the engine reads
 * a block copied up only once copy_done says it has arrived.
 *
 * Tickets count up from 1; ticket t's completion is event t % CUDA_COPY_RING,
 * so at most that many copies are in flight (-EAGAIN beyond). copy_done
 * advances copies_done over the events that have completed, in order, with
 * cudaEventQuery, which never waits.
 */
#include <errno.h>
#include <stdlib.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_impl.h"

cudaError_t cuda_transfer_open(struct cuda_backend *cu)
{
	cudaError_t e = cudaStreamCreateWithFlags(&cu->copy_stream, cudaStreamNonBlocking);
	if (!e)
		e = cudaEventCreateWithFlags(&cu->copy_mark, cudaEventDisableTiming);
	for (int i = 0; !e && i < CUDA_COPY_RING; i++)
		e = cudaEventCreateWithFlags(&cu->copy_events[i], cudaEventDisableTiming);
	return e;
}

void cuda_transfer_close(struct cuda_backend *cu)
{
	if (cu->copy_stream)
		CU_WARN(cudaStreamSynchronize(cu->copy_stream));
	for (int i = 0; i < CUDA_COPY_RING; i++)
		if (cu->copy_events[i])
			CU_WARN(cudaEventDestroy(cu->copy_events[i]));
	if (cu->copy_mark)
		CU_WARN(cudaEventDestroy(cu->copy_mark));
	if (cu->copy_stream)
		CU_WARN(cudaStreamDestroy(cu->copy_stream));
}

/* Ordinary memory, aligned as O_DIRECT wants, then pinned: cudaHostAlloc
 * hands out small sizes from a pool at no particular alignment, and memory
 * of its own may not register with io_uring. */
int cuda_host_alloc(struct kt_backend *be, size_t bytes, void **out)
{
	struct cuda_backend *cu = cu_of(be);
	const size_t n = ((bytes ? bytes : 1) + KT_HOST_ALIGN - 1) / KT_HOST_ALIGN * KT_HOST_ALIGN;
	void *p = NULL;
	if (posix_memalign(&p, KT_HOST_ALIGN, n))
		return -ENOMEM;
	cudaError_t e = cu_enter(cu);
	if (!e)
		e = cudaHostRegister(p, n, cudaHostRegisterPortable | cudaHostRegisterMapped);
	if (e) {
		free(p);
		return cuda_fail(e, "cudaHostRegister", __FILE__, __LINE__);
	}
	*out = p;
	return 0;
}

void cuda_host_free(struct kt_backend *be, void *p)
{
	struct cuda_backend *cu = cu_of(be);
	CU_WARN(cu_enter(cu));
	CU_WARN(cudaHostUnregister(p));
	free(p);
}

int cuda_copy_async(struct kt_backend *be, void *host, const struct kt_tensor *t, size_t off,
		    size_t bytes, bool to_host, uint64_t *ticket)
{
	struct cuda_backend *cu = cu_of(be);
	if (!host || !t || !t->data || off > kt_nbytes(t) || bytes > kt_nbytes(t) - off)
		return -EINVAL;
	if (cu->copies_issued - cu->copies_done >= CUDA_COPY_RING)
		return -EAGAIN;
	char *dev = (char *)t->data + off;
	const uint64_t n = cu->copies_issued + 1;
	CU_CHECK(cu_enter(cu));
	CU_CHECK(cudaEventRecord(cu->copy_mark, cu->stream));
	CU_CHECK(cudaStreamWaitEvent(cu->copy_stream, cu->copy_mark, 0));
	CU_CHECK(cudaMemcpyAsync(to_host ? host : dev, to_host ? (const void *)dev : host, bytes,
				 to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice,
				 cu->copy_stream));
	CU_CHECK(cudaEventRecord(cu->copy_events[n % CUDA_COPY_RING], cu->copy_stream));
	cu->copies_issued = n;
	*ticket = n;
	return 0;
}

int cuda_copy_done(struct kt_backend *be, uint64_t ticket)
{
	struct cuda_backend *cu = cu_of(be);
	if (ticket > cu->copies_issued)
		return -EINVAL;
	CU_CHECK(cu_enter(cu));
	while (cu->copies_done < ticket) {
		cudaError_t e = cudaEventQuery(cu->copy_events[(cu->copies_done + 1) % CUDA_COPY_RING]);
		if (e == cudaErrorNotReady)
			return 0;
		if (e != cudaSuccess)
			return cuda_fail(e, "cudaEventQuery", __FILE__, __LINE__);
		cu->copies_done++;
	}
	return 1;
}

/* Piece blockIdx.x of kv_stage: 16 bytes a thread when everything is 16-byte
 * aligned, else byte by byte. Host slots are read through their mapped
 * device address, over the bus. */
__global__ void kv_stage_kernel(char *dst, const char *pool, size_t pool_block_bytes,
				int64_t pool_blocks, const char *host, size_t host_slot_bytes,
				int64_t host_slots, const int32_t *src, size_t off, size_t bytes,
				bool vec, unsigned *fault)
{
	const int64_t i = blockIdx.x;
	const int32_t id = src[i];
	const char *from;
	char *to = dst + (size_t)i * bytes;

	if (id >= 0 ? id >= pool_blocks : -1 - (int64_t)id >= host_slots) {
		if (threadIdx.x == 0)
			atomicOr(fault, CUDA_FAULT_KV_STAGE);
		return;
	}
	from = id >= 0 ? pool + (size_t)id * pool_block_bytes + off
		       : host + (size_t)(-1 - (int64_t)id) * host_slot_bytes + off;
	if (vec) {
		const uint4 *f = (const uint4 *)from;
		uint4 *t = (uint4 *)to;

		for (size_t j = threadIdx.x; j < bytes / 16; j += blockDim.x)
			t[j] = f[j];
		return;
	}
	for (size_t j = threadIdx.x; j < bytes; j += blockDim.x)
		to[j] = from[j];
}

/* Pieces [i, end) whose blocks follow each other in one memory (device
 * ids up by one, host slots up by one): the end of the run from i. */
static int64_t run_end(const int32_t *ids, int64_t i, int64_t n)
{
	int64_t j = i + 1;
	while (j < n && ((ids[i] >= 0 && ids[j] == ids[j - 1] + 1) ||
			 (ids[i] < 0 && ids[j] < 0 && ids[j] == ids[j - 1] - 1)))
		j++;
	return j;
}

/* The pieces as copy-engine copies, one 2D copy per run, when ids (on the
 * host) make at most KT_STAGE_MAX_RUNS runs: 1 done, 0 not taken. */
static int stage_by_runs(cudaStream_t stream, char *dst, const char *pool,
			 size_t pool_block_bytes, int64_t pool_blocks, const char *host,
			 size_t host_slot_bytes, int64_t host_slots, const int32_t *ids, int64_t n,
			 size_t off, size_t bytes)
{
	int64_t runs = 0;
	for (int64_t i = 0; i < n; i = run_end(ids, i, n)) {
		if (ids[i] >= 0 ? ids[i] >= pool_blocks : -1 - (int64_t)ids[i] >= host_slots)
			return -EINVAL;
		if (++runs > KT_STAGE_MAX_RUNS)
			return 0;
	}
	for (int64_t i = 0, j; i < n; i = j) {
		j = run_end(ids, i, n);
		const bool on_host = ids[i] < 0;
		const size_t pitch = on_host ? host_slot_bytes : pool_block_bytes;
		const char *from = on_host ? host + (size_t)(-1 - (int64_t)ids[i]) * host_slot_bytes
					   : pool + (size_t)ids[i] * pool_block_bytes;
		if (ids[j - 1] < 0 && -1 - (int64_t)ids[j - 1] >= host_slots)
			return -EINVAL;
		if (ids[j - 1] >= 0 && ids[j - 1] >= pool_blocks)
			return -EINVAL;
		CU_CHECK(cudaMemcpy2DAsync(dst + (size_t)i * bytes, bytes, from + off, pitch, bytes,
					   (size_t)(j - i), cudaMemcpyDefault, stream));
	}
	return 1;
}

int cuda_kv_stage(struct kt_backend *be, const struct kt_tensor *dst,
		  const struct kt_tensor *pool, size_t pool_block_bytes, const void *host,
		  size_t host_slot_bytes, int64_t host_slots, const struct kt_tensor *src,
		  const int32_t *src_host, size_t off, size_t bytes, uint64_t *ticket)
{
	cudaStream_t stream;
	struct cuda_backend *cu = cu_of(be);
	void *host_dev = NULL;
	bool vec;

	if (!dst || !dst->data || !pool || !pool->data || !cu_valid(src, KT_I32) ||
	    src->cols != 1 || !pool_block_bytes || off > pool_block_bytes ||
	    bytes > pool_block_bytes - off || src->rows > INT32_MAX ||
	    (host_slots && (!host || off > host_slot_bytes || bytes > host_slot_bytes - off)))
		return -EINVAL;
	if ((size_t)src->rows * bytes > kt_nbytes(dst))
		return -EINVAL;
	if (!src->rows || !bytes)
		return 0;
	CU_CHECK(cu_enter(cu));
	if (host_slots)
		CU_CHECK(cudaHostGetDevicePointer(&host_dev, (void *)host, 0));
	vec = bytes % 16 == 0 && off % 16 == 0 && pool_block_bytes % 16 == 0 &&
	      host_slot_bytes % 16 == 0 && (uintptr_t)dst->data % 16 == 0 &&
	      (uintptr_t)pool->data % 16 == 0 && (uintptr_t)host_dev % 16 == 0;
	stream = cu->stream;
	/* With the ring full of copies still running, it runs as an op. */
	if (ticket && cu->copies_issued - cu->copies_done >= CUDA_COPY_RING &&
	    cuda_copy_done(be, cu->copies_issued - CUDA_COPY_RING + 1) <= 0)
		*ticket = 0, ticket = NULL;
	if (ticket) {
		CU_CHECK(cudaEventRecord(cu->copy_mark, cu->stream));
		CU_CHECK(cudaStreamWaitEvent(cu->copy_stream, cu->copy_mark, 0));
		stream = cu->copy_stream;
	}
	const int64_t pool_blocks = (int64_t)(kt_nbytes(pool) / pool_block_bytes);
	int done = src_host ? stage_by_runs(stream, (char *)dst->data, (const char *)pool->data,
					    pool_block_bytes, pool_blocks, (const char *)host,
					    host_slot_bytes, host_slots, src_host, src->rows, off,
					    bytes)
			    : 0;
	if (done < 0)
		return done;
	if (!done) {
		kv_stage_kernel<<<(unsigned)src->rows, CUDA_THREADS, 0, stream>>>(
			(char *)dst->data, (const char *)pool->data, pool_block_bytes, pool_blocks,
			(const char *)host_dev, host_slot_bytes, host_slots,
			(const int32_t *)src->data, off, bytes, vec, cu->fault);
		CU_LAUNCHED();
	}
	if (ticket) {
		const uint64_t n = cu->copies_issued + 1;
		CU_CHECK(cudaEventRecord(cu->copy_events[n % CUDA_COPY_RING], cu->copy_stream));
		cu->copies_issued = n;
		*ticket = n;
	}
	return 0;
}

int cuda_copy_wait(struct kt_backend *be, uint64_t ticket)
{
	struct cuda_backend *cu = cu_of(be);
	if (ticket > cu->copies_issued)
		return -EINVAL;
	if (ticket <= cu->copies_done)
		return 0;
	CU_CHECK(cu_enter(cu));
	/* A ticket older than the ring's reach has an event recorded again for
	 * a later copy: waiting on that one waits longer, never shorter. */
	CU_CHECK(cudaStreamWaitEvent(cu->stream, cu->copy_events[ticket % CUDA_COPY_RING], 0));
	return 0;
}
