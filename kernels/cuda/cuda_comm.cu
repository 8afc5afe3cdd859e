/* Expert parallelism's collective on the cuda backend: an NCCL
 * communicator (comm_open, comm_id) and an in-place f32 sum over the ranks
 * (allreduce), contracts in kernels/backend.h; and the wait of a sync point
 * while a communicator is open (cuda_comm_wait).
 *
 * comm_open joins the ranks with ncclCommInitRank on the backend's device,
 * from the ncclUniqueId that rank 0 made with comm_id and the engine's
 * bootstrap handed to every rank (spec->id). It waits until every rank has
 * joined. Only KT_COMM_NCCL: sockets are the cpu backend's.
 *
 * allreduce enqueues ncclAllReduce(sum, f32) in place on the backend's
 * stream, so it is ordered like an op and may be captured into a graph.
 * Two one-thread kernels around it read the device's global timer and add
 * the call, its bytes and its time to comm_clock, so graph replays are
 * counted as well as op-by-op steps; the time is what the device spent in
 * the collective, waiting for a slower peer included. Each sync point
 * copies the counts into kt_backend.comm.
 *
 * A peer that dies or stops leaves this rank's NCCL kernel waiting for it
 * forever, so with a communicator open a sync point does not block in
 * cudaStreamSynchronize: it polls the stream and the communicator's
 * asynchronous error, and past spec.timeout_ms (ep_timeout) aborts the
 * communicator, which ends its kernels, and fails with -ETIMEDOUT (-EPIPE
 * for an error NCCL reported). The communicator is broken from then on:
 * every later allreduce fails at once with the same errno, and the next
 * comm_open (the group's next epoch) replaces it.
 *
 * A communicator ends by ncclCommAbort, never ncclCommDestroy, which waits
 * for every rank to destroy theirs (the head closing while its workers
 * waited to rejoin hung in it; H100 x2, NCCL 2.28). The graphs go first:
 * a graph that launches NCCL kernels holds a reference on the
 * communicator, and NCCL's teardown waits until every such graph is freed,
 * so aborting with graphs kept hung every close (H200 x2, NCCL 2.28). A
 * graph still in flight is freed by CUDA once it completes, which the
 * abort brings about. The abort runs on a thread of its own and is waited
 * for at most ABORT_WAIT_MS: a teardown that hangs on a peer is logged and
 * left behind, so no epoch change, failed step or close can hang on it.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include <nccl.h>

extern "C" {
#include "common/err.h"
#include "common/log.h"
}
#include "common/clock.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_impl.h"

static_assert(sizeof(ncclUniqueId) == KT_COMM_ID_BYTES, "spec->id holds an ncclUniqueId");

/* How long a sync point waits for the stream after ncclCommAbort before it
 * calls the device stuck. */
#define ABORT_DRAIN_MS 10000
/* How long a teardown waits for ncclCommAbort before it leaves it behind. */
#define ABORT_WAIT_MS 5000

/* One ncclCommAbort on its own thread; the last of the waiter and the
 * thread to let go frees it. */
struct abort_job {
	ncclComm_t comm;
	int device;
	pthread_mutex_t lock;
	pthread_cond_t done_cv;
	bool done;
	int refs;
};

static void abort_job_put(struct abort_job *j)
{
	pthread_mutex_lock(&j->lock);
	const int refs = --j->refs;
	pthread_mutex_unlock(&j->lock);
	if (refs)
		return;
	pthread_mutex_destroy(&j->lock);
	pthread_cond_destroy(&j->done_cv);
	free(j);
}

static void *abort_main(void *arg)
{
	struct abort_job *j = (struct abort_job *)arg;
	ncclResult_t r;

	(void)cudaSetDevice(j->device);
	r = ncclCommAbort(j->comm);
	if (r != ncclSuccess)
		(void)nccl_fail(r, "ncclCommAbort", __FILE__, __LINE__);
	pthread_mutex_lock(&j->lock);
	j->done = true;
	pthread_cond_signal(&j->done_cv);
	pthread_mutex_unlock(&j->lock);
	abort_job_put(j);
	return NULL;
}

/* Abort cu's communicator, waiting at most ABORT_WAIT_MS, after dropping
 * the graphs (those that launch its kernels keep it alive); cu->nccl is
 * NULL after it either way. */
static void end_comm(struct cuda_backend *cu)
{
	struct abort_job *j;
	struct timespec until;
	pthread_attr_t attr;
	pthread_t thread;
	bool done;

	if (!cu->nccl)
		return;
	cuda_graphs_free(cu);
	j = (struct abort_job *)calloc(1, sizeof *j);
	if (!j) {
		ncclCommAbort(cu->nccl);
		cu->nccl = NULL;
		return;
	}
	j->comm = cu->nccl;
	j->device = cu->device;
	j->refs = 2;
	pthread_mutex_init(&j->lock, NULL);
	pthread_cond_init(&j->done_cv, NULL);
	cu->nccl = NULL;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&thread, &attr, abort_main, j)) {
		pthread_attr_destroy(&attr);
		j->refs = 1;
		abort_main(j);
		return;
	}
	pthread_attr_destroy(&attr);
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += ABORT_WAIT_MS / 1000;
	until.tv_nsec += (long)(ABORT_WAIT_MS % 1000) * 1000000L;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&j->lock);
	while (!j->done && !pthread_cond_timedwait(&j->done_cv, &j->lock, &until))
		;
	done = j->done;
	pthread_mutex_unlock(&j->lock);
	if (!done)
		log_error("cuda: device %d: ncclCommAbort did not return in %d ms; the "
			  "communicator is left behind", cu->device, ABORT_WAIT_MS);
	abort_job_put(j);
}

static __device__ unsigned long long global_ns(void)
{
	unsigned long long t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

static __global__ void clock_start_kernel(struct cuda_comm_clock *c)
{
	c->start = global_ns();
}

static __global__ void clock_stop_kernel(struct cuda_comm_clock *c, unsigned long long bytes)
{
	c->ns += global_ns() - c->start;
	c->calls++;
	c->bytes += bytes;
}

int cuda_comm_id(struct kt_backend *be, unsigned char *id)
{
	ncclUniqueId uid;

	if (!id)
		return -EINVAL;
	NCCL_CHECK(ncclGetUniqueId(&uid));
	memcpy(id, &uid, sizeof uid);
	return 0;
}

/* The device counters and their pinned copy, once per backend. */
static int make_clock(struct cuda_backend *cu)
{
	if (cu->comm_clock)
		return 0;
	CU_CHECK(cudaMalloc((void **)&cu->comm_clock, sizeof *cu->comm_clock));
	CU_CHECK(cudaMemsetAsync(cu->comm_clock, 0, sizeof *cu->comm_clock, cu->stream));
	CU_CHECK(cudaMallocHost((void **)&cu->comm_clock_host, sizeof *cu->comm_clock_host));
	memset(cu->comm_clock_host, 0, sizeof *cu->comm_clock_host);
	return 0;
}

int cuda_comm_open(struct kt_backend *be, const struct kt_comm_spec *spec, char *err,
		   size_t errlen)
{
	struct cuda_backend *cu = cu_of(be);
	ncclUniqueId uid;
	ncclComm_t comm = NULL;
	ncclResult_t r;
	cudaError_t e;

	if (!spec)
		return atlas_errf(err, errlen, -EINVAL, "comm_open: no spec");
	if (spec->kind == KT_COMM_SOCKET)
		return atlas_errf(err, errlen, -ENOTSUP,
				  "comm_open: sockets: the cuda backend's communicator is NCCL");
	if (spec->kind != KT_COMM_NCCL)
		return atlas_errf(err, errlen, -EINVAL, "comm_open: unknown kind %d",
				  (int)spec->kind);
	if (spec->n_ranks < 1 || spec->n_ranks > KT_COMM_MAX_RANKS || spec->rank < 0 ||
	    spec->rank >= spec->n_ranks || spec->timeout_ms <= 0)
		return atlas_errf(err, errlen, -EINVAL,
				  "comm_open: rank %d of %d, timeout %d ms: need 0 <= rank < "
				  "n_ranks <= %d and a timeout > 0", spec->rank, spec->n_ranks,
				  spec->timeout_ms, KT_COMM_MAX_RANKS);
	if ((e = cu_enter(cu)))
		return atlas_errf(err, errlen, -EIO, "comm_open: device %d: %s", cu->device,
				  cudaGetErrorString(e));
	if (make_clock(cu))
		return atlas_errf(err, errlen, -ENOMEM, "comm_open: device %d: no memory for "
				  "the collectives' counters", cu->device);
	/* The group's next epoch: the old communicator goes (a lost rank may
	 * have left it hung), and with it the graphs that launch its kernels. */
	end_comm(cu);
	memcpy(&uid, spec->id, sizeof uid);
	r = ncclCommInitRank(&comm, spec->n_ranks, uid, spec->rank);
	if (r != ncclSuccess)
		return atlas_errf(err, errlen, nccl_errno(r),
				  "comm_open: ncclCommInitRank (rank %d of %d, device %d): %s",
				  spec->rank, spec->n_ranks, cu->device, ncclGetErrorString(r));
	cu->nccl = comm;
	cu->nccl_timeout_ms = spec->timeout_ms;
	be->comm.rank = spec->rank;
	be->comm.n_ranks = spec->n_ranks;
	be->comm.broken = 0;
	be->comm.broken_rank = -1;
	return 0;
}

/* Mark the communicator broken by errno code (> 0); returns -code. */
static int comm_broken(struct kt_backend *be, int code)
{
	be->comm.broken = code;
	return -code;
}

int cuda_allreduce(struct kt_backend *be, const struct kt_tensor *x)
{
	struct cuda_backend *cu = cu_of(be);
	ncclResult_t r, async = ncclSuccess;
	size_t n;

	if (!cu_valid(x, KT_F32))
		return -EINVAL;
	if (be->comm.broken)
		return -be->comm.broken;
	if (!cu->nccl)
		return -ENOTCONN;
	n = (size_t)x->rows * (size_t)x->cols;
	CU_CHECK(cu_enter(cu));
	r = ncclCommGetAsyncError(cu->nccl, &async);
	if (r != ncclSuccess || async != ncclSuccess) {
		(void)nccl_fail(r != ncclSuccess ? r : async, "ncclCommGetAsyncError", __FILE__,
				__LINE__);
		return comm_broken(be, -nccl_errno(r != ncclSuccess ? r : async));
	}
	if (!n)
		return 0;
	clock_start_kernel<<<1, 1, 0, cu->stream>>>(cu->comm_clock);
	CU_LAUNCHED();
	r = ncclAllReduce(x->data, x->data, n, ncclFloat32, ncclSum, cu->nccl, cu->stream);
	if (r != ncclSuccess)
		return comm_broken(be, -nccl_fail(r, "ncclAllReduce", __FILE__, __LINE__));
	clock_stop_kernel<<<1, 1, 0, cu->stream>>>(cu->comm_clock,
						   (unsigned long long)(n * sizeof(float)));
	CU_LAUNCHED();
	return 0;
}

/* Abort the communicator for errno code (> 0) and let the stream drain:
 * its NCCL kernels end once the abort is seen. Returns -code, or -EIO when
 * the stream still does not finish. */
static int abort_comm(struct cuda_backend *cu, int code, const char *why)
{
	const uint64_t deadline = atlas_now_ns() + (uint64_t)ABORT_DRAIN_MS * 1000000u;

	log_error("cuda: device %d: expert parallelism's collective: %s; aborting the NCCL "
		  "communicator", cu->device, why);
	end_comm(cu);
	cu->base.comm.broken = code;
	/* With two ranks the silent peer is the other one. */
	cu->base.comm.broken_rank = cu->base.comm.n_ranks == 2 ? 1 - cu->base.comm.rank : -1;
	while (cudaStreamQuery(cu->stream) == cudaErrorNotReady) {
		if (atlas_now_ns() > deadline) {
			log_error("cuda: device %d: the stream did not finish %d ms after "
				  "ncclCommAbort", cu->device, ABORT_DRAIN_MS);
			return -EIO;
		}
		sched_yield();
	}
	(void)cudaGetLastError();
	return -code;
}

int cuda_comm_wait(struct cuda_backend *cu)
{
	const uint64_t deadline = atlas_now_ns() + (uint64_t)cu->nccl_timeout_ms * 1000000u;
	ncclResult_t r, async;
	cudaError_t e;

	CU_CHECK(cudaMemcpyAsync(cu->comm_clock_host, cu->comm_clock, sizeof *cu->comm_clock,
				 cudaMemcpyDeviceToHost, cu->stream));
	while ((e = cudaStreamQuery(cu->stream)) == cudaErrorNotReady) {
		async = ncclSuccess;
		r = ncclCommGetAsyncError(cu->nccl, &async);
		if (r != ncclSuccess || (async != ncclSuccess && async != ncclInProgress))
			return abort_comm(cu, -nccl_errno(r != ncclSuccess ? r : async),
					  ncclGetErrorString(r != ncclSuccess ? r : async));
		if (atlas_now_ns() > deadline) {
			char why[96];
			snprintf(why, sizeof why, "no progress for %d ms (ep_timeout): a peer is "
				 "gone or stopped", cu->nccl_timeout_ms);
			return abort_comm(cu, ETIMEDOUT, why);
		}
		sched_yield();
	}
	if (e != cudaSuccess)
		return cuda_fail(e, "cudaStreamQuery", __FILE__, __LINE__);
	cu->base.comm.calls = cu->comm_clock_host->calls;
	cu->base.comm.bytes = cu->comm_clock_host->bytes;
	cu->base.comm.ns = cu->comm_clock_host->ns;
	return 0;
}

void cuda_comm_end(struct kt_backend *be)
{
	struct cuda_backend *cu = cu_of(be);

	end_comm(cu);
}

void cuda_comm_close(struct cuda_backend *cu)
{
	end_comm(cu);
	CU_WARN(cudaFree(cu->comm_clock));
	CU_WARN(cudaFreeHost(cu->comm_clock_host));
	cu->comm_clock = NULL;
	cu->comm_clock_host = NULL;
}
