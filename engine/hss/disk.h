/* The disk tier of the KV swap tier (DESIGN §8): whole KV blocks kept in the
 * slots of one file in kv_dir, moved to and from the host tier's memory
 * through one io_uring ring that one I/O thread drives (DESIGN §3).
 *
 *   disk_tier_open      the file, the ring, the I/O thread
 *   disk_slot_alloc     a free slot (the disk budget is max_blocks slots)
 *   disk_slot_claim     mark a slot used that a named file kept (persistence)
 *   disk_slot_sum       the checksum of what a slot holds
 *   disk_submit_write   queue a copy of host memory into a slot
 *   disk_submit_read    queue a copy of a slot into host memory
 *   disk_poll           collect finished operations: cb(ctx, tag, result)
 *   disk_stats          counters, read latency percentiles, modes
 *
 * The engine thread never waits on I/O: a submission goes on a bounded
 * queue (DISK_QUEUE_DEPTH operations between submit and poll) or is refused
 * with -EAGAIN, to be retried after a poll. The I/O thread moves queued
 * operations into the ring, resubmits the rest of a short transfer (and
 * retries EINTR/EAGAIN), posts each finished operation with its result and
 * latency, and after each batch calls wake_fn(wake_ctx) so that the engine
 * thread polls. A result is 0 or a negative errno: -ENOSPC from a full
 * filesystem, -EIO from the device or from a read past the end of the file
 * (a slot never written beyond the last written one), -ECANCELED when close
 * came first. Operations are not ordered with each other: a read of a slot
 * submitted before the write to it has completed may see either contents.
 *
 * The file. One unnamed file (O_TMPFILE) in dir, so its space goes back to
 * the filesystem on close and on a crash alike, with no stale files to sweep;
 * or, for persistence (engine/persist/), a named one that outlives the
 * process: a restarted atlasd opens it again and claims the slots its
 * manifest lists, so slot numbers need no translation. Slot s is bytes
 * [s * slot_bytes, (s + 1) * slot_bytes) of it; there is no header. No space
 * is reserved: the file grows as slots are written, and a full filesystem
 * fails the write that finds it full.
 *
 * Checksums. The I/O thread hashes every block it writes (XXH3-64, some
 * tens of GB/s against the disk's few) and the slot keeps the hash; a read of
 * a slot with a known hash is checked against it and fails with -EBADMSG
 * when the data differ (a torn or foreign file, a flipped bit). Claimed
 * slots come with the hash their manifest recorded.
 *
 * Modes. The file is opened with O_DIRECT where the filesystem takes it (the
 * host tier's RAM is the cache; a page-cache copy would double it), else
 * buffered (ramfs, tmpfs before Linux 6.6). Slots, transfers and host
 * pointers follow O_DIRECT's alignment in both modes, so a caller that works
 * on one works on the other. The host tier's memory is registered with the
 * ring as fixed buffers, so that reads and writes do not pin its pages each
 * time (READ_FIXED/WRITE_FIXED), unless the kernel refuses (RLIMIT_MEMLOCK
 * for a process without CAP_IPC_LOCK; memory that cannot be pinned): then
 * plain reads and writes. The region is registered in buffers of 1 GiB (the
 * kernel's limit on one); a transfer that straddles two goes plain.
 * disk_stats says which modes are on.
 *
 * Threads: every function but the I/O thread's wake_fn call is the engine
 * thread's (disk_stats also from a thread holding the lock that serialises
 * the engine thread's slot calls). Nothing allocates after open.
 */
#ifndef ATLAS_ENGINE_HSS_DISK_H
#define ATLAS_ENGINE_HSS_DISK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Operations between submit and poll, finished ones not yet polled
 * included. */
#define DISK_QUEUE_DEPTH 128

/* Called on the I/O thread after it has posted finished operations. It must
 * not block and must not call into the tier; it may be called until
 * disk_tier_close returns. */
typedef void (*disk_wake_fn)(void *ctx);
/* One finished operation, on the engine thread inside disk_poll: the tag
 * given at submit and 0 or a negative errno. It may submit again. */
typedef void (*disk_done_fn)(void *ctx, uint64_t tag, int result);

struct disk_tier;

struct disk_stats {
	uint64_t writes, reads;               /* successful operations */
	uint64_t bytes_written, bytes_read;   /* by them: whole slots */
	uint64_t errors;                      /* operations that failed (not the refused ones) */
	int last_error;                       /* the latest of those errors, 0: none */
	uint64_t resubmits;                   /* rests of short transfers; EINTR/EAGAIN retries */
	uint64_t read_p50_ns, read_p99_ns;    /* successful reads, submit to completion; 0: none */
	uint64_t read_max_ns;
	bool direct;                          /* O_DIRECT */
	bool fixed_buffers;                   /* the host region is registered with the ring */
	uint32_t slots_used, slots_total;
	uint32_t in_flight;                   /* operations between submit and poll */
	size_t slot_bytes;                    /* block_bytes rounded up to align */
	size_t align;                         /* of slots, transfers and host pointers */
};

/* Open the tier: an unnamed file in dir (file NULL) or dir/file as it is
 * (made when missing, never truncated), room for max_blocks slots of
 * block_bytes (at most 1 GiB) rounded up to the O_DIRECT alignment (4096, or
 * the filesystem's larger one), and the host tier's region
 * [host_base, host_base + host_bytes) that every transfer reads or writes
 * (not owned; it must outlive the tier). wake_fn may be NULL. */
int disk_tier_open(const char *dir, const char *file, size_t block_bytes, uint32_t max_blocks,
		   void *host_base, size_t host_bytes, disk_wake_fn wake_fn, void *wake_ctx,
		   struct disk_tier **out, char *err, size_t errlen);
/* Stop the I/O thread and close everything. Operations in the kernel finish
 * first; queued ones are cancelled; finished operations not yet polled are
 * dropped without their callbacks. The file's space goes back. */
void disk_tier_close(struct disk_tier *d);

/* Bytes a transfer moves: the host tier strides its blocks by this. */
size_t disk_slot_bytes(const struct disk_tier *d);
/* The alignment of host pointers given to submit. */
size_t disk_align(const struct disk_tier *d);

/* A free slot (the most recently freed first, then the lowest never used),
 * or -ENOSPC when all max_blocks are used. */
int disk_slot_alloc(struct disk_tier *d);
/* Return a slot; its operations must have completed. -EINVAL for a slot that
 * is not allocated. */
int disk_slot_free(struct disk_tier *d, int slot);
/* Mark slot used, its data known to hash to sum (a named file's slot that a
 * previous process wrote): -ERANGE past max_blocks, -EEXIST when used. */
int disk_slot_claim(struct disk_tier *d, int slot, uint64_t sum);
/* The hash of the data slot holds (written and polled, or claimed), or
 * -ENODATA when none is known. */
int disk_slot_sum(const struct disk_tier *d, int slot, uint64_t *sum);
/* Make every write polled so far durable (fdatasync). Blocks. */
int disk_tier_sync(struct disk_tier *d);

/* Queue a copy of [host_ptr, host_ptr + slot_bytes) into slot (write) or of
 * slot into that memory (read); the memory is the I/O thread's until the
 * operation is polled. -EINVAL when the slot is not allocated or the memory
 * is not aligned or not inside the host region, -EAGAIN when
 * DISK_QUEUE_DEPTH operations are outstanding, the ring's error once it has
 * failed (disk_stats' last_error). Never blocks. */
int disk_submit_write(struct disk_tier *d, int slot, const void *host_ptr, uint64_t tag);
int disk_submit_read(struct disk_tier *d, int slot, void *host_ptr, uint64_t tag);

/* Call cb for each operation finished since the last poll, in completion
 * order; returns how many. */
int disk_poll(struct disk_tier *d, disk_done_fn cb, void *ctx);

void disk_stats(struct disk_tier *d, struct disk_stats *out);

#endif
