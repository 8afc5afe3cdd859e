/* Cases of sample: one token id per row of logits, greedy or by
 * temperature, top-k, top-p and the caller's u, against an oracle that
 * sorts the whole row in rank order (larger logit first, lower id on ties,
 * NaN as -inf) and sums masses in double.
 *
 * A row is compared (with the oracle, and on other backends with the cpu)
 * when its decision lies at least 1e-6 of the kept mass away from every
 * boundary that decided it: closer than that, summation order may decide
 * (backends sum in f32-rounded weights: the cpu in double, cuda in fixed
 * point). Greedy rows, rows whose u and top_p are put in the middle of a
 * token's interval of at least 1e-4 of the mass, and rows of equal logits
 * (masses exactly 1) are always compared; random sweeps must leave fewer
 * than one row in ten undecided. Sampling twice gives the same ids.
 *
 * Rows: V from 1 to 151936 (several of the cpu's chunks, flat rows, long
 * tie runs across chunk edges), top_k around 4096, more rows than
 * max_tokens (cuda samples in launches of that many), NaN, -inf and all-NaN
 * rows, and u on a fine grid reproducing softmax(l / T).
 *
 * A backend may pick its kernel by the launch's rows (cuda: greedy rows,
 * rows of a top_k of at most 256, others), so two cases sample rows again
 * in another launch and want the same ids exactly: the greedy edge rows
 * alone, and the rows of a sweep of one top_k beside a row of top_k 0.
 *
 * Every case of at most OP_MAX_TOKENS rows also draws them (kt_draw_rows,
 * kt_draw, kt_drawn: the ids sample gives, enqueued without a wait), then
 * with the draw recorded in a graph, and replays that graph with the rows'
 * u moved and staged anew, against sample of the moved rows: a replayed
 * draw reads the requests staged last. Refusals and device faults:
 * ops_sample_faults.c.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/ops/ops.h"

#define MARGIN 1e-6        /* rows closer than this to a boundary are not compared */
#define CONSTRUCT_MASS 1e-4 /* constructed picks: tokens of at least this much mass */

enum sample_kind {
	SAMPLE_SWEEP,         /* random rows, settings and u */
	SAMPLE_CONSTRUCTED,   /* u and top_p in the middle of a token's interval */
	SAMPLE_GREEDY_EDGES,  /* ties, NaN, -inf, flat and all-NaN rows, greedy and top_k 1 */
	SAMPLE_GREEDY_TIES,   /* ties at ids 5, 9, 200; NaN at 0, then ties at 17, 18 */
	SAMPLE_TOPK1,         /* top_k 1 or a tiny top_p: the argmax at any T and u */
	SAMPLE_FLAT,          /* equal logits: the exact boundaries of the definition */
	SAMPLE_DISTRIBUTION,  /* u on a grid: frequencies of softmax(l / T) */
};

struct sample_params {
	enum sample_kind kind;
	int V, rows;
	float spread, quant; /* sweep rows: gaussian spread, rounding step (ties) */
	int max_undecided;   /* sweep: most rows in ten too close to call (0: 1), and one */
	float temperature;   /* constructed, distribution */
	int top_k;           /* constructed; sweep: every row's (0: each its own) */
	bool top_p;          /* constructed: choose a top_p too */
	int ties;            /* constructed: logits from this many values (0: separated) */
};

struct sample_in {
	int n, V;
	float *logits;
	struct kt_sample_row *rows;
	int32_t *expect; /* the oracle's id, or -1 where it is not compared */
	int undecided;   /* sweep rows too close to a boundary */
};

struct sample_out {
	int rc, rc_again, rc_greedy;
	int32_t *ids, *again;
	int32_t *greedy;   /* edge rows: the greedy rows again, in a launch of their own */
	int rc_mixed;
	int32_t *mixed;    /* sweeps of one top_k: the rows again beside a row of top_k 0 */
	bool drew;         /* rows up to a draw's most: drawn as well (draw_all) */
	int kind, kind_graph, kind_again;
	int rc_draw, rc_graph, rc_replay, rc_resample;
	int32_t *drawn;    /* kt_draw's ids */
	int32_t *graphed;  /* the same, the draw recorded in a graph */
	int32_t *replayed; /* the graph replayed with other u staged */
	int32_t *resampled; /* kt_sample's ids of those rows */
};

/* kt_draw as the ops of a graph (draw_all). */
struct draw_ctx {
	struct kt_backend *be;
	struct kt_tensor logits;
};

static int draw_record(void *ctx)
{
	const struct draw_ctx *c = ctx;

	return kt_draw(c->be, &c->logits);
}

static int draw_ids(struct kt_backend *be, const struct kt_tensor *l,
		    const struct kt_sample_row *rows, int n, int *kind, int32_t *ids)
{
	int rc;

	if ((*kind = kt_draw_rows(be, rows, n, l->cols)) < 0)
		return *kind;
	return (rc = kt_draw(be, l)) ? rc : kt_drawn(be, ids, n);
}

/* The rows drawn (kt_draw_rows, kt_draw, kt_drawn), then drawn again by a
 * graph that records the draw, and that graph replayed with the rows'
 * u moved (staged anew: a replay must read them) beside kt_sample of the
 * moved rows. */
static void draw_all(struct op_run *r, const struct op_backend *b, const struct kt_tensor *l,
		     const struct kt_sample_row *rows, int n, struct sample_out *o)
{
	struct draw_ctx c = { b->be, *l };
	struct kt_sample_row *moved = op_dup(r, rows, (size_t)n * sizeof(*rows));
	int rc;

	for (int i = 0; i < n; i++)
		moved[i].u = fmodf(moved[i].u + 0.37f, 1.0f);
	o->drew = true;
	o->drawn = op_ints(r, (size_t)n);
	o->graphed = op_ints(r, (size_t)n);
	o->replayed = op_ints(r, (size_t)n);
	o->resampled = op_ints(r, (size_t)n);
	o->rc_draw = draw_ids(b->be, l, rows, n, &o->kind, o->drawn);
	if ((o->kind_graph = kt_draw_rows(b->be, rows, n, l->cols)) < 0)
		o->rc_graph = o->kind_graph;
	else if (!(o->rc_graph = kt_graph(b->be, op_case_key(r), draw_record, &c)))
		o->rc_graph = kt_drawn(b->be, o->graphed, n);
	o->rc_resample = kt_sample(b->be, l, moved, n, o->resampled);
	if ((o->kind_again = kt_draw_rows(b->be, moved, n, l->cols)) < 0)
		o->rc_replay = o->kind_again;
	else if (o->kind_again != o->kind_graph)
		o->rc_replay = 0; /* another kind: the graph's key would differ */
	else if (!(rc = kt_graph(b->be, op_case_key(r), draw_record, &c)))
		o->rc_replay = kt_drawn(b->be, o->replayed, n);
	else
		o->rc_replay = rc;
}

/* The oracle: a row in rank order and the running masses of that order. */
struct oracle {
	int32_t *order;
	double *cum; /* cum[i]: mass of ranks 0..i */
	float *rank;
	int V, limit;
};

static const float *sort_rank;

static int by_rank(const void *a, const void *b)
{
	int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;

	if (sort_rank[i] != sort_rank[j])
		return sort_rank[i] > sort_rank[j] ? -1 : 1;
	return i < j ? -1 : 1;
}

static void oracle_init(struct op_run *r, struct oracle *o, const float *l, int V, float temp,
			int top_k)
{
	float lmax;

	o->V = V;
	o->order = op_ints(r, (size_t)V);
	o->cum = op_doubles(r, (size_t)V);
	o->rank = op_floats(r, (size_t)V);
	for (int i = 0; i < V; i++) {
		o->order[i] = i;
		o->rank[i] = isnan(l[i]) ? -INFINITY : l[i];
	}
	sort_rank = o->rank;
	qsort(o->order, (size_t)V, sizeof(int32_t), by_rank);
	lmax = o->rank[o->order[0]];
	for (int i = 0; i < V; i++) {
		float li = o->rank[o->order[i]];
		double w = li == lmax ? 1.0 : exp(((double)li - lmax) / temp);

		o->cum[i] = (i ? o->cum[i - 1] : 0.0) + w;
	}
	o->limit = top_k > 0 && top_k < V ? top_k : V;
}

static double oracle_w(const struct oracle *o, int k)
{
	return o->cum[k] - (k ? o->cum[k - 1] : 0.0);
}

/* Tokens top-p keeps (at least one). */
static int oracle_keep(const struct oracle *o, float top_p)
{
	double need = (double)top_p * o->cum[o->limit - 1];

	for (int k = 0; top_p < 1.0f && k < o->limit; k++)
		if (o->cum[k] >= need)
			return k + 1;
	return o->limit;
}

/* The pick for row s; *margin: how close (relative to the kept mass) a
 * boundary came to the threshold that decided it. */
static int32_t oracle_pick(const struct oracle *o, const struct kt_sample_row *s, double *margin)
{
	int keep = oracle_keep(o, s->top_p), i;
	double kept, target;

	*margin = 1.0;
	if (s->temperature == 0.0f)
		return o->order[0];
	if (s->top_p < 1.0f) {
		double total = o->cum[o->limit - 1], need = (double)s->top_p * total;

		*margin = fmin(fabs(o->cum[keep - 1] - need),
			       keep > 1 ? fabs(o->cum[keep - 2] - need) : 1.0) / total;
	}
	kept = o->cum[keep - 1];
	target = (double)s->u * kept;
	for (i = 0; i < keep - 1 && o->cum[i] <= target; i++)
		;
	*margin = fmin(*margin, fabs(o->cum[i] - target) / kept);
	if (i > 0) /* mass 0 before the first token is no boundary */
		*margin = fmin(*margin, fabs(o->cum[i - 1] - target) / kept);
	return o->order[i];
}

/* A random rank in [lo, hi) carrying at least CONSTRUCT_MASS of mass; -1 if none. */
static int pick_rank(struct op_run *r, const struct oracle *o, int lo, int hi, double mass)
{
	int n = 0, *c = op_alloc(r, (size_t)(hi > lo ? hi - lo : 1) * sizeof(int));

	for (int i = lo; i < hi; i++)
		if (oracle_w(o, i) >= CONSTRUCT_MASS * mass)
			c[n++] = i;
	return n ? c[op_randint(r, n)] : -1;
}

/* top_p (when wanted) and u in the middle of a chosen token's interval. */
static void construct(struct op_run *r, const struct oracle *o, bool want_top_p,
		      struct kt_sample_row *s)
{
	int keep = o->limit, j;
	int jp = want_top_p ? pick_rank(r, o, 1, o->limit, o->cum[o->limit - 1]) : -1;

	s->top_p = 1.0f;
	if (jp > 0) {
		s->top_p = (float)((o->cum[jp - 1] + 0.5 * oracle_w(o, jp)) / o->cum[o->limit - 1]);
		keep = jp + 1;
	}
	j = pick_rank(r, o, 0, keep, o->cum[keep - 1]);
	s->u = (float)(((j ? o->cum[j - 1] : 0.0) + 0.5 * oracle_w(o, j)) / o->cum[keep - 1]);
}

static float gauss(struct op_run *r)
{
	double u1 = op_uniform(r, 1e-12, 1.0), u2 = op_uniform(r, 0.0, 1.0);

	return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

/* A gaussian row: spread 0 gives a flat row; quant > 0 rounds to that step. */
static void gauss_row(struct op_run *r, float *l, int V, float spread, float quant)
{
	for (int i = 0; i < V; i++) {
		float v = spread * gauss(r);

		l[i] = quant > 0.0f ? quant * roundf(v / quant) : v;
	}
}

/* Ranks 0..n_top-1 spaced by step from 6, the rest in [-30, -8], over a
 * random permutation of the ids. */
static void separated_row(struct op_run *r, float *l, int V, int n_top, float step)
{
	int32_t *ids = op_ints(r, (size_t)V);

	for (int i = 0; i < V; i++)
		ids[i] = i;
	op_shuffle(r, ids, V);
	for (int k = 0; k < V; k++)
		l[ids[k]] = k < n_top ? 6.0f - step * (float)k : (float)op_uniform(r, -30.0, -8.0);
}

/* Six rows of edge cases: random, the max at three ids, NaNs before the
 * max, all equal, -inf but one, all NaN. */
/* The edge rows' cases: 6 rows (edge_rows), greedy, then the same 6 with top_k 1. */
#define EDGE_GREEDY_ROWS 6

static void edge_rows(struct op_run *r, float *l, int V)
{
	op_fill(r, l, (size_t)6 * V, 10.0f);
	l[1 * V + V / 2] = l[1 * V + V / 3] = l[1 * V + V - 1] = 20.0f;
	for (int i = 0; i < V; i += 3)
		l[2 * V + i] = NAN;
	l[2 * V + V - 1] = 11.0f;
	for (int i = 0; i < V; i++) {
		l[3 * V + i] = 0.25f;
		l[4 * V + i] = -INFINITY;
		l[5 * V + i] = NAN;
	}
	l[4 * V + V / 2] = -1e30f;
}

/* The flat rows' cases: every token has mass 1, so the definition's
 * boundaries are hit exactly: the pick is the first token whose running
 * mass exceeds u · kept (strictly); top-p keeps the first tokens whose mass
 * reaches top_p · total (>=). */
static const struct {
	float top_p, u;
	int top_k, want;
} flat_cases[] = {
	{ 1.0f, 0.0f, 0, 0 },   { 1.0f, 0.25f, 0, 1 }, { 1.0f, 0.5f, 0, 2 },
	{ 1.0f, 0.75f, 0, 3 },  { 1.0f, 0.999f, 0, 3 }, { 0.5f, 0.5f, 0, 1 },
	{ 0.5f, 0.7f, 0, 1 },   { 0.75f, 0.99f, 0, 2 }, { 0.76f, 0.76f, 0, 3 },
	{ 1.0f, 0.5f, 2, 1 },   { 1.0f, 0.49f, 2, 0 },  { 0.5f, 0.99f, 3, 1 },
	{ 0.0f, 0.99f, 0, 0 },
};

/* The distribution cases' row (V = 4). */
static const float dist_logits[4] = { 1.0f, 0.5f, 0.0f, -1.0f };

/* A sweep row's random settings: long rows need several chunks, top_k
 * around 4096 meets the cpu's chunk, u 0 and 0.99999 meet the ends. */
static struct kt_sample_row sweep_settings(struct op_run *r, int i)
{
	static const int top_ks[] = { 0, 0, 1, 2, 5, 50, 4095, 4096, 4097, 6000, 1 << 30 };
	static const float top_ps[] = { 1.0f, 1.0f, 0.95f, 0.8f, 0.5f, 0.1f, 0.0f };
	static const float temps[] = { 0.3f, 0.7f, 1.0f, 1.6f };
	struct kt_sample_row s = { .temperature = temps[op_randint(r, 4)],
				   .top_p = top_ps[op_randint(r, 7)],
				   .top_k = top_ks[op_randint(r, 11)] };

	s.u = i % 10 == 0 ? 0.0f : i % 10 == 1 ? 0.99999f : (float)op_uniform(r, 0.0, 1.0);
	return s;
}

static void *sample_build(struct op_run *r, const void *params, const struct op_backend *target)
{
	const struct sample_params *p = params;
	struct sample_in *in = op_alloc(r, sizeof(*in));
	const int V = p->V;

	in->V = V;
	in->n = p->kind == SAMPLE_GREEDY_EDGES ? 12 : p->kind == SAMPLE_GREEDY_TIES ? 2 :
		p->kind == SAMPLE_FLAT ? (int)(sizeof flat_cases / sizeof flat_cases[0]) : p->rows;
	in->logits = op_floats(r, (size_t)in->n * V);
	in->rows = op_alloc(r, (size_t)in->n * sizeof(*in->rows));
	in->expect = op_ints(r, (size_t)in->n);
	if (p->kind == SAMPLE_GREEDY_EDGES) {
		edge_rows(r, in->logits, V);
		memcpy(in->logits + (size_t)6 * V, in->logits, (size_t)6 * V * sizeof(float));
	}
	for (int i = 0; i < in->n; i++) {
		float *l = in->logits + (size_t)i * V;
		struct kt_sample_row *s = &in->rows[i];
		struct oracle o;
		double margin;

		switch (p->kind) {
		case SAMPLE_SWEEP:
			gauss_row(r, l, V, p->spread, p->quant);
			*s = sweep_settings(r, i);
			if (p->top_k)
				s->top_k = p->top_k;
			break;
		case SAMPLE_CONSTRUCTED:
			if (p->ties)
				for (int k = 0; k < V; k++)
					l[k] = 2.0f - 0.5f * (float)op_randint(r, p->ties);
			else
				separated_row(r, l, V, V < 600 ? V : 600, 0.02f);
			*s = (struct kt_sample_row){ .temperature = p->temperature,
						     .top_k = p->top_k };
			break;
		case SAMPLE_GREEDY_EDGES:
			/* greedy ignores top_p, top_k and u, whatever they say */
			*s = i < EDGE_GREEDY_ROWS
				     ? (struct kt_sample_row){ .top_p = i % 2 ? 0.01f : 0.0f,
							       .top_k = i % 2 ? 3 : 0,
							       .u = i % 2 ? 0.9f : 0.0f }
				     : (struct kt_sample_row){ .temperature = 0.7f, .top_p = 0.5f,
							       .top_k = 1,
							       .u = (float)op_uniform(r, 0.0, 0.99) };
			break;
		case SAMPLE_GREEDY_TIES:
			gauss_row(r, l, V, 1.0f, 0.0f);
			if (i == 0) {
				l[5] = l[9] = l[200] = 7.0f;
			} else {
				l[0] = NAN;
				l[17] = l[18] = 9.0f;
			}
			*s = i == 0 ? (struct kt_sample_row){ .top_p = 0.01f, .top_k = 3,
							      .u = 0.9f }
				    : (struct kt_sample_row){ .top_p = 1.0f };
			in->expect[i] = i == 0 ? 5 : 17;
			continue;
		case SAMPLE_TOPK1:
			gauss_row(r, l, V, 2.0f, i % 2 ? 0.5f : 0.0f);
			*s = (struct kt_sample_row){ .temperature = (float)op_uniform(r, 0.1, 3.0),
						     .top_p = i % 4 < 2 ? 1.0f : 1e-6f,
						     .top_k = i % 4 < 2 ? 1 : 0,
						     .u = (float)op_uniform(r, 0.0, 0.999) };
			break;
		case SAMPLE_FLAT:
			for (int k = 0; k < V; k++)
				l[k] = 0.5f;
			*s = (struct kt_sample_row){ .temperature = 0.8f,
						     .top_p = flat_cases[i].top_p,
						     .top_k = flat_cases[i].top_k,
						     .u = flat_cases[i].u };
			in->expect[i] = flat_cases[i].want;
			continue;
		case SAMPLE_DISTRIBUTION:
			memcpy(l, dist_logits, sizeof dist_logits);
			*s = (struct kt_sample_row){ .temperature = p->temperature, .top_p = 1.0f,
						     .u = (float)((i + 0.5) / p->rows) };
			in->expect[i] = -1;
			continue;
		}
		oracle_init(r, &o, l, V, s->temperature > 0.0f ? s->temperature : 1.0f, s->top_k);
		if (p->kind == SAMPLE_CONSTRUCTED)
			construct(r, &o, p->top_p, s);
		if (p->kind == SAMPLE_TOPK1) {
			in->expect[i] = o.order[0];
			continue;
		}
		in->expect[i] = oracle_pick(&o, s, &margin);
		if (margin < MARGIN) {
			in->expect[i] = -1;
			in->undecided++;
		}
	}
	return in;
}

static void *sample_run(struct op_run *r, const void *params, const void *input,
			const struct op_backend *b)
{
	const struct sample_params *p = params;
	const struct sample_in *in = input;
	struct sample_out *o = op_alloc(r, sizeof(*o));
	struct kt_tensor l = op_tensor(r, b, KT_F32, in->n, in->V, in->logits);

	o->ids = op_ints(r, (size_t)in->n);
	o->again = op_ints(r, (size_t)in->n);
	o->rc = kt_sample(b->be, &l, in->rows, in->n, o->ids);
	o->rc_again = kt_sample(b->be, &l, in->rows, in->n, o->again);
	if (p->kind == SAMPLE_GREEDY_EDGES) {
		/* rows 0..5 are greedy: alone, a launch that may split each row
		 * over several blocks (cuda) */
		const struct kt_tensor g = kt_rows(l, 0, EDGE_GREEDY_ROWS);

		o->greedy = op_ints(r, EDGE_GREEDY_ROWS);
		o->rc_greedy = kt_sample(b->be, &g, in->rows, EDGE_GREEDY_ROWS, o->greedy);
	}
	if (in->n <= OP_MAX_TOKENS)
		draw_all(r, b, &l, in->rows, in->n, o);
	if (p->kind == SAMPLE_SWEEP && p->top_k) {
		/* the same rows and one more of top_k 0 (row 0's logits): a launch
		 * that takes another kernel on cuda (one block a row, the radix
		 * levels) must pick the same ids */
		const size_t nv = (size_t)in->n * in->V;
		float *host = op_floats(r, nv + (size_t)in->V);
		struct kt_sample_row *rows = op_alloc(r, (size_t)(in->n + 1) * sizeof(*rows));

		memcpy(host, in->logits, nv * sizeof(float));
		memcpy(host + nv, in->logits, (size_t)in->V * sizeof(float));
		memcpy(rows, in->rows, (size_t)in->n * sizeof(*rows));
		rows[in->n] = (struct kt_sample_row){ .temperature = 1.0f, .top_p = 1.0f, .u = 0.5f };

		struct kt_tensor lm = op_tensor(r, b, KT_F32, in->n + 1, in->V, host);

		o->mixed = op_ints(r, (size_t)in->n + 1);
		o->rc_mixed = kt_sample(b->be, &lm, rows, in->n + 1, o->mixed);
	}
	return o;
}

/* Frequencies of the picks over the u grid against softmax(l / T) (within
 * one row of the grid each), and ids that never decrease as u grows (rank
 * order is id order here). */
static void check_distribution(struct op_run *r, const struct sample_params *p,
			       const struct sample_in *in, const int32_t *ids)
{
	double z = 0.0, want[8];
	int count[8] = { 0 }, decreasing = 0, worst = 0;
	double err = 0.0;

	for (int v = 0; v < in->V; v++)
		z += want[v] = exp(in->logits[v] / p->temperature);
	for (int i = 0; i < in->n; i++) {
		count[ids[i] >= 0 && ids[i] < in->V ? ids[i] : 0]++;
		decreasing += i && ids[i] < ids[i - 1];
	}
	for (int v = 0; v < in->V; v++) {
		double e = fabs((double)count[v] / in->n - want[v] / z);

		if (e > err) {
			err = e;
			worst = v;
		}
	}
	op_check(r, err <= 1.0 / in->n, "token %d drawn %d times, softmax says %.1f (off by %.3g)",
		 worst, count[worst], want[worst] / z * in->n, err);
	op_check(r, !decreasing, "picks in rank order as u grows (%d steps back)", decreasing);
}

static void sample_check(struct op_run *r, const void *params, const void *input, const void *got,
			 const void *cpu)
{
	const struct sample_params *p = params;
	const struct sample_in *in = input;
	const struct sample_out *g = got, *c = cpu;
	int checked = 0, vs_oracle = 0, vs_cpu = 0, first = -1;

	op_check_rc(r, g->rc, 0, "sample runs");
	op_check_rc(r, g->rc_again, 0, "sample runs again");
	op_check_ints(r, g->again, g->ids, (size_t)in->n, "the same ids the second time");
	if (p->kind == SAMPLE_SWEEP && p->top_k) {
		op_check_rc(r, g->rc_mixed, 0, "sample runs the rows beside a row of top_k 0");
		op_check_ints(r, g->mixed, g->ids, (size_t)in->n,
			      "the same ids beside a row of top_k 0");
	}
	if (p->kind == SAMPLE_GREEDY_EDGES) {
		op_check_rc(r, g->rc_greedy, 0, "sample runs the greedy rows alone");
		op_check_ints(r, g->greedy, g->ids, EDGE_GREEDY_ROWS,
			      "the greedy rows alone as beside the sampled ones");
	}
	if (g->drew) {
		bool greedy = true;

		for (int i = 0; i < in->n; i++)
			greedy = greedy && in->rows[i].temperature == 0.0f;
		op_check_rc(r, g->rc_draw, 0, "draw runs the rows");
		op_check(r, g->kind >= 0 && g->kind < KT_DRAW_KINDS && (g->kind == 0) == greedy,
			 "the draw's kind %d, 0 only for greedy rows", g->kind);
		op_check_ints(r, g->drawn, g->ids, (size_t)in->n, "draw's ids as sample's");
		op_check_rc(r, g->rc_graph, 0, "draw runs in a graph");
		op_check(r, g->kind_graph == g->kind, "the same kind staged again (%d, %d)",
			 g->kind_graph, g->kind);
		op_check_ints(r, g->graphed, g->ids, (size_t)in->n, "the graph's draw as sample's");
		op_check_rc(r, g->rc_resample, 0, "sample runs the rows with u moved");
		op_check_rc(r, g->rc_replay, 0, "the graph replays with those rows staged");
		if (g->kind_again == g->kind_graph)
			op_check_ints(r, g->replayed, g->resampled, (size_t)in->n,
				      "the replay's draw as sample's of the rows staged for it");
	}
	if (p->kind == SAMPLE_DISTRIBUTION) {
		check_distribution(r, p, in, g->ids);
		return;
	}
	for (int i = 0; i < in->n; i++) {
		if (in->expect[i] < 0)
			continue;
		checked++;
		if (g->ids[i] != in->expect[i] && !vs_oracle++)
			first = i;
		if (c && g->ids[i] != c->ids[i] && !vs_cpu++ && first < 0)
			first = i;
	}
	op_check(r, !vs_oracle, "%d of %d decided rows as the oracle picks (%d differ%s)", checked,
		 in->n, vs_oracle, vs_oracle ? ": see the first below" : "");
	if (c)
		op_check(r, !vs_cpu, "the decided rows as the cpu picks (%d differ)", vs_cpu);
	if (first >= 0) {
		const struct kt_sample_row *s = &in->rows[first];
		char cpu_id[32] = "";

		if (c)
			snprintf(cpu_id, sizeof cpu_id, ", cpu %d", c->ids[first]);
		op_check(r, false,
			 "row %d (T %g, top_k %d, top_p %.9g, u %.9g): got %d, oracle %d%s", first,
			 s->temperature, s->top_k, s->top_p, s->u, g->ids[first],
			 in->expect[first], cpu_id);
	}
	if (p->kind == SAMPLE_SWEEP) {
		/* One more than the share, for sweeps of a few rows (row 1 has
		 * u = 0.99999, deep in a long tail). */
		int most = p->max_undecided ? p->max_undecided : 1;

		op_check(r, in->undecided <= most * in->n / 10 + 1,
			 "at most %d rows in ten (and one) too close to a boundary to call "
			 "(%d of %d)", most, in->undecided, in->n);
	}
}

static const struct op_family sample = { sample_build, sample_run, sample_check, false };

#define SAMPLE(name, ...) \
	{ name, "sample", &sample, &(const struct sample_params){ __VA_ARGS__ } }
#define SWEEP(name, v, n, s, q, ...) \
	SAMPLE(name, .kind = SAMPLE_SWEEP, .V = v, .rows = n, .spread = s, .quant = q, __VA_ARGS__)
#define CONSTRUCTED(name, ...) SAMPLE(name, .kind = SAMPLE_CONSTRUCTED, __VA_ARGS__)
#define EDGES(v) SAMPLE("sample greedy and top_k 1, edge rows, V=" #v, \
			.kind = SAMPLE_GREEDY_EDGES, .V = v)

static const struct op_case cases[] = {
	EDGES(1), EDGES(7), EDGES(300), EDGES(1000), EDGES(40001), EDGES(151936),
	SAMPLE("sample greedy: lowest id of tied maxima, NaN as -inf", .kind = SAMPLE_GREEDY_TIES,
	       .V = 300),
	SAMPLE("sample top_k 1 and tiny top_p are greedy V=1000", .kind = SAMPLE_TOPK1,
	       .V = 1000, .rows = 40),
	SWEEP("sample sweep V=1", 1, 4, 1.0f, 0.0f),
	SWEEP("sample sweep V=7", 7, 60, 1.0f, 0.0f),
	SWEEP("sample sweep V=1000", 1000, 200, 2.0f, 0.0f),
	SWEEP("sample sweep V=1000 quantized (ties)", 1000, 100, 2.0f, 0.25f),
	SWEEP("sample sweep V=5000", 5000, 60, 1.5f, 0.0f),
	/* flat rows put top-p and u boundaries exactly on whole masses */
	SWEEP("sample sweep V=12000 flat", 12000, 12, 0.0f, 0.0f, .max_undecided = 5),
	SWEEP("sample sweep V=9000 quantized (long tie runs)", 9000, 16, 0.3f, 0.25f),
	SWEEP("sample sweep V=151936", 151936, 4, 3.0f, 0.0f),
	/* every row of a top_k of at most a few hundred: cuda's candidates */
	SWEEP("sample sweep V=151936 top_k 40", 151936, 24, 3.0f, 0.0f, .top_k = 40),
	SWEEP("sample sweep V=151936 top_k 107 quantized (ties)", 151936, 24, 2.0f, 0.25f,
	      .top_k = 107),
	SWEEP("sample sweep V=5000 top_k 256", 5000, 40, 1.5f, 0.0f, .top_k = 256),
	SWEEP("sample sweep V=9000 top_k 3 quantized (long tie runs)", 9000, 40, 0.3f, 0.25f,
	      .top_k = 3),
	SAMPLE("sample flat rows: exact boundaries", .kind = SAMPLE_FLAT, .V = 4),
	SAMPLE("sample distribution over u, T=0.25", .kind = SAMPLE_DISTRIBUTION, .V = 4,
	       .rows = 4000, .temperature = 0.25f),
	SAMPLE("sample distribution over u, T=1", .kind = SAMPLE_DISTRIBUTION, .V = 4,
	       .rows = 4000, .temperature = 1.0f),
	SAMPLE("sample distribution over u, T=4", .kind = SAMPLE_DISTRIBUTION, .V = 4,
	       .rows = 4000, .temperature = 4.0f),
	CONSTRUCTED("sample V=5000 T=1", .V = 5000, .rows = 8, .temperature = 1.0f),
	CONSTRUCTED("sample V=5000 T=0.7 top_k 50", .V = 5000, .rows = 8, .temperature = 0.7f,
		    .top_k = 50),
	CONSTRUCTED("sample V=5000 T=1.3 top_p", .V = 5000, .rows = 8, .temperature = 1.3f,
		    .top_p = true),
	CONSTRUCTED("sample V=5000 T=0.5 top_k 40 top_p", .V = 5000, .rows = 8,
		    .temperature = 0.5f, .top_k = 40, .top_p = true),
	CONSTRUCTED("sample V=151936 T=1 top_p", .V = 151936, .rows = 8, .temperature = 1.0f,
		    .top_p = true),
	CONSTRUCTED("sample V=151936 T=0.8 top_k 20", .V = 151936, .rows = 8,
		    .temperature = 0.8f, .top_k = 20),
	CONSTRUCTED("sample V=151936 T=0.8 top_p, 16 rows", .V = 151936, .rows = 16,
		    .temperature = 0.8f, .top_p = true),
	CONSTRUCTED("sample V=1000 T=1 top_k V", .V = 1000, .rows = 8, .temperature = 1.0f,
		    .top_k = 1000),
	CONSTRUCTED("sample V=1000 T=1 top_k past V top_p", .V = 1000, .rows = 8,
		    .temperature = 1.0f, .top_k = 5000, .top_p = true),
	CONSTRUCTED("sample V=3 T=2 top_k 2 top_p", .V = 3, .rows = 8, .temperature = 2.0f,
		    .top_k = 2, .top_p = true),
	CONSTRUCTED("sample V=1000 one value everywhere", .V = 1000, .rows = 4,
		    .temperature = 1.0f, .ties = 1),
	CONSTRUCTED("sample V=1000 ten tied values", .V = 1000, .rows = 8, .temperature = 1.0f,
		    .ties = 10),
	CONSTRUCTED("sample V=1000 ten tied values top_k 300 top_p", .V = 1000, .rows = 8,
		    .temperature = 0.9f, .top_k = 300, .top_p = true, .ties = 10),
	CONSTRUCTED("sample V=4096 ten tied values T=3 top_p", .V = 4096, .rows = 8,
		    .temperature = 3.0f, .top_p = true, .ties = 10),
	CONSTRUCTED("sample V=257 rows=max_tokens+44 top_p", .V = 257, .rows = OP_MAX_TOKENS + 44,
		    .temperature = 1.0f, .top_p = true),
};

OP_LIST(ops_sample, cases);
