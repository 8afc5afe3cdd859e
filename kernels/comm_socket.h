/* The socket communicator of expert parallelism: a sum over ranks of f32
 * buffers in host memory, over the connected stream sockets of a
 * kt_comm_spec (KT_COMM_SOCKET), for any backend that stages its tensors on
 * the host (the cpu backend's allreduce uses it directly).
 *
 * A star: rank 0 receives every other rank's buffer in rank order, adds
 * them into its own in rank order 1, 2, ... (so each element is
 * ((x0 + x1) + x2) + ..., the same on every rank and at every call), then
 * sends the sum back to each rank; a rank > 0 sends its buffer and receives
 * the sum. A value that one rank holds and the others hold as +0 comes out
 * as that rank's (x + 0 == x for every x but -0, which becomes +0).
 *
 * Each message is a header (magic, sender rank and rank count, call number,
 * payload bytes) and the payload, in host byte order: the ranks share an
 * architecture. A header that does not match what the receiver expects (a
 * peer a call behind or ahead, or reducing another size) is -EPROTO.
 *
 * Faults: every wait for a socket is bounded by poll() with the spec's
 * timeout_ms, counted from the last byte that moved: a silent peer is
 * -ETIMEDOUT, a closed or reset one -EPIPE. The first failure breaks the
 * communicator: it shuts its sockets down (so that the peers blocked on it
 * learn at once, as -EPIPE) and every later call fails at once with the
 * same errno. Signals interrupt nothing (EINTR is retried on the same
 * deadline) and a closed peer raises no SIGPIPE (MSG_NOSIGNAL).
 *
 * Memory: one receive buffer allocated at open; calls allocate nothing.
 */
#ifndef ATLAS_KERNELS_COMM_SOCKET_H
#define ATLAS_KERNELS_COMM_SOCKET_H

#include <stddef.h>

#include "kernels/backend.h"

struct comm_socket;

/* Check spec (KT_COMM_SOCKET, rank < n_ranks <= KT_COMM_MAX_RANKS,
 * timeout_ms > 0, the fds this rank needs are stream sockets) and take its
 * fds: on success the communicator owns them and closes them at
 * comm_socket_close; on failure they stay the caller's. -EINVAL (with a
 * message in err) for a bad spec, -ENOMEM. Exchanges nothing. */
int comm_socket_open(const struct kt_comm_spec *spec, struct comm_socket **out, char *err,
		     size_t errlen);
/* x[0..n) = the sum over ranks of x[0..n), in place, on every rank; every
 * rank passes the same n. 0, or -ETIMEDOUT, -EPIPE, -EPROTO or another
 * negative errno of the sockets: the communicator is broken from then on. */
int comm_socket_allreduce(struct comm_socket *c, float *x, size_t n);
/* 0, or the (positive) errno that broke the communicator. */
int comm_socket_broken(const struct comm_socket *c);
/* Rank 0 of a broken communicator: the peer whose socket failed (the
 * first one that did), else -1. */
int comm_socket_broken_peer(const struct comm_socket *c);
/* Close the fds and free c (NULL is a no-op). */
void comm_socket_close(struct comm_socket *c);

#endif
