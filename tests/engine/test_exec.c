/* The executor's uploads (engine/step/exec.c) on the tiny test model and
 * the cpu backend. A run uploads only the block-table entries that changed
 * since the last one, so what the device's table holds must follow every
 * command whatever the commands before it did:
 *
 *   - after each run, the table rows of the run's slots hold its tables,
 *     and every other row still holds what the last command that named it
 *     gave it (a copy of a merged range rewrites the rows between);
 *   - through tables that grow, a slot handed to a new sequence with fewer
 *     blocks, an entry changed in the middle, entries equal to what the row
 *     held, and slots far enough apart that their changes go up in copies
 *     of their own.
 *
 * Usage: test_exec MODEL_DIR   (exit 77 when the directory is missing)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "common/err.h"
#include "engine/step/exec.h"
#include "engine_testutil.h"

static const char *model_dir;

#define SLOTS 40
#define BLOCK 4        /* positions a block: with CONTEXT, a table row of 4 KB */
#define CONTEXT 4096
#define FAR 30         /* a slot 120 KB of table away from slot 0 */
#define MAX_SEQS 4

/* One command of the script: up to MAX_SEQS sequences, each a decode row
 * at position 0 (so that attention reads only what the step writes; the
 * rest of a table is there for the upload, which sends all of it). */
struct seq_spec {
	int slot, n_blocks;
	int32_t blocks[8];
};

struct step_spec {
	int n_seqs;
	struct seq_spec seqs[MAX_SEQS];
};

static const struct step_spec script[] = {
	/* first use of three slots, two of them far apart */
	{ 3, { { 0, 2, { 3, 4 } }, { 1, 1, { 5 } }, { FAR, 3, { 6, 7, 8 } } } },
	/* slot 0 grows; the others unchanged */
	{ 3, { { 0, 3, { 3, 4, 9 } }, { 1, 1, { 5 } }, { FAR, 3, { 6, 7, 8 } } } },
	/* slot 1 handed to a new sequence, a new slot beside it */
	{ 3, { { 1, 2, { 10, 11 } }, { 2, 1, { 4 } }, { 0, 3, { 3, 4, 9 } } } },
	/* slot 0 to a sequence of one block, the far slot's middle entry */
	{ 2, { { 0, 1, { 12 } }, { FAR, 3, { 6, 13, 8 } } } },
	/* entries equal to what the rows held (0 is an unused row's entry) */
	{ 3, { { 3, 1, { 0 } }, { 1, 2, { 10, 11 } }, { FAR, 3, { 6, 13, 8 } } } },
	/* everything changes at once, in an order other than the slots' */
	{ 4,
	  { { FAR, 4, { 14, 15, 16, 17 } },
	    { 2, 2, { 18, 19 } },
	    { 0, 3, { 20, 21, 22 } },
	    { 1, 1, { 23 } } } },
};

static struct atlas_config config(void)
{
	struct atlas_config c;
	et_config(&c, model_dir);
	snprintf(c.backend, sizeof c.backend, "cpu");
	c.kv_block_size = BLOCK;
	c.context = CONTEXT;
	c.kv_memory = 2u << 20;
	c.max_batch = MAX_SEQS;
	return c;
}

static struct exec *open_exec(const struct atlas_config *c)
{
	const struct step_limits lim = { .max_seqs = MAX_SEQS, .max_rows = MAX_SEQS,
					 .max_out = MAX_SEQS };
	char err[ATLAS_ERRLEN];
	struct exec *x;
	if (exec_open(c, EXEC_MODEL, SLOTS, &lim, &x, err, sizeof err))
		fail_msg("exec_open: %s", err);
	return x;
}

/* The command of step s, greedy on every row. */
static void lay_out(struct step_cmd *cmd, const struct step_spec *s, uint64_t number)
{
	int t = 0;
	for (int i = 0; i < s->n_seqs; i++) {
		const struct seq_spec *q = &s->seqs[i];
		cmd->seqs[i] = (struct step_seq){ .slot = q->slot, .row = i, .n_rows = 1,
						  .pos0 = 0, .table = t,
						  .n_blocks = q->n_blocks, .state_slot = -1 };
		memcpy(cmd->tables + t, q->blocks, sizeof(int32_t) * (size_t)q->n_blocks);
		t += q->n_blocks;
		cmd->ids[i] = 100 + 7 * i;
		cmd->out[i] = (struct step_out){ .row = i, .sample = 1,
						 .params = { .temperature = 0, .top_p = 1 } };
	}
	cmd->n_seqs = s->n_seqs;
	cmd->n_rows = s->n_seqs;
	cmd->n_out = s->n_seqs;
	cmd->n_table = t;
	cmd->number = number;
}

static void run(struct exec *x, struct step_cmd *cmd, struct step_result *res)
{
	char err[ATLAS_ERRLEN];
	if (exec_run(x, cmd, res, err, sizeof err))
		fail_msg("exec_run of step %llu: %s", (unsigned long long)cmd->number, err);
}

static void test_tables_follow_every_command(void **state)
{
	(void)state;
	struct stat sb;
	if (stat(model_dir, &sb) != 0)
		skip();
	const struct atlas_config c = config();
	struct exec *x = open_exec(&c);
	const int cols = x->geo.max_blocks;
	assert_int_equal(cols, CONTEXT / BLOCK);
	/* The script's block ids must be in the pool and not its pad block. */
	assert_true(x->geo.n_blocks > 24 && x->pool.kv.pad_block > 23);

	/* What each row must hold: unused rows 0, as the executor starts them. */
	int32_t *want = calloc((size_t)SLOTS * (size_t)cols, sizeof *want);
	int32_t *got = malloc((size_t)cols * sizeof *got);
	assert_non_null(want);
	assert_non_null(got);
	struct step_cmd cmd;
	struct step_result res;
	assert_int_equal(step_cmd_alloc(&cmd, &x->lim), 0);
	for (size_t s = 0; s < sizeof script / sizeof *script; s++) {
		lay_out(&cmd, &script[s], s + 1);
		run(x, &cmd, &res);
		for (int i = 0; i < script[s].n_seqs; i++) {
			const struct seq_spec *q = &script[s].seqs[i];
			memcpy(want + (size_t)q->slot * cols, q->blocks,
			       sizeof(int32_t) * (size_t)q->n_blocks);
		}
		for (int slot = 0; slot < SLOTS; slot++) {
			assert_int_equal(kt_download(x->be, got, &x->d_tables,
						     (size_t)slot * cols * sizeof *got,
						     (size_t)cols * sizeof *got),
					 0);
			if (memcmp(got, want + (size_t)slot * cols, (size_t)cols * sizeof *got))
				fail_msg("after step %zu the table row of slot %d is not what the "
					 "commands gave it", s + 1, slot);
		}
	}
	step_cmd_free(&cmd);
	free(want);
	free(got);
	exec_close(x);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s MODEL_DIR\n", argv[0]);
		return 2;
	}
	model_dir = argv[1];
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tables_follow_every_command),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
