/* test_comm: the socket communicator of expert parallelism
 * (kernels/comm_socket.h) through the cpu backend's comm_open and
 * allreduce, with three ranks as forked processes joined by socketpair()s
 * (rank 0 holds one to each other rank), each with a cpu backend of its
 * own.
 *
 * Scenarios, each with fresh processes and sockets:
 *  - sums: refusals before and at comm_open (NCCL is -ENOTSUP, a bad spec
 *    -EINVAL, a second open -EINVAL, allreduce before open or of i32
 *    -EINVAL); sums of random tensors (one float, odd shapes, 1.2 MB that
 *    moves in many partial reads and writes) bitwise equal to
 *    ((x0 + x1) + x2) in f32 on every rank; rows that one rank holds and
 *    the others hold as zeros come out as the owner's bits; be->comm counts
 *    every call, its bytes and its time.
 *  - a rank that exits: the others fail their next call with -EPIPE within
 *    timeout_ms + slack (rank 0 reads the closed socket, then shuts its
 *    own down, which rank 1 sees);
 *  - a rank that sleeps, and one stopped with SIGSTOP (continued once the
 *    others are done): rank 0 fails with -ETIMEDOUT after timeout_ms and
 *    within the slack, rank 1 with -EPIPE or -ETIMEDOUT (its own wait may
 *    end first), and the silent rank, when it calls at last, fails too;
 *  - a rank that reduces another size, and one that writes bytes that are
 *    no message at all instead of its first call: rank 0 fails with
 *    -EPROTO, the others with -EPIPE.
 * After a failure every later call fails at once with the same errno, and
 * be->comm.broken names it.
 *
 * Every process ends by itself: each child has an alarm() guard and dies
 * with its parent (PR_SET_PDEATHSIG), and the parent has a guard of its
 * own. A child reports a failed check on stderr and in its exit status.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "kernels/backend.h"

#define RANKS 3
#define TIMEOUT_MS 300
#define SLACK_MS 700   /* scheduling and process start on a loaded machine */
#define AT_ONCE_MS 50  /* "fails at once" */
#define GUARD_S 10     /* a child that runs longer is killed by its alarm */

enum silent { NONE, EXITS, SLEEPS, STOPS, RESIZES, GARBAGE };

struct scenario {
	const char *name;
	enum silent how; /* what rank 2 does after the first call */
};

static const char *scenario_name;
static int rank_self = -1, failures;

__attribute__((format(printf, 2, 3)))
static void check(bool ok, const char *fmt, ...)
{
	va_list ap;

	if (ok)
		return;
	failures++;
	fprintf(stderr, "test_comm: %s: rank %d: FAIL: ", scenario_name, rank_self);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n");
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* splitmix64 */
static uint64_t next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* Rank r's x of call `call` (n floats): random signs and magnitudes from
 * 1e-3 to 1e3, so that the order of the sum shows in its bits. */
static void rank_values(int call, int r, float *x, size_t n)
{
	uint64_t s = (uint64_t)call * 1000003u + (uint64_t)r * 7919u + 1;

	for (size_t i = 0; i < n; i++) {
		double u = (double)(next(&s) >> 11) * 0x1p-53;

		x[i] = (float)((next(&s) & 1 ? 1.0 : -1.0) * pow(10.0, 6.0 * u - 3.0));
	}
}

static float *alloc_floats(size_t n)
{
	float *p = calloc(n ? n : 1, sizeof(float));

	if (!p) {
		fprintf(stderr, "test_comm: out of memory\n");
		exit(1);
	}
	return p;
}

/* One allreduce of rows × cols whose values on rank r are x_r; the time it
 * took into *ms. x holds this rank's values before and the result after. */
static int reduce(struct kt_backend *be, float *x, int64_t rows, int64_t cols, int64_t *ms)
{
	struct kt_tensor t;
	const size_t bytes = (size_t)rows * (size_t)cols * sizeof(float);
	int64_t t0;
	int rc = kt_alloc(be, KT_F32, rows, cols, &t);

	check(!rc, "kt_alloc %lldx%lld: %d", (long long)rows, (long long)cols, rc);
	if (rc)
		return rc;
	check(!kt_upload(be, &t, 0, x, bytes), "kt_upload");
	t0 = now_ms();
	rc = kt_allreduce(be, &t);
	if (ms)
		*ms = now_ms() - t0;
	check(!kt_download(be, x, &t, 0, bytes), "kt_download");
	kt_free(be, &t);
	return rc;
}

/* Call `call` with random values: the sum must be ((x0 + x1) + x2) bit
 * for bit. */
static void random_sum(struct kt_backend *be, int call, int64_t rows, int64_t cols)
{
	const size_t n = (size_t)rows * (size_t)cols;
	float *x = alloc_floats(n), *want = alloc_floats(n), *other = alloc_floats(n);
	size_t bad = 0;
	int rc;

	rank_values(call, rank_self, x, n);
	rank_values(call, 0, want, n);
	for (int r = 1; r < RANKS; r++) {
		rank_values(call, r, other, n);
		for (size_t i = 0; i < n; i++)
			want[i] += other[i];
	}
	rc = reduce(be, x, rows, cols, NULL);
	check(rc == 0, "call %d (%lldx%lld): allreduce returned %d", call, (long long)rows,
	      (long long)cols, rc);
	for (size_t i = 0; i < n; i++)
		bad += memcmp(&x[i], &want[i], sizeof(float)) != 0;
	check(!bad, "call %d (%lldx%lld): %zu of %zu sums differ from ((x0 + x1) + x2)", call,
	      (long long)rows, (long long)cols, bad, n);
	free(x);
	free(want);
	free(other);
}

/* Rows of 64 floats, row i held by rank i % RANKS and zero elsewhere: the
 * result is each owner's values, bitwise. */
static void disjoint_rows(struct kt_backend *be, int call)
{
	enum { ROWS = 7, COLS = 64 };
	float *x = alloc_floats(ROWS * COLS), *owner = alloc_floats(ROWS * COLS);
	size_t bad = 0;
	int rc;

	for (int r = 0; r < RANKS; r++) {
		float *v = r == rank_self ? x : alloc_floats(ROWS * COLS);

		rank_values(call, r, v, ROWS * COLS);
		for (int i = 0; i < ROWS; i++) {
			if (i % RANKS == r)
				memcpy(owner + i * COLS, v + i * COLS, COLS * sizeof(float));
			if (i % RANKS != r && r == rank_self)
				memset(v + i * COLS, 0, COLS * sizeof(float));
		}
		if (v != x)
			free(v);
	}
	rc = reduce(be, x, ROWS, COLS, NULL);
	check(rc == 0, "disjoint rows: allreduce returned %d", rc);
	for (int i = 0; i < ROWS * COLS; i++)
		bad += memcmp(&x[i], &owner[i], sizeof(float)) != 0;
	check(!bad, "disjoint rows: %zu of %d values differ from their owner's", bad, ROWS * COLS);
	free(x);
	free(owner);
}

/* What may be asked before and at comm_open; spec is the good one. */
static void open_refusals(struct kt_backend *be, const struct kt_comm_spec *spec)
{
	struct kt_comm_spec bad = *spec;
	struct kt_tensor t;
	char err[ATLAS_ERRLEN] = "";
	int rc;

	check(be->comm.rank == 0 && be->comm.n_ranks == 0 && be->comm.calls == 0,
	      "be->comm before comm_open: rank %d of %d, %llu calls", be->comm.rank,
	      be->comm.n_ranks, (unsigned long long)be->comm.calls);
	check(!kt_alloc(be, KT_F32, 1, 4, &t), "kt_alloc");
	rc = kt_allreduce(be, &t);
	check(rc == -EINVAL, "allreduce before comm_open returned %d, want -EINVAL", rc);
	kt_free(be, &t);
	bad.kind = KT_COMM_NCCL;
	rc = kt_comm_open(be, &bad, err, sizeof err);
	check(rc == -ENOTSUP && strstr(err, "the cpu backend's communicator is sockets"),
	      "comm_open of NCCL returned %d (%s), want -ENOTSUP and a message", rc, err);
	bad = *spec;
	bad.rank = RANKS;
	rc = kt_comm_open(be, &bad, err, sizeof err);
	check(rc == -EINVAL, "comm_open of rank %d of %d returned %d, want -EINVAL", RANKS, RANKS,
	      rc);
	bad = *spec;
	bad.timeout_ms = 0;
	rc = kt_comm_open(be, &bad, err, sizeof err);
	check(rc == -EINVAL, "comm_open with timeout_ms 0 returned %d, want -EINVAL", rc);
	bad = *spec;
	bad.fds[rank_self ? 0 : 1] = open("/dev/null", O_RDWR);
	rc = kt_comm_open(be, &bad, err, sizeof err);
	check(rc == -EINVAL, "comm_open with /dev/null for a socket returned %d, want -EINVAL",
	      rc);
	close(bad.fds[rank_self ? 0 : 1]);
}

/* The refusals after comm_open, which count nothing. */
static void call_refusals(struct kt_backend *be, const struct kt_comm_spec *spec)
{
	char err[ATLAS_ERRLEN] = "";
	struct kt_tensor t;
	struct kt_comm_spec nccl = *spec;
	nccl.kind = KT_COMM_NCCL;
	int rc = kt_comm_open(be, &nccl, err, sizeof err);

	check(rc == -ENOTSUP, "a second comm_open of kind nccl returned %d, want -ENOTSUP", rc);
	check(!kt_alloc(be, KT_I32, 2, 2, &t), "kt_alloc");
	rc = kt_allreduce(be, &t);
	check(rc == -EINVAL, "allreduce of i32 returned %d, want -EINVAL", rc);
	kt_free(be, &t);
	check(be->comm.calls == 0, "refused calls counted (%llu)",
	      (unsigned long long)be->comm.calls);
}

static void healthy(struct kt_backend *be, const struct kt_comm_spec *spec)
{
	static const int64_t shapes[][2] = { { 1, 1 }, { 7, 33 }, { 300, 1024 }, { 1, 5 } };
	uint64_t bytes = 0;
	int call = 0;

	call_refusals(be, spec);
	for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++, call++) {
		random_sum(be, call, shapes[i][0], shapes[i][1]);
		bytes += (uint64_t)shapes[i][0] * (uint64_t)shapes[i][1] * sizeof(float);
	}
	disjoint_rows(be, call++);
	bytes += 7 * 64 * sizeof(float);
	check(be->comm.rank == rank_self && be->comm.n_ranks == RANKS,
	      "be->comm says rank %d of %d", be->comm.rank, be->comm.n_ranks);
	check(be->comm.calls == (uint64_t)call, "be->comm.calls %llu, want %d",
	      (unsigned long long)be->comm.calls, call);
	check(be->comm.bytes == bytes, "be->comm.bytes %llu, want %llu",
	      (unsigned long long)be->comm.bytes, (unsigned long long)bytes);
	check(be->comm.ns > 0 && be->comm.broken == 0, "be->comm.ns %llu, broken %d",
	      (unsigned long long)be->comm.ns, be->comm.broken);
}

/* A call that must fail as how says, then one that must fail at once the
 * same way. */
static void failing_call(struct kt_backend *be, enum silent how)
{
	float x[64];
	int64_t ms;
	int rc, again;
	uint64_t calls;

	rank_values(1, rank_self, x, 64);
	rc = reduce(be, x, 4, 16, &ms);
	if (rank_self == 0 && how == EXITS)
		check(rc == -EPIPE, "allreduce with rank 2 gone returned %d, want -EPIPE", rc);
	else if (rank_self == 0 && (how == RESIZES || how == GARBAGE))
		check(rc == -EPROTO, "allreduce with rank 2 out of step returned %d, want -EPROTO",
		      rc);
	else if (rank_self == 0)
		check(rc == -ETIMEDOUT, "allreduce with rank 2 silent returned %d, want -ETIMEDOUT",
		      rc);
	else if (how == SLEEPS || how == STOPS)
		check(rc == -EPIPE || rc == -ETIMEDOUT,
		      "allreduce with rank 2 silent returned %d, want -EPIPE or -ETIMEDOUT", rc);
	else
		check(rc == -EPIPE, "allreduce with rank 2 at fault returned %d, want -EPIPE (rank "
		      "0 hung up)", rc);
	check(ms <= TIMEOUT_MS + SLACK_MS, "the failure took %lld ms (bound %d)", (long long)ms,
	      TIMEOUT_MS + SLACK_MS);
	if (rank_self == 0 && (how == SLEEPS || how == STOPS))
		check(ms >= TIMEOUT_MS - 5, "rank 0 timed out after %lld ms, before timeout_ms %d",
		      (long long)ms, TIMEOUT_MS);
	check(be->comm.broken == -rc, "be->comm.broken %d after %d", be->comm.broken, rc);
	calls = be->comm.calls;
	again = reduce(be, x, 4, 16, &ms);
	check(again == rc && ms <= AT_ONCE_MS,
	      "the next call returned %d after %lld ms, want %d at once", again, (long long)ms, rc);
	check(be->comm.calls == calls, "a call refused at once was counted");
}

/* Rank 2's part after the first call. */
static void silent_rank(struct kt_backend *be, enum silent how)
{
	float x[64];
	int rc;

	switch (how) {
	case EXITS:
		kt_backend_close(be);
		_exit(failures ? 1 : 0);
	case SLEEPS:
		usleep(3 * TIMEOUT_MS * 1000);
		break;
	case STOPS:
		raise(SIGSTOP);
		break;
	case RESIZES:
		rank_values(1, rank_self, x, 64);
		rc = reduce(be, x, 4, 15, NULL);
		check(rc == -EPIPE, "allreduce of another size returned %d, want -EPIPE", rc);
		return;
	case NONE:
	case GARBAGE:
		return;
	}
	rank_values(1, rank_self, x, 64);
	rc = reduce(be, x, 4, 16, NULL);
	check(rc == -EPIPE || rc == -ETIMEDOUT,
	      "the silent rank's late call returned %d, want -EPIPE or -ETIMEDOUT", rc);
}

/* Rank 2 of GARBAGE: bytes that are no header on its socket, then wait
 * for rank 0 to hang up. */
static void garbage_rank(int fd)
{
	char buf[64];

	memset(buf, 0xab, sizeof buf);
	check(write(fd, buf, sizeof buf) == (ssize_t)sizeof buf, "write: %s", strerror(errno));
	while (read(fd, buf, sizeof buf) > 0)
		continue;
	close(fd);
	_exit(failures ? 1 : 0);
}

static void rank_main(int rank, const struct kt_comm_spec *spec, enum silent how)
{
	const struct kt_config c = { .backend = "cpu", .threads = 1, .max_tokens = 16,
				     .max_seqs = 1, .max_context = 16, .max_heads = 1,
				     .max_head_dim = 8 };
	char err[ATLAS_ERRLEN] = "";
	struct kt_backend *be;
	int rc = kt_backend_open(&c, &be, err, sizeof err);

	rank_self = rank;
	if (rank == 2 && how == GARBAGE)
		garbage_rank(spec->fds[0]);
	check(!rc, "kt_backend_open: %s (%d)", err, rc);
	if (rc)
		_exit(1);
	if (how == NONE)
		open_refusals(be, spec);
	rc = kt_comm_open(be, spec, err, sizeof err);
	check(!rc, "comm_open: %s (%d)", err, rc);
	if (!rc && how == NONE)
		healthy(be, spec);
	if (!rc && how != NONE) {
		if (how != GARBAGE)
			random_sum(be, 0, 3, 5);
		if (rank == 2)
			silent_rank(be, how);
		else
			failing_call(be, how);
		/* A head that stays up: its peers learn of the failure from
		 * its sockets' shutdown, not from its exit. */
		if (rank == 0 && how != SLEEPS && how != STOPS)
			usleep(2 * TIMEOUT_MS * 1000);
	}
	kt_backend_close(be);
	_exit(failures ? 1 : 0);
}

/* Run one scenario; false when a rank failed or did not end well. */
static bool run(const struct scenario *s)
{
	int sv[RANKS][2];
	pid_t pid[RANKS];
	bool ok = true;

	scenario_name = s->name;
	for (int r = 1; r < RANKS; r++)
		if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv[r])) {
			perror("test_comm: socketpair");
			exit(1);
		}
	for (int r = 0; r < RANKS; r++) {
		pid[r] = fork();
		if (pid[r] < 0) {
			perror("test_comm: fork");
			exit(1);
		}
		if (pid[r] == 0) {
			struct kt_comm_spec spec = { .kind = KT_COMM_SOCKET, .rank = r,
						     .n_ranks = RANKS, .timeout_ms = TIMEOUT_MS };

			prctl(PR_SET_PDEATHSIG, SIGKILL);
			alarm(GUARD_S);
			for (int q = 1; q < RANKS; q++) {
				if (r == 0)
					spec.fds[q] = sv[q][0];
				else if (q == r)
					spec.fds[0] = sv[q][1];
				if (r == 0 || q == r) {
					close(sv[q][r == 0 ? 1 : 0]);
				} else {
					close(sv[q][0]);
					close(sv[q][1]);
				}
			}
			rank_main(r, &spec, s->how);
		}
	}
	for (int r = 1; r < RANKS; r++) {
		close(sv[r][0]);
		close(sv[r][1]);
	}
	for (int r = 0; r < RANKS; r++) {
		int st = 0;

		if (r == 2 && s->how == STOPS) {
			if (waitpid(pid[2], &st, WUNTRACED) != pid[2] || !WIFSTOPPED(st)) {
				fprintf(stderr, "test_comm: %s: rank 2 did not stop (status 0x%x)\n",
					s->name, st);
				ok = false;
			}
			continue;
		}
		if (waitpid(pid[r], &st, 0) != pid[r] || !WIFEXITED(st) || WEXITSTATUS(st)) {
			fprintf(stderr, "test_comm: %s: rank %d ended with status 0x%x\n", s->name,
				r, st);
			ok = false;
		}
	}
	if (s->how == STOPS) {
		int st = 0;

		kill(pid[2], SIGCONT);
		if (waitpid(pid[2], &st, 0) != pid[2] || !WIFEXITED(st) || WEXITSTATUS(st)) {
			fprintf(stderr, "test_comm: %s: rank 2 ended with status 0x%x\n", s->name,
				st);
			ok = false;
		}
	}
	printf("  %-50s %s\n", s->name, ok ? "OK" : "FAIL");
	return ok;
}

int main(void)
{
	static const struct scenario scenarios[] = {
		{ "3 ranks: refusals, exact sums, disjoint rows, stats", NONE },
		{ "rank 2 exits", EXITS },
		{ "rank 2 sleeps past timeout_ms", SLEEPS },
		{ "rank 2 stopped (SIGSTOP) past timeout_ms", STOPS },
		{ "rank 2 reduces another size", RESIZES },
		{ "rank 2 writes bytes that are no message", GARBAGE },
	};
	int failed = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	alarm(5 * GUARD_S);
	printf("test_comm: %d ranks, timeout_ms %d\n", RANKS, TIMEOUT_MS);
	for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++)
		failed += !run(&scenarios[i]);
	printf("%zu scenarios: %d failed\n", sizeof scenarios / sizeof scenarios[0], failed);
	return failed ? 1 : 0;
}
