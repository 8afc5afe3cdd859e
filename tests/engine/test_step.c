/* Step commands (engine/step/step.h) without a model: the byte form round
 * trips exactly and refuses damaged input, and the check the executor runs
 * on every command refuses each kind of malformed command. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "engine/step/step.h"

static const struct step_limits lim = { .max_seqs = 4, .max_rows = 24, .max_out = 8,
					.max_table = 16 };
static const struct step_geometry geo = { .n_slots = 5, .max_blocks = 4, .n_blocks = 10,
					  .block_size = 16, .context = 64, .vocab = 100 };

/* Two decode rows, a 5-row prefill chunk that ends its prompt, a 3-row
 * verify whose every row wants logits. */
static void sample_cmd(struct step_cmd *c)
{
	assert_int_equal(step_cmd_alloc(c, &lim), 0);
	c->number = 0x123456789ull;
	c->n_seqs = 4;
	c->seqs[0] = (struct step_seq){ .slot = 2, .row = 0, .n_rows = 1, .pos0 = 17, .table = 0,
					.n_blocks = 2, .state_slot = -1 };
	c->seqs[1] = (struct step_seq){ .slot = 0, .row = 1, .n_rows = 1, .pos0 = 3, .table = 2,
					.n_blocks = 1, .state_slot = -1 };
	c->seqs[2] = (struct step_seq){ .slot = 1, .row = 2, .n_rows = 5, .pos0 = 30, .table = 3,
					.n_blocks = 3, .state_slot = 7 };
	c->seqs[3] = (struct step_seq){ .slot = 4, .row = 7, .n_rows = 3, .pos0 = 0, .table = 6,
					.n_blocks = 1, .state_slot = -1 };
	c->n_rows = 10;
	for (int i = 0; i < c->n_rows; i++)
		c->ids[i] = (i * 37) % 100;
	c->n_table = 7;
	const int32_t t[] = { 4, 9, 0, 1, 2, 3, 8 };
	memcpy(c->tables, t, sizeof t);
	const int rows[] = { 0, 1, 6, 7, 8, 9 };
	c->n_out = 6;
	for (int i = 0; i < c->n_out; i++)
		c->out[i] = (struct step_out){ .row = rows[i], .sample = i != 4, .keep = i >= 3,
					       .params = { .temperature = 0.5f * (float)i,
							   .top_p = 0.9f, .top_k = i,
							   .u = 0.125f * (float)i } };
}

static void test_wire_round_trip(void **state)
{
	struct step_cmd c, d;
	sample_cmd(&c);
	assert_int_equal(step_cmd_check(&c, &lim, &geo, NULL, 0), 0);
	size_t n = step_wire_size(&c);
	unsigned char *buf = malloc(n + 8);
	assert_int_equal(step_encode(&c, buf, n - 1), -E2BIG);
	assert_int_equal(step_encode(&c, buf, n + 8), (long)n);
	assert_int_equal(step_cmd_alloc(&d, &lim), 0);
	assert_int_equal(step_decode(buf, n, &lim, &d), 0);
	assert_true(d.number == c.number);
	assert_int_equal(d.n_seqs, c.n_seqs);
	assert_int_equal(d.n_rows, c.n_rows);
	assert_int_equal(d.n_out, c.n_out);
	assert_int_equal(d.n_table, c.n_table);
	assert_memory_equal(d.seqs, c.seqs, sizeof *c.seqs * (size_t)c.n_seqs);
	assert_memory_equal(d.ids, c.ids, sizeof *c.ids * (size_t)c.n_rows);
	assert_memory_equal(d.tables, c.tables, sizeof *c.tables * (size_t)c.n_table);
	for (int i = 0; i < c.n_out; i++) {
		assert_int_equal(d.out[i].row, c.out[i].row);
		assert_int_equal(d.out[i].sample, c.out[i].sample);
		assert_int_equal(d.out[i].keep, c.out[i].keep);
		assert_memory_equal(&d.out[i].params, &c.out[i].params, sizeof c.out[i].params);
	}
	/* The same bytes again: the form has no padding or pointers in it. */
	unsigned char *again = malloc(n);
	assert_int_equal(step_encode(&d, again, n), (long)n);
	assert_memory_equal(again, buf, n);

	/* Damage: short, long, another version or magic, counts past the limits. */
	assert_int_equal(step_decode(buf, n - 1, &lim, &d), -EINVAL);
	assert_int_equal(step_decode(buf, 10, &lim, &d), -EINVAL);
	assert_int_equal(step_decode(buf, n + 4, &lim, &d), -EINVAL);
	buf[4]++;
	assert_int_equal(step_decode(buf, n, &lim, &d), -EPROTO);
	buf[4]--;
	buf[0] ^= 1;
	assert_int_equal(step_decode(buf, n, &lim, &d), -EPROTO);
	buf[0] ^= 1;
	struct step_limits small = lim;
	small.max_rows = 9;
	assert_int_equal(step_decode(buf, n, &small, &d), -E2BIG);
	free(buf);
	free(again);
	step_cmd_free(&c);
	step_cmd_free(&d);
}

/* Break one thing of a good command: the check names it. */
static void assert_refused(void (*breakit)(struct step_cmd *), const char *what)
{
	struct step_cmd c;
	char err[ATLAS_ERRLEN] = "";
	sample_cmd(&c);
	breakit(&c);
	assert_int_equal(step_cmd_check(&c, &lim, &geo, err, sizeof err), -EINVAL);
	if (!strstr(err, what))
		fail_msg("message '%s' does not say '%s'", err, what);
	step_cmd_free(&c);
}

static void slot_out_of_range(struct step_cmd *c) { c->seqs[1].slot = 5; }
static void slot_twice(struct step_cmd *c) { c->seqs[3].slot = 2; }
static void rows_gap(struct step_cmd *c) { c->seqs[2].row = 3; }
static void past_context(struct step_cmd *c) { c->seqs[2].pos0 = 60; }
static void too_few_blocks(struct step_cmd *c)
{
	c->seqs[0].n_blocks = 1;
	for (int i = 1; i < 4; i++)
		c->seqs[i].table--;
	c->n_table--;
}
static void block_outside_pool(struct step_cmd *c) { c->tables[5] = 10; }
static void bad_id(struct step_cmd *c) { c->ids[3] = 100; }
static void out_not_sorted(struct step_cmd *c) { c->out[2].row = 1; }
static void out_past_rows(struct step_cmd *c) { c->out[5].row = 10; }
static void bad_top_p(struct step_cmd *c) { c->out[1].params.top_p = 0; }
static void bad_u(struct step_cmd *c) { c->out[1].params.u = 1.0f; }
static void uncovered(struct step_cmd *c) { c->n_rows = 11; }
static void too_many(struct step_cmd *c) { c->n_out = 9; }

static void test_check_refuses_malformed(void **state)
{
	assert_refused(slot_out_of_range, "slot 5");
	assert_refused(slot_twice, "twice");
	assert_refused(rows_gap, "rows or table");
	assert_refused(past_context, "outside the context");
	assert_refused(too_few_blocks, "do not hold");
	assert_refused(block_outside_pool, "not in the pool");
	assert_refused(bad_id, "token id 100");
	assert_refused(out_not_sorted, "out of order");
	assert_refused(out_past_rows, "out of order");
	assert_refused(bad_top_p, "sampling");
	assert_refused(bad_u, "sampling");
	assert_refused(uncovered, "do not cover");
	assert_refused(too_many, "over the limits");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_wire_round_trip),
		cmocka_unit_test(test_check_refuses_malformed),
	};
	return cmocka_run_group_tests_name("step", tests, NULL, NULL);
}
