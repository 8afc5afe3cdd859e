/* TCP for expert parallelism's ranks (DESIGN §10): the head's listening
 * socket, a worker's connection, and whole messages sent and received within
 * a deadline. Every call returns 0 or a negative errno: -ETIMEDOUT when the
 * peer stays silent past the timeout, -EPIPE when it closed the
 * connection. */
#ifndef ATLAS_ENGINE_EP_NET_H
#define ATLAS_ENGINE_EP_NET_H

#include <stddef.h>

/* Listen on address "host:port" (port 0: any free one; *port_out says
 * which). The socket is non-blocking and close-on-exec. */
int ep_listen(const char *address, int *fd_out, int *port_out, char *err, size_t errlen);
/* Connect to "host:port" within timeout_ms (trying every address of the
 * name); the socket has TCP_NODELAY and is close-on-exec. */
int ep_connect(const char *address, int timeout_ms, int *fd_out, char *err, size_t errlen);
/* Accept one connection if one is waiting within timeout_ms; -EAGAIN when
 * none came. */
int ep_accept(int listen_fd, int timeout_ms, int *fd_out);
/* Send or receive exactly n bytes, each wait bounded by timeout_ms. */
int ep_send_all(int fd, const void *buf, size_t n, int timeout_ms);
int ep_recv_all(int fd, void *buf, size_t n, int timeout_ms);
/* The host name of this machine, for ctl/ep. */
void ep_host_name(char *buf, size_t len);

#endif
