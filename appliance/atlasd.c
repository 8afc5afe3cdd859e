/* atlasd: load a model into the engine and serve it as the atlas filesystem.
 *
 *     atlasd [options] MOUNTPOINT
 *
 * Configuration: the table defaults, then --config FILE, then every
 * -o key=value in order. -o options that are FUSE's own are passed to FUSE.
 *
 * Without -f atlasd forks before the engine starts its threads; the child
 * loads, mounts and only then detaches, so that load errors still reach the
 * terminal and the parent exits with the child's status.
 */
#define FUSE_USE_VERSION 312

#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <fuse_opt.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "appliance/mountpoint.h"
#include "appliance/notify.h"
#include "common/err.h"
#include "common/log.h"
#include "config/config.h"
#include "engine/engine.h"
#include "fs/fs.h"

#ifndef ATLAS_VERSION
#error "appliance/meson.build defines ATLAS_VERSION"
#endif

/* -o names that belong to FUSE (libfuse's session and mount options and
 * fuse_parse_cmdline's). Every other -o name is an atlas configuration key;
 * allow_other and default_permissions are both (the fs passes them on).
 * context is atlas's key (the session context length), not the SELinux
 * mount option of that name, which FUSE mounts rarely want (fscontext and
 * the others stay FUSE's). */
static const char *const fuse_names[] = {
	"allow_root", "auto_unmount", "blkdev", "blksize", "fsname", "subtype", "max_read",
	"ro", "rw", "suid", "nosuid", "dev", "nodev", "exec", "noexec", "async", "sync",
	"dirsync", "atime", "noatime", "nodiratime", "relatime", "norelatime", "strictatime",
	"nostrictatime", "fscontext", "defcontext", "rootcontext", "debug",
	"clone_fd", "max_idle_threads", "max_threads", "user",
};

struct setting {
	char *key, *value;
};

struct options {
	char *config_file;
	char *worker;                   /* --worker RANK: an expert-parallelism worker */
	char *mountpoint;               /* MOUNTPOINT as given; FUSE never sees it */
	char *extra;                    /* a second argument that is not an option */
	struct setting *settings;       /* -o key=value for the config, in order */
	size_t n_settings;
	bool failed;                    /* out of memory while collecting */
};

#define OPT(t, p) { t, offsetof(struct options, p), 1 }
static const struct fuse_opt atlas_opts[] = {
	OPT("--config=%s", config_file),
	OPT("--config %s", config_file),
	OPT("--worker=%s", worker),
	OPT("--worker %s", worker),
	FUSE_OPT_END
};

static bool is_fuse_name(const char *arg)
{
	size_t n = strcspn(arg, "=");
	for (size_t i = 0; i < ATLAS_ARRAY_LEN(fuse_names); i++)
		if (strlen(fuse_names[i]) == n && strncmp(fuse_names[i], arg, n) == 0)
			return true;
	return false;
}

/* Keeps (returns 1) what is FUSE's; collects configuration keys and the
 * mountpoint, which atlasd checks itself (mountpoint.c: FUSE's own check
 * cannot tell a missing mountpoint from a stale mount or a bad option). */
static int opt_proc(void *data, const char *arg, int key, struct fuse_args *outargs)
{
	struct options *o = data;
	if (key == FUSE_OPT_KEY_NONOPT) {
		char **slot = o->mountpoint ? &o->extra : &o->mountpoint;
		if (!*slot && !(*slot = strdup(arg))) {
			o->failed = true;
			return -1;
		}
		return 0;
	}
	if (key != FUSE_OPT_KEY_OPT || arg[0] == '-' || is_fuse_name(arg))
		return 1;
	struct setting *s = realloc(o->settings, (o->n_settings + 1) * sizeof *s);
	if (!s) {
		o->failed = true;
		return -1;
	}
	o->settings = s;
	const char *eq = strchr(arg, '=');
	s = &o->settings[o->n_settings++];
	s->key = eq ? strndup(arg, (size_t)(eq - arg)) : strdup(arg);
	s->value = strdup(eq ? eq + 1 : "true");   /* a bare name sets a boolean */
	if (!s->key || !s->value) {
		o->failed = true;
		return -1;
	}
	return 0;
}

static void options_free(struct options *o)
{
	for (size_t i = 0; i < o->n_settings; i++) {
		free(o->settings[i].key);
		free(o->settings[i].value);
	}
	free(o->settings);
	free(o->config_file);
	free(o->worker);
	free(o->mountpoint);
	free(o->extra);
}

static void usage(const char *prog)
{
	printf("usage: %s [options] MOUNTPOINT\n"
	       "       %s [options] --worker RANK\n\n"
	       "Load a model and serve it as a filesystem on MOUNTPOINT: s1/in takes a prompt,\n"
	       "s1/out streams the answer, ctl/ shows the engine (see README in the mount).\n"
	       "Without -f, atlasd goes to the background once the model is loaded and mounted.\n\n"
	       "Options:\n"
	       "    --config FILE          read the configuration from FILE (INI; default: the\n"
	       "                           installed PREFIX/etc/atlas/atlas.conf when atlasd is\n"
	       "                           installed, else the built-in defaults; atlas.conf(5))\n"
	       "    -o KEY=VALUE[,...]     set a configuration key, over the file; a bare KEY\n"
	       "                           sets a boolean key to true (-o allow_other)\n"
	       "    -o OPTION              a FUSE option (fsname=, auto_unmount, max_threads=, ...)\n"
	       "    --worker RANK          be rank RANK (1 .. ep-1) of an expert-parallel group:\n"
	       "                           join the head at ep_address and run its steps; no\n"
	       "                           mount, stays in the foreground, ends when the head\n"
	       "                           refuses it or stays away for ep_join_timeout\n"
	       "    -f                     stay in the foreground (logs go to stderr)\n"
	       "    -d                     log every FUSE request, log_level debug (implies -f)\n"
	       "    -s                     serve from one thread\n"
	       "    -h, --help             this help\n"
	       "    -V, --version          versions of atlasd and FUSE\n\n"
	       "Configuration keys and their defaults:\n", prog, prog);
	struct atlas_config *c = malloc(sizeof *c);
	char *text = NULL;
	if (c) {
		atlas_config_defaults(c);
		size_t n = atlas_config_format(c, false, NULL, 0);
		text = malloc(n + 1);
		if (text)
			atlas_config_format(c, false, text, n + 1);
	}
	for (char *line = text, *next; line && *line; line = next) {
		next = strchr(line, '\n');
		if (next)
			*next++ = 0;
		if (*line)
			printf("    %s\n", line);
		if (!next)
			break;
	}
	free(text);
	free(c);
	printf("\nFUSE options:\n");
	fflush(stdout);
	fuse_cmdline_help();
	fuse_lowlevel_help();
}

/* Table defaults, the file, then the -o settings; then checked as a whole. */
static int build_config(struct atlas_config *c, const struct options *o, bool debug)
{
	char err[ATLAS_ERRLEN], installed[PATH_MAX];
	atlas_config_defaults(c);
	/* An installed atlasd reads the installed atlas.conf unless told a file. */
	const char *file = o->config_file;
	if (!file && atlas_config_installed_file(installed, sizeof installed) == 0)
		file = installed;
	if (file && atlas_config_load(c, file, err, sizeof err)) {
		fprintf(stderr, "atlasd: %s\n", err);
		return -1;
	}
	for (size_t i = 0; i < o->n_settings; i++)
		if (atlas_config_set(c, o->settings[i].key, o->settings[i].value, err, sizeof err)) {
			fprintf(stderr, "atlasd: -o %s=%s: %s\n", o->settings[i].key,
				o->settings[i].value, err);
			return -1;
		}
	if (debug)
		atlas_config_set(c, "log_level", "debug", NULL, 0);
	if (atlas_config_validate(c, err, sizeof err)) {
		fprintf(stderr, "atlasd: %s\n", err);
		return -1;
	}
	/* ctl/config shows the model directory that was really loaded (dummy
	 * weights: a shape's name). */
	char path[PATH_MAX];
	const char *model = atlas_config_model_dir(c);
	if (!strcmp(c->load_format, "dummy"))
		snprintf(path, sizeof path, "%s", model);
	else if (!realpath(model, path)) {
		fprintf(stderr, "atlasd: model directory %s: %s\n", model, strerror(errno));
		return -1;
	}
	if (strlen(path) >= sizeof c->model) {
		fprintf(stderr, "atlasd: model directory %s: path too long\n", path);
		return -1;
	}
	snprintf(c->model, sizeof c->model, "%s", path);
	enum atlas_log_level level;
	if (atlas_log_parse_level(c->log_level, &level) == 0)
		atlas_log_set_level(level);
	return 0;
}

/* FUSE's own options, tried on a session that is never mounted, so that a
 * bad one is reported (libfuse prints which) before the model loads. */
static bool fuse_options_ok(const struct fuse_args *args)
{
	static const struct fuse_lowlevel_ops no_ops;
	struct fuse_args copy = FUSE_ARGS_INIT(0, NULL);
	bool ok = true;
	for (int i = 0; ok && i < args->argc; i++)
		ok = fuse_opt_add_arg(&copy, args->argv[i]) == 0;
	struct fuse_session *se = ok ? fuse_session_new(&copy, &no_ops, sizeof no_ops, NULL) : NULL;
	if (se)
		fuse_session_destroy(se);
	fuse_opt_free_args(&copy);
	return se != NULL;
}

/* Fork; the parent waits until the child reports that it is mounted (one
 * byte on the pipe) and exits 0, or exits with the child's status. Returns
 * in the child only, with the pipe's write end. */
static int daemon_fork(void)
{
	int fds[2];
	if (pipe(fds)) {
		fprintf(stderr, "atlasd: pipe: %s\n", strerror(errno));
		exit(1);
	}
	pid_t pid = fork();
	if (pid < 0) {
		fprintf(stderr, "atlasd: fork: %s\n", strerror(errno));
		exit(1);
	}
	if (pid == 0) {
		close(fds[0]);
		return fds[1];
	}
	close(fds[1]);
	char ok;
	ssize_t n;
	do
		n = read(fds[0], &ok, 1);
	while (n < 0 && errno == EINTR);
	if (n == 1)
		_exit(0);
	int status;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}

/* The key log_file opened for appending, before the model loads so that a
 * bad path stops the start on the terminal: its fd, -1 for syslog (no
 * file, or -f: then stderr stays), or -2 after printing the error. */
static int open_log_file(const struct atlas_config *cfg, bool foreground)
{
	if (foreground || !cfg->log_file[0])
		return -1;
	int fd = open(cfg->log_file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
	if (fd < 0) {
		fprintf(stderr, "atlasd: log_file %s: %s\n", cfg->log_file, strerror(errno));
		return -2;
	}
	return fd;
}

/* libfuse's own messages, once detached, join atlas's log instead of a
 * stderr that is gone. */
static void fuse_to_log(enum fuse_log_level level, const char *fmt, va_list ap)
{
	char msg[512];
	vsnprintf(msg, sizeof msg, fmt, ap);
	msg[strcspn(msg, "\n")] = 0;
	if (level <= FUSE_LOG_ERR)
		log_error("fuse: %s", msg);
	else if (level == FUSE_LOG_WARNING)
		log_warn("fuse: %s", msg);
	else if (level < FUSE_LOG_DEBUG)
		log_info("fuse: %s", msg);
	else
		log_debug("fuse: %s", msg);
}

/* In the child, once mounted: detach from the terminal, send the log to
 * log_fd (the key log_file) or else to syslog, and release the parent.
 * Until here a Ctrl-C reaches both; the child's is pending and ends its
 * loop at once. */
static void daemon_ready(int fd, int log_fd)
{
	setsid();
	int null = open("/dev/null", O_RDWR);
	if (null >= 0) {
		dup2(null, STDIN_FILENO);
		dup2(null, STDOUT_FILENO);
		dup2(log_fd >= 0 ? log_fd : null, STDERR_FILENO);
		if (null > STDERR_FILENO)
			close(null);
	}
	if (log_fd >= 0)
		close(log_fd);
	atlas_log_set_sink(log_fd >= 0 ? ATLAS_LOG_STDERR_WALL : ATLAS_LOG_SYSLOG, "atlasd");
	fuse_set_log_func(fuse_to_log);
	if (chdir("/") != 0)
		log_warn("chdir /: %s", strerror(errno));
	char ok = 1;
	if (write(fd, &ok, 1) != 1)
		log_warn("cannot report readiness: %s", strerror(errno));
	close(fd);
}

/* Serve until unmounted or signalled; returns the exit status. */
static int serve(const struct atlas_config *cfg, struct fuse_args *args,
		 const struct fuse_cmdline_opts *cmd, const char *mountpoint, int ready_fd,
		 int log_fd)
{
	char err[ATLAS_ERRLEN];
	struct atlas_engine *e = NULL;
	struct atlas_fs *fs = NULL;
	if (atlas_engine_open(cfg, &e, err, sizeof err)) {
		fprintf(stderr, "atlasd: cannot load model %s: %s\n", cfg->model, err);
		return 1;
	}
	log_info("model %s loaded", cfg->model);
	int status = 1;
	if (atlas_fs_open(e, cfg, &fs, err, sizeof err)) {
		fprintf(stderr, "atlasd: %s\n", err);
		atlas_engine_close(e);
		return 1;
	}
	if (atlas_fs_mount(fs, args, mountpoint, err, sizeof err)) {
		fprintf(stderr, "atlasd: %s\n", err);
		goto out;
	}
	struct fuse_session *se = atlas_fs_fuse_session(fs);
	if (fuse_set_signal_handlers(se) != 0) {
		fprintf(stderr, "atlasd: cannot install signal handlers\n");
		goto out;
	}
	if (ready_fd >= 0)
		daemon_ready(ready_fd, log_fd);
	int rc = notify_systemd("READY=1");
	if (rc)
		log_warn("cannot tell systemd that atlasd is ready: %s", strerror(-rc));

	/* Only this thread takes SIGTERM/SIGINT/SIGHUP, so that they end the loop. */
	sigset_t sigs;
	sigemptyset(&sigs);
	pthread_sigmask(SIG_SETMASK, &sigs, NULL);
	rc = atlas_fs_loop(fs, cmd);
	notify_systemd("STOPPING=1");
	fuse_remove_signal_handlers(se);
	if (rc)
		log_error("the FUSE loop failed: %s", strerror(-rc));
	else
		log_info("unmounted");
	status = rc ? 1 : 0;
	/* Before the sessions close with the tree: kv_persist keeps them. */
	if (atlas_engine_persist(e, err, sizeof err)) {
		log_error("%s", err);
		status = 1;
	}
out:
	atlas_fs_stop(fs);
	atlas_fs_unmount(fs);
	atlas_engine_close(e);
	atlas_fs_free(fs);
	return status;
}

/* atlasd --worker RANK: one rank of expert parallelism, in the foreground. */
static int run_worker(struct atlas_config *cfg, const struct options *o, bool debug)
{
	char err[ATLAS_ERRLEN], *end;
	const long rank = strtol(o->worker, &end, 10);
	if (!*o->worker || *end || rank < 1 || rank >= ATLAS_EP_MAX) {
		fprintf(stderr, "atlasd: --worker %s: not a rank (1 .. ep-1)\n", o->worker);
		return 1;
	}
	if (build_config(cfg, o, debug))
		return 1;
	if (atlas_ep_worker_run(cfg, (int)rank, err, sizeof err)) {
		log_error("%s", err);
		fprintf(stderr, "atlasd: %s\n", err);
		return 1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
	struct options o = { 0 };
	struct fuse_cmdline_opts cmd = { 0 };
	int status = 1;
	if (fuse_opt_parse(&args, &o, atlas_opts, opt_proc) != 0) {
		fprintf(stderr, "atlasd: %s\n", o.failed ? "out of memory" : "bad options (see --help)");
		goto out;
	}
	if (o.extra) {
		fprintf(stderr, "atlasd: one MOUNTPOINT only: %s, then %s (see --help)\n",
			o.mountpoint, o.extra);
		goto out;
	}
	/* Mounts say what they are (mount(8), /proc/mounts: "atlas on DIR type
	 * fuse.atlas"), which is how mountpoint.c knows atlas's own; a later
	 * -o fsname= or subtype= still wins. */
	if (fuse_opt_insert_arg(&args, 1, "-osubtype=atlas,fsname=atlas")) {
		fprintf(stderr, "atlasd: out of memory\n");
		goto out;
	}
	if (fuse_parse_cmdline(&args, &cmd) != 0) {
		fprintf(stderr, "atlasd: bad options (see --help)\n");
		goto out;
	}
	if (cmd.show_help) {
		usage(argv[0]);
		status = 0;
		goto out;
	}
	if (cmd.show_version) {
		printf("atlasd %s\nFUSE library %s\n", ATLAS_VERSION, fuse_pkgversion());
		status = 0;
		goto out;
	}

	struct atlas_config *cfg = malloc(sizeof *cfg);
	if (!cfg) {
		fprintf(stderr, "atlasd: out of memory\n");
		goto out;
	}
	if (o.worker) {
		status = run_worker(cfg, &o, cmd.debug);
		free(cfg);
		goto out;
	}
	if (build_config(cfg, &o, cmd.debug) == 0) {
		char mnt[PATH_MAX], err[ATLAS_ERRLEN];
		const char *given = o.mountpoint ? o.mountpoint : cfg->mountpoint;
		const bool foreground = cmd.foreground || cmd.debug;
		int log_fd = -1;
		if (!*given)
			fprintf(stderr, "atlasd: no mountpoint (give MOUNTPOINT or the key mountpoint)\n");
		else if (!fuse_options_ok(&args))
			fprintf(stderr, "atlasd: bad FUSE options (see above and --help)\n");
		else if (strncmp(given, "/dev/fd/", 8) &&
			 mountpoint_prepare(given, mnt, sizeof mnt, err, sizeof err))
			fprintf(stderr, "atlasd: %s\n", err);
		else if ((log_fd = open_log_file(cfg, foreground)) != -2) {
			int ready_fd = foreground ? -1 : daemon_fork();
			/* Threads started from here on (the engine's, the fs waker, the
			 * FUSE workers) leave the ending signals to the main thread. */
			sigset_t sigs;
			sigemptyset(&sigs);
			sigaddset(&sigs, SIGTERM);
			sigaddset(&sigs, SIGINT);
			sigaddset(&sigs, SIGHUP);
			sigaddset(&sigs, SIGQUIT);
			pthread_sigmask(SIG_BLOCK, &sigs, NULL);
			status = serve(cfg, &args, &cmd,
				       strncmp(given, "/dev/fd/", 8) ? mnt : given, ready_fd, log_fd);
		}
	}
	free(cfg);
out:
	free(cmd.mountpoint);
	options_free(&o);
	fuse_opt_free_args(&args);
	return status;
}
