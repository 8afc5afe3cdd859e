/* Cases of rope_store with attend_next: a layer's rope_store whose q only the
 * attention right after it reads, which a backend may run inside that
 * attention (cuda: in the decode kernel's blocks at one decode row,
 * kernels/cuda/cuda_attention_decode.cuh).
 *
 * Each case runs a product, rope_store (attend_next) and attention on one
 * copy of the paged world (ops_paged.h, history stored first), as a layer
 * does (cuda takes the rope_store only right after a product), and the
 * same without attend_next on another, on the same backend. Two rounds of
 * the same step (the decode kernel's split counters must start from 0
 * again; in a graph, recorded once and replayed): attention's out, the
 * sync point's code and every cache row must be the same bits. Against
 * the cpu, out within what a bf16 cache and bf16 tensor-core products
 * allow (max_abs 3e-2). On cuda, a case it takes leaves q unwritten, and
 * a case it leaves to rope_store writes q as rope_store does.
 *
 * Taken on cuda: Qwen3-0.6B's and 8B's heads (16 or 32 q heads over 8 kv
 * heads of 128) with bf16 norms and one qkv, in the engine's block-major
 * caches; histories of 0, 63 and 64 (the row's own key last of a tile,
 * first of a tile and of a block); bounds of 256 (the graph's for a short
 * context), 1024 (the own key in a split past split 0, which stores it)
 * and 4096 (in a graph); no norms and a group of 1; partial rotary; a
 * group of 16 (one CTA's heads); a bf16 out; head_dim 64 with f32 norms
 * and q, k, v apart (q uploaded, so its being unwritten is not checked).
 * Left to rope_store first (cuda): two decode rows; a group of 24 (two
 * head chunks); q downloaded between the two (q must be written); f32
 * caches; no product before the rope_store. Device faults: a negative
 * position, a bad block id for the row's own key, a slot past the table
 * (the row NaN, the sync point failing, the caches as rope_store leaves
 * them).
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "tests/ops/ops_rope_in.h"

enum ra_norm { RA_NO_NORM, RA_NORM_F32, RA_NORM_BF16 };
enum ra_fault { RA_CLEAN, RA_POS_NEGATIVE, RA_BAD_BLOCK, RA_SLOT_PAST };

struct ra_params {
	struct paged_params w;
	int rot;           /* rotated dims of a head; 0: all */
	enum ra_norm norm;
	bool packed;       /* q, k and v as the rows of one qkv */
	int max_kv;        /* the batch's bound; 0: the step's own */
	bool graph;        /* the fused side recorded as a graph and replayed */
	bool read_q;       /* q downloaded between rope_store and attention */
	bool out_bf16;
	bool no_product;   /* no product right before the rope_store */
	bool taken;        /* cuda runs it inside the attention: q (packed) never written */
	enum ra_fault fault;
};

#define RA_ROUNDS 2


struct ra_side {
	int rc[RA_ROUNDS], rc_sync[RA_ROUNDS];
	float *out[RA_ROUNDS], *q_read[RA_ROUNDS];
	float *snap, *q_after;
};

struct ra_out {
	struct ra_side fused, apart;
	bool cuda;
};

static const float ra_eps = 1e-6f;

static void *ra_build(struct op_run *r, const void *params, const struct op_backend *target)
{
	const struct ra_params *p = params;
	struct rope_in *in = op_alloc(r, sizeof(*in));

	rope_in_build(r, in, &p->w, p->rot, target);
	return in;
}

/* One side's tensors and the ops of a round. */
struct ra_world {
	const struct ra_params *p;
	const struct paged_world *w;
	const struct op_backend *b;
	struct op_run *r;
	struct kt_rope_store_args args;
	struct kt_batch batch;
	struct kt_tensor q, out;
	struct kt_tensor px, pw, py; /* the product before: py = px · pwᵀ */
	float *q_read;     /* read_q: q as the download found it */
};

static int ra_round(void *ctx)
{
	struct ra_world *c = ctx;
	struct kt_backend *be = c->b->be;
	int rc = c->p->no_product ? 0 : kt_matmul(be, &c->py, &c->px, &c->pw, NULL);

	if (rc || (rc = kt_rope_store(be, &c->args, &c->batch)))
		return rc;
	if (c->p->read_q)
		c->q_read = op_get(c->r, c->b, &c->q);
	return kt_attention(be, &c->out, &c->q, c->args.kcache, c->args.vcache, &c->batch,
			    c->p->w.n_heads, c->p->w.n_kv, c->p->w.D, c->w->scale);
}

/* The case's device fault put into the batch of the step (one row). */
static void ra_break(struct op_run *r, const struct ra_params *p, const struct paged_world *w,
		     const struct op_backend *b, struct kt_batch *batch)
{
	const int32_t slot = w->step.slot[0], pos = w->step.pos[0];
	int32_t *table;

	switch (p->fault) {
	case RA_CLEAN:
		return;
	case RA_POS_NEGATIVE:
		batch->pos = op_tensor_raw(r, b, KT_I32, 1, 1, &(int32_t){ -1 });
		return;
	case RA_SLOT_PAST:
		batch->seq = op_tensor_raw(r, b, KT_I32, 1, 1, &(int32_t){ w->n_slots + 2 });
		return;
	case RA_BAD_BLOCK:
		table = op_dup(r, w->table, (size_t)w->n_slots * w->bt_cols * sizeof(int32_t));
		table[(size_t)slot * w->bt_cols + pos / p->w.bs] = w->n_blocks + 5;
		batch->block_tables = op_tensor_raw(r, b, KT_I32, w->n_slots, w->bt_cols, table);
		return;
	}
}

static void ra_side_run(struct op_run *r, const struct ra_params *p, const struct rope_in *in,
			const struct op_backend *b, bool fused, struct ra_side *o)
{
	const struct paged_world *w = &in->world;
	const enum kt_dtype ndt = p->norm == RA_NORM_BF16 ? KT_BF16 : KT_F32;
	const int T = w->step.T;
	struct ra_world c = { .p = p, .w = w, .b = b, .r = r };
	struct paged_dev d = paged_setup(r, b, w);
	struct kt_tensor qkv, k, v, inv, qn, kn;

	for (int i = 0; i < w->n_hist; i++)
		op_ok(r, paged_store(r, b, w, &d, &w->hist[i]), "history stored");
	c.batch = paged_batch(r, b, w, &d, &w->step,
			      p->max_kv ? p->max_kv : paged_max_len(&w->step));
	ra_break(r, p, w, b, &c.batch);
	c.q = op_tensor(r, b, KT_F32, T, w->QC, p->packed ? NULL : w->q);
	k = op_tensor(r, b, KT_F32, T, w->C, p->packed ? NULL : in->k);
	v = op_tensor(r, b, KT_F32, T, w->C, p->packed ? NULL : in->v);
	qkv = op_tensor(r, b, KT_F32, T, w->QC + 2 * w->C, p->packed ? rope_in_packed(r, in) : NULL);
	inv = op_tensor(r, b, KT_F32, 1, in->R / 2, in->inv);
	qn = ndt == KT_BF16 ? op_weight_bf16(r, b, in->qn, 1, p->w.D)
			    : op_weight(r, b, KT_F32, in->qn, 1, p->w.D);
	kn = ndt == KT_BF16 ? op_weight_bf16(r, b, in->kn, 1, p->w.D)
			    : op_weight(r, b, KT_F32, in->kn, 1, p->w.D);
	c.out = op_tensor(r, b, p->out_bf16 ? KT_BF16 : KT_F32, T, w->QC, NULL);
	c.px = op_tensor(r, b, KT_F32, 1, 64, in->k);
	c.pw = op_weight_bf16(r, b, (float[16 * 64]){ 0 }, 16, 64);
	c.py = op_tensor(r, b, KT_F32, 1, 16, NULL);
	c.args = (struct kt_rope_store_args){
		.qkv = p->packed ? &qkv : NULL, .q = &c.q, .k = &k, .v = &v, .inv_freq = &inv,
		.q_norm = p->norm == RA_NO_NORM ? NULL : &qn,
		.k_norm = p->norm == RA_NO_NORM ? NULL : &kn, .kcache = &d.kc, .vcache = &d.vc,
		.n_heads = p->w.n_heads, .n_kv_heads = p->w.n_kv, .head_dim = p->w.D,
		.eps = ra_eps, .attend_next = fused,
	};
	for (int i = 0; i < RA_ROUNDS; i++) {
		/* rope_store ropes q and k in place: the next round starts from them again */
		if (!p->packed && i > 0) {
			op_set(r, b, &c.q, w->q);
			op_set(r, b, &k, in->k);
		}
		o->rc[i] = fused && p->graph ? kt_graph(b->be, op_case_key(r), ra_round, &c)
					     : ra_round(&c);
		o->rc_sync[i] = kt_synchronize(b->be);
		o->out[i] = op_get(r, b, &c.out);
		o->q_read[i] = c.q_read;
		op_poison(r, b, &c.out);
	}
	o->snap = paged_snapshot(r, b, w, &d);
	o->q_after = op_get(r, b, &c.q);
}

static void *ra_run(struct op_run *r, const void *params, const void *input,
		    const struct op_backend *b)
{
	struct ra_out *o = op_alloc(r, sizeof(*o));

	ra_side_run(r, params, input, b, true, &o->fused);
	ra_side_run(r, params, input, b, false, &o->apart);
	o->cuda = !strcmp(b->be->info.backend, "cuda");
	return o;
}

static void ra_check(struct op_run *r, const void *params, const void *input, const void *got,
		     const void *cpu)
{
	const struct ra_params *p = params;
	const struct rope_in *in = input;
	const struct paged_world *w = &in->world;
	const struct ra_out *g = got, *c = cpu;
	const size_t nq = (size_t)w->step.T * w->QC;

	for (int i = 0; i < RA_ROUNDS; i++) {
		op_check_rc(r, g->fused.rc[i], g->apart.rc[i],
			    "round %d: the call's code as rope_store's then attention's", i + 1);
		op_check_rc(r, g->fused.rc_sync[i], g->apart.rc_sync[i],
			    "round %d: the sync point's code as theirs", i + 1);
		if (p->fault == RA_CLEAN) {
			op_check_rc(r, g->fused.rc[i], 0, "round %d: the ops run", i + 1);
			op_check_rc(r, g->fused.rc_sync[i], 0, "round %d: a clean sync point", i + 1);
		}
		op_check_bits(r, g->fused.out[i], g->apart.out[i], nq,
			      "round %d: out equal to rope_store's then attention's", i + 1);
		if (p->read_q)
			op_check_bits(r, g->fused.q_read[i], g->apart.q_read[i], nq,
				      "round %d: q, read between them, roped", i + 1);
	}
	op_check_bits(r, g->fused.snap, g->apart.snap, paged_snapshot_rows(w) * w->C,
		      "every cache row equal to rope_store's");
	if (g->cuda && p->taken)
		op_check_poison(r, g->fused.q_after, nq,
				"cuda: q never written (the rope ran in the attention)");
	else if (g->cuda && p->packed && p->fault == RA_CLEAN)
		op_check_bits(r, g->fused.q_after, g->apart.q_after, nq,
			      "cuda: q roped as rope_store ropes it (left to rope_store)");
	if (c && p->fault == RA_CLEAN)
		op_check_close(r, g->fused.out[0], c->fused.out[0], nq, 3e-2, 1e-3,
			       "out against the cpu");
}

static const struct op_family rope_attend = { ra_build, ra_run, ra_check, false };

#define SEQS(...) .n_seqs = sizeof((struct paged_seq[]){ __VA_ARGS__ }) / sizeof(struct paged_seq), \
		  .seqs = { __VA_ARGS__ }
#define RA(name, ...) \
	{ name, "rope_store", &rope_attend, &(const struct ra_params){ __VA_ARGS__ } }
/* Qwen3-0.6B's (hq 16) or 8B's (hq 32) attention, one decode row after a
 * history of h, in the engine's block-major caches. */
#define QWEN3(hq, h) \
	.w = { .n_heads = hq, .n_kv = 8, .D = 128, .bs = 16, SEQS({ h, 1 }), \
	       .shape = SHAPE_STEP, .qmag = 1, .kmag = 1, .layers = 3, .layer = 1 }

static const struct op_case cases[] = {
	RA("rope_store attend_next 0.6B heads, history 40, bound 256", QWEN3(16, 40),
	   .norm = RA_NORM_BF16, .packed = true, .max_kv = 256, .taken = true),
	RA("rope_store attend_next 8B heads, history 600, bound 1024 (own key past split 0)",
	   QWEN3(32, 600), .norm = RA_NORM_BF16, .packed = true, .max_kv = 1024, .taken = true),
	RA("rope_store attend_next 8B heads, history 150, bound 256", QWEN3(32, 150),
	   .norm = RA_NORM_BF16, .packed = true, .max_kv = 256, .taken = true),
	RA("rope_store attend_next 8B heads, history 1000, bound 4096, in a graph",
	   QWEN3(32, 1000), .norm = RA_NORM_BF16, .packed = true, .max_kv = 4096, .graph = true,
	   .taken = true),
	RA("rope_store attend_next 0.6B heads, history 0", QWEN3(16, 0), .norm = RA_NORM_BF16,
	   .packed = true, .max_kv = 256, .taken = true),
	RA("rope_store attend_next 0.6B heads, history 63 (own key last of a tile)",
	   QWEN3(16, 63), .norm = RA_NORM_BF16, .packed = true, .taken = true),
	RA("rope_store attend_next 0.6B heads, history 64 (own key first of a tile and block)",
	   QWEN3(16, 64), .norm = RA_NORM_BF16, .packed = true, .max_kv = 256, .taken = true),
	RA("rope_store attend_next 0.6B heads, history 40, bf16 out", QWEN3(16, 40),
	   .norm = RA_NORM_BF16, .packed = true, .max_kv = 256, .out_bf16 = true, .taken = true),
	RA("rope_store attend_next D=64 8/2 heads, f32 norms, q k v apart, history 100",
	   .w = { .n_heads = 8, .n_kv = 2, .D = 64, .bs = 16, SEQS({ 100, 1 }),
		  .shape = SHAPE_STEP, .qmag = 1, .kmag = 1 },
	   .norm = RA_NORM_F32),
	RA("rope_store attend_next no norms, 4/4 heads, history 20",
	   .w = { .n_heads = 4, .n_kv = 4, .D = 128, .bs = 16, SEQS({ 20, 1 }),
		  .shape = SHAPE_STEP, .qmag = 1, .kmag = 1 },
	   .packed = true, .max_kv = 256, .taken = true),
	RA("rope_store attend_next partial R=64 of 128, 8/2 heads, history 70",
	   .w = { .n_heads = 8, .n_kv = 2, .D = 128, .bs = 16, SEQS({ 70, 1 }),
		  .shape = SHAPE_STEP, .qmag = 1, .kmag = 1 },
	   .rot = 64, .norm = RA_NORM_BF16, .packed = true, .max_kv = 512, .taken = true),
	RA("rope_store attend_next 16/1 heads (a CTA's 16), history 90",
	   .w = { .n_heads = 16, .n_kv = 1, .D = 128, .bs = 16, SEQS({ 90, 1 }),
		  .shape = SHAPE_STEP, .qmag = 1, .kmag = 1 },
	   .norm = RA_NORM_BF16, .packed = true, .max_kv = 256, .taken = true),
	RA("rope_store attend_next 24/1 heads (two head chunks: not taken)",
	   .w = { .n_heads = 24, .n_kv = 1, .D = 128, .bs = 16, SEQS({ 90, 1 }),
		  .shape = SHAPE_STEP, .qmag = 1, .kmag = 1 },
	   .norm = RA_NORM_BF16, .packed = true, .max_kv = 256),
	RA("rope_store attend_next two decode rows (not taken)",
	   .w = { .n_heads = 16, .n_kv = 8, .D = 128, .bs = 16, SEQS({ 40, 1 }, { 7, 1 }),
		  .shape = SHAPE_STEP, .qmag = 1, .kmag = 1 },
	   .norm = RA_NORM_BF16, .packed = true, .max_kv = 256),
	RA("rope_store attend_next, q downloaded before the attention", QWEN3(16, 40),
	   .norm = RA_NORM_BF16, .packed = true, .max_kv = 256, .read_q = true),
	RA("rope_store attend_next, no product before it (not taken)", QWEN3(16, 40),
	   .norm = RA_NORM_BF16, .packed = true, .max_kv = 256, .no_product = true),
	RA("rope_store attend_next f32 caches (not taken)",
	   .w = { .n_heads = 16, .n_kv = 8, .D = 128, .bs = 16, SEQS({ 40, 1 }),
		  .kv = KV_F32, .shape = SHAPE_STEP, .qmag = 1, .kmag = 1 },
	   .norm = RA_NORM_BF16, .packed = true, .max_kv = 256),
	RA("rope_store attend_next: a negative position", QWEN3(16, 40), .norm = RA_NORM_BF16,
	   .packed = true, .max_kv = 256, .fault = RA_POS_NEGATIVE, .taken = true),
	RA("rope_store attend_next: a bad block id for the row's own key", QWEN3(32, 150),
	   .norm = RA_NORM_BF16, .packed = true, .max_kv = 256, .fault = RA_BAD_BLOCK,
	   .taken = true),
	RA("rope_store attend_next: a slot past the table", QWEN3(16, 40), .norm = RA_NORM_BF16,
	   .packed = true, .max_kv = 256, .fault = RA_SLOT_PAST, .taken = true),
};

OP_LIST(ops_rope_attend, cases);
