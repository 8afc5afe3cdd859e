/* The KV swap tier (DESIGN §8) on the cpu backend, through the public API:
 * with device pools so small that most KV lives in the host and disk tiers,
 * greedy tokens are bitwise those of a run without the tier, at batch 1 and
 * N and at several chunk sizes; a session parked between turns continues on
 * its KV without recomputing it; a prefetch hint brings it back before the
 * prompt; a disk that fills up degrades to recomputation, not to wrong
 * tokens or a stuck engine. Long contexts: with a device share of a few
 * blocks per session (or a pool smaller than one session's context), a
 * running session's older blocks stay on the host tier and attention
 * streams them through staging, every step, with the same bits.
 *
 * Usage: test_swap MODEL_DIR   (exit 77 when the directory is missing)
 * ATLAS_TEST_BACKEND=cuda runs the same checks on another backend, where a
 * token may differ only at a near tie of the reference's logits (near_tie).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/err.h"
#include "engine/engine.h"
#include "engine_testutil.h"

static const char *model_dir;
static char disk_dir[256];          /* a temporary directory for the disk tier */
static uint64_t block_bytes;        /* K and V of one block, all layers */
static int layers;                  /* of the model */

#define SESSIONS 4
#define MAX_TOKENS 14
static const int prompt_len[SESSIONS] = { 50, 7, 83, 30 };

struct tiers {
	int blocks;                 /* device blocks */
	int share;                  /* kv_device_blocks_per_seq */
	int stage_blocks;           /* each staging buffer, in blocks of one layer (0: default) */
	uint64_t host_blocks;       /* 0: no host tier */
	uint64_t disk_blocks;       /* 0: no disk tier */
	const char *dir;            /* of the disk tier */
};

static enum atlas_spec spec = ATLAS_SPEC_AUTO;  /* spec of the engines opened next */

static struct atlas_engine *open_engine(int max_batch, int chunk, const struct tiers *t)
{
	struct atlas_config c;
	et_config(&c, model_dir);
	c.spec = spec;
	/* Drafts by the tokens alone: a gate that decides by the step times
	 * it measures would make the step shapes timing-dependent even
	 * without the tier. */
	c.spec_gate = false;
	c.max_batch = max_batch;
	c.chunk_size = chunk;
	c.kv_memory = block_bytes ? (uint64_t)t->blocks * block_bytes : 8u << 20;
	c.kv_host_memory = t->host_blocks * ((block_bytes + 4095) / 4096 * 4096);
	c.kv_disk_memory = t->disk_blocks * block_bytes;
	snprintf(c.kv_dir, sizeof c.kv_dir, "%s", t->disk_blocks ? t->dir : "");
	c.context = 256;
	c.kv_device_blocks_per_seq = t->share;
	if (t->stage_blocks)
		c.kv_stage_memory = 2 * (uint64_t)t->stage_blocks * block_bytes / (uint64_t)layers;
	struct atlas_engine *e;
	char err[ATLAS_ERRLEN];
	if (atlas_engine_open(&c, &e, err, sizeof err))
		fail_msg("atlas_engine_open: %s", err);
	atlas_engine_set_notify(e, et_on_notify, NULL);
	return e;
}

struct run {
	int32_t ids[SESSIONS][2][MAX_TOKENS];   /* turn 1 and turn 2 of each session */
	uint64_t swap_out, swap_in, host_peak, errors, drops, staged;
};

/* SESSIONS sessions, two turns each: the first turns all at once, the
 * second turns one after another, so that each session's KV has been pushed
 * out by the others in between. */
static void run_sessions(struct atlas_engine *e, struct run *out)
{
	struct atlas_session *s[SESSIONS];
	char err[ATLAS_ERRLEN], name[16];
	const int vocab = atlas_engine_vocab_size(e);
	struct atlas_engine_stats *st = malloc(sizeof *st);
	for (int i = 0; i < SESSIONS; i++) {
		snprintf(name, sizeof name, "w%d", i);
		assert_int_equal(atlas_session_open(e, name, &s[i], err, sizeof err), 0);
		et_set(s[i], "ignore_eos", "1");
		et_set(s[i], "max_tokens", "14");
	}
	for (int i = 0; i < SESSIONS; i++) {
		int32_t ids[128];
		et_prompt_ids(ids, prompt_len[i], 300u + (uint32_t)i, vocab);
		assert_int_equal(atlas_session_submit_tokens(s[i], ids, (size_t)prompt_len[i], err,
							     sizeof err), 1);
	}
	out->host_peak = 0;
	for (int i = 0; i < SESSIONS; i++) {
		assert_int_equal(et_wait_turn(s[i], 1, NULL, 0, 0), 0);
		et_turn_ids(s[i], 1, out->ids[i][0], MAX_TOKENS);
	}
	for (int i = 0; i < SESSIONS; i++) {
		int32_t ids[16];
		et_prompt_ids(ids, 11, 900u + (uint32_t)i, vocab);
		assert_int_equal(atlas_session_submit_tokens(s[i], ids, 11, err, sizeof err), 2);
		assert_int_equal(et_wait_turn(s[i], 2, NULL, 0, 0), 0);
		et_turn_ids(s[i], 2, out->ids[i][1], MAX_TOKENS);
		atlas_engine_stats(e, st);
		if (st->kv.blocks_used[ATLAS_TIER_HOST] + st->kv.blocks_used[ATLAS_TIER_DISK] >
		    out->host_peak)
			out->host_peak = st->kv.blocks_used[ATLAS_TIER_HOST] +
					 st->kv.blocks_used[ATLAS_TIER_DISK];
	}
	atlas_engine_stats(e, st);
	out->swap_out = st->kv.swap_out_ops_total;
	out->swap_in = st->kv.swap_in_ops_total;
	out->errors = st->kv.swap_errors_total;
	out->drops = st->kv.swap_drops_total;
	out->staged = st->kv.staged_blocks_total;
	for (int i = 0; i < SESSIONS; i++)
		atlas_session_close(s[i]);
	free(st);
}

static struct run reference;

/* On cuda a logit may change in its last bits with the step's shape
 * (test_engine.c), and the shapes of a run with the swap tier depend on
 * when its copies finish: a greedy token may then differ where the model's
 * top two are a near tie. The reference's own logits for the context
 * before such a token (whole-context prefill on a reference engine) must
 * have both tokens within CUDA_TIE_TOL of their best; the rest of that
 * session is then not compared. On the cpu backend every token is equal. */
#define CUDA_TIE_TOL 0.1f

static bool near_tie(const struct run *ref, int i, int t, int k, int32_t a, int32_t b)
{
	const char *backend = getenv("ATLAS_TEST_BACKEND");
	if (!backend || !strcmp(backend, "cpu"))
		return false;
	const struct tiers none = { .blocks = 0 };
	struct atlas_engine *e = open_engine(4, 64, &none);
	const int vocab = atlas_engine_vocab_size(e);
	int32_t ctx[128];
	size_t n = 0;
	et_prompt_ids(ctx, prompt_len[i], 300u + (uint32_t)i, vocab);
	n = (size_t)prompt_len[i];
	for (int j = 0; j < (t ? MAX_TOKENS : k); j++)
		ctx[n++] = ref->ids[i][0][j];
	if (t) {
		et_prompt_ids(ctx + n, 11, 900u + (uint32_t)i, vocab);
		n += 11;
		for (int j = 0; j < k; j++)
			ctx[n++] = ref->ids[i][1][j];
	}
	float *logits = malloc(sizeof(float) * n * (size_t)vocab);
	char err[ATLAS_ERRLEN];
	assert_non_null(logits);
	if (atlas_engine_logits(e, ctx, n, logits, err, sizeof err))
		fail_msg("atlas_engine_logits: %s", err);
	const float *last = logits + (n - 1) * (size_t)vocab;
	float best = last[0];
	for (int v = 1; v < vocab; v++)
		best = last[v] > best ? last[v] : best;
	const bool tie = best - last[a] <= CUDA_TIE_TOL && best - last[b] <= CUDA_TIE_TOL;
	printf("session %d turn %d token %d: %d vs %d, %g and %g below the best logit\n", i,
	       t + 1, k, a, b, (double)(best - last[a]), (double)(best - last[b]));
	free(logits);
	atlas_engine_close(e);
	return tie;
}

static void assert_same(const struct run *a, const struct run *b, const char *what)
{
	for (int i = 0; i < SESSIONS; i++)
		for (int t = 0; t < 2; t++)
			for (int k = 0; k < MAX_TOKENS; k++) {
				if (a->ids[i][t][k] == b->ids[i][t][k])
					continue;
				if (!near_tie(b, i, t, k, a->ids[i][t][k], b->ids[i][t][k]))
					fail_msg("%s: session %d turn %d token %d: %d vs %d", what,
						 i, t + 1, k, a->ids[i][t][k], b->ids[i][t][k]);
				t = 2;
				break;
			}
}

/* The reference: a pool that holds everything, no swap tier. */
static void test_reference(void **state)
{
	const struct tiers none = { .blocks = 0 };
	struct atlas_engine *e = open_engine(4, 64, &none);
	struct atlas_engine_stats *st = malloc(sizeof *st);
	atlas_engine_stats(e, st);
	block_bytes = st->kv.bytes_per_block;
	layers = st->layers;
	free(st);
	run_sessions(e, &reference);
	assert_int_equal(reference.swap_out, 0);
	atlas_engine_close(e);
}

/* Every session alone needs up to 8 blocks (83 + 14 + 11 + 14 tokens of 16);
 * 10 device blocks hold one or two of them. */
static void test_host_tier_is_exact(void **state)
{
	static const int chunks[] = { 7, 64 };
	static const int batches[] = { 1, 4 };
	const struct tiers host = { .blocks = 10, .host_blocks = 64 };
	for (size_t b = 0; b < ATLAS_ARRAY_LEN(batches); b++)
		for (size_t c = 0; c < ATLAS_ARRAY_LEN(chunks); c++) {
			struct run r;
			struct atlas_engine *e = open_engine(batches[b], chunks[c], &host);
			run_sessions(e, &r);
			atlas_engine_close(e);
			printf("host tier, batch %d, chunk %d: %llu blocks out, %llu in\n",
			       batches[b], chunks[c], (unsigned long long)r.swap_out,
			       (unsigned long long)r.swap_in);
			assert_same(&r, &reference, "host tier vs none");
			assert_true(r.swap_out > 0 && r.swap_in > 0);
			assert_int_equal(r.errors, 0);
			assert_int_equal(r.drops, 0);
		}
}

/* Long contexts: each running session keeps 2 blocks on the device (plus
 * those its chunk writes) and streams the rest from the host tier, at batch
 * 1 and 4, chunks of 7 and 64 rows, one staging round per step or many
 * (staging of 3 blocks). */
static void test_long_contexts_stream_from_host(void **state)
{
	static const int chunks[] = { 7, 64 };
	static const int batches[] = { 1, 4 };
	static const int stages[] = { 0, 3 };
	for (size_t b = 0; b < ATLAS_ARRAY_LEN(batches); b++)
		for (size_t c = 0; c < ATLAS_ARRAY_LEN(chunks); c++)
			for (size_t g = 0; g < ATLAS_ARRAY_LEN(stages); g++) {
				const struct tiers t = { .blocks = 24, .share = 2, .host_blocks = 64,
							 .stage_blocks = stages[g] };
				struct run r;
				struct atlas_engine *e = open_engine(batches[b], chunks[c], &t);
				run_sessions(e, &r);
				atlas_engine_close(e);
				printf("share 2, batch %d, chunk %d, staging %d: %llu blocks "
				       "streamed, %llu out, %llu in\n", batches[b], chunks[c],
				       stages[g], (unsigned long long)r.staged,
				       (unsigned long long)r.swap_out,
				       (unsigned long long)r.swap_in);
				assert_same(&r, &reference, "device share 2 vs none");
				assert_true(r.staged > 0);
				assert_int_equal(r.errors, 0);
				assert_int_equal(r.drops, 0);
			}
}

/* A pool of 6 blocks, less than a session's context (up to 8): with the
 * automatic share the session keeps what fits and streams the rest; a
 * host tier of 6 blocks and a disk behind it, so that idle sessions' host
 * blocks move to disk to make room. */
static void test_context_beyond_the_pool(void **state)
{
	static const int batches[] = { 1, 4 };
	for (size_t b = 0; b < ATLAS_ARRAY_LEN(batches); b++) {
		const struct tiers t = { .blocks = 6, .host_blocks = 6, .disk_blocks = 64,
					 .dir = disk_dir };
		struct run r;
		struct atlas_engine *e = open_engine(batches[b], 16, &t);
		run_sessions(e, &r);
		atlas_engine_close(e);
		printf("pool of 6 blocks, batch %d: %llu blocks streamed, %llu out, %llu in, "
		       "%llu drops\n", batches[b], (unsigned long long)r.staged,
		       (unsigned long long)r.swap_out, (unsigned long long)r.swap_in,
		       (unsigned long long)r.drops);
		assert_same(&r, &reference, "a pool smaller than a context vs none");
		assert_true(r.staged > 0);
		assert_int_equal(r.errors, 0);
	}
}

/* A host tier of 4 blocks and a disk tier behind it: blocks go through
 * staging to disk and come back from it. */
static void test_disk_tier_is_exact(void **state)
{
	const struct tiers disk = { .blocks = 10, .host_blocks = 4, .disk_blocks = 64,
				    .dir = disk_dir };
	struct run r;
	struct atlas_engine *e = open_engine(4, 16, &disk);
	struct atlas_engine_stats *st = malloc(sizeof *st);
	atlas_engine_stats(e, st);
	assert_true(st->kv.blocks_total[ATLAS_TIER_DISK] >= 64);
	run_sessions(e, &r);
	atlas_engine_stats(e, st);
	printf("disk tier: %llu blocks out, %llu in, %llu failed, read p50 %.1f us, p99 %.1f us\n",
	       (unsigned long long)r.swap_out, (unsigned long long)r.swap_in,
	       (unsigned long long)r.errors, st->kv.read_latency_p50_s * 1e6,
	       st->kv.read_latency_p99_s * 1e6);
	const double p99 = st->kv.read_latency_p99_s;
	free(st);
	atlas_engine_close(e);
	assert_same(&r, &reference, "disk tier vs none");
	assert_int_equal(r.errors, 0);
	assert_true(p99 > 0);           /* blocks came back from disk */
	assert_true(r.host_peak > 4);   /* more than the host tier held: disk was used */
}

/* A session parked between turns continues on its KV: its second turn
 * computes only its new tokens. A prefetch hint brings the KV back first. */
static void test_parked_session_resumes_without_recompute(void **state)
{
	const struct tiers host = { .blocks = 10, .host_blocks = 64 };
	/* The rows counted below are plain decoding's: a rejected draft through
	 * linear layers feeds its kept rows again, and one at a turn's end
	 * leaves those positions for the next turn. */
	spec = ATLAS_SPEC_OFF;
	struct atlas_engine *e = open_engine(2, 64, &host);
	spec = ATLAS_SPEC_AUTO;
	const int vocab = atlas_engine_vocab_size(e);
	char err[ATLAS_ERRLEN];
	struct atlas_session *a, *b;
	int32_t pa[80], pb[100], more[9];
	et_prompt_ids(pa, 80, 1, vocab);
	et_prompt_ids(pb, 100, 2, vocab);
	et_prompt_ids(more, 9, 3, vocab);
	assert_int_equal(atlas_session_open(e, "a", &a, err, sizeof err), 0);
	assert_int_equal(atlas_session_open(e, "b", &b, err, sizeof err), 0);
	et_set(a, "max_tokens", "6");
	et_set(b, "max_tokens", "6");
	/* Six tokens whatever the model: the block counts below depend on it. */
	et_set(a, "ignore_eos", "1");
	et_set(b, "ignore_eos", "1");
	assert_int_equal(atlas_session_submit_tokens(a, pa, 80, err, sizeof err), 1);
	assert_int_equal(et_wait_turn(a, 1, NULL, 0, 0), 0);
	/* b's 106 tokens need 7 blocks: a's 6 go to the host tier. */
	assert_int_equal(atlas_session_submit_tokens(b, pb, 100, err, sizeof err), 1);
	assert_int_equal(et_wait_turn(b, 1, NULL, 0, 0), 0);
	struct atlas_session_status sa;
	atlas_session_status(a, &sa);
	assert_true(sa.kv_blocks[ATLAS_TIER_HOST] > 0);
	assert_int_equal(sa.kv_blocks[ATLAS_TIER_HOST] + sa.kv_blocks[ATLAS_TIER_DEVICE], 6);

	/* The hint: a's KV comes back once b's is out of the way. */
	atlas_session_close(b);
	atlas_session_prefetch(a);
	for (int i = 0; i < 2000; i++) {
		atlas_session_status(a, &sa);
		if (!sa.kv_blocks[ATLAS_TIER_HOST])
			break;
		usleep(1000);
	}
	assert_int_equal(sa.kv_blocks[ATLAS_TIER_HOST], 0);
	assert_int_equal(sa.kv_blocks[ATLAS_TIER_DEVICE], 6);

	struct atlas_engine_stats *st = malloc(sizeof *st);
	atlas_engine_stats(e, st);
	const uint64_t before = st->step_tokens_total;
	assert_int_equal(atlas_session_submit_tokens(a, more, 9, err, sizeof err), 2);
	assert_int_equal(et_wait_turn(a, 2, NULL, 0, 0), 0);
	atlas_engine_stats(e, st);
	assert_int_equal(st->kv.prefetch_hits_total, 1);
	assert_int_equal(st->kv.prefetch_misses_total, 0);
	/* The last token of turn 1, the 9 new ones and 5 decode steps. */
	assert_int_equal(st->step_tokens_total - before, 1 + 9 + 5);
	free(st);
	atlas_session_close(a);
	atlas_engine_close(e);
}

/* A disk that fills up: writes that fail keep their blocks where they
 * were, the sessions that could not park recompute, and every token is
 * still the reference's. */
static void test_full_disk_degrades_to_recompute(void **state)
{
	char small[300], size[64];
	snprintf(small, sizeof small, "%s/small", disk_dir);
	/* Room for three blocks, whatever the model's block is. */
	snprintf(size, sizeof size, "size=%llu",
		 (unsigned long long)(3 * ((block_bytes + 4095) / 4096 * 4096)));
	if (mkdir(small, 0700) != 0 || mount("tmpfs", small, "tmpfs", 0, size) != 0) {
		printf("skip: cannot mount a small tmpfs here (%s)\n", strerror(errno));
		rmdir(small);
		skip();
	}
	const struct tiers disk = { .blocks = 10, .host_blocks = 2, .disk_blocks = 256,
				    .dir = small };
	struct run r;
	struct atlas_engine *e = open_engine(4, 16, &disk);
	run_sessions(e, &r);
	atlas_engine_close(e);
	umount(small);
	rmdir(small);
	printf("full disk: %llu blocks out, %llu in, %llu failed writes, %llu drops\n",
	       (unsigned long long)r.swap_out, (unsigned long long)r.swap_in,
	       (unsigned long long)r.errors, (unsigned long long)r.drops);
	assert_true(r.errors > 0 && r.drops > 0);
	assert_same(&r, &reference, "a full disk vs none");
}

int main(int argc, char **argv)
{
	int status = et_model_arg(argc, argv, &model_dir);
	if (status)
		return status;
	const char *build = getenv("ATLAS_BUILD_ROOT");
	snprintf(disk_dir, sizeof disk_dir, "%s/swap-XXXXXX", build ? build : "/tmp");
	if (!mkdtemp(disk_dir)) {
		perror(disk_dir);
		return 1;
	}
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reference),
		cmocka_unit_test(test_host_tier_is_exact),
		cmocka_unit_test(test_disk_tier_is_exact),
		cmocka_unit_test(test_long_contexts_stream_from_host),
		cmocka_unit_test(test_context_beyond_the_pool),
		cmocka_unit_test(test_parked_session_resumes_without_recompute),
		cmocka_unit_test(test_full_disk_degrades_to_recompute),
	};
	int rc = cmocka_run_group_tests_name("swap", tests, NULL, NULL);
	rmdir(disk_dir);
	return rc;
}
