/* Moving sequences' blocks between the device, host and disk tiers
 * (seq.h, DESIGN §8). Each block moves whole, with one device copy each way
 * (kt_copy_async, on the backend's copy stream) and one disk I/O each way
 * (engine/hss/disk.h, on its own ring and thread); the engine thread only
 * starts moves and, in seq_pool_poll, notices which have ended. Nothing here
 * waits.
 *
 * A move's stages:
 *
 *   down to host    copy device -> host slot                      (COPYING)
 *   down to disk    [staging slot] copy device -> staging          (COPYING)
 *                   write staging -> disk slot                     (IO)
 *   host to disk    write host slot -> disk slot                   (IO)
 *   up from host    copy host slot -> device                      (COPYING)
 *   up from disk    [staging slot] read disk slot -> staging      (IO)
 *                   copy staging -> device                        (COPYING)
 *   disk to host    read disk slot -> host slot                   (IO)
 *
 * A move that needs a staging slot waits for one (NEED_STAGING); a copy or
 * I/O that the backend or the ring cannot take yet is retried at the next
 * poll (START_COPY, START_IO). Until a move ends, the block's kv_ref still
 * names its source, which stays valid: a failed write or copy leaves the
 * block where it was (counted in move_error); only a failed read from disk
 * loses it (seq.lost). Up moves take their device block when they start, so
 * a restore is all or nothing on device memory.
 */
#include "engine/seq/seq.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "engine/hss/disk.h"

enum move_stage { NEED_STAGING, START_COPY, COPYING, START_IO, IO };

/* Moves in flight at once: the backends keep up to 1024 copies in flight. */
#define SEQ_MAX_MOVES 1024
/* Host slots kept aside for staging disk I/O (when there is a disk tier). */
#define SEQ_STAGING_SLOTS 32

/* The device bytes of block b: one contiguous span of the pool. */
static size_t dev_offset(const struct kv_pool *kv, int b)
{
	return (size_t)b * kv->bytes_per_block;
}

static void on_io(void *ctx, uint64_t tag, int result)
{
	struct seq_pool *p = ctx;
	struct seq_move *m = &p->moves[tag];
	m->io_result = result;
	m->io_done = 1;
}

int seq_pool_tiers(struct seq_pool *p, uint64_t host_bytes, const char *disk_dir,
		   const char *disk_file, uint64_t disk_bytes, void (*wake)(void *ctx),
		   void *wake_ctx, char *err, size_t errlen)
{
	const size_t block = (size_t)p->kv.bytes_per_block;
	const bool disk = disk_dir && *disk_dir && disk_bytes;
	int rc;

	if (!host_bytes && !disk)
		return 0;
	if (!p->kv.n_layers)
		return atlas_errf(err, errlen, -EINVAL,
				  "kv_host_memory: the model has no attention layers to swap");
	/* The disk tier reads and writes through host slots: it needs a few. */
	uint64_t staging = disk ? (uint64_t)SEQ_STAGING_SLOTS * ((block + KT_HOST_ALIGN - 1) /
								KT_HOST_ALIGN * KT_HOST_ALIGN) : 0;
	if ((rc = host_pool_init(&p->host, p->kv.be, block, host_bytes + staging, err, errlen)))
		return rc;
	p->max_moves = SEQ_MAX_MOVES;
	p->moves = calloc((size_t)p->max_moves, sizeof *p->moves);
	p->active = calloc((size_t)p->max_moves, sizeof *p->active);
	p->free_moves = calloc((size_t)p->max_moves, sizeof *p->free_moves);
	p->staging_free = calloc(SEQ_STAGING_SLOTS, sizeof *p->staging_free);
	if (!p->moves || !p->active || !p->free_moves || !p->staging_free)
		return atlas_errf(err, errlen, -ENOMEM, "kv: out of memory for the swap tier");
	for (int i = 0; i < p->max_moves; i++) {
		p->free_moves[i] = p->max_moves - 1 - i;
		p->moves[i].active_pos = -1;
	}
	p->n_free_moves = p->max_moves;
	if (!disk)
		return 0;
	while (p->n_staging < SEQ_STAGING_SLOTS && p->host.n_free)
		p->staging_free[p->n_staging++] = host_slot_alloc(&p->host);
	p->n_staging_free = p->n_staging;
	if (!p->n_staging)
		return atlas_errf(err, errlen, -ENOMEM, "kv: no host memory to stage disk I/O");
	uint64_t slots = disk_bytes / block;
	if (slots > UINT32_MAX)
		slots = UINT32_MAX;
	if ((rc = disk_tier_open(disk_dir, disk_file, block, (uint32_t)slots, p->host.mem,
				 (size_t)p->host.n_blocks * p->host.slot_bytes, wake, wake_ctx,
				 &p->disk, err, errlen)))
		return rc;
	/* A transfer moves one disk slot: it must be one host slot exactly. */
	if (disk_slot_bytes(p->disk) != p->host.slot_bytes)
		return atlas_errf(err, errlen, -EINVAL,
				  "kv_dir %s: the filesystem's alignment makes a block %zu bytes "
				  "on disk against %zu in memory", disk_dir,
				  disk_slot_bytes(p->disk), p->host.slot_bytes);
	return 0;
}

void seq_pool_tiers_free(struct seq_pool *p)
{
	if (p->disk)
		disk_tier_close(p->disk);
	host_pool_free(&p->host);
	free(p->moves);
	free(p->active);
	free(p->free_moves);
	free(p->staging_free);
	p->disk = NULL;
	p->moves = NULL;
	p->active = NULL;
	p->free_moves = NULL;
	p->staging_free = NULL;
}

static struct seq_move *move_new(struct seq_pool *p, struct seq *s, int block, bool up)
{
	const int i = p->free_moves[--p->n_free_moves];
	struct seq_move *m = &p->moves[i];
	*m = (struct seq_move){ .seq = s, .block = block, .up = up, .dev = -1, .host = -1,
				.disk = -1, .t0_ns = atlas_now_ns(), .active_pos = p->n_active };
	p->active[p->n_active++] = i;
	m->src = s->blocks[block].tier;
	s->blocks[block].moving = 1;
	s->blocks[block].move = i;
	s->n_moving++;
	return m;
}

static void move_free(struct seq_pool *p, struct seq_move *m)
{
	const int i = (int)(m - p->moves), last = p->active[--p->n_active];
	p->active[m->active_pos] = last;
	p->moves[last].active_pos = m->active_pos;
	m->active_pos = -1;
	p->free_moves[p->n_free_moves++] = i;
}

static void free_host(struct seq_pool *p, struct seq_move *m)
{
	if (m->staging)
		p->staging_free[p->n_staging_free++] = m->host;
	else
		host_slot_free(&p->host, m->host);
	m->host = -1;
}

/* Give back what m holds: all but its source (which its sequence owns), or
 * with_source everything (an orphaned move, a lost block). */
static void release(struct seq_pool *p, struct seq_move *m, bool with_source)
{
	if (m->dev >= 0 && (with_source || m->src != KV_TIER_DEVICE))
		kv_block_unref(&p->kv, m->dev);
	if (m->host >= 0 && (with_source || m->src != KV_TIER_HOST || m->staging))
		free_host(p, m);
	if (m->disk >= 0 && (with_source || m->src != KV_TIER_DISK))
		disk_slot_free(p->disk, m->disk);
}

/* The move is over; the block's ref says where it is, or with moved_to >= 0
 * it is now at that tier and index. */
static void settle(struct seq_pool *p, struct seq_move *m, int moved_to, int index)
{
	if (m->seq) {
		struct kv_ref *r = &m->seq->blocks[m->block];
		r->moving = 0;
		if (moved_to >= 0) {
			r->tier = (uint8_t)moved_to;
			r->index = (uint32_t)index;
		}
		m->seq->n_moving--;
	}
	if (!m->up && m->src == KV_TIER_DEVICE)
		p->dev_freeing--;
	move_free(p, m);
}

/* The move failed or was orphaned: the block stays at its source. */
static void end_keeping_source(struct seq_pool *p, struct seq_move *m, int rc)
{
	release(p, m, !m->seq);
	if (m->seq && rc) {
		m->seq->move_error = rc;
		p->swap.errors++;
		log_warn("kv: moving a block %s failed (%s); it stays where it was",
			 m->up ? "back to the device" : "out of the device", strerror(-rc));
	}
	settle(p, m, -1, 0);
}

/* The block is at its destination: its source and any staging slot go. */
static void finish(struct seq_pool *p, struct seq_move *m)
{
	const size_t bytes = (size_t)p->kv.bytes_per_block;
	if (!m->seq) {
		end_keeping_source(p, m, 0);
		return;
	}
	int tier = KV_TIER_DEVICE, index = m->dev;
	if (m->up && m->dev < 0) {
		tier = KV_TIER_HOST;
		index = m->host;
	} else if (!m->up) {
		tier = m->to_disk ? KV_TIER_DISK : KV_TIER_HOST;
		index = m->to_disk ? m->disk : m->host;
	}
	if (m->up) {
		p->swap.in_bytes += bytes;
		p->swap.in_ops++;
	} else {
		p->swap.out_bytes += bytes;
		p->swap.out_ops++;
	}
	if (m->src == KV_TIER_DEVICE)
		kv_block_unref(&p->kv, m->dev);
	else if (m->src == KV_TIER_HOST)
		free_host(p, m);
	else
		disk_slot_free(p->disk, m->disk);
	if (m->staging && m->host >= 0)
		free_host(p, m);
	settle(p, m, tier, index);
}

/* A read from disk failed: the block's data is gone. */
static void lose(struct seq_pool *p, struct seq_move *m, int rc)
{
	if (m->seq) {
		m->seq->lost = rc;
		p->swap.lost++;
		log_error("kv: reading a block back from disk failed (%s)", strerror(-rc));
	}
	release(p, m, true);
	settle(p, m, -1, 0);
}

static int start_copy(struct seq_pool *p, struct seq_move *m)
{
	const struct kt_tensor *pool = &p->kv.blocks;
	return kt_copy_async(p->kv.be, host_slot(&p->host, m->host), pool,
			     dev_offset(&p->kv, m->dev), (size_t)p->kv.bytes_per_block, !m->up,
			     &m->ticket);
}

static int start_io(struct seq_pool *p, struct seq_move *m)
{
	const uint64_t tag = (uint64_t)(m - p->moves);
	void *host = host_slot(&p->host, m->host);
	m->io_done = 0;
	return m->up ? disk_submit_read(p->disk, m->disk, host, tag)
		     : disk_submit_write(p->disk, m->disk, host, tag);
}

/* Take m as far as it can go now; true when it ended. */
static bool advance(struct seq_pool *p, struct seq_move *m)
{
	int rc;
	for (;;) {
		switch (m->stage) {
		case NEED_STAGING:
			if (!p->n_staging_free)
				return false;
			m->host = p->staging_free[--p->n_staging_free];
			m->staging = 1;
			m->stage = m->up ? START_IO : START_COPY;
			break;
		case START_COPY:
			if ((rc = start_copy(p, m)) == -EAGAIN)
				return false;
			if (rc) {
				end_keeping_source(p, m, rc);
				return true;
			}
			m->stage = COPYING;
			break;
		case COPYING:
			if ((rc = kt_copy_done(p->kv.be, m->ticket)) == 0)
				return false;
			if (rc < 0) {
				end_keeping_source(p, m, rc);
				return true;
			}
			if (!m->up && m->to_disk) {
				m->stage = START_IO;
				break;
			}
			finish(p, m);
			return true;
		case START_IO:
			if ((rc = start_io(p, m)) == -EAGAIN)
				return false;
			if (rc) {
				end_keeping_source(p, m, rc);
				return true;
			}
			m->stage = IO;
			break;
		case IO:
			if (!m->io_done)
				return false;
			if (m->io_result < 0) {
				if (m->up)
					lose(p, m, m->io_result);
				else
					end_keeping_source(p, m, m->io_result);
				return true;
			}
			if (m->up && m->dev >= 0) {
				m->stage = START_COPY;
				break;
			}
			finish(p, m);
			return true;
		}
	}
}

int seq_pool_poll(struct seq_pool *p)
{
	int ended = 0;
	if (p->disk)
		disk_poll(p->disk, on_io, p);
	/* Walk from the end: an ended move swaps the last one into its place. */
	for (int i = p->n_active - 1; i >= 0; i--)
		if (i < p->n_active)
			ended += advance(p, &p->moves[p->active[i]]);
	return ended;
}

static bool movable(const struct seq_pool *p, const struct kv_ref *r)
{
	return !r->moving && (r->tier != KV_TIER_DEVICE || p->kv.refs[r->index] == 1);
}

/* Copy s's recurrent state to host memory and free its slots: 1 if it did. */
static int park_state(struct seq_pool *p, struct seq *s)
{
	if (!p->state.n_layers || s->state_slot < 0 || s->state_host)
		return 0;
	float *h = malloc((size_t)p->state.n_layers * (size_t)p->state.floats * sizeof *h);
	if (!h || state_slot_save(&p->state, s->state_slot, h)) {
		free(h);
		return 0;
	}
	state_slot_free(&p->state, s->state_slot);
	seq_forget_snapshot(p, s);
	s->state_slot = -1;
	s->state_host = h;
	return 1;
}

int seq_park(struct seq_pool *p, struct seq *s)
{
	if (!p->moves)
		return 0;
	int started = park_state(p, s);
	for (int b = 0; b < s->n_blocks && p->n_free_moves; b++) {
		struct kv_ref *r = &s->blocks[b];
		if (r->tier != KV_TIER_DEVICE || !movable(p, r))
			continue;
		int host = host_slot_alloc(&p->host), disk = -1;
		if (host < 0 && (!p->disk || (disk = disk_slot_alloc(p->disk)) < 0))
			break;
		struct seq_move *m = move_new(p, s, b, false);
		m->dev = (int)r->index;
		m->host = host;
		m->disk = disk;
		m->to_disk = host < 0;
		m->stage = host < 0 ? NEED_STAGING : START_COPY;
		p->dev_freeing++;
		started++;
		advance(p, m);
	}
	return started;
}

int seq_demote(struct seq_pool *p, struct seq *s)
{
	int started = 0;
	if (!p->disk)
		return 0;
	for (int b = 0; b < s->n_blocks && p->n_free_moves; b++) {
		struct kv_ref *r = &s->blocks[b];
		if (r->tier != KV_TIER_HOST || r->moving)
			continue;
		int disk = disk_slot_alloc(p->disk);
		if (disk < 0)
			break;
		struct seq_move *m = move_new(p, s, b, false);
		m->host = (int)r->index;
		m->disk = disk;
		m->to_disk = 1;
		m->stage = START_IO;
		started++;
		advance(p, m);
	}
	return started;
}

int seq_to_disk(struct seq_pool *p, struct seq *s, int n_tokens)
{
	const int n = ATLAS_MIN(p->kv.n_layers ? kv_blocks_for(&p->kv, n_tokens) : 0, s->n_blocks);
	int started = 0, stuck = 0;
	if (!p->disk)
		return n ? -ENOSPC : 0;
	for (int b = 0; b < n && p->n_free_moves; b++) {
		struct kv_ref *r = &s->blocks[b];
		if (r->moving || r->tier == KV_TIER_DISK)
			continue;
		if (!movable(p, r)) {
			stuck++;
			continue;
		}
		const int disk = disk_slot_alloc(p->disk);
		if (disk < 0) {
			stuck++;
			break;
		}
		struct seq_move *m = move_new(p, s, b, false);
		m->disk = disk;
		m->to_disk = 1;
		if (r->tier == KV_TIER_HOST) {
			m->host = (int)r->index;
			m->stage = START_IO;
		} else {
			m->dev = (int)r->index;
			m->stage = NEED_STAGING;
			p->dev_freeing++;
		}
		started++;
		advance(p, m);
	}
	return stuck ? -ENOSPC : started;
}

int seq_disk_slots(const struct seq_pool *p, const struct seq *s, int n_tokens, uint32_t *slots,
		   uint64_t *sums)
{
	const int n = p->kv.n_layers ? kv_blocks_for(&p->kv, n_tokens) : 0;
	if (n > s->n_blocks)
		return -EINVAL;
	for (int b = 0; b < n; b++) {
		const struct kv_ref *r = &s->blocks[b];
		if (r->moving || r->tier != KV_TIER_DISK)
			return -EAGAIN;
		if (disk_slot_sum(p->disk, (int)r->index, &sums[b]))
			return -ENODATA;
		slots[b] = r->index;
	}
	return 0;
}

int seq_adopt_disk(struct seq_pool *p, struct seq *s, int n_tokens, const uint32_t *slots,
		   const uint64_t *sums, int n_blocks)
{
	if (!p->disk || !p->kv.n_layers || s->n_blocks || n_tokens <= 0 ||
	    n_blocks != kv_blocks_for(&p->kv, n_tokens))
		return -EINVAL;
	int rc = seq_table_grow(s, n_blocks);
	for (int b = 0; !rc && b < n_blocks; b++) {
		if ((rc = disk_slot_claim(p->disk, (int)slots[b], sums[b])))
			break;
		s->blocks[s->n_blocks++] = (struct kv_ref){ .tier = KV_TIER_DISK, .index = slots[b] };
	}
	if (rc) {
		for (int b = 0; b < s->n_blocks; b++)
			disk_slot_free(p->disk, (int)s->blocks[b].index);
		s->n_blocks = 0;
		return rc;
	}
	s->n_tokens = n_tokens;
	return 0;
}

bool seq_resident(const struct seq_pool *p, const struct seq *s, int n_tokens)
{
	const int n = p->kv.n_layers ? kv_blocks_for(&p->kv, n_tokens) : 0;
	for (int b = 0; b < n && b < s->n_blocks; b++)
		if (s->blocks[b].moving || s->blocks[b].tier != KV_TIER_DEVICE)
			return false;
	return true;
}

/* Block b of s, which restore wants at the device (device zone) or at
 * least on the host: still not readable there. */
static bool unreadable(const struct kv_ref *r, bool device_zone)
{
	if (device_zone)
		return r->moving || r->tier != KV_TIER_DEVICE;
	return r->tier == KV_TIER_DISK;
}

int seq_restore(struct seq_pool *p, struct seq *s, int n_tokens, int host_blocks)
{
	const int n = ATLAS_MIN(p->kv.n_layers ? kv_blocks_for(&p->kv, n_tokens) : 0, s->n_blocks);
	const int hb = ATLAS_MAX(0, ATLAS_MIN(host_blocks, n));
	int need_dev = 0, need_host = 0;
	for (int b = 0; b < n; b++) {
		const struct kv_ref *r = &s->blocks[b];
		if (r->moving)
			continue;
		if (b >= hb && r->tier != KV_TIER_DEVICE)
			need_dev++;
		else if (b < hb && r->tier == KV_TIER_DISK)
			need_host++;
	}
	if (need_dev > p->kv.n_free)
		return -ENOSPC;
	/* More blocks than moves can be in flight: the rest start in a later
	 * call, once some of these have ended. A block of the host prefix that
	 * finds no free host slot comes up to the device instead when the
	 * device has a block to spare (attention reads it there just as well);
	 * with neither, nothing would ever bring it up: -ENOSPC. */
	int start = p->n_free_moves, stuck = 0;
	for (int b = 0; b < n && (need_dev || need_host) && start > 0; b++) {
		struct kv_ref *r = &s->blocks[b];
		bool to_device = b >= hb;
		if (r->moving || r->tier == KV_TIER_DEVICE || (!to_device && r->tier == KV_TIER_HOST))
			continue;
		int host = -1;
		if (!to_device && (host = host_slot_alloc(&p->host)) < 0) {
			need_host--;
			if (p->kv.n_free <= need_dev) {
				stuck++;
				continue;
			}
			to_device = true;
		}
		start--;
		struct seq_move *m = move_new(p, s, b, true);
		if (to_device) {
			need_dev -= b >= hb;
			m->dev = kv_block_alloc(&p->kv);
		} else {
			need_host--;
			m->host = host;
		}
		if (r->tier == KV_TIER_HOST) {
			m->host = (int)r->index;
			m->stage = START_COPY;
		} else {
			m->disk = (int)r->index;
			m->stage = to_device ? NEED_STAGING : START_IO;
		}
		advance(p, m);
	}
	if (stuck)
		return -ENOSPC;
	/* Moves that could end at once (a cpu copy) have: count what is left. */
	int left = 0;
	for (int b = 0; b < n; b++)
		left += unreadable(&s->blocks[b], b >= hb);
	return left;
}

int seq_spill(struct seq_pool *p, struct seq *s, int n_blocks)
{
	int started = 0;
	if (!p->moves)
		return 0;
	for (int b = 0; b < ATLAS_MIN(n_blocks, s->n_blocks) && p->n_free_moves; b++) {
		struct kv_ref *r = &s->blocks[b];
		if (r->tier != KV_TIER_DEVICE || !movable(p, r))
			continue;
		const int host = host_slot_alloc(&p->host);
		if (host < 0)
			break;
		struct seq_move *m = move_new(p, s, b, false);
		m->dev = (int)r->index;
		m->host = host;
		m->stage = START_COPY;
		p->dev_freeing++;
		started++;
		advance(p, m);
	}
	return started;
}
