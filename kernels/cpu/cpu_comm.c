/* Expert parallelism's collective on the cpu backend: comm_open joins the
 * ranks through the socket communicator (kernels/comm_socket.h), the only
 * kind the cpu has, and allreduce sums a tensor in place with it (the
 * tensor is host memory already), keeping be->comm up to date.
 *
 * be->comm: rank and n_ranks from comm_open; calls, bytes and ns count the
 * allreduces that went on the wire, the one that broke the communicator
 * included (ns: monotonic time inside them); broken is the positive errno
 * that broke it. A call refused at once (a bad tensor, no communicator, a
 * broken one) counts nothing.
 */
#include <errno.h>
#include <time.h>

#include "common/err.h"
#include "kernels/comm_socket.h"
#include "kernels/cpu/cpu_impl.h"

int cpu_comm_open(struct kt_backend *be, const struct kt_comm_spec *spec, char *err,
		  size_t errlen)
{
	struct cpu_backend *cpu = cpu_of(be);
	int rc;

	if (!spec)
		return atlas_errf(err, errlen, -EINVAL, "backend cpu: comm_open: no spec");
	if (cpu->comm)
		return atlas_errf(err, errlen, -EINVAL,
				  "backend cpu: comm_open: the communicator is open already");
	if (spec->kind != KT_COMM_SOCKET)
		return atlas_errf(err, errlen, -ENOTSUP,
				  "backend cpu: the cpu backend's communicator is sockets "
				  "(kt_comm_spec kind %d)", (int)spec->kind);
	rc = comm_socket_open(spec, &cpu->comm, err, errlen);
	if (rc) {
		atlas_errprefix(err, errlen, "backend cpu");
		return rc;
	}
	be->comm = (struct kt_comm_stats){ .rank = spec->rank, .n_ranks = spec->n_ranks };
	return 0;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int cpu_allreduce(struct kt_backend *be, const struct kt_tensor *x)
{
	struct cpu_backend *cpu = cpu_of(be);
	uint64_t t0;
	int rc;

	if (!cpu_valid(x, KT_F32) || !cpu->comm)
		return -EINVAL;
	if (comm_socket_broken(cpu->comm))
		return -comm_socket_broken(cpu->comm);
	t0 = now_ns();
	rc = comm_socket_allreduce(cpu->comm, x->data, (size_t)(x->rows * x->cols));
	be->comm.ns += now_ns() - t0;
	be->comm.calls++;
	be->comm.bytes += kt_nbytes(x);
	be->comm.broken = comm_socket_broken(cpu->comm);
	return rc;
}
