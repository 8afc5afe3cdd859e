/* Helpers of the fs tests: a daemon (the real atlasd, serving a copy of
 * the scripted model tests/fs/script-model) mounted on a temporary
 * directory, and small file operations that return a negative errno
 * instead of failing. */
#ifndef ATLAS_TESTS_FS_HARNESS_H
#define ATLAS_TESTS_FS_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define SKIP 77

struct daemon {
	char dir[256];      /* temporary directory: mnt/, the model's copy, log */
	char mnt[300];
	char model[400];    /* the copy of the scripted model */
	char log[300];      /* the daemon's stderr */
	pid_t pid;          /* 0 when not running (or not our child) */
};

/* The atlasd to run (argv[1] of the test) and the scripted model's
 * directory (argv[2]). */
extern const char *harness_atlasd;
extern const char *harness_model;
/* Take the paths from argv and check /dev/fuse: 0, or the status main must
 * return (1 for usage, SKIP without FUSE). */
int harness_args(int argc, char **argv);

/* Make the directories of d, the model's copy in d->dir/model_name. */
int daemon_prepare(struct daemon *d, const char *model_name);
/* "model=DIR" for -o: d->model with its backslashes escaped for the
 * configuration's INI text, then backslashes and commas for FUSE's option
 * parser. */
void model_option(const struct daemon *d, char *buf, size_t len);
/* Run atlasd with args (NULL-terminated, between the program and the
 * mountpoint), without waiting; its stderr goes to d->log. */
pid_t daemon_spawn(struct daemon *d, const char *const *args);
/* Spawn with -f and wait until mounted: 0, SKIP when FUSE mounts are not
 * permitted here, -1 on other failures (the log is printed). */
int daemon_start(struct daemon *d, const char *const *args);
/* Wait up to ms for pid to exit; its exit status, or -1 on timeout. */
int wait_exit(pid_t pid, int ms);
/* SIGTERM and wait: the exit status (-1 on timeout, then SIGKILL). */
int daemon_stop(struct daemon *d);
bool is_mounted(const char *path);
/* Remove what daemon_prepare made (after unmounting). */
void daemon_cleanup(struct daemon *d);
/* Whole content of the daemon's log (malloc'd). */
char *daemon_log(const struct daemon *d);

/* A path under the mount: a rotating static buffer. */
const char *mpath(const struct daemon *d, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* open + write + close: 0 or the first -errno (close's included). */
int put_file(const char *path, const char *text);
/* Read to EOF or error: the text (malloc'd, *len bytes) and 0 or -errno of
 * the read that failed. */
int get_file(const char *path, char **text, size_t *len);
/* Read fd to EOF or error, as get_file. */
int read_fd(int fd, char **text, size_t *len);
double now_s(void);

#endif
