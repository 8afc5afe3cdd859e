/* Expert parallelism's collective on the cpu backend: comm_open joins the
 * ranks through the socket communicator (kernels/comm_socket.h), the only
 * kind the cpu has, and allreduce sums a tensor in place with it (the
 * tensor is host memory already), keeping be->comm up to date.
 *
 * be->comm: rank and n_ranks from comm_open; calls, bytes and ns count the
 * allreduces that went on the wire, the one that broke the communicator
 * included (ns: monotonic time inside them); broken is the positive errno
 * that broke it, broken_rank (rank 0) the peer whose socket failed. A
 * second comm_open (the group's next epoch) replaces the communicator. A call refused at once (a bad tensor, no communicator, a
 * broken one) counts nothing.
 */
#include <errno.h>
#include <time.h>

#include "common/clock.h"
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
	if (spec->kind != KT_COMM_SOCKET)
		return atlas_errf(err, errlen, -ENOTSUP,
				  "backend cpu: the cpu backend's communicator is sockets "
				  "(kt_comm_spec kind %d)", (int)spec->kind);
	struct comm_socket *c;
	rc = comm_socket_open(spec, &c, err, errlen);
	if (rc) {
		atlas_errprefix(err, errlen, "backend cpu");
		return rc;
	}
	/* A new epoch of the group: the new communicator replaces the old;
	 * the counts go on. */
	comm_socket_close(cpu->comm);
	cpu->comm = c;
	be->comm.rank = spec->rank;
	be->comm.n_ranks = spec->n_ranks;
	be->comm.broken = 0;
	be->comm.broken_rank = -1;
	return 0;
}

void cpu_comm_close(struct kt_backend *be)
{
	struct cpu_backend *cpu = cpu_of(be);

	comm_socket_close(cpu->comm);
	cpu->comm = NULL;
}

int cpu_comm_id(struct kt_backend *be, unsigned char id[KT_COMM_ID_BYTES])
{
	return -ENOTSUP; /* sockets need no id: the fds are the group */
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
	t0 = atlas_now_ns();
	rc = comm_socket_allreduce(cpu->comm, x->data, (size_t)(x->rows * x->cols));
	be->comm.ns += atlas_now_ns() - t0;
	be->comm.calls++;
	be->comm.bytes += kt_nbytes(x);
	be->comm.broken = comm_socket_broken(cpu->comm);
	be->comm.broken_rank = comm_socket_broken_peer(cpu->comm);
	return rc;
}
