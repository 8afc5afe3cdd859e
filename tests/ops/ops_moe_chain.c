/* Cases that chain the mixture-of-experts ops as a layer runs them:
 * moe_route, the experts' moe_matmul (one, or two through a hidden width)
 * and moe_combine, recorded as a graph, and the chain's batch and rank
 * invariance. The reference routes each token with moe_route's references
 * (ops_moe.h).
 *
 * Graph: route, moe_matmul (k > 0), moe_matmul (k == 0) and combine
 * recorded once and replayed with new logits and x give the bits they give
 * run eagerly; against the chain in double (2e-5 of its scale), or the cpu
 * (NMSE 1e-4: the device rounds the hidden rows to bf16).
 *
 * Invariance (op_moe_invariant): each of 37 tokens routed, multiplied and
 * combined alone gives the bits it gets in the batch; the batch with the
 * experts split into shards (one moe_matmul per shard, summed with add as
 * allreduce sums ranks) and on a backend of one thread gives the same
 * bits. Where not promised: NMSE 1e-8 (bf16-exact x and w).
 */
#include <math.h>

#include "tests/ops/ops.h"
#include "tests/ops/ops_moe.h"

struct chain_params {
	int T, E, k, K, I, N; /* I: the hidden width of a two-matmul chain, 0: one matmul */
	bool norm;
	int shards[4];        /* invariance: first expert of each shard after the first; 0 ends */
};

struct chain_in {
	float *logits[3], *x[3]; /* per round (graph); [0] for invariance */
	float *w1, *w2;          /* w1 [E * (I ? I : N), K], w2 [E * N, I] */
};

/* A chain's tensors on one backend for T tokens. */
struct chain_dev {
	int T;
	struct kt_tensor logits, x, ids, w, order, slot, offsets, h, y, out, w1, w2;
};

static int chain_width(const struct chain_params *p)
{
	return p->I ? p->I : p->N;
}

static void *chain_build(struct op_run *r, const void *params, const struct op_backend *target)
{
	const struct chain_params *p = params;
	const size_t nl = (size_t)p->T * p->E, nx = (size_t)p->T * p->K;
	const size_t n1 = (size_t)p->E * chain_width(p) * p->K, n2 = (size_t)p->E * p->N * p->I;
	struct chain_in *in = op_alloc(r, sizeof(*in));

	for (int i = 0; i < 3; i++) {
		in->logits[i] = op_floats(r, nl);
		in->x[i] = op_floats(r, nx);
		op_fill(r, in->logits[i], nl, 3.0f);
		op_fill(r, in->x[i], nx, 1.0f);
		op_round_bf16(in->x[i], nx);
	}
	in->w1 = op_floats(r, n1);
	in->w2 = op_floats(r, n2 ? n2 : 1);
	op_fill(r, in->w1, n1, 0.5f);
	op_fill(r, in->w2, n2, 0.5f);
	op_round_bf16(in->w1, n1);
	op_round_bf16(in->w2, n2);
	return in;
}

static struct chain_dev chain_setup(struct op_run *r, const struct op_backend *b,
				    const struct chain_params *p, const struct chain_in *in,
				    int T)
{
	const int A = T * p->k;
	struct chain_dev d = { .T = T };

	d.logits = op_tensor(r, b, KT_F32, T, p->E, NULL);
	d.x = op_tensor(r, b, KT_F32, T, p->K, NULL);
	d.ids = op_tensor_raw(r, b, KT_I32, T, p->k, NULL);
	d.w = op_tensor(r, b, KT_F32, T, p->k, NULL);
	d.order = op_tensor_raw(r, b, KT_I32, A, 1, NULL);
	d.slot = op_tensor_raw(r, b, KT_I32, A, 1, NULL);
	d.offsets = op_tensor_raw(r, b, KT_I32, p->E + 1, 1, NULL);
	d.h = op_tensor(r, b, KT_F32, A, chain_width(p), NULL);
	d.y = p->I ? op_tensor(r, b, KT_F32, A, p->N, NULL) : d.h;
	d.out = op_tensor(r, b, KT_F32, T, p->N, NULL);
	d.w1 = op_weight_bf16(r, b, in->w1, (int64_t)p->E * chain_width(p), p->K);
	if (p->I)
		d.w2 = op_weight_bf16(r, b, in->w2, (int64_t)p->E * p->N, p->I);
	return d;
}

/* What record() enqueues. */
struct chain_rec {
	const struct op_backend *b;
	const struct chain_params *p;
	const struct chain_dev *d;
	int records;
};

static int chain_forward(void *ctx)
{
	struct chain_rec *c = ctx;
	const struct chain_dev *d = c->d;
	struct kt_backend *be = c->b->be;
	int rc;

	c->records++;
	rc = kt_moe_route(be, &d->ids, &d->w, &d->order, &d->slot, &d->offsets, &d->logits,
			  c->p->norm);
	rc = rc ? rc : kt_moe_matmul(be, &d->h, &d->x, &d->w1, &d->order, &d->offsets, c->p->k, 0);
	if (c->p->I)
		rc = rc ? rc : kt_moe_matmul(be, &d->y, &d->h, &d->w2, &d->order, &d->offsets, 0, 0);
	return rc ? rc : kt_moe_combine(be, &d->out, &d->y, &d->w, &d->slot);
}

/* Rows t0 .. t0 + d->T - 1 of round i's logits and x into d. */
static void chain_inputs(struct op_run *r, const struct op_backend *b, const struct chain_dev *d,
			 const struct chain_params *p, const struct chain_in *in, int i, int t0)
{
	op_ok(r, kt_upload(b->be, &d->logits, 0, in->logits[i] + (size_t)t0 * p->E,
			   kt_nbytes(&d->logits)), "kt_upload (logits)");
	op_ok(r, kt_upload(b->be, &d->x, 0, in->x[i] + (size_t)t0 * p->K, kt_nbytes(&d->x)),
	      "kt_upload (x)");
}

/* The chain of round i in double, and its scale: Σ_j |w_j| Σ |w2| · Σ |w1 x|. */
static void chain_reference(struct op_run *r, const struct chain_params *p,
			    const struct chain_in *in, int i, double *ref, double *scale)
{
	const int H = chain_width(p);
	int32_t ids[KT_MOE_MAX_K];
	double w[KT_MOE_MAX_K], *h = op_doubles(r, (size_t)H), *ha = op_doubles(r, (size_t)H);

	for (int t = 0; t < p->T; t++) {
		const float *x = in->x[i] + (size_t)t * p->K;

		moe_ref_topk(in->logits[i] + (size_t)t * p->E, p->E, p->k, ids);
		moe_ref_weights(in->logits[i] + (size_t)t * p->E, p->E, ids, p->k, p->norm, w);
		for (int n = 0; n < p->N; n++)
			ref[(size_t)t * p->N + n] = scale[(size_t)t * p->N + n] = 0.0;
		for (int j = 0; j < p->k; j++) {
			for (int u = 0; u < H; u++) {
				const float *w1 = in->w1 + ((size_t)ids[j] * H + u) * p->K;

				h[u] = ha[u] = 0.0;
				for (int kk = 0; kk < p->K; kk++) {
					h[u] += (double)w1[kk] * x[kk];
					ha[u] += fabs((double)w1[kk] * x[kk]);
				}
			}
			for (int n = 0; n < p->N; n++) {
				const float *w2 = in->w2 + ((size_t)ids[j] * p->N + n) * p->I;
				double s = p->I ? 0.0 : h[n], a = p->I ? 0.0 : ha[n];

				for (int u = 0; p->I && u < p->I; u++) {
					s += (double)w2[u] * h[u];
					a += fabs((double)w2[u]) * ha[u];
				}
				ref[(size_t)t * p->N + n] += w[j] * s;
				scale[(size_t)t * p->N + n] += w[j] * a;
			}
		}
	}
}

struct graph_out {
	int rc, records, calls;
	bool graphs;
	float *eager[3], *replay[3];
	int32_t *eager_ids[3], *replay_ids[3];
};

static void *graph_run(struct op_run *r, const void *params, const void *input,
		       const struct op_backend *b)
{
	const struct chain_params *p = params;
	const struct chain_in *in = input;
	struct graph_out *o = op_alloc(r, sizeof(*o));
	struct chain_dev d = chain_setup(r, b, p, in, p->T);
	struct chain_rec eager = { .b = b, .p = p, .d = &d }, rec = eager;

	o->graphs = b->be->info.graphs;
	for (int i = 0; i < 3 && !o->rc; i++) {
		chain_inputs(r, b, &d, p, in, i, 0);
		o->rc = chain_forward(&eager);
		o->eager[i] = op_get(r, b, &d.out);
		o->eager_ids[i] = op_get_ints(r, b, &d.ids);
		op_poison(r, b, &d.out);
		op_poison(r, b, &d.ids);
		o->calls++;
		o->rc = o->rc ? o->rc : kt_graph(b->be, op_case_key(r), chain_forward, &rec);
		o->replay[i] = op_get(r, b, &d.out);
		o->replay_ids[i] = op_get_ints(r, b, &d.ids);
	}
	o->records = rec.records;
	return o;
}

static void graph_check(struct op_run *r, const void *params, const void *input, const void *got,
			const void *cpu)
{
	const struct chain_params *p = params;
	const struct graph_out *g = got, *c = cpu;
	const size_t n = (size_t)p->T * p->N;
	double *ref = op_doubles(r, n), *scale = op_doubles(r, n);

	op_check_rc(r, g->rc, 0, "every op and graph call runs");
	op_check(r, g->calls == 3, "%d graph calls made", g->calls);
	op_check(r, g->records == (g->graphs ? 1 : g->calls),
		 "record() ran %d times for %d calls (backend %s graphs)", g->records, g->calls,
		 g->graphs ? "records" : "records no");
	for (int i = 0; i < g->calls; i++) {
		op_check_bits(r, g->replay[i], g->eager[i], n, "round %d: out %s as run eagerly", i,
			      i ? "replayed" : "recorded");
		op_check_ints(r, g->replay_ids[i], g->eager_ids[i], (size_t)p->T * p->k,
			      "round %d: ids as run eagerly", i);
		if (c && i < c->calls) {
			op_check_close(r, g->replay[i], c->replay[i], n, INFINITY, 1e-4,
				       "round %d: out against the cpu", i);
			continue;
		}
		chain_reference(r, p, input, i, ref, scale);
		op_check_rel(r, g->replay[i], ref, scale, n, 2e-5,
			     "round %d: out against the chain in double", i);
	}
}

static const struct op_family graph = { chain_build, graph_run, graph_check, false };

struct inv_out {
	int rc;
	bool promised;
	float *batch, *alone, *sharded, *one_thread;
};

/* The batch's y again with w split into shards (one moe_matmul each, as the
 * ranks hold them), summed with add, then combined. */
static float *run_sharded(struct op_run *r, const struct op_backend *b,
			  const struct chain_params *p, const struct chain_in *in,
			  const struct chain_dev *d, int *rc)
{
	const int A = p->T * p->k;
	struct kt_tensor sum = op_tensor(r, b, KT_F32, A, p->N, NULL);

	for (int s = 0, e0 = 0; e0 < p->E && !*rc; s++) {
		const int e1 = s < 4 && p->shards[s] ? p->shards[s] : p->E;
		struct kt_tensor ws = op_weight_bf16(r, b, in->w1 + (size_t)e0 * p->N * p->K,
						     (int64_t)(e1 - e0) * p->N, p->K);
		struct kt_tensor ys = s ? op_tensor(r, b, KT_F32, A, p->N, NULL) : sum;

		*rc = kt_moe_matmul(b->be, &ys, &d->x, &ws, &d->order, &d->offsets, p->k, e0);
		if (s && !*rc)
			*rc = kt_add(b->be, &sum, &ys);
		e0 = e1;
	}
	op_poison(r, b, &d->out);
	*rc = *rc ? *rc : kt_moe_combine(b->be, &d->out, &sum, &d->w, &d->slot);
	return op_get(r, b, &d->out);
}

/* The batch on a second backend of b's kind with one thread. */
static float *run_one_thread(struct op_run *r, const struct op_backend *b,
			     const struct chain_params *p, const struct chain_in *in, int *rc)
{
	struct kt_config c1 = *b->config;
	const struct op_backend *one;
	struct chain_dev d;
	struct chain_rec rec;

	c1.threads = 1;
	one = op_open(r, b, &c1);
	d = chain_setup(r, one, p, in, p->T);
	rec = (struct chain_rec){ .b = one, .p = p, .d = &d };
	chain_inputs(r, one, &d, p, in, 0, 0);
	*rc = chain_forward(&rec);
	return op_get(r, one, &d.out);
}

static void *inv_run(struct op_run *r, const void *params, const void *input,
		     const struct op_backend *b)
{
	const struct chain_params *p = params;
	const struct chain_in *in = input;
	struct inv_out *o = op_alloc(r, sizeof(*o));
	struct chain_dev d = chain_setup(r, b, p, in, p->T), d1 = chain_setup(r, b, p, in, 1);
	struct chain_rec batch = { .b = b, .p = p, .d = &d }, alone = { .b = b, .p = p, .d = &d1 };

	o->promised = op_moe_invariant(b);
	chain_inputs(r, b, &d, p, in, 0, 0);
	o->rc = chain_forward(&batch);
	o->batch = op_get(r, b, &d.out);
	o->alone = op_floats(r, (size_t)p->T * p->N);
	for (int t = 0; t < p->T && !o->rc; t++) {
		chain_inputs(r, b, &d1, p, in, 0, t);
		o->rc = chain_forward(&alone);
		op_ok(r, kt_download(b->be, o->alone + (size_t)t * p->N, &d1.out, 0,
				     kt_nbytes(&d1.out)), "kt_download");
	}
	if (!o->rc)
		o->sharded = run_sharded(r, b, p, in, &d, &o->rc);
	if (o->promised && !o->rc)
		o->one_thread = run_one_thread(r, b, p, in, &o->rc);
	return o;
}

static void inv_check(struct op_run *r, const void *params, const void *input, const void *got,
		      const void *cpu)
{
	const struct chain_params *p = params;
	const struct inv_out *g = got;
	const size_t n = (size_t)p->T * p->N;

	op_check_rc(r, g->rc, 0, "every op runs");
	if (g->rc)
		return;
	if (!g->promised) {
		op_check_close(r, g->alone, g->batch, n, INFINITY, 1e-8,
			       "each token alone against the batch of %d", p->T);
		op_check_close(r, g->sharded, g->batch, n, INFINITY, 1e-8,
			       "the experts in shards against all in one call");
		return;
	}
	op_check_bits(r, g->alone, g->batch, n, "each token alone as in the batch of %d", p->T);
	op_check_bits(r, g->sharded, g->batch, n, "the experts in shards as all in one call");
	op_check_bits(r, g->one_thread, g->batch, n, "the batch on a backend of one thread");
}

static const struct op_family invariance = { chain_build, inv_run, inv_check, true };

#define GRAPH(name, ...) { name, "graph", &graph, &(const struct chain_params){ __VA_ARGS__ } }
#define INV(name, ...) \
	{ name, "moe_*", &invariance, &(const struct chain_params){ __VA_ARGS__ } }

static const struct op_case cases[] = {
	GRAPH("graph: moe route, matmul k>0, k=0, combine T=5 E=16 k=4",
	      .T = 5, .E = 16, .k = 4, .K = 64, .I = 40, .N = 48, .norm = true),
	GRAPH("graph: moe route, matmul k>0, k=0, combine T=37 E=64 k=8",
	      .T = 37, .E = 64, .k = 8, .K = 256, .I = 96, .N = 256),
	INV("moe invariance: batch, shards T=37 E=64 k=8 K=256 N=96 norm", .T = 37, .E = 64,
	    .k = 8, .K = 256, .N = 96, .norm = true, .shards = { 21, 48 }),
	INV("moe invariance: batch, shards T=37 E=8 k=2 K=40 N=24", .T = 37, .E = 8, .k = 2,
	    .K = 40, .N = 24, .shards = { 3, 4, 7 }),
};

OP_LIST(ops_moe_chain, cases);
