/* Cases of moe_route: each token's softmax over its E logits, its top k
 * experts and their weights, and the routing plan (order, slot, offsets) of
 * the batch. Its references (the top k, the weights in double, the plan)
 * are defined here and shared with the other moe case files through
 * ops_moe.h; its refusals are in ops_moe_faults.c.
 *
 * ids, order, slot and offsets are exact on every backend (the top k by
 * logit, equal logits by lower id, by selection on the host; the plan a
 * stable sort of the assignments by expert). w within 2e-5 of |ref|, ref
 * the softmax in double (the f32 sum of E terms errs by up to
 * (E - 1) · 2^-24, 7.6e-6 at E = 128, plus expf's ulps); against the cpu
 * max_abs 1e-5, NMSE 1e-10 (a device sums E terms in another order).
 * On the cpu w is also bitwise its f32 recipe (cpu_moe.c). Logits: random
 * (±100 too, where expf overflows without the max), small integers (ties
 * across the k-th place), and all equal.
 */
#include <math.h>

#include "tests/ops/ops.h"
#include "tests/ops/ops_moe.h"

void moe_ref_topk(const float *l, int E, int k, int32_t *ids)
{
	for (int j = 0; j < k; j++) {
		int best = -1;

		for (int e = 0; e < E; e++) {
			bool taken = false;

			for (int i = 0; i < j; i++)
				taken = taken || ids[i] == e;
			if (!taken && (best < 0 || l[e] > l[best]))
				best = e;
		}
		ids[j] = best;
	}
}

void moe_ref_weights(const float *l, int E, const int32_t *ids, int k, bool norm, double *w)
{
	double m = l[0], s = 0.0, sum = 0.0;

	for (int e = 1; e < E; e++)
		m = l[e] > m ? l[e] : m;
	for (int e = 0; e < E; e++)
		s += exp(l[e] - m);
	for (int j = 0; j < k; j++) {
		w[j] = exp(l[ids[j]] - m) / s;
		sum += w[j];
	}
	for (int j = 0; norm && j < k; j++)
		w[j] /= sum;
}

void moe_ref_plan(const int32_t *ids, int A, int E, int32_t *order, int32_t *slot,
		  int32_t *offsets)
{
	int pos = 0;

	for (int e = 0; e < E; e++) {
		offsets[e] = pos;
		for (int a = 0; a < A; a++)
			if (ids[a] == e) {
				order[pos] = a;
				slot[a] = pos++;
			}
	}
	offsets[E] = pos;
}

/* ids' weights as the cpu computes them in f32: m the max logit, s the sum
 * of expf(l - m) in expert order, expf(l - m) / s, then each divided by
 * their sum in j order when norm. */
static void f32_weights(const float *l, int E, const int32_t *ids, int k, bool norm, float *w)
{
	float m = l[0], s = 0.0f, sum = 0.0f;

	for (int e = 1; e < E; e++)
		m = l[e] > m ? l[e] : m;
	for (int e = 0; e < E; e++)
		s += expf(l[e] - m);
	for (int j = 0; j < k; j++) {
		w[j] = expf(l[ids[j]] - m) / s;
		sum += w[j];
	}
	for (int j = 0; norm && j < k; j++)
		w[j] /= sum;
}

enum logits_kind {
	LOGITS_RANDOM, /* ±[mag/100, mag] */
	LOGITS_TIES,   /* integers -2..2: ties at the k-th place */
	LOGITS_EQUAL,  /* every logit 0.5 */
};

struct route_params {
	int T, E, k;
	bool norm;
	enum logits_kind logits;
	float mag; /* LOGITS_RANDOM; 0: 4 */
};

struct route_out {
	int rc;
	int32_t *ids, *order, *slot, *offsets;
	float *w;
};

static void fill_logits(struct op_run *r, float *l, size_t n, enum logits_kind kind, float mag)
{
	for (size_t i = 0; i < n; i++)
		l[i] = kind == LOGITS_TIES ? (float)(op_randint(r, 5) - 2) : 0.5f;
	if (kind == LOGITS_RANDOM)
		op_fill(r, l, n, mag > 0.0f ? mag : 4.0f);
}

static void *route_build(struct op_run *r, const void *params, const struct op_backend *target)
{
	const struct route_params *p = params;
	float *l = op_floats(r, (size_t)p->T * p->E);

	fill_logits(r, l, (size_t)p->T * p->E, p->logits, p->mag);
	return l;
}

static void *route_run(struct op_run *r, const void *params, const void *input,
		       const struct op_backend *b)
{
	const struct route_params *p = params;
	const int A = p->T * p->k;
	struct route_out *o = op_alloc(r, sizeof(*o));
	struct kt_tensor logits = op_tensor(r, b, KT_F32, p->T, p->E, input);
	struct kt_tensor ids = op_tensor_raw(r, b, KT_I32, p->T, p->k, NULL);
	struct kt_tensor w = op_tensor(r, b, KT_F32, p->T, p->k, NULL);
	struct kt_tensor order = op_tensor_raw(r, b, KT_I32, A, 1, NULL);
	struct kt_tensor slot = op_tensor_raw(r, b, KT_I32, A, 1, NULL);
	struct kt_tensor offsets = op_tensor_raw(r, b, KT_I32, p->E + 1, 1, NULL);

	o->rc = kt_moe_route(b->be, &ids, &w, &order, &slot, &offsets, &logits, p->norm);
	o->ids = op_get_ints(r, b, &ids);
	o->w = op_get(r, b, &w);
	o->order = op_get_ints(r, b, &order);
	o->slot = op_get_ints(r, b, &slot);
	o->offsets = op_get_ints(r, b, &offsets);
	return o;
}

static void route_check(struct op_run *r, const void *params, const void *input, const void *got,
			const void *cpu)
{
	const struct route_params *p = params;
	const float *l = input;
	const struct route_out *g = got, *c = cpu;
	const int A = p->T * p->k;
	int32_t *ids = op_ints(r, (size_t)A), *order = op_ints(r, (size_t)A);
	int32_t *slot = op_ints(r, (size_t)A), *offsets = op_ints(r, (size_t)p->E + 1);
	double *w = op_doubles(r, (size_t)A);
	float *w32 = op_floats(r, (size_t)A);

	op_check_rc(r, g->rc, 0, "moe_route runs");
	for (int t = 0; t < p->T; t++) {
		const float *lt = l + (size_t)t * p->E;
		int32_t *it = ids + (size_t)t * p->k;

		moe_ref_topk(lt, p->E, p->k, it);
		moe_ref_weights(lt, p->E, it, p->k, p->norm, w + (size_t)t * p->k);
		f32_weights(lt, p->E, it, p->k, p->norm, w32 + (size_t)t * p->k);
	}
	moe_ref_plan(ids, A, p->E, order, slot, offsets);
	op_check_ints(r, g->ids, ids, (size_t)A, "ids: the top %d by logit, lower id first", p->k);
	op_check_ints(r, g->order, order, (size_t)A, "order: the stable sort by expert");
	op_check_ints(r, g->slot, slot, (size_t)A, "slot: order's inverse");
	op_check_ints(r, g->offsets, offsets, (size_t)p->E + 1, "offsets: each expert's start");
	if (c) {
		op_check_close(r, g->w, c->w, (size_t)A, 1e-5, 1e-10, "w against the cpu");
		return;
	}
	op_check_rel(r, g->w, w, NULL, (size_t)A, 2e-5, "w against the softmax in double%s",
		     p->norm ? ", renormalised" : "");
	op_check_bits(r, g->w, w32, (size_t)A, "w bitwise the cpu's f32 softmax (max, expf, "
		      "expert order%s)", p->norm ? ", then the sum over j" : "");
}

static const struct op_family route = { route_build, route_run, route_check, false };

#define ROUTE(name, ...) \
	{ name, "moe_route", &route, &(const struct route_params){ __VA_ARGS__ } }

static const struct op_case cases[] = {
	ROUTE("moe_route T=1 E=8 k=1", .T = 1, .E = 8, .k = 1),
	ROUTE("moe_route T=3 E=8 k=2 norm", .T = 3, .E = 8, .k = 2, .norm = true),
	ROUTE("moe_route T=17 E=64 k=8 norm", .T = 17, .E = 64, .k = 8, .norm = true),
	ROUTE("moe_route T=17 E=128 k=1", .T = 17, .E = 128, .k = 1),
	ROUTE("moe_route T=200 E=128 k=8 norm", .T = 200, .E = 128, .k = 8, .norm = true),
	ROUTE("moe_route T=200 E=128 k=8", .T = 200, .E = 128, .k = 8),
	ROUTE("moe_route T=3 E=64 k=2", .T = 3, .E = 64, .k = 2),
	ROUTE("moe_route T=5 E=64 k=16 norm", .T = 5, .E = 64, .k = KT_MOE_MAX_K, .norm = true),
	ROUTE("moe_route T=17 E=64 k=8 logits ±100", .T = 17, .E = 64, .k = 8, .mag = 100.0f),
	ROUTE("moe_route T=17 E=8 k=2 ties norm", .T = 17, .E = 8, .k = 2, .norm = true,
	      .logits = LOGITS_TIES),
	ROUTE("moe_route T=200 E=64 k=8 ties", .T = 200, .E = 64, .k = 8, .logits = LOGITS_TIES),
	ROUTE("moe_route T=17 E=128 k=1 ties", .T = 17, .E = 128, .k = 1,
	      .logits = LOGITS_TIES),
	ROUTE("moe_route T=17 E=8 k=8 (k = E) ties norm", .T = 17, .E = 8, .k = 8, .norm = true,
	      .logits = LOGITS_TIES),
	ROUTE("moe_route T=3 E=128 k=8 all equal norm", .T = 3, .E = 128, .k = 8, .norm = true,
	      .logits = LOGITS_EQUAL),
	ROUTE("moe_route T=3 E=64 k=2 all equal", .T = 3, .E = 64, .k = 2,
	      .logits = LOGITS_EQUAL),
};

OP_LIST(ops_moe_route, cases);
