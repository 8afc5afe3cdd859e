/* The mixture-of-experts ops of the cpu backend: moe_route (router softmax,
 * top-k and the routing plan), moe_matmul (the experts' products over the
 * plan) and moe_combine (each token's weighted sum of its experts' rows).
 *
 * moe_route, per token t of logits [T, E]: m = the max of the row; p_e =
 * expf(l_e - m); s = the sum of p_e in expert order, in f32; the top k
 * experts by logit (not by p: equal logits are equal, and the lower expert
 * id goes first); w[t, j] = p_ids[j] / s, and with norm each of those
 * divided by their f32 sum taken in j order. The plan is a counting sort of
 * the T*k assignments by expert, stable in the assignment a = t*k + j:
 * offsets is built in place (counts, then starts, then each expert's cursor
 * at offsets[e + 1]), so no scratch is needed.
 *
 * moe_matmul checks the plan on the host before writing anything (offsets
 * monotone from 0 to T*k, order's entries below T*k) and then runs the
 * matmul kernel of cpu_matmul.c on each local expert's rows, gathered
 * through the plan (struct cpu_xrows): every row of y is the dot products
 * that matmul gives for that x row and that expert's w, bit for bit,
 * whatever other rows share its expert, the step, or the expert range of
 * the call (the number of ranks). Rows of other experts are written +0.
 *
 * moe_combine: out[t] = ((0 + w[t,0]·y[slot[t*k]]) + w[t,1]·y[..]) + ...,
 * the plain multiply-add `acc += w * y` in f32. This file is built for the
 * x86-64 baseline (no target_clones, and meson.build adds no -march), which
 * has no fused multiply-add: GCC's default -ffp-contract=fast has nothing
 * to contract there, so the product and the sum round separately. On a
 * target with FMA in its baseline (aarch64) GCC contracts it into one
 * fused multiply-add per term. Either way the order is fixed and each
 * token's result depends on its own rows only.
 *
 * Threads: route and combine split tokens over the OpenMP team; moe_matmul
 * splits (expert, w block, row block) work items as matmul does. Every
 * output element is written by one thread.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_impl.h"

/* The tensors are pairwise apart in memory. */
static bool all_apart(const struct kt_tensor *const *t, int n)
{
	for (int i = 0; i < n; i++)
		for (int j = i + 1; j < n; j++)
			if (cpu_overlap(t[i], t[j]))
				return false;
	return true;
}

/* ids and probabilities of token row l (E logits) into id[k], pw[k]. */
static void route_token(const float *l, int64_t E, int k, bool norm, int32_t *id, float *pw)
{
	float top[KT_MOE_MAX_K], m = l[0], s = 0.0f;
	int n = 0;

	for (int64_t e = 1; e < E; e++)
		m = l[e] > m ? l[e] : m;
	for (int64_t e = 0; e < E; e++)
		s += expf(l[e] - m);
	/* Insertion into the k best so far: a logit goes after every equal
	 * one, which has a lower expert id. */
	for (int64_t e = 0; e < E; e++) {
		int i;

		if (n == k && !(l[e] > top[k - 1]))
			continue;
		i = n < k ? n++ : k - 1;
		for (; i > 0 && top[i - 1] < l[e]; i--) {
			top[i] = top[i - 1];
			id[i] = id[i - 1];
		}
		top[i] = l[e];
		id[i] = (int32_t)e;
	}
	for (int j = 0; j < k; j++)
		pw[j] = expf(top[j] - m) / s;
	if (norm) {
		float sum = 0.0f;

		for (int j = 0; j < k; j++)
			sum += pw[j];
		for (int j = 0; j < k; j++)
			pw[j] /= sum;
	}
}

int cpu_moe_route(struct kt_backend *be, const struct kt_tensor *ids, const struct kt_tensor *w,
		  const struct kt_tensor *order, const struct kt_tensor *slot,
		  const struct kt_tensor *offsets, const struct kt_tensor *logits, bool norm)
{
	struct cpu_backend *cpu = cpu_of(be);
	int64_t T, E, A;
	int k;
	int32_t *id, *ord, *sl, *off;

	if (!cpu_valid(logits, KT_F32) || !cpu_valid(ids, KT_I32))
		return -EINVAL;
	T = logits->rows;
	E = logits->cols;
	k = (int)ids->cols;
	if (E < 1 || E >= INT32_MAX || ids->cols < 1 || ids->cols > KT_MOE_MAX_K || k > E ||
	    ids->rows != T)
		return -EINVAL;
	A = T * k;
	if (A > INT32_MAX || !cpu_shape(w, KT_F32, T, k) || !cpu_shape(order, KT_I32, A, 1) ||
	    !cpu_shape(slot, KT_I32, A, 1) || !cpu_shape(offsets, KT_I32, E + 1, 1))
		return -EINVAL;
	if (!all_apart((const struct kt_tensor *const[]){ ids, w, order, slot, offsets, logits },
		       6))
		return -EINVAL;
	id = ids->data;
	ord = order->data;
	sl = slot->data;
	off = offsets->data;
#pragma omp parallel for num_threads(cpu->threads) schedule(static) if (T * E > CPU_PAR_MIN)
	for (int64_t t = 0; t < T; t++)
		route_token((const float *)logits->data + t * E, E, k, norm, id + t * k,
			    (float *)w->data + t * k);
	/* Stable counting sort: off[e + 1] counts, then holds e's start, then
	 * advances past each of e's assignments to end at e + 1's start. */
	memset(off, 0, (size_t)(E + 1) * sizeof(*off));
	for (int64_t a = 0; a < A; a++)
		off[id[a] + 1]++;
	for (int64_t e = 0, start = 0; e < E; e++) {
		int32_t c = off[e + 1];

		off[e + 1] = (int32_t)start;
		start += c;
	}
	for (int64_t a = 0; a < A; a++) {
		int32_t pos = off[id[a] + 1]++;

		ord[pos] = (int32_t)a;
		sl[a] = pos;
	}
	return 0;
}

/* offsets runs from 0 to A without going down; order's entries are
 * assignments (below A) when they are read (k > 0). */
static bool plan_valid(const int32_t *off, int64_t E, const int32_t *order, int64_t A, int k)
{
	if (off[0] != 0 || off[E] != A)
		return false;
	for (int64_t e = 0; e < E; e++)
		if (off[e + 1] < off[e])
			return false;
	for (int64_t i = 0; k && i < A; i++)
		if (order[i] < 0 || order[i] >= A)
			return false;
	return true;
}

int cpu_moe_matmul(struct kt_backend *be, const struct kt_tensor *y, const struct kt_tensor *x,
		   const struct kt_tensor *w, const struct kt_tensor *order,
		   const struct kt_tensor *offsets, int k, int e0)
{
	struct cpu_backend *cpu = cpu_of(be);
	int64_t A, E, K, N, n_local, nb, n_wb, n_items = 0;
	const int32_t *off;
	struct cpu_xrows xr;
	cpu_mm_block_fn *kernel;
	size_t esize;
	float *yd;

	if (!cpu_valid(y, KT_F32) || !cpu_valid(x, KT_F32) || !w ||
	    (w->dtype != KT_F32 && w->dtype != KT_BF16) || !cpu_valid(w, w->dtype) ||
	    !cpu_valid(order, KT_I32) || !cpu_valid(offsets, KT_I32))
		return -EINVAL;
	A = y->rows;
	N = y->cols;
	K = x->cols;
	E = offsets->rows - 1;
	if (k < 0 || k > KT_MOE_MAX_K || N < 1 || E < 1 || offsets->cols != 1 ||
	    !cpu_shape(order, KT_I32, A, 1) || x->rows * (k ? k : 1) != A || w->cols != K ||
	    w->rows % N)
		return -EINVAL;
	n_local = w->rows / N;
	if (n_local < 1 || e0 < 0 || e0 + n_local > E)
		return -EINVAL;
	if (cpu_overlap(y, x) || cpu_overlap(y, w) || cpu_overlap(y, order) ||
	    cpu_overlap(y, offsets))
		return -EINVAL;
	off = offsets->data;
	if (!plan_valid(off, E, order->data, A, k))
		return -EINVAL;
	yd = y->data;
	memset(yd, 0, (size_t)off[e0] * (size_t)N * sizeof(float));
	memset(yd + off[e0 + n_local] * N, 0,
	       (size_t)(A - off[e0 + n_local]) * (size_t)N * sizeof(float));
	kernel = cpu_matmul_kernel(cpu, w->dtype, K);
	nb = cpu_matmul_kernel_wrows(kernel, K, N);
	n_wb = (N + nb - 1) / nb;
	for (int64_t e = e0; e < e0 + n_local; e++)
		n_items += n_wb * ((off[e + 1] - off[e] + CPU_MM_ROWS - 1) / CPU_MM_ROWS);
	xr = (struct cpu_xrows){ .x = x->data, .order = k ? order->data : NULL, .k = k };
	esize = kt_dtype_size(w->dtype);
	/* Items run expert by expert and, within one, walk the row blocks inside
	 * each w block, as matmul's do. */
#pragma omp parallel for num_threads(cpu->threads) schedule(dynamic, 1) \
	if (n_items > 1 && A * N * K > CPU_PAR_MIN)
	for (int64_t it = 0; it < n_items; it++) {
		int64_t e = e0, first = 0, n_xb, r0, n0, rows, len;

		for (;; e++) {
			n_xb = (off[e + 1] - off[e] + CPU_MM_ROWS - 1) / CPU_MM_ROWS;
			if (it < first + n_wb * n_xb)
				break;
			first += n_wb * n_xb;
		}
		n0 = (it - first) / n_xb * nb;
		r0 = off[e] + (it - first) % n_xb * CPU_MM_ROWS;
		rows = off[e + 1] - r0 < CPU_MM_ROWS ? off[e + 1] - r0 : CPU_MM_ROWS;
		len = N - n0 < nb ? N - n0 : nb;
		kernel(&xr, r0, rows, (const char *)w->data + (size_t)(((e - e0) * N + n0) * K) * esize,
		       len, K, yd + r0 * N + n0, N, NULL, cpu_scratch_self(cpu)->xbuf);
	}
	return 0;
}

int cpu_moe_combine(struct kt_backend *be, const struct kt_tensor *out,
		    const struct kt_tensor *y, const struct kt_tensor *w,
		    const struct kt_tensor *slot)
{
	struct cpu_backend *cpu = cpu_of(be);
	int64_t T, N, A;
	int k;
	const int32_t *sl;

	if (!cpu_valid(w, KT_F32) || !cpu_valid(y, KT_F32))
		return -EINVAL;
	T = w->rows;
	k = (int)w->cols;
	N = y->cols;
	A = T * k;
	if (w->cols < 1 || w->cols > KT_MOE_MAX_K || y->rows != A ||
	    !cpu_shape(slot, KT_I32, A, 1) || !cpu_shape(out, KT_F32, T, N))
		return -EINVAL;
	if (cpu_overlap(out, y) || cpu_overlap(out, w) || cpu_overlap(out, slot))
		return -EINVAL;
	sl = slot->data;
	for (int64_t a = 0; a < A; a++)
		if (sl[a] < 0 || sl[a] >= A)
			return -EINVAL;
#pragma omp parallel for num_threads(cpu->threads) schedule(static) if (A * N > CPU_PAR_MIN)
	for (int64_t t = 0; t < T; t++) {
		float *o = (float *)out->data + t * N;
		const float *wt = (const float *)w->data + t * k;

		memset(o, 0, (size_t)N * sizeof(float));
		for (int j = 0; j < k; j++) {
			const float *yr = (const float *)y->data + (int64_t)sl[t * k + j] * N;
			const float wj = wt[j];

#pragma omp simd
			for (int64_t n = 0; n < N; n++)
				o[n] += wj * yr[n];
		}
	}
	return 0;
}
