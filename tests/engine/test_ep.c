/* Expert parallelism on the cpu backend (DESIGN §10), with worker processes
 * on loopback addresses:
 *
 *  - tokens and logits with ep = 2, 3 and 4 are bitwise those of ep = 1, four
 *    sessions at once (batched decode, prompts of several chunks), and with
 *    ep = 2 and prompt-lookup drafts verified across the ranks;
 *  - a worker killed mid-turn: the running turns fail within ep_timeout
 *    with an error naming the rank, ctl/ep's stats say which rank is gone,
 *    new turns fail at once saying so; a restarted worker lets the head
 *    resume, and the next turns give the reference tokens again;
 *  - a worker stopped (SIGSTOP) mid-turn: the same, through the timeout;
 *  - a worker of another configuration is refused, with the reason, on
 *    both sides.
 *
 * The model is the dummy shape qwen3-moe-test (random weights, 8 experts,
 * top 2, one dense layer), or the one given, a shape or a model directory:
 * with another model (qwen3-next-test, a hybrid whose Gated DeltaNet layers
 * every rank runs beside its share of the experts; a transformers test
 * model) the equality checks run, not the failures. Workers are `atlasd
 * --worker` processes. Every process ends by itself: workers end when no
 * head answers for ep_join_timeout, and alarms bound the test and them.
 *
 * With ATLAS_TEST_BACKEND=cuda the ranks run on the cuda backend and meet
 * through NCCL, rank r on device r % ATLAS_TEST_GPUS (default 1; NCCL
 * takes one rank per device, so ep = 3 runs only with 3 GPUs and ep = 4
 * with 4), and the faults are the NCCL ones: a killed or stopped worker
 * leaves the head's collective waiting until ep_timeout aborts it. The
 * tokens must be those of ep = 1 there too; the logits are checked bitwise
 * on the cpu, and on cuda their largest difference is printed and held to
 * CUDA_LOGIT_TOL.
 *
 * Usage: test_ep ATLASD [SHAPE | MODEL_DIR]
 */
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/clock.h"
#include "common/err.h"
#include "engine_testutil.h"

static const char *shape = "qwen3-moe-test";
static bool on_cuda;                /* ATLAS_TEST_BACKEND=cuda */
static int gpus = 1;                /* ATLAS_TEST_GPUS */
/* The largest logit difference allowed from ep = 1 on cuda: a sum over
 * ranks of rows that only one rank holds is exact in NCCL too, so any
 * difference would come from a kernel whose arithmetic depends on which
 * experts share its launch. */
#define CUDA_LOGIT_TOL 1e-3f
#define N_SESSIONS 4
#define NEW_TOKENS 32
#define TIMEOUT_S 3.0               /* ep_timeout of the fault tests */
/* The head's ep_join_timeout where every worker should join: workers
 * started beside the tests of a loaded two-core machine took more than
 * the workers' 3 s to join (CI, 2026-12-03). */
#define HEAD_JOIN_S 60.0

static const int prompt_len[N_SESSIONS] = { 40, 3, 75, 1 };

struct run {
	int32_t ids[N_SESSIONS][NEW_TOKENS];
	float *logits;                  /* [LOGIT_POSITIONS, vocab] */
};

#define LOGIT_POSITIONS 20

static struct run reference;
static int vocab;

/* A free loopback port, for one group. */
static int free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof a;
	assert_true(fd >= 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	close(fd);
	return ntohs(a.sin_port);
}

/* Whether the model is a directory of files rather than a dummy shape. */
static bool model_dir(void)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/config.json", shape);
	return access(path, R_OK) == 0;
}

static void config(struct atlas_config *c, int ep, int port)
{
	et_config(c, shape);
	if (!model_dir())
		snprintf(c->load_format, sizeof c->load_format, "dummy");
	c->ep = ep;
	snprintf(c->ep_address, sizeof c->ep_address, "127.0.0.1:%d", port);
	c->ep_timeout = TIMEOUT_S;
	c->ep_join_timeout = 3;         /* a worker ends 3 s after its head is gone */
	c->max_batch = N_SESSIONS;
	c->chunk_size = 32;
	c->context = 256;
	c->spec = ATLAS_SPEC_OFF;
	c->kv_memory = 4u << 20;
}

static const char *atlasd;          /* argv[1]: the atlasd that workers run */

/* A line saying how far a case got, so that a hang in a run on the GPUs
 * (where the fault is NCCL's) shows its phase in the log. */
static void phase(const char *what, int ep)
{
	static uint64_t t0;
	if (!t0)
		t0 = atlas_now_ns();
	printf("  %7.2f s  ep = %d: %s\n", (double)(atlas_now_ns() - t0) * 1e-9, ep, what);
	fflush(stdout);
}

/* `atlasd --worker r` with c's keys, a process of its own (exec'd: this
 * process has threads by now). Exits 0 once its head is gone for good,
 * 1 when the head refused it. */
static pid_t start_worker(const struct atlas_config *c, int rank)
{
	char opts[6144], r[8];
	snprintf(opts, sizeof opts,
		 "model=%s,load_format=%s,backend=%s,cpu_precision=%s,device=%d,threads=%d,ep=%d,"
		 "ep_address=%s,ep_timeout=%g,ep_join_timeout=%g,max_batch=%d,chunk_size=%d,"
		 "context=%d,kv_block_size=%d,kv_memory=%llu,spec=off,log_level=warn", c->model,
		 c->load_format, c->backend, c->cpu_precision, rank % gpus, c->threads, c->ep,
		 c->ep_address,
		 c->ep_timeout,
		 c->ep_join_timeout, c->max_batch, c->chunk_size, c->context, c->kv_block_size,
		 (unsigned long long)c->kv_memory);
	snprintf(r, sizeof r, "%d", rank);
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		alarm(120);
		execl(atlasd, atlasd, "--worker", r, "-o", opts, (char *)NULL);
		_exit(127);
	}
	return pid;
}

static struct atlas_engine *open_engine(const struct atlas_config *c)
{
	struct atlas_engine *e;
	char err[ATLAS_ERRLEN];
	if (atlas_engine_open(c, &e, err, sizeof err))
		fail_msg("atlas_engine_open: %s", err);
	atlas_engine_set_notify(e, et_on_notify, NULL);
	vocab = atlas_engine_vocab_size(e);
	return e;
}

static struct atlas_session *session(struct atlas_engine *e, const char *name, int max_tokens)
{
	struct atlas_session *s;
	char err[ATLAS_ERRLEN], mt[16];
	assert_int_equal(atlas_session_open(e, name, &s, err, sizeof err), 0);
	snprintf(mt, sizeof mt, "%d", max_tokens);
	et_set(s, "mode", "raw");
	et_set(s, "temperature", "0");
	et_set(s, "max_tokens", mt);
	et_set(s, "ignore_eos", "1");
	return s;
}

/* Four sessions at once, then the logits of one sequence. */
static void run_all(struct atlas_engine *e, struct run *out)
{
	struct atlas_session *s[N_SESSIONS];
	char err[ATLAS_ERRLEN], name[16];
	for (int i = 0; i < N_SESSIONS; i++) {
		snprintf(name, sizeof name, "s%d", i);
		s[i] = session(e, name, NEW_TOKENS);
	}
	for (int i = 0; i < N_SESSIONS; i++) {
		/* The second half repeats the first, so that prompt lookup has
		 * matches to draft from whatever the model answers. */
		int32_t ids[128];
		const int half = (prompt_len[i] + 1) / 2;
		et_prompt_ids(ids, half, 500u + (uint32_t)i, vocab);
		memcpy(ids + half, ids, sizeof *ids * (size_t)(prompt_len[i] - half));
		assert_int_equal(atlas_session_submit_tokens(s[i], ids, (size_t)prompt_len[i], err,
							     sizeof err), 1);
	}
	for (int i = 0; i < N_SESSIONS; i++) {
		assert_int_equal(et_wait_turn(s[i], 1, NULL, 0, 0), 0);
		et_turn_ids(s[i], 1, out->ids[i], NEW_TOKENS);
		atlas_session_close(s[i]);
	}
	int32_t ids[LOGIT_POSITIONS];
	et_prompt_ids(ids, LOGIT_POSITIONS, 77, vocab);
	out->logits = malloc(sizeof(float) * LOGIT_POSITIONS * (size_t)vocab);
	assert_non_null(out->logits);
	assert_int_equal(atlas_engine_logits(e, ids, LOGIT_POSITIONS, out->logits, err,
					     sizeof err), 0);
}

static void assert_same_run(const struct run *a, const struct run *b, const char *what)
{
	for (int i = 0; i < N_SESSIONS; i++)
		for (int t = 0; t < NEW_TOKENS; t++)
			if (a->ids[i][t] != b->ids[i][t])
				fail_msg("%s: session %d token %d: %d, ep = 1 gave %d", what, i, t,
					 a->ids[i][t], b->ids[i][t]);
	const size_t n = (size_t)LOGIT_POSITIONS * (size_t)vocab;
	if (!on_cuda) {
		if (memcmp(a->logits, b->logits, sizeof(float) * n))
			fail_msg("%s: logits differ from ep = 1's", what);
		return;
	}
	float most = 0;
	for (size_t i = 0; i < n; i++)
		most = fmaxf(most, fabsf(a->logits[i] - b->logits[i]));
	printf("%s on cuda: logits %s ep = 1's (largest difference %g)\n", what,
	       most == 0 ? "bitwise" : "within", (double)most);
	if (!(most <= CUDA_LOGIT_TOL))
		fail_msg("%s: logits differ from ep = 1's by %g", what, (double)most);
}

static void wait_worker(pid_t pid, int want)
{
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != want)
		fail_msg("worker %d: status %d, wanted exit %d", (int)pid, st, want);
}

static void test_reference(void **state)
{
	struct atlas_config c;
	config(&c, 1, free_port());
	struct atlas_engine *e = open_engine(&c);
	run_all(e, &reference);
	struct atlas_engine_stats *st = malloc(sizeof *st);
	assert_int_equal(atlas_engine_stats(e, st), 0);
	assert_int_equal(st->ep.ranks, 1);
	assert_int_equal(st->ep.experts_per_rank, st->experts);
	free(st);
	atlas_engine_close(e);
}

/* ep ranks: the head here, workers 1 .. ep-1 as processes; with
 * prompt-lookup drafts verified across the ranks when spec. */
static void equal_with(int ep, bool spec)
{
	struct atlas_config c;
	pid_t w[8];
	char what[48];
	config(&c, ep, free_port());
	if (spec) {
		c.spec = ATLAS_SPEC_NGRAM;
		c.spec_gate = false;
	}
	for (int r = 1; r < ep; r++)
		w[r] = start_worker(&c, r);
	phase("workers started", ep);
	struct atlas_config head = c;
	head.ep_join_timeout = HEAD_JOIN_S;
	struct atlas_engine *e = open_engine(&head);
	phase("the group is up", ep);
	struct run got;
	run_all(e, &got);
	phase("the turns and the logits are done", ep);
	snprintf(what, sizeof what, "ep = %d%s", ep, spec ? ", prompt lookup" : "");
	assert_same_run(&got, &reference, what);
	struct atlas_engine_stats *st = malloc(sizeof *st);
	assert_int_equal(atlas_engine_stats(e, st), 0);
	if (spec && st->spec.drafts_total == 0)
		fail_msg("prompt lookup never drafted: the test checks nothing of it");
	assert_int_equal(st->ep.ranks, ep);
	assert_true(st->ep.up);
	assert_true(st->ep.collectives_total > 0);
	assert_true(st->ep.commands_total > 0);
	assert_int_equal(st->ep.rank[ep - 1].expert_last, st->experts - 1);
	assert_string_equal(st->ep.rank[1].state, "up");
	free(st);
	free(got.logits);
	atlas_engine_close(e);
	phase("the head is closed", ep);
	for (int r = 1; r < ep; r++)
		wait_worker(w[r], 0);
	phase("the workers have ended", ep);
}

static void test_ep2(void **state) { equal_with(2, false); }
/* ep ranks when the GPUs allow it: NCCL takes one rank per device. */
static void equal_with_ranks(int ep)
{
	if (on_cuda && gpus < ep) {
		printf("ep = %d on cuda needs %d GPUs (ATLAS_TEST_GPUS = %d): skipped\n", ep, ep,
		       gpus);
		skip();
	}
	equal_with(ep, false);
}
static void test_ep3(void **state) { equal_with_ranks(3); }
static void test_ep4(void **state) { equal_with_ranks(4); }
static void test_ep2_spec(void **state) { equal_with(2, true); }

/* A turn long enough to be running when the worker is hit. */
static void fault(int sig)
{
	struct atlas_config c;
	struct atlas_session_status ss;
	char err[ATLAS_ERRLEN];
	config(&c, 2, free_port());
	pid_t w = start_worker(&c, 1);
	struct atlas_config head = c;
	head.ep_join_timeout = HEAD_JOIN_S;
	struct atlas_engine *e = open_engine(&head);
	struct atlas_session *s = session(e, "long", 200);
	int32_t ids[16];
	et_prompt_ids(ids, 16, 9, vocab);
	assert_int_equal(atlas_session_submit_tokens(s, ids, 16, err, sizeof err), 1);
	assert_int_equal(et_wait_turn(s, 1, NULL, 0, 8), 0); /* a few tokens came */
	const uint64_t t0 = atlas_now_ns();
	kill(w, sig);
	phase(sig == SIGKILL ? "the worker is killed" : "the worker is stopped", 2);
	int rc = et_wait_turn(s, 1, NULL, 0, 0);
	const double took = (double)(atlas_now_ns() - t0) * 1e-9;
	phase("the running turn has ended", 2);
	assert_true(rc < 0);
	assert_true(took < TIMEOUT_S + 3.0);
	assert_int_equal(atlas_session_status(s, &ss), 0);
	assert_string_equal(ss.finish, "error");
	if (!strstr(ss.last_error, "rank 1"))
		fail_msg("the error does not name the rank: %s", ss.last_error);
	struct atlas_engine_stats *st = malloc(sizeof *st);
	assert_int_equal(atlas_engine_stats(e, st), 0);
	assert_false(st->ep.up);
	assert_string_equal(st->ep.rank[1].state, "gone");
	assert_non_null(strstr(st->ep.why, "rank 1"));

	/* New turns fail at once, saying why. */
	assert_int_equal(atlas_session_submit_tokens(s, ids, 4, err, sizeof err), 2);
	assert_true(et_wait_turn(s, 2, NULL, 0, 0) < 0);
	assert_int_equal(atlas_session_status(s, &ss), 0);
	if (!strstr(ss.last_error, "rejoin"))
		fail_msg("a turn while the rank is gone: %s", ss.last_error);

	/* The worker comes back (a new process, or the stopped one goes on). */
	if (sig == SIGSTOP) {
		kill(w, SIGCONT);
	} else {
		int status;
		assert_int_equal(waitpid(w, &status, 0), w);
		w = start_worker(&c, 1);
	}
	atlas_session_close(s);
	struct run got;
	for (int tries = 0;; tries++) {
		assert_true(tries < 200);
		assert_int_equal(atlas_engine_stats(e, st), 0);
		if (st->ep.up)
			break;
		usleep(50000);
	}
	phase("the worker has rejoined", 2);
	run_all(e, &got);
	assert_same_run(&got, &reference, "after the worker came back");
	assert_true(st->ep.epochs_lost_total >= 1);
	free(st);
	free(got.logits);
	atlas_engine_close(e);
	wait_worker(w, 0);
}

static void test_killed(void **state) { fault(SIGKILL); }
static void test_stopped(void **state) { fault(SIGSTOP); }

/* A worker of another kv_block_size, or another cpu_precision (the ranks'
 * arithmetic), is refused; the head gives up on it after its join timeout
 * and says which rank is missing. */
static void mismatch(void (*spoil)(struct atlas_config *))
{
	struct atlas_config c, bad;
	struct atlas_engine *e;
	char err[ATLAS_ERRLEN];
	config(&c, 2, free_port());
	bad = c;
	spoil(&bad);
	pid_t w = start_worker(&bad, 1);
	assert_true(atlas_engine_open(&c, &e, err, sizeof err) < 0);
	if (!strstr(err, "ranks 1 did not join"))
		fail_msg("the head's error: %s", err);
	wait_worker(w, 1);
}

static void double_block_size(struct atlas_config *c) { c->kv_block_size *= 2; }
static void other_precision(struct atlas_config *c)
{
	snprintf(c->cpu_precision, sizeof c->cpu_precision, "%s",
		 strcmp(c->cpu_precision, "bf16") ? "bf16" : "f32");
}
static void test_mismatch(void **state) { mismatch(double_block_size); }
static void test_mismatch_precision(void **state) { mismatch(other_precision); }

int main(int argc, char **argv)
{
	if (argc != 2 && argc != 3) {
		fprintf(stderr, "usage: test_ep ATLASD [SHAPE]\n");
		return 1;
	}
	atlasd = argv[1];
	if (argc == 3)
		shape = argv[2];
	const char *backend = getenv("ATLAS_TEST_BACKEND"), *n_gpus = getenv("ATLAS_TEST_GPUS");
	on_cuda = backend && !strcmp(backend, "cuda");
	if (n_gpus && atoi(n_gpus) > 0)
		gpus = atoi(n_gpus);
	alarm(600);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reference),
		cmocka_unit_test(test_ep2),
		cmocka_unit_test(test_ep3),
		cmocka_unit_test(test_ep4),
		cmocka_unit_test(test_ep2_spec),
		cmocka_unit_test(test_killed),
		cmocka_unit_test(test_stopped),
		cmocka_unit_test(test_mismatch),
		cmocka_unit_test(test_mismatch_precision),
	};
	/* Another shape: the equality checks (the first five). */
	const size_t n = argc == 3 ? 5 : sizeof tests / sizeof tests[0];
	return _cmocka_run_group_tests("test_ep", tests, n, NULL, NULL);
}
