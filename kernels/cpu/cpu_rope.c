/* Rotary position embedding in place, rotate-half pairing (GPT-NeoX, Hugging
 * Face) over the first R = 2 * inv_freq.cols dims of each head: x[i] and
 * x[i + R/2] are rotated by the angle (float)pos * inv_freq[i], the product
 * taken in f32 as Hugging Face does, then cosf/sinf of that f32 angle. The
 * other D - R dims (partial rotary, R < D) pass unchanged; R == D is the
 * whole head.
 *
 * With norm_w, each head is first normalised exactly as cpu_rmsnorm does a
 * row (sum of squares in double, then w * (x * 1/sqrtf(var + eps))), over all D
 * dims whatever R, so the fused op equals rmsnorm followed by rope bit for
 * bit.
 *
 * Layout: x [T, n_heads * D] f32, pos [T, 1] i32, inv_freq [1, R/2] f32,
 * norm_w NULL or [1, D] f32.
 * The cos/sin of one token live in the worker's scratch and serve all heads.
 *
 * Threads: tokens are split over the OpenMP team.
 *
 * rope_store is the two ropes and kv_store one after another, after the
 * rows of a stacked qkv are copied apart.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_impl.h"

static void norm_head(float *x, const float *w, int D, float eps)
{
	double ss = 0.0;

#pragma omp simd reduction(+ : ss)
	for (int i = 0; i < D; i++)
		ss += (double)x[i] * x[i];
	float inv = 1.0f / sqrtf((float)(ss / (double)D) + eps);
	for (int i = 0; i < D; i++)
		x[i] = w[i] * (x[i] * inv);
}

/* half = R / 2: the pairs (x[i], x[i + half]) for i < half rotate. */
static void rope_token(float *x, int32_t pos, const float *inv_freq, int half, int n_heads,
		       int D, const float *norm_w, float eps, float *cs, float *sn)
{

	for (int i = 0; i < half; i++) {
		float angle = (float)pos * inv_freq[i];

		cs[i] = cosf(angle);
		sn[i] = sinf(angle);
	}
	for (int h = 0; h < n_heads; h++) {
		float *a = x + (int64_t)h * D, *b = a + half;

		if (norm_w)
			norm_head(a, norm_w, D, eps);
		for (int i = 0; i < half; i++) {
			float x0 = a[i], x1 = b[i];

			a[i] = x0 * cs[i] - x1 * sn[i];
			b[i] = x1 * cs[i] + x0 * sn[i];
		}
	}
}

int cpu_rope(struct kt_backend *be, const struct kt_tensor *x, const struct kt_tensor *pos,
	     const struct kt_tensor *inv_freq, int n_heads, int head_dim,
	     const struct kt_tensor *norm_w, float eps)
{
	struct cpu_backend *cpu = cpu_of(be);
	int64_t T;
	const int32_t *p;

	if (n_heads <= 0 || head_dim <= 0 || head_dim % 2 || head_dim > cpu->max_head_dim)
		return -EINVAL;
	if (!cpu_valid(x, KT_F32))
		return -EINVAL;
	T = x->rows;
	if (x->cols != (int64_t)n_heads * head_dim || !cpu_shape(pos, KT_I32, T, 1) ||
	    !cpu_valid(inv_freq, KT_F32) || inv_freq->rows != 1 || inv_freq->cols < 1 ||
	    inv_freq->cols > head_dim / 2)
		return -EINVAL;
	/* The norm refuses what cpu_rmsnorm refuses (and cuda's rope does). */
	if (norm_w && (!cpu_shape(norm_w, KT_F32, 1, head_dim) || !(eps >= 0.0f)))
		return -EINVAL;
	p = pos->data;
	for (int64_t t = 0; t < T; t++)
		if (p[t] < 0)
			return -EINVAL;
#pragma omp parallel for num_threads(cpu->threads) schedule(static) if (T * x->cols > CPU_PAR_MIN)
	for (int64_t t = 0; t < T; t++) {
		struct cpu_scratch *s = cpu_scratch_self(cpu);

		rope_token((float *)x->data + t * x->cols, p[t], inv_freq->data,
			   (int)inv_freq->cols, n_heads, head_dim, norm_w ? norm_w->data : NULL,
			   eps, s->cos, s->sin);
	}
	return 0;
}

/* rope_store: with qkv, each row's q, k and v copied out of it first; then
 * the three ops, which is what the contract asks of every backend. */
int cpu_rope_store(struct kt_backend *be, const struct kt_rope_store_args *a,
		   const struct kt_batch *b)
{
	int rc;

	if (a->qkv) {
		const int64_t T = a->q->rows, nq = a->q->cols, nk = a->k->cols;

		if (!cpu_valid(a->qkv, KT_F32) || !cpu_valid(a->q, KT_F32) ||
		    !cpu_valid(a->k, KT_F32) || !cpu_valid(a->v, KT_F32))
			return -EINVAL;
		for (int64_t t = 0; t < T; t++) {
			const float *row = (const float *)a->qkv->data + t * a->qkv->cols;

			memcpy((float *)a->q->data + t * nq, row, (size_t)nq * sizeof(float));
			memcpy((float *)a->k->data + t * nk, row + nq, (size_t)nk * sizeof(float));
			memcpy((float *)a->v->data + t * nk, row + nq + nk,
			       (size_t)nk * sizeof(float));
		}
	}
	if ((rc = cpu_rope(be, a->q, &b->pos, a->inv_freq, a->n_heads, a->head_dim, a->q_norm,
			   a->eps)) ||
	    (rc = cpu_rope(be, a->k, &b->pos, a->inv_freq, a->n_kv_heads, a->head_dim, a->k_norm,
			   a->eps)))
		return rc;
	return cpu_kv_store(be, a->kcache, a->vcache, a->k, a->v, b);
}
