/* TCP helpers of expert parallelism (net.h). */
#include "engine/ep/net.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/err.h"

/* Split "host:port" (or "[v6]:port") into its parts. */
static int split_address(const char *address, char *host, size_t hostlen, char *port,
			 size_t portlen)
{
	const char *colon = strrchr(address, ':');
	const char *h = address;
	size_t n;

	if (!colon || !colon[1] || strlen(colon + 1) >= portlen)
		return -EINVAL;
	n = (size_t)(colon - address);
	if (n >= 2 && h[0] == '[' && h[n - 1] == ']') {
		h++;
		n -= 2;
	}
	if (n == 0 || n >= hostlen)
		return -EINVAL;
	memcpy(host, h, n);
	host[n] = '\0';
	snprintf(port, portlen, "%s", colon + 1);
	return 0;
}

static int resolve(const char *address, bool passive, struct addrinfo **out, char *err,
		   size_t errlen)
{
	char host[256], port[16];
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
				  .ai_flags = passive ? AI_PASSIVE : 0 };
	int rc;

	if (split_address(address, host, sizeof host, port, sizeof port))
		return atlas_errf(err, errlen, -EINVAL,
				  "ep_address '%s': not host:port", address);
	if ((rc = getaddrinfo(host, port, &hints, out)))
		return atlas_errf(err, errlen, -EHOSTUNREACH, "ep_address '%s': %s", address,
				  gai_strerror(rc));
	return 0;
}

int ep_listen(const char *address, int *fd_out, int *port_out, char *err, size_t errlen)
{
	struct addrinfo *ai;
	int rc = resolve(address, true, &ai, err, errlen), fd = -1, one = 1;

	if (rc)
		return rc;
	rc = -EADDRNOTAVAIL;
	for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
		fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (fd < 0) {
			rc = -errno;
			continue;
		}
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (bind(fd, a->ai_addr, a->ai_addrlen) || listen(fd, 16)) {
			rc = -errno;
			close(fd);
			fd = -1;
		}
	}
	freeaddrinfo(ai);
	if (fd < 0)
		return atlas_errf(err, errlen, rc, "ep_address '%s': cannot listen: %s", address,
				  strerror(-rc));
	struct sockaddr_storage ss;
	socklen_t len = sizeof ss;
	*port_out = 0;
	if (!getsockname(fd, (struct sockaddr *)&ss, &len))
		*port_out = ntohs(ss.ss_family == AF_INET6
					  ? ((struct sockaddr_in6 *)&ss)->sin6_port
					  : ((struct sockaddr_in *)&ss)->sin_port);
	*fd_out = fd;
	return 0;
}

/* Wait until fd is ready for events, at most timeout_ms. */
static int wait_fd(int fd, short events, int timeout_ms)
{
	struct pollfd p = { .fd = fd, .events = events };
	for (;;) {
		int n = poll(&p, 1, timeout_ms);
		if (n > 0)
			return 0;
		if (n == 0)
			return -ETIMEDOUT;
		if (errno != EINTR)
			return -errno;
	}
}

static void nodelay(int fd)
{
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int ep_connect(const char *address, int timeout_ms, int *fd_out, char *err, size_t errlen)
{
	struct addrinfo *ai;
	int rc = resolve(address, false, &ai, err, errlen), fd = -1;

	if (rc)
		return rc;
	rc = -ECONNREFUSED;
	for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
		fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (fd < 0) {
			rc = -errno;
			continue;
		}
		if (connect(fd, a->ai_addr, a->ai_addrlen) && errno != EINPROGRESS) {
			rc = -errno;
		} else if (!(rc = wait_fd(fd, POLLOUT, timeout_ms))) {
			int e = 0;
			socklen_t len = sizeof e;
			getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len);
			rc = -e;
		}
		if (rc) {
			close(fd);
			fd = -1;
		}
	}
	freeaddrinfo(ai);
	if (fd < 0)
		return atlas_errf(err, errlen, rc, "ep: cannot connect to %s: %s", address,
				  strerror(-rc));
	nodelay(fd);
	*fd_out = fd;
	return 0;
}

int ep_accept(int listen_fd, int timeout_ms, int *fd_out)
{
	int rc = wait_fd(listen_fd, POLLIN, timeout_ms);
	if (rc)
		return rc == -ETIMEDOUT ? -EAGAIN : rc;
	int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
	if (fd < 0)
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	nodelay(fd);
	*fd_out = fd;
	return 0;
}

int ep_send_all(int fd, const void *buf, size_t n, int timeout_ms)
{
	const char *p = buf;
	while (n) {
		ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
		if (k > 0) {
			p += k;
			n -= (size_t)k;
			continue;
		}
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
			return errno == ECONNRESET ? -EPIPE : -errno;
		int rc = wait_fd(fd, POLLOUT, timeout_ms);
		if (rc)
			return rc;
	}
	return 0;
}

int ep_recv_all(int fd, void *buf, size_t n, int timeout_ms)
{
	char *p = buf;
	while (n) {
		ssize_t k = recv(fd, p, n, 0);
		if (k > 0) {
			p += k;
			n -= (size_t)k;
			continue;
		}
		if (k == 0)
			return -EPIPE;
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return errno == ECONNRESET ? -EPIPE : -errno;
		int rc = wait_fd(fd, POLLIN, timeout_ms);
		if (rc)
			return rc;
	}
	return 0;
}

void ep_host_name(char *buf, size_t len)
{
	if (gethostname(buf, len))
		snprintf(buf, len, "?");
	buf[len - 1] = '\0';
}
