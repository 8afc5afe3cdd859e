/* y = x · wᵀ (+ bias), batch-invariant.
 *
 * Layout: x [T, K] and w [N, K] row-major (the Hugging Face Linear layout),
 * y [T, N], bias [1, N]; all f32 but w, which may be bf16 (and x, widened
 * first: matmul_widened_x). A bf16 w is
 * widened exactly to f32 in registers (portable, or AVX2 + FMA), so that
 * both give the products of f32 precision, or, with cpu_precision bf16 on a
 * CPU with AMX or AVX512-BF16, multiplied with x rounded to bf16 on those
 * units (cpu_matmul_amx.c, cpu_matmul_dp.c). cpu_matmul_kernel picks one
 * per backend and K, never by T.
 *
 * Every y[t, n] is dot(x[t], w[n]) in the one order of cpu_simd.h, plus
 * bias[n]: it depends on those two rows only, never on T, on where row t sits
 * in the batch, or on the thread count. DESIGN §4.1 needs exactly this (one
 * token, one result, at batch 1 or N, any prefill chunk, in a speculative
 * verify). BLAS libraries choose kernels and blockings by shape: with
 * OpenBLAS 0.3.21, sgemv differs from sgemm, and an sgemm row changes in the
 * last bits with M, with its place in the call and with the thread count.
 *
 * Blocking: a work item is up to CPU_MM_ROWS rows of x against a block of w
 * rows of about W_BLOCK_BYTES (kept in L2), computed in MR × NR register
 * tiles: per 8 elements of K, NR + MR loads feed MR * NR independent FMA
 * chains. A last single row of x (decode) uses 1 × NR1 tiles: more w rows
 * streaming at once keep the memory busy. Items walk the x blocks inside each
 * w block so that w is read from memory once.
 *
 * The block kernel (cpu_matmul_block) reads the rows of x through a row map
 * (struct cpu_xrows): consecutive rows here, the tokens a routing plan sends
 * to one expert in moe_matmul (cpu_moe.c), which so computes every row
 * exactly as matmul would.
 *
 * Threads: work items are spread over the OpenMP team; each output is
 * written by one thread.
 */
#include <errno.h>
#include <stdlib.h>

#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/cpu_simd.h"

#define MR 4
#define NR 3
#define NR1 8
#define W_BLOCK_BYTES (128 * 1024)
#define AMX_BLOCK_BYTES (1024 * 1024)

int64_t cpu_matmul_wrows(int64_t K, int64_t N)
{
	/* A multiple of NR and of NR1, so that a block splits into whole tiles. */
	int64_t nb = K ? W_BLOCK_BYTES / (K * (int64_t)sizeof(float)) / 24 * 24 : N;

	return nb < 24 ? 24 : nb;
}

/* Element k of a w row: f32, or bf16 widened. */
CPU_INLINE float wat(const void *w, bool bf16, int64_t k)
{
	return bf16 ? widen1(((const uint16_t *)w)[k]) : ((const float *)w)[k];
}

/* y[i, j] = dot(x[i], w[j]) (+ bias[j]) for an mr × nr tile: x[i] are the
 * tile's rows of x, w's rows (f32, or bf16 widened in registers) are K apart. */
CPU_INLINE void tile(const int mr, const int nr, const float *const *x, const void *w,
		     const bool bf16, int64_t K, float *y, int64_t ldy, const float *bias)
{
	v8f acc[MR][NR1];
	int64_t k;

#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
		for (int j = 0; j < nr; j++)
			acc[i][j] = (v8f){ 0 };
	for (k = 0; k + 8 <= K; k += 8) {
		v8f wv[NR1];

#pragma GCC unroll 8
		for (int j = 0; j < nr; j++)
			wv[j] = bf16 ? widen8((const uint16_t *)w + j * K + k)
				     : load8((const float *)w + j * K + k);
#pragma GCC unroll 4
		for (int i = 0; i < mr; i++) {
			v8f xv = load8(x[i] + k);

#pragma GCC unroll 8
			for (int j = 0; j < nr; j++)
				acc[i][j] += xv * wv[j];
		}
	}
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++) {
#pragma GCC unroll 8
		for (int j = 0; j < nr; j++) {
			float s = hsum8(acc[i][j]);

			for (int64_t t = k; t < K; t++)
				s += x[i][t] * wat(w, bf16, j * K + t);
			y[i * ldy + j] = bias ? s + bias[j] : s;
		}
	}
}

#define TILE_CASE(m, n) \
	case (m) * 16 + (n): \
		tile(m, n, xp, wp, bf16, K, yp, N, bp); \
		break

CPU_INLINE void block(const struct cpu_xrows *x, int64_t t0, int64_t T, const void *w,
		      const bool bf16, int64_t nb, int64_t K, float *y, int64_t N,
		      const float *bias)
{
	const size_t esize = bf16 ? sizeof(uint16_t) : sizeof(float);

	for (int64_t t = t0; t < t0 + T; t += MR) {
		int mr = t0 + T - t < MR ? (int)(t0 + T - t) : MR, step = mr == 1 ? NR1 : NR;
		const float *xp[MR];

		for (int i = 0; i < mr; i++)
			xp[i] = x->x + (x->order ? x->order[t + i] / x->k : t + i) * K;
		for (int64_t j = 0; j < nb; j += step) {
			int nr = nb - j < step ? (int)(nb - j) : step;
			const void *wp = (const char *)w + (size_t)(j * K) * esize;
			const float *bp = bias ? bias + j : NULL;
			float *yp = y + (t - t0) * N + j;

			switch (mr * 16 + nr) {
			TILE_CASE(1, 1); TILE_CASE(1, 2); TILE_CASE(1, 3); TILE_CASE(1, 4);
			TILE_CASE(1, 5); TILE_CASE(1, 6); TILE_CASE(1, 7); TILE_CASE(1, 8);
			TILE_CASE(2, 1); TILE_CASE(2, 2); TILE_CASE(2, 3);
			TILE_CASE(3, 1); TILE_CASE(3, 2); TILE_CASE(3, 3);
			TILE_CASE(4, 1); TILE_CASE(4, 2); TILE_CASE(4, 3);
			}
		}
	}
}

CPU_CLONES void cpu_matmul_block(const struct cpu_xrows *x, int64_t t0, int64_t T,
				 const void *w, int64_t nb, int64_t K, float *y, int64_t N,
				 const float *bias, uint16_t *xbuf)
{
	block(x, t0, T, w, false, nb, K, y, N, bias);
}

void cpu_matmul_bf16_generic(const struct cpu_xrows *x, int64_t t0, int64_t T, const void *w,
			     int64_t nb, int64_t K, float *y, int64_t N, const float *bias,
			     uint16_t *xbuf)
{
	block(x, t0, T, w, true, nb, K, y, N, bias);
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma")))
#endif
void cpu_matmul_bf16_avx2(const struct cpu_xrows *x, int64_t t0, int64_t T, const void *w,
			  int64_t nb, int64_t K, float *y, int64_t N, const float *bias,
			  uint16_t *xbuf)
{
	block(x, t0, T, w, true, nb, K, y, N, bias);
}

cpu_mm_block_fn *cpu_matmul_kernel(const struct cpu_backend *cpu, enum kt_dtype dt, int64_t K)
{
	if (dt == KT_F32)
		return cpu_matmul_block;
	if (cpu->bf16 && cpu->isa == CPU_ISA_AMX && K <= CPU_DP_MAX_K)
		return cpu_matmul_bf16_amx;
	if (cpu->bf16 && cpu->isa == CPU_ISA_AVX512BF16 && K <= CPU_DP_MAX_K)
		return cpu_matmul_bf16_dp;
	return cpu->isa >= CPU_ISA_AVX2 ? cpu_matmul_bf16_avx2 : cpu_matmul_bf16_generic;
}

int64_t cpu_matmul_kernel_wrows(cpu_mm_block_fn *kernel, int64_t K, int64_t N)
{
	int64_t nb;

	if (kernel != cpu_matmul_bf16_amx)
		return cpu_matmul_wrows(K, N);
	/* About 1 MiB of w (in L2), but no more than half of N: two threads
	 * share a decode step's rows. Multiples of the 32 rows of a tile pair. */
	nb = (AMX_BLOCK_BYTES / (K * 2 + 1) / 32) * 32;
	nb = nb < (N + 1) / 2 ? nb : (N + 1) / 2;
	nb = (nb + 31) / 32 * 32;
	return nb < 32 ? 32 : nb;
}

/* A bf16 x: widened into a buffer of the call's own, then the f32-x
 * product. Models on the cpu never hand it one (matmul_x_bf16 is
 * false here: under cpu_precision f32 x is not rounded); it is the op
 * cases' reference for the backends that take it. */
static int matmul_widened_x(struct kt_backend *be, const struct kt_tensor *y,
			    const struct kt_tensor *x, const struct kt_tensor *w,
			    const struct kt_tensor *bias)
{
	const size_t n = (size_t)x->rows * (size_t)x->cols;
	const uint16_t *xh = x->data;
	struct kt_tensor xf = *x;
	float *buf;
	int rc;

	if (!y || cpu_overlap(y, x))
		return -EINVAL;
	buf = malloc(n ? n * sizeof *buf : sizeof *buf);
	if (!buf)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		buf[i] = widen1(xh[i]);
	xf.dtype = KT_F32;
	xf.data = buf;
	rc = cpu_matmul(be, y, &xf, w, bias);
	free(buf);
	return rc;
}

int cpu_matmul(struct kt_backend *be, const struct kt_tensor *y, const struct kt_tensor *x,
	       const struct kt_tensor *w, const struct kt_tensor *bias)
{
	struct cpu_backend *cpu = cpu_of(be);
	int64_t T, K, N, nb, n_wb, n_xb;
	struct cpu_xrows xr;
	const char *wd;
	const float *bd;
	cpu_mm_block_fn *kernel;
	size_t esize;
	float *yd;

	if (cpu_valid(x, KT_BF16))
		return matmul_widened_x(be, y, x, w, bias);
	if (!cpu_valid(x, KT_F32) || !w || (w->dtype != KT_F32 && w->dtype != KT_BF16) ||
	    !cpu_valid(w, w->dtype))
		return -EINVAL;
	T = x->rows;
	K = x->cols;
	N = w->rows;
	if (w->cols != K || !cpu_shape(y, KT_F32, T, N))
		return -EINVAL;
	if (bias && (!cpu_shape(bias, KT_F32, 1, N) || cpu_overlap(y, bias)))
		return -EINVAL;
	if (cpu_overlap(y, x) || cpu_overlap(y, w))
		return -EINVAL;
	if (!T || !N)
		return 0;
	kernel = cpu_matmul_kernel(cpu, w->dtype, K);
	nb = cpu_matmul_kernel_wrows(kernel, K, N);
	n_wb = (N + nb - 1) / nb;
	n_xb = (T + CPU_MM_ROWS - 1) / CPU_MM_ROWS;
	xr = (struct cpu_xrows){ .x = x->data };
	wd = w->data;
	esize = kt_dtype_size(w->dtype);
	bd = bias ? bias->data : NULL;
	yd = y->data;
#pragma omp parallel for num_threads(cpu->threads) schedule(dynamic, 1) \
	if (n_wb * n_xb > 1 && T * N * K > CPU_PAR_MIN)
	for (int64_t it = 0; it < n_wb * n_xb; it++) {
		int64_t n0 = it / n_xb * nb, t0 = it % n_xb * CPU_MM_ROWS;
		int64_t len = N - n0 < nb ? N - n0 : nb;
		int64_t rows = T - t0 < CPU_MM_ROWS ? T - t0 : CPU_MM_ROWS;

		kernel(&xr, t0, rows, wd + (size_t)(n0 * K) * esize, len, K, yd + t0 * N + n0, N,
		       bd ? bd + n0 : NULL, cpu_scratch_self(cpu)->xbuf);
	}
	return 0;
}
