/* The tree (DESIGN §2) on a real FUSE mount: names and modes, a session's
 * ctl, mkdir and rmdir, access errors, and the ctl/ files with metrics in
 * the Prometheus text format. */
#include "client.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>

#include "common/err.h"
#include "metrics_check.h"

static void test_tree(void **state)
{
	const char *want[] = { "README", "ctl", "s1", "s2" };
	for (size_t i = 0; i < 4; i++) {
		struct stat st;
		assert_int_equal(stat(mpath(&D, "%s", want[i]), &st), 0);
	}
	DIR *dir = opendir(D.mnt);
	assert_non_null(dir);
	int n = 0;
	for (struct dirent *e; (e = readdir(dir));)
		n++;
	closedir(dir);
	assert_int_equal(n, 6);   /* . .. README ctl s1 s2 */

	const char *ctl_files[] = { "slots", "kv", "spec", "ep", "engine", "metrics", "config" };
	for (size_t i = 0; i < 7; i++) {
		char *text;
		size_t len;
		assert_int_equal(get_file(mpath(&D, "ctl/%s", ctl_files[i]), &text, &len), 0);
		assert_true(len > 0);
		free(text);
	}
	struct { const char *name; mode_t mode; } modes[] = {
		{ "s1", S_IFDIR | 0500 }, { "s1/in", S_IFREG | 0200 }, { "s1/out", S_IFREG | 0400 },
		{ "s1/ctl", S_IFREG | 0600 }, { "s1/history", S_IFREG | 0400 },
		{ "s1/status", S_IFREG | 0400 }, { "ctl/metrics", S_IFREG | 0444 },
		{ "ctl", S_IFDIR | 0555 }, { "", S_IFDIR | S_ISVTX | 0777 },
	};
	for (size_t i = 0; i < ATLAS_ARRAY_LEN(modes); i++) {
		struct stat st;
		assert_int_equal(stat(mpath(&D, "%s", modes[i].name), &st), 0);
		assert_int_equal(st.st_mode, modes[i].mode);
		assert_int_equal(st.st_size, 0);
	}

	char *readme;
	size_t len;
	assert_int_equal(get_file(mpath(&D, "README"), &readme, &len), 0);
	assert_non_null(strstr(readme, D.model));
	assert_non_null(strstr(readme, "s1/in"));
	free(readme);
}

/* Write buf[0, n) to fd in pieces of 1 MiB: a write fails with EFBIG
 * before 16 MiB are in, and so do a later write and the close. */
static void write_too_much(int fd, const char *buf, size_t n)
{
	size_t done = 0;
	ssize_t w = 0;
	while (done < n && (w = write(fd, buf + done, ATLAS_MIN(n - done, 1u << 20))) > 0)
		done += (size_t)w;
	assert_int_equal(w, -1);
	assert_int_equal(errno, EFBIG);
	assert_true(done <= 16u << 20);
	assert_int_equal(write(fd, "\n", 1), -1);
	assert_int_equal(errno, EFBIG);
	assert_int_equal(close(fd), -1);
	assert_int_equal(errno, EFBIG);
}

static void test_ctl(void **state)
{
	const char *path = mpath(&D, "s1/ctl");
	assert_value(path, "temperature", "0.5");   /* -o temperature=0.5 */
	ctl("s1", "temperature 0.25\ntop_k 7\n");
	assert_value(path, "temperature", "0.25");
	assert_value(path, "top_k", "7");
	/* One bad line fails the whole write and changes nothing. */
	assert_int_equal(put_file(path, "temperature 0.75\nbogus 1\n"), -EINVAL);
	assert_int_equal(put_file(path, "top_k 9\ntop_p 2\n"), -EINVAL);
	assert_int_equal(put_file(path, "top_k 9\ncancel now\n"), -EINVAL);
	assert_value(path, "temperature", "0.25");
	assert_value(path, "top_k", "7");
	/* Reading ctl back says why the last write was refused, as a comment
	 * that the settings read back and written again skip; a batch that
	 * applies clears it. */
	assert_int_equal(put_file(path, "top_p 2\n"), -EINVAL);
	assert_value(path, "# error:", "top_p: 2 is not in (0, 1]");
	char *settings;
	size_t n_settings;
	assert_int_equal(get_file(path, &settings, &n_settings), 0);
	assert_int_equal(put_file(path, settings), 0);
	free(settings);
	assert_null(value_of(path, "# error:"));
	/* Shells write a redirection line by line: the lines of one handle apply
	 * together at close, and a bad one fails its write, the later ones and
	 * the close. */
	int wfd = open(path, O_WRONLY);
	assert_true(wfd >= 0);
	assert_int_equal(write(wfd, "top_k 11\n", 9), 9);
	assert_value(path, "top_k", "7");
	errno = 0;
	assert_int_equal(write(wfd, "temperature hot\n", 16), -1);
	assert_int_equal(errno, EINVAL);
	assert_int_equal(write(wfd, "top_p 0.5\n", 10), -1);
	assert_int_equal(errno, EINVAL);
	assert_int_equal(close(wfd), -1);
	assert_int_equal(errno, EINVAL);
	assert_value(path, "top_k", "7");
	assert_value(path, "top_p", "0.9");
	wfd = open(path, O_WRONLY);
	assert_int_equal(write(wfd, "top_k 11\n", 9), 9);
	assert_int_equal(write(wfd, "top_p 0.", 8), 8);      /* a line across writes */
	assert_int_equal(write(wfd, "5\nstop a\nstop", 13), 13);
	ctl("s1", "top_k 12\nseed 5\n");                   /* another handle, meanwhile */
	assert_int_equal(write(wfd, " b\nstop c", 9), 9);    /* the last line may lack its newline */
	assert_int_equal(close(wfd), 0);
	assert_value(path, "top_k", "11");
	assert_value(path, "top_p", "0.5");
	assert_value(path, "seed", "5");                      /* a key this batch did not set */
	char *stops;
	size_t n_stops;
	assert_int_equal(get_file(path, &stops, &n_stops), 0);
	assert_non_null(strstr(stops, "stop a\nstop b\nstop c\n"));
	free(stops);
	/* A batch over the size limit fails its write, the later ones and the
	 * close, and applies nothing. */
	const size_t big = 17u << 20;
	char *lines = malloc(big);
	assert_non_null(lines);
	for (size_t i = 0; i + 8 <= big; i += 8)
		memcpy(lines + i, "top_k 9\n", 8);
	wfd = open(path, O_WRONLY);
	write_too_much(wfd, lines, big);
	free(lines);
	assert_value(path, "top_k", "11");
	ctl("s1", "top_k 7\ntop_p 0.9\nstop\n");
	/* Settings apply to the next turn: a token is a byte with the scripted model. */
	ctl("s1", "max_tokens 3\n");
	submit("s1", "abcdef");
	char *out = answer("s1", NULL);
	assert_string_equal(out, "fed");
	free(out);
	assert_value(mpath(&D, "s1/status"), "finish", "length");
	ctl("s1", "max_tokens 512\ntemperature 0.5\ntop_k 40\n");

	/* A handle's snapshot is taken at open. */
	int fd = open(path, O_RDONLY);
	ctl("s1", "seed 42\n");
	char *text;
	size_t len;
	assert_int_equal(read_fd(fd, &text, &len), 0);
	close(fd);
	assert_null(strstr(text, "seed 42"));
	free(text);
	assert_value(path, "seed", "42");
}

/* A prompt over the size limit fails its write, the later ones and the
 * close, and no part of it becomes a turn. */
static void test_in_too_long(void **state)
{
	const size_t big = 17u << 20;
	char *prompt = malloc(big);
	assert_non_null(prompt);
	memset(prompt, 'x', big);
	assert_value(mpath(&D, "s2/status"), "turns", "0");
	int fd = open(mpath(&D, "s2/in"), O_WRONLY);
	assert_true(fd >= 0);
	write_too_much(fd, prompt, big);
	free(prompt);
	/* Nothing of it reaches the context: the turn a reader would wait for
	 * has failed, saying why. */
	assert_value(mpath(&D, "s2/status"), "turns", "1");
	assert_value(mpath(&D, "s2/status"), "finish", "error");
	assert_value(mpath(&D, "s2/status"), "prompt_tokens", "0");
	/* The session takes the next prompt. */
	submit("s2", "ok");
	char *out = answer("s2", NULL);
	assert_string_equal(out, "ko");
	free(out);
}

/* A reader of a session's next turn, on a thread of its own. */
struct next_reader {
	pthread_t thread;
	const char *path;
	int rc, err;            /* read's result: -1 and errno when the turn failed */
};

static void *read_next(void *arg)
{
	struct next_reader *r = arg;
	char buf[256];
	int fd = open(r->path, O_RDONLY);
	if (fd < 0) {
		r->rc = -2;
		return NULL;
	}
	ssize_t n;
	while ((n = read(fd, buf, sizeof buf)) > 0)
		;
	r->rc = (int)n;
	r->err = n < 0 ? errno : 0;
	close(fd);
	return NULL;
}

/* Text that is not UTF-8 fails the write that brings it (EILSEQ), a prompt
 * that ends inside a character fails its close; either way the commit takes
 * nothing, a reader that waits for the session's next turn ends with an
 * error instead of waiting for ever, and status says why. A system or stop
 * text that is not UTF-8 fails its ctl write. */
static void test_in_not_utf8(void **state)
{
	assert_int_equal(mkdir(mpath(&D, "u8"), 0755), 0);
	for (int split = 0; split < 2; split++) {
		struct next_reader r = { .path = mpath(&D, "u8/out") };
		r.path = strdup(r.path);
		assert_int_equal(pthread_create(&r.thread, NULL, read_next, &r), 0);
		usleep(200000); /* the reader waits for turn 1 (then 2) */
		int fd = open(mpath(&D, "u8/in"), O_WRONLY);
		assert_true(fd >= 0);
		if (split) {
			/* The first byte of "é", and the prompt ends there. */
			assert_int_equal(write(fd, "caf\xc3", 4), 4);
			assert_int_equal(close(fd), -1);
			assert_int_equal(errno, EILSEQ);
		} else {
			assert_int_equal(write(fd, "hello \xff\xfe", 8), -1);
			assert_int_equal(errno, EILSEQ);
			assert_int_equal(write(fd, "more", 4), -1);
			assert_int_equal(close(fd), -1);
		}
		assert_int_equal(pthread_join(r.thread, NULL), 0);
		free((char *)r.path);
		assert_int_equal(r.rc, -1);
		assert_int_equal(r.err, EIO);
		assert_value(mpath(&D, "u8/status"), "finish", "error");
		char *why = value_of(mpath(&D, "u8/status"), "last_error");
		assert_non_null(strstr(why, "UTF-8"));
		free(why);
	}
	int fd = open(mpath(&D, "u8/ctl"), O_WRONLY);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "system \xc3\x28\n", 10), -1);
	assert_int_equal(errno, EILSEQ);
	close(fd);
	fd = open(mpath(&D, "u8/ctl"), O_WRONLY);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "stop \xed\xa0\x80\n", 9), -1);
	assert_int_equal(errno, EILSEQ);
	close(fd);
	/* The session takes the next prompt, UTF-8 split across writes too. */
	fd = open(mpath(&D, "u8/in"), O_WRONLY);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "caf\xc3", 4), 4);
	assert_int_equal(write(fd, "\xa9", 1), 1);
	assert_int_equal(close(fd), 0);
	char *out = answer("u8", NULL);
	assert_string_equal(out, "\xc3\xa9" "fac");
	free(out);
	assert_int_equal(rmdir(mpath(&D, "u8")), 0);
}

/* The mount's prompt memory (prompt_memory 40M for these tests): ctl lines
 * not yet applied hold it as prompts do. Two handles holding 15 MiB each
 * fit; a third's write past the rest fails with ENOSPC (and its close);
 * once they are closed the memory is back. */
static void test_prompt_memory(void **state)
{
	const size_t chunk = 1u << 20;
	char *buf = malloc(chunk);
	assert_non_null(buf);
	memset(buf, 'x', chunk);
	int fd[3];
	for (int i = 0; i < 3; i++) {
		fd[i] = open(mpath(&D, "s1/ctl"), O_WRONLY);
		assert_true(fd[i] >= 0);
	}
	for (int i = 0; i < 2; i++)
		for (int c = 0; c < 15; c++)
			assert_int_equal(write(fd[i], buf, chunk), (ssize_t)chunk);
	int c = 0;
	while (c < 15 && write(fd[2], buf, chunk) == (ssize_t)chunk)
		c++;
	assert_int_equal(c, 10);
	assert_int_equal(errno, ENOSPC);
	assert_int_equal(write(fd[2], "x", 1), -1);
	assert_int_equal(errno, ENOSPC);
	for (int i = 0; i < 3; i++)
		assert_int_equal(close(fd[i]), -1);
	int f = open(mpath(&D, "s2/ctl"), O_WRONLY);
	assert_true(f >= 0);
	for (c = 0; c < 15; c++)
		assert_int_equal(write(f, buf, chunk), (ssize_t)chunk);
	assert_int_equal(close(f), -1); /* not a setting */
	assert_int_equal(errno, EINVAL);
	free(buf);
}

static void test_mkdir_rmdir(void **state)
{
	struct stat st;
	assert_int_equal(mkdir(mpath(&D, "s9"), 0755), 0);
	assert_int_equal(stat(mpath(&D, "s9/in"), &st), 0);
	submit("s9", "nine");
	char *out = answer("s9", NULL);
	assert_string_equal(out, "enin");
	free(out);
	assert_int_equal(mkdir(mpath(&D, "s9"), 0755), -1);
	assert_int_equal(errno, EEXIST);
	assert_int_equal(rmdir(mpath(&D, "s9")), 0);
	assert_int_equal(stat(mpath(&D, "s9"), &st), -1);
	assert_int_equal(errno, ENOENT);
	/* The name can be used again, for a fresh session. */
	assert_int_equal(mkdir(mpath(&D, "s9"), 0755), 0);
	assert_value(mpath(&D, "s9/status"), "turns", "0");

	assert_int_equal(mkdir(mpath(&D, "bad name"), 0755), -1);
	assert_int_equal(errno, EINVAL);
	char longname[80];
	memset(longname, 'a', 70);
	longname[70] = 0;
	assert_int_equal(mkdir(mpath(&D, "%s", longname), 0755), -1);
	assert_int_equal(errno, EINVAL);
	/* max_sessions is 5: s1 s2 s9 and two more. */
	assert_int_equal(mkdir(mpath(&D, "x1"), 0755), 0);
	assert_int_equal(mkdir(mpath(&D, "x2"), 0755), 0);
	assert_int_equal(mkdir(mpath(&D, "x3"), 0755), -1);
	assert_int_equal(errno, ENOSPC);
	assert_int_equal(rmdir(mpath(&D, "x1")), 0);
	assert_int_equal(rmdir(mpath(&D, "x2")), 0);
	assert_int_equal(rmdir(mpath(&D, "s9")), 0);

	assert_int_equal(mkdir(mpath(&D, "ctl/x"), 0755), -1);
	assert_int_equal(errno, EACCES);
	assert_int_equal(mkdir(mpath(&D, "s1/x"), 0755), -1);
	assert_int_equal(errno, EACCES);
	assert_int_equal(rmdir(mpath(&D, "ctl")), -1);
	assert_int_equal(errno, EACCES);
	assert_int_equal(rmdir(mpath(&D, "README")), -1);
	assert_int_equal(errno, ENOTDIR);
	assert_int_equal(rmdir(mpath(&D, "nosuch")), -1);
	assert_int_equal(errno, ENOENT);
}

static void test_access_errors(void **state)
{
	struct { const char *name; int flags, err; } cases[] = {
		{ "s1/out", O_WRONLY, EACCES }, { "s1/status", O_WRONLY, EACCES },
		{ "s1/history", O_RDWR, EACCES }, { "s1/in", O_RDONLY, EACCES },
		{ "ctl/slots", O_WRONLY, EACCES }, { "README", O_RDWR, EACCES },
		{ "s1/nope", O_RDONLY, ENOENT }, { "nosuch/in", O_WRONLY, ENOENT },
		{ "s1/new", O_WRONLY | O_CREAT, EACCES }, { "newfile", O_WRONLY | O_CREAT, EACCES },
	};
	for (size_t i = 0; i < ATLAS_ARRAY_LEN(cases); i++) {
		int fd = open(mpath(&D, "%s", cases[i].name), cases[i].flags, 0644);
		if (fd >= 0)
			close(fd);
		assert_int_equal(fd, -1);
		assert_int_equal(errno, cases[i].err);
	}
	assert_int_equal(unlink(mpath(&D, "s1/in")), -1);
	assert_int_equal(errno, EACCES);
	assert_int_equal(rename(mpath(&D, "s1/in"), mpath(&D, "s1/in2")), -1);
	assert_int_equal(errno, EACCES);
	assert_int_equal(truncate(mpath(&D, "s1/status"), 0), -1);
	assert_int_equal(errno, EACCES);
}

static void test_metrics(void **state)
{
	submit("s1", "metrics");
	free(answer("s1", NULL));
	char *text;
	size_t len;
	assert_int_equal(get_file(mpath(&D, "ctl/metrics"), &text, &len), 0);
	char err[256] = "";
	int rc = check_prometheus(text, err, sizeof err);
	if (rc)
		fail_msg("ctl/metrics: %s", err);
	assert_non_null(strstr(text, "\natlas_turns_total "));
	assert_non_null(strstr(text, "atlas_slot_kv_blocks{slot=\"2\",tier=\"disk\"} 0\n"));
	/* The first tier is the device's, whatever its memory is called. */
	assert_non_null(strstr(text, "atlas_slot_kv_blocks{slot=\"2\",tier=\"device\"} "));
	/* The model's path holds a quote and a backslash (client.h). */
	char label[1200] = "atlas_engine_info{model=\"";
	for (const char *c = D.model; *c; c++) {
		size_t n = strlen(label);
		if (*c == '"' || *c == '\\')
			label[n++] = '\\';
		label[n] = *c;
		label[n + 1] = 0;
	}
	strcat(label, "\",");
	assert_non_null(strstr(text, label));
	free(text);
}

/* The value of the series `key` (name and labels) in ctl/metrics now. */
static double metric(const char *key)
{
	char *text, want[200];
	size_t len;
	assert_int_equal(get_file(mpath(&D, "ctl/metrics"), &text, &len), 0);
	snprintf(want, sizeof want, "\n%s ", key);
	char *at = strstr(text, want);
	if (!at)
		fail_msg("no %s in ctl/metrics", key);
	double v = strtod(at + strlen(want), NULL);
	free(text);
	return v;
}

/* A turn of 5 tokens (4 of them 30 ms apart): one time to first token, one
 * queue time, 4 inter-token latencies, 3 of them above 25 ms, and one turn
 * finished with eos. */
static void test_turn_metrics(void **state)
{
	static const char *const keys[] = {
		"atlas_time_to_first_token_seconds_count", "atlas_request_queue_time_seconds_count",
		"atlas_inter_token_latency_seconds_count",
		"atlas_inter_token_latency_seconds_bucket{le=\"0.025\"}",
		"atlas_turns_finished_total{finished_reason=\"eos\"}",
		"atlas_turns_finished_total{finished_reason=\"length\"}",
	};
	double before[6], after[6];
	for (int i = 0; i < 6; i++)
		before[i] = metric(keys[i]);
	submit("s1", "SLEEP 30 abcd");
	free(answer("s1", NULL));
	for (int i = 0; i < 6; i++)
		after[i] = metric(keys[i]);
	assert_true(after[0] - before[0] == 1);
	assert_true(after[1] - before[1] == 1);
	assert_true(after[2] - before[2] == 4);
	assert_true((after[2] - after[3]) - (before[2] - before[3]) >= 3);
	assert_true(after[4] - before[4] == 1);
	assert_true(after[5] == before[5]);
	assert_true(metric("atlas_inter_token_latency_seconds_sum") >= 0.09);
	assert_true(metric("atlas_time_to_first_token_seconds_bucket{le=\"+Inf\"}") ==
		    metric("atlas_time_to_first_token_seconds_count"));
}

static void test_ctl_files(void **state)
{
	assert_value(mpath(&D, "ctl/engine"), "architecture", "AtlasScriptForCausalLM");
	assert_value(mpath(&D, "ctl/engine"), "slots", "3");
	assert_value(mpath(&D, "ctl/spec"), "method", "auto");
	assert_value(mpath(&D, "ctl/kv"), "block_size_tokens", "16");
	assert_value(mpath(&D, "ctl/ep"), "ranks", "1");
	char *text;
	size_t len;
	assert_int_equal(get_file(mpath(&D, "ctl/slots"), &text, &len), 0);
	int lines = 0;
	for (char *c = text; *c; c++)
		lines += *c == '\n';
	assert_int_equal(lines, 4);   /* a header and max_batch = 3 slots */
	free(text);
	assert_int_equal(get_file(mpath(&D, "ctl/config"), &text, &len), 0);
	assert_non_null(strstr(text, "\nmax_batch = 3\n"));
	/* INI text: the backslash of the model's path is escaped. */
	char model[1000] = "\nmodel = ";
	for (const char *c = D.model; *c; c++) {
		size_t n = strlen(model);
		if (*c == '\\')
			model[n++] = '\\';
		model[n] = *c;
		model[n + 1] = 0;
	}
	strcat(model, "\n");
	assert_non_null(strstr(text, model));
	free(text);
	/* Reads honour offsets within one snapshot. */
	int fd = open(mpath(&D, "ctl/config"), O_RDONLY);
	char a[32] = "", b[32] = "";
	assert_int_equal(pread(fd, a, 10, 5), 10);
	assert_int_equal(pread(fd, b, 5, 10), 5);
	assert_memory_equal(a + 5, b, 5);
	close(fd);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tree),
		cmocka_unit_test(test_ctl),
		cmocka_unit_test(test_in_too_long),
		cmocka_unit_test(test_in_not_utf8),
		cmocka_unit_test(test_prompt_memory),
		cmocka_unit_test(test_mkdir_rmdir),
		cmocka_unit_test(test_access_errors),
		cmocka_unit_test(test_metrics),
		cmocka_unit_test(test_turn_metrics),
		cmocka_unit_test(test_ctl_files),
	};
	return run_mounted(argc, argv, "fs-tree", tests, ATLAS_ARRAY_LEN(tests));
}
