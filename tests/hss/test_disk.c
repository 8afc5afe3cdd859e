/* The disk tier's I/O layer (engine/hss/disk.h) on real filesystems: round
 * trips of hundreds of blocks with more operations than the queue holds (so
 * -EAGAIN and its retry run), with O_DIRECT (the build tree's filesystem or
 * /var/tmp), on tmpfs, and buffered where O_DIRECT is refused (ramfs when
 * this kernel's tmpfs takes O_DIRECT); fixed buffers refused under a small
 * RLIMIT_MEMLOCK; a full filesystem (a 264 KiB tmpfs): the writes that find
 * it full fail with -ENOSPC and nothing else does, the one that fills it
 * first writes part of its block and then fails; a read past the end of
 * the file fails with -EIO; a named file reopened by a second tier, its
 * slot claimed with the first tier's hash, and a changed byte caught by the
 * checksum (-EBADMSG); the refusals of bad arguments; close with
 * operations in flight. Every byte read back is checked; every wait has a
 * deadline. Cases that need a mount or a filesystem this machine lacks are
 * skipped with a message.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/clock.h"
#include "common/err.h"
#include "engine/hss/disk.h"

#ifndef TMPFS_MAGIC
#define TMPFS_MAGIC 0x01021994
#endif

#define WAIT_NS (10ull * 1000000000ull) /* the longest any wait may take */
#define MAX_TAGS 2048

/* One case's tier, its directory and host region, and what came back. */
struct fx {
	char dir[PATH_MAX];        /* a temporary directory, removed at teardown */
	bool mounted;              /* dir is a mount of this case's */
	uint8_t *host;             /* host_bytes, 4096-aligned; owned */
	size_t host_bytes;
	struct disk_tier *d;
	pthread_mutex_t lock;      /* wakes */
	pthread_cond_t cond;
	unsigned wakes;            /* wake_fn calls */
	int n_done;                /* callbacks */
	int result[MAX_TAGS];      /* by tag */
	int seen[MAX_TAGS];        /* callbacks by tag */
	int eagain;                /* submits refused with -EAGAIN */
};

static void on_wake(void *ctx)
{
	struct fx *f = ctx;
	pthread_mutex_lock(&f->lock);
	f->wakes++;
	pthread_cond_broadcast(&f->cond);
	pthread_mutex_unlock(&f->lock);
}

static void on_done(void *ctx, uint64_t tag, int result)
{
	struct fx *f = ctx;
	assert_true(tag < MAX_TAGS);
	f->result[tag] = result;
	f->seen[tag]++;
	f->n_done++;
}

static int setup(void **state)
{
	struct fx *f = calloc(1, sizeof *f);
	if (!f)
		return -1;
	pthread_mutex_init(&f->lock, NULL);
	pthread_cond_init(&f->cond, NULL);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;
	disk_tier_close(f->d);
	if (f->mounted && umount2(f->dir, MNT_DETACH))
		fprintf(stderr, "umount %s: %s\n", f->dir, strerror(errno));
	if (f->dir[0] && rmdir(f->dir))
		fprintf(stderr, "rmdir %s: %s\n", f->dir, strerror(errno));
	free(f->host);
	pthread_mutex_destroy(&f->lock);
	pthread_cond_destroy(&f->cond);
	free(f);
	return 0;
}

/* A fresh temporary directory under parent, into f->dir. */
static bool make_dir(struct fx *f, const char *parent)
{
	snprintf(f->dir, sizeof f->dir, "%s/hss-test-XXXXXX", parent);
	if (mkdtemp(f->dir))
		return true;
	f->dir[0] = '\0';
	return false;
}

static void remove_dir(struct fx *f)
{
	assert_int_equal(rmdir(f->dir), 0);
	f->dir[0] = '\0';
}

/* Mount a filesystem of type on a new directory under /tmp; false (and no
 * directory) when this process may not mount. */
static bool mount_dir(struct fx *f, const char *type, const char *opts)
{
	assert_true(make_dir(f, "/tmp"));
	if (mount(type, f->dir, type, 0, opts) == 0) {
		f->mounted = true;
		return true;
	}
	printf("skip: cannot mount %s on %s: %s\n", type, f->dir, strerror(errno));
	remove_dir(f);
	return false;
}

static void alloc_host(struct fx *f, size_t bytes)
{
	f->host_bytes = bytes;
	f->host = aligned_alloc(4096, bytes);
	assert_non_null(f->host);
	memset(f->host, 0, bytes);
}

static int open_tier(struct fx *f, size_t block_bytes, uint32_t max_blocks)
{
	char err[ATLAS_ERRLEN];
	int rc = disk_tier_open(f->dir, NULL, block_bytes, max_blocks, f->host, f->host_bytes, on_wake, f,
				&f->d, err, sizeof err);
	if (rc)
		printf("disk_tier_open: %s\n", err);
	return rc;
}

static void close_tier(struct fx *f)
{
	disk_tier_close(f->d);
	f->d = NULL;
}

static struct disk_stats stats(struct fx *f)
{
	struct disk_stats s;
	disk_stats(f->d, &s);
	return s;
}

/* Poll until want callbacks have come in all, sleeping on wake_fn between
 * polls; false after WAIT_NS. */
static bool wait_done(struct fx *f, int want)
{
	uint64_t deadline = atlas_now_ns() + WAIT_NS;
	for (;;) {
		pthread_mutex_lock(&f->lock);
		unsigned seen = f->wakes;
		pthread_mutex_unlock(&f->lock);
		disk_poll(f->d, on_done, f);
		if (f->n_done >= want)
			return true;
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 100000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_mutex_lock(&f->lock);
		if (f->wakes == seen)
			pthread_cond_timedwait(&f->cond, &f->lock, &ts);
		pthread_mutex_unlock(&f->lock);
		if (atlas_now_ns() > deadline) {
			printf("%d of %d operations done after %llu s\n", f->n_done, want,
			       WAIT_NS / 1000000000ull);
			return false;
		}
	}
}

/* Submit, and on -EAGAIN wait for a completion and try again. */
static void submit(struct fx *f, bool write, int slot, uint8_t *p, uint64_t tag)
{
	f->result[tag] = 1; /* neither 0 nor an errno: not done */
	for (;;) {
		int rc = write ? disk_submit_write(f->d, slot, p, tag)
			       : disk_submit_read(f->d, slot, p, tag);
		if (rc != -EAGAIN) {
			assert_int_equal(rc, 0);
			return;
		}
		f->eagain++;
		assert_true(wait_done(f, f->n_done + 1));
	}
}

/* A pattern of its own for every seed (xorshift64). */
static void fill(uint8_t *p, size_t len, uint64_t seed)
{
	uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
	for (size_t i = 0; i < len; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		p[i] = (uint8_t)x;
	}
}

static void check(const uint8_t *p, size_t len, uint64_t seed)
{
	static uint8_t want[1 << 20];
	assert_true(len <= sizeof want);
	fill(want, len, seed);
	assert_memory_equal(p, want, len);
}

#define RT_BLOCKS 300
#define RT_BLOCK_BYTES (3 * 4096 + 100) /* not a multiple of the alignment */

/* In f->dir: write RT_BLOCKS blocks with patterns of their own, read them all
 * back into other host memory, then free a third of the slots, take them
 * again, write them anew and read everything back once more. More
 * operations are submitted than the queue holds, so -EAGAIN comes back. */
static void round_trip(struct fx *f)
{
	size_t slot = disk_slot_bytes(f->d);
	assert_int_equal(slot % disk_align(f->d), 0);
	assert_true(slot >= RT_BLOCK_BYTES);
	if (2 * RT_BLOCKS * slot > f->host_bytes)
		fail_msg("slots of %zu bytes: the host region is too small", slot);
	uint8_t *src = f->host, *dst = f->host + RT_BLOCKS * slot;
	int slots[RT_BLOCKS];
	for (int i = 0; i < RT_BLOCKS; i++) {
		slots[i] = disk_slot_alloc(f->d);
		assert_int_equal(slots[i], i); /* the lowest never used first */
		fill(src + i * slot, slot, (uint64_t)i + 1);
	}
	int base = f->n_done;
	for (int i = 0; i < RT_BLOCKS; i++)
		submit(f, true, slots[i], src + i * slot, (uint64_t)i);
	assert_true(wait_done(f, base + RT_BLOCKS));
	for (int i = 0; i < RT_BLOCKS; i++)
		assert_int_equal(f->result[i], 0);
	assert_true(f->eagain > 0);

	for (int i = 0; i < RT_BLOCKS; i++)
		submit(f, false, slots[i], dst + i * slot, (uint64_t)(RT_BLOCKS + i));
	assert_true(wait_done(f, base + 2 * RT_BLOCKS));
	for (int i = 0; i < RT_BLOCKS; i++) {
		assert_int_equal(f->result[RT_BLOCKS + i], 0);
		check(dst + i * slot, slot, (uint64_t)i + 1);
	}

	/* Slots come back, the most recently freed first. */
	for (int i = 100; i < 200; i++)
		assert_int_equal(disk_slot_free(f->d, slots[i]), 0);
	assert_int_equal(stats(f).slots_used, RT_BLOCKS - 100);
	for (int i = 199; i >= 100; i--)
		assert_int_equal(disk_slot_alloc(f->d), slots[i]);
	for (int i = 100; i < 200; i++) {
		fill(src + i * slot, slot, 1000 + (uint64_t)i);
		submit(f, true, slots[i], src + i * slot, (uint64_t)(2 * RT_BLOCKS + i));
	}
	assert_true(wait_done(f, base + 2 * RT_BLOCKS + 100));
	memset(dst, 0, RT_BLOCKS * slot);
	for (int i = 0; i < RT_BLOCKS; i++)
		submit(f, false, slots[i], dst + i * slot, (uint64_t)(3 * RT_BLOCKS + i));
	assert_true(wait_done(f, base + 3 * RT_BLOCKS + 100));
	for (int i = 0; i < RT_BLOCKS; i++) {
		assert_int_equal(f->result[3 * RT_BLOCKS + i], 0);
		check(dst + i * slot, slot, (i >= 100 && i < 200 ? 1000 : 1) + (uint64_t)i);
	}
	/* One callback for each operation: the rewrites used tags 700-799 only. */
	for (int t = 0; t < 4 * RT_BLOCKS; t++) {
		bool unused = (t >= 2 * RT_BLOCKS && t < 2 * RT_BLOCKS + 100) ||
			      (t >= 2 * RT_BLOCKS + 200 && t < 3 * RT_BLOCKS);
		assert_int_equal(f->seen[t], unused ? 0 : 1);
	}

	/* The counters add up; the latency percentiles are ordered. */
	struct disk_stats s = stats(f);
	assert_int_equal(s.writes, RT_BLOCKS + 100);
	assert_int_equal(s.reads, 2 * RT_BLOCKS);
	assert_int_equal(s.bytes_written, (RT_BLOCKS + 100) * slot);
	assert_int_equal(s.bytes_read, 2 * RT_BLOCKS * slot);
	assert_int_equal(s.errors, 0);
	assert_int_equal(s.last_error, 0);
	assert_int_equal(s.slots_used, RT_BLOCKS);
	assert_int_equal(s.in_flight, 0);
	assert_true(s.read_p50_ns > 0);
	assert_true(s.read_p50_ns <= s.read_p99_ns);
	assert_true(s.read_p99_ns <= s.read_max_ns);
	assert_true(s.read_max_ns < WAIT_NS);
	pthread_mutex_lock(&f->lock);
	assert_true(f->wakes > 0);
	pthread_mutex_unlock(&f->lock);
	printf("%s: %s, %s buffers, slot %zu bytes: %d submits refused with EAGAIN; "
	       "read latency p50 %.1f us, p99 %.1f us, max %.1f us\n",
	       f->dir, s.direct ? "O_DIRECT" : "buffered", s.fixed_buffers ? "fixed" : "plain",
	       slot, f->eagain, s.read_p50_ns / 1e3, s.read_p99_ns / 1e3, s.read_max_ns / 1e3);
}

/* A host region for round_trip with 4096-byte alignment. */
static void open_round_trip_tier(struct fx *f)
{
	alloc_host(f, 2 * RT_BLOCKS * 16384);
	assert_int_equal(open_tier(f, RT_BLOCK_BYTES, RT_BLOCKS + 10), 0);
	/* root has CAP_IPC_LOCK: no RLIMIT_MEMLOCK stands in the way. */
	if (geteuid() == 0)
		assert_true(stats(f).fixed_buffers);
}

/* A directory whose filesystem takes O_DIRECT: the build tree's, or
 * /var/tmp's. */
static void test_round_trip_direct(void **state)
{
	struct fx *f = *state;
	const char *parents[] = { getenv("ATLAS_BUILD_ROOT"), "/var/tmp" };
	for (size_t i = 0; i < ATLAS_ARRAY_LEN(parents); i++) {
		if (!parents[i] || !make_dir(f, parents[i]))
			continue;
		open_round_trip_tier(f);
		if (stats(f).direct) {
			round_trip(f);
			return;
		}
		close_tier(f);
		free(f->host);
		f->host = NULL;
		remove_dir(f);
	}
	printf("skip: no filesystem here takes O_DIRECT\n");
	skip();
}

static bool is_tmpfs(const char *path)
{
	struct statfs sf;
	return statfs(path, &sf) == 0 && sf.f_type == TMPFS_MAGIC;
}

/* tmpfs: /dev/shm, or a mount of our own. Linux 6.6 and later take O_DIRECT
 * there; before, this is the buffered fallback. */
static bool tmpfs_dir(struct fx *f)
{
	if (is_tmpfs("/dev/shm") && make_dir(f, "/dev/shm"))
		return true;
	return mount_dir(f, "tmpfs", "size=64m");
}

static void test_round_trip_tmpfs(void **state)
{
	struct fx *f = *state;
	if (!tmpfs_dir(f))
		skip();
	open_round_trip_tier(f);
	round_trip(f);
}

/* A filesystem that refuses O_DIRECT: tmpfs before Linux 6.6, else ramfs. */
static void test_round_trip_buffered(void **state)
{
	struct fx *f = *state;
	if (!tmpfs_dir(f))
		skip();
	open_round_trip_tier(f);
	if (stats(f).direct) {
		close_tier(f);
		free(f->host);
		f->host = NULL;
		if (f->mounted)
			assert_int_equal(umount2(f->dir, 0), 0);
		f->mounted = false;
		remove_dir(f);
		if (!mount_dir(f, "ramfs", NULL))
			skip();
		open_round_trip_tier(f);
	}
	assert_false(stats(f).direct);
	round_trip(f);
}

/* Fixed-buffer registration refused: a child process under a 64 KiB
 * RLIMIT_MEMLOCK and, when root, as nobody (root's CAP_IPC_LOCK ignores the
 * limit) runs a small round trip with plain reads and writes. Its checks
 * are exit codes: cmocka's asserts belong to the parent. */
static int fallback_child(struct fx *f)
{
	struct rlimit rl = { .rlim_cur = 64 << 10, .rlim_max = 64 << 10 };
	if (setrlimit(RLIMIT_MEMLOCK, &rl))
		return 10;
	if (geteuid() == 0 && (setgid(65534) || setuid(65534)))
		return 11;
	if (open_tier(f, 8192, 32))
		return 12;
	if (stats(f).fixed_buffers)
		return 13;
	size_t slot = disk_slot_bytes(f->d);
	if (slot != 8192)
		return 20;
	for (int i = 0; i < 16; i++) {
		if (disk_slot_alloc(f->d) != i)
			return 14;
		fill(f->host + i * slot, slot, 77 + (uint64_t)i);
		if (disk_submit_write(f->d, i, f->host + i * slot, (uint64_t)i))
			return 15;
	}
	if (!wait_done(f, 16))
		return 19;
	for (int i = 0; i < 16; i++) {
		uint8_t *dst = f->host + (16 + i) * slot;
		if (f->result[i] || disk_submit_read(f->d, i, dst, 16 + (uint64_t)i))
			return 16;
	}
	if (!wait_done(f, 32))
		return 19;
	for (int i = 0; i < 16; i++) {
		uint8_t want[8192];
		fill(want, slot, 77 + (uint64_t)i);
		if (f->result[16 + i] || memcmp(f->host + (16 + i) * slot, want, slot))
			return 17;
	}
	struct disk_stats s = stats(f);
	close_tier(f);
	return s.reads == 16 && s.writes == 16 ? 0 : 18;
}

static void test_fixed_buffers_refused(void **state)
{
	struct fx *f = *state;
	if (!tmpfs_dir(f))
		skip();
	assert_int_equal(chmod(f->dir, 0777), 0);
	alloc_host(f, 1 << 20);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		_exit(fallback_child(f));
	int status = 0;
	uint64_t deadline = atlas_now_ns() + WAIT_NS;
	pid_t r;
	while ((r = waitpid(pid, &status, WNOHANG)) == 0 && atlas_now_ns() < deadline)
		usleep(10000);
	if (r == 0) {
		kill(pid, SIGKILL);
		waitpid(pid, &status, 0);
		fail_msg("the child took longer than %llu s", WAIT_NS / 1000000000ull);
	}
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
}

/* A full filesystem: 64 writes of 16 KiB into a 264 KiB tmpfs. Those that
 * find it full fail with -ENOSPC, the others succeed and read back; the
 * last 8 KiB go to a write that comes back short, whose rest then fails. The
 * tier stays usable: freed slots, overwrites of written slots, reads. */
static void test_enospc(void **state)
{
	struct fx *f = *state;
	if (!mount_dir(f, "tmpfs", "size=264k"))
		skip();
	enum { N = 64, BLOCK = 16384 };
	alloc_host(f, 2 * N * BLOCK);
	assert_int_equal(open_tier(f, BLOCK, N), 0);
	assert_int_equal(disk_slot_bytes(f->d), BLOCK);
	for (int i = 0; i < N; i++) {
		assert_int_equal(disk_slot_alloc(f->d), i);
		fill(f->host + i * BLOCK, BLOCK, 500 + (uint64_t)i);
		submit(f, true, i, f->host + i * BLOCK, (uint64_t)i);
	}
	assert_true(wait_done(f, N));
	int ok = 0, full = 0;
	for (int i = 0; i < N; i++) {
		if (f->result[i] == 0)
			ok++;
		else if (f->result[i] == -ENOSPC)
			full++;
		else
			fail_msg("write %d: %s", i, strerror(-f->result[i]));
	}
	printf("264 KiB tmpfs: %d writes of 16 KiB succeeded, %d failed with ENOSPC\n", ok, full);
	assert_true(ok >= 1 && ok <= 16);
	assert_int_equal(ok + full, N);
	struct disk_stats s = stats(f);
	assert_int_equal(s.errors, full);
	assert_int_equal(s.last_error, -ENOSPC);
	assert_int_equal(s.writes, ok);
	assert_true(s.resubmits >= 1);

	/* The failed slots go back; the written ones read back. */
	for (int i = 0; i < N; i++)
		if (f->result[i])
			assert_int_equal(disk_slot_free(f->d, i), 0);
	assert_int_equal(stats(f).slots_used, ok);
	uint8_t *dst = f->host + N * BLOCK;
	for (int i = 0; i < N; i++)
		if (!f->result[i])
			submit(f, false, i, dst + i * BLOCK, (uint64_t)(N + i));
	assert_true(wait_done(f, N + ok));
	int first = -1;
	for (int i = 0; i < N; i++) {
		if (f->result[i])
			continue;
		if (first < 0)
			first = i;
		assert_int_equal(f->result[N + i], 0);
		check(dst + i * BLOCK, BLOCK, 500 + (uint64_t)i);
	}

	/* A written slot takes new contents: its space is the file's already. */
	fill(f->host + first * BLOCK, BLOCK, 9999);
	submit(f, true, first, f->host + first * BLOCK, 2 * N);
	assert_true(wait_done(f, N + ok + 1));
	assert_int_equal(f->result[2 * N], 0);
	submit(f, false, first, dst, 2 * N + 1);
	assert_true(wait_done(f, N + ok + 2));
	assert_int_equal(f->result[2 * N + 1], 0);
	check(dst, BLOCK, 9999);
	close_tier(f);
}

/* Reads of slots never written: inside the file (a hole) they read zeros,
 * past its end they fail with -EIO. Where O_DIRECT is taken if possible. */
static void test_read_past_end(void **state)
{
	struct fx *f = *state;
	const char *parent = getenv("ATLAS_BUILD_ROOT");
	if (!make_dir(f, parent ? parent : "/var/tmp"))
		assert_true(make_dir(f, "/tmp"));
	alloc_host(f, 4 * 4096);
	assert_int_equal(open_tier(f, 4096, 8), 0);
	for (int i = 0; i < 3; i++)
		assert_int_equal(disk_slot_alloc(f->d), i);
	fill(f->host, 4096, 3);
	submit(f, true, 1, f->host, 0);
	assert_true(wait_done(f, 1));
	assert_int_equal(f->result[0], 0);
	memset(f->host + 4096, 0xAB, 2 * 4096);
	submit(f, false, 0, f->host + 4096, 1);
	submit(f, false, 2, f->host + 2 * 4096, 2);
	assert_true(wait_done(f, 3));
	assert_int_equal(f->result[1], 0);
	for (size_t i = 0; i < 4096; i++)
		assert_int_equal(f->host[4096 + i], 0);
	assert_int_equal(f->result[2], -EIO);
	struct disk_stats s = stats(f);
	assert_int_equal(s.errors, 1);
	assert_int_equal(s.last_error, -EIO);
	assert_int_equal(s.reads, 1);
	/* The tier goes on. */
	submit(f, false, 1, f->host + 3 * 4096, 3);
	assert_true(wait_done(f, 4));
	assert_int_equal(f->result[3], 0);
	check(f->host + 3 * 4096, 4096, 3);
}

static int open_named(struct fx *f, const char *file, size_t block_bytes, uint32_t max_blocks)
{
	char err[ATLAS_ERRLEN];
	int rc = disk_tier_open(f->dir, file, block_bytes, max_blocks, f->host, f->host_bytes,
				on_wake, f, &f->d, err, sizeof err);
	if (rc)
		printf("disk_tier_open: %s\n", err);
	return rc;
}

/* A named file outlives its tier: a second tier on it claims a slot with
 * the hash the first one computed and reads the data back; after a byte of
 * the file changed, the same read fails with -EBADMSG. */
static void test_named_file_and_checksums(void **state)
{
	struct fx *f = *state;
	const char *parent = getenv("ATLAS_BUILD_ROOT");
	if (!make_dir(f, parent ? parent : "/var/tmp"))
		assert_true(make_dir(f, "/tmp"));
	alloc_host(f, 4 * 4096);
	uint64_t sum;
	assert_int_equal(open_named(f, "blocks", 4096, 8), 0);
	assert_int_equal(disk_slot_alloc(f->d), 0);
	assert_int_equal(disk_slot_alloc(f->d), 1);
	assert_int_equal(disk_slot_sum(f->d, 1, &sum), -ENODATA);
	fill(f->host, 4096, 5);
	submit(f, true, 1, f->host, 0);
	assert_true(wait_done(f, 1));
	assert_int_equal(f->result[0], 0);
	assert_int_equal(disk_slot_sum(f->d, 1, &sum), 0);
	assert_int_equal(disk_tier_sync(f->d), 0);
	close_tier(f);

	for (int life = 0; life < 2; life++) {
		assert_int_equal(open_named(f, "blocks", 4096, 8), 0);
		assert_int_equal(disk_slot_claim(f->d, 8, sum), -ERANGE);
		assert_int_equal(disk_slot_claim(f->d, 1, sum), 0);
		assert_int_equal(disk_slot_claim(f->d, 1, sum), -EEXIST);
		assert_int_equal(stats(f).slots_used, 1);
		assert_int_equal(disk_slot_alloc(f->d), 0);     /* the lowest free one */
		assert_int_equal(disk_slot_alloc(f->d), 2);
		memset(f->host + 4096, 0, 4096);
		const int done = f->n_done;
		submit(f, false, 1, f->host + 4096, 1 + (uint64_t)life);
		assert_true(wait_done(f, done + 1));
		if (life == 0) {
			assert_int_equal(f->result[1], 0);
			check(f->host + 4096, 4096, 5);
		} else {
			assert_int_equal(f->result[2], -EBADMSG);
		}
		close_tier(f);
		/* Between the lives, one byte of slot 1 changes. */
		char path[PATH_MAX + 16];
		snprintf(path, sizeof path, "%s/blocks", f->dir);
		int fd = open(path, O_RDWR);
		assert_true(fd >= 0);
		uint8_t b = 0;
		assert_int_equal(pread(fd, &b, 1, 4096 + 77), 1);
		b ^= 1;
		assert_int_equal(pwrite(fd, &b, 1, 4096 + 77), 1);
		close(fd);
		if (life == 1)
			assert_int_equal(unlink(path), 0);
	}
}

/* What open and submit refuse, and the slot allocator's edges. */
static void test_refusals(void **state)
{
	struct fx *f = *state;
	assert_true(make_dir(f, "/tmp"));
	alloc_host(f, 4 * 4096 + 4096);
	char err[ATLAS_ERRLEN];
	struct disk_tier *d = NULL;
	assert_int_equal(disk_tier_open(f->dir, NULL, 0, 4, f->host, f->host_bytes, NULL, NULL, &d, err,
					sizeof err), -EINVAL);
	assert_int_equal(disk_tier_open(f->dir, NULL, 4096, 0, f->host, f->host_bytes, NULL, NULL, &d,
					err, sizeof err), -EINVAL);
	assert_int_equal(disk_tier_open(f->dir, NULL, 4096, 4, NULL, f->host_bytes, NULL, NULL, &d, err,
					sizeof err), -EINVAL);
	assert_int_equal(disk_tier_open(f->dir, NULL, 8192, 4, f->host, 4096, NULL, NULL, &d, err,
					sizeof err), -EINVAL);
	assert_non_null(strstr(err, "holds no slot"));
	assert_int_equal(disk_tier_open("/nonexistent/kv", NULL, 4096, 4, f->host, f->host_bytes, NULL,
					NULL, &d, err, sizeof err), -ENOENT);
	assert_non_null(strstr(err, "/nonexistent/kv"));
	assert_null(d);

	assert_int_equal(open_tier(f, 4096, 4), 0);
	for (int i = 0; i < 4; i++)
		assert_int_equal(disk_slot_alloc(f->d), i);
	assert_int_equal(disk_slot_alloc(f->d), -ENOSPC);
	assert_int_equal(disk_slot_free(f->d, 3), 0);
	assert_int_equal(disk_slot_free(f->d, 3), -EINVAL);
	assert_int_equal(disk_slot_free(f->d, 4), -EINVAL);
	assert_int_equal(disk_slot_free(f->d, -1), -EINVAL);

	uint8_t *h = f->host;
	assert_int_equal(disk_submit_write(f->d, 3, h, 0), -EINVAL);  /* a free slot */
	assert_int_equal(disk_submit_write(f->d, 4, h, 0), -EINVAL);  /* past max_blocks */
	assert_int_equal(disk_submit_read(f->d, -1, h, 0), -EINVAL);
	assert_int_equal(disk_submit_write(f->d, 0, h + 512, 0), -EINVAL);  /* misaligned */
	assert_int_equal(disk_submit_write(f->d, 0, h - 4096, 0), -EINVAL); /* before the region */
	/* The last whole slot in the region is fine, one past it is not. */
	assert_int_equal(disk_submit_write(f->d, 0, h + 4 * 4096, 0), 0);
	assert_int_equal(disk_submit_read(f->d, 0, h + 5 * 4096, 1), -EINVAL);
	assert_true(wait_done(f, 1));
	assert_int_equal(f->result[0], 0);
	struct disk_stats s = stats(f);
	assert_int_equal(s.errors, 0);
	assert_int_equal(s.slots_used, 3);
	assert_int_equal(s.slots_total, 4);
	assert_int_equal(s.slot_bytes, 4096);
}

/* Close while the queue is full: no hang, no leak (valgrind), no callback
 * after close. */
static void test_close_in_flight(void **state)
{
	struct fx *f = *state;
	if (!tmpfs_dir(f))
		skip();
	enum { N = 64, BLOCK = 65536 };
	alloc_host(f, N * BLOCK);
	assert_int_equal(open_tier(f, BLOCK, N), 0);
	for (int i = 0; i < N; i++)
		assert_int_equal(disk_slot_alloc(f->d), i);
	int n = 0;
	/* Each slot written, then read (maybe before the write: no matter). */
	for (int i = 0; i < N; i++, n++)
		assert_int_equal(disk_submit_write(f->d, i, f->host + i * BLOCK, (uint64_t)n), 0);
	for (int i = 0; n < DISK_QUEUE_DEPTH; i++, n++)
		assert_int_equal(disk_submit_read(f->d, i, f->host + i * BLOCK, (uint64_t)n), 0);
	assert_int_equal(disk_submit_write(f->d, 0, f->host, 0), -EAGAIN);
	uint64_t t0 = atlas_now_ns();
	close_tier(f);
	assert_true(atlas_now_ns() - t0 < WAIT_NS);
	assert_int_equal(f->n_done, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_round_trip_direct, setup, teardown),
		cmocka_unit_test_setup_teardown(test_round_trip_tmpfs, setup, teardown),
		cmocka_unit_test_setup_teardown(test_round_trip_buffered, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fixed_buffers_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_enospc, setup, teardown),
		cmocka_unit_test_setup_teardown(test_read_past_end, setup, teardown),
		cmocka_unit_test_setup_teardown(test_named_file_and_checksums, setup, teardown),
		cmocka_unit_test_setup_teardown(test_refusals, setup, teardown),
		cmocka_unit_test_setup_teardown(test_close_in_flight, setup, teardown),
	};
	return cmocka_run_group_tests_name("hss_disk", tests, NULL, NULL);
}
