/* RMSNorm with the fused residual add, as Hugging Face computes it in f32:
 * x += residual (when given); var = mean(x²); out = w * (x * 1/sqrt(var + eps)).
 * The gated norm of the Gated DeltaNet heads (rmsnorm_gated) is the same
 * norm times silu(z): out = (w * (x * 1/sqrt(var + eps))) * silu(z), with
 * silu(z) = z / (1 + expf(-z)) as swiglu computes it (Hugging Face's
 * Qwen3NextRMSNormGated: the weighted norm, then the gate).
 *
 * Layout: out, x, residual, z [R, D] f32, w [1, D] f32. Each row is read
 * whole (pass 1: add and sum of squares, in double) before it is written
 * (pass 2), so out may be x or residual. rmsnorm's out may instead be bf16
 * (apart from x and residual): each value rounded to nearest even as it is
 * stored, the same bits as rounding the f32 out afterwards.
 *
 * Threads: rows are split over the OpenMP team.
 */
#include <errno.h>
#include <math.h>

#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/cpu_simd.h"

/* out = w * (x * inv), times silu(z) when z is given; into out16 (bf16)
 * instead of out when out16 is given. */
static void norm_row(float *out, uint16_t *out16, float *x, const float *res, const float *z,
		     const float *w, int64_t D, float eps)
{
	double ss = 0.0;
	float var, inv;

	if (res) {
#pragma omp simd reduction(+ : ss)
		for (int64_t i = 0; i < D; i++) {
			float v = x[i] + res[i];

			x[i] = v;
			ss += (double)v * v;
		}
	} else {
#pragma omp simd reduction(+ : ss)
		for (int64_t i = 0; i < D; i++)
			ss += (double)x[i] * x[i];
	}
	var = (float)(ss / (double)D);
	inv = 1.0f / sqrtf(var + eps);
	if (z) {
		for (int64_t i = 0; i < D; i++)
			out[i] = w[i] * (x[i] * inv) * (z[i] / (1.0f + expf(-z[i])));
		return;
	}
	if (out16) {
		for (int64_t i = 0; i < D; i++)
			out16[i] = narrow1(w[i] * (x[i] * inv));
		return;
	}
	for (int64_t i = 0; i < D; i++)
		out[i] = w[i] * (x[i] * inv);
}

/* a and b are the same tensor memory or do not touch. */
static bool same_or_apart(const struct kt_tensor *a, const struct kt_tensor *b)
{
	return a->data == b->data || !cpu_overlap(a, b);
}

int cpu_rmsnorm(struct kt_backend *be, const struct kt_tensor *out, const struct kt_tensor *x,
		const struct kt_tensor *residual, const struct kt_tensor *w, float eps)
{
	struct cpu_backend *cpu = cpu_of(be);
	int64_t R, D;

	if (!cpu_valid(x, KT_F32))
		return -EINVAL;
	R = x->rows;
	D = x->cols;
	const bool out16 = out && out->dtype == KT_BF16;
	if (!cpu_shape(out, out16 ? KT_BF16 : KT_F32, R, D) || !cpu_shape(w, KT_F32, 1, D))
		return -EINVAL;
	if (residual && !cpu_shape(residual, KT_F32, R, D))
		return -EINVAL;
	if (!same_or_apart(out, x) || (residual && (!same_or_apart(out, residual) ||
						    !same_or_apart(x, residual))))
		return -EINVAL;
	if (out16 && (cpu_overlap(out, x) || (residual && cpu_overlap(out, residual))))
		return -EINVAL;
	if (!(eps >= 0.0f))
		return -EINVAL;
	if (!D)
		return 0;
#pragma omp parallel for num_threads(cpu->threads) schedule(static) if (R * D > CPU_PAR_MIN)
	for (int64_t r = 0; r < R; r++)
		norm_row(out16 ? NULL : (float *)out->data + r * D,
			 out16 ? (uint16_t *)out->data + r * D : NULL, (float *)x->data + r * D,
			 residual ? (const float *)residual->data + r * D : NULL, NULL, w->data, D,
			 eps);
	return 0;
}

int cpu_rmsnorm_gated(struct kt_backend *be, const struct kt_tensor *out,
		      const struct kt_tensor *x, const struct kt_tensor *z,
		      const struct kt_tensor *w, float eps)
{
	struct cpu_backend *cpu = cpu_of(be);
	int64_t R, D;

	if (!cpu_valid(x, KT_F32))
		return -EINVAL;
	R = x->rows;
	D = x->cols;
	if (!cpu_shape(out, KT_F32, R, D) || !cpu_shape(z, KT_F32, R, D) ||
	    !cpu_shape(w, KT_F32, 1, D))
		return -EINVAL;
	/* z is read element by element as out is written: it must not be out. */
	if (!same_or_apart(out, x) || cpu_overlap(out, z) || !(eps >= 0.0f))
		return -EINVAL;
	if (!D)
		return 0;
#pragma omp parallel for num_threads(cpu->threads) schedule(static) if (R * D > CPU_PAR_MIN)
	for (int64_t r = 0; r < R; r++)
		norm_row((float *)out->data + r * D, NULL, (float *)x->data + r * D, NULL,
			 (const float *)z->data + r * D, w->data, D, eps);
	return 0;
}
