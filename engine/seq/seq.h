/* One sequence's state in the engine: paged KV blocks for the model's
 * attention layers and a fixed-size recurrent state slot for its linear-
 * attention layers, behind one API (DESIGN §7.3):
 *
 *   seq_reserve   room to append positions (allocates; copy-on-write)
 *   seq_truncate  forget positions from n on (rollback after speculation;
 *                 the recurrent state comes back from a snapshot)
 *   seq_snapshot  remember the recurrent state at the current position
 *   seq_fork      a new sequence that starts as a prefix of another: full
 *                 blocks shared, the partly filled one copied
 *   seq_resolve   the one way every attention path reads KV (DESIGN §4.2)
 *
 * A block is shared only while full and only read: sequences append, fork
 * shares whole blocks only, and seq_reserve copies a shared block before a
 * position in it is written again (after a truncate into it). So a partly
 * filled block is never shared (DESIGN §4.3).
 *
 * Positions [0, n_tokens) have their K/V (and state) written; the caller
 * advances n_tokens with seq_commit once a step that wrote them has run.
 *
 * Not thread-safe: the engine thread owns the pool (engine.lock held).
 */
#ifndef ATLAS_ENGINE_SEQ_H
#define ATLAS_ENGINE_SEQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/hss/host.h"
#include "engine/kv/kv.h"
#include "engine/model/model.h"
#include "kernels/backend.h"

/* Recurrent state slots: per linear-attention layer one tensor of n_slots
 * rows, a row being one sequence's state in that layer. */
struct state_pool {
	struct kt_backend *be;      /* not owned */
	int n_layers;               /* linear-attention layers; 0: the pool is empty */
	int64_t floats;             /* f32 values of one slot in one layer */
	int n_slots;
	struct kt_tensor *layers;   /* [n_layers], each [n_slots, floats] f32; owned */
	int32_t *free_ids;          /* [n_slots]: stack of free slots */
	int n_free;
	struct kv_journal *journal; /* NULL, or where state_slot_copy records its copies */
};

struct disk_tier;
struct seq;

/* One block on its way between tiers (move.c): what it holds until it ends
 * and where it is. A move whose sequence let the block go is orphaned (seq
 * NULL): it runs to its end and then frees everything it holds. */
struct seq_move {
	struct seq *seq;            /* owner, NULL once orphaned */
	int block;                  /* its index in seq->blocks */
	uint8_t up;                 /* toward the device, else away from it */
	uint8_t to_disk;            /* down: the block ends on disk */
	uint8_t stage;              /* enum move_stage (move.c) */
	uint8_t staging;            /* host is a staging slot, freed when the move ends */
	uint8_t src;                /* enum kv_tier of its source, which its sequence owns */
	int dev;                    /* device block: source (down) or destination (up), -1 none */
	int host;                   /* host slot or staging slot, -1 none */
	int disk;                   /* disk slot: destination (down) or source (up), -1 none */
	uint64_t ticket;            /* its device copy (kt_copy_async) */
	int io_result;              /* its disk I/O's result once io_done */
	uint8_t io_done;
	uint64_t t0_ns;             /* when it started, for read latencies */
	int active_pos;             /* its place in seq_pool.active, -1 when free */
};

/* Counters of the swap tier (ctl/kv). */
struct seq_swap_stats {
	uint64_t out_bytes, out_ops;    /* blocks moved away from the device, and to disk */
	uint64_t in_bytes, in_ops;      /* blocks moved toward the device, and from disk */
	uint64_t errors;                /* moves that failed (a write kept its source) */
	uint64_t lost;                  /* blocks lost to a failed read */
};

/* Everything the sequences of one model keep, in every tier. */
struct seq_pool {
	struct kv_pool kv;              /* the device tier */
	struct state_pool state;
	struct host_pool host;          /* the host tier; n_blocks 0: none */
	int32_t *staging_free;          /* [n_staging] free host slots kept for staging disk
					 * I/O, taken from the host pool at init */
	int n_staging, n_staging_free;
	struct disk_tier *disk;         /* the disk tier, NULL: none; owned */
	struct seq_move *moves;         /* [max_moves] */
	int max_moves;
	int *active;                    /* [max_moves] indices of moves in flight */
	int n_active;
	int32_t *free_moves;            /* [max_moves] stack */
	int n_free_moves;
	int dev_freeing;                /* device blocks that moves in flight will free */
	struct seq_swap_stats swap;
};

struct seq {
	struct kv_ref *blocks;      /* [cap] block table in position order; owned */
	int n_blocks, cap;
	int n_tokens;               /* positions whose K/V and state are written */
	int state_slot;             /* recurrent state after position n_tokens - 1, -1: none yet
				     * (or the model has no linear layers); undefined until the
				     * first step writes it, which starts from a zero state
				     * because its first position is 0 */
	int snap_slot;              /* a copy of the state taken at snap_pos, -1: none */
	float *state_host;          /* the state parked on the host by seq_park
				     * ([n_layers * floats], owned; state_slot is -1 then),
				     * NULL: none; seq_reserve brings it back */
	int snap_pos;
	int n_moving;               /* blocks with a move in flight */
	int lost;                   /* a block could not be read back: the negative errno;
				     * its owner must fail and release the sequence */
	int move_error;             /* the last move that failed and kept its source */
};

/* Recurrent state slots (state.c): the pool, a slot, and the copy of one
 * slot's state in every linear layer over another's. */
int state_pool_init(struct state_pool *p, struct kt_backend *be, int n_layers, int64_t floats,
		    int n_slots, char *err, size_t errlen);
void state_pool_free(struct state_pool *p);
int state_slot_alloc(struct state_pool *p);
void state_slot_free(struct state_pool *p, int slot);
int state_slot_copy(struct state_pool *p, int dst, int src);
/* A slot's state in every layer to host memory [n_layers * floats], and
 * back; synchronous (parking an idle sequence, not a step's work). */
int state_slot_save(struct state_pool *p, int slot, float *host);
int state_slot_load(struct state_pool *p, int slot, const float *host);

/* The pools of a model: KV blocks from kv_budget bytes for its attention
 * layers, state_slots recurrent slots when it has linear layers. */
int seq_pool_init(struct seq_pool *p, struct kt_backend *be, const struct model_config *mc,
		  int block_size, uint64_t kv_budget, int state_slots, char *err, size_t errlen);
void seq_pool_free(struct seq_pool *p);

/* An empty sequence (no allocation). */
void seq_init(struct seq *s);
/* Room for positions [0, n_tokens): blocks, a state slot, and a private copy
 * of a shared block that a position >= s->n_tokens falls in. All or
 * nothing: -ENOSPC leaves s unchanged. */
int seq_reserve(struct seq_pool *p, struct seq *s, int n_tokens);
/* Positions [0, n_tokens) are written (n_tokens within the reserved room). */
void seq_commit(struct seq *s, int n_tokens);
/* Forget positions [n_tokens, s->n_tokens): blocks past the new end are
 * dropped and the recurrent state is restored from the snapshot, which must
 * have been taken at n_tokens (-EINVAL otherwise, and nothing changes).
 * Truncating to 0 releases everything. */
int seq_truncate(struct seq_pool *p, struct seq *s, int n_tokens);
/* Copy the recurrent state aside, tagged with s->n_tokens; a no-op for a
 * model without linear layers. -ENOSPC when no slot is free. */
int seq_snapshot(struct seq_pool *p, struct seq *s);
/* Give the snapshot's slot back (none: a no-op): a verify is settled. */
void seq_forget_snapshot(struct seq_pool *p, struct seq *s);
/* Make empty dst the first n_tokens positions of src: src's full blocks
 * shared, the partly filled one copied into a block of dst's own, the
 * recurrent state copied from src's current state (n_tokens == src->n_tokens)
 * or its snapshot (n_tokens == src->snap_pos), else -EINVAL. All or nothing. */
int seq_fork(struct seq_pool *p, struct seq *dst, const struct seq *src, int n_tokens);
/* Drop every block and slot; the sequence is empty and keeps its table memory. */
void seq_release(struct seq_pool *p, struct seq *s);
/* Release and free the table. */
void seq_free(struct seq_pool *p, struct seq *s);

/* The one way to read KV: the blocks that hold positions [0, n_tokens), in
 * position order, into ids: a device block id, or KV_HOST_ID(slot) for a
 * block on the host tier that holds only written positions (attention
 * streams it through staging; a step never writes it). Returns the number
 * of blocks, -EAGAIN when one of them is on disk, or on the host but not
 * yet written (the caller defers the sequence until it is restored),
 * -E2BIG when more than max_ids, -EINVAL when the sequence has no room for
 * n_tokens. */
int seq_resolve(const struct seq_pool *p, const struct seq *s, int n_tokens, int32_t *ids,
		int max_ids);
/* Room for cap entries in s's block table (move.c fills one too). */
int seq_table_grow(struct seq *s, int cap);

/* Blocks of s per tier. */
void seq_count(const struct seq *s, uint32_t counts[KV_TIERS]);

/* ---- moves between tiers (move.c) ---- */

/* The host tier (host_bytes of host memory; 0: none) and the disk tier
 * (disk_bytes in disk_dir; "" or 0: none), after seq_pool_init. The disk
 * tier's file is unnamed, or disk_dir/disk_file kept as it is (persistence,
 * disk.h). */
int seq_pool_tiers(struct seq_pool *p, uint64_t host_bytes, const char *disk_dir,
		   const char *disk_file, uint64_t disk_bytes, void (*wake)(void *ctx),
		   void *wake_ctx, char *err, size_t errlen);
/* Start moving s's device blocks away (to host slots, or through staging to
 * disk when the host tier is full); blocks shared with another sequence
 * stay. The device blocks are free once the moves end. A recurrent state
 * is copied to host memory and its slot freed at once (seq_reserve brings
 * it back). Returns the number of blocks started plus one for a parked
 * state, 0 when nothing could move. */
int seq_park(struct seq_pool *p, struct seq *s);
/* Start writing s's blocks in host slots to disk; returns the number started. */
int seq_demote(struct seq_pool *p, struct seq *s);
/* Start moving every block of s that holds one of positions [0, n_tokens)
 * and is not on disk yet there (device blocks through staging); the number
 * started, or -ENOSPC when a block finds no disk slot or is shared with
 * another sequence (the others start). Call again as moves end: 0 with
 * n_moving 0 means every one is on disk. */
int seq_to_disk(struct seq_pool *p, struct seq *s, int n_tokens);
/* Where the blocks of positions [0, n_tokens) are on disk: their slots and
 * the hashes of their data (each [kv_blocks_for(n_tokens)]); -EAGAIN when
 * one is elsewhere or moving, -ENODATA when a hash is unknown. */
int seq_disk_slots(const struct seq_pool *p, const struct seq *s, int n_tokens, uint32_t *slots,
		   uint64_t *sums);
/* An empty s takes n_blocks blocks that a previous process left in the
 * disk tier's named file, holding positions [0, n_tokens): it claims their
 * slots with their hashes (a read checks the data against them). Nothing is
 * claimed on failure: -ERANGE or -EEXIST (disk_slot_claim), -EINVAL when
 * n_blocks is not what n_tokens needs, -ENOMEM. */
int seq_adopt_disk(struct seq_pool *p, struct seq *s, int n_tokens, const uint32_t *slots,
		   const uint64_t *sums, int n_blocks);
/* Bring the blocks holding positions [0, n_tokens) back where a step can
 * read them: the first host_blocks at least to the host tier (from disk;
 * to the device when the host tier has no free slot), the rest to the
 * device. -ENOSPC when the device has not room for all that go there
 * (nothing starts then), or when a block finds room on neither tier (the
 * others' moves start). Else their moves start, as many as can be in
 * flight (the rest at a later call). Returns 0 when every one is readable,
 * else the number still on their way or waiting to start. */
int seq_restore(struct seq_pool *p, struct seq *s, int n_tokens, int host_blocks);
/* Start moving s's device blocks among its first n_blocks to the host tier
 * (never to disk), oldest first, as far as host slots last; they stay
 * readable on the device until the moves end. Returns the number started. */
int seq_spill(struct seq_pool *p, struct seq *s, int n_blocks);
/* Whether the blocks holding positions [0, n_tokens) are all on the
 * device, none of them moving. */
bool seq_resident(const struct seq_pool *p, const struct seq *s, int n_tokens);
/* Advance the moves in flight (copies done, disk I/O completed, staging
 * freed); returns the number that ended. Never waits. */
int seq_pool_poll(struct seq_pool *p);
/* Free the tiers (seq_pool_free does). Every sequence must be released. */
void seq_pool_tiers_free(struct seq_pool *p);

#endif
