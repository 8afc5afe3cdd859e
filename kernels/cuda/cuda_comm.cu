/* Expert parallelism's collective on the cuda backend: an NCCL
 * communicator (comm_open, comm_id) and an in-place f32 sum over the ranks
 * (allreduce), contracts in kernels/backend.h.
 *
 * comm_open joins the ranks with ncclCommInitRank on the backend's device,
 * from the ncclUniqueId that rank 0 made with comm_id and the engine's
 * bootstrap handed to every rank (spec->id). It waits until every rank has
 * joined. Only KT_COMM_NCCL: sockets are the cpu backend's.
 *
 * allreduce enqueues ncclAllReduce(sum, f32) in place on the backend's
 * stream, so it is ordered like an op and may be captured into a graph;
 * kt_backend.comm counts the calls, the bytes and the host time to enqueue.
 * An NCCL failure, or an asynchronous error the communicator reports (a
 * peer gone: -EPIPE), breaks the communicator: every later allreduce fails
 * at once with the same errno.
 */
#include <errno.h>
#include <string.h>
#include <time.h>

#include <nccl.h>

extern "C" {
#include "common/err.h"
}
#include "common/clock.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_impl.h"

static_assert(sizeof(ncclUniqueId) == KT_COMM_ID_BYTES, "spec->id holds an ncclUniqueId");

int cuda_comm_id(struct kt_backend *be, unsigned char *id)
{
	ncclUniqueId uid;

	if (!id)
		return -EINVAL;
	NCCL_CHECK(ncclGetUniqueId(&uid));
	memcpy(id, &uid, sizeof uid);
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
	    spec->rank >= spec->n_ranks)
		return atlas_errf(err, errlen, -EINVAL,
				  "comm_open: rank %d of %d: need 0 <= rank < n_ranks <= %d",
				  spec->rank, spec->n_ranks, KT_COMM_MAX_RANKS);
	if ((e = cu_enter(cu)))
		return atlas_errf(err, errlen, -EIO, "comm_open: device %d: %s", cu->device,
				  cudaGetErrorString(e));
	/* The group's next epoch: the old communicator goes (a lost rank may
	 * have left it hung), the new one replaces it. */
	if (cu->nccl) {
		ncclCommAbort(cu->nccl);
		cu->nccl = NULL;
	}
	memcpy(&uid, spec->id, sizeof uid);
	r = ncclCommInitRank(&comm, spec->n_ranks, uid, spec->rank);
	if (r != ncclSuccess)
		return atlas_errf(err, errlen, nccl_errno(r),
				  "comm_open: ncclCommInitRank (rank %d of %d, device %d): %s",
				  spec->rank, spec->n_ranks, cu->device, ncclGetErrorString(r));
	cu->nccl = comm;
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
	uint64_t t0;
	size_t n;

	if (!cu_valid(x, KT_F32))
		return -EINVAL;
	if (!cu->nccl)
		return -ENOTCONN;
	if (be->comm.broken)
		return -be->comm.broken;
	n = (size_t)x->rows * (size_t)x->cols;
	t0 = atlas_now_ns();
	CU_CHECK(cu_enter(cu));
	r = ncclCommGetAsyncError(cu->nccl, &async);
	if (r != ncclSuccess || async != ncclSuccess) {
		(void)nccl_fail(r != ncclSuccess ? r : async, "ncclCommGetAsyncError", __FILE__,
				__LINE__);
		return comm_broken(be, -nccl_errno(r != ncclSuccess ? r : async));
	}
	if (n) {
		r = ncclAllReduce(x->data, x->data, n, ncclFloat32, ncclSum, cu->nccl, cu->stream);
		if (r != ncclSuccess)
			return comm_broken(be, -nccl_fail(r, "ncclAllReduce", __FILE__, __LINE__));
	}
	be->comm.calls++;
	be->comm.bytes += n * sizeof(float);
	be->comm.ns += atlas_now_ns() - t0;
	return 0;
}

void cuda_comm_close(struct cuda_backend *cu)
{
	ncclResult_t r;

	if (!cu->nccl)
		return;
	r = cu->base.comm.broken ? ncclCommAbort(cu->nccl) : ncclCommDestroy(cu->nccl);
	if (r != ncclSuccess)
		(void)nccl_fail(r, cu->base.comm.broken ? "ncclCommAbort" : "ncclCommDestroy",
				__FILE__, __LINE__);
	cu->nccl = NULL;
}
