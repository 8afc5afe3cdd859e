/* Cases of attention over the parts of a context (attention_part,
 * attention_staged, attention_finish) and of kv_stage, over block-major
 * worlds of ops_paged.h, as the swap tier runs them (DESIGN §8): each
 * sequence's first H blocks are "off the device", the rest on it.
 *
 * The first H blocks of every sequence are pieces, in sequence order; every
 * other piece is read from host memory (a copy of its block in memory from
 * host_alloc, named by a negative id), the rest from the pool itself.
 * kv_stage gathers the layer's K and V rows of the pieces into staging
 * buffers of `slots` blocks, round by round (K as an op, V beside the ops
 * with a ticket that the ops after it wait for); attention_staged folds each
 * round (span per token: its sequence's pieces in the round), then
 * attention_part the device blocks (from = H * bs per slot), and
 * attention_finish writes the output.
 *
 * Checks: the staging buffers hold the pieces' rows bitwise; the output
 * matches attention in double (tolerance as ops_attention.c); on the cpu it
 * is bitwise the output of one attention call over the whole context (the
 * parts fold the same blocks in the same order), and on other backends
 * within their attention tolerance of the cpu's; attention_finish into a
 * bf16 out holds the f32 out rounded to nearest even, bit for bit. A
 * sequence with H 0, one whose pieces straddle rounds, and tokens with
 * nothing staged in a round are in every case.
 */
#include <math.h>
#include <string.h>

#include "common/err.h"
#include "tests/ops/ops_paged.h"

struct parts_params {
	struct paged_params w;
	int slots;     /* staging capacity, in blocks */
	double tol;
};

struct parts_out {
	int rc_store, rc;
	float *whole;  /* one attention call over the whole context */
	float *parts;  /* staged rounds, the device part, the finish */
	float *parts_bf16; /* the same state finished into a bf16 out, widened */
	float *stage_k, *stage_v; /* the last round's staging buffers */
	float *want_k, *want_v;   /* what they must hold: the pieces' rows from the pool */
	int last_round_pieces;
};

static void *parts_build(struct op_run *r, const void *params, const struct op_backend *target)
{
	const struct parts_params *p = params;
	struct paged_world *w = op_alloc(r, sizeof(*w));

	paged_build(r, w, &p->w, target);
	return w;
}

/* Blocks of sequence s off the device: all its history blocks but the last
 * one for even s, none for s = 1. */
static int staged_blocks(const struct paged_world *w, int s)
{
	const int full = w->p->seqs[s].hist / w->p->bs;

	if (s == 1)
		return 0;
	return s % 2 ? full : (full > 1 ? full - 1 : 0);
}

static void *parts_run(struct op_run *r, const void *params, const void *input,
		       const struct op_backend *b)
{
	const struct parts_params *p = params;
	const struct paged_world *w = input;
	const struct paged_params *wp = w->p;
	struct parts_out *o = op_alloc(r, sizeof(*o));
	struct paged_dev d = paged_setup(r, b, w);
	const int T = w->step.T, L = paged_max_len(&w->step), bs = wp->bs;
	const size_t esz = kt_dtype_size(d.kv), row_bytes = (size_t)w->C * esz;
	const size_t block_bytes = (size_t)d.block_rows * row_bytes;
	const size_t k_off = (size_t)wp->layer * 2 * bs * row_bytes, v_off = k_off + bs * row_bytes;
	struct kt_tensor q = op_tensor(r, b, KT_F32, T, w->QC, w->q);
	struct kt_tensor out = op_tensor(r, b, KT_F32, T, w->QC, NULL);
	struct kt_batch batch;
	int first_piece[PAGED_MAX_SEQS], n_pieces = 0;

	o->rc_store = paged_store_all(r, b, w, &d);
	batch = paged_batch(r, b, w, &d, &w->step, L);
	o->rc = kt_attention(b->be, &out, &q, &d.kc, &d.vc, &batch, wp->n_heads, wp->n_kv,
			     wp->D, w->scale);
	o->whole = op_get(r, b, &out);

	/* The pieces, and the host copies of every other one. */
	for (int s = 0; s < wp->n_seqs; s++) {
		first_piece[s] = n_pieces;
		n_pieces += staged_blocks(w, s);
	}
	int32_t *ids = op_ints(r, (size_t)n_pieces + 1);
	void *host = NULL;
	op_ok(r, kt_host_alloc(b->be, (size_t)(n_pieces + 1) * block_bytes, &host),
	      "kt_host_alloc");
	char *all = op_alloc(r, kt_nbytes(&d.all));
	op_ok(r, kt_download(b->be, all, &d.all, 0, kt_nbytes(&d.all)), "kt_download");
	for (int s = 0; s < wp->n_seqs; s++)
		for (int j = 0; j < staged_blocks(w, s); j++) {
			const int i = first_piece[s] + j;
			const int32_t blk = w->table[(size_t)w->slot[s] * w->bt_cols + j];

			ids[i] = blk;
			if (i % 2) {
				memcpy((char *)host + (size_t)i * block_bytes,
				       all + (size_t)blk * block_bytes, block_bytes);
				ids[i] = -1 - i;
			}
		}

	/* from per slot, and the state. */
	int32_t *from = op_ints(r, (size_t)w->n_slots);
	for (int s = 0; s < wp->n_seqs; s++)
		from[w->slot[s]] = staged_blocks(w, s) * bs;
	struct kt_tensor d_from = op_tensor_raw(r, b, KT_I32, w->n_slots, 1, from);
	struct kt_att_state st = {
		op_tensor(r, b, KT_F32, T, w->QC, NULL),
		op_tensor(r, b, KT_F32, T, 2 * (int64_t)wp->n_heads, NULL),
	};
	struct kt_tensor ks = op_tensor(r, b, d.kv, (int64_t)p->slots * bs, w->C, NULL);
	struct kt_tensor vs = op_tensor(r, b, d.kv, (int64_t)p->slots * bs, w->C, NULL);
	struct kt_tensor d_ids = op_tensor_raw(r, b, KT_I32, n_pieces + 1, 1, ids);
	int32_t *span = op_ints(r, (size_t)T * 2);
	struct kt_tensor d_span = op_tensor_raw(r, b, KT_I32, T, 2, NULL);
	const int rounds = (n_pieces + p->slots - 1) / p->slots;
	uint64_t ticket = 0;

	for (int rd = 0; rd < rounds && !o->rc; rd++) {
		const int p0 = rd * p->slots, n = ATLAS_MIN(p->slots, n_pieces - p0);
		const struct kt_tensor src = kt_rows(d_ids, p0, n);

		for (int t = 0; t < T; t++) {
			const int s = w->step.seq[t];
			const int a = ATLAS_MAX(first_piece[s], p0);
			const int e = ATLAS_MIN(first_piece[s] + staged_blocks(w, s), p0 + n);

			span[2 * t] = e > a ? (a - p0) * bs : 0;
			span[2 * t + 1] = e > a ? (e - a) * bs : 0;
		}
		op_ok(r, kt_upload(b->be, &d_span, 0, span, (size_t)T * 2 * sizeof(int32_t)),
		      "kt_upload");
		o->rc = kt_kv_stage(b->be, &ks, &d.all, block_bytes, host, block_bytes,
				    n_pieces + 1, &src, NULL, k_off, (size_t)bs * row_bytes, NULL);
		o->rc = o->rc ? o->rc : kt_kv_stage(b->be, &vs, &d.all, block_bytes, host,
						    block_bytes, n_pieces + 1, &src, ids + p0, v_off,
						    (size_t)bs * row_bytes, &ticket);
		o->rc = o->rc ? o->rc : kt_copy_wait(b->be, ticket);
		o->rc = o->rc ? o->rc : kt_attention_staged(b->be, &st, &q, &ks, &vs, &d_span, bs,
							    wp->n_heads, wp->n_kv, wp->D,
							    w->scale, rd == 0);
		if (rd == rounds - 1) {
			/* The staging rows that must be there: each piece's rows of the pool. */
			struct kt_tensor all_view = kt_reshape(d.all, d.all.rows, w->C);
			float *pool = op_get(r, b, &all_view);

			o->last_round_pieces = n;
			o->stage_k = op_get(r, b, &ks);
			o->stage_v = op_get(r, b, &vs);
			o->want_k = op_floats(r, (size_t)n * bs * w->C);
			o->want_v = op_floats(r, (size_t)n * bs * w->C);
			for (int i = 0; i < n; i++) {
				int32_t id = ids[p0 + i];
				const int32_t blk = id >= 0 ? id : -1;
				size_t row;

				if (blk < 0) /* a host copy of the block the table names */
					for (int s = 0; s < wp->n_seqs; s++)
						if (p0 + i >= first_piece[s] &&
						    p0 + i < first_piece[s] + staged_blocks(w, s))
							id = w->table[(size_t)w->slot[s] * w->bt_cols +
								      p0 + i - first_piece[s]];
				row = (size_t)id * d.block_rows + (size_t)wp->layer * 2 * bs;
				memcpy(o->want_k + (size_t)i * bs * w->C, pool + row * w->C,
				       (size_t)bs * w->C * sizeof(float));
				memcpy(o->want_v + (size_t)i * bs * w->C, pool + (row + bs) * w->C,
				       (size_t)bs * w->C * sizeof(float));
			}
		}
	}
	o->rc = o->rc ? o->rc : kt_attention_part(b->be, &st, &q, &d.kc, &d.vc, &batch, &d_from,
						  wp->n_heads, wp->n_kv, wp->D, w->scale,
						  rounds == 0);
	op_poison(r, b, &out);
	o->rc = o->rc ? o->rc : kt_attention_finish(b->be, &out, &st, wp->n_heads, wp->D);
	o->parts = op_get(r, b, &out);
	{
		struct kt_tensor ob = op_tensor(r, b, KT_BF16, T, w->QC, NULL);

		o->rc = o->rc ? o->rc : kt_attention_finish(b->be, &ob, &st, wp->n_heads, wp->D);
		o->parts_bf16 = op_get(r, b, &ob);
	}
	kt_host_free(b->be, host);
	return o;
}

static void parts_check(struct op_run *r, const void *params, const void *input, const void *got,
			const void *cpu)
{
	const struct parts_params *p = params;
	const struct paged_world *w = input;
	const struct parts_out *g = got, *c = cpu;
	const size_t n = (size_t)w->step.T * w->QC;

	op_check_rc(r, g->rc_store, 0, "kv_store runs");
	op_check_rc(r, g->rc, 0, "kv_stage and the attention parts run");
	op_check_bits(r, g->stage_k, g->want_k, (size_t)g->last_round_pieces * p->w.bs * w->C,
		      "staged K rows are the pieces' rows");
	op_check_bits(r, g->stage_v, g->want_v, (size_t)g->last_round_pieces * p->w.bs * w->C,
		      "staged V rows are the pieces' rows");
	{
		float *rounded = op_dup(r, g->parts, n * sizeof(float));

		op_round_bf16(rounded, n);
		op_check_bits(r, g->parts_bf16, rounded, n, "finish into bf16: the f32 out rounded");
	}
	if (!c) {
		double *ref = op_doubles(r, n), *mag = op_doubles(r, n);

		paged_reference(r, w, ref, mag);
		op_check_rel(r, g->parts, ref, mag, n, fmax(p->tol, w->tol_min),
			     "parts against attention in double");
		op_check_bits(r, g->parts, g->whole, n, "parts bitwise as one attention call");
		return;
	}
	if (w->target_kv == KT_BF16)
		op_check_close(r, g->parts, g->whole, n, 4e-3, 2e-5,
			       "parts against the backend's own attention");
	else
		op_check_close(r, g->parts, g->whole, n, 2e-5, 1e-10,
			       "parts against the backend's own attention");
	op_check_close(r, g->parts, c->parts, n, 2e-5, 1e-10, "parts against the cpu's");
}

static const struct op_family parts = { parts_build, parts_run, parts_check, false };

#define SEQS(...) .seqs = { __VA_ARGS__ }, .n_seqs = sizeof((struct paged_seq[]){ __VA_ARGS__ }) \
						      / sizeof(struct paged_seq)
#define PARTS(name, heads, kv_heads, d, block, kv_dtype, n, l, slot_count, seq_list) \
	{ name, "attention_part", &parts, &(const struct parts_params){ \
		.w = { .n_heads = heads, .n_kv = kv_heads, .D = d, .bs = block, .kv = kv_dtype, \
		       .shape = SHAPE_STEP, .qmag = 2.0f, .kmag = 1.0f, .layers = n, .layer = l, \
		       seq_list }, \
		.slots = slot_count, .tol = 1e-5 } }

/* Decode rows and prompt chunks after long histories; slot 1 stays whole. */
#define LONG SEQS({ 300, 1 }, { 200, 1 }, { 640, 20 }, { 1100, 1 }, { 96, 40 }, { 33, 3 })

static const struct op_case cases[] = {
	PARTS("attention parts GQA 32/8 D=128 bs=16 (Qwen3-8B), one round", 32, 8, 128, 16,
	      KV_NATIVE, 3, 1, 512, LONG),
	PARTS("attention parts GQA 8/4 D=64 bs=16 (atlas-tiny), rounds of 7 blocks", 8, 4, 64, 16,
	      KV_NATIVE, 2, 1, 7, LONG),
	PARTS("attention parts MHA 4/4 D=128 bs=8, rounds of 16 blocks, last layer", 4, 4, 128, 8,
	      KV_NATIVE, 3, 2, 16, LONG),
	PARTS("attention parts GQA 6/3 D=80 bs=7 f32 cache, rounds of 5 blocks", 6, 3, 80, 7,
	      KV_F32, 2, 0, 5, LONG),
	PARTS("attention parts GQA 16/2 D=64 bs=32, rounds of 3 blocks", 16, 2, 64, 32,
	      KV_NATIVE, 2, 1, 3, LONG),
};

OP_LIST(ops_attention_parts, cases);
