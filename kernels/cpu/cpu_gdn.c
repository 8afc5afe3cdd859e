/* The Gated DeltaNet ops of the cpu backend (DESIGN §11): conv1d, the causal
 * depthwise convolution with its carried inputs, and delta_rule, the gated
 * delta rule with its carried matrices. Contracts in kernels/backend.h.
 *
 * Runs: a step's rows are cut into runs, the maximal stretches of rows with
 * one state row (slot). A run is one sequence's rows of the step, at
 * consecutive positions p0, p0 + 1, ...; no two runs may share a slot. Both
 * ops check that on the host before writing anything.
 *
 * conv1d: x, out [T, C] f32; w [C, K] f32 or bf16 (cpu_weight's); state row s holds
 * at float j * C + c the input of channel c at position p0 - K + 1 + j
 * (j < K - 1, oldest first) before the run. Row t at position p:
 *   acc = 0; acc += w[c, j] · in(p - K + 1 + j, c) for j = 0 .. K-1 in order;
 *   out[t, c] = acc / (1 + expf(-acc))   (silu, as swiglu computes it)
 * with in(q, c) from x for q >= p0, from the state for 0 <= q < p0 and 0
 * for q < 0 (so a run from position 0 never reads its state row). Then the
 * state takes the inputs of positions last - K + 2 .. last, in place: slot j
 * reads slot j + n (n rows in the run), so ascending j reads before it
 * overwrites.
 *
 * delta_rule: qkv [T, 2·Hk·dk + Hv·dv] (q heads, k heads, v heads), ba
 * [T, 2·Hv] (b, then a), out [T, Hv·dv]; head h's matrix S [dk, dv]
 * (row-major: S[i][j] at i·dv + j) sits at float off + h·dk·dv of the state
 * row. Per row t of a run, in order, for value head h (q, k head
 * kh = h / (Hv / Hk)), all in f32:
 *   q[i] = (x[i] · r) · (1 / sqrtf(dk)), k[i] = x[i] · r,
 *       r = 1 / sqrtf(sum x² + 1e-6), the sum in cpu_simd.h's lane order;
 *   beta = 1 / (1 + expf(-b)); sp = a + dt_bias, or log1pf(expf(.)) at or
 *       below 20; decay = expf(-(expf(a_log) · sp));
 *   S[i][j] *= decay and kv[j] += S[i][j] · k[i]      (i = 0 .. dk-1 in order)
 *   kv[j] = (v[j] - kv[j]) · beta
 *   S[i][j] += k[i] · kv[j] and o[j] += S[i][j] · q[i] (i in order, o from 0)
 * the transformers recurrence (torch_recurrent_gated_delta_rule) written
 * as two passes over S. A run from position 0 zeroes its matrices first.
 *
 * Invariance (DESIGN §4.1): every value depends on its own row, the
 * sequence's earlier rows and the state only, through the same operations
 * in the same order, so a sequence's outputs and final state are bitwise
 * the same whether its rows come in one call or several, and whatever
 * shares the call. Columns j of S evolve independently (kv[j], the update
 * and o[j] read column j only), which is what lets a head's columns be
 * split over threads: blocks are multiples of 8 columns, so column j is a
 * vector lane or a tail element by j alone.
 *
 * Threads: work items are (run, channel block) for conv1d and (run, value
 * head, column block) for delta_rule, dynamically scheduled (runs differ
 * in length); an item is named by its run's first row, and items of other
 * rows do nothing. Each item's rows run in order on one thread.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "common/half.h"
#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/cpu_simd.h"

/* Channels of one conv1d work item. */
#define GDN_CONV_CHANNELS 256

/* Row t starts a run of slot sl. */
static inline bool run_start(const int32_t *sl, int64_t t)
{
	return t == 0 || sl[t] != sl[t - 1];
}

/* Rows in the run that starts at t0. */
static int64_t run_len(const int32_t *sl, int64_t t0, int64_t T)
{
	int64_t t = t0 + 1;

	while (t < T && sl[t] == sl[t0])
		t++;
	return t - t0;
}

/* The step b and slot [T, 1] cut T rows into runs over a state of n_slots
 * rows: slots in range, positions >= 0 and consecutive within a run, no
 * slot in two runs (compared with every earlier row: O(T · runs), runs
 * being the step's sequences). *runs receives their number. */
static int check_runs(const struct kt_batch *b, const struct kt_tensor *slot, int64_t T,
		      int64_t n_slots, int64_t *runs)
{
	const int32_t *pos, *sl;

	if (!b || b->n_tokens != T || !cpu_shape(&b->pos, KT_I32, T, 1) ||
	    !cpu_shape(slot, KT_I32, T, 1))
		return -EINVAL;
	pos = b->pos.data;
	sl = slot->data;
	*runs = 0;
	for (int64_t t = 0; t < T; t++) {
		if (sl[t] < 0 || sl[t] >= n_slots || pos[t] < 0)
			return -EINVAL;
		if (!run_start(sl, t)) {
			if (pos[t - 1] == INT32_MAX || pos[t] != pos[t - 1] + 1)
				return -EINVAL;
			continue;
		}
		for (int64_t u = 0; u < t; u++)
			if (sl[u] == sl[t])
				return -EINVAL;
		++*runs;
	}
	return 0;
}

/* The written tensors t[0], t[1] (out, state) touch no other of the n:
 * inputs may share memory among themselves, they are only read. */
static bool writes_apart(const struct kt_tensor *const *t, int n)
{
	for (int i = 0; i < 2; i++)
		for (int j = i + 1; j < n; j++)
			if (cpu_overlap(t[i], t[j]))
				return false;
	return true;
}

/* The input of channel c at position q for a run of rows t0.. from p0. */
static inline float conv_in(const float *x, const float *st, int64_t C, int K, int64_t t0,
			    int64_t p0, int64_t q, int64_t c)
{
	if (q >= p0)
		return x[(t0 + q - p0) * C + c];
	if (q >= 0)
		return st[(q - p0 + K - 1) * C + c];
	return 0.0f;
}

/* conv1d of the n rows from t0 (positions p0..) over channels [c0, c1),
 * then their state: st is the run's state row. */
static void conv_run(float *out, const float *x, const void *w, bool w_bf16, float *st,
		     int64_t C, int K, int64_t t0, int64_t n, int64_t p0, int64_t c0, int64_t c1)
{
	const int64_t last = p0 + n - 1;

	for (int64_t i = 0; i < n; i++) {
		const int64_t first = p0 + i - K + 1;

		for (int64_t c = c0; c < c1; c++) {
			float acc = 0.0f;

			for (int j = 0; j < K; j++) {
				float wj = w_bf16 ? half_bits_to_float(half_bf16_bits(
							    ((const uint16_t *)w)[c * K + j]))
						  : ((const float *)w)[c * K + j];

				acc += wj * conv_in(x, st, C, K, t0, p0, first + j, c);
			}
			out[(t0 + i) * C + c] = acc / (1.0f + expf(-acc));
		}
	}
	for (int j = 0; j < K - 1; j++)
		for (int64_t c = c0; c < c1; c++)
			st[j * C + c] = conv_in(x, st, C, K, t0, p0, last - K + 2 + j, c);
}

int cpu_conv1d(struct kt_backend *be, const struct kt_tensor *out, const struct kt_tensor *x,
	       const struct kt_tensor *w, const struct kt_tensor *state,
	       const struct kt_tensor *slot, const struct kt_batch *b)
{
	struct cpu_backend *cpu = cpu_of(be);
	int64_t T, C, K, runs, n_cb;
	int rc;

	if (!cpu_valid(x, KT_F32) || !w || (w->dtype != KT_F32 && w->dtype != KT_BF16) ||
	    !cpu_valid(w, w->dtype) || !cpu_valid(state, KT_F32))
		return -EINVAL;
	T = x->rows;
	C = x->cols;
	K = w->cols;
	if (!cpu_shape(out, KT_F32, T, C) || w->rows != C || K < 1 || K > INT32_MAX ||
	    state->cols < (K - 1) * C)
		return -EINVAL;
	if ((rc = check_runs(b, slot, T, state->rows, &runs)))
		return rc;
	if (!writes_apart((const struct kt_tensor *const[]){ out, state, x, w, slot, &b->pos }, 6))
		return -EINVAL;
	if (!T || !C)
		return 0;
	n_cb = (C + GDN_CONV_CHANNELS - 1) / GDN_CONV_CHANNELS;
	const int32_t *sl = slot->data, *pos = b->pos.data;
#pragma omp parallel for num_threads(cpu->threads) schedule(dynamic, 1) \
	if (T * C * K > CPU_PAR_MIN)
	for (int64_t it = 0; it < T * n_cb; it++) {
		const int64_t t0 = it / n_cb, c0 = it % n_cb * GDN_CONV_CHANNELS;

		if (!run_start(sl, t0))
			continue;
		conv_run(out->data, x->data, w->data, w->dtype == KT_BF16,
			 (float *)state->data + sl[t0] * state->cols,
			 C, (int)K, t0, run_len(sl, t0, T), pos[t0], c0,
			 C - c0 < GDN_CONV_CHANNELS ? C : c0 + GDN_CONV_CHANNELS);
	}
	return 0;
}

/* One delta_rule call's shapes and tensors. */
struct delta_args {
	const float *qkv, *ba, *a_log, *dt_bias;
	float *out, *state;
	int64_t qkv_cols, F, off;
	int Hk, Hv, dk, dv, group;
};

/* The sum of x² over n floats: lanes l, l + 8, ... then hsum8, then the tail. */
CPU_INLINE float sum_squares(const float *x, int n)
{
	v8f acc = { 0 };
	int i;
	float s;

	for (i = 0; i + 8 <= n; i += 8) {
		v8f v = load8(x + i);

		acc += v * v;
	}
	s = hsum8(acc);
	for (; i < n; i++)
		s += x[i] * x[i];
	return s;
}

/* dst = (x · r) · scale with r = 1 / sqrtf(sum x² + 1e-6) over n floats. */
CPU_INLINE void l2_scaled(float *dst, const float *x, int n, float scale)
{
	const float r = 1.0f / sqrtf(sum_squares(x, n) + 1e-6f);

	for (int i = 0; i < n; i++)
		dst[i] = x[i] * r * scale;
}

/* s[0..nj) = s · decay and kv += s · ki; nj is dv (a tail past its last
 * multiple of 8 goes one column at a time) or a multiple of 8. */
CPU_INLINE void decay_read(float *s, float *kv, int nj, float decay, float ki)
{
	int j;

	for (j = 0; j + 8 <= nj; j += 8) {
		v8f sv = load8(s + j) * decay;

		store8(s + j, sv);
		store8(kv + j, load8(kv + j) + sv * ki);
	}
	for (; j < nj; j++) {
		s[j] *= decay;
		kv[j] += s[j] * ki;
	}
}

/* s += ki · delta and o += s · qi over nj columns, split as decay_read's. */
CPU_INLINE void update_read(float *s, float *o, const float *delta, int nj, float ki, float qi)
{
	int j;

	for (j = 0; j + 8 <= nj; j += 8) {
		v8f sv = load8(s + j) + ki * load8(delta + j);

		store8(s + j, sv);
		store8(o + j, load8(o + j) + sv * qi);
	}
	for (; j < nj; j++) {
		s[j] += ki * delta[j];
		o[j] += s[j] * qi;
	}
}

/* The n rows from t0 (first at position p0) of value head h, columns
 * [j0, j0 + nj), on the state row st. scratch: 2 · dk + nj floats. */
CPU_CLONES static void delta_run(const struct delta_args *a, float *st, int64_t t0, int64_t n,
				 int32_t p0, int h, int j0, int nj, float *scratch)
{
	const int dk = a->dk, dv = a->dv, kh = h / a->group;
	const float A = expf(a->a_log[h]), bias = a->dt_bias[h];
	const float qscale = 1.0f / sqrtf((float)dk);
	float *S = st + a->off + (int64_t)h * dk * dv + j0;
	float *q = scratch, *k = q + dk, *kv = k + dk;

	if (p0 == 0)
		for (int i = 0; i < dk; i++)
			memset(S + (int64_t)i * dv, 0, (size_t)nj * sizeof(float));
	for (int64_t t = t0; t < t0 + n; t++) {
		const float *row = a->qkv + t * a->qkv_cols, *bat = a->ba + t * 2 * a->Hv;
		const float *v = row + 2 * (int64_t)a->Hk * dk + (int64_t)h * dv + j0;
		float *o = a->out + t * (int64_t)a->Hv * dv + (int64_t)h * dv + j0;
		const float beta = 1.0f / (1.0f + expf(-bat[h]));
		const float ab = bat[a->Hv + h] + bias;
		const float decay = expf(-(A * (ab > 20.0f ? ab : log1pf(expf(ab)))));

		l2_scaled(q, row + (int64_t)kh * dk, dk, qscale);
		l2_scaled(k, row + ((int64_t)a->Hk + kh) * dk, dk, 1.0f);
		memset(kv, 0, (size_t)nj * sizeof(float));
		for (int i = 0; i < dk; i++)
			decay_read(S + (int64_t)i * dv, kv, nj, decay, k[i]);
		for (int j = 0; j < nj; j++)
			kv[j] = (v[j] - kv[j]) * beta;
		memset(o, 0, (size_t)nj * sizeof(float));
		for (int i = 0; i < dk; i++)
			update_read(S + (int64_t)i * dv, o, kv, nj, k[i], q[i]);
	}
}

int cpu_delta_rule(struct kt_backend *be, const struct kt_tensor *out,
		   const struct kt_tensor *qkv, const struct kt_tensor *ba,
		   const struct kt_tensor *a_log, const struct kt_tensor *dt_bias,
		   const struct kt_tensor *state, int64_t off, const struct kt_tensor *slot,
		   const struct kt_batch *b, int n_k_heads, int n_v_heads, int k_dim, int v_dim)
{
	struct cpu_backend *cpu = cpu_of(be);
	struct delta_args a = { .Hk = n_k_heads, .Hv = n_v_heads, .dk = k_dim, .dv = v_dim };
	int64_t T, runs, cb, n_cb;
	int rc;

	if (a.Hk < 1 || a.Hv < 1 || a.Hv % a.Hk || a.dk < 1 || a.dv < 1 ||
	    a.dk > cpu->max_head_dim || a.dv > cpu->max_head_dim)
		return -EINVAL;
	if (!cpu_valid(qkv, KT_F32) || !cpu_valid(state, KT_F32))
		return -EINVAL;
	T = qkv->rows;
	a.qkv_cols = 2 * (int64_t)a.Hk * a.dk + (int64_t)a.Hv * a.dv;
	a.F = state->cols;
	a.off = off;
	a.group = a.Hv / a.Hk;
	if (qkv->cols != a.qkv_cols || !cpu_shape(ba, KT_F32, T, 2 * (int64_t)a.Hv) ||
	    !cpu_shape(out, KT_F32, T, (int64_t)a.Hv * a.dv) ||
	    !cpu_shape(a_log, KT_F32, 1, a.Hv) || !cpu_shape(dt_bias, KT_F32, 1, a.Hv))
		return -EINVAL;
	if (off < 0 || off > a.F || a.F - off < (int64_t)a.Hv * a.dk * a.dv)
		return -EINVAL;
	if ((rc = check_runs(b, slot, T, state->rows, &runs)))
		return rc;
	if (!writes_apart((const struct kt_tensor *const[]){ out, state, qkv, ba, a_log, dt_bias,
							     slot, &b->pos }, 8))
		return -EINVAL;
	if (!T)
		return 0;
	a.qkv = qkv->data;
	a.ba = ba->data;
	a.a_log = a_log->data;
	a.dt_bias = dt_bias->data;
	a.out = out->data;
	a.state = state->data;
	/* Column blocks (multiples of 8) only when there are fewer (run, head)
	 * items than threads: a lone decode row of a few heads. */
	cb = a.dv;
	while (cb % 16 == 0 && runs * a.Hv * (a.dv / cb) < cpu->threads)
		cb /= 2;
	n_cb = a.dv / cb;
	const int32_t *sl = slot->data, *pos = b->pos.data;
	const int64_t per_row = a.Hv * n_cb;
#pragma omp parallel for num_threads(cpu->threads) schedule(dynamic, 1) \
	if (T * a.Hv * a.dk * a.dv > CPU_PAR_MIN)
	for (int64_t it = 0; it < T * per_row; it++) {
		const int64_t t0 = it / per_row;
		const int h = (int)(it % per_row / n_cb), j0 = (int)(it % n_cb * cb);

		if (!run_start(sl, t0))
			continue;
		delta_run(&a, a.state + sl[t0] * a.F, t0, run_len(sl, t0, T), pos[t0], h, j0,
			  (int)cb, cpu_scratch_self(cpu)->gdn);
	}
	return 0;
}
