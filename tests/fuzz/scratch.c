/* The fuzz targets' scratch directory (fuzz.h): one per process under
 * $TMPDIR, emptied and removed at exit so that millions of inputs leave
 * nothing behind. */
#include "fuzz.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[256];

static void remove_dir(void)
{
	DIR *d = opendir(dir);
	if (!d)
		return;
	for (struct dirent *e; (e = readdir(d));) {
		char path[600];
		if (e->d_name[0] != '.') {
			snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
			unlink(path);
		}
	}
	closedir(d);
	rmdir(dir);
}

const char *fuzz_path(const char *name, char *buf, size_t len)
{
	if (!dir[0]) {
		const char *tmp = getenv("TMPDIR");
		snprintf(dir, sizeof dir, "%s/atlas-fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
		if (!mkdtemp(dir)) {
			perror("fuzz: mkdtemp");
			abort();
		}
		atexit(remove_dir);
	}
	snprintf(buf, len, "%s%s%s", dir, *name ? "/" : "", name);
	return buf;
}

int fuzz_write(const char *name, const void *data, size_t size)
{
	char path[600];
	int fd = open(fuzz_path(name, path, sizeof path), O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0)
		return -1;
	ssize_t n = size ? write(fd, data, size) : 0;
	return close(fd) == 0 && n == (ssize_t)size ? 0 : -1;
}
