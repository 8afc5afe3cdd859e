/* Cases of kv_store and paged attention over the world of ops_paged.h:
 * history stored in shuffled chunks, then one step that mixes decode rows
 * and prompt chunks of several sequences, stored and attended.
 *
 * kv_store: after the history and after the step, every stored row sits
 * where the block table puts it, bitwise (a bf16 cache rounds to nearest
 * even), and every other row of the poisoned caches is untouched.
 *
 * attention runs out of place and in place over q, at max_kv_len equal to
 * the longest row and, for the cases that ask, at larger buckets (300 above
 * it, and past max_context) as a replayed graph gives them; and once more
 * into a bf16 out, which must hold the f32 out rounded to nearest even, bit
 * for bit (the same arithmetic, stored rounded: matmul_x_bf16's x).
 *  - Reference: naive attention in double over each sequence's logical K/V;
 *    |out - ref| <= tol · Σ softmax · |v| (1e-5; 1e-4 for the peaky case,
 *    whose f32 dot products of terms summing to ~300 round at ~2e-5).
 *  - Against the cpu, same rounded inputs: with bf16 caches max_abs 4e-3,
 *    NMSE 2e-5 (the tensor-core kernels round the softmax weights P to bf16
 *    for P·V, |error| <= 2^-8 · max|v|; the NMSE bound is ~20x the mean
 *    square of that rounding); with f32 caches (cuda's generic kernel, all
 *    f32, online softmax) max_abs 2e-5, NMSE 1e-10.
 *  - Where the backend promises it (op_attention_invariant), each token
 *    attended alone gives the bits it got in the whole step (DESIGN §4.1).
 *  - Block-major caches (several layers interleaved in one allocation,
 *    kv_block_rows above block_size): kv_store leaves every row of the other
 *    layers poisoned and puts K and V only in its layer's rows, and
 *    attention gives the bits that the same world in caches of their own
 *    gives on the same backend: the layout changes where rows are read,
 *    never the kernel or the order of the arithmetic (the views keep the
 *    alignment the kernels choose by).
 *
 * Shapes: MHA, GQA (groups 2 to 32), MQA; head_dim 34, 36, 64, 72, 80, 96,
 * 128, 256; block sizes 1, 5, 7, 8, 16, 32, 64; sequences at position 0,
 * on and across block boundaries, to 3001 positions, decode rows whose
 * lengths meet the decode kernel's split boundaries, a slot left unused;
 * block-major caches of a middle layer and of the last one (whose V view
 * ends with the allocation), for decode, prefill and mixed steps.
 */
#include <math.h>
#include <string.h>

#include "tests/ops/ops_paged.h"

#define MAX_BUCKETS 3

struct att_params {
	struct paged_params w;
	double tol;   /* reference: error over Σ softmax · |v| */
	bool buckets; /* also max_kv_len 300 above the longest row, and past max_context */
};

struct att_out {
	int rc_store, rc_att;
	float *hist, *caches; /* paged_snapshot after the history and after the step */
	int n_buckets, bucket[MAX_BUCKETS];
	float *out[MAX_BUCKETS], *in_place[MAX_BUCKETS];
	float *out_bf16; /* the step at the first bucket into a bf16 out, widened */
	float *alone; /* the step's rows attended one at a time; NULL if not promised */
	float *flat;  /* block-major worlds: out[0] from caches of their own; else NULL */
};

static void *att_build(struct op_run *r, const void *params, const struct op_backend *target)
{
	const struct att_params *p = params;
	struct paged_world *w = op_alloc(r, sizeof(*w));

	paged_build(r, w, &p->w, target);
	return w;
}

/* Attention of tok over the world's caches into out (from q); first error kept. */
static void attend(const struct op_backend *b, const struct paged_world *w,
		   const struct paged_dev *d, const struct kt_batch *batch,
		   const struct kt_tensor *out, const struct kt_tensor *q, int *rc)
{
	const struct paged_params *p = w->p;
	int e = kt_attention(b->be, out, q, &d->kc, &d->vc, batch, p->n_heads, p->n_kv, p->D,
			     w->scale);

	*rc = *rc ? *rc : e;
}

/* Each token of the step alone: a batch of one row without step shape. */
static float *attend_alone(struct op_run *r, const struct op_backend *b,
			   const struct paged_world *w, const struct paged_dev *d,
			   const struct kt_batch *batch, const struct kt_tensor *q, int *rc)
{
	float *alone = op_floats(r, (size_t)w->step.T * w->QC);
	struct kt_tensor out = op_tensor(r, b, KT_F32, 1, w->QC, NULL);

	for (int t = 0; t < w->step.T; t++) {
		struct kt_batch one = *batch;
		struct kt_tensor qt = kt_rows(*q, t, 1);

		one.n_tokens = 1;
		one.pos = kt_rows(batch->pos, t, 1);
		one.seq = kt_rows(batch->seq, t, 1);
		one.n_single = one.n_segments = 0;
		one.segments = NULL;
		attend(b, w, d, &one, &out, &qt, rc);
		op_ok(r, kt_download(b->be, alone + (size_t)t * w->QC, &out, 0, kt_nbytes(&out)),
		      "kt_download");
	}
	return alone;
}

/* The world in caches of their own (kv_block_rows 0): the step's attention
 * at max_kv_len L, for a block-major world to compare with. */
static float *attend_flat(struct op_run *r, const struct op_backend *b,
			  const struct paged_world *w, int L, int *rc_store, int *rc_att)
{
	struct paged_params fp = *w->p;
	struct paged_world fw = *w;
	struct paged_dev d;
	struct kt_tensor q, out;
	struct kt_batch batch;
	int rc;

	fp.layers = fp.layer = 0;
	fw.p = &fp;
	d = paged_setup(r, b, &fw);
	q = op_tensor(r, b, KT_F32, fw.step.T, fw.QC, fw.q);
	out = op_tensor(r, b, KT_F32, fw.step.T, fw.QC, NULL);
	rc = paged_store_all(r, b, &fw, &d);
	*rc_store = *rc_store ? *rc_store : rc;
	batch = paged_batch(r, b, &fw, &d, &fw.step, L);
	attend(b, &fw, &d, &batch, &out, &q, rc_att);
	return op_get(r, b, &out);
}

static void *att_run(struct op_run *r, const void *params, const void *input,
		     const struct op_backend *b)
{
	const struct att_params *p = params;
	const struct paged_world *w = input;
	struct att_out *o = op_alloc(r, sizeof(*o));
	struct paged_dev d = paged_setup(r, b, w);
	const int T = w->step.T, L = paged_max_len(&w->step);
	struct kt_tensor q = op_tensor(r, b, KT_F32, T, w->QC, w->q);
	struct kt_batch batch;

	for (int c = 0; c < w->n_hist && !o->rc_store; c++)
		o->rc_store = paged_store(r, b, w, &d, &w->hist[c]);
	o->hist = paged_snapshot(r, b, w, &d);
	o->rc_store = o->rc_store ? o->rc_store : paged_store(r, b, w, &d, &w->step);
	o->caches = paged_snapshot(r, b, w, &d);
	o->bucket[o->n_buckets++] = L;
	if (p->buckets) {
		o->bucket[o->n_buckets++] = L + 300;
		o->bucket[o->n_buckets++] = OP_MAX_CONTEXT + 1000;
	}
	for (int i = 0; i < o->n_buckets; i++) {
		struct kt_tensor out = op_tensor(r, b, KT_F32, T, w->QC, NULL);
		struct kt_tensor qi = op_tensor(r, b, KT_F32, T, w->QC, w->q);

		batch = paged_batch(r, b, w, &d, &w->step, o->bucket[i]);
		attend(b, w, &d, &batch, &out, &q, &o->rc_att);
		attend(b, w, &d, &batch, &qi, &qi, &o->rc_att);
		o->out[i] = op_get(r, b, &out);
		o->in_place[i] = op_get(r, b, &qi);
	}
	batch = paged_batch(r, b, w, &d, &w->step, L);
	{
		struct kt_tensor ob = op_tensor(r, b, KT_BF16, T, w->QC, NULL);

		attend(b, w, &d, &batch, &ob, &q, &o->rc_att);
		o->out_bf16 = op_get(r, b, &ob);
	}
	if (op_attention_invariant(b)) {
		o->alone = attend_alone(r, b, w, &d, &batch, &q, &o->rc_att);
	}
	if (p->w.layers)
		o->flat = attend_flat(r, b, w, L, &o->rc_store, &o->rc_att);
	return o;
}

static void att_check(struct op_run *r, const void *params, const void *input, const void *got,
		      const void *cpu)
{
	const struct paged_world *w = input;
	const struct att_params *p = params;
	const struct att_out *g = got, *c = cpu;
	const size_t n = (size_t)w->step.T * w->QC;
	double *ref = NULL, *mag = NULL;

	op_check_rc(r, g->rc_store, 0, "kv_store runs");
	op_check_rc(r, g->rc_att, 0, "attention runs");
	paged_check_caches(r, w, g->hist, false, "after the history");
	paged_check_caches(r, w, g->caches, true, "after the step");
	if (!c) {
		ref = op_doubles(r, n);
		mag = op_doubles(r, n);
		paged_reference(r, w, ref, mag);
	}
	for (int i = 0; i < g->n_buckets; i++) {
		for (int in_place = 0; in_place < 2; in_place++) {
			const float *o = in_place ? g->in_place[i] : g->out[i];
			const char *how = in_place ? "in place over q" : "out of place";

			if (!c)
				op_check_rel(r, o, ref, mag, n, fmax(p->tol, w->tol_min),
					     "max_kv_len %d, %s: against attention in double",
					     g->bucket[i], how);
			else if (w->target_kv == KT_BF16)
				op_check_close(r, o, in_place ? c->in_place[i] : c->out[i], n,
					       4e-3, 2e-5, "max_kv_len %d, %s: against the cpu",
					       g->bucket[i], how);
			else
				op_check_close(r, o, in_place ? c->in_place[i] : c->out[i], n,
					       2e-5, 1e-10, "max_kv_len %d, %s: against the cpu",
					       g->bucket[i], how);
		}
	}
	{
		float *rounded = op_dup(r, g->out[0], n * sizeof(float));

		op_round_bf16(rounded, n);
		op_check_bits(r, g->out_bf16, rounded, n, "a bf16 out: the f32 out rounded");
	}
	if (g->alone)
		op_check_bits(r, g->alone, g->out[0], n, "each token alone as in the step");
	if (g->flat)
		op_check_bits(r, g->out[0], g->flat, n,
			      "block-major caches (layer %d of %d) as caches of their own",
			      p->w.layer, p->w.layers);
}

static const struct op_family attention = { att_build, att_run, att_check, false };

#define SEQS(...) .seqs = { __VA_ARGS__ }, .n_seqs = sizeof((struct paged_seq[]){ __VA_ARGS__ }) \
						      / sizeof(struct paged_seq)
/* A scenario of the cpu tests: q and k of one magnitude, shuffled tokens. */
#define SCENARIO(name, heads, kv_heads, d, block, mag, t, ...) \
	{ name, "attention", &attention, &(const struct att_params){ \
		.w = { .n_heads = heads, .n_kv = kv_heads, .D = d, .bs = block, \
		       .qmag = mag, .kmag = mag, SEQS(__VA_ARGS__) }, .tol = t } }
/* A step as the engine makes it (decode rows, then segments), q 2, k 1. */
#define STEP(name, heads, kv_heads, d, block, kv_dtype, shape_kind, seq_list) \
	{ name, "attention", &attention, &(const struct att_params){ \
		.w = { .n_heads = heads, .n_kv = kv_heads, .D = d, .bs = block, .kv = kv_dtype, \
		       .shape = shape_kind, .qmag = 2.0f, .kmag = 1.0f, seq_list }, \
		.tol = 1e-5, .buckets = true } }
/* STEP over block-major caches: layer l of n layers in one allocation. */
#define LAYERED(name, heads, kv_heads, d, block, kv_dtype, shape_kind, n, l, seq_list) \
	{ name, "attention", &attention, &(const struct att_params){ \
		.w = { .n_heads = heads, .n_kv = kv_heads, .D = d, .bs = block, .kv = kv_dtype, \
		       .shape = shape_kind, .qmag = 2.0f, .kmag = 1.0f, .layers = n, .layer = l, \
		       seq_list }, \
		.tol = 1e-5, .buckets = true } }

/* Eight slots: decode rows over several blocks, at position 0, over several
 * splits and ending on a split boundary (2048); prompt chunks after history,
 * from position 0, starting on a block boundary; one slot unused. */
#define MIXED SEQS({ 300, 1 }, { 0, 1 }, { 40, 10 }, { 0, 13 }, { 0, 0 }, { 1100, 1 }, \
		   { 2047, 1 }, { 16, 70 })
/* Decode rows only, lengths around block and split boundaries. */
#define DECODE SEQS({ 3000, 1 }, { 0, 1 }, { 17, 1 }, { 255, 1 }, { 256, 1 }, { 1023, 1 }, \
		    { 64, 1 }, { 4, 1 })
/* Decode rows and verifies (a row and up to 8 drafts) as the executor runs
 * them, all decode rows: across block and split boundaries, one at 0. */
#define VERIFY SEQS({ 300, 5 }, { 0, 1 }, { 17, 9 }, { 2046, 3 }, { 1100, 2 }, { 64, 1 }, \
		    { 3000, 9 }, { 0, 4 })
/* Prompt chunks only: from position 0, after history, across many blocks. */
#define PREFILL SEQS({ 0, 40 }, { 16, 70 }, { 300, 33 }, { 5, 2 })

static const struct op_case cases[] = {
	SCENARIO("attention MHA 4/4 D=64 bs=16", 4, 4, 64, 16, 1.0f, 1e-5,
		 { 0, 9 }, { 37, 1 }, { 16, 5 }, { 100, 1 }),
	SCENARIO("attention GQA 8/2 D=128 bs=8", 8, 2, 128, 8, 1.0f, 1e-5,
		 { 250, 1 }, { 3, 12 }, { 0, 1 }),
	SCENARIO("attention GQA 6/3 D=72 bs=5", 6, 3, 72, 5, 1.0f, 1e-5,
		 { 7, 1 }, { 0, 4 }, { 33, 3 }, { 1, 1 }, { 64, 1 }),
	SCENARIO("attention MQA 4/1 D=64 bs=32 long", 4, 1, 64, 32, 1.0f, 1e-5,
		 { 1000, 1 }, { 480, 40 }),
	SCENARIO("attention GQA 20/2 D=36 bs=16 group 10", 20, 2, 36, 16, 1.0f, 1e-5,
		 { 30, 1 }, { 5, 3 }, { 0, 6 }),
	SCENARIO("attention GQA 16/4 D=128 bs=16 peaky", 16, 4, 128, 16, 10.0f, 1e-4,
		 { 60, 1 }, { 0, 20 }, { 200, 2 }),
	STEP("attention GQA 32/8 D=128 bs=16 mixed (Qwen3-8B)", 32, 8, 128, 16, KV_NATIVE,
	     SHAPE_STEP, MIXED),
	STEP("attention GQA 8/2 D=128 bs=16 mixed", 8, 2, 128, 16, KV_NATIVE, SHAPE_STEP, MIXED),
	STEP("attention GQA 16/2 D=64 bs=16 mixed (group 8)", 16, 2, 64, 16, KV_NATIVE,
	     SHAPE_STEP, MIXED),
	STEP("attention GQA 8/4 D=64 bs=16 mixed (atlas-tiny)", 8, 4, 64, 16, KV_NATIVE,
	     SHAPE_STEP, MIXED),
	STEP("attention GQA 32/1 D=128 bs=32 mixed (group 32)", 32, 1, 128, 32, KV_NATIVE,
	     SHAPE_STEP, MIXED),
	STEP("attention GQA 2/1 D=256 bs=32 mixed", 2, 1, 256, 32, KV_NATIVE, SHAPE_STEP, MIXED),
	STEP("attention MHA 4/4 D=64 bs=16 mixed", 4, 4, 64, 16, KV_NATIVE, SHAPE_STEP, MIXED),
	STEP("attention MHA 4/4 D=128 bs=64 mixed", 4, 4, 128, 64, KV_NATIVE, SHAPE_STEP, MIXED),
	STEP("attention GQA 10/2 D=64 bs=5 mixed (group 5)", 10, 2, 64, 5, KV_NATIVE, SHAPE_STEP,
	     MIXED),
	STEP("attention MHA 3/3 D=128 bs=1 mixed", 3, 3, 128, 1, KV_NATIVE, SHAPE_STEP, MIXED),
	STEP("attention GQA 6/3 D=80 bs=7 mixed", 6, 3, 80, 7, KV_NATIVE, SHAPE_STEP, MIXED),
	/* 440 rows of group 8 after 60 of history, 16 kv heads: on a GPU of up
	 * to 160 multiprocessors (an H100's or H200's 132) prefill_wide_pays
	 * sends the segment to the wide prefill kernel (its grid's work
	 * outweighs its longest CTA), and the 3 rows beside it (fewer than a
	 * wide CTA) to the narrow one (cuda_attention.cu). */
	STEP("attention GQA 128/16 D=128 bs=16 prefill of a wide grid", 128, 16, 128, 16,
	     KV_NATIVE, SHAPE_STEP, SEQS({ 60, 440 }, { 7, 3 }, { 50, 1 })),
	STEP("attention GQA 32/8 D=128 bs=16 decode only", 32, 8, 128, 16, KV_NATIVE, SHAPE_STEP,
	     DECODE),
	STEP("attention GQA 8/4 D=64 bs=16 decode only", 8, 4, 64, 16, KV_NATIVE, SHAPE_STEP,
	     DECODE),
	STEP("attention GQA 32/8 D=128 bs=16 verifies as decode rows (Qwen3-8B)", 32, 8, 128, 16,
	     KV_NATIVE, SHAPE_DECODE_ROWS, VERIFY),
	STEP("attention GQA 8/4 D=64 bs=16 verifies as decode rows (atlas-tiny)", 8, 4, 64, 16,
	     KV_NATIVE, SHAPE_DECODE_ROWS, VERIFY),
	STEP("attention GQA 16/2 D=64 bs=16 verifies as decode rows (group 8)", 16, 2, 64, 16,
	     KV_NATIVE, SHAPE_DECODE_ROWS, VERIFY),
	STEP("attention GQA 8/2 D=128 bs=16 verifies as decode rows, f32 cache", 8, 2, 128, 16,
	     KV_F32, SHAPE_DECODE_ROWS, VERIFY),
	STEP("attention GQA 8/2 D=128 bs=16 mixed, f32 cache", 8, 2, 128, 16, KV_F32, SHAPE_STEP,
	     MIXED),
	STEP("attention MHA 3/3 D=34 bs=7 mixed, f32 cache", 3, 3, 34, 7, KV_F32, SHAPE_STEP,
	     MIXED),
	STEP("attention MQA 5/1 D=96 bs=1 mixed, f32 cache", 5, 1, 96, 1, KV_F32, SHAPE_STEP,
	     MIXED),
	STEP("attention GQA 8/2 D=128 bs=16 mixed, no step shape", 8, 2, 128, 16, KV_NATIVE,
	     SHAPE_PLAIN, MIXED),
	LAYERED("attention GQA 8/2 D=128 bs=16 mixed, block-major layer 1 of 3", 8, 2, 128, 16,
		KV_NATIVE, SHAPE_STEP, 3, 1, MIXED),
	LAYERED("attention GQA 8/4 D=64 bs=16 mixed, block-major last layer of 2", 8, 4, 64, 16,
		KV_NATIVE, SHAPE_STEP, 2, 1, MIXED),
	LAYERED("attention MHA 4/4 D=64 bs=16 decode only, block-major layer 1 of 4", 4, 4, 64,
		16, KV_NATIVE, SHAPE_STEP, 4, 1, DECODE),
	LAYERED("attention GQA 32/8 D=128 bs=16 decode only, block-major last layer of 3", 32, 8,
		128, 16, KV_NATIVE, SHAPE_STEP, 3, 2, DECODE),
	LAYERED("attention GQA 16/2 D=64 bs=32 prefill, block-major layer 1 of 2", 16, 2, 64, 32,
		KV_NATIVE, SHAPE_STEP, 2, 1, PREFILL),
	LAYERED("attention MHA 4/4 D=128 bs=8 prefill, block-major last layer of 3", 4, 4, 128, 8,
		KV_NATIVE, SHAPE_STEP, 3, 2, PREFILL),
	LAYERED("attention GQA 8/2 D=128 bs=16 mixed, f32 cache, block-major layer 1 of 3", 8, 2,
		128, 16, KV_F32, SHAPE_STEP, 3, 1, MIXED),
	LAYERED("attention MHA 3/3 D=80 bs=7 mixed, f32 cache, block-major last layer of 2", 3, 3,
		80, 7, KV_F32, SHAPE_STEP, 2, 1, MIXED),
	LAYERED("attention GQA 6/3 D=72 bs=5 mixed, block-major layer 0 of 2", 6, 3, 72, 5,
		KV_NATIVE, SHAPE_STEP, 2, 0, MIXED),
	LAYERED("attention GQA 8/2 D=128 bs=16 mixed, no step shape, block-major layer 1 of 3",
		8, 2, 128, 16, KV_NATIVE, SHAPE_PLAIN, 3, 1, MIXED),
};

OP_LIST(ops_attention, cases);
