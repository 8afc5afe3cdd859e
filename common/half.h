/* 16-bit floats (IEEE binary16 and bfloat16) to f32 on the host: what
 * weight loading needs where a value must stay exact in f32 (the cpu
 * backend's weights, norm vectors kept in f32 on every backend). */
#ifndef ATLAS_COMMON_HALF_H
#define ATLAS_COMMON_HALF_H

#include <stdint.h>
#include <string.h>

/* binary16 to binary32 bits, exact for every input: subnormals are
 * renormalised, inf stays inf, nan keeps its sign and payload. */
static inline uint32_t half_f16_bits(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f;
	uint32_t mant = h & 0x3ff;

	if (exp == 0x1f)
		return sign | 0x7f800000 | (mant << 13);
	if (exp)
		return sign | ((exp + 127 - 15) << 23) | (mant << 13);
	if (!mant)
		return sign;
	/* Subnormal mant * 2^-24: shift the leading one up to bit 10. */
	exp = 127 - 15 + 1;
	while (!(mant & 0x400)) {
		mant <<= 1;
		exp--;
	}
	return sign | (exp << 23) | ((mant & 0x3ff) << 13);
}

/* bfloat16 is the top half of a binary32. */
static inline uint32_t half_bf16_bits(uint16_t h)
{
	return (uint32_t)h << 16;
}

static inline float half_bits_to_float(uint32_t bits)
{
	float f;
	memcpy(&f, &bits, sizeof f);
	return f;
}

#endif
