/* atlasd's life around the filesystem, serving the scripted model: options
 * and their errors, load errors with and without -f, the background mode,
 * SIGTERM, fusermount3 -u and a lazy unmount; its mountpoint missing, stale
 * after a kill -9 or already served; readiness for systemd. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

/* The engine keys every start uses: the cpu backend with one worker and a
 * small KV pool, so that a start takes milliseconds. */
#define ENGINE_OPT "backend=cpu,threads=1,kv_memory=1M"

struct fixture {
	struct daemon d;
	char model_opt[1000];           /* -o model=... plus ENGINE_OPT */
};

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof *f);
	if (!f || daemon_prepare(&f->d, "model"))
		return -1;
	model_option(&f->d, f->model_opt, sizeof f->model_opt - sizeof ENGINE_OPT - 1);
	strcat(f->model_opt, "," ENGINE_OPT);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	daemon_cleanup(&f->d);
	free(f);
	return 0;
}

/* Run atlasd to its end (it must not mount): its exit status; its output
 * is in the log. */
static int run(struct daemon *d, const char *const *args)
{
	pid_t pid = daemon_spawn(d, args);
	int status = wait_exit(pid, 10000);
	if (status < 0)
		kill(pid, SIGKILL);
	return status;
}

static void assert_log_has(const struct daemon *d, const char *what)
{
	char *log = daemon_log(d);
	assert_non_null(log);
	if (!strstr(log, what))
		fail_msg("'%s' not in atlasd's output:\n%s", what, log);
	free(log);
}

/* atlasd ends by itself within ms and exits 0; else its output says why
 * (a sanitizer's report, say). */
static void assert_exits_cleanly(struct daemon *d, int ms)
{
	int status = wait_exit(d->pid, ms);
	if (status < 0)
		kill(d->pid, SIGKILL);
	d->pid = 0;
	if (status != 0) {
		static char shown[8192];
		char *log = daemon_log(d);
		snprintf(shown, sizeof shown, "%s", log ? log : "(none)");
		free(log);
		fail_msg("atlasd %s %d; its output:\n%s", status < 0 ? "still ran after" : "exited",
			 status < 0 ? ms : status, shown);
	}
}

/* Errors are one line on stderr. */
static void assert_one_line(const struct daemon *d)
{
	char *log = daemon_log(d);
	assert_non_null(log);
	int lines = 0;
	for (char *c = log; *c; c++)
		lines += *c == '\n';
	if (lines != 1)
		fail_msg("not one line:\n%s", log);
	free(log);
}

static void test_help_version(void **state)
{
	struct fixture *f = *state;
	const char *help[] = { "--help", NULL };
	assert_int_equal(run(&f->d, help), 0);
	assert_log_has(&f->d, "--config FILE");
	assert_log_has(&f->d, "max_batch = ");   /* the keys with their defaults */
	const char *version[] = { "-V", NULL };
	assert_int_equal(run(&f->d, version), 0);
	assert_log_has(&f->d, "atlasd ");
}

static void test_bad_options(void **state)
{
	struct fixture *f = *state;
	const char *unknown[] = { "-f", "-o", f->model_opt, "-o", "no_such_key=1", NULL };
	assert_int_equal(run(&f->d, unknown), 1);
	assert_log_has(&f->d, "no_such_key");
	assert_one_line(&f->d);
	const char *value[] = { "-f", "-o", f->model_opt, "-o", "max_batch=0", NULL };
	assert_int_equal(run(&f->d, value), 1);
	assert_log_has(&f->d, "max_batch");
	assert_one_line(&f->d);
	const char *file[] = { "-f", "--config", "/nonexistent/atlas.conf", NULL };
	assert_int_equal(run(&f->d, file), 1);
	assert_log_has(&f->d, "/nonexistent/atlas.conf");
	assert_false(is_mounted(f->d.mnt));
}

static void test_config_file(void **state)
{
	struct fixture *f = *state;
	char conf[400], text[600];
	snprintf(conf, sizeof conf, "%s/atlas.conf", f->d.dir);
	snprintf(text, sizeof text, "[model]\nmodel = %s\n[engine]\nbackend = cpu\nthreads = 1\n"
		 "kv_memory = 1M\n[sessions]\nsessions = 3\nmax_sessions = 3\n", f->d.model);
	FILE *fp = fopen(conf, "w");
	assert_non_null(fp);
	fputs(text, fp);
	fclose(fp);
	/* Flags override the file; allow_other and default_permissions are
	 * configuration keys that reach the mount. */
	const char *args[] = { "--config", conf, "-o", "sessions=1", "-o",
			       "allow_other,default_permissions", NULL };
	assert_int_equal(daemon_start(&f->d, args), 0);
	char *mounts;
	size_t len;
	assert_int_equal(get_file("/proc/self/mounts", &mounts, &len), 0);
	char *line = strstr(mounts, f->d.mnt);
	assert_non_null(line);
	*strchrnul(line, '\n') = 0;
	assert_non_null(strstr(line, "allow_other"));
	assert_non_null(strstr(line, "default_permissions"));
	free(mounts);
	struct stat st;
	assert_int_equal(stat(mpath(&f->d, "s1"), &st), 0);
	assert_int_equal(stat(mpath(&f->d, "s2"), &st), -1);
	char *cfg;
	assert_int_equal(get_file(mpath(&f->d, "ctl/config"), &cfg, &len), 0);
	assert_non_null(strstr(cfg, "\nsessions = 1\n"));
	assert_non_null(strstr(cfg, "\nmax_sessions = 3\n"));
	assert_non_null(strstr(cfg, "\nallow_other = true\n"));
	free(cfg);
	assert_int_equal(daemon_stop(&f->d), 0);
	assert_false(is_mounted(f->d.mnt));
}

static void test_missing_model(void **state)
{
	struct fixture *f = *state;
	const char *args[] = { "-f", "-o", "model=/nonexistent/model", NULL };
	assert_int_equal(run(&f->d, args), 1);
	assert_log_has(&f->d, "/nonexistent/model");
	assert_one_line(&f->d);
	assert_false(is_mounted(f->d.mnt));
}

/* A model that fails to load (here a config.json with a shape the scripted
 * family refuses) is reported on the terminal, naming the file and the key,
 * and atlasd exits 1, in the foreground and in the background alike. */
static void test_load_error(void **state)
{
	struct fixture *f = *state;
	char path[600], *config;
	size_t len;
	snprintf(path, sizeof path, "%s/config.json", f->d.model);
	assert_int_equal(get_file(path, &config, &len), 0);
	char *key = strstr(config, "\"head_dim\": 2");
	assert_non_null(key);
	key[strlen("\"head_dim\": ")] = '4';
	FILE *fp = fopen(path, "w");
	assert_non_null(fp);
	fputs(config, fp);
	fclose(fp);
	free(config);
	char want[700];
	snprintf(want, sizeof want, "%s: key head_dim: 4", path);
	const char *fg[] = { "-f", "-o", f->model_opt, NULL };
	assert_int_equal(run(&f->d, fg), 1);
	assert_log_has(&f->d, want);
	assert_one_line(&f->d);
	const char *bg[] = { "-o", f->model_opt, NULL };
	assert_int_equal(run(&f->d, bg), 1);
	assert_log_has(&f->d, want);
	assert_false(is_mounted(f->d.mnt));
}

/* Mounts on d's mountpoint in the mount table (a stacked mount counts twice). */
static int mounts_on(const struct daemon *d)
{
	char *mounts, key[600];
	size_t len;
	assert_int_equal(get_file("/proc/self/mounts", &mounts, &len), 0);
	snprintf(key, sizeof key, " %s fuse", d->mnt);
	int n = 0;
	for (const char *c = mounts; (c = strstr(c, key)); c++)
		n++;
	free(mounts);
	return n;
}

static void assert_serves(const struct daemon *d)
{
	assert_int_equal(put_file(mpath(d, "s1/in"), "ab"), 0);
	char *out;
	size_t len;
	assert_int_equal(get_file(mpath(d, "s1/out"), &out, &len), 0);
	assert_string_equal(out, "ba");
	free(out);
}

/* Unmount a daemon that runs in the background (not our child). */
static void unmount_background(const struct daemon *d)
{
	char cmd[400];
	snprintf(cmd, sizeof cmd, "fusermount3 -u %s", d->mnt);
	assert_int_equal(system(cmd), 0);
	assert_false(is_mounted(d->mnt));
}

/* One info line per turn: session, prompt and generated tokens, time to
 * first token, tokens/s, finish; on stderr with -f. */
static void test_turn_log_line(void **state)
{
	struct fixture *f = *state;
	const char *args[] = { "-o", f->model_opt, NULL };
	assert_int_equal(daemon_start(&f->d, args), 0);
	assert_serves(&f->d);
	assert_int_equal(daemon_stop(&f->d), 0);
	/* "ab" in chat mode: the template's tokens, then "ba" and the end token */
	assert_log_has(&f->d, "info  session.c:");
	assert_log_has(&f->d, "turn: session s1 turn 1 prompt_tokens ");
	assert_log_has(&f->d, " generated_tokens 3 ttft_s 0.");
	assert_log_has(&f->d, " finish eos\n");
}

/* Detached with log_file: the log, turns included, is appended to the file
 * with the wall-clock time; a log_file that cannot be opened stops the start
 * on the terminal. */
static void test_log_file(void **state)
{
	struct fixture *f = *state;
	char opt[420], path[400];
	snprintf(path, sizeof path, "%s/atlasd.log", f->d.dir);
	snprintf(opt, sizeof opt, "log_file=%s", path);
	const char *args[] = { "-o", f->model_opt, "-o", opt, NULL };
	assert_int_equal(run(&f->d, args), 0);
	assert_serves(&f->d);
	unmount_background(&f->d);
	char *log;
	size_t len;
	for (int i = 0; i < 100; i++) {   /* the daemon's last lines follow the unmount */
		assert_int_equal(get_file(path, &log, &len), 0);
		if (strstr(log, "unmounted"))
			break;
		free(log);
		log = NULL;
		usleep(20000);
	}
	assert_non_null(log);
	assert_non_null(strstr(log, "turn: session s1 turn 1 prompt_tokens "));
	assert_true(log[0] == '[' && log[5] == '-' && log[11] == 'T');   /* [2026-11-26T... */
	free(log);
	const char *bad[] = { "-o", f->model_opt, "-o", "log_file=/nonexistent/dir/log", NULL };
	assert_int_equal(run(&f->d, bad), 1);
	assert_log_has(&f->d, "log_file /nonexistent/dir/log");
	assert_one_line(&f->d);
}

/* Without -f: atlasd returns once mounted and keeps serving. */
static void test_background(void **state)
{
	struct fixture *f = *state;
	const char *args[] = { "-o", f->model_opt, NULL };
	assert_int_equal(run(&f->d, args), 0);
	assert_true(is_mounted(f->d.mnt));
	assert_serves(&f->d);
	unmount_background(&f->d);
}

static void test_fusermount(void **state)
{
	struct fixture *f = *state;
	const char *args[] = { "-o", f->model_opt, NULL };
	assert_int_equal(daemon_start(&f->d, args), 0);
	char cmd[400];
	snprintf(cmd, sizeof cmd, "fusermount3 -u %s", f->d.mnt);
	assert_int_equal(system(cmd), 0);
	assert_exits_cleanly(&f->d, 5000);
	assert_false(is_mounted(f->d.mnt));
}

/* SIGTERM with a reader parked on a running turn: the reader gets an error,
 * atlasd exits 0 and the mount is gone. */
static void test_sigterm_with_reader(void **state)
{
	struct fixture *f = *state;
	const char *args[] = { "-o", f->model_opt, NULL };
	assert_int_equal(daemon_start(&f->d, args), 0);
	assert_int_equal(put_file(mpath(&f->d, "s1/in"), "SLOW abc"), 0);
	pid_t reader = fork();
	if (reader == 0) {
		char *text;
		size_t len;
		int rc = get_file(mpath(&f->d, "s1/out"), &text, &len);
		_exit(rc < 0 && !strcmp(text, "cba") ? 0 : 1);
	}
	usleep(200000);
	double t0 = now_s();
	assert_int_equal(daemon_stop(&f->d), 0);
	assert_true(now_s() - t0 < 3.0);
	assert_int_equal(wait_exit(reader, 3000), 0);
	assert_false(is_mounted(f->d.mnt));
}

/* A second atlasd on a mountpoint one serves is refused with exit status 1
 * and one line that names it, without stacking a mount; the first serves on. */
static void test_second_refused(void **state)
{
	struct fixture *f = *state;
	const char *args[] = { "-o", f->model_opt, NULL };
	assert_int_equal(daemon_start(&f->d, args), 0);
	const char *second[] = { "-f", "-o", f->model_opt, NULL };
	assert_int_equal(run(&f->d, second), 1);
	assert_log_has(&f->d, "is already an atlas mount");
	assert_one_line(&f->d);
	const char *background[] = { "-o", f->model_opt, NULL };
	assert_int_equal(run(&f->d, background), 1);
	assert_int_equal(mounts_on(&f->d), 1);
	assert_serves(&f->d);
	assert_int_equal(daemon_stop(&f->d), 0);
	assert_false(is_mounted(f->d.mnt));
}

/* kill -9 leaves a stale mount (ENOTCONN); the next atlasd removes it,
 * says so, and mounts in its place. */
static void test_stale_mount(void **state)
{
	struct fixture *f = *state;
	const char *args[] = { "-o", f->model_opt, NULL };
	assert_int_equal(daemon_start(&f->d, args), 0);
	kill(f->d.pid, SIGKILL);
	assert_int_equal(wait_exit(f->d.pid, 5000), 128 + SIGKILL);
	f->d.pid = 0;
	struct stat st;
	assert_int_equal(stat(f->d.mnt, &st), -1);
	assert_int_equal(errno, ENOTCONN);
	/* In the background: it returns once mounted (the stale entry in the
	 * mount table cannot tell a new mount from the old). */
	assert_int_equal(run(&f->d, args), 0);
	assert_log_has(&f->d, "removed the stale mount");
	assert_int_equal(mounts_on(&f->d), 1);
	assert_serves(&f->d);
	unmount_background(&f->d);
}

/* A mountpoint that does not exist, and a bad FUSE option, are reported
 * before the model loads. */
static void test_mountpoint_and_fuse_errors(void **state)
{
	struct fixture *f = *state;
	assert_int_equal(rmdir(f->d.mnt), 0);
	const char *args[] = { "-f", "-o", f->model_opt, NULL };
	assert_int_equal(run(&f->d, args), 1);
	assert_log_has(&f->d, "does not exist (make it with mkdir -p");
	assert_one_line(&f->d);
	assert_int_equal(mkdir(f->d.mnt, 0755), 0);
	const char *fuse[] = { "-f", "-o", f->model_opt, "-o", "max_read=many", NULL };
	assert_int_equal(run(&f->d, fuse), 1);
	assert_log_has(&f->d, "bad FUSE options");
	char *log = daemon_log(&f->d);
	assert_null(strstr(log, "loaded"));
	free(log);
	assert_false(is_mounted(f->d.mnt));
}

/* Under systemd (Type=notify): READY=1 on $NOTIFY_SOCKET once mounted, and
 * STOPPING=1 when it stops. */
static void test_systemd_notify(void **state)
{
	struct fixture *f = *state;
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	assert_true(strlen(f->d.dir) + sizeof "/notify" <= sizeof addr.sun_path);
	memcpy(addr.sun_path, f->d.dir, strlen(f->d.dir));
	strcat(addr.sun_path, "/notify");
	int sock = socket(AF_UNIX, SOCK_DGRAM, 0);
	assert_true(sock >= 0);
	assert_int_equal(bind(sock, (struct sockaddr *)&addr, sizeof addr), 0);
	struct timeval tv = { .tv_sec = 5 };
	assert_int_equal(setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), 0);
	setenv("NOTIFY_SOCKET", addr.sun_path, 1);
	const char *args[] = { "-o", f->model_opt, NULL };
	int rc = daemon_start(&f->d, args);
	unsetenv("NOTIFY_SOCKET");
	assert_int_equal(rc, 0);
	char msg[64] = { 0 };
	assert_int_equal(recv(sock, msg, sizeof msg - 1, 0), 7);
	assert_string_equal(msg, "READY=1");
	assert_true(is_mounted(f->d.mnt));
	assert_int_equal(daemon_stop(&f->d), 0);
	memset(msg, 0, sizeof msg);
	assert_int_equal(recv(sock, msg, sizeof msg - 1, 0), 10);
	assert_string_equal(msg, "STOPPING=1");
	close(sock);
}

/* A lazy unmount while readers wait on idle sessions' out: the kernel
 * keeps the connection for their open files and sends nothing, yet atlasd
 * notices the mount is gone, ends the readers with an error (ECANCELED),
 * serves their close (a FLUSH that waits for atlasd) and exits 0 by
 * itself. A reader exits 0 when all of that held, else 1 to 3. */
static void test_lazy_umount(void **state)
{
	struct fixture *f = *state;
	const char *args[] = { "-o", f->model_opt, NULL };
	assert_int_equal(daemon_start(&f->d, args), 0);
	pid_t readers[2];
	for (int i = 0; i < 2; i++) {
		readers[i] = fork();
		if (readers[i] == 0) {
			char buf[64];
			int fd = open(mpath(&f->d, "s%d/out", i + 1), O_RDONLY);
			if (fd < 0)
				_exit(1);
			if (read(fd, buf, sizeof buf) >= 0 || errno != ECANCELED)
				_exit(2);
			_exit(close(fd) == 0 ? 0 : 3);
		}
	}
	usleep(300000); /* both wait for their session's first turn */
	char cmd[400];
	snprintf(cmd, sizeof cmd, "fusermount3 -u -z %s", f->d.mnt);
	assert_int_equal(system(cmd), 0);
	assert_false(is_mounted(f->d.mnt));
	assert_exits_cleanly(&f->d, 10000);
	for (int i = 0; i < 2; i++)
		assert_int_equal(wait_exit(readers[i], 5000), 0);
}

int main(int argc, char **argv)
{
	int status = harness_args(argc, argv);
	if (status)
		return status;
	/* Can this machine mount at all? */
	struct daemon probe;
	if (daemon_prepare(&probe, "model"))
		return 1;
	char opt[1000];
	model_option(&probe, opt, sizeof opt);
	const char *args[] = { "-o", opt, "-o", ENGINE_OPT, NULL };
	int rc = daemon_start(&probe, args);
	if (rc == 0 && daemon_stop(&probe) != 0)
		rc = 1;
	daemon_cleanup(&probe);
	if (rc)
		return rc == SKIP ? SKIP : 1;

	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_help_version, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bad_options, setup, teardown),
		cmocka_unit_test_setup_teardown(test_config_file, setup, teardown),
		cmocka_unit_test_setup_teardown(test_missing_model, setup, teardown),
		cmocka_unit_test_setup_teardown(test_load_error, setup, teardown),
		cmocka_unit_test_setup_teardown(test_background, setup, teardown),
		cmocka_unit_test_setup_teardown(test_turn_log_line, setup, teardown),
		cmocka_unit_test_setup_teardown(test_log_file, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fusermount, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sigterm_with_reader, setup, teardown),
		cmocka_unit_test_setup_teardown(test_lazy_umount, setup, teardown),
		cmocka_unit_test_setup_teardown(test_second_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_stale_mount, setup, teardown),
		cmocka_unit_test_setup_teardown(test_mountpoint_and_fuse_errors, setup, teardown),
		cmocka_unit_test_setup_teardown(test_systemd_notify, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
