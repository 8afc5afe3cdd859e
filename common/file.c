/* Opening regular files without blocking on FIFOs (common/file.h). */
#include "common/file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"

int file_open_regular(const char *path, char *err, size_t errlen)
{
	struct stat sb;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0)
		return atlas_errf(err, errlen, -errno, "%s: %s", path, strerror(errno));
	if (fstat(fd, &sb) < 0) {
		int rc = -errno;
		close(fd);
		return atlas_errf(err, errlen, rc, "%s: %s", path, strerror(-rc));
	}
	if (!S_ISREG(sb.st_mode)) {
		close(fd);
		return atlas_errf(err, errlen, -EINVAL, "%s: not a regular file", path);
	}
	int flags = fcntl(fd, F_GETFL);
	if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0) {
		int rc = -errno;
		close(fd);
		return atlas_errf(err, errlen, rc, "%s: %s", path, strerror(-rc));
	}
	return fd;
}

FILE *file_fopen_regular(const char *path, char *err, size_t errlen)
{
	int fd = file_open_regular(path, err, errlen);
	if (fd < 0) {
		errno = -fd;
		return NULL;
	}
	FILE *f = fdopen(fd, "r");
	if (!f) {
		int e = errno;
		close(fd);
		atlas_errf(err, errlen, -e, "%s: %s", path, strerror(e));
		errno = e;
	}
	return f;
}
