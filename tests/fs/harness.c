/* The fs tests' daemon, mounts and file helpers (harness.h). */
#include "harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

const char *harness_atlasd;
const char *harness_model;

double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int copy_file(const char *from, const char *to)
{
	int in = open(from, O_RDONLY), out = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	char buf[8192];
	ssize_t n = in < 0 || out < 0 ? -1 : 0;
	while (n >= 0 && (n = read(in, buf, sizeof buf)) > 0)
		if (write(out, buf, (size_t)n) != n)
			n = -1;
	if (in >= 0)
		close(in);
	if (out >= 0 && close(out) != 0)
		n = -1;
	return n < 0 ? -1 : 0;
}

/* Copy the files of the scripted model into d->model. */
static int copy_model(struct daemon *d)
{
	DIR *dir = opendir(harness_model);
	if (!dir || mkdir(d->model, 0755) != 0) {
		if (dir)
			closedir(dir);
		return -1;
	}
	int rc = 0;
	for (struct dirent *e; !rc && (e = readdir(dir));) {
		char from[1000], to[1000];
		if (e->d_name[0] == '.')
			continue;
		snprintf(from, sizeof from, "%s/%s", harness_model, e->d_name);
		snprintf(to, sizeof to, "%s/%s", d->model, e->d_name);
		rc = copy_file(from, to);
	}
	closedir(dir);
	return rc;
}

int daemon_prepare(struct daemon *d, const char *model_name)
{
	memset(d, 0, sizeof *d);
	snprintf(d->dir, sizeof d->dir, "/tmp/atlas-fs-XXXXXX");
	if (!mkdtemp(d->dir))
		return -1;
	snprintf(d->mnt, sizeof d->mnt, "%s/mnt", d->dir);
	snprintf(d->model, sizeof d->model, "%s/%s", d->dir, model_name);
	snprintf(d->log, sizeof d->log, "%s/log", d->dir);
	return mkdir(d->mnt, 0755) || copy_model(d) ? -1 : 0;
}

void model_option(const struct daemon *d, char *buf, size_t len)
{
	size_t n = (size_t)snprintf(buf, len, "model=");
	for (const char *c = d->model; *c && n + 5 < len; c++) {
		if (*c == '\\') {
			/* \\ for the INI text, each of the two escaped for FUSE */
			memcpy(buf + n, "\\\\\\\\", 4);
			n += 4;
		} else {
			if (*c == ',')
				buf[n++] = '\\';
			buf[n++] = *c;
		}
	}
	buf[n] = 0;
}

pid_t daemon_spawn(struct daemon *d, const char *const *args)
{
	const char *argv[32];
	int n = 0;
	argv[n++] = harness_atlasd;
	while (args && *args && n < 30)
		argv[n++] = *args++;
	argv[n++] = d->mnt;
	argv[n] = NULL;
	pid_t pid = fork();
	if (pid == 0) {
		int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd >= 0) {
			dup2(fd, STDOUT_FILENO);
			dup2(fd, STDERR_FILENO);
		}
		execv(harness_atlasd, (char *const *)argv);
		_exit(127);
	}
	return pid;
}

/* From the mount table, so that a mount whose daemon died (statfs then
 * fails with ENOTCONN) counts as mounted too. */
bool is_mounted(const char *path)
{
	char *mounts;
	size_t len;
	if (get_file("/proc/self/mounts", &mounts, &len) != 0) {
		free(mounts);
		return false;
	}
	char key[600];
	snprintf(key, sizeof key, " %s fuse", path);
	bool found = strstr(mounts, key) != NULL;
	free(mounts);
	return found;
}

int wait_exit(pid_t pid, int ms)
{
	for (int waited = 0; waited <= ms; waited += 10) {
		int status;
		pid_t r = waitpid(pid, &status, WNOHANG);
		if (r == pid)
			return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
		if (r < 0)
			return -1;
		usleep(10000);
	}
	return -1;
}

char *daemon_log(const struct daemon *d)
{
	char *text = NULL;
	size_t len;
	get_file(d->log, &text, &len);
	return text;
}

int daemon_start(struct daemon *d, const char *const *args)
{
	const char *argv[32];
	int n = 0;
	argv[n++] = "-f";
	while (args && *args && n < 30)
		argv[n++] = *args++;
	argv[n] = NULL;
	d->pid = daemon_spawn(d, argv);
	if (d->pid < 0)
		return -1;
	for (int i = 0; i < 1000; i++) {
		if (is_mounted(d->mnt))
			return 0;
		int status = wait_exit(d->pid, 10);
		if (status >= 0) {
			d->pid = 0;
			char *log = daemon_log(d);
			bool denied = log && (strstr(log, "ermission denied") ||
					      strstr(log, "Operation not permitted") ||
					      strstr(log, "fuse: device not found"));
			fprintf(stderr, "atlasd exited with %d:\n%s\n", status, log ? log : "");
			free(log);
			return denied ? SKIP : -1;
		}
	}
	fprintf(stderr, "atlasd did not mount within 10 s\n");
	return -1;
}

int daemon_stop(struct daemon *d)
{
	if (!d->pid)
		return -1;
	kill(d->pid, SIGTERM);
	int status = wait_exit(d->pid, 10000);
	if (status < 0) {
		kill(d->pid, SIGKILL);
		wait_exit(d->pid, 5000);
	}
	d->pid = 0;
	return status;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	return remove(path);
}

void daemon_cleanup(struct daemon *d)
{
	if (d->pid)
		daemon_stop(d);
	if (is_mounted(d->mnt)) {
		char cmd[400];
		snprintf(cmd, sizeof cmd, "fusermount3 -u -z %s 2>/dev/null", d->mnt);
		if (system(cmd) != 0)
			return;   /* leave it rather than remove files under a mount */
	}
	if (d->dir[0])
		nftw(d->dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
}

const char *mpath(const struct daemon *d, const char *fmt, ...)
{
	static __thread char bufs[8][512];
	static __thread int next;
	char *b = bufs[next++ % 8];
	int n = snprintf(b, sizeof bufs[0], "%s/", d->mnt);
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(b + n, sizeof bufs[0] - (size_t)n, fmt, ap);
	va_end(ap);
	return b;
}

int put_file(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_TRUNC);
	if (fd < 0)
		return -errno;
	size_t len = strlen(text);
	int rc = 0;
	if (len && write(fd, text, len) != (ssize_t)len)
		rc = -errno;
	if (close(fd) != 0 && !rc)
		rc = -errno;
	return rc;
}

int read_fd(int fd, char **text, size_t *len)
{
	size_t cap = 4096, n = 0;
	char *buf = malloc(cap + 1);
	int rc = 0;
	for (;;) {
		if (n == cap) {
			cap *= 2;
			buf = realloc(buf, cap + 1);
		}
		ssize_t r = read(fd, buf + n, cap - n);
		if (r < 0) {
			rc = -errno;
			break;
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	buf[n] = 0;
	*text = buf;
	*len = n;
	return rc;
}

int get_file(const char *path, char **text, size_t *len)
{
	*text = NULL;
	*len = 0;
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return -errno;
	int rc = read_fd(fd, text, len);
	close(fd);
	return rc;
}

int harness_args(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: %s ATLASD MODEL_DIR\n", argv[0]);
		return 1;
	}
	harness_atlasd = argv[1];
	harness_model = argv[2];
	if (access("/dev/fuse", R_OK | W_OK) != 0) {
		fprintf(stderr, "no usable /dev/fuse: skipped\n");
		return SKIP;
	}
	return 0;
}
