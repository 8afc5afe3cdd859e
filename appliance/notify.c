/* Readiness for systemd (notify.h): the sd_notify datagram protocol, which
 * is one message on a unix socket; written here rather than linking
 * libsystemd for it, so that atlasd needs nothing new on machines without
 * systemd and the message is sent the same way everywhere. */
#include "appliance/notify.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int notify_systemd(const char *state)
{
	const char *path = getenv("NOTIFY_SOCKET");
	if (!path || !*path)
		return 0;
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	size_t len = strlen(path);
	/* '@' names a socket in the abstract namespace: a leading NUL. */
	if ((path[0] != '/' && path[0] != '@') || len >= sizeof addr.sun_path)
		return -EINVAL;
	memcpy(addr.sun_path, path, len);
	if (path[0] == '@')
		addr.sun_path[0] = 0;
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	ssize_t n = sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&addr,
			   (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len));
	int rc = n < 0 ? -errno : 0;
	close(fd);
	return rc;
}
