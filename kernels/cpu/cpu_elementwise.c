/* Row copies and elementwise ops: embed, gather_rows, swiglu, add,
 * sigmoid_mul.
 *
 * Layout: row-major f32 matrices (embed's table may be bf16); ids and idx are [n, 1] i32 and are checked
 * against the table's rows before anything is written. swiglu may write over
 * gate or up, add may take x == y, sigmoid_mul may write over x (and over a
 * gate g of x's shape); other overlaps are refused. sigmoid_mul's gate is
 * [R, D] (one per element) or [R, 1] (one per row), sigmoid(g) = 1 / (1 +
 * expf(-g)) as torch computes it in f32. swiglu's out may be bf16 (apart
 * from its inputs), each value rounded to nearest even as it is stored.
 *
 * Threads: rows (copies) or elements (arithmetic) are split over the OpenMP
 * team once the op is large enough to pay for it.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "common/half.h"
#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/cpu_simd.h"

/* out[i, :] = src[idx[i], :] for n rows of D floats; idx already checked. */
static void copy_rows(const struct cpu_backend *cpu, float *out, const float *src,
		      const int32_t *idx, int64_t n, int64_t D)
{
#pragma omp parallel for num_threads(cpu->threads) schedule(static) if (n * D > CPU_PAR_MIN)
	for (int64_t i = 0; i < n; i++)
		memcpy(out + i * D, src + (int64_t)idx[i] * D, (size_t)D * sizeof(float));
}

/* out[i, :] = table[idx[i], :] widened, for n rows of D bf16; idx already checked. */
static void widen_rows(const struct cpu_backend *cpu, float *out, const uint16_t *table,
		       const int32_t *idx, int64_t n, int64_t D)
{
#pragma omp parallel for num_threads(cpu->threads) schedule(static) if (n * D > CPU_PAR_MIN)
	for (int64_t i = 0; i < n; i++)
		for (int64_t j = 0; j < D; j++)
			out[i * D + j] = half_bits_to_float(half_bf16_bits(table[idx[i] * D + j]));
}

static bool indices_below(const int32_t *idx, int64_t n, int64_t limit)
{
	for (int64_t i = 0; i < n; i++)
		if (idx[i] < 0 || idx[i] >= limit)
			return false;
	return true;
}

int cpu_embed(struct kt_backend *be, const struct kt_tensor *out, const struct kt_tensor *table,
	      const struct kt_tensor *ids)
{
	if (!table || (table->dtype != KT_F32 && table->dtype != KT_BF16) ||
	    !cpu_valid(table, table->dtype) || !cpu_valid(ids, KT_I32) || ids->cols != 1)
		return -EINVAL;
	if (!cpu_shape(out, KT_F32, ids->rows, table->cols) || cpu_overlap(out, table) ||
	    cpu_overlap(out, ids))
		return -EINVAL;
	if (!indices_below(ids->data, ids->rows, table->rows))
		return -EINVAL;
	if (table->dtype == KT_BF16)
		widen_rows(cpu_of(be), out->data, table->data, ids->data, ids->rows, table->cols);
	else
		copy_rows(cpu_of(be), out->data, table->data, ids->data, ids->rows, table->cols);
	return 0;
}

int cpu_gather_rows(struct kt_backend *be, const struct kt_tensor *out,
		    const struct kt_tensor *x, const struct kt_tensor *idx)
{
	if (!cpu_valid(x, KT_F32) || !cpu_valid(idx, KT_I32) || idx->cols != 1)
		return -EINVAL;
	if (!cpu_shape(out, KT_F32, idx->rows, x->cols) || cpu_overlap(out, x) ||
	    cpu_overlap(out, idx))
		return -EINVAL;
	if (!indices_below(idx->data, idx->rows, x->rows))
		return -EINVAL;
	copy_rows(cpu_of(be), out->data, x->data, idx->data, idx->rows, x->cols);
	return 0;
}

/* a and b are the same memory or do not touch. */
static bool same_or_apart(const struct kt_tensor *a, const struct kt_tensor *b)
{
	return a->data == b->data || !cpu_overlap(a, b);
}

/* out[i] = silu(g[i]) * u[i] for n values, into o (f32) or o16 (bf16,
 * rounded to nearest even). */
static void swiglu_run(float *o, uint16_t *o16, const float *g, const float *u, int64_t n)
{
	for (int64_t i = 0; i < n; i++) {
		const float v = g[i] / (1.0f + expf(-g[i])) * u[i];

		if (o16)
			o16[i] = narrow1(v);
		else
			o[i] = v;
	}
}

int cpu_swiglu(struct kt_backend *be, const struct kt_tensor *out, const struct kt_tensor *gate,
	       const struct kt_tensor *up)
{
	struct cpu_backend *cpu = cpu_of(be);
	const bool out16 = out && out->dtype == KT_BF16;
	const enum kt_dtype odt = out16 ? KT_BF16 : KT_F32;
	float *o;
	uint16_t *o16;
	const float *g, *u;
	int64_t n;

	if (!up) {
		if (!cpu_valid(gate, KT_F32) || gate->cols % 2 ||
		    !cpu_shape(out, odt, gate->rows, gate->cols / 2) || cpu_overlap(out, gate))
			return -EINVAL;
		const int64_t I = out->cols, R = out->rows;
		o = out16 ? NULL : out->data;
		o16 = out16 ? out->data : NULL;
		g = gate->data;
#pragma omp parallel for num_threads(cpu->threads) schedule(static) if (R * I > CPU_PAR_MIN)
		for (int64_t r = 0; r < R; r++)
			swiglu_run(o ? o + r * I : NULL, o16 ? o16 + r * I : NULL, g + r * 2 * I,
				   g + r * 2 * I + I, I);
		return 0;
	}
	if (!cpu_valid(gate, KT_F32) || !cpu_shape(up, KT_F32, gate->rows, gate->cols) ||
	    !cpu_shape(out, odt, gate->rows, gate->cols))
		return -EINVAL;
	if (!same_or_apart(out, gate) || !same_or_apart(out, up))
		return -EINVAL;
	if (out16 && (cpu_overlap(out, gate) || cpu_overlap(out, up)))
		return -EINVAL;
	o = out16 ? NULL : out->data;
	o16 = out16 ? out->data : NULL;
	g = gate->data;
	u = up->data;
	n = gate->rows * gate->cols;
	const int64_t chunk = 4096, n_chunks = (n + chunk - 1) / chunk;
#pragma omp parallel for num_threads(cpu->threads) schedule(static) if (n > CPU_PAR_MIN)
	for (int64_t c = 0; c < n_chunks; c++) {
		const int64_t i = c * chunk, len = n - i < chunk ? n - i : chunk;

		swiglu_run(o ? o + i : NULL, o16 ? o16 + i : NULL, g + i, u + i, len);
	}
	return 0;
}

int cpu_add(struct kt_backend *be, const struct kt_tensor *y, const struct kt_tensor *x)
{
	struct cpu_backend *cpu = cpu_of(be);
	float *yd;
	const float *xd;
	int64_t n;

	if (!cpu_valid(y, KT_F32) || !cpu_shape(x, KT_F32, y->rows, y->cols) ||
	    !same_or_apart(y, x))
		return -EINVAL;
	yd = y->data;
	xd = x->data;
	n = y->rows * y->cols;
#pragma omp parallel for simd num_threads(cpu->threads) schedule(static) if (n > CPU_PAR_MIN)
	for (int64_t i = 0; i < n; i++)
		yd[i] += xd[i];
	return 0;
}

int cpu_sigmoid_mul(struct kt_backend *be, const struct kt_tensor *out, const struct kt_tensor *x,
		    const struct kt_tensor *g)
{
	struct cpu_backend *cpu = cpu_of(be);
	int64_t R, D;
	float *o;
	const float *xd, *gd;

	if (!cpu_valid(x, KT_F32) || !cpu_valid(g, KT_F32))
		return -EINVAL;
	R = x->rows;
	D = x->cols;
	if (!cpu_shape(out, KT_F32, R, D) || g->rows != R || (g->cols != D && g->cols != 1))
		return -EINVAL;
	/* A per-row gate is read after its row's first output is written. */
	if (!same_or_apart(out, x) ||
	    (g->cols == D ? !same_or_apart(out, g) : cpu_overlap(out, g)))
		return -EINVAL;
	o = out->data;
	xd = x->data;
	gd = g->data;
	if (g->cols == D) {
		const int64_t n = R * D;

#pragma omp parallel for num_threads(cpu->threads) schedule(static) if (n > CPU_PAR_MIN)
		for (int64_t i = 0; i < n; i++)
			o[i] = xd[i] * (1.0f / (1.0f + expf(-gd[i])));
		return 0;
	}
#pragma omp parallel for num_threads(cpu->threads) schedule(static) if (R * D > CPU_PAR_MIN)
	for (int64_t r = 0; r < R; r++) {
		const float s = 1.0f / (1.0f + expf(-gd[r]));

		for (int64_t i = 0; i < D; i++)
			o[r * D + i] = xd[r * D + i] * s;
	}
	return 0;
}
