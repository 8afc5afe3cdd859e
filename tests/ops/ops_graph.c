/* Cases of graph: kt_graph records the ops of record() once per key and
 * replays them (cuda), or runs record() every time (cpu). What a caller may
 * rely on, on every backend:
 *  - record() runs once per key where info.graphs says the backend records,
 *    every call where it does not;
 *  - a replay computes what the same ops give run eagerly, bit for bit,
 *    on new contents of the same tensors (the engine's decode steps);
 *  - recorded matmuls (both cuda paths: the GEMV and cuBLAS) also match the
 *    reference (cpu) or the cpu (other backends, NMSE 1e-8 on bf16-exact x).
 * The decode case records kv_store and attention of four decode rows at a
 * max_kv_len bucket above their lengths, then replays them as the rows move
 * on one position each round, over caches of their own or block-major ones
 * (the engine's pool: the stride is part of what a graph records).
 *
 * Graph keys are per case (a hash of its name), so no case replays another's.
 */
#include <math.h>
#include <string.h>

#include "kernels/cuda/cuda_gemv.h"
#include "tests/ops/ops_paged.h"

#define ROUNDS 3

enum graph_kind { GRAPH_MATMUL, GRAPH_DECODE };

struct graph_params {
	enum graph_kind kind;
	int T;                   /* matmul rows */
	struct paged_params w;   /* decode: the world (step 3: positions of three rounds) */
};

enum { GK = 1024, GN = 515 }; /* matmul: K, N */

struct graph_in {
	float *x[ROUNDS], *w, *bias;  /* matmul */
	struct paged_world world;     /* decode */
	float *q[ROUNDS];             /* decode: q of each round */
};

struct graph_out {
	int rc, records, calls;
	bool graphs; /* the backend's info.graphs */
	float *eager[ROUNDS], *replay[ROUNDS];
};

static void *graph_build(struct op_run *r, const void *params, const struct op_backend *target)
{
	const struct graph_params *p = params;
	struct graph_in *in = op_alloc(r, sizeof(*in));

	if (p->kind == GRAPH_DECODE) {
		paged_build(r, &in->world, &p->w, target);
		for (int i = 0; i < ROUNDS; i++) {
			size_t n = (size_t)p->w.n_seqs * in->world.QC;

			in->q[i] = op_floats(r, n);
			op_fill(r, in->q[i], n, 2.0f);
			if (in->world.target_kv == KT_BF16)
				op_round_bf16(in->q[i], n);
		}
		return in;
	}
	in->w = op_floats(r, (size_t)GN * GK);
	in->bias = op_floats(r, GN);
	op_fill(r, in->w, (size_t)GN * GK, 0.5f);
	op_fill(r, in->bias, GN, 1.0f);
	op_round_bf16(in->w, (size_t)GN * GK);
	op_round_bf16(in->bias, GN);
	for (int i = 0; i < ROUNDS; i++) {
		in->x[i] = op_floats(r, (size_t)p->T * GK);
		op_fill(r, in->x[i], (size_t)p->T * GK, 1.0f);
		op_round_bf16(in->x[i], (size_t)p->T * GK);
	}
	return in;
}

/* What record() enqueues: one matmul, or kv_store then attention. */
struct recording {
	const struct op_backend *b;
	struct graph_out *o;
	const struct paged_world *w;
	const struct paged_dev *d;
	struct kt_tensor y, x, wt, bias, k, v, q, out;
	struct kt_batch batch;
};

static int record(void *ctx)
{
	struct recording *c = ctx;
	const struct paged_params *p;
	int rc;

	c->o->records++;
	if (!c->w)
		return kt_matmul(c->b->be, &c->y, &c->x, &c->wt, &c->bias);
	p = c->w->p;
	rc = kt_kv_store(c->b->be, &c->d->kc, &c->d->vc, &c->k, &c->v, &c->batch);
	return rc ? rc : kt_attention(c->b->be, &c->out, &c->q, &c->d->kc, &c->d->vc, &c->batch,
				      p->n_heads, p->n_kv, p->D, c->w->scale);
}

/* Round i's decode rows: each sequence at hist + i. */
static struct paged_tokens round_tokens(struct op_run *r, const struct paged_world *w, int i)
{
	const int n = w->p->n_seqs;
	struct paged_tokens t = { .T = n, .n_single = n };

	t.seq = op_ints(r, (size_t)n);
	t.pos = op_ints(r, (size_t)n);
	t.slot = op_ints(r, (size_t)n);
	for (int s = 0; s < n; s++) {
		t.seq[s] = s;
		t.pos[s] = w->p->seqs[s].hist + i;
		t.slot[s] = w->slot[s];
	}
	return t;
}

static void run_decode(struct op_run *r, const struct op_backend *b, const struct graph_in *in,
		       struct graph_out *o)
{
	const struct paged_world *w = &in->world;
	struct paged_dev d = paged_setup(r, b, w);
	struct paged_tokens tok = round_tokens(r, w, 0);
	struct recording c = { .b = b, .o = o, .w = w, .d = &d };
	struct graph_out uncounted = { 0 }; /* record() run eagerly counts here */
	const int n = tok.T;
	float *k, *v;

	for (int i = 0; i < w->n_hist && !o->rc; i++)
		o->rc = paged_store(r, b, w, &d, &w->hist[i]);
	c.batch = paged_batch(r, b, w, &d, &tok, 512);
	c.k = op_tensor(r, b, KT_F32, n, w->C, NULL);
	c.v = op_tensor(r, b, KT_F32, n, w->C, NULL);
	c.q = op_tensor(r, b, KT_F32, n, w->QC, NULL);
	c.out = op_tensor(r, b, KT_F32, n, w->QC, NULL);
	for (int i = 0; i < ROUNDS && !o->rc; i++) {
		tok = round_tokens(r, w, i);
		paged_rows(r, w, d.kv, &tok, &k, &v);
		op_ok(r, kt_upload(b->be, &c.batch.pos, 0, tok.pos, (size_t)n * 4), "kt_upload");
		op_set(r, b, &c.k, k);
		op_set(r, b, &c.v, v);
		op_set(r, b, &c.q, in->q[i]);
		c.o = &uncounted;
		o->rc = record(&c);
		o->eager[i] = op_get(r, b, &c.out);
		op_poison(r, b, &c.out);
		c.o = o;
		o->calls++;
		o->rc = o->rc ? o->rc : kt_graph(b->be, op_case_key(r), record, &c);
		o->replay[i] = op_get(r, b, &c.out);
	}
}

static void *graph_run(struct op_run *r, const void *params, const void *input,
		       const struct op_backend *b)
{
	const struct graph_params *p = params;
	const struct graph_in *in = input;
	struct graph_out *o = op_alloc(r, sizeof(*o));
	struct recording c = { .b = b, .o = o };

	o->graphs = b->be->info.graphs;
	if (p->kind == GRAPH_DECODE) {
		run_decode(r, b, in, o);
		return o;
	}
	c.wt = op_weight_bf16(r, b, in->w, GN, GK);
	c.bias = op_weight_bf16(r, b, in->bias, 1, GN);
	c.x = op_tensor(r, b, KT_F32, p->T, GK, NULL);
	c.y = op_tensor(r, b, KT_F32, p->T, GN, NULL);
	for (int i = 0; i < ROUNDS && !o->rc; i++) {
		op_set(r, b, &c.x, in->x[i]);
		o->rc = kt_matmul(b->be, &c.y, &c.x, &c.wt, &c.bias);
		o->eager[i] = op_get(r, b, &c.y);
		op_poison(r, b, &c.y);
		o->calls++;
		o->rc = o->rc ? o->rc : kt_graph(b->be, op_case_key(r), record, &c);
		o->replay[i] = op_get(r, b, &c.y);
	}
	return o;
}

/* Round i's y = x · wᵀ + bias in double, and its scale Σ|x·w| + |bias|. */
static void matmul_reference(const struct graph_in *in, int T, int i, double *ref, double *scale)
{
	for (int t = 0; t < T; t++)
		for (int j = 0; j < GN; j++) {
			double s = in->bias[j], a = fabs(in->bias[j]);

			for (int k = 0; k < GK; k++) {
				double v = (double)in->x[i][(size_t)t * GK + k] *
					   in->w[(size_t)j * GK + k];

				s += v;
				a += fabs(v);
			}
			ref[(size_t)t * GN + j] = s;
			scale[(size_t)t * GN + j] = a;
		}
}

static void graph_check(struct op_run *r, const void *params, const void *input, const void *got,
			const void *cpu)
{
	const struct graph_params *p = params;
	const struct graph_in *in = input;
	const struct graph_out *g = got, *c = cpu;
	const bool decode = p->kind == GRAPH_DECODE, bf16 = in->world.target_kv == KT_BF16;
	const size_t n = decode ? (size_t)p->w.n_seqs * in->world.QC : (size_t)p->T * GN;
	double *ref = op_doubles(r, n), *scale = op_doubles(r, n);
	size_t nonfinite = 0;

	op_check_rc(r, g->rc, 0, "every op and graph call runs");
	op_check(r, g->calls == ROUNDS, "%d graph calls made", g->calls);
	/* The engine relies on this: a recorded step's ops are not called again. */
	op_check(r, g->records == (g->graphs ? 1 : g->calls),
		 "record() ran %d times for %d calls (backend %s graphs)", g->records, g->calls,
		 g->graphs ? "records" : "records no");
	for (int i = 0; i < g->calls; i++) {
		op_check_bits(r, g->replay[i], g->eager[i], n, "round %d: %s as run eagerly", i,
			      i ? "replayed" : "recorded");
		for (size_t j = 0; j < n; j++)
			nonfinite += !isfinite(g->replay[i][j]);
		if (c && i < c->calls && decode)
			op_check_close(r, g->replay[i], c->replay[i], n, bf16 ? 4e-3 : 2e-5,
				       bf16 ? 2e-5 : 1e-10, "round %d: against the cpu", i);
		else if (c && i < c->calls)
			op_check_close(r, g->replay[i], c->replay[i], n, INFINITY, 1e-8,
				       "round %d: against the cpu", i);
		if (c || decode)
			continue;
		matmul_reference(in, p->T, i, ref, scale);
		op_check_rel(r, g->replay[i], ref, scale, n, 1e-5,
			     "round %d: against x · wᵀ + bias in double", i);
	}
	op_check(r, !nonfinite, "every output finite (%zu are not)", nonfinite);
}

static const struct op_family graph = { graph_build, graph_run, graph_check, false };

#define MATMUL(name, t) { name, "graph", &graph, \
	&(const struct graph_params){ .kind = GRAPH_MATMUL, .T = t } }
#define DECODE_LAYER(name, heads, kv_heads, d, kv_dtype, n, l) { name, "graph", &graph, \
	&(const struct graph_params){ .kind = GRAPH_DECODE, .w = { \
		.n_heads = heads, .n_kv = kv_heads, .D = d, .bs = 16, .kv = kv_dtype, \
		.qmag = 2.0f, .kmag = 1.0f, .n_seqs = 4, \
		.seqs = { { 100, ROUNDS }, { 0, ROUNDS }, { 300, ROUNDS }, { 17, ROUNDS } }, \
		.layers = n, .layer = l } } }
#define DECODE(name, heads, kv_heads, d, kv_dtype) \
	DECODE_LAYER(name, heads, kv_heads, d, kv_dtype, 0, 0)

static const struct op_case cases[] = {
	MATMUL("graph: matmul T=3 (GEMV), 3 rounds", 3),
	MATMUL("graph: matmul T=19 (cuBLAS), 3 rounds", CUDA_GEMV_MAX_T + 3),
	DECODE("graph: kv_store + attention, 4 decode rows, 8/2 D=128", 8, 2, 128, KV_NATIVE),
	DECODE("graph: kv_store + attention, 4 decode rows, 8/4 D=64", 8, 4, 64, KV_NATIVE),
	DECODE("graph: kv_store + attention, 4 decode rows, 6/3 D=80", 6, 3, 80, KV_NATIVE),
	DECODE("graph: kv_store + attention, 4 decode rows, D=128 f32 cache", 8, 2, 128, KV_F32),
	DECODE_LAYER("graph: kv_store + attention, 4 decode rows, 8/2 D=128, block-major layer 1 "
		     "of 3", 8, 2, 128, KV_NATIVE, 3, 1),
	DECODE_LAYER("graph: kv_store + attention, 4 decode rows, 6/3 D=80, block-major last "
		     "layer of 2", 6, 3, 80, KV_NATIVE, 2, 1),
};

OP_LIST(ops_graph, cases);
