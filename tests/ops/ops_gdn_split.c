/* The split invariant of conv1d and delta_rule: the same sequences run as
 * one call and as calls of at most `chunk` rows of each sequence (1, 3 and
 * 64 here), every call holding the next rows of every sequence not yet
 * done, in reversed order on every other call (so that a sequence meets
 * other neighbours), give the same outputs and final state. The state
 * carries everything between calls.
 *
 * On the cpu: bitwise (DESIGN §4.1: neither batch size nor prefill chunk
 * size may change a result), and also bitwise on a backend of one thread
 * (the last case's lone head is split into column blocks over two or more
 * threads, not on one).
 * On another backend: each split run against its own one-call run within
 * the tolerances of ops_gdn.c's comparisons with the cpu (max_abs 1e-5
 * for conv1d, 1e-4 for delta_rule; NMSE 1e-12 and 1e-9), the conv's state
 * bitwise.
 */
#include <string.h>

#include "tests/ops/ops.h"
#include "tests/ops/ops_gdn.h"

struct split_out {
	int rc_one, rc_split[3], rc_alone;
	float *out_one, *state_one, *out_alone, *state_alone;
	float *out_split[3], *state_split[3];
	size_t n_out, n_state;
};

static void *split_build(struct op_run *r, const void *params, const struct op_backend *target)
{
	return gdn_build(r, params);
}

/* The whole world in calls of at most chunk rows per sequence (chunk 0:
 * one call) on b: out and the state after. */
static int run_split(struct op_run *r, const struct op_backend *b, const struct gdn_params *p,
		     const struct gdn_world *w, int chunk, float *out, float **state)
{
	const struct gdn_dev d = gdn_upload(r, b, p, w);
	struct gdn_piece pc[GDN_MAX_RUNS];
	int rc = 0;

	for (int r0 = 0, call = 0;; r0 += chunk, call++) {
		int n = 0;

		/* Decode pieces first, then segments, each group reversed on odd calls. */
		for (int seg = 0; seg < 2; seg++) {
			const int first = n;

			for (int i = 0; i < p->n_runs; i++) {
				const int left = p->runs[i].len - r0;

				if (p->runs[i].seg != seg || left <= 0)
					continue;
				pc[n++] = (struct gdn_piece){ i, r0, chunk && left > chunk ? chunk
											   : left };
			}
			for (int a = first, z = n - 1; call % 2 && a < z; a++, z--) {
				struct gdn_piece t = pc[a];

				pc[a] = pc[z];
				pc[z] = t;
			}
		}
		if (!n)
			break;
		rc = gdn_call(r, b, p, w, &d, pc, n, out);
		if (rc || !chunk)
			break;
	}
	*state = op_get(r, b, &d.state);
	return rc;
}

static void *split_run(struct op_run *r, const void *params, const void *input,
		       const struct op_backend *b)
{
	const struct gdn_params *p = params;
	const struct gdn_world *w = input;
	struct split_out *o = op_alloc(r, sizeof(*o));
	const int64_t oc = p->op == GDN_CONV ? w->C : (int64_t)p->Hv * p->dv;

	o->n_out = (size_t)(w->T * oc);
	o->n_state = (size_t)(w->n_slots * w->F);
	o->out_one = op_floats(r, o->n_out);
	o->rc_one = run_split(r, b, p, w, 0, o->out_one, &o->state_one);
	for (int c = 0; c < 3 && p->chunks[c]; c++) {
		o->out_split[c] = op_floats(r, o->n_out);
		o->rc_split[c] = run_split(r, b, p, w, p->chunks[c], o->out_split[c],
					   &o->state_split[c]);
	}
	if (strcmp(b->be->info.backend, "cpu") == 0) {
		struct kt_config one = *b->config;

		one.threads = 1;
		o->out_alone = op_floats(r, o->n_out);
		o->rc_alone = run_split(r, op_open(r, b, &one), p, w, 0, o->out_alone,
					&o->state_alone);
	}
	return o;
}

static void split_check(struct op_run *r, const void *params, const void *input,
			const void *got, const void *cpu)
{
	const struct gdn_params *p = params;
	const struct split_out *g = got;
	const bool conv = p->op == GDN_CONV;
	const double tol = conv ? 1e-5 : 1e-4, nmse = conv ? 1e-12 : 1e-9;

	op_check_rc(r, g->rc_one, 0, "one call runs");
	for (int c = 0; c < 3 && p->chunks[c]; c++) {
		op_check_rc(r, g->rc_split[c], 0, "calls of %d rows run", p->chunks[c]);
		if (g->out_alone) {
			op_check_bits(r, g->out_split[c], g->out_one, g->n_out,
				      "out of calls of %d rows bitwise that of one call",
				      p->chunks[c]);
			op_check_bits(r, g->state_split[c], g->state_one, g->n_state,
				      "the state after calls of %d rows bitwise that of one call",
				      p->chunks[c]);
			continue;
		}
		op_check_close(r, g->out_split[c], g->out_one, g->n_out, tol, nmse,
			       "out of calls of %d rows against one call", p->chunks[c]);
		if (conv)
			op_check_bits(r, g->state_split[c], g->state_one, g->n_state,
				      "the conv state after calls of %d rows bitwise that of one call",
				      p->chunks[c]);
		else
			op_check_close(r, g->state_split[c], g->state_one, g->n_state, tol, nmse,
				       "the state after calls of %d rows against one call",
				       p->chunks[c]);
	}
	if (!g->out_alone)
		return;
	op_check_rc(r, g->rc_alone, 0, "one call on one thread runs");
	op_check_bits(r, g->out_alone, g->out_one, g->n_out, "out on one thread bitwise the same");
	op_check_bits(r, g->state_alone, g->state_one, g->n_state,
		      "the state on one thread bitwise the same");
}

static const struct op_family split = { split_build, split_run, split_check, true };

#define DEC(len, pos0) { len, pos0, false }
#define SEG(len, pos0) { len, pos0, true }
#define RUNS(...) .runs = { __VA_ARGS__ }, \
	.n_runs = sizeof((struct gdn_run[]){ __VA_ARGS__ }) / sizeof(struct gdn_run)
#define SPLIT(name, opname, o, ...) \
	{ name, opname, &split, \
	  &(const struct gdn_params){ .op = o, .chunks = { 1, 3, 64 }, __VA_ARGS__ } }

static const struct op_case cases[] = {
	SPLIT("conv1d split: segments of 170, 65, 7 and a verify run in 1, 3, 64-row calls",
	      "conv1d", GDN_CONV, .Hk = 2, .Hv = 4, .dk = 32, .dv = 64, .K = 4,
	      RUNS(DEC(5, 30), SEG(170, 0), SEG(65, 12), SEG(7, 3))),
	SPLIT("conv1d split K=2: segments of 70 and 1", "conv1d", GDN_CONV, .Hk = 1, .Hv = 1,
	      .dk = 16, .dv = 16, .K = 2, RUNS(SEG(70, 0), SEG(1, 4))),
	SPLIT("delta_rule split: segments of 170, 65, 7 and a verify run in 1, 3, 64-row calls",
	      "delta_rule", GDN_DELTA, .Hk = 1, .Hv = 2, .dk = 128, .dv = 128, .K = 4,
	      RUNS(DEC(5, 30), SEG(170, 0), SEG(65, 12), SEG(7, 3))),
	SPLIT("delta_rule split Hv/Hk=4 dk=32 dv=64: segments of 100 and 64", "delta_rule",
	      GDN_DELTA, .Hk = 1, .Hv = 4, .dk = 32, .dv = 64, .K = 4,
	      RUNS(SEG(100, 0), SEG(64, 9))),
	SPLIT("delta_rule split one decode sequence of 64 (column blocks)", "delta_rule",
	      GDN_DELTA, .Hk = 1, .Hv = 1, .dk = 64, .dv = 128, .K = 4, RUNS(DEC(64, 0))),
};

OP_LIST(ops_gdn_split, cases);
