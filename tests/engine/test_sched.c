/* The scheduler (engine/sched/) alone, over a sequence pool and requests,
 * without a model or an executor: what it plans, in what order, and what
 * it tells the requests' owners. */
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
#include "engine/sched/rng.h"
#include "engine/sched/sched.h"

#define BLOCK 16
#define SLOTS 2

struct fixture {
	struct seq_pool pool;
	struct sched s;
	struct step_cmd cmd;
	struct sched_req r[4];
};


/* A pool of `blocks` blocks (one attention layer, 8 cols: 1024 bytes each),
 * SLOTS session slots, 8 prefill rows a step, tools chunks of 4. */
static void setup(struct fixture *f, int blocks)
{
	struct model_config mc = { .n_attention_layers = 1, .n_kv_heads = 2, .head_dim = 4 };
	const struct step_limits lim = { .max_seqs = SLOTS, .max_rows = 8 + SLOTS, .max_out = 4,
					 .max_table = SLOTS * 16 };
	char err[ATLAS_ERRLEN];
	memset(f, 0, sizeof *f);
	assert_int_equal(seq_pool_init(&f->pool, et_cpu(), &mc, BLOCK, (uint64_t)blocks * 1024, 0,
				       err, sizeof err), 0);
	assert_int_equal(f->pool.kv.n_blocks, blocks);
	assert_int_equal(sched_init(&f->s, &f->pool, SLOTS, 8, 4, 16, SLOTS, 0), 0);
	assert_int_equal(step_cmd_alloc(&f->cmd, &lim), 0);
	for (int i = 0; i < 4; i++) {
		sched_req_init(&f->r[i]);
		sched_add(&f->s, &f->r[i]);
	}
}

static void teardown(struct fixture *f)
{
	for (int i = 0; i < 4; i++) {
		sched_remove(&f->s, &f->r[i]);
		seq_free(&f->pool, &f->r[i].seq);
		free(f->r[i].tokens);
	}
	step_cmd_free(&f->cmd);
	sched_free(&f->s);
	seq_pool_free(&f->pool);
}

/* Give request i n tokens (ids i*100 + k) and queue it. */
static void submit(struct fixture *f, int i, int n)
{
	for (int k = 0; k < n; k++) {
		int32_t id = i * 100 + (int)f->r[i].n_tokens;
		assert_int_equal(sched_req_append(&f->r[i], &id, 1), 0);
	}
	sched_queue(&f->s, &f->r[i]);
}

/* The token a step drew joins a running request, as the engine appends it. */
static void accept(struct fixture *f, int i)
{
	int32_t id = 7;
	assert_int_equal(sched_req_append(&f->r[i], &id, 1), 0);
}

/* Plan and pretend the step ran: its K/V counts as written. */
static int step(struct fixture *f)
{
	int n = sched_plan(&f->s, &f->cmd);
	if (n)
		sched_commit(&f->s, &f->cmd);
	return n;
}

static int count_events(const struct fixture *f, enum sched_event_kind kind,
			const struct sched_req *r)
{
	int n = 0;
	for (int i = 0; i < f->s.n_events; i++)
		n += f->s.events[i].kind == kind && f->s.events[i].req == r;
	return n;
}

/* FIFO admission into free slots; chunked prefill within the budget; the
 * row that reaches the last token samples with the position's number. */
static void test_admission_chunks_and_sampling(void **state)
{
	struct fixture f;
	setup(&f, 16);
	f.r[0].sampling = (struct sched_sampling){ .temperature = 0.7f, .top_p = 0.9f,
						   .top_k = 5, .seed = 3 };
	submit(&f, 0, 11);
	submit(&f, 1, 3);
	submit(&f, 2, 2);
	assert_int_equal(sched_plan(&f.s, &f.cmd), 1);
	assert_int_equal(count_events(&f, SCHED_ADMITTED, &f.r[0]), 1);
	assert_int_equal(count_events(&f, SCHED_ADMITTED, &f.r[1]), 1);
	assert_int_equal(f.r[2].phase, REQ_QUEUED);      /* two slots */
	/* The oldest takes the whole budget of 8 rows; nothing wants logits yet. */
	assert_int_equal(f.cmd.seqs[0].slot, f.r[0].slot);
	assert_int_equal(f.cmd.seqs[0].n_rows, 8);
	assert_int_equal(f.cmd.n_out, 0);
	assert_int_equal(f.cmd.ids[7], 7);
	assert_int_equal(f.cmd.number, 1);
	sched_commit(&f.s, &f.cmd);

	/* Then the rest of r0 (3 rows, the last samples) and 3 rows of r1. */
	assert_int_equal(sched_plan(&f.s, &f.cmd), 2);
	assert_int_equal(f.cmd.seqs[0].pos0, 8);
	assert_int_equal(f.cmd.seqs[0].n_rows, 3);
	assert_int_equal(f.cmd.seqs[1].n_rows, 3);
	assert_int_equal(f.cmd.n_out, 2);
	assert_int_equal(f.cmd.out[0].row, 2);
	assert_true(f.cmd.out[0].sample && !f.cmd.out[0].keep);
	assert_true(f.cmd.out[0].params.temperature == 0.7f && f.cmd.out[0].params.top_k == 5);
	assert_true(f.cmd.out[0].params.u == rng_uniform(3, 11));
	assert_int_equal(f.cmd.seqs[0].n_blocks, 1);
	sched_commit(&f.s, &f.cmd);
	assert_int_equal(f.r[0].seq.n_tokens, 11);

	/* Both decode now (one token each appended): decode rows come first and
	 * in admission order; r2 still waits. */
	accept(&f, 1);
	accept(&f, 0);
	assert_int_equal(sched_plan(&f.s, &f.cmd), 2);
	assert_int_equal(f.cmd.n_rows, 2);
	assert_int_equal(f.cmd.seqs[0].pos0, 11);
	assert_int_equal(f.cmd.seqs[1].pos0, 3);
	teardown(&f);
}

/* A request whose blocks are on their way between tiers sits the step out,
 * keeps its slot and runs again once they are back on the device: here its
 * blocks go to a disk tier (asynchronous I/O) and come back from it. */
static void test_moving_blocks_defer_their_request(void **state)
{
	struct fixture f;
	char dir[256], err[ATLAS_ERRLEN];
	const char *build = getenv("ATLAS_BUILD_ROOT");
	snprintf(dir, sizeof dir, "%s/sched-XXXXXX", build ? build : "/tmp");
	assert_non_null(mkdtemp(dir));
	setup(&f, 16);
	assert_int_equal(seq_pool_tiers(&f.pool, 0, dir, NULL, 64 * 1024, NULL, NULL, err, sizeof err),
			 0);
	submit(&f, 0, 20);
	submit(&f, 1, 4);
	while (f.r[0].seq.n_tokens < 20 || f.r[1].seq.n_tokens < 4)
		assert_true(step(&f) > 0);
	assert_int_equal(seq_park(&f.pool, &f.r[0].seq), 2);   /* through staging to disk */
	assert_true(f.r[0].seq.n_moving > 0);
	accept(&f, 0);
	accept(&f, 1);
	assert_int_equal(sched_plan(&f.s, &f.cmd), 1);
	assert_int_equal(f.cmd.seqs[0].slot, f.r[1].slot);
	assert_true(f.s.deferrals >= 1);
	assert_int_equal(f.r[0].phase, REQ_RUNNING);
	assert_ptr_equal(f.s.slots[f.r[0].slot], &f.r[0]);
	assert_int_equal(f.s.n_events, 0);
	sched_commit(&f.s, &f.cmd);
	/* Down to disk, then back up: r0 runs again within a bounded time. */
	bool ran = false;
	for (int i = 0; i < 2000 && !ran; i++) {
		for (int k = sched_plan(&f.s, &f.cmd); k > 0; k--)
			ran |= f.cmd.seqs[k - 1].slot == f.r[0].slot;
		sched_commit(&f.s, &f.cmd);
		usleep(1000);
	}
	assert_true(ran);
	assert_true(seq_resident(&f.pool, &f.r[0].seq, 21));
	assert_int_equal(f.pool.swap.out_ops, 2);
	assert_int_equal(f.pool.swap.in_ops, 2);
	teardown(&f);
	rmdir(dir);
}

/* Out of blocks: an idle request's KV goes first, then the newest running
 * request is preempted and queued again; a context the pool can never
 * hold fails its request with the reason. */
static void test_eviction_preemption_and_failure(void **state)
{
	struct fixture f;
	setup(&f, 4);
	submit(&f, 2, 20);                 /* 2 blocks, then idle */
	while (f.r[2].seq.n_tokens < 20)
		step(&f);
	sched_stop(&f.s, &f.r[2]);
	assert_int_equal(f.r[2].seq.n_blocks, 2);

	submit(&f, 0, 24);                 /* 2 blocks */
	submit(&f, 1, 24);                 /* 2 more: r2's must go */
	while (f.r[0].seq.n_tokens < 24 || f.r[1].seq.n_tokens < 24)
		step(&f);
	assert_int_equal(f.s.evictions, 1);
	assert_int_equal(f.r[2].seq.n_blocks, 0);
	assert_int_equal(f.s.preemptions, 0);

	/* r0 and r1 hold everything; r0 growing past its blocks preempts r1,
	 * the newer one. */
	for (int k = 0; k < 9; k++)
		accept(&f, 0);
	step(&f);                          /* 8 rows: up to 32, its 2 blocks */
	sched_plan(&f.s, &f.cmd);
	assert_int_equal(count_events(&f, SCHED_PREEMPTED, &f.r[1]), 1);
	assert_int_equal(f.r[1].phase, REQ_QUEUED);
	assert_int_equal(f.r[1].seq.n_blocks, 0);
	assert_int_equal(f.s.preemptions, 1);
	assert_int_equal(f.cmd.n_seqs, 1);
	assert_int_equal(f.cmd.seqs[0].slot, f.r[0].slot);

	/* 65 tokens need 5 blocks of a pool of 4. */
	submit(&f, 3, 65);
	sched_stop(&f.s, &f.r[0]);
	sched_plan(&f.s, &f.cmd);
	assert_int_equal(count_events(&f, SCHED_FAILED, &f.r[3]), 1);
	assert_int_equal(f.r[3].phase, REQ_IDLE);
	for (int i = 0; i < f.s.n_events; i++)
		if (f.s.events[i].kind == SCHED_FAILED)
			assert_non_null(strstr(f.s.events[i].msg, "needs 5 KV blocks"));
	teardown(&f);
}

/* A tools request runs alone in the tools slot, every row kept, in chunks;
 * sessions wait meanwhile and go on after. */
static void test_tools_request_runs_alone(void **state)
{
	struct fixture f;
	setup(&f, 16);
	submit(&f, 0, 3);
	step(&f);
	f.r[3].keep_all = true;
	submit(&f, 3, 6);
	assert_int_equal(sched_plan(&f.s, &f.cmd), 1);
	assert_int_equal(f.cmd.seqs[0].slot, SLOTS);
	assert_int_equal(f.cmd.n_rows, 4);
	assert_int_equal(f.cmd.n_out, 4);
	for (int i = 0; i < 4; i++)
		assert_true(f.cmd.out[i].keep && !f.cmd.out[i].sample && f.cmd.out[i].row == i);
	sched_commit(&f.s, &f.cmd);
	assert_int_equal(sched_plan(&f.s, &f.cmd), 1);
	assert_int_equal(f.cmd.seqs[0].pos0, 4);
	assert_int_equal(f.cmd.n_rows, 2);
	sched_commit(&f.s, &f.cmd);
	sched_stop(&f.s, &f.r[3]);
	accept(&f, 0);
	assert_int_equal(sched_plan(&f.s, &f.cmd), 1);
	assert_int_equal(f.cmd.seqs[0].slot, f.r[0].slot);
	teardown(&f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_admission_chunks_and_sampling),
		cmocka_unit_test(test_moving_blocks_defer_their_request),
		cmocka_unit_test(test_eviction_preemption_and_failure),
		cmocka_unit_test(test_tools_request_runs_alone),
	};
	return cmocka_run_group_tests_name("sched", tests, NULL, NULL);
}
