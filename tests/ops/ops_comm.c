/* Cases of the collective (comm_id, comm_open, allreduce) with one rank, on
 * the backend under test: the communicator of each backend runs its whole
 * path (cpu: sockets; cuda: NCCL, its unique id made by comm_id) where
 * there is one device. A sum over one rank is the tensor itself, bit for
 * bit, and the backend counts the call. Groups of several ranks are
 * tests/ops/test_comm.c (sockets, processes) and tests/engine/test_ep.c.
 * Each case opens a backend of its own: the one under test keeps no
 * communicator.
 */
#include <errno.h>
#include <string.h>

#include "common/err.h"
#include "tests/ops/ops.h"

struct comm_params {
	int rows, cols;
};

struct comm_out {
	int rc_id, rc_open, rc_reduce;
	float *before, *after;
	struct kt_comm_stats stats;
	const char *kind;
};

static void *comm_run(struct op_run *r, const void *params, const void *in,
		      const struct op_backend *b)
{
	const struct comm_params *p = params;
	struct comm_out *o = op_alloc(r, sizeof *o);
	const struct op_backend *own = op_open(r, b, b->config);
	struct kt_comm_spec spec = { .rank = 0, .n_ranks = 1, .timeout_ms = 1000 };
	char err[ATLAS_ERRLEN];
	const size_t n = (size_t)p->rows * (size_t)p->cols;

	for (int i = 0; i < KT_COMM_MAX_RANKS; i++)
		spec.fds[i] = -1;
	o->kind = own->kind;
	spec.kind = strcmp(own->kind, "cuda") ? KT_COMM_SOCKET : KT_COMM_NCCL;
	o->rc_id = spec.kind == KT_COMM_NCCL ? kt_comm_id(own->be, spec.id) : 0;
	o->rc_open = o->rc_id ? o->rc_id : kt_comm_open(own->be, &spec, err, sizeof err);
	o->before = op_floats(r, n);
	op_fill(r, o->before, n, 3.0f);
	struct kt_tensor x = op_tensor(r, own, KT_F32, p->rows, p->cols, o->before);
	o->rc_reduce = o->rc_open ? o->rc_open : kt_allreduce(own->be, &x);
	o->after = op_get(r, own, &x);
	o->stats = own->be->comm;
	return o;
}

static void comm_check(struct op_run *r, const void *params, const void *in, const void *got,
		       const void *cpu)
{
	const struct comm_params *p = params;
	const struct comm_out *o = got;

	op_check_rc(r, o->rc_id, 0, "comm_id on %s", o->kind);
	op_check_rc(r, o->rc_open, 0, "comm_open of one rank on %s", o->kind);
	op_check_rc(r, o->rc_reduce, 0, "allreduce over one rank");
	op_check_bits(r, o->after, o->before, (size_t)p->rows * (size_t)p->cols,
		      "a sum over one rank is the tensor");
	op_check(r, o->stats.n_ranks == 1 && o->stats.rank == 0 && o->stats.calls == 1 &&
		 o->stats.bytes == (uint64_t)p->rows * (uint64_t)p->cols * 4 && !o->stats.broken,
		 "the backend counts the call (rank %d of %d, %llu calls, %llu bytes)",
		 o->stats.rank, o->stats.n_ranks, (unsigned long long)o->stats.calls,
		 (unsigned long long)o->stats.bytes);
}

static const struct op_family comm_one = { NULL, comm_run, comm_check, true };

#define COMM(name, ...) \
	{ name, "allreduce", &comm_one, &(const struct comm_params){ __VA_ARGS__ } }

static const struct op_case cases[] = {
	COMM("allreduce one rank [1, 7]", .rows = 1, .cols = 7),
	COMM("allreduce one rank [64, 2048]", .rows = 64, .cols = 2048),
};

OP_LIST(ops_comm, cases);
