/* Prompts and answers (DESIGN §2, `in` and `out`) on a real FUSE mount:
 * commits at close, per-handle cursors, blocking, O_NONBLOCK, poll,
 * interrupts, UTF-8, failed and cancelled turns, parked readers and rmdir.
 * The scripted model answers a prompt with the prompt reversed; SLEEP,
 * FAIL and SLOW script a turn (engine/model/script/script.h). */
#include "client.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "common/err.h"

/* `echo p > in; cat out` never races: the commit happens at close. */
static void test_commit_at_flush(void **state)
{
	for (int i = 0; i < 50; i++) {
		char prompt[32], want[32];
		snprintf(prompt, sizeof prompt, "abc%d\n", i);
		submit("s1", prompt);
		char *out = answer("s1", NULL);
		int n = snprintf(want, sizeof want, "%d", i);
		for (int k = 0; k < n / 2; k++) {
			char c = want[k];
			want[k] = want[n - 1 - k];
			want[n - 1 - k] = c;
		}
		strcat(want, "cba");
		assert_string_equal(out, want);
		free(out);
	}
	char cmd[1200], result[300];
	snprintf(result, sizeof result, "%s/shell.out", D.dir);
	snprintf(cmd, sizeof cmd, "echo hello > %s && cat %s > %s", mpath(&D, "s1/in"),
		 mpath(&D, "s1/out"), result);
	assert_int_equal(system(cmd), 0);
	char *text;
	size_t len;
	assert_int_equal(get_file(result, &text, &len), 0);
	assert_string_equal(text, "olleh");
	free(text);
}

/* Each handle has its own cursor; reads block and end with EOF. */
static void test_two_readers_block_then_eof(void **state)
{
	submit("s1", "SLEEP 20 abcdefgh");
	int a = open(mpath(&D, "s1/out"), O_RDONLY), b = open(mpath(&D, "s1/out"), O_RDONLY);
	assert_true(a >= 0 && b >= 0);
	char got_a[64] = "", got_b[64] = "", buf[64];
	size_t na = 0, nb = 0;
	int reads = 0;
	double t0 = now_s();
	for (bool ea = false, eb = false; !ea || !eb;) {
		ssize_t r;
		if (!ea) {
			r = read(a, buf, sizeof buf);
			assert_true(r >= 0);
			memcpy(got_a + na, buf, (size_t)r);
			na += (size_t)r;
			ea = r == 0;
			reads++;
		}
		if (!eb) {
			r = read(b, buf, sizeof buf);
			assert_true(r >= 0);
			memcpy(got_b + nb, buf, (size_t)r);
			nb += (size_t)r;
			eb = r == 0;
		}
	}
	assert_true(now_s() - t0 > 0.1);   /* the reads waited for the characters */
	assert_true(reads > 2);            /* and returned them as they came */
	assert_string_equal(got_a, "hgfedcba");
	assert_string_equal(got_b, "hgfedcba");
	close(a);
	close(b);
}

static void test_nonblock_and_poll(void **state)
{
	submit("s1", "SLEEP 300 xy");
	int fd = open(mpath(&D, "s1/out"), O_RDONLY | O_NONBLOCK);
	assert_true(fd >= 0);
	char buf[8];
	assert_int_equal(read(fd, buf, sizeof buf), -1);
	assert_int_equal(errno, EAGAIN);
	struct pollfd p = { .fd = fd, .events = POLLIN };
	assert_int_equal(poll(&p, 1, 50), 0);
	double t0 = now_s();
	assert_int_equal(poll(&p, 1, 3000), 1);
	assert_true(p.revents & POLLIN);
	assert_true(now_s() - t0 < 1.0);
	assert_int_equal(read(fd, buf, sizeof buf), 1);
	assert_int_equal(buf[0], 'y');
	assert_int_equal(poll(&p, 1, 3000), 1);
	assert_int_equal(read(fd, buf, sizeof buf), 1);
	assert_int_equal(buf[0], 'x');
	assert_int_equal(poll(&p, 1, 3000), 1);   /* the end is readable too */
	assert_int_equal(read(fd, buf, sizeof buf), 0);
	close(fd);
}

static void on_usr1(int sig)
{
}

/* Child of test_interrupted_read: read out to the SLOW turn's text, block,
 * get EINTR from SIGUSR1, report, block again and end with ECANCELED. */
static int eintr_child(int report)
{
	int fd = open(mpath(&D, "s2/out"), O_RDONLY);
	char buf[64], got[64] = "";
	size_t n = 0;
	for (;;) {
		ssize_t r = read(fd, buf, sizeof buf);
		if (r > 0 && n + (size_t)r < sizeof got) {
			memcpy(got + n, buf, (size_t)r);
			n += (size_t)r;
			continue;
		}
		if (r < 0 && errno == EINTR && !strcmp(got, "zyx"))
			break;
		return 2;
	}
	char ok = 1;
	if (write(report, &ok, 1) != 1)
		return 3;
	ssize_t r;
	do
		r = read(fd, buf, sizeof buf);
	while (r < 0 && errno == EINTR);
	return r < 0 && errno == ECANCELED ? 0 : 4;
}

static void test_interrupted_read(void **state)
{
	submit("s2", "SLOW xyz");
	int fds[2];
	assert_int_equal(pipe(fds), 0);
	/* The child inherits the handler, so no signal can find it without. */
	struct sigaction sa = { .sa_handler = on_usr1 }, old;   /* no SA_RESTART */
	sigaction(SIGUSR1, &sa, &old);
	pid_t pid = fork();
	if (pid == 0)
		_exit(eintr_child(fds[1]));
	sigaction(SIGUSR1, &old, NULL);
	close(fds[1]);
	/* Signal until the child reports EINTR: a signal that comes before its
	 * read blocks is simply followed by another one. */
	struct pollfd p = { .fd = fds[0], .events = POLLIN };
	int tries = 0;
	for (; tries < 50 && poll(&p, 1, 0) == 0; tries++) {
		kill(pid, SIGUSR1);
		poll(&p, 1, 100);
	}
	char ok = 0;
	assert_int_equal(read(fds[0], &ok, 1), 1);
	close(fds[0]);
	ctl("s2", "cancel\n");
	assert_int_equal(wait_exit(pid, 5000), 0);
}

static bool whole_utf8(const char *s, size_t n)
{
	for (size_t i = 0; i < n;) {
		unsigned char c = (unsigned char)s[i];
		size_t k = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
		if (c >= 0x80 && c < 0xC0)
			return false;
		if (i + k > n)
			return false;
		i += k;
	}
	return true;
}

/* A read whose buffer ends inside a character returns the characters before it. */
static void test_utf8_not_split(void **state)
{
	char prompt[512] = "", want[512] = "";
	for (int i = 0; i < 20; i++)
		strcat(prompt, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");   /* é € 😀 */
	for (int i = 0; i < 20; i++)
		strcat(want, "\xf0\x9f\x98\x80\xe2\x82\xac\xc3\xa9");
	submit("s1", prompt);
	int fd = open(mpath(&D, "s1/out"), O_RDONLY);
	char got[512] = "", buf[5];
	size_t n = 0;
	for (ssize_t r; (r = read(fd, buf, sizeof buf)) > 0; n += (size_t)r) {
		assert_true(whole_utf8(buf, (size_t)r));
		memcpy(got + n, buf, (size_t)r);
	}
	close(fd);
	assert_string_equal(got, want);
}

static void test_failed_turn(void **state)
{
	/* A step that fails loses the tokens of all its rows: with drafts in
	 * it, those before the script's failing position too. */
	ctl("s1", "spec off\n");
	submit("s1", "FAIL abc");
	int rc;
	char *out = answer("s1", &rc);
	ctl("s1", "spec auto\n");
	assert_string_equal(out, "cba");
	assert_int_equal(rc, -EIO);
	free(out);
	assert_value(mpath(&D, "s1/status"), "state", "error");
	assert_value(mpath(&D, "s1/status"), "finish", "error");
	char *err = value_of(mpath(&D, "s1/status"), "last_error");
	assert_non_null(err);
	assert_non_null(strstr(err, "forward pass failed"));
	free(err);
}

static void test_cancel_and_busy(void **state)
{
	submit("s1", "SLOW abc");
	int fd = open(mpath(&D, "s1/out"), O_RDONLY);
	char buf[16] = "";
	size_t n = 0;
	while (n < 3) {
		ssize_t r = read(fd, buf + n, sizeof buf - n - 1);
		assert_true(r > 0);
		n += (size_t)r;
	}
	assert_string_equal(buf, "cba");
	/* A prompt while the turn runs fails, and changes nothing; already its
	 * first write says so, since shells ignore what close returns. */
	assert_int_equal(put_file(mpath(&D, "s1/in"), "more"), -EBUSY);
	int wfd = open(mpath(&D, "s1/in"), O_WRONLY);
	assert_true(wfd >= 0);
	errno = 0;
	assert_int_equal(write(wfd, "more", 4), -1);
	assert_int_equal(errno, EBUSY);
	assert_int_equal(close(wfd), -1);   /* the handle's prompt failed */
	assert_int_equal(errno, EBUSY);
	assert_value(mpath(&D, "s1/status"), "state", "decode");
	ctl("s1", "cancel\n");
	assert_int_equal(read(fd, buf, sizeof buf), -1);
	assert_int_equal(errno, ECANCELED);
	close(fd);
	assert_value(mpath(&D, "s1/status"), "finish", "cancelled");
}

static void test_in_rules(void **state)
{
	char *turns = value_of(mpath(&D, "s1/status"), "turns");
	assert_non_null(turns);
	/* A handle without bytes commits nothing; O_TRUNC is accepted. */
	int fd = open(mpath(&D, "s1/in"), O_WRONLY | O_TRUNC);
	assert_true(fd >= 0);
	assert_int_equal(close(fd), 0);
	assert_value(mpath(&D, "s1/status"), "turns", turns);
	/* Bytes of several writes make one prompt. */
	fd = open(mpath(&D, "s1/in"), O_WRONLY);
	assert_int_equal(write(fd, "ab", 2), 2);
	assert_int_equal(write(fd, "cd", 2), 2);
	assert_int_equal(close(fd), 0);
	char *out = answer("s1", NULL);
	assert_string_equal(out, "dcba");
	free(out);
	free(turns);
	/* Bad UTF-8 is refused at the write that brings it. */
	assert_int_equal(put_file(mpath(&D, "s1/in"), "\xff\xfe"), -EILSEQ);
}

/* tail -f ARGS in the background, its stdout and stderr in files of D.dir
 * named after tag. */
static pid_t tail_follow(const char *path, const char *tag)
{
	char out[400], err[400];
	snprintf(out, sizeof out, "%s/%s.out", D.dir, tag);
	snprintf(err, sizeof err, "%s/%s.err", D.dir, tag);
	pid_t pid = fork();
	if (pid == 0) {
		int o = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		int e = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		dup2(o, STDOUT_FILENO);
		dup2(e, STDERR_FILENO);
		execlp("tail", "tail", "-f", "-s", "0.1", path, (char *)NULL);
		_exit(127);
	}
	return pid;
}

static char *tail_file(const char *tag, const char *kind)
{
	char path[400], *text;
	size_t len;
	snprintf(path, sizeof path, "%s/%s.%s", D.dir, tag, kind);
	assert_int_equal(get_file(path, &text, &len), 0);
	return text;
}

/* history has its real size and positioned reads, so that tail -f follows
 * the conversation turn after turn; tail -f on out shows the answer and
 * fails on nothing. */
static void test_tail_follow(void **state)
{
	assert_int_equal(mkdir(mpath(&D, "tailed"), 0755), 0);
	submit("tailed", "one");
	free(answer("tailed", NULL));
	pid_t history = tail_follow(mpath(&D, "tailed/history"), "history");
	pid_t out = tail_follow(mpath(&D, "tailed/out"), "out");
	usleep(300000);
	submit("tailed", "two");
	free(answer("tailed", NULL));
	submit("tailed", "SLEEP 50 three");
	free(answer("tailed", NULL));
	char *text = NULL;
	for (int i = 0; i < 100; i++) {
		free(text);
		text = tail_file("history", "out");
		if (strstr(text, "### turn 3 end: eos\n"))
			break;
		usleep(50000);
	}
	kill(history, SIGTERM);
	kill(out, SIGTERM);
	waitpid(history, NULL, 0);
	waitpid(out, NULL, 0);
	char *whole;
	size_t len;
	assert_int_equal(get_file(mpath(&D, "tailed/history"), &whole, &len), 0);
	assert_string_equal(text, whole);   /* all three turns, each once */
	assert_non_null(strstr(whole, "### turn 1 user\none\n### turn 1 assistant\neno\n"
			       "### turn 1 end: eos\n"));
	free(text);
	text = tail_file("history", "err");
	assert_string_equal(text, "");
	free(text);
	text = tail_file("out", "err");
	assert_string_equal(text, "");   /* no "file truncated", no "Illegal seek" */
	free(text);
	text = tail_file("out", "out");
	assert_string_equal(text, "eno");
	free(text);

	struct stat st;
	assert_int_equal(stat(mpath(&D, "tailed/history"), &st), 0);
	assert_int_equal(st.st_size, (off_t)len);
	int fd = open(mpath(&D, "tailed/history"), O_RDONLY);
	assert_true(fd >= 0);
	char buf[16] = { 0 };
	assert_int_equal(pread(fd, buf, 9, 4), 9);
	assert_string_equal(buf, "turn 1 us");
	close(fd);
	free(whole);
	assert_int_equal(rmdir(mpath(&D, "tailed")), 0);
}

static void test_history_status_reset(void **state)
{
	submit("s2", "first");
	free(answer("s2", NULL));
	submit("s2", "second");
	free(answer("s2", NULL));
	char *hist;
	size_t len;
	assert_int_equal(get_file(mpath(&D, "s2/history"), &hist, &len), 0);
	assert_non_null(strstr(hist, "first"));
	assert_non_null(strstr(hist, "tsrif"));
	assert_non_null(strstr(hist, "dnoces"));
	free(hist);
	const char *st = mpath(&D, "s2/status");
	assert_value(st, "state", "idle");
	assert_value(st, "generated_tokens", "7");   /* "dnoces" and the end of turn */
	assert_value(st, "finish", "eos");
	assert_value(st, "last_error", "");
	const char *keys[] = { "slot", "turns", "prompt_tokens", "context_tokens", "context_max",
			       "kv_blocks_device", "kv_blocks_host", "kv_blocks_disk",
			       "ttft_seconds", "tokens_per_second" };
	for (size_t i = 0; i < ATLAS_ARRAY_LEN(keys); i++) {
		char *v = value_of(st, keys[i]);
		assert_non_null(v);
		free(v);
	}

	ctl("s2", "reset\n");
	assert_int_equal(get_file(mpath(&D, "s2/history"), &hist, &len), 0);
	assert_int_equal(len, 0);
	free(hist);
	/* After a reset, out waits for the next turn (not a forgotten one). */
	int fd = open(mpath(&D, "s2/out"), O_RDONLY | O_NONBLOCK);
	char buf[8];
	assert_int_equal(read(fd, buf, sizeof buf), -1);
	assert_int_equal(errno, EAGAIN);
	submit("s2", "pq");
	struct pollfd p = { .fd = fd, .events = POLLIN };
	assert_int_equal(poll(&p, 1, 3000), 1);
	char *text;
	fcntl(fd, F_SETFL, 0);
	assert_int_equal(read_fd(fd, &text, &len), 0);
	assert_string_equal(text, "qp");
	free(text);
	close(fd);
}

static void *first_turn_reader(void *arg)
{
	char **text = arg;
	size_t len;
	if (get_file(mpath(&D, "s5/out"), text, &len) != 0) {
		free(*text);
		*text = NULL;
	}
	return NULL;
}

static void test_out_waits_for_first_turn(void **state)
{
	assert_int_equal(mkdir(mpath(&D, "s5"), 0755), 0);
	char *text = NULL;
	pthread_t th;
	pthread_create(&th, NULL, first_turn_reader, &text);
	usleep(200000);
	submit("s5", "hello");
	pthread_join(th, NULL);
	assert_non_null(text);
	assert_string_equal(text, "olleh");
	free(text);
	assert_int_equal(rmdir(mpath(&D, "s5")), 0);
}

/* Child reader of a SLOW turn: 0 when its read ends with ECANCELED. */
static int cancelled_reader(const char *session)
{
	int fd = open(mpath(&D, "%s/out", session), O_RDONLY);
	char buf[64];
	ssize_t r;
	while ((r = read(fd, buf, sizeof buf)) > 0)
		;
	int e = errno;
	close(fd);
	return r < 0 && e == ECANCELED ? 0 : 1;
}

static void test_ten_blocked_readers(void **state)
{
	submit("s1", "SLOW wait");
	pid_t pids[10];
	for (int i = 0; i < 10; i++)
		if ((pids[i] = fork()) == 0)
			_exit(cancelled_reader("s1"));
	usleep(300000);
	double t0 = now_s();
	char *v = value_of(mpath(&D, "ctl/slots"), "0");
	assert_non_null(v);
	assert_non_null(strstr(v, "s1 decode"));
	free(v);
	assert_value(mpath(&D, "s1/status"), "state", "decode");
	char *text;
	size_t len;
	assert_int_equal(get_file(mpath(&D, "ctl/metrics"), &text, &len), 0);
	free(text);
	assert_true(now_s() - t0 < 0.5);
	ctl("s1", "cancel\n");
	for (int i = 0; i < 10; i++)
		assert_int_equal(wait_exit(pids[i], 5000), 0);
}

static void test_rmdir_parked_reader(void **state)
{
	assert_int_equal(mkdir(mpath(&D, "s7"), 0755), 0);
	submit("s7", "SLOW abc");
	int fd = open(mpath(&D, "s7/out"), O_RDONLY);
	pid_t pid = fork();
	if (pid == 0)
		_exit(cancelled_reader("s7"));
	usleep(200000);
	double t0 = now_s();
	assert_int_equal(rmdir(mpath(&D, "s7")), 0);
	assert_int_equal(wait_exit(pid, 3000), 0);
	assert_true(now_s() - t0 < 1.0);
	/* A handle opened before the rmdir keeps its attributes, reads the
	 * rest, then ECANCELED; closing it afterwards is safe. */
	usleep(150000);   /* past attr_timeout: fstat asks atlasd */
	struct stat st;
	assert_int_equal(fstat(fd, &st), 0);
	assert_int_equal(st.st_mode, S_IFREG | 0400);
	char *text;
	size_t len;
	assert_int_equal(read_fd(fd, &text, &len), -ECANCELED);
	free(text);
	close(fd);
	assert_int_equal(mkdir(mpath(&D, "s7"), 0755), 0);
	assert_value(mpath(&D, "s7/status"), "turns", "0");
	assert_int_equal(rmdir(mpath(&D, "s7")), 0);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_commit_at_flush),
		cmocka_unit_test(test_two_readers_block_then_eof),
		cmocka_unit_test(test_nonblock_and_poll),
		cmocka_unit_test(test_interrupted_read),
		cmocka_unit_test(test_utf8_not_split),
		cmocka_unit_test(test_failed_turn),
		cmocka_unit_test(test_cancel_and_busy),
		cmocka_unit_test(test_in_rules),
		cmocka_unit_test(test_history_status_reset),
		cmocka_unit_test(test_tail_follow),
		cmocka_unit_test(test_out_waits_for_first_turn),
		cmocka_unit_test(test_ten_blocked_readers),
		cmocka_unit_test(test_rmdir_parked_reader),
	};
	return run_mounted(argc, argv, "fs-stream", tests, ATLAS_ARRAY_LEN(tests));
}
