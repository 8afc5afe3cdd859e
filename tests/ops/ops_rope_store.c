/* Cases of rope_store: a layer's rope of q, rope of k and kv_store of k and
 * v as one op (cuda: one launch), over the paged world of the attention
 * cases (ops_paged.h): history stored first, then the step's tokens.
 *
 * On every backend the op must give what the three ops give one after
 * another on the same backend, bit for bit: q and k (roped in place) and
 * every row of the caches, the step's rows where the block table puts them
 * and every other row as it was (history, other layers, poison). The case
 * runs both on two copies of the world. Against the cpu, q and k within
 * the tolerance of the rope cases (max_abs 1e-5, NMSE 1e-12).
 *
 * Shapes: Qwen3-8B and -0.6B heads (32 or 16 q heads, 8 kv heads of 128)
 * with the bf16 q/k norms, decode rows and a prefill segment, caches of
 * their own and block-major ones; Qwen3-Next's partial rotary (64 of 256
 * dims, f32 norms) into f32 caches; no norm at head_dim 64; a q norm
 * without a k norm (cuda runs the three ops apart). The same with q, k and
 * v given as the rows of one qkv (q, k and v poisoned before: their values
 * must come from qkv; k and v are scratch then and not compared).
 * Refusals: q and k that overlap, a k of the wrong width; nothing is
 * written.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "tests/ops/ops_rope_in.h"

enum rs_norm { RS_NONE, RS_F32, RS_BF16, RS_Q_ONLY };

struct rs_params {
	struct paged_params w;
	int rot;    /* rotated dims of a head; 0: all */
	enum rs_norm norm;
	bool packed; /* q, k and v given as the rows of one qkv tensor (k and v scratch) */
};


struct rs_out {
	int rc, rc_q, rc_k, rc_store;
	float *q, *k, *snap;              /* rope_store */
	float *q_apart, *k_apart, *snap_apart; /* the three ops */
};

static const float rs_eps = 1e-6f;

static void *rs_build(struct op_run *r, const void *params, const struct op_backend *target)
{
	const struct rs_params *p = params;
	struct rope_in *in = op_alloc(r, sizeof(*in));

	rope_in_build(r, in, &p->w, p->rot, target);
	return in;
}

/* One copy of the world on b with its history stored, and the step's
 * tensors: q, k, v uploaded. */
struct rs_dev {
	struct paged_dev d;
	struct kt_batch batch;
	struct kt_tensor q, k, v;
};

static struct rs_dev rs_setup(struct op_run *r, const struct op_backend *b,
			      const struct rope_in *in, bool poisoned)
{
	const struct paged_world *w = &in->world;
	struct rs_dev s;

	s.d = paged_setup(r, b, w);
	for (int c = 0; c < w->n_hist; c++)
		op_ok(r, paged_store(r, b, w, &s.d, &w->hist[c]), "history stored");
	s.batch = paged_batch(r, b, w, &s.d, &w->step, paged_max_len(&w->step));
	s.q = op_tensor(r, b, KT_F32, w->step.T, w->QC, poisoned ? NULL : w->q);
	s.k = op_tensor(r, b, KT_F32, w->step.T, w->C, poisoned ? NULL : in->k);
	s.v = op_tensor(r, b, KT_F32, w->step.T, w->C, poisoned ? NULL : in->v);
	return s;
}

static void *rs_run(struct op_run *r, const void *params, const void *input,
		    const struct op_backend *b)
{
	const struct rs_params *p = params;
	const struct rope_in *in = input;
	const struct paged_world *w = &in->world;
	const enum kt_dtype ndt = p->norm == RS_BF16 ? KT_BF16 : KT_F32;
	struct rs_out *o = op_alloc(r, sizeof(*o));
	struct rs_dev one = rs_setup(r, b, in, p->packed), three = rs_setup(r, b, in, false);
	struct kt_tensor qkv = op_tensor(r, b, KT_F32, w->step.T, w->QC + 2 * w->C,
					 p->packed ? rope_in_packed(r, in) : NULL);
	struct kt_tensor inv = op_tensor(r, b, KT_F32, 1, in->R / 2, in->inv);
	struct kt_tensor qn = ndt == KT_BF16 ? op_weight_bf16(r, b, in->qn, 1, p->w.D)
					    : op_weight(r, b, KT_F32, in->qn, 1, p->w.D);
	struct kt_tensor kn = ndt == KT_BF16 ? op_weight_bf16(r, b, in->kn, 1, p->w.D)
					    : op_weight(r, b, KT_F32, in->kn, 1, p->w.D);
	const struct kt_tensor *qnp = p->norm == RS_NONE ? NULL : &qn;
	const struct kt_tensor *knp = p->norm == RS_NONE || p->norm == RS_Q_ONLY ? NULL : &kn;
	struct kt_rope_store_args a = {
		.qkv = p->packed ? &qkv : NULL, .q = &one.q, .k = &one.k, .v = &one.v, .inv_freq = &inv, .q_norm = qnp,
		.k_norm = knp, .kcache = &one.d.kc, .vcache = &one.d.vc, .n_heads = p->w.n_heads,
		.n_kv_heads = p->w.n_kv, .head_dim = p->w.D, .eps = rs_eps,
	};

	o->rc = kt_rope_store(b->be, &a, &one.batch);
	o->rc_q = kt_rope(b->be, &three.q, &three.batch.pos, &inv, p->w.n_heads, p->w.D, qnp,
			  rs_eps);
	o->rc_k = kt_rope(b->be, &three.k, &three.batch.pos, &inv, p->w.n_kv, p->w.D, knp,
			  rs_eps);
	o->rc_store = kt_kv_store(b->be, &three.d.kc, &three.d.vc, &three.k, &three.v,
				  &three.batch);
	o->q = op_get(r, b, &one.q);
	o->k = op_get(r, b, &one.k);
	o->snap = paged_snapshot(r, b, w, &one.d);
	o->q_apart = op_get(r, b, &three.q);
	o->k_apart = op_get(r, b, &three.k);
	o->snap_apart = paged_snapshot(r, b, w, &three.d);
	return o;
}

static void rs_check(struct op_run *r, const void *params, const void *input, const void *got,
		     const void *cpu)
{
	const struct rs_params *p = params;
	const struct rope_in *in = input;
	const struct paged_world *w = &in->world;
	const struct rs_out *g = got, *c = cpu;
	const size_t nq = (size_t)w->step.T * w->QC, nk = (size_t)w->step.T * w->C;

	op_check_rc(r, g->rc, 0, "rope_store runs");
	op_check_rc(r, g->rc_q, 0, "rope of q runs");
	op_check_rc(r, g->rc_k, 0, "rope of k runs");
	op_check_rc(r, g->rc_store, 0, "kv_store runs");
	op_check_bits(r, g->q, g->q_apart, nq, "q equal to rope's");
	if (!p->packed)
		op_check_bits(r, g->k, g->k_apart, nk, "k equal to rope's");
	op_check_bits(r, g->snap, g->snap_apart, paged_snapshot_rows(w) * w->C,
		      "every cache row equal to kv_store's after rope");
	if (c) {
		op_check_close(r, g->q, c->q, nq, 1e-5, 1e-12, "q against the cpu");
		if (!p->packed)
			op_check_close(r, g->k, c->k, nk, 1e-5, 1e-12, "k against the cpu");
	}
}

static const struct op_family rope_store = { rs_build, rs_run, rs_check, false };

/* Refusals: q and k that overlap (kt_rope_store's own check), k of the
 * wrong width (the backend's). Nothing is written: q, k and the caches
 * stay poisoned. */
enum rs_fault { RS_QK_OVERLAP, RS_K_COLS };

struct rs_fault_params {
	enum rs_fault fault;
};

struct rs_fault_out {
	int rc_call, rc_sync;
	float *qk, *kc, *vc;
};

static void *rs_fault_run(struct op_run *r, const void *params, const void *input,
			  const struct op_backend *b)
{
	const struct rs_fault_params *p = params;
	struct rs_fault_out *o = op_alloc(r, sizeof(*o));
	const int32_t pos[2] = { 3, 4 }, seq[2] = { 0, 0 }, table[4] = { 0, 1, 2, 3 };
	/* q: rows 0-1 of qk [4, 128]; k: rows 1-2 (overlapping q) or rows 2-3
	 * read as 120 columns */
	struct kt_tensor qk = op_tensor(r, b, KT_F32, 4, 128, NULL);
	struct kt_tensor q = kt_rows(qk, 0, 2);
	struct kt_tensor k = p->fault == RS_QK_OVERLAP ? kt_rows(qk, 1, 2)
						       : kt_reshape(kt_rows(qk, 2, 2), 2, 120);
	struct kt_tensor v = op_tensor(r, b, KT_F32, 2, 128, NULL);
	struct kt_tensor kc = op_tensor(r, b, b->be->info.kv_dtype, 4 * 16, 128, NULL);
	struct kt_tensor vc = op_tensor(r, b, b->be->info.kv_dtype, 4 * 16, 128, NULL);
	struct kt_tensor inv = op_tensor(r, b, KT_F32, 1, 32, NULL);
	struct kt_batch batch = {
		.n_tokens = 2, .block_size = 16,
		.pos = op_tensor_raw(r, b, KT_I32, 2, 1, pos),
		.seq = op_tensor_raw(r, b, KT_I32, 2, 1, seq),
		.block_tables = op_tensor_raw(r, b, KT_I32, 1, 4, table),
	};
	struct kt_rope_store_args a = {
		.q = &q, .k = &k, .v = &v, .inv_freq = &inv, .kcache = &kc, .vcache = &vc,
		.n_heads = 2, .n_kv_heads = 2, .head_dim = 64, .eps = rs_eps,
	};

	op_set(r, b, &inv, (float[32]){ 0 });
	o->rc_call = kt_rope_store(b->be, &a, &batch);
	o->rc_sync = kt_synchronize(b->be);
	o->qk = op_get(r, b, &qk);
	o->kc = op_get(r, b, &kc);
	o->vc = op_get(r, b, &vc);
	return o;
}

static void rs_fault_check(struct op_run *r, const void *params, const void *input,
			   const void *got, const void *cpu)
{
	const struct rs_fault_out *g = got;

	op_check_rc(r, g->rc_call, -EINVAL, "refused at the call");
	op_check_rc(r, g->rc_sync, 0, "nothing to report at the sync point");
	op_check_poison(r, g->qk, 4 * 128, "q and k left alone");
	op_check_poison(r, g->kc, 64 * 128, "k cache left alone");
	op_check_poison(r, g->vc, 64 * 128, "v cache left alone");
}

static const struct op_family rs_fault = { NULL, rs_fault_run, rs_fault_check, true };

#define SEQS(...) .n_seqs = sizeof((struct paged_seq[]){ __VA_ARGS__ }) / sizeof(struct paged_seq), \
		  .seqs = { __VA_ARGS__ }
#define RS(name, ...) { name, "rope_store", &rope_store, &(const struct rs_params){ __VA_ARGS__ } }
#define RS_FAULT(name, f) \
	{ name, "rope_store", &rs_fault, &(const struct rs_fault_params){ f } }

static const struct op_case cases[] = {
	RS("rope_store 8B heads, 4 decode rows, bf16 norms",
	   .w = { .n_heads = 32, .n_kv = 8, .D = 128, .bs = 16, SEQS({ 37, 1 }, { 0, 1 },
		  { 100, 1 }, { 15, 1 }), .shape = SHAPE_STEP, .qmag = 1, .kmag = 1 },
	   .norm = RS_BF16),
	RS("rope_store 0.6B heads, a segment of 40 and 2 decode rows, block-major",
	   .w = { .n_heads = 16, .n_kv = 8, .D = 128, .bs = 16, SEQS({ 9, 40 }, { 20, 1 },
		  { 3, 1 }), .shape = SHAPE_STEP, .qmag = 1, .kmag = 1, .layers = 3,
		  .layer = 1 },
	   .norm = RS_BF16),
	RS("rope_store partial R=64 of 256, 16/2 heads, f32 norms, f32 caches",
	   .w = { .n_heads = 16, .n_kv = 2, .D = 256, .bs = 8, SEQS({ 5, 7 }, { 12, 1 }),
		  .kv = KV_F32, .shape = SHAPE_STEP, .qmag = 1, .kmag = 1 },
	   .rot = 64, .norm = RS_F32),
	RS("rope_store no norm D=64 4/4 heads, 9 shuffled tokens",
	   .w = { .n_heads = 4, .n_kv = 4, .D = 64, .bs = 4, SEQS({ 6, 5 }, { 0, 4 }),
		  .shape = SHAPE_PLAIN, .qmag = 1, .kmag = 1 }),
	RS("rope_store q norm without k norm (cuda: three ops)",
	   .w = { .n_heads = 8, .n_kv = 2, .D = 64, .bs = 16, SEQS({ 30, 3 }),
		  .shape = SHAPE_STEP, .qmag = 1, .kmag = 1 },
	   .norm = RS_Q_ONLY),
	RS("rope_store packed qkv, 8B heads, 3 decode rows and a segment of 20",
	   .w = { .n_heads = 32, .n_kv = 8, .D = 128, .bs = 16, SEQS({ 37, 1 }, { 0, 20 },
		  { 100, 1 }, { 15, 1 }), .shape = SHAPE_STEP, .qmag = 1, .kmag = 1 },
	   .norm = RS_BF16, .packed = true),
	RS("rope_store packed qkv, partial R=64 of 256, f32 caches",
	   .w = { .n_heads = 16, .n_kv = 2, .D = 256, .bs = 8, SEQS({ 5, 7 }, { 12, 1 }),
		  .kv = KV_F32, .shape = SHAPE_STEP, .qmag = 1, .kmag = 1 },
	   .rot = 64, .norm = RS_F32, .packed = true),
	RS("rope_store packed qkv, q norm without k norm (cuda: taken apart, three ops)",
	   .w = { .n_heads = 8, .n_kv = 2, .D = 64, .bs = 16, SEQS({ 30, 3 }, { 2, 1 }),
		  .shape = SHAPE_STEP, .qmag = 1, .kmag = 1 },
	   .norm = RS_Q_ONLY, .packed = true),
	RS("rope_store packed qkv, no norm, 9 shuffled tokens",
	   .w = { .n_heads = 4, .n_kv = 4, .D = 64, .bs = 4, SEQS({ 6, 5 }, { 0, 4 }),
		  .shape = SHAPE_PLAIN, .qmag = 1, .kmag = 1 },
	   .packed = true),
	RS_FAULT("rope_store: q and k overlap", RS_QK_OVERLAP),
	RS_FAULT("rope_store: k of the wrong width", RS_K_COLS),
};

OP_LIST(ops_rope_store, cases);
