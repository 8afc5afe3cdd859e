/* What the AMX kernels share (cpu_matmul_amx.c, cpu_attention_amx.c): the
 * target attribute, the tile configuration's layout, and tile loads and
 * stores fenced for the compiler. x86-64 only.
 */
#ifndef ATLAS_KERNELS_CPU_AMX_H
#define ATLAS_KERNELS_CPU_AMX_H

#include <immintrin.h>
#include <stdint.h>

#define AMX_TARGET \
	__attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))
#define AMX_INLINE static inline __attribute__((always_inline)) AMX_TARGET

/* GCC 12's tile load and store intrinsics are asm statements that do not
 * tell the compiler they touch memory: without this fence around them the
 * stores that fill a buffer may sink past its tile load (or vanish as
 * dead), and the reads of a stored tile may rise above the store. */
#define TILE_FENCE() __asm__ volatile("" ::: "memory")
#define TILE_LOAD(t, p, stride) \
	do { \
		TILE_FENCE(); \
		_tile_loadd(t, p, stride); \
	} while (0)
#define TILE_STORE(t, p, stride) \
	do { \
		TILE_FENCE(); \
		_tile_stored(t, p, stride); \
		TILE_FENCE(); \
	} while (0)

/* The tile configuration of palette 1 (64 bytes, as ldtilecfg reads it):
 * tile i has rows[i] rows of colsb[i] bytes. */
struct amx_tilecfg {
	uint8_t palette, start_row;
	uint8_t reserved[14];
	uint16_t colsb[16];
	uint8_t rows[16];
};

#endif
