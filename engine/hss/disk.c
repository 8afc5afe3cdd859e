/* The disk tier's I/O (disk.h): the block file, the slot allocator, the two
 * queues between the engine thread and the I/O thread, and the I/O thread,
 * which alone touches the ring after open.
 *
 * The I/O thread sleeps in a read of one eventfd, which the submitters and
 * close write and which the kernel signals for every completion (the ring's
 * registered eventfd). It never blocks in io_uring_enter: a plain read is
 * also a wait that tools such as valgrind see as one (valgrind 3.19 holds
 * its lock through io_uring_enter and so deadlocks the other threads).
 *
 * An operation (struct disk_op) is handed over whole through the queues,
 * each under the tier's lock: the engine thread fills it and puts its index
 * on the submission queue; the I/O thread takes it, runs it, and puts it on
 * the completion queue; disk_poll gives it back to the engine thread's free
 * stack. Both queues have room for every operation, so neither can be full.
 */
#include "engine/hss/disk.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "engine/hss/hist.h"
#include "engine/hss/uring_check.h"

/* Submission queue entries of the ring (the completion queue gets twice as
 * many). Operations in the ring stay within it, so that neither of the
 * ring's queues can overflow. */
#define RING_DEPTH 64
/* The kernel's limit on one fixed buffer: the host region is registered as
 * consecutive buffers of this size. */
#define FIXED_CHUNK (1ull << 30)
#define MAX_BLOCK_BYTES FIXED_CHUNK
/* Resubmissions of an operation answered with EINTR or EAGAIN before it
 * fails with that error: a bound, not a tuning knob. */
#define MAX_RETRIES 16

enum { SLOT_FREE, SLOT_USED, SLOT_SUMMED };

struct disk_op {
	uint64_t tag;          /* the caller's */
	uint64_t t_submit_ns;
	uint8_t *buf;          /* len bytes of the host region; the caller's */
	uint64_t off;          /* the slot's offset in the file */
	uint32_t len;          /* slot_bytes */
	uint32_t done;         /* bytes moved so far: a short transfer resumes here */
	int result;            /* 0 or negative errno, once finished */
	int buf_index;         /* the fixed buffer that holds [buf, buf + len), -1: none */
	uint32_t slot;
	uint64_t sum;          /* write: the checksum of what it wrote (the I/O thread's);
				* read: the one the slot's data must have */
	bool check;            /* read: compare the data with sum */
	bool write;
	bool in_ring;          /* an SQE of it is in the ring (the I/O thread's) */
	uint8_t retries;       /* EINTR/EAGAIN answers so far */
	uint32_t resubmits;    /* SQEs after the first */
};

struct disk_tier {
	/* Set at open, read-only after. */
	int fd;                          /* the block file; owned */
	int wake_fd;                     /* eventfd that wakes the I/O thread; owned */
	uint8_t *host_base;              /* the host tier's region; not owned */
	size_t host_bytes;
	size_t slot_bytes, align;
	uint32_t n_slots;
	bool direct, fixed;
	disk_wake_fn wake_fn;
	void *wake_ctx;
	struct io_uring ring;            /* the I/O thread's once it runs */
	pthread_t thread;

	/* The engine thread's. */
	uint32_t *free_slots;            /* [n_slots] stack, slot 0 on top at open; owned */
	uint32_t n_free_slots;
	bool stack_stale;                /* slots were claimed: rebuild free_slots first */
	uint8_t *slot_used;              /* [n_slots] SLOT_FREE, SLOT_USED or SLOT_SUMMED; owned */
	uint64_t *slot_sum;              /* [n_slots] checksum of a SLOT_SUMMED slot's data; owned */
	uint16_t free_ops[DISK_QUEUE_DEPTH]; /* stack of idle operations */
	int n_free_ops;

	struct disk_op ops[DISK_QUEUE_DEPTH]; /* each the thread's that the header comment says */

	/* The I/O thread's. */
	int in_ring;                     /* operations with an SQE in the ring */

	/* Under lock: the queues (indices into ops, counters that wrap), stop,
	 * broken and the I/O counters. */
	pthread_mutex_t lock;
	uint16_t sub_q[DISK_QUEUE_DEPTH];
	uint32_t sub_head, sub_tail;
	uint16_t done_q[DISK_QUEUE_DEPTH];
	uint32_t done_head, done_tail;
	bool stop;                       /* close: the I/O thread finishes up and exits */
	int broken;                      /* the ring's fatal error, 0: none */
	uint64_t writes, reads, bytes_written, bytes_read, errors, resubmits;
	int last_error;
	struct lat_hist read_lat;        /* ns */
};

/* Engine side. */

static void wake_io(struct disk_tier *d)
{
	/* Cannot block: the counter would have to reach 2^64 - 1 first. */
	if (eventfd_write(d->wake_fd, 1))
		log_error("hss disk: waking the I/O thread: %s", strerror(errno));
}

/* The fixed buffer that holds all of bytes [off, off + len) of the host
 * region, or -1 when the region is not registered or the range straddles
 * two buffers. */
static int fixed_index(const struct disk_tier *d, size_t off, size_t len)
{
	if (!d->fixed)
		return -1;
	size_t last = off + len - 1;
	return off / FIXED_CHUNK == last / FIXED_CHUNK ? (int)(off / FIXED_CHUNK) : -1;
}

static int submit(struct disk_tier *d, int slot, const void *host_ptr, uint64_t tag, bool write)
{
	uintptr_t p = (uintptr_t)host_ptr, base = (uintptr_t)d->host_base;
	if (slot < 0 || (uint32_t)slot >= d->n_slots || d->slot_used[slot] == SLOT_FREE)
		return -EINVAL;
	if (p < base || p - base > d->host_bytes - d->slot_bytes || p % d->align)
		return -EINVAL;
	if (!d->n_free_ops)
		return -EAGAIN;
	pthread_mutex_lock(&d->lock);
	int rc = d->broken;
	bool was_empty = d->sub_head == d->sub_tail;
	if (!rc) {
		int i = d->free_ops[--d->n_free_ops];
		d->ops[i] = (struct disk_op){
			.tag = tag,
			.t_submit_ns = atlas_now_ns(),
			.buf = d->host_base + (p - base),
			.off = (uint64_t)slot * d->slot_bytes,
			.len = (uint32_t)d->slot_bytes,
			.buf_index = fixed_index(d, p - base, d->slot_bytes),
			.slot = (uint32_t)slot,
			.sum = d->slot_sum[slot],
			.check = !write && d->slot_used[slot] == SLOT_SUMMED,
			.write = write,
		};
		d->sub_q[d->sub_tail++ % DISK_QUEUE_DEPTH] = (uint16_t)i;
	}
	pthread_mutex_unlock(&d->lock);
	/* A queue that was not empty has a wake on the way already: its first
	 * submit's, or the completions that make room in the ring for it. */
	if (!rc && was_empty)
		wake_io(d);
	return rc;
}

int disk_submit_write(struct disk_tier *d, int slot, const void *host_ptr, uint64_t tag)
{
	return submit(d, slot, host_ptr, tag, true);
}

int disk_submit_read(struct disk_tier *d, int slot, void *host_ptr, uint64_t tag)
{
	return submit(d, slot, host_ptr, tag, false);
}

int disk_poll(struct disk_tier *d, disk_done_fn cb, void *ctx)
{
	uint16_t ids[DISK_QUEUE_DEPTH];
	pthread_mutex_lock(&d->lock);
	int n = (int)(d->done_tail - d->done_head);
	for (int i = 0; i < n; i++)
		ids[i] = d->done_q[(d->done_head + (uint32_t)i) % DISK_QUEUE_DEPTH];
	d->done_head = d->done_tail;
	pthread_mutex_unlock(&d->lock);
	for (int i = 0; i < n; i++) {
		const struct disk_op *op = &d->ops[ids[i]];
		uint64_t tag = op->tag;
		int result = op->result;
		if (op->write && !result) {
			d->slot_used[op->slot] = SLOT_SUMMED;
			d->slot_sum[op->slot] = op->sum;
		}
		/* Idle before the callback, which may submit again. */
		d->free_ops[d->n_free_ops++] = ids[i];
		cb(ctx, tag, result);
	}
	return n;
}

/* After claims: the free slots again, the lowest on top. */
static void rebuild_free(struct disk_tier *d)
{
	uint32_t n = 0;
	for (uint32_t i = d->n_slots; i-- > 0;)
		if (d->slot_used[i] == SLOT_FREE)
			d->free_slots[n++] = i;
	d->n_free_slots = n;
	d->stack_stale = false;
}

int disk_slot_alloc(struct disk_tier *d)
{
	if (d->stack_stale)
		rebuild_free(d);
	if (!d->n_free_slots)
		return -ENOSPC;
	uint32_t s = d->free_slots[--d->n_free_slots];
	d->slot_used[s] = SLOT_USED;
	return (int)s;
}

int disk_slot_free(struct disk_tier *d, int slot)
{
	if (slot < 0 || (uint32_t)slot >= d->n_slots || d->slot_used[slot] == SLOT_FREE)
		return -EINVAL;
	if (d->stack_stale)
		rebuild_free(d);
	d->slot_used[slot] = SLOT_FREE;
	d->free_slots[d->n_free_slots++] = (uint32_t)slot;
	return 0;
}

int disk_slot_claim(struct disk_tier *d, int slot, uint64_t sum)
{
	if (slot < 0 || (uint32_t)slot >= d->n_slots)
		return -ERANGE;
	if (d->slot_used[slot] != SLOT_FREE)
		return -EEXIST;
	d->slot_used[slot] = SLOT_SUMMED;
	d->slot_sum[slot] = sum;
	d->n_free_slots--;
	d->stack_stale = true;
	return 0;
}

int disk_slot_sum(const struct disk_tier *d, int slot, uint64_t *sum)
{
	if (slot < 0 || (uint32_t)slot >= d->n_slots || d->slot_used[slot] != SLOT_SUMMED)
		return -ENODATA;
	*sum = d->slot_sum[slot];
	return 0;
}

int disk_tier_sync(struct disk_tier *d)
{
	return fdatasync(d->fd) ? -errno : 0;
}

size_t disk_slot_bytes(const struct disk_tier *d)
{
	return d->slot_bytes;
}

size_t disk_align(const struct disk_tier *d)
{
	return d->align;
}

void disk_stats(struct disk_tier *d, struct disk_stats *out)
{
	pthread_mutex_lock(&d->lock);
	*out = (struct disk_stats){
		.writes = d->writes,
		.reads = d->reads,
		.bytes_written = d->bytes_written,
		.bytes_read = d->bytes_read,
		.errors = d->errors,
		.resubmits = d->resubmits,
		.last_error = d->last_error,
		.read_p50_ns = hist_quantile(&d->read_lat, 0.50),
		.read_p99_ns = hist_quantile(&d->read_lat, 0.99),
		.read_max_ns = d->read_lat.max,
	};
	pthread_mutex_unlock(&d->lock);
	out->direct = d->direct;
	out->fixed_buffers = d->fixed;
	out->slots_used = d->n_slots - d->n_free_slots;
	out->slots_total = d->n_slots;
	out->in_flight = (uint32_t)(DISK_QUEUE_DEPTH - d->n_free_ops);
	out->slot_bytes = d->slot_bytes;
	out->align = d->align;
}

/* The I/O thread. */

/* Operations finished by one pass of the thread, posted together. */
struct batch {
	uint16_t ids[DISK_QUEUE_DEPTH];
	int n;
};

static void finish(struct disk_tier *d, struct disk_op *op, int result, struct batch *b)
{
	if (op->in_ring)
		d->in_ring--;
	op->in_ring = false;
	op->result = result;
	b->ids[b->n++] = (uint16_t)(op - d->ops);
}

/* Post a batch: counters, the completion queue, then the engine's wake. */
static void post(struct disk_tier *d, struct batch *b)
{
	if (!b->n)
		return;
	uint64_t now = atlas_now_ns();
	pthread_mutex_lock(&d->lock);
	for (int i = 0; i < b->n; i++) {
		const struct disk_op *op = &d->ops[b->ids[i]];
		d->resubmits += op->resubmits;
		if (op->result) {
			d->errors++;
			d->last_error = op->result;
		} else if (op->write) {
			d->writes++;
			d->bytes_written += op->len;
		} else {
			d->reads++;
			d->bytes_read += op->len;
			hist_add(&d->read_lat, now - op->t_submit_ns);
		}
		d->done_q[d->done_tail++ % DISK_QUEUE_DEPTH] = b->ids[i];
	}
	pthread_mutex_unlock(&d->lock);
	b->n = 0;
	if (d->wake_fn)
		d->wake_fn(d->wake_ctx);
}

/* An SQE; when the ring's submission queue is full (it cannot be, by the
 * bound on operations in the ring, but a submit makes room anyway), after a
 * submit. */
static struct io_uring_sqe *get_sqe(struct disk_tier *d)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&d->ring);
	if (!sqe && URING_CHECK(io_uring_submit(&d->ring)) >= 0)
		sqe = io_uring_get_sqe(&d->ring);
	return sqe;
}

/* Put (the rest of) an operation into the ring. */
static void start(struct disk_tier *d, struct disk_op *op, struct batch *b)
{
	struct io_uring_sqe *sqe = get_sqe(d);
	if (!sqe) {
		finish(d, op, -EBUSY, b);
		return;
	}
	uint8_t *buf = op->buf + op->done;
	unsigned len = op->len - op->done;
	uint64_t off = op->off + op->done;
	if (op->buf_index >= 0 && op->write)
		io_uring_prep_write_fixed(sqe, d->fd, buf, len, off, op->buf_index);
	else if (op->buf_index >= 0)
		io_uring_prep_read_fixed(sqe, d->fd, buf, len, off, op->buf_index);
	else if (op->write)
		io_uring_prep_write(sqe, d->fd, buf, len, off);
	else
		io_uring_prep_read(sqe, d->fd, buf, len, off);
	io_uring_sqe_set_data64(sqe, (uint64_t)(op - d->ops));
	if (!op->in_ring)
		d->in_ring++;
	op->in_ring = true;
}

/* One CQE of a data operation: done, the rest of a short transfer, a retry,
 * or an error. */
static void complete(struct disk_tier *d, struct disk_op *op, int res, struct batch *b)
{
	if ((res == -EINTR || res == -EAGAIN) && op->retries < MAX_RETRIES) {
		op->retries++;
		op->resubmits++;
		start(d, op, b);
	} else if (res < 0) {
		finish(d, op, res, b);
	} else if (res == 0) {
		/* A read at the end of the file (a slot never written), or a
		 * write that moved nothing: resubmitting would spin. */
		finish(d, op, -EIO, b);
	} else if ((op->done += (uint32_t)res) < op->len) {
		op->resubmits++;
		start(d, op, b);
	} else if (op->check && XXH3_64bits(op->buf, op->len) != op->sum) {
		finish(d, op, -EBADMSG, b);
	} else {
		finish(d, op, 0, b);
	}
}

/* Handle every CQE there is; returns how many. */
static unsigned reap(struct disk_tier *d, struct batch *b)
{
	struct io_uring_cqe *cqe;
	unsigned head, n = 0;
	io_uring_for_each_cqe(&d->ring, head, cqe) {
		complete(d, &d->ops[io_uring_cqe_get_data64(cqe)], cqe->res, b);
		n++;
	}
	io_uring_cq_advance(&d->ring, n);
	return n;
}

/* Take queued operations, as many as the ring has room for; at close, cancel
 * them all instead. Returns how many were taken, and whether to stop. */
static uint32_t take(struct disk_tier *d, struct batch *b, bool *stop)
{
	uint16_t ids[DISK_QUEUE_DEPTH];
	pthread_mutex_lock(&d->lock);
	*stop = d->stop;
	int fail = d->broken ? d->broken : *stop ? -ECANCELED : 0;
	uint32_t n = d->sub_tail - d->sub_head;
	if (!fail && n > (uint32_t)(RING_DEPTH - d->in_ring))
		n = (uint32_t)(RING_DEPTH - d->in_ring);
	for (uint32_t i = 0; i < n; i++)
		ids[i] = d->sub_q[(d->sub_head + i) % DISK_QUEUE_DEPTH];
	d->sub_head += n;
	pthread_mutex_unlock(&d->lock);
	for (uint32_t i = 0; i < n; i++) {
		struct disk_op *op = &d->ops[ids[i]];
		if (fail) {
			finish(d, op, fail, b);
			continue;
		}
		if (op->write)
			op->sum = XXH3_64bits(op->buf, op->len);
		start(d, op, b);
	}
	return n;
}

/* Sleep until a submit, a completion or close writes the eventfd. */
static int wait_wake(struct disk_tier *d)
{
	uint64_t v;
	if (read(d->wake_fd, &v, sizeof v) >= 0 || errno == EINTR)
		return 0;
	int rc = -errno;
	log_error("hss disk: reading the eventfd: %s", strerror(-rc));
	return rc;
}

/* The ring failed in a way no retry clears (a bug: a bad ring or address).
 * Every operation the thread holds fails with that error, so does every
 * later one, and the ring is not touched again; the thread waits for close
 * on the eventfd itself. */
static void run_broken(struct disk_tier *d, int rc, struct batch *b)
{
	log_error("hss disk: the ring failed (%s): every operation fails from now on",
		  strerror(-rc));
	for (int i = 0; i < DISK_QUEUE_DEPTH; i++)
		if (d->ops[i].in_ring)
			finish(d, &d->ops[i], rc, b);
	pthread_mutex_lock(&d->lock);
	d->broken = rc;
	pthread_mutex_unlock(&d->lock);
	for (;;) {
		bool stop;
		take(d, b, &stop);
		post(d, b);
		if (stop || wait_wake(d))
			return;
	}
}

static void *io_main(void *arg)
{
	struct disk_tier *d = arg;
	struct batch b = { .n = 0 };
	for (;;) {
		bool stop;
		uint32_t taken = take(d, &b, &stop);
		int rc = 0;
		if (io_uring_sq_ready(&d->ring))
			rc = URING_CHECK(io_uring_submit(&d->ring));
		if (rc < 0 && !uring_transient(rc)) {
			run_broken(d, rc, &b);
			return NULL;
		}
		unsigned reaped = reap(d, &b);
		post(d, &b);
		if (stop && !d->in_ring)
			return NULL;
		if (rc < 0 && !reaped) {
			/* The kernel was short of something and nothing finished
			 * meanwhile: pause before trying again. */
			struct timespec ms = { .tv_nsec = 1000000 };
			nanosleep(&ms, NULL);
		} else if (!taken && !reaped && (rc = wait_wake(d))) {
			run_broken(d, rc, &b);
			return NULL;
		}
	}
}

/* Open. */

/* O_DIRECT's alignment for fd: 4096 (a page, and the logical block of
 * every common disk), or the filesystem's own when it says it is larger. */
static size_t dio_align(int fd)
{
	size_t a = 4096;
	struct statx sx;
	if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 &&
	    (sx.stx_mask & STATX_DIOALIGN)) {
		a = ATLAS_MAX(a, (size_t)sx.stx_dio_mem_align);
		a = ATLAS_MAX(a, (size_t)sx.stx_dio_offset_align);
	}
	return a;
}

/* Register the host region as fixed buffers of up to FIXED_CHUNK bytes;
 * false (and a warning) when the kernel refuses. */
static bool register_host(struct disk_tier *d)
{
	size_t n = (d->host_bytes + FIXED_CHUNK - 1) / FIXED_CHUNK;
	struct iovec *iov = calloc(n, sizeof *iov);
	if (!iov)
		return false;
	for (size_t i = 0; i < n; i++) {
		iov[i].iov_base = d->host_base + i * FIXED_CHUNK;
		iov[i].iov_len = ATLAS_MIN(FIXED_CHUNK, d->host_bytes - i * FIXED_CHUNK);
	}
	int rc = URING_TRY(io_uring_register_buffers(&d->ring, iov, (unsigned)n));
	free(iov);
	if (rc < 0)
		log_warn("hss disk: plain reads and writes: cannot register %zu bytes of host "
			 "memory as fixed buffers (%s; RLIMIT_MEMLOCK applies without "
			 "CAP_IPC_LOCK)",
			 d->host_bytes, strerror(-rc));
	return rc == 0;
}

/* The block file: unnamed in dir, or dir/file as it is (made if missing). */
static int open_file(const char *dir, const char *file, int flags)
{
	if (!file)
		return open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC | flags, 0600);
	int dfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return -1;
	int fd = openat(dfd, file, O_CREAT | O_RDWR | O_CLOEXEC | flags, 0600);
	int e = errno;
	close(dfd);
	errno = e;
	return fd;
}

static void tier_free(struct disk_tier *d)
{
	if (d->fd >= 0)
		close(d->fd);
	if (d->wake_fd >= 0)
		close(d->wake_fd);
	free(d->free_slots);
	free(d->slot_used);
	free(d->slot_sum);
	pthread_mutex_destroy(&d->lock);
	free(d);
}

int disk_tier_open(const char *dir, const char *file, size_t block_bytes, uint32_t max_blocks,
		   void *host_base, size_t host_bytes, disk_wake_fn wake_fn, void *wake_ctx,
		   struct disk_tier **out, char *err, size_t errlen)
{
	if (!block_bytes || block_bytes > MAX_BLOCK_BYTES)
		return atlas_errf(err, errlen, -EINVAL,
				  "hss disk: a block of %zu bytes (1 to %llu)", block_bytes,
				  MAX_BLOCK_BYTES);
	if (!max_blocks || max_blocks > INT32_MAX)
		return atlas_errf(err, errlen, -EINVAL, "hss disk: %u blocks (1 to %d)", max_blocks,
				  INT32_MAX);
	if (!host_base)
		return atlas_errf(err, errlen, -EINVAL, "hss disk: no host region");
	struct disk_tier *d = calloc(1, sizeof *d);
	if (!d)
		return atlas_errf(err, errlen, -ENOMEM, "out of memory");
	d->wake_fd = -1;
	pthread_mutex_init(&d->lock, NULL);
	d->host_base = host_base;
	d->host_bytes = host_bytes;
	d->n_slots = max_blocks;
	d->wake_fn = wake_fn;
	d->wake_ctx = wake_ctx;

	d->direct = true;
	d->fd = open_file(dir, file, O_DIRECT);
	if (d->fd < 0 && errno == EINVAL) {
		d->direct = false;
		d->fd = open_file(dir, file, 0);
	}
	int rc;
	if (d->fd < 0) {
		rc = -errno;
		tier_free(d);
		return atlas_errf(err, errlen, rc, "hss disk: cannot %s a block file in %s: %s",
				  file ? "open" : "create", dir, strerror(-rc));
	}
	d->align = dio_align(d->fd);
	d->slot_bytes = (block_bytes + d->align - 1) / d->align * d->align;
	if (host_bytes < d->slot_bytes) {
		rc = atlas_errf(err, errlen, -EINVAL,
				"hss disk: a host region of %zu bytes holds no slot of %zu",
				host_bytes, d->slot_bytes);
		tier_free(d);
		return rc;
	}
	d->free_slots = malloc((size_t)max_blocks * sizeof *d->free_slots);
	d->slot_used = calloc(max_blocks, 1);
	d->slot_sum = calloc(max_blocks, sizeof *d->slot_sum);
	if (!d->free_slots || !d->slot_used || !d->slot_sum) {
		tier_free(d);
		return atlas_errf(err, errlen, -ENOMEM, "hss disk: out of memory for %u slots",
				  max_blocks);
	}
	for (uint32_t i = 0; i < max_blocks; i++)
		d->free_slots[i] = max_blocks - 1 - i;
	d->n_free_slots = max_blocks;
	for (int i = 0; i < DISK_QUEUE_DEPTH; i++)
		d->free_ops[i] = (uint16_t)(DISK_QUEUE_DEPTH - 1 - i);
	d->n_free_ops = DISK_QUEUE_DEPTH;

	d->wake_fd = eventfd(0, EFD_CLOEXEC);
	if (d->wake_fd < 0) {
		rc = -errno;
		tier_free(d);
		return atlas_errf(err, errlen, rc, "hss disk: eventfd: %s", strerror(-rc));
	}
	if ((rc = URING_CHECK(io_uring_queue_init(RING_DEPTH, &d->ring, 0))) < 0) {
		tier_free(d);
		return atlas_errf(err, errlen, rc, "hss disk: cannot set up an io_uring: %s",
				  strerror(-rc));
	}
	if ((rc = URING_CHECK(io_uring_register_eventfd(&d->ring, d->wake_fd))) < 0) {
		io_uring_queue_exit(&d->ring);
		tier_free(d);
		return atlas_errf(err, errlen, rc, "hss disk: cannot register an eventfd: %s",
				  strerror(-rc));
	}
	d->fixed = register_host(d);

	/* The I/O thread takes no signals: its waits are never interrupted,
	 * and the process's handlers run elsewhere. */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	rc = -pthread_create(&d->thread, NULL, io_main, d);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc) {
		if (d->fixed)
			URING_CHECK(io_uring_unregister_buffers(&d->ring));
		io_uring_queue_exit(&d->ring);
		tier_free(d);
		return atlas_errf(err, errlen, rc, "hss disk: cannot start the I/O thread");
	}
	log_info("hss disk: %s/%s: %u slots of %zu bytes, %s, %s", dir, file ? file : "(unnamed)",
		 max_blocks, d->slot_bytes,
		 d->direct ? "O_DIRECT" : "buffered (no O_DIRECT here)",
		 d->fixed ? "fixed buffers" : "plain buffers");
	*out = d;
	return 0;
}

void disk_tier_close(struct disk_tier *d)
{
	if (!d)
		return;
	pthread_mutex_lock(&d->lock);
	d->stop = true;
	pthread_mutex_unlock(&d->lock);
	wake_io(d);
	pthread_join(d->thread, NULL);
	if (d->fixed)
		URING_CHECK(io_uring_unregister_buffers(&d->ring));
	io_uring_queue_exit(&d->ring);
	tier_free(d);
}
