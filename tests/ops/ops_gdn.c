/* Cases of the Gated DeltaNet ops, conv1d and delta_rule: several sequences
 * per call on state rows in shuffled order among unused ones, decode and
 * verify runs of 1 to 5 rows, prompt segments of 1 to 200 rows, runs from
 * position 0 (their state rows hold garbage, which must be ignored) and
 * from later positions (state carried), dk, dv in {16, 32, 64, 128}, Hv/Hk
 * 1, 2 and 4, K 4 and 2. The world (ops_gdn.h) and the references in
 * double are here too; the split invariant is ops_gdn_split.c's, the
 * refusals ops_gdn_faults.c's.
 *
 * Every case also checks that what the op must not touch is bitwise as it
 * was: unused state rows, the floats of a used row past the conv's inputs
 * (conv1d) or before off (delta_rule: the conv's part).
 *
 * conv1d against the reference: out within 1e-6 of |terms| + |out| (the f32
 * sum of K products errs by K ulps of the terms, silu by a few of out); the
 * state after bitwise (it is copies of inputs, and zeros before position
 * 0). Against the cpu: out max_abs 1e-5, NMSE 1e-12 (expf's last bits),
 * the state bitwise.
 *
 * delta_rule against the reference: each (row, head) of out within tol of
 * RMS(S after the row) · sum |q| (out's error is S's weighted by |q|), and
 * each (slot, head) matrix of the state after within tol of its RMS. One
 * step errs by a few f32 ulps of those (sums of dk products, expf of the
 * decay); the rule does not expand old errors (decay <= 1, and
 * I - beta·k·kᵀ with |k| = 1 has eigenvalues 1 - beta and 1) and mostly
 * forgets them, so over n rows they grow at most like n and in practice
 * not at all (measured: below 1e-6 at 1 and at 200 rows). tol 4e-6 for
 * runs of up to 7 rows, 1e-5 for longer ones. Against the cpu: max_abs
 * 1e-4 on outputs and matrices of magnitude about 1, NMSE 1e-9 (a device
 * sums the dk products in another order, and its expf and log1pf differ).
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "tests/ops/ops.h"
#include "tests/ops/ops_gdn.h"

struct gdn_world *gdn_build(struct op_run *r, const struct gdn_params *p)
{
	struct gdn_world *w = op_alloc(r, sizeof(*w));
	int32_t order[GDN_MAX_RUNS + 2];

	w->n_slots = p->n_runs + 2;
	for (int s = 0; s < w->n_slots; s++)
		order[s] = s;
	op_shuffle(r, order, w->n_slots);
	for (int i = 0; i < p->n_runs; i++) {
		w->start[i] = w->T;
		w->slot[i] = order[i];
		w->T += p->runs[i].len;
	}
	w->C = 2 * (int64_t)p->Hk * p->dk + (int64_t)p->Hv * p->dv;
	w->off = (p->K - 1) * w->C;
	w->F = p->op == GDN_CONV ? w->off + 3 : w->off + (int64_t)p->Hv * p->dk * p->dv;
	w->x = op_floats(r, (size_t)(w->T * w->C));
	w->w = op_floats(r, (size_t)(w->C * p->K));
	w->ba = op_floats(r, (size_t)w->T * 2 * p->Hv);
	w->a_log = op_floats(r, (size_t)p->Hv);
	w->dt_bias = op_floats(r, (size_t)p->Hv);
	w->state = op_floats(r, (size_t)(w->n_slots * w->F));
	op_fill(r, w->x, (size_t)(w->T * w->C), 1.0f);
	op_fill(r, w->w, (size_t)(w->C * p->K), 0.5f);
	/* bf16 values: a backend that keeps weights in bf16 (cuda) holds them
	 * exactly, so the comparison with the cpu sees the op, not the rounding. */
	op_round_bf16(w->w, (size_t)(w->C * p->K));
	op_fill(r, w->ba, (size_t)w->T * 2 * p->Hv, 4.0f);
	op_fill(r, w->dt_bias, (size_t)p->Hv, 1.0f);
	for (int h = 0; h < p->Hv; h++)
		w->a_log[h] = (float)op_uniform(r, -3.0, 2.5);
	/* Some a past softplus's threshold of 20. */
	for (int t = 0; t < w->T; t += 7)
		w->ba[(size_t)t * 2 * p->Hv + p->Hv] = (float)op_uniform(r, 21.0, 25.0);
	for (int s = 0; s < w->n_slots; s++) {
		float *row = w->state + s * w->F;

		op_fill(r, row, (size_t)w->off, 1.0f);
		op_fill(r, row + w->off, (size_t)(w->F - w->off), 0.3f);
	}
	return w;
}

struct gdn_dev gdn_upload(struct op_run *r, const struct op_backend *b,
			  const struct gdn_params *p, const struct gdn_world *w)
{
	return (struct gdn_dev){
		.state = op_tensor(r, b, KT_F32, w->n_slots, w->F, w->state),
		.w = op_weight(r, b, KT_F32, w->w, w->C, p->K),
		.a_log = op_tensor(r, b, KT_F32, 1, p->Hv, w->a_log),
		.dt_bias = op_tensor(r, b, KT_F32, 1, p->Hv, w->dt_bias),
	};
}

int gdn_call(struct op_run *r, const struct op_backend *b, const struct gdn_params *p,
	     const struct gdn_world *w, const struct gdn_dev *d, const struct gdn_piece *pc,
	     int n_pc, float *out)
{
	const int64_t C = w->C, bac = 2 * (int64_t)p->Hv;
	const int64_t oc = p->op == GDN_CONV ? C : (int64_t)p->Hv * p->dv;
	int T = 0, n_single = 0, n_seg = 0, row = 0, max_pos = 0, rc;
	struct kt_segment *segs;
	float *x, *ba, *got;
	int32_t *pos, *slot;

	for (int i = 0; i < n_pc; i++) {
		T += pc[i].n;
		if (p->runs[pc[i].run].seg)
			n_seg++;
		else
			n_single += pc[i].n;
	}
	x = op_floats(r, (size_t)(T * C));
	ba = op_floats(r, (size_t)(T * bac));
	pos = op_ints(r, (size_t)T);
	slot = op_ints(r, (size_t)T);
	segs = op_alloc(r, (size_t)n_seg * sizeof(*segs));
	n_seg = 0;
	for (int i = 0; i < n_pc; i++) {
		const struct gdn_run *run = &p->runs[pc[i].run];
		const int first = w->start[pc[i].run] + pc[i].r0;

		if (run->seg)
			segs[n_seg++] = (struct kt_segment){ row, pc[i].n, run->pos0 + pc[i].r0,
							     w->slot[pc[i].run] };
		for (int j = 0; j < pc[i].n; j++, row++) {
			memcpy(x + row * C, w->x + (first + j) * C, (size_t)C * sizeof(float));
			memcpy(ba + row * bac, w->ba + (first + j) * bac, (size_t)bac * sizeof(float));
			pos[row] = run->pos0 + pc[i].r0 + j;
			slot[row] = w->slot[pc[i].run];
			max_pos = pos[row] > max_pos ? pos[row] : max_pos;
		}
	}
	struct kt_tensor tx = op_tensor(r, b, KT_F32, T, C, x);
	struct kt_tensor tba = op_tensor(r, b, KT_F32, T, bac, ba);
	struct kt_tensor tout = op_tensor(r, b, KT_F32, T, oc, NULL);
	struct kt_tensor tslot = op_tensor_raw(r, b, KT_I32, T, 1, slot);
	struct kt_batch batch = {
		.n_tokens = T, .block_size = 16, .max_kv_len = max_pos + 1,
		.pos = op_tensor_raw(r, b, KT_I32, T, 1, pos),
		.seq = op_tensor_raw(r, b, KT_I32, T, 1, slot),
		.block_tables = op_tensor_raw(r, b, KT_I32, w->n_slots, 1,
					      op_ints(r, (size_t)w->n_slots)),
		.n_single = n_single, .n_segments = n_seg, .segments = segs,
	};

	if (p->op == GDN_CONV)
		rc = kt_conv1d(b->be, &tout, &tx, &d->w, &d->state, &tslot, &batch);
	else
		rc = kt_delta_rule(b->be, &tout, &tx, &tba, &d->a_log, &d->dt_bias, &d->state,
				   w->off, &tslot, &batch, p->Hk, p->Hv, p->dk, p->dv);
	if (rc)
		return rc;
	got = op_get(r, b, &tout);
	row = 0;
	for (int i = 0; i < n_pc; i++)
		for (int j = 0; j < pc[i].n; j++, row++)
			memcpy(out + (w->start[pc[i].run] + pc[i].r0 + j) * oc, got + row * oc,
			       (size_t)oc * sizeof(float));
	return 0;
}

/* The conv input of channel c at position q of run i, before the step. */
static float conv_input(const struct gdn_params *p, const struct gdn_world *w, int i, int64_t q,
			int64_t c)
{
	const int pos0 = p->runs[i].pos0;

	if (q >= pos0)
		return w->x[(w->start[i] + q - pos0) * w->C + c];
	if (q >= 0)
		return w->state[w->slot[i] * w->F + (q - pos0 + p->K - 1) * w->C + c];
	return 0.0f;
}

void gdn_ref_conv(const struct gdn_params *p, const struct gdn_world *w, double *out,
		  double *scale, float *state)
{
	const int64_t C = w->C;

	memcpy(state, w->state, (size_t)(w->n_slots * w->F) * sizeof(float));
	for (int i = 0; i < p->n_runs; i++) {
		const struct gdn_run *run = &p->runs[i];
		const int64_t last = run->pos0 + run->len - 1;

		for (int t = 0; t < run->len; t++) {
			for (int64_t c = 0; c < C; c++) {
				const size_t at = (size_t)((w->start[i] + t) * C + c);
				double acc = 0.0, mag = 0.0;

				for (int j = 0; j < p->K; j++) {
					double v = (double)w->w[c * p->K + j] *
						   conv_input(p, w, i, run->pos0 + t - p->K + 1 + j, c);

					acc += v;
					mag += fabs(v);
				}
				out[at] = acc / (1.0 + exp(-acc));
				scale[at] = mag + fabs(out[at]);
			}
		}
		for (int j = 0; j < p->K - 1; j++)
			for (int64_t c = 0; c < C; c++)
				state[w->slot[i] * w->F + j * C + c] =
					conv_input(p, w, i, last - p->K + 2 + j, c);
	}
}

/* dst = x / sqrt(sum x² + 1e-6) · scale in double. */
static void ref_l2(double *dst, const float *x, int n, double scale)
{
	double ss = 0.0;

	for (int i = 0; i < n; i++)
		ss += (double)x[i] * x[i];
	for (int i = 0; i < n; i++)
		dst[i] = x[i] / sqrt(ss + 1e-6) * scale;
}

static double rms(const double *x, size_t n)
{
	double ss = 0.0;

	for (size_t i = 0; i < n; i++)
		ss += x[i] * x[i];
	return sqrt(ss / (double)n);
}

void gdn_ref_delta(const struct gdn_params *p, const struct gdn_world *w, double *out,
		   double *out_scale, double *state, double *state_scale)
{
	const int dk = p->dk, dv = p->dv, Hv = p->Hv, group = p->Hv / p->Hk;
	const size_t hs = (size_t)dk * dv, oc = (size_t)Hv * dv;
	double q[128], k[128], kv[128];

	for (int64_t i = 0; i < w->n_slots * w->F; i++)
		state[i] = w->state[i];
	for (int i = 0; i < p->n_runs; i++) {
		double *S0 = state + w->slot[i] * w->F + w->off;

		for (size_t e = 0; p->runs[i].pos0 == 0 && e < Hv * hs; e++)
			S0[e] = 0.0;
		for (int t = w->start[i]; t < w->start[i] + p->runs[i].len; t++) {
			const float *row = w->x + t * w->C, *bat = w->ba + (size_t)t * 2 * Hv;

			for (int h = 0; h < Hv; h++) {
				const int kh = h / group;
				const float *v = row + 2 * (int64_t)p->Hk * dk + (int64_t)h * dv;
				const double beta = 1.0 / (1.0 + exp(-(double)bat[h]));
				const double ab = (double)bat[Hv + h] + w->dt_bias[h];
				const double sp = ab > 20.0 ? ab : log1p(exp(ab));
				const double decay = exp(-exp((double)w->a_log[h]) * sp);
				double *S = S0 + h * hs, *o = out + (size_t)t * oc + (size_t)h * dv;
				double ql1 = 0.0;

				ref_l2(q, row + (int64_t)kh * dk, dk, 1.0 / sqrt((double)dk));
				ref_l2(k, row + ((int64_t)p->Hk + kh) * dk, dk, 1.0);
				for (int j = 0; j < dv; j++)
					kv[j] = 0.0;
				for (int a = 0; a < dk; a++)
					for (int j = 0; j < dv; j++) {
						S[a * dv + j] *= decay;
						kv[j] += S[a * dv + j] * k[a];
					}
				for (int j = 0; j < dv; j++) {
					kv[j] = (v[j] - kv[j]) * beta;
					o[j] = 0.0;
				}
				for (int a = 0; a < dk; a++)
					for (int j = 0; j < dv; j++) {
						S[a * dv + j] += k[a] * kv[j];
						o[j] += S[a * dv + j] * q[a];
					}
				/* out's error is S's error weighted by |q|. */
				for (int a = 0; a < dk; a++)
					ql1 += fabs(q[a]);
				for (int j = 0; j < dv; j++)
					out_scale[(size_t)t * oc + (size_t)h * dv + j] = rms(S, hs) * ql1;
			}
		}
	}
	for (int s = 0; s < w->n_slots; s++)
		for (int h = 0; h < Hv; h++) {
			const double *S = state + s * w->F + w->off + h * hs;
			const double m = rms(S, hs);

			for (size_t e = 0; e < hs; e++)
				state_scale[s * w->F + w->off + h * hs + e] = m;
		}
}

struct gdn_out {
	int rc;
	float *out, *state;
};

static void *gdn_build_case(struct op_run *r, const void *params, const struct op_backend *target)
{
	return gdn_build(r, params);
}

static void *gdn_run(struct op_run *r, const void *params, const void *input,
		     const struct op_backend *b)
{
	const struct gdn_params *p = params;
	const struct gdn_world *w = input;
	struct gdn_out *o = op_alloc(r, sizeof(*o));
	struct gdn_piece pc[GDN_MAX_RUNS];
	const struct gdn_dev d = gdn_upload(r, b, p, w);
	const int64_t oc = p->op == GDN_CONV ? w->C : (int64_t)p->Hv * p->dv;

	for (int i = 0; i < p->n_runs; i++)
		pc[i] = (struct gdn_piece){ i, 0, p->runs[i].len };
	o->out = op_floats(r, (size_t)(w->T * oc));
	o->rc = gdn_call(r, b, p, w, &d, pc, p->n_runs, o->out);
	o->state = op_get(r, b, &d.state);
	return o;
}

/* Column col of state row s is the op's to write. */
static bool touched(const struct gdn_params *p, const struct gdn_world *w, int s, int64_t col)
{
	bool used = false;

	for (int i = 0; i < p->n_runs; i++)
		used = used || w->slot[i] == s;
	return used && (p->op == GDN_CONV ? col < w->off : col >= w->off);
}

static void gdn_check(struct op_run *r, const void *params, const void *input, const void *got,
		      const void *cpu)
{
	const struct gdn_params *p = params;
	const struct gdn_world *w = input;
	const struct gdn_out *g = got, *c = cpu;
	const bool conv = p->op == GDN_CONV;
	const size_t n_out = (size_t)w->T * (conv ? (size_t)w->C : (size_t)p->Hv * p->dv);
	const size_t n_st = (size_t)(w->n_slots * w->F);
	float *gt = op_floats(r, n_st), *gu = op_floats(r, n_st), *want_u = op_floats(r, n_st);
	float *ct = op_floats(r, n_st), *want_cf = op_floats(r, n_st);
	double *rt = op_doubles(r, n_st), *st = op_doubles(r, n_st);
	double *ref = op_doubles(r, n_out), *scale = op_doubles(r, n_out);
	double *sref = op_doubles(r, n_st), *sscale = op_doubles(r, n_st);
	size_t nt = 0, nu = 0;

	op_check_rc(r, g->rc, 0, "%s runs", p->op == GDN_CONV ? "conv1d" : "delta_rule");
	if (g->rc)
		return;
	if (!c) {
		if (conv)
			gdn_ref_conv(p, w, ref, scale, want_cf);
		else
			gdn_ref_delta(p, w, ref, scale, sref, sscale);
	}
	for (int s = 0; s < w->n_slots; s++)
		for (int64_t col = 0; col < w->F; col++) {
			const size_t at = (size_t)(s * w->F + col);

			if (!touched(p, w, s, col)) {
				gu[nu] = g->state[at];
				want_u[nu++] = w->state[at];
				continue;
			}
			gt[nt] = g->state[at];
			ct[nt] = c ? c->state[at] : conv ? want_cf[at] : 0.0f;
			rt[nt] = c || conv ? 0.0 : sref[at];
			st[nt++] = c || conv ? 0.0 : sscale[at];
		}
	op_check_bits(r, gu, want_u, nu, "the state it must not touch left alone");
	if (c) {
		const double tol = conv ? 1e-5 : 1e-4, nmse = conv ? 1e-12 : 1e-9;

		op_check_close(r, g->out, c->out, n_out, tol, nmse, "out against the cpu");
		if (conv)
			op_check_bits(r, gt, ct, nt, "the conv state equal to the cpu's");
		else
			op_check_close(r, gt, ct, nt, tol, nmse, "the state against the cpu");
		return;
	}
	if (conv) {
		op_check_rel(r, g->out, ref, scale, n_out, 1e-6, "out against the conv in double");
		op_check_bits(r, gt, ct, nt, "the conv state: the last K - 1 inputs");
		return;
	}
	op_check_rel(r, g->out, ref, scale, n_out, p->tol, "out against the rule in double");
	op_check_rel(r, gt, rt, st, nt, p->tol, "the state after against the rule in double");
}

static const struct op_family gdn = { gdn_build_case, gdn_run, gdn_check, false };

#define RUNS(...) .runs = { __VA_ARGS__ }, \
	.n_runs = sizeof((struct gdn_run[]){ __VA_ARGS__ }) / sizeof(struct gdn_run)
/* A run of decode (or verify) rows, and a prompt segment: len rows from pos0. */
#define DEC(len, pos0) { len, pos0, false }
#define SEG(len, pos0) { len, pos0, true }
#define CONV(name, ...) \
	{ name, "conv1d", &gdn, &(const struct gdn_params){ .op = GDN_CONV, __VA_ARGS__ } }
#define DELTA(name, ...) \
	{ name, "delta_rule", &gdn, &(const struct gdn_params){ .op = GDN_DELTA, __VA_ARGS__ } }

/* Decode runs first, then segments. */
static const struct op_case cases[] = {
	CONV("conv1d decode 1 row at 0 (garbage state) K=4", .Hk = 1, .Hv = 1, .dk = 16,
	     .dv = 16, .K = 4, RUNS(DEC(1, 0))),
	CONV("conv1d decode 4 seqs: rows at 0, 1, 2, 300 K=4", .Hk = 2, .Hv = 4, .dk = 32,
	     .dv = 32, .K = 4, RUNS(DEC(1, 0), DEC(1, 1), DEC(1, 2), DEC(1, 300))),
	CONV("conv1d verify runs of 2..5 rows K=4", .Hk = 2, .Hv = 4, .dk = 64, .dv = 64,
	     .K = 4, RUNS(DEC(5, 40), DEC(2, 1), DEC(3, 0), DEC(4, 7))),
	CONV("conv1d segments 1, 7, 64, 65 rows K=4", .Hk = 1, .Hv = 2, .dk = 32, .dv = 64,
	     .K = 4, RUNS(SEG(1, 5), SEG(7, 0), SEG(64, 64), SEG(65, 2))),
	CONV("conv1d decode + verify + segment of 200 K=4 (Qwen3-Next heads)", .Hk = 2,
	     .Hv = 4, .dk = 128, .dv = 128, .K = 4,
	     RUNS(DEC(1, 9), DEC(3, 0), SEG(200, 17))),
	CONV("conv1d K=2 decode and segments", .Hk = 1, .Hv = 2, .dk = 16, .dv = 16, .K = 2,
	     RUNS(DEC(1, 0), DEC(2, 3), SEG(9, 0), SEG(1, 12))),
	DELTA("delta_rule decode 1 row at 0 (garbage state) dk=dv=16", .Hk = 1, .Hv = 1,
	      .dk = 16, .dv = 16, .K = 4, .tol = 4e-6, RUNS(DEC(1, 0))),
	DELTA("delta_rule decode 4 seqs Hv/Hk=2 dk=dv=32", .Hk = 2, .Hv = 4, .dk = 32, .dv = 32,
	      .K = 4, .tol = 4e-6, RUNS(DEC(1, 0), DEC(1, 1), DEC(1, 2), DEC(1, 300))),
	DELTA("delta_rule decode Hv/Hk=2 dk=dv=128 (Qwen3-Next)", .Hk = 2, .Hv = 4, .dk = 128,
	      .dv = 128, .K = 4, .tol = 4e-6, RUNS(DEC(1, 77), DEC(1, 3))),
	DELTA("delta_rule verify runs of 2..5 rows Hv/Hk=1 dk=64 dv=32", .Hk = 3, .Hv = 3,
	      .dk = 64, .dv = 32, .K = 4, .tol = 4e-6,
	      RUNS(DEC(5, 40), DEC(2, 1), DEC(3, 0), DEC(4, 7))),
	DELTA("delta_rule verify 5 rows Hv/Hk=4 dk=32 dv=128", .Hk = 1, .Hv = 4, .dk = 32,
	      .dv = 128, .K = 4, .tol = 4e-6, RUNS(DEC(5, 12), DEC(5, 0))),
	DELTA("delta_rule segments 1, 7 rows Hv/Hk=2 dk=dv=64", .Hk = 1, .Hv = 2, .dk = 64,
	      .dv = 64, .K = 4, .tol = 4e-6, RUNS(SEG(1, 5), SEG(7, 0))),
	DELTA("delta_rule segments 64, 65 rows Hv/Hk=2 dk=128 dv=64", .Hk = 2, .Hv = 4,
	      .dk = 128, .dv = 64, .K = 4, .tol = 1e-5, RUNS(SEG(64, 64), SEG(65, 0))),
	DELTA("delta_rule decode + verify + segment of 200 dk=dv=128 Hv/Hk=2", .Hk = 1,
	      .Hv = 2, .dk = 128, .dv = 128, .K = 4, .tol = 1e-5,
	      RUNS(DEC(1, 9), DEC(3, 0), SEG(200, 17))),
	DELTA("delta_rule segment of 200 from 0 dk=dv=16 Hv/Hk=4", .Hk = 1, .Hv = 4, .dk = 16,
	      .dv = 16, .K = 2, .tol = 1e-5, RUNS(DEC(2, 6), SEG(200, 0))),
};

OP_LIST(ops_gdn, cases);
