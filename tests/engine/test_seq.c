/* The sequence state (engine/seq/seq.h) on the cpu backend, with a model
 * shape that has both kinds of mixer (two attention layers, two linear
 * ones), so that every path of the API runs before its users exist:
 * reserve and release, resolve (and its refusal of blocks off the device),
 * fork with a copied partial block, copy-on-write after a truncate into a
 * shared block, truncate with the recurrent state restored from a snapshot.
 * The data in the caches and state slots is checked, not only the tables. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/err.h"
#include "engine_testutil.h"
#include "engine/seq/seq.h"

#define BLOCK 16
#define COLS 8          /* 2 kv heads x head_dim 4 */
#define STATE 8         /* floats of one state slot in one linear layer */


/* Layers 0 and 2 attention, 1 and 3 linear (with_state), or 2 attention only. */
static struct model_config shape(bool with_state)
{
	struct model_config mc = { .n_kv_heads = 2, .head_dim = 4 };
	mc.n_attention_layers = 2;
	if (with_state) {
		mc.n_linear_layers = 2;
		mc.linear_state_floats = STATE;
	}
	return mc;
}

/* 2 attention layers x 16 positions x 8 cols x f32 x (K+V) = 2048 bytes a block. */
static void pool(struct seq_pool *p, int blocks, bool with_state, int slots)
{
	char err[ATLAS_ERRLEN];
	struct model_config mc = shape(with_state);
	assert_int_equal(seq_pool_init(p, et_cpu(), &mc, BLOCK, (uint64_t)blocks * 2048, slots, err,
				       sizeof err), 0);
	assert_int_equal(p->kv.bytes_per_block, 2048);
	assert_int_equal(p->kv.n_blocks, blocks);
	assert_int_equal(p->kv.block_rows, 2 * 2 * BLOCK);
	assert_int_equal(p->state.n_slots, with_state ? slots : 0);
}

/* Through the views the kernels address (layer l's K or V rows of block b
 * at row b * block_rows of k[l] or v[l]), write v + e into element e of
 * block b as the layout orders it: layer 0 K, layer 0 V, layer 1 K, ... */
static void fill_block(struct seq_pool *p, int b, float v)
{
	float rows[BLOCK * COLS];
	size_t off = (size_t)b * (size_t)p->kv.block_rows * COLS * sizeof(float);
	for (int l = 0; l < p->kv.n_layers; l++) {
		const struct kt_tensor *t[2] = { &p->kv.k[l], &p->kv.v[l] };
		for (int i = 0; i < 2; i++) {
			for (int j = 0; j < BLOCK * COLS; j++)
				rows[j] = v + (float)((2 * l + i) * BLOCK * COLS + j);
			assert_int_equal(kt_upload(et_cpu(), t[i], off, rows, sizeof rows), 0);
		}
	}
}

/* Block b holds what fill_block(b, v) wrote, as one contiguous region of
 * the pool's allocation. */
static void assert_block(struct seq_pool *p, int b, float v)
{
	float rows[2 * 2 * BLOCK * COLS];
	size_t bytes = (size_t)p->kv.block_rows * COLS * sizeof(float);
	assert_true(bytes == sizeof rows);
	assert_int_equal(kt_download(et_cpu(), rows, &p->kv.blocks, (size_t)b * bytes, bytes), 0);
	for (size_t e = 0; e < sizeof rows / sizeof *rows; e++)
		assert_true(rows[e] == v + (float)e);
}

static void set_state(struct seq_pool *p, int slot, float v)
{
	float x[STATE];
	for (int i = 0; i < STATE; i++)
		x[i] = v * (float)(i + 1);
	for (int l = 0; l < p->state.n_layers; l++)
		assert_int_equal(kt_upload(et_cpu(), &p->state.layers[l],
					   (size_t)slot * sizeof x, x, sizeof x), 0);
}

static void assert_state(struct seq_pool *p, int slot, float v)
{
	float x[STATE];
	for (int l = 0; l < p->state.n_layers; l++) {
		assert_int_equal(kt_download(et_cpu(), x, &p->state.layers[l],
					     (size_t)slot * sizeof x, sizeof x), 0);
		for (int i = 0; i < STATE; i++)
			assert_true(x[i] == v * (float)(i + 1));
	}
}

static void test_reserve_and_release(void **state)
{
	struct seq_pool p;
	pool(&p, 8, false, 0);
	struct seq a, b;
	seq_init(&a);
	seq_init(&b);
	assert_int_equal(seq_reserve(&p, &a, 1), 0);
	assert_int_equal(a.n_blocks, 1);
	assert_int_equal(a.state_slot, -1);
	assert_int_equal(seq_reserve(&p, &a, 16), 0);
	assert_int_equal(a.n_blocks, 1);
	assert_int_equal(seq_reserve(&p, &a, 17), 0);
	assert_int_equal(a.n_blocks, 2);
	assert_int_equal(seq_reserve(&p, &b, 6 * 16), 0);
	assert_int_equal(p.kv.n_free, 0);
	/* All or nothing: a failing reservation changes neither table nor pool. */
	assert_int_equal(seq_reserve(&p, &a, 3 * 16), -ENOSPC);
	assert_int_equal(a.n_blocks, 2);
	assert_int_equal(p.kv.n_free, 0);

	/* Every block is held by exactly one sequence, none twice. */
	int seen[8] = { 0 };
	int32_t ids[8];
	int n = seq_resolve(&p, &a, 17, ids, 8);
	assert_int_equal(n, 2);
	for (int i = 0; i < n; i++)
		seen[ids[i]]++;
	n = seq_resolve(&p, &b, 96, ids, 8);
	assert_int_equal(n, 6);
	for (int i = 0; i < n; i++)
		seen[ids[i]]++;
	for (int i = 0; i < 8; i++)
		assert_int_equal(seen[i], 1);
	/* Resolving fewer positions gives the blocks that hold them. */
	assert_int_equal(seq_resolve(&p, &b, 17, ids, 8), 2);
	assert_int_equal(seq_resolve(&p, &b, 96, ids, 5), -E2BIG);
	assert_int_equal(seq_resolve(&p, &a, 33, ids, 8), -EINVAL);

	seq_release(&p, &b);
	assert_int_equal(p.kv.n_free, 6);
	assert_int_equal(seq_reserve(&p, &a, 8 * 16), 0);
	assert_int_equal(p.kv.n_free, 0);
	seq_free(&p, &a);
	seq_free(&p, &b);
	assert_int_equal(p.kv.n_free, 8);
	seq_pool_free(&p);
}

static void test_budget_too_small(void **state)
{
	struct seq_pool p;
	struct model_config mc = shape(false);
	char err[ATLAS_ERRLEN] = "";
	assert_int_equal(seq_pool_init(&p, et_cpu(), &mc, BLOCK, 1000, 0, err, sizeof err), -ENOMEM);
	assert_non_null(strstr(err, "kv_memory"));
}

/* The one resolve function refuses a block that is not on the device:
 * the scheduler defers the sequence instead of running on stale ids. */
static void test_resolve_refuses_other_tiers(void **state)
{
	struct seq_pool p;
	pool(&p, 4, false, 0);
	struct seq a;
	seq_init(&a);
	assert_int_equal(seq_reserve(&p, &a, 33), 0);
	uint32_t c[KV_TIERS];
	seq_count(&a, c);
	assert_int_equal(c[KV_TIER_DEVICE], 3);
	assert_int_equal(c[KV_TIER_HOST], 0);
	assert_int_equal(c[KV_TIER_DISK], 0);
	a.blocks[1].tier = KV_TIER_HOST;
	seq_count(&a, c);
	assert_int_equal(c[KV_TIER_HOST], 1);
	int32_t ids[4];
	assert_int_equal(seq_resolve(&p, &a, 33, ids, 4), -EAGAIN);
	assert_int_equal(seq_resolve(&p, &a, 16, ids, 4), 1);   /* block 0 alone is resident */
	a.blocks[1].tier = KV_TIER_DEVICE;
	assert_int_equal(seq_resolve(&p, &a, 33, ids, 4), 3);
	seq_free(&p, &a);
	seq_pool_free(&p);
}

/* A fork shares the full blocks and copies the partial one; each side
 * then writes only blocks of its own. */
static void test_fork_shares_full_blocks_only(void **state)
{
	struct seq_pool p;
	pool(&p, 8, false, 0);
	struct seq a, b;
	seq_init(&a);
	seq_init(&b);
	assert_int_equal(seq_reserve(&p, &a, 40), 0);  /* 3 blocks, the last partial */
	seq_commit(&a, 40);
	for (int i = 0; i < 3; i++)
		fill_block(&p, (int)a.blocks[i].index, 1000.0f * (float)(i + 1));
	assert_int_equal(seq_fork(&p, &b, &a, 40), 0);
	assert_int_equal(b.n_blocks, 3);
	assert_int_equal(b.n_tokens, 40);
	assert_int_equal(p.kv.n_free, 4);
	int32_t ia[8], ib[8];
	assert_int_equal(seq_resolve(&p, &a, 40, ia, 8), 3);
	assert_int_equal(seq_resolve(&p, &b, 40, ib, 8), 3);
	assert_int_equal(ia[0], ib[0]);
	assert_int_equal(ia[1], ib[1]);
	assert_int_not_equal(ia[2], ib[2]);            /* the partial block is b's own copy */
	assert_int_equal(p.kv.refs[ia[0]], 2);
	assert_int_equal(p.kv.refs[ia[2]], 1);
	assert_block(&p, ib[2], 3000.0f);
	/* Both append in their own partial blocks: no copy needed. */
	assert_int_equal(seq_reserve(&p, &a, 41), 0);
	assert_int_equal(seq_reserve(&p, &b, 41), 0);
	assert_int_equal(p.kv.n_free, 4);
	/* A fork of a whole-block prefix shares everything it takes. */
	struct seq c;
	seq_init(&c);
	assert_int_equal(seq_fork(&p, &c, &a, 32), 0);
	assert_int_equal(c.n_blocks, 2);
	assert_int_equal(p.kv.n_free, 4);
	assert_int_equal(p.kv.refs[ia[1]], 3);
	/* A fork needs an empty destination and a prefix of the source. */
	assert_int_equal(seq_fork(&p, &c, &a, 16), -EINVAL);
	struct seq d;
	seq_init(&d);
	assert_int_equal(seq_fork(&p, &d, &a, 41), -EINVAL);
	/* Releasing a keeps the shared blocks alive for b and c. */
	seq_release(&p, &a);
	assert_int_equal(p.kv.refs[ib[0]], 2);
	assert_block(&p, ib[0], 1000.0f);
	seq_free(&p, &a);
	seq_free(&p, &b);
	seq_free(&p, &c);
	assert_int_equal(p.kv.n_free, 8);
	seq_pool_free(&p);
}

/* After a truncate into a shared block, the next reservation gives the
 * sequence a private copy before anything is written there again. */
static void test_truncate_into_shared_block_copies_on_write(void **state)
{
	struct seq_pool p;
	pool(&p, 8, false, 0);
	struct seq a, b;
	seq_init(&a);
	seq_init(&b);
	assert_int_equal(seq_reserve(&p, &a, 48), 0);
	seq_commit(&a, 48);
	for (int i = 0; i < 3; i++)
		fill_block(&p, (int)a.blocks[i].index, 100.0f * (float)(i + 1));
	assert_int_equal(seq_fork(&p, &b, &a, 48), 0);  /* all three shared */
	assert_int_equal(p.kv.n_free, 5);
	const int shared = (int)a.blocks[1].index;

	/* b rolls back into its second block: the blocks past it go... */
	assert_int_equal(seq_truncate(&p, &b, 20), 0);
	assert_int_equal(b.n_blocks, 2);
	assert_int_equal(b.n_tokens, 20);
	assert_int_equal(p.kv.refs[a.blocks[2].index], 1);
	/* ...and the block it will write in is copied, not written in place. */
	assert_int_equal(seq_reserve(&p, &b, 21), 0);
	assert_int_not_equal((int)b.blocks[1].index, shared);
	assert_int_equal(p.kv.refs[shared], 1);
	assert_block(&p, (int)b.blocks[1].index, 200.0f);
	fill_block(&p, (int)b.blocks[1].index, -5.0f);       /* b writes its copy */
	assert_block(&p, shared, 200.0f);                    /* a's data is untouched */
	assert_int_equal((int)b.blocks[0].index, (int)a.blocks[0].index);
	/* Out of blocks, the copy fails whole. */
	struct seq c;
	seq_init(&c);
	assert_int_equal(seq_fork(&p, &c, &a, 48), 0);
	assert_int_equal(seq_truncate(&p, &c, 8), 0);
	struct seq hog;
	seq_init(&hog);
	assert_int_equal(seq_reserve(&p, &hog, p.kv.n_free * BLOCK), 0);
	assert_int_equal(seq_reserve(&p, &c, 9), -ENOSPC);
	assert_int_equal((int)c.blocks[0].index, (int)a.blocks[0].index);
	assert_int_equal(seq_truncate(&p, &c, 9), -EINVAL);  /* past its end */
	seq_free(&p, &hog);
	seq_free(&p, &a);
	seq_free(&p, &b);
	seq_free(&p, &c);
	assert_int_equal(p.kv.n_free, 8);
	seq_pool_free(&p);
}

/* With linear layers: a state slot per sequence, snapshots, truncate
 * restoring the snapshot, fork copying the state. */
static void test_recurrent_state_snapshot_and_rollback(void **state)
{
	struct seq_pool p;
	pool(&p, 8, true, 4);
	struct seq a;
	seq_init(&a);
	assert_int_equal(seq_reserve(&p, &a, 10), 0);
	assert_true(a.state_slot >= 0);
	assert_int_equal(p.state.n_free, 3);
	seq_commit(&a, 10);
	set_state(&p, a.state_slot, 1.0f);
	/* Without a snapshot there is nothing to roll back to. */
	assert_int_equal(seq_truncate(&p, &a, 8), -EINVAL);
	assert_int_equal(a.n_tokens, 10);

	assert_int_equal(seq_snapshot(&p, &a), 0);        /* state at 10 aside */
	assert_int_equal(p.state.n_free, 2);
	assert_int_equal(seq_reserve(&p, &a, 14), 0);      /* a verify of 4 rows */
	seq_commit(&a, 14);
	set_state(&p, a.state_slot, 2.0f);
	assert_int_equal(seq_truncate(&p, &a, 12), -EINVAL); /* the snapshot is at 10 */
	assert_state(&p, a.state_slot, 2.0f);
	assert_int_equal(seq_truncate(&p, &a, 10), 0);
	assert_int_equal(a.n_tokens, 10);
	assert_state(&p, a.state_slot, 1.0f);

	/* A fork at the current position copies the current state; at the
	 * snapshot's position, the snapshot; anywhere else it cannot. */
	set_state(&p, a.state_slot, 3.0f);
	struct seq b, c, d;
	seq_init(&b);
	seq_init(&c);
	seq_init(&d);
	assert_int_equal(seq_fork(&p, &b, &a, 10), 0);
	assert_state(&p, b.state_slot, 3.0f);
	assert_int_equal(seq_fork(&p, &c, &a, 5), -EINVAL);
	assert_int_equal(p.state.n_free, 1);
	assert_int_equal(seq_fork(&p, &c, &b, 10), 0);
	assert_int_equal(p.state.n_free, 0);
	/* No slot left: the next sequence cannot start. */
	assert_int_equal(seq_reserve(&p, &d, 1), -ENOSPC);
	assert_int_equal(d.n_blocks, 0);
	/* Truncating to 0 gives everything back. */
	assert_int_equal(seq_truncate(&p, &a, 0), 0);
	assert_int_equal(a.state_slot, -1);
	assert_int_equal(a.snap_slot, -1);
	assert_int_equal(p.state.n_free, 2);
	seq_free(&p, &a);
	seq_free(&p, &b);
	seq_free(&p, &c);
	seq_free(&p, &d);
	assert_int_equal(p.state.n_free, 4);
	assert_int_equal(p.kv.n_free, 8);
	seq_pool_free(&p);
}

/* Without linear layers a snapshot is free and truncate needs none. */
static void test_attention_only_truncate_needs_no_snapshot(void **state)
{
	struct seq_pool p;
	pool(&p, 4, false, 0);
	struct seq a;
	seq_init(&a);
	assert_int_equal(seq_reserve(&p, &a, 40), 0);
	seq_commit(&a, 40);
	assert_int_equal(seq_snapshot(&p, &a), 0);
	assert_int_equal(a.snap_slot, -1);
	assert_int_equal(seq_truncate(&p, &a, 17), 0);
	assert_int_equal(a.n_blocks, 2);
	assert_int_equal(p.kv.n_free, 2);
	seq_free(&p, &a);
	seq_pool_free(&p);
}

/* A sequence longer than the moves that can be in flight at once goes to
 * the host tier and comes back in waves, every block's data intact, and a
 * restore that the device has no room for starts nothing. */
static void test_park_and_restore_in_waves(void **state)
{
	enum { N = 1300 };
	struct seq_pool p;
	char err[ATLAS_ERRLEN];
	pool(&p, N + 10, false, 0);
	assert_int_equal(seq_pool_tiers(&p, (uint64_t)(N + 10) * 4096, NULL, NULL, 0, NULL, NULL, err,
					sizeof err), 0);
	struct seq a;
	seq_init(&a);
	assert_int_equal(seq_reserve(&p, &a, N * BLOCK), 0);
	seq_commit(&a, N * BLOCK);
	for (int b = 0; b < N; b++)
		fill_block(&p, (int)a.blocks[b].index, (float)(b * 1000));
	/* Out: a call starts as many moves as can be in flight (on the cpu each
	 * ends at once, making room for the next). */
	int calls = 0;
	while (seq_resident(&p, &a, 1) || a.n_moving) {
		seq_park(&p, &a);
		seq_pool_poll(&p);
		calls++;
		assert_true(calls < 10);
	}
	uint32_t c[KV_TIERS];
	seq_count(&a, c);
	assert_int_equal(c[KV_TIER_HOST], N);
	assert_int_equal(p.kv.n_free, N + 10);
	/* No room on the device for all of it: nothing starts. */
	struct seq hog;
	seq_init(&hog);
	assert_int_equal(seq_reserve(&p, &hog, 20 * BLOCK), 0);
	assert_int_equal(seq_restore(&p, &a, N * BLOCK, 0), -ENOSPC);
	seq_count(&a, c);
	assert_int_equal(c[KV_TIER_HOST], N);
	seq_free(&p, &hog);
	/* Back: in waves, onto other device blocks, the data as it was. */
	calls = 0;
	int left;
	while ((left = seq_restore(&p, &a, N * BLOCK, 0)) > 0) {
		seq_pool_poll(&p);
		assert_true(++calls < 10);
	}
	assert_int_equal(left, 0);
	assert_true(calls >= 1);        /* more than one wave */
	assert_true(seq_resident(&p, &a, N * BLOCK));
	for (int b = 0; b < N; b++)
		assert_block(&p, (int)a.blocks[b].index, (float)(b * 1000));
	assert_int_equal(p.swap.out_ops, N);
	assert_int_equal(p.swap.in_ops, N);
	seq_free(&p, &a);
	assert_int_equal(p.host.n_free, p.host.n_blocks);
	seq_pool_free(&p);
}

/* Poll until s has no block on the move (disk I/O ends on its own thread). */
static void settle_moves(struct seq_pool *p, struct seq *s)
{
	for (int i = 0; s->n_moving && i < 5000; i++) {
		seq_pool_poll(p);
		usleep(1000);
	}
	assert_int_equal(s->n_moving, 0);
}

/* A block of the host prefix that is on disk while the host tier is full
 * comes up to the device instead, its data intact; with the device full
 * too, the restore says -ENOSPC instead of waiting for a slot nothing
 * would free (a scheduler that waited there hung). */
static void test_restore_past_a_full_host_tier(void **state)
{
	struct seq_pool p;
	char err[ATLAS_ERRLEN], dir[] = "/tmp/atlas-test-seq-XXXXXX";
	assert_non_null(mkdtemp(dir));
	pool(&p, 4, false, 0);
	assert_int_equal(seq_pool_tiers(&p, 2 * 4096, dir, NULL, 16 * 4096, NULL, NULL, err, sizeof err),
			 0);
	assert_int_equal(p.host.n_free, 2);
	struct seq a, hog;
	seq_init(&a);
	seq_init(&hog);
	assert_int_equal(seq_reserve(&p, &a, 3 * BLOCK), 0);
	seq_commit(&a, 3 * BLOCK);
	for (int b = 0; b < 3; b++)
		fill_block(&p, (int)a.blocks[b].index, (float)(b * 1000));
	/* Out: two blocks fill the host tier, the third goes to disk. */
	assert_int_equal(seq_park(&p, &a), 3);
	settle_moves(&p, &a);
	uint32_t c[KV_TIERS];
	seq_count(&a, c);
	assert_int_equal(c[KV_TIER_HOST], 2);
	assert_int_equal(c[KV_TIER_DISK], 1);
	assert_int_equal(p.host.n_free, 0);
	/* Every block on the host prefix: the one on disk finds no host slot. */
	int left = seq_restore(&p, &a, 3 * BLOCK, 3);
	assert_true(left > 0);
	settle_moves(&p, &a);
	assert_int_equal(seq_restore(&p, &a, 3 * BLOCK, 3), 0);
	assert_int_equal(a.blocks[2].tier, KV_TIER_DEVICE);
	assert_block(&p, (int)a.blocks[2].index, 2000.0f);
	/* Again with the device full: nothing can take it. */
	assert_int_equal(seq_park(&p, &a), 1);
	settle_moves(&p, &a);
	assert_int_equal(a.blocks[2].tier, KV_TIER_DISK);
	assert_int_equal(seq_reserve(&p, &hog, 4 * BLOCK), 0);
	assert_int_equal(seq_restore(&p, &a, 3 * BLOCK, 3), -ENOSPC);
	assert_int_equal(a.n_moving, 0);
	seq_free(&p, &hog);
	seq_free(&p, &a);
	seq_pool_free(&p);
	rmdir(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reserve_and_release),
		cmocka_unit_test(test_budget_too_small),
		cmocka_unit_test(test_resolve_refuses_other_tiers),
		cmocka_unit_test(test_fork_shares_full_blocks_only),
		cmocka_unit_test(test_truncate_into_shared_block_copies_on_write),
		cmocka_unit_test(test_recurrent_state_snapshot_and_rollback),
		cmocka_unit_test(test_attention_only_truncate_needs_no_snapshot),
		cmocka_unit_test(test_park_and_restore_in_waves),
		cmocka_unit_test(test_restore_past_a_full_host_tier),
	};
	return cmocka_run_group_tests_name("seq", tests, NULL, NULL);
}
