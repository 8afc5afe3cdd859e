/* Limits that keep one client from stalling or bloating the daemon for
 * everyone: closing large prompts does not hold the FUSE workers (the
 * engine tokenizes them later), refused prompts are not kept, a
 * session's history is bounded (history_max), and so is what one
 * session's open handles hold (session_prompt_memory). */
#include "client.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>

#include "common/err.h"

#define BIG_SESSIONS 4
#define BIG_HANDLES 2           /* per session: a close commits, the others meet its turn
				 * (EBUSY) unless it has ended already */
#define BIG_PROMPT (6u << 20)   /* bytes of each, far more tokens than the context holds */

struct closer {
	pthread_t thread;
	pthread_barrier_t *go;
	int fd;
	int rc;                 /* close: 0 or errno */
};

static void *close_at_once(void *arg)
{
	struct closer *c = arg;
	pthread_barrier_wait(c->go);
	c->rc = close(c->fd) ? errno : 0;
	return NULL;
}

/* Sessions b0.. each get BIG_HANDLES handles on `in` holding BIG_PROMPT
 * bytes, all closed at once by threads of their own while this thread
 * reads README and another session's status. When every close has
 * returned and those reads are done, the engine is still tokenizing:
 * some session still waits in state queued with no prompt tokens. Had a
 * close tokenized its prompt itself (on a FUSE worker, under the
 * session's lock), every prompt would have its tokens by then. */
static void test_close_does_not_stall(void **state)
{
	char *prompt = malloc(BIG_PROMPT);
	assert_non_null(prompt);
	for (size_t i = 0; i < BIG_PROMPT; i++)
		prompt[i] = "lorem ipsum dolor sit amet "[i % 27];
	struct closer c[BIG_SESSIONS * BIG_HANDLES];
	pthread_barrier_t go;
	pthread_barrier_init(&go, NULL, ATLAS_ARRAY_LEN(c) + 1);
	for (int s = 0; s < BIG_SESSIONS; s++) {
		assert_int_equal(mkdir(mpath(&D, "b%d", s), 0755), 0);
		for (int h = 0; h < BIG_HANDLES; h++) {
			struct closer *k = &c[s * BIG_HANDLES + h];
			k->go = &go;
			k->fd = open(mpath(&D, "b%d/in", s), O_WRONLY);
			assert_true(k->fd >= 0);
			for (size_t off = 0; off < BIG_PROMPT; off += 1u << 20)
				assert_int_equal(write(k->fd, prompt + off, 1u << 20), 1 << 20);
		}
	}
	free(prompt);
	for (size_t i = 0; i < ATLAS_ARRAY_LEN(c); i++)
		assert_int_equal(pthread_create(&c[i].thread, NULL, close_at_once, &c[i]), 0);
	pthread_barrier_wait(&go);
	for (int i = 0; i < 4; i++) {
		char *text;
		size_t len;
		assert_int_equal(get_file(mpath(&D, "README"), &text, &len), 0);
		free(text);
		assert_value(mpath(&D, "s1/status"), "state", "idle");
	}
	for (size_t i = 0; i < ATLAS_ARRAY_LEN(c); i++)
		assert_int_equal(pthread_join(c[i].thread, NULL), 0);
	pthread_barrier_destroy(&go);
	int waiting = 0;
	for (int s = 0; s < BIG_SESSIONS; s++) {
		int committed = 0;
		for (int h = 0; h < BIG_HANDLES; h++) {
			int rc = c[s * BIG_HANDLES + h].rc;
			assert_true(rc == 0 || rc == EBUSY);
			committed += rc == 0;
		}
		assert_true(committed >= 1);
		char *st = value_of(mpath(&D, "b%d/status", s), "state");
		char *tokens = value_of(mpath(&D, "b%d/status", s), "prompt_tokens");
		waiting += !strcmp(st, "queued") && !strcmp(tokens, "0");
		free(st);
		free(tokens);
	}
	assert_true(waiting > 0);

	/* Each prompt then fails, as it does not fit the context, and its
	 * text is not kept in the history. */
	for (int s = 0; s < BIG_SESSIONS; s++) {
		char name[16];
		int rc;
		snprintf(name, sizeof name, "b%d", s);
		free(answer(name, &rc));
		assert_int_equal(rc, -EIO);
		char *why = value_of(mpath(&D, "b%d/status", s), "last_error");
		assert_non_null(strstr(why, "does not fit the context"));
		free(why);
		char *text;
		size_t len;
		assert_int_equal(get_file(mpath(&D, "b%d/history", s), &text, &len), 0);
		assert_true(len < 200);
		free(text);
		assert_int_equal(rmdir(mpath(&D, "b%d", s)), 0);
	}
}

/* history_max is 1K here: a turn of a 200-byte prompt and its answer
 * counts about 460 bytes, so two turns fit before the newest. */
static void test_history_cap(void **state)
{
	char prompt[201];
	assert_int_equal(mkdir(mpath(&D, "h"), 0755), 0);
	for (int turn = 1; turn <= 5; turn++) {
		memset(prompt, 'a' + turn, 200);
		prompt[200] = 0;
		submit("h", prompt);
		free(answer("h", NULL));
	}
	assert_value(mpath(&D, "h/status"), "turns", "5");
	char *text;
	size_t len;
	assert_int_equal(get_file(mpath(&D, "h/history"), &text, &len), 0);
	const char *head = "### 2 earlier turns dropped (history_max)\n### turn 3 user\n";
	assert_memory_equal(text, head, strlen(head));
	assert_null(strstr(text, "### turn 2 "));
	assert_non_null(strstr(text, "### turn 4 user\n"));
	assert_non_null(strstr(text, "### turn 5 user\n"));
	assert_non_null(strstr(text, "ffff"));   /* turn 5's prompt, whole */
	assert_true(len < 1024 + 600);
	free(text);
	/* A reset forgets the count with the turns. */
	ctl("h", "reset\n");
	submit("h", "ok");
	free(answer("h", NULL));
	assert_int_equal(get_file(mpath(&D, "h/history"), &text, &len), 0);
	assert_memory_equal(text, "### turn 6 user\n", 16);
	free(text);
	assert_int_equal(rmdir(mpath(&D, "h")), 0);
}

/* One session's handles hold at most session_prompt_memory (24M here)
 * together: two ctl handles of 10 MiB each, then a third takes 4 MiB more
 * and fails its next write with ENOSPC, while another session's handle
 * takes 10 MiB beside them (the mount's 64M are not full). Closed, the
 * session's memory is back. */
static void test_session_prompt_memory(void **state)
{
	const size_t chunk = 1u << 20;
	char *buf = malloc(chunk);
	assert_non_null(buf);
	memset(buf, 'x', chunk);
	assert_int_equal(mkdir(mpath(&D, "m1"), 0755), 0);
	assert_int_equal(mkdir(mpath(&D, "m2"), 0755), 0);
	int fd[4];
	for (int i = 0; i < 4; i++) {
		fd[i] = open(mpath(&D, i < 3 ? "m1/ctl" : "m2/ctl"), O_WRONLY);
		assert_true(fd[i] >= 0);
	}
	for (int i = 0; i < 2; i++)
		for (int c = 0; c < 10; c++)
			assert_int_equal(write(fd[i], buf, chunk), (ssize_t)chunk);
	int c = 0;
	while (c < 10 && write(fd[2], buf, chunk) == (ssize_t)chunk)
		c++;
	assert_int_equal(c, 4);
	assert_int_equal(errno, ENOSPC);
	for (c = 0; c < 10; c++)
		assert_int_equal(write(fd[3], buf, chunk), (ssize_t)chunk);
	for (int i = 0; i < 4; i++)
		assert_int_equal(close(fd[i]), -1); /* not settings, or failed */
	int f = open(mpath(&D, "m1/ctl"), O_WRONLY);
	assert_true(f >= 0);
	for (c = 0; c < 15; c++)
		assert_int_equal(write(f, buf, chunk), (ssize_t)chunk);
	assert_int_equal(close(f), -1);
	assert_int_equal(errno, EINVAL);
	free(buf);
	assert_int_equal(rmdir(mpath(&D, "m1")), 0);
	assert_int_equal(rmdir(mpath(&D, "m2")), 0);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_close_does_not_stall),
		cmocka_unit_test(test_history_cap),
		cmocka_unit_test(test_session_prompt_memory),
	};
	return run_mounted_with(argc, argv, "fs-limits", tests, ATLAS_ARRAY_LEN(tests),
				"max_sessions=8,prompt_memory=64M,session_prompt_memory=24M,"
				"history_max=1K");
}
