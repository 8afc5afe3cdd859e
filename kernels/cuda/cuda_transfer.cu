/* Host memory for the KV swap tier and copies between it and device memory
 * (backend.h: host_alloc, copy_async, copy_done).
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
		e = cudaHostRegister(p, n, cudaHostRegisterPortable);
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
