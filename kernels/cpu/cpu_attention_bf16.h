/* The arithmetic of cpu attention on bf16 KV caches (cpu_precision bf16),
 * for cpu_attention.c's fold_block alone: scores and value sums of up to 4
 * key rows for two query heads at once, each row widened once, and the
 * softmax weights through a vector exp. A token's result depends on its own
 * q and keys only (DESIGN §4.1): every tree below sums one (head, row) pair
 * whatever its neighbours hold.
 */
#ifndef ATLAS_KERNELS_CPU_ATTENTION_BF16_H
#define ATLAS_KERNELS_CPU_ATTENTION_BF16_H

#include <stdint.h>

#include "kernels/cpu/cpu_simd.h"

/* The bf16 path's scores of nr (<= 4) bf16 key rows for nq (<= 2) query
 * heads, each key row widened once for both: o_i[r] = scale * dot(q_i, k_r).
 * The lanes of each (head, row) product are summed in one tree, ((0 + 1) +
 * (2 + 3)) + ((4 + 5) + (6 + 7)), whatever the other 7 accumulators hold
 * (unused ones are zeros), so a score never depends on its neighbours. */
CPU_INLINE void score_tile(const int nr, const int nq, const float *q0, const float *q1,
			   const uint16_t *k, int64_t ldk, int D, float scale, float *o0, float *o1)
{
	v8f acc[8], u[4], w[2], s;
	int d;

#pragma GCC unroll 8
	for (int i = 0; i < 8; i++)
		acc[i] = (v8f){ 0 };
	for (d = 0; d + 8 <= D; d += 8) {
		v8f qv0 = load8(q0 + d), qv1 = nq > 1 ? load8(q1 + d) : qv0;

#pragma GCC unroll 4
		for (int r = 0; r < nr; r++) {
			v8f kv = widen8(k + r * ldk + d);

			acc[r] += qv0 * kv;
			if (nq > 1)
				acc[4 + r] += qv1 * kv;
		}
	}
#pragma GCC unroll 4
	for (int i = 0; i < 4; i++)
		u[i] = __builtin_shufflevector(acc[2 * i], acc[2 * i + 1], 0, 8, 2, 10, 4, 12, 6, 14) +
		       __builtin_shufflevector(acc[2 * i], acc[2 * i + 1], 1, 9, 3, 11, 5, 13, 7, 15);
#pragma GCC unroll 2
	for (int i = 0; i < 2; i++)
		w[i] = __builtin_shufflevector(u[2 * i], u[2 * i + 1], 0, 1, 8, 9, 4, 5, 12, 13) +
		       __builtin_shufflevector(u[2 * i], u[2 * i + 1], 2, 3, 10, 11, 6, 7, 14, 15);
	s = __builtin_shufflevector(w[0], w[1], 0, 1, 2, 3, 8, 9, 10, 11) +
	    __builtin_shufflevector(w[0], w[1], 4, 5, 6, 7, 12, 13, 14, 15);
#pragma GCC unroll 4
	for (int r = 0; r < nr; r++) {
		float t0 = s[r], t1 = s[4 + r];

		for (int i = d; i < D; i++) {
			t0 += q0[i] * widen1(k[r * ldk + i]);
			if (nq > 1)
				t1 += q1[i] * widen1(k[r * ldk + i]);
		}
		o0[r] = t0 * scale;
		if (nq > 1)
			o1[r] = t1 * scale;
	}
}

/* acc_i[0..D) += sum over r of w_i[r] * v_r for nr (<= 4) bf16 value rows
 * and nq (<= 2) heads, each value row widened once for both; per head the
 * order of accumulate_rows. */
CPU_INLINE void acc_tile(const int nr, const int nq, float *acc0, float *acc1, const uint16_t *v,
			 int64_t ldv, int D, const float *w0, const float *w1)
{
	int d;

	for (d = 0; d + 8 <= D; d += 8) {
		v8f vr[4], a0 = load8(acc0 + d), a1 = nq > 1 ? load8(acc1 + d) : a0;

#pragma GCC unroll 4
		for (int r = 0; r < nr; r++)
			vr[r] = widen8(v + r * ldv + d);
#pragma GCC unroll 4
		for (int r = 0; r < nr; r++)
			a0 += w0[r] * vr[r];
		store8(acc0 + d, a0);
		if (nq < 2)
			continue;
#pragma GCC unroll 4
		for (int r = 0; r < nr; r++)
			a1 += w1[r] * vr[r];
		store8(acc1 + d, a1);
	}
	for (; d < D; d++)
		for (int r = 0; r < nr; r++) {
			acc0[d] += w0[r] * widen1(v[r * ldv + d]);
			if (nq > 1)
				acc1[d] += w1[r] * widen1(v[r * ldv + d]);
		}
}

#define TILE_CASES(f, nr, nq, ...) \
	switch ((nr) * 4 + (nq)) { \
	case 4 * 4 + 2: f(4, 2, __VA_ARGS__); break; \
	case 4 * 4 + 1: f(4, 1, __VA_ARGS__); break; \
	case 3 * 4 + 2: f(3, 2, __VA_ARGS__); break; \
	case 3 * 4 + 1: f(3, 1, __VA_ARGS__); break; \
	case 2 * 4 + 2: f(2, 2, __VA_ARGS__); break; \
	case 2 * 4 + 1: f(2, 1, __VA_ARGS__); break; \
	case 1 * 4 + 2: f(1, 2, __VA_ARGS__); break; \
	default: f(1, 1, __VA_ARGS__); break; \
	}

/* e^x for x <= 0 on 8 lanes (Cephes' expf polynomial, within 2 ulp; below
 * -87.3 it gives e^-87.3 rather than a denormal or 0): the bf16 path's
 * softmax weights. */
CPU_INLINE v8f vexp8(v8f x)
{
	typedef int32_t v8i __attribute__((vector_size(32)));
	const v8f lo = { -87.3f, -87.3f, -87.3f, -87.3f, -87.3f, -87.3f, -87.3f, -87.3f };
	const v8i below = x < lo;
	v8f n, r, p;

	x = (v8f)(((v8i)x & ~below) | ((v8i)lo & below));
	n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
	r = x - n * 0.693359375f + n * 2.12194440e-4f;
	p = 1.9875691500e-4f * r + 1.3981999507e-3f;
	p = p * r + 8.3334519073e-3f;
	p = p * r + 4.1665795894e-2f;
	p = p * r + 1.6666665459e-1f;
	p = p * r + 5.0000001201e-1f;
	p = p * (r * r) + r + 1.0f;
	return p * (v8f)((__builtin_convertvector(n, v8i) + 127) << 23);
}

/* w[0, len) = e^(w - m) with vexp8, 8 at a time. */
CPU_INLINE void exp_block(float *w, int32_t len, float m)
{
	for (int32_t j = 0; j < len; j += 8) {
		v8f x = { 0 }, e;

		if (j + 8 <= len) {
			store8(w + j, vexp8(load8(w + j) - m));
			continue;
		}
		for (int32_t i = j; i < len; i++)
			x[i - j] = w[i] - m;
		e = vexp8(x);
		for (int32_t i = j; i < len; i++)
			w[i] = e[i - j];
	}
}

#endif
