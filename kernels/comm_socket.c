/* The socket communicator (comm_socket.h): rank 0 in the middle of a star
 * of connected stream sockets, sums in rank order, every wait bounded. */
#include "kernels/comm_socket.h"

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/err.h"

#define WIRE_MAGIC 0x31725361u /* "aSr1" in little-endian bytes */
#define RECV_FLOATS (16 * 1024)  /* rank 0 receives and adds 64 KiB at a time */

/* What precedes every payload. */
struct wire_hdr {
	uint32_t magic;
	uint16_t rank, n_ranks; /* the sender's */
	uint64_t call;          /* the sender's allreduce count before this one */
	uint64_t bytes;         /* of the payload that follows */
};

struct comm_socket {
	int rank, n_ranks, timeout_ms;
	int fds[KT_COMM_MAX_RANKS]; /* rank 0: fds[r] to rank r > 0; else fds[0]; -1: none */
	uint64_t calls;             /* collectives that went on the wire */
	int broken;                 /* 0, or the errno that broke the communicator */
	int broken_peer;            /* rank 0: the peer whose socket failed, else -1 */
	float *buf;                 /* rank 0: [RECV_FLOATS], one peer's payload at a time */
};

static int64_t now_ms(void)
{
	return (int64_t)(atlas_now_ns() / 1000000u);
}

/* Wait until fd is ready for events, at most timeout_ms: 0 or -ETIMEDOUT.
 * An error or hang-up on fd counts as ready: the next send or recv says
 * what it is. */
static int wait_fd(const struct comm_socket *c, int fd, short events)
{
	const int64_t deadline = now_ms() + c->timeout_ms;
	struct pollfd p = { .fd = fd, .events = events };

	for (;;) {
		int64_t left = deadline - now_ms();
		int rc;

		if (left < 0)
			left = 0;
		rc = poll(&p, 1, (int)left);
		if (rc > 0)
			return 0;
		if (rc == 0)
			return -ETIMEDOUT;
		if (errno != EINTR)
			return -errno;
	}
}

/* A socket error as the communicator reports it: a peer that is gone is -EPIPE. */
static int sock_error(int e)
{
	return e == EPIPE || e == ECONNRESET || e == ENOTCONN ? -EPIPE : -e;
}

static int send_all(const struct comm_socket *c, int fd, const void *p, size_t n)
{
	const char *b = p;

	while (n) {
		ssize_t r = send(fd, b, n, MSG_NOSIGNAL | MSG_DONTWAIT);
		int rc;

		if (r > 0) {
			b += r;
			n -= (size_t)r;
			continue;
		}
		if (r < 0 && errno == EINTR)
			continue;
		if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
			return r == 0 ? -EPIPE : sock_error(errno);
		rc = wait_fd(c, fd, POLLOUT);
		if (rc)
			return rc;
	}
	return 0;
}

static int recv_all(const struct comm_socket *c, int fd, void *p, size_t n)
{
	char *b = p;

	while (n) {
		ssize_t r = recv(fd, b, n, MSG_DONTWAIT);
		int rc;

		if (r > 0) {
			b += r;
			n -= (size_t)r;
			continue;
		}
		if (r == 0)
			return -EPIPE;
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return sock_error(errno);
		rc = wait_fd(c, fd, POLLIN);
		if (rc)
			return rc;
	}
	return 0;
}

static int send_msg(const struct comm_socket *c, int fd, uint64_t call, const float *x,
		    size_t bytes)
{
	const struct wire_hdr h = { .magic = WIRE_MAGIC, .rank = (uint16_t)c->rank,
				    .n_ranks = (uint16_t)c->n_ranks, .call = call,
				    .bytes = bytes };
	int rc = send_all(c, fd, &h, sizeof h);

	return rc ? rc : send_all(c, fd, x, bytes);
}

/* Receive the header of call's message from rank `from`; -EPROTO unless it
 * is exactly what this rank expects. */
static int recv_hdr(const struct comm_socket *c, int fd, int from, uint64_t call, size_t bytes)
{
	struct wire_hdr h;
	int rc = recv_all(c, fd, &h, sizeof h);

	if (rc)
		return rc;
	if (h.magic != WIRE_MAGIC || h.rank != from || h.n_ranks != c->n_ranks ||
	    h.call != call || h.bytes != bytes)
		return -EPROTO;
	return 0;
}

/* Rank 0: x += each peer's x in rank order, then the sum to every peer. */
static int reduce_head(struct comm_socket *c, uint64_t call, float *x, size_t n)
{
	const size_t bytes = n * sizeof(float);
	int rc;

	for (int r = 1; r < c->n_ranks; r++) {
		rc = recv_hdr(c, c->fds[r], r, call, bytes);
		for (size_t i = 0; !rc && i < n; i += RECV_FLOATS) {
			const size_t m = n - i < RECV_FLOATS ? n - i : RECV_FLOATS;

			rc = recv_all(c, c->fds[r], c->buf, m * sizeof(float));
			for (size_t j = 0; !rc && j < m; j++)
				x[i + j] += c->buf[j];
		}
		if (rc) {
			c->broken_peer = r;
			return rc;
		}
	}
	for (int r = 1; r < c->n_ranks; r++) {
		rc = send_msg(c, c->fds[r], call, x, bytes);
		if (rc) {
			c->broken_peer = r;
			return rc;
		}
	}
	return 0;
}

/* Rank > 0: x to rank 0, the sum back into x. */
static int reduce_peer(struct comm_socket *c, uint64_t call, float *x, size_t n)
{
	const size_t bytes = n * sizeof(float);
	int rc = send_msg(c, c->fds[0], call, x, bytes);

	if (!rc)
		rc = recv_hdr(c, c->fds[0], 0, call, bytes);
	return rc ? rc : recv_all(c, c->fds[0], x, bytes);
}

int comm_socket_allreduce(struct comm_socket *c, float *x, size_t n)
{
	uint64_t call;
	int rc;

	if (c->broken)
		return -c->broken;
	call = c->calls++;
	if (c->n_ranks == 1)
		return 0;
	rc = c->rank == 0 ? reduce_head(c, call, x, n) : reduce_peer(c, call, x, n);
	if (rc) {
		c->broken = -rc;
		for (int r = 0; r < c->n_ranks; r++)
			if (c->fds[r] >= 0)
				shutdown(c->fds[r], SHUT_RDWR);
	}
	return rc;
}

int comm_socket_broken(const struct comm_socket *c)
{
	return c->broken;
}

int comm_socket_broken_peer(const struct comm_socket *c)
{
	return c->broken_peer;
}

/* Rank `rank` holds a socket to rank r: rank 0 to every other, the others to 0. */
static bool needs_fd(int rank, int r)
{
	return (rank == 0) != (r == 0);
}

/* fd is a stream socket. */
static bool stream_socket(int fd)
{
	int type = 0;
	socklen_t len = sizeof type;

	return fd >= 0 && getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 &&
	       type == SOCK_STREAM;
}

int comm_socket_open(const struct kt_comm_spec *spec, struct comm_socket **out, char *err,
		     size_t errlen)
{
	struct comm_socket *c;

	if (spec->kind != KT_COMM_SOCKET)
		return atlas_errf(err, errlen, -EINVAL, "comm socket: the spec is not of sockets");
	if (spec->n_ranks < 1 || spec->n_ranks > KT_COMM_MAX_RANKS || spec->rank < 0 ||
	    spec->rank >= spec->n_ranks)
		return atlas_errf(err, errlen, -EINVAL,
				  "comm socket: rank %d of %d: want 0 <= rank < ranks <= %d",
				  spec->rank, spec->n_ranks, KT_COMM_MAX_RANKS);
	if (spec->timeout_ms <= 0)
		return atlas_errf(err, errlen, -EINVAL, "comm socket: timeout_ms %d: must be > 0",
				  spec->timeout_ms);
	for (int r = 0; r < spec->n_ranks; r++) {
		if (!needs_fd(spec->rank, r))
			continue;
		if (!stream_socket(spec->fds[r]))
			return atlas_errf(err, errlen, -EINVAL,
					  "comm socket: rank %d: fds[%d] = %d is not a stream socket",
					  spec->rank, r, spec->fds[r]);
		for (int q = 1; q < r; q++)
			if (spec->fds[q] == spec->fds[r])
				return atlas_errf(err, errlen, -EINVAL,
						  "comm socket: fds[%d] and fds[%d] are both %d", q,
						  r, spec->fds[r]);
	}
	c = calloc(1, sizeof(*c));
	if (c && spec->rank == 0 && spec->n_ranks > 1)
		c->buf = malloc(RECV_FLOATS * sizeof(float));
	if (!c || (spec->rank == 0 && spec->n_ranks > 1 && !c->buf)) {
		free(c);
		return atlas_errf(err, errlen, -ENOMEM, "comm socket: out of memory");
	}
	c->rank = spec->rank;
	c->n_ranks = spec->n_ranks;
	c->broken_peer = -1;
	c->timeout_ms = spec->timeout_ms;
	for (int r = 0; r < KT_COMM_MAX_RANKS; r++)
		c->fds[r] = r < c->n_ranks && needs_fd(c->rank, r) ? spec->fds[r] : -1;
	*out = c;
	return 0;
}

void comm_socket_close(struct comm_socket *c)
{
	if (!c)
		return;
	for (int r = 0; r < KT_COMM_MAX_RANKS; r++)
		if (c->fds[r] >= 0)
			close(c->fds[r]);
	free(c->buf);
	free(c);
}
