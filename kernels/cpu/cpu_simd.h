/* Portable 8-lane float vectors (GCC vector extensions) for the cpu hot
 * loops, and the function multi-versioning that compiles them twice on
 * x86-64: once for x86-64-v3 (AVX2 + FMA), once for the baseline, chosen at
 * load time. Elsewhere the baseline alone is built.
 *
 * Reduction order is part of the contract of the kernels that use these
 * helpers (see cpu_matmul.c): a dot product accumulates lane l over the
 * elements l, l + 8, ... in order, then reduces the lanes with hsum8, then
 * adds the tail elements in order.
 */
#ifndef ATLAS_KERNELS_CPU_SIMD_H
#define ATLAS_KERNELS_CPU_SIMD_H

#include <stdint.h>

/* 32-byte vectors never cross a call: every helper here is always inlined,
 * so the baseline ABI note about passing them is moot. */
#pragma GCC diagnostic ignored "-Wpsabi"

typedef float v8f __attribute__((vector_size(32)));
/* The same, for loads and stores at any float-aligned address. */
typedef float v8f_u __attribute__((vector_size(32), aligned(4)));
/* 8 bf16, aligned or at any 2-byte-aligned address. */
typedef uint16_t v8h __attribute__((vector_size(16)));
typedef uint16_t v8h_u __attribute__((vector_size(16), aligned(2)));

#define CPU_INLINE static inline __attribute__((always_inline))

/* clang before 16 (the fuzz build's) knows no x86-64 level names in
 * target_clones or __builtin_cpu_supports: it builds the baseline alone. */
#if defined(__x86_64__) && !(defined(__clang__) && __clang_major__ < 16)
#define CPU_X86_CLONES 1
#define CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define CPU_CLONES
#endif

CPU_INLINE v8f load8(const float *p)
{
	return *(const v8f_u *)p;
}

CPU_INLINE void store8(float *p, v8f v)
{
	*(v8f_u *)p = v;
}

/* 8 bf16 values widened to f32 (exact: bf16 is the top half of an f32),
 * each put above a zero half: two unpacks and a lane swap (GCC 12 makes
 * five instructions of a conversion to 32 bits and a shift). */
CPU_INLINE v8f widen8(const uint16_t *p)
{
	const v8h z = { 0 };

	return (v8f)__builtin_shufflevector(z, *(const v8h_u *)p, 0, 8, 1, 9, 2, 10, 3, 11, 4, 12,
					    5, 13, 6, 14, 7, 15);
}

/* One bf16 value widened to f32. */
CPU_INLINE float widen1(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;

	__builtin_memcpy(&f, &u, sizeof f);
	return f;
}

/* f32 rounded to bf16, nearest even; a NaN stays a (quiet) NaN. */
CPU_INLINE uint16_t narrow1(float f)
{
	uint32_t u;

	__builtin_memcpy(&u, &f, sizeof u);
	if ((u & 0x7fffffff) > 0x7f800000)
		return (uint16_t)((u >> 16) | 0x40);
	return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

/* The lanes of a, summed in a fixed tree. */
CPU_INLINE float hsum8(v8f a)
{
	return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

/* Name of the instruction set the clones run with on this machine. */
static inline const char *cpu_isa_name(void)
{
#if defined(CPU_X86_CLONES)
	return __builtin_cpu_supports("x86-64-v3") ? "AVX2+FMA" : "SSE2";
#elif defined(__x86_64__)
	return "SSE2";
#else
	return "generic";
#endif
}

#endif
