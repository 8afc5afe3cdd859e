/* The matmul block kernel of cpu_precision bf16 on CPUs with AVX512-BF16:
 * bf16 w times x rounded to bf16, with vdpbf16ps.
 *
 * Order (a row's result depends on its x row, w row and bias only, never on
 * T or on the tile it falls in; DESIGN §4.1): x is rounded to bf16 (nearest
 * even); lane l of a 16-lane f32 accumulator takes, per 32 elements of K
 * from 0 up, the pair (2l, 2l + 1) as vdpbf16ps adds it; the last partial
 * chunk reads zeros past K; then sum4's fixed tree and the bias. The products of two bf16 are exact in f32; only x's rounding and
 * the f32 sums differ from f32 precision.
 *
 * Tiles: DP_MR rows of x against DP_NR w rows, or one row against DP_NR1
 * (decode: more w rows streaming at once). The tile's rows of x are rounded
 * to bf16 once into the thread's scratch (cpu_scratch.xbuf) before the w
 * rows go by; cpu_matmul_kernel sends wider K to the widening kernel.
 *
 * Built for AVX512-BF16 with a target attribute whatever the compiler's
 * flags; cpu_matmul_kernel calls it only where cpu_isa_supported says the
 * CPU has it. Elsewhere than x86-64 it is never called and aborts.
 */
#include <stdlib.h>

#include "kernels/cpu/cpu_impl.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define DP_MR 4
#define DP_NR 4
#define DP_NR1 8
#define DP_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define DP_INLINE static inline __attribute__((always_inline)) DP_TARGET

/* dst[0, K32) = x[0, K) rounded to bf16, zeros up to K32 (K rounded up to 32). */
DP_INLINE void round_row(uint16_t *dst, const float *x, int64_t K)
{
	int64_t k;

	for (k = 0; k + 32 <= K; k += 32)
		_mm512_storeu_si512(dst + k, (__m512i)_mm512_cvtne2ps_pbh(
						     _mm512_loadu_ps(x + k + 16),
						     _mm512_loadu_ps(x + k)));
	if (k < K) {
		int64_t n = K - k;
		__mmask16 lo = (__mmask16)(n >= 16 ? 0xffff : (1u << n) - 1);
		__mmask16 hi = (__mmask16)(n <= 16 ? 0 : (1u << (n - 16)) - 1);

		_mm512_storeu_si512(dst + k, (__m512i)_mm512_cvtne2ps_pbh(
						     _mm512_maskz_loadu_ps(hi, x + k + 16),
						     _mm512_maskz_loadu_ps(lo, x + k)));
	}
}

/* The lanes of a, b, c and d summed, each in the same tree whatever the
 * others hold: 128-bit quarters q0 + q2 and q1 + q3, then those two, then
 * within the quarter (e0 + e1) + (e2 + e3). Four at once: a tile's 16
 * reductions cost about what 4 of _mm512_reduce_add_ps would. */
DP_INLINE __m128 sum4(__m512 a, __m512 b, __m512 c, __m512 d)
{
	__m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xee));
	__m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xee));
	__m512 x = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88),
				 _mm512_shuffle_f32x4(ab, cd, 0xdd));

	x = _mm512_add_ps(x, _mm512_permute_ps(x, 0xb1));
	x = _mm512_add_ps(x, _mm512_permute_ps(x, 0x4e));
	return _mm512_castps512_ps128(_mm512_permutexvar_ps(
		_mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), x));
}

/* y[i, j] = dot(xb[i], w[j]) (+ bias[j]) for an mr × nr tile; xb rows are
 * padded with zeros to a multiple of 32, w rows are K apart. */
DP_INLINE void tile(const int mr, const int nr, const uint16_t *const *xb, const uint16_t *w,
		    int64_t K, float *y, int64_t ldy, const float *bias)
{
	__m512 acc[DP_MR][DP_NR1];
	int64_t k;

#pragma GCC unroll 4
	for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
		for (int j = 0; j < nr; j++)
			acc[i][j] = _mm512_setzero_ps();
	for (k = 0; k < K; k += 32) {
		__m512bh wv[DP_NR1];

		if (k + 32 <= K) {
#pragma GCC unroll 8
			for (int j = 0; j < nr; j++)
				wv[j] = (__m512bh)_mm512_loadu_si512(w + j * K + k);
		} else {
			__mmask32 m = (__mmask32)((1ull << (K - k)) - 1);

#pragma GCC unroll 8
			for (int j = 0; j < nr; j++)
				wv[j] = (__m512bh)_mm512_maskz_loadu_epi16(m, w + j * K + k);
		}
#pragma GCC unroll 4
		for (int i = 0; i < mr; i++) {
			__m512bh xv = (__m512bh)_mm512_loadu_si512(xb[i] + k);

#pragma GCC unroll 8
			for (int j = 0; j < nr; j++)
				acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv, wv[j]);
		}
	}
#pragma GCC unroll 4
	for (int i = 0; i < mr; i++) {
		float s[DP_NR1];

#pragma GCC unroll 2
		for (int j = 0; j < nr; j += 4) {
			const __m512 z = _mm512_setzero_ps();

			_mm_storeu_ps(s + j, sum4(acc[i][j], j + 1 < nr ? acc[i][j + 1] : z,
						  j + 2 < nr ? acc[i][j + 2] : z,
						  j + 3 < nr ? acc[i][j + 3] : z));
		}
#pragma GCC unroll 8
		for (int j = 0; j < nr; j++)
			y[i * ldy + j] = bias ? s[j] + bias[j] : s[j];
	}
}

#define TILE_CASE(m, n) \
	case (m) * 16 + (n): \
		tile(m, n, xp, wp, K, yp, N, bp); \
		break

DP_TARGET void cpu_matmul_bf16_dp(const struct cpu_xrows *x, int64_t t0, int64_t T,
				  const void *w, int64_t nb, int64_t K, float *y, int64_t N,
				  const float *bias, uint16_t *xbuf)
{
	if (K > CPU_DP_MAX_K || !xbuf)
		abort();
	for (int64_t t = t0; t < t0 + T; t += DP_MR) {
		int mr = t0 + T - t < DP_MR ? (int)(t0 + T - t) : DP_MR;
		int step = mr == 1 ? DP_NR1 : DP_NR;
		const uint16_t *xp[DP_MR];

		for (int i = 0; i < mr; i++) {
			xp[i] = xbuf + i * CPU_DP_MAX_K;
			round_row(xbuf + i * CPU_DP_MAX_K,
				  x->x + (x->order ? x->order[t + i] / x->k : t + i) * K, K);
		}
		for (int64_t j = 0; j < nb; j += step) {
			int nr = nb - j < step ? (int)(nb - j) : step;
			const uint16_t *wp = (const uint16_t *)w + j * K;
			const float *bp = bias ? bias + j : NULL;
			float *yp = y + (t - t0) * N + j;

			switch (mr * 16 + nr) {
			TILE_CASE(1, 1); TILE_CASE(1, 2); TILE_CASE(1, 3); TILE_CASE(1, 4);
			TILE_CASE(1, 5); TILE_CASE(1, 6); TILE_CASE(1, 7); TILE_CASE(1, 8);
			TILE_CASE(2, 1); TILE_CASE(2, 2); TILE_CASE(2, 3); TILE_CASE(2, 4);
			TILE_CASE(3, 1); TILE_CASE(3, 2); TILE_CASE(3, 3); TILE_CASE(3, 4);
			TILE_CASE(4, 1); TILE_CASE(4, 2); TILE_CASE(4, 3); TILE_CASE(4, 4);
			}
		}
	}
}

bool cpu_isa_supported(enum cpu_isa isa)
{
	switch (isa) {
	case CPU_ISA_AMX:
		return cpu_isa_supported(CPU_ISA_AVX512BF16) && cpu_amx_usable();
	case CPU_ISA_AVX512BF16:
		return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
		       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
	case CPU_ISA_AVX2:
		return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
	default:
		return true;
	}
}

#else

void cpu_matmul_bf16_dp(const struct cpu_xrows *x, int64_t t0, int64_t T, const void *w,
			int64_t nb, int64_t K, float *y, int64_t N, const float *bias, uint16_t *xbuf)
{
	abort();
}

bool cpu_isa_supported(enum cpu_isa isa)
{
	return isa == CPU_ISA_GENERIC;
}

#endif
