/* The matmul block kernel of cpu_precision bf16 on CPUs with AMX-BF16:
 * bf16 w times x rounded to bf16, with the tile unit (TDPBF16PS).
 *
 * Roles: y's transpose is computed, C[n][t] = Σ w[n][k] x[t][k], so that w
 * is the A operand, loaded straight from its rows (16 rows × 32 k a tile,
 * rows K apart), and x the B operand, which TDPBF16PS wants in pairs:
 * B[p][t] = (x[t][2p], x[t][2p + 1]) for the 16 pairs p of a 32-k step.
 * The kernel rounds up to 32 rows of x at a time to bf16 (nearest even)
 * into that layout in the thread's scratch (cpu_scratch.xbuf), zeros past
 * K and past the rows, then runs every w tile of the block against them:
 * 2 × 2 tiles of C (32 w rows × 32 x rows) per step of 32 k.
 *
 * Order (DESIGN §4.1): every C element starts at zero and takes the steps
 * of 32 k in order, each as TDPBF16PS adds its 16 pairs in f32; then the
 * bias. Rows and columns of a tile never mix, padding is zeros on both
 * sides, so a row's result depends on its x row, w row and bias alone,
 * whatever T, t0 and nb. A w tile that would read past the block's rows or
 * past K is copied, zero-padded, into a 1 KiB buffer first.
 *
 * Built with target attributes whatever the compiler's flags; chosen only
 * where cpu_isa_supported(CPU_ISA_AMX) said yes, which also asks Linux for
 * the tile state (arch_prctl ARCH_REQ_XCOMP_PERM). Each call loads the tile
 * configuration on its thread and releases the tiles when it returns.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_impl.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kernels/cpu/cpu_amx.h"

/* x rows per pass: two B tiles of 16 columns. */
#define PASS_ROWS 32

/* Tiles 0-3: C [16 w rows, 16 x rows] f32; 4, 5: A, w [16 rows, 32 bf16];
 * 6, 7: B, x [16 pairs, 16 rows × 2 bf16]. All 16 rows of 64 bytes. */
AMX_INLINE void configure(void)
{
	struct amx_tilecfg c = { .palette = 1 };

	for (int i = 0; i < 8; i++) {
		c.colsb[i] = 64;
		c.rows[i] = 16;
	}
	TILE_FENCE();
	_tile_loadconfig(&c);
}

/* Row t (0..31) of a pass into pk, the pass's B tiles: pair p of row t at
 * pk[((t / 16) * P + p) * 16 + t % 16], P = K rounded up to 32, halved. */
AMX_INLINE void pack_row(uint32_t *pk, const float *x, int64_t K, int64_t P, int t)
{
	const __m512i idx = _mm512_mullo_epi32(_mm512_set1_epi32(16),
					       _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9,
								 10, 11, 12, 13, 14, 15));
	uint32_t *base = pk + (t / 16) * P * 16 + t % 16;

	for (int64_t k = 0; k < K; k += 32) {
		int64_t n = K - k;
		__mmask16 lo = (__mmask16)(n >= 16 ? 0xffff : (1u << n) - 1);
		__mmask16 hi = (__mmask16)(n >= 32 ? 0xffff : n <= 16 ? 0 : (1u << (n - 16)) - 1);
		__m512i v = (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, x + k + 16),
							 _mm512_maskz_loadu_ps(lo, x + k));

		_mm512_i32scatter_epi32(base + k / 2 * 16, idx, v, 4);
	}
}

/* A tile of w rows [0, rows) and k [k, k + 32) of rows K apart, zero-padded. */
AMX_INLINE void load_a_padded(int tile, const uint16_t *w, int rows, int64_t k, int64_t K)
{
	uint16_t buf[16 * 32] __attribute__((aligned(64)));
	const int64_t n = K - k < 32 ? K - k : 32;

	memset(buf, 0, sizeof buf);
	for (int r = 0; r < rows; r++)
		memcpy(buf + r * 32, w + r * K + k, (size_t)n * sizeof(uint16_t));
	if (tile == 4)
		TILE_LOAD(4, buf, 64);
	else
		TILE_LOAD(5, buf, 64);
}

/* y[t][n0 + n] (+ bias) from a stored C tile c[n][t]: rows × cols valid. */
AMX_INLINE void put(const float *c, float *y, int64_t ldy, const float *bias, int rows,
		    int cols)
{
	for (int t = 0; t < cols; t++)
		for (int n = 0; n < rows; n++)
			y[t * ldy + n] = bias ? c[n * 16 + t] + bias[n] : c[n * 16 + t];
}

/* One pass: x rows [0, xr) (packed in pk) against w rows [0, nb). */
AMX_INLINE void pass(const uint32_t *pk, int xr, const uint16_t *w, int64_t nb, int64_t K,
		     int64_t P, float *y, int64_t ldy, const float *bias)
{
	const bool g2 = xr > 16;
	float c[16 * 16] __attribute__((aligned(64)));

	for (int64_t n0 = 0; n0 < nb; n0 += 32) {
		const int r0 = nb - n0 < 16 ? (int)(nb - n0) : 16;
		const int r1 = nb - n0 - 16 < 16 ? (int)(nb - n0 - 16) : 16;
		const bool n2 = r1 > 0;
		const uint16_t *w0 = w + n0 * K, *w1 = w0 + 16 * K;

		_tile_zero(0);
		_tile_zero(1);
		_tile_zero(2);
		_tile_zero(3);
		for (int64_t s = 0; s < P / 16; s++) {
			const int64_t k = s * 32;
			const bool whole = k + 32 <= K;

			TILE_LOAD(6, pk + s * 256, 64);
			if (g2)
				TILE_LOAD(7, pk + (P + s * 16) * 16, 64);
			if (whole && r0 == 16)
				TILE_LOAD(4, w0 + k, K * 2);
			else
				load_a_padded(4, w0, r0, k, K);
			_tile_dpbf16ps(0, 4, 6);
			if (g2)
				_tile_dpbf16ps(1, 4, 7);
			if (!n2)
				continue;
			if (whole && r1 == 16)
				TILE_LOAD(5, w1 + k, K * 2);
			else
				load_a_padded(5, w1, r1, k, K);
			_tile_dpbf16ps(2, 5, 6);
			if (g2)
				_tile_dpbf16ps(3, 5, 7);
		}
		TILE_STORE(0, c, 64);
		put(c, y + n0, ldy, bias ? bias + n0 : NULL, r0, xr < 16 ? xr : 16);
		if (g2) {
			TILE_STORE(1, c, 64);
			put(c, y + 16 * ldy + n0, ldy, bias ? bias + n0 : NULL, r0, xr - 16);
		}
		if (!n2)
			continue;
		TILE_STORE(2, c, 64);
		put(c, y + n0 + 16, ldy, bias ? bias + n0 + 16 : NULL, r1, xr < 16 ? xr : 16);
		if (g2) {
			TILE_STORE(3, c, 64);
			put(c, y + 16 * ldy + n0 + 16, ldy, bias ? bias + n0 + 16 : NULL, r1,
			    xr - 16);
		}
	}
}

AMX_TARGET void cpu_matmul_bf16_amx(const struct cpu_xrows *x, int64_t t0, int64_t T,
				    const void *w, int64_t nb, int64_t K, float *y, int64_t N,
				    const float *bias, uint16_t *xbuf)
{
	const int64_t P = (K + 31) / 32 * 16;
	uint32_t *pk = (uint32_t *)xbuf;

	if (K > CPU_DP_MAX_K || !xbuf)
		abort();
	configure();
	for (int64_t t = t0; t < t0 + T; t += PASS_ROWS) {
		const int xr = t0 + T - t < PASS_ROWS ? (int)(t0 + T - t) : PASS_ROWS;

		/* columns past xr of a used B tile must be zero */
		if (xr % 16)
			memset(pk + (xr / 16) * P * 16, 0, (size_t)P * 16 * sizeof(uint32_t));
		for (int i = 0; i < xr; i++)
			pack_row(pk, x->x + (x->order ? x->order[t + i] / x->k : t + i) * K, K, P,
				 i);
		pass(pk, xr, w, nb, K, P, y + (t - t0) * N, N, bias);
	}
	_tile_release();
}

/* CPUID leaf 7 names AMX-TILE (EDX bit 24) and AMX-BF16 (bit 22), read
 * directly because not every compiler's __builtin_cpu_supports knows them.
 * Linux hands out the tile state only on request, once per process. */
bool cpu_amx_usable(void)
{
	unsigned a, b, c, d;

	if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
		return false;
	return (d >> 24 & 1) && (d >> 22 & 1) &&
	       syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */,
		       18 /* XFEATURE_XTILEDATA */) == 0;
}

#else

void cpu_matmul_bf16_amx(const struct cpu_xrows *x, int64_t t0, int64_t T, const void *w,
			 int64_t nb, int64_t K, float *y, int64_t N, const float *bias,
			 uint16_t *xbuf)
{
	abort();
}

bool cpu_amx_usable(void)
{
	return false;
}

#endif
