/* Building blocks of the paged attention kernels: the step metadata as the
 * device sees it, and the tensor-core tile step that the decode and prefill
 * kernels share (cuda_attention_decode.cuh, cuda_attention_prefill.cuh).
 *
 * Tile step. A warp owns 16 query rows (q rows as bf16 A fragments of
 * mma.sync m16n8k16) and an online-softmax state: running max m (log2
 * domain), partial sum l and an f32 accumulator o [16, D]. One step folds NK
 * keys whose K and V rows sit in shared memory (bf16, rows of D + 8 values so
 * that the 8 rows one ldmatrix phase reads fall in distinct banks):
 *   S = q Kᵀ (f32 accumulate), masked per row, scaled by scale·log2 e;
 *   m' = max(m, rowmax S); o, l *= 2^(m - m'); P = 2^(S - m');
 *   l += rowsum P; o += bf16(P) V.
 * The fragment layouts are the PTX ones for m16n8k16 (row g = lane / 4 and
 * g + 8, columns 2 (lane % 4) + {0, 1} of each 8-wide n-tile); the S
 * accumulators of two adjacent key n-tiles are exactly the A fragment of P
 * for the next product, so P never leaves registers.
 *
 * K/V tiles come through the block table with cp.async (16 bytes a thread);
 * a key past the end or in a block whose id is out of range is zero-filled
 * (so 0 · V stays finite), and a bad id is recorded for the caller.
 */
#ifndef ATLAS_KERNELS_CUDA_ATTENTION_COMMON_CUH
#define ATLAS_KERNELS_CUDA_ATTENTION_COMMON_CUH

#include <limits.h>
#include <math.h>
#include <stdint.h>

#include <cuda_bf16.h>

#include "kernels/cuda/cuda_async.cuh"
#include "kernels/cuda/cuda_impl.h"
#include "kernels/cuda/cuda_pdl.cuh"
#include "kernels/cuda/cuda_reduce.cuh"

/* Keys per shared-memory stage of the tensor-core kernels. */
#define ATT_TILE 64

/* scale · log2(e): scores are kept in the log2 domain so that softmax uses ex2. */
#define ATT_LOG2E 1.4426950408889634f

/* Where the rows of one step live, as the kernels see them. */
struct paged_kv {
	const int32_t *pos, *seq; /* [T] */
	const int32_t *bt;        /* [bt_rows, bt_cols] */
	int64_t bt_rows, bt_cols;
	int64_t n_blocks;         /* blocks both caches hold whole (kt_kv_blocks) */
	int64_t row_len;          /* cache cols: n_kv * D */
	int bs;                   /* block_size */
	int block_rows;           /* cache rows from one block to the next (kt_kv_block_rows) */
};

/* The blocks of slot s for position p, or NULL when either is out of
 * range (position at most max_pos). */
__device__ __forceinline__ const int32_t *slot_blocks(const paged_kv &kv, int32_t s, int32_t p,
						      int32_t max_pos)
{
	if (s < 0 || s >= kv.bt_rows || p < 0 || p > max_pos || p / kv.bs >= kv.bt_cols)
		return NULL;
	return kv.bt + (int64_t)s * kv.bt_cols;
}

/* Token t's sequence blocks, or NULL when its slot or position is out of
 * range (position at most max_pos). */
__device__ __forceinline__ const int32_t *token_blocks(const paged_kv &kv, int64_t t,
						       int32_t max_pos)
{
	return slot_blocks(kv, kv.seq[t], kv.pos[t], max_pos);
}

/* token_blocks() with the position and slot read through L2 only
 * (ld.global.cg), for a kernel that reads them before its pdl_wait
 * (cuda_attention_decode.cuh); *pos: the position. */
__device__ __forceinline__ const int32_t *token_blocks_l2(const paged_kv &kv, int64_t t,
							  int32_t max_pos, int32_t *pos)
{
	*pos = __ldcg(kv.pos + t);
	return slot_blocks(kv, __ldcg(kv.seq + t), *pos, max_pos);
}

/* Check b for T tokens over caches kc and vc (shapes only: the values are on
 * the device) and describe it for the kernels (cuda_attention.cu). */
int paged_kv_init(paged_kv *kv, const struct kt_batch *b, int64_t T, const struct kt_tensor *kc,
		  const struct kt_tensor *vc);

/* Where attention writes its output [T, n_heads * D]: f32, or bf16 with
 * each value rounded to nearest even as it is stored (the x of the next
 * product: matmul_x_bf16), so that o_proj reads half the bytes and no
 * rounding pass runs between them. Element i is p[i] either way. */
struct att_out {
	void *p;
	bool bf16;

	__device__ __forceinline__ void put(int64_t i, float v) const
	{
		if (bf16)
			((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
		else
			((float *)p)[i] = v;
	}
	/* i even, p 8-byte aligned */
	__device__ __forceinline__ void put2(int64_t i, float2 v) const
	{
		if (bf16)
			*(__nv_bfloat162 *)((__nv_bfloat16 *)p + i) = __float22bfloat162_rn(v);
		else
			*(float2 *)((float *)p + i) = v;
	}
	/* i a multiple of 4, p 16-byte aligned */
	__device__ __forceinline__ void put4(int64_t i, float4 v) const
	{
		if (bf16) {
			__nv_bfloat162 *o = (__nv_bfloat162 *)((__nv_bfloat16 *)p + i);

			o[0] = __float22bfloat162_rn(make_float2(v.x, v.y));
			o[1] = __float22bfloat162_rn(make_float2(v.z, v.w));
		} else {
			*(float4 *)((float *)p + i) = v;
		}
	}
};

/* Cache row of position p, or -1 when its block id is out of range. */
__device__ __forceinline__ int64_t cache_row(const paged_kv &kv, const int32_t *blocks,
					     int32_t p)
{
	const int32_t blk = blocks[p / kv.bs];

	if (blk < 0 || blk >= kv.n_blocks)
		return -1;
	return (int64_t)blk * kv.block_rows + p % kv.bs;
}

/* Shared-memory geometry of one K (or V) tile of ATT_TILE rows. */
template <int D> struct att_geom {
	static constexpr int row_bytes = (D + 8) * 2;
	static constexpr int tile_bytes = ATT_TILE * row_bytes;
	static constexpr int stage_bytes = 2 * tile_bytes; /* K then V */
};

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4])
{
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
		     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
		     : "r"(addr)
		     : "memory");
}

__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t (&r)[4])
{
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
		     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
		     : "r"(addr)
		     : "memory");
}

/* c += a · b for one m16n8k16 tile, bf16 inputs, f32 accumulators. */
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
					 uint32_t b1)
{
	asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
	    "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
	    : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
	    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* lo in the low half (the smaller column index), both rounded to nearest even. */
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
	const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);

	return *(const uint32_t *)&v;
}

/* 2^x (ex2.approx: relative error about 2^-22; 2^-inf = 0). */
__device__ __forceinline__ float exp2_fast(float x)
{
	float y;

	asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
	return y;
}

/* One warp's 16 query rows and their online-softmax state (see the top). */
template <int D> struct warp_rows {
	uint32_t q[D / 16][4]; /* A fragments of q in bf16, one per 16-dim k-step */
	float o[D / 8][4];     /* accumulator, one m16n8 tile per 8 output dims */
	float m[2], l[2];      /* rows g and g + 8: running max (log2 domain), partial sum */
};

/* Load this thread's part of the q rows (q0: row g, q1: row g + 8, NULL for
 * a padding row, which reads as zeros) and reset the state. */
template <int D>
__device__ __forceinline__ void warp_rows_init(warp_rows<D> &w, const float *q0, const float *q1)
{
	const int c = 2 * (threadIdx.x & 3);

#pragma unroll
	for (int kk = 0; kk < D / 16; kk++) {
		const float2 z = make_float2(0.0f, 0.0f);
		const float2 x0 = q0 ? *(const float2 *)(q0 + 16 * kk + c) : z;
		const float2 x1 = q1 ? *(const float2 *)(q1 + 16 * kk + c) : z;
		const float2 x2 = q0 ? *(const float2 *)(q0 + 16 * kk + 8 + c) : z;
		const float2 x3 = q1 ? *(const float2 *)(q1 + 16 * kk + 8 + c) : z;

		w.q[kk][0] = pack_bf16(x0.x, x0.y);
		w.q[kk][1] = pack_bf16(x1.x, x1.y);
		w.q[kk][2] = pack_bf16(x2.x, x2.y);
		w.q[kk][3] = pack_bf16(x3.x, x3.y);
	}
#pragma unroll
	for (int i = 0; i < D / 8; i++)
		w.o[i][0] = w.o[i][1] = w.o[i][2] = w.o[i][3] = 0.0f;
	w.m[0] = w.m[1] = -INFINITY;
	w.l[0] = w.l[1] = 0.0f;
}

/* The online-softmax step of one m-tile of 16 rows (see the top): mask
 * and scale the scores s of NK keys, whose first column in this lane is
 * position c0, for rows g (positions up to lim0) and g + 8 (lim1); rescale
 * the accumulators o and the sums l to the new running max m; turn s into
 * P. warp_attend and the prefill kernels (cuda_attention_prefill.cuh,
 * cuda_attention_wgmma.cuh) share it, so that a row gets the same bits
 * from each.
 *
 * With SKIP (prefill), a step whose keys every row of the warp may see (all
 * but the diagonal steps of a causal segment) skips the mask, which would
 * keep every score: +6.7 % on the wide kernel (dev/cuda/README.md). The
 * test is warp-wide, so the warp does not diverge. Both branches then scale
 * with __fmul_rn, which the compiler never fuses into the subtraction of
 * the max (an fma, one rounding less): in the masked branch the select
 * kept them apart, and without it nothing would. The decode kernel, whose
 * steps are few and on a latency chain, leaves SKIP out and keeps the
 * machine code it had (the plain product). */
template <int D, int NK, bool SKIP = true>
__device__ __forceinline__ void softmax_tile(float (&s)[NK / 8][4], float (&o)[D / 8][4],
					     float (&m)[2], float (&l)[2], int c0, int lim0,
					     int lim1, float sl2)
{
	float mx[2] = { -INFINITY, -INFINITY }, base[2];
	/* this lane's last column is c0 + NK - 7 */
	const bool seen = SKIP && __all_sync(FULL_WARP, c0 + NK - 7 <= min(lim0, lim1));

	if (seen) {
#pragma unroll
		for (int i = 0; i < NK / 8; i++)
#pragma unroll
			for (int e = 0; e < 4; e++) {
				s[i][e] = __fmul_rn(s[i][e], sl2);
				mx[e >> 1] = fmaxf(mx[e >> 1], s[i][e]);
			}
	} else {
#pragma unroll
		for (int i = 0; i < NK / 8; i++)
#pragma unroll
			for (int e = 0; e < 4; e++) {
				const int j = c0 + 8 * i + (e & 1);
				const bool keep = j <= (e < 2 ? lim0 : lim1);

				s[i][e] = keep ? (SKIP ? __fmul_rn(s[i][e], sl2) : s[i][e] * sl2)
					       : -INFINITY;
				mx[e >> 1] = fmaxf(mx[e >> 1], s[i][e]);
			}
	}
#pragma unroll
	for (int r = 0; r < 2; r++) {
		float mn, corr;

		mx[r] = fmaxf(mx[r], __shfl_xor_sync(FULL_WARP, mx[r], 1));
		mx[r] = fmaxf(mx[r], __shfl_xor_sync(FULL_WARP, mx[r], 2));
		mn = fmaxf(m[r], mx[r]);
		base[r] = mn == -INFINITY ? 0.0f : mn;
		corr = exp2_fast(m[r] - base[r]);
		m[r] = mn;
		l[r] *= corr;
#pragma unroll
		for (int i = 0; i < D / 8; i++) {
			o[i][2 * r] *= corr;
			o[i][2 * r + 1] *= corr;
		}
	}
#pragma unroll
	for (int i = 0; i < NK / 8; i++)
#pragma unroll
		for (int e = 0; e < 4; e++) {
			s[i][e] = exp2_fast(s[i][e] - base[e >> 1]);
			l[e >> 1] += s[i][e];
		}
}

/* Fold NK keys into w: their K and V rows start at shared addresses ks and
 * vs, key i of them is position key0 + i, and row g (g + 8) may see
 * positions up to lim0 (lim1); sl2 = scale · log2 e. SKIP: softmax_tile's. */
template <int D, int NK, bool SKIP = true>
__device__ __forceinline__ void warp_attend(warp_rows<D> &w, uint32_t ks, uint32_t vs, int key0,
					    int lim0, int lim1, float sl2)
{
	constexpr int RB = att_geom<D>::row_bytes;
	const int lane = threadIdx.x & 31, mat = lane >> 3, r8 = lane & 7;
	const int c0 = key0 + 2 * (lane & 3);
	float s[NK / 8][4];

	/* This lane's ldmatrix row address: K tiles are read as [key][dim] 8x8
	 * matrices (B of S = q Kᵀ), V tiles transposed (B of o = P V). */
	ks += ((mat >> 1) * 8 + r8) * RB + (mat & 1) * 16;
	vs += ((mat & 1) * 8 + r8) * RB + (mat >> 1) * 16;

#pragma unroll
	for (int i = 0; i < NK / 8; i++)
		s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
	for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
		for (int np = 0; np < NK / 16; np++) {
			uint32_t b[4];

			ldsm_x4(ks + 16 * np * RB + 32 * kk, b);
			mma_bf16(s[2 * np], w.q[kk], b[0], b[1]);
			mma_bf16(s[2 * np + 1], w.q[kk], b[2], b[3]);
		}
	}
	softmax_tile<D, NK, SKIP>(s, w.o, w.m, w.l, c0, lim0, lim1, sl2);
#pragma unroll
	for (int kk = 0; kk < NK / 16; kk++) {
		const uint32_t a[4] = { pack_bf16(s[2 * kk][0], s[2 * kk][1]),
					pack_bf16(s[2 * kk][2], s[2 * kk][3]),
					pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
					pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]) };

#pragma unroll
		for (int np = 0; np < D / 16; np++) {
			uint32_t b[4];

			ldsm_x4_trans(vs + 16 * kk * RB + 32 * np, b);
			mma_bf16(w.o[2 * np], a, b[0], b[1]);
			mma_bf16(w.o[2 * np + 1], a, b[2], b[3]);
		}
	}
}

/* Sum the partial l of the 4 threads that share a row. */
template <int D> __device__ __forceinline__ void warp_rows_finish(warp_rows<D> &w)
{
#pragma unroll
	for (int r = 0; r < 2; r++) {
		w.l[r] += __shfl_xor_sync(FULL_WARP, w.l[r], 1);
		w.l[r] += __shfl_xor_sync(FULL_WARP, w.l[r], 2);
	}
}

/* Copy the K and V rows of keys [key0, key0 + ATT_TILE) of kv head kvh into
 * the shared tiles ks, vs (NT threads, thread tid). Keys at or past key_end
 * are zero-filled; a key in a block whose id is out of range too, and the
 * smallest such key goes to *bad_from (shared, atomicMin). Key `skip` (a
 * decode row's own key, which the decode kernel puts in the tile itself) is
 * checked but not copied: its rows in the tiles are left as they are.
 * (The wgmma prefill loads its swizzled tiles itself:
 * cuda_attention_wgmma.cuh.) */
template <int D, int NT>
__device__ __forceinline__ void load_kv_tile(uint32_t ks, uint32_t vs,
					     const __nv_bfloat16 *kc, const __nv_bfloat16 *vc,
					     const int32_t *blocks, const paged_kv &kv, int kvh,
					     int key0, int key_end, int *bad_from, int skip = -1)
{
	constexpr int CPR = D / 8; /* 16-byte chunks per row */
	constexpr int RB = att_geom<D>::row_bytes;

	constexpr int N = ATT_TILE * CPR / NT; /* chunks per thread */
	static_assert(ATT_TILE * CPR % NT == 0, "whole chunks per thread");
	int64_t off[N];
	int bad = INT_MAX;

	/* Every block id first, then the copies: a copy is a compiler barrier
	 * (cuda_async.cuh), and a block id read after one would wait a round
	 * trip of its own. */
#pragma unroll
	for (int i = 0; i < N; i++) {
		const int c = (int)threadIdx.x + i * NT;
		const int row = c / CPR, col = c % CPR, j = key0 + row;

		off[i] = -1;
		if (j < key_end) {
			const int32_t blk = blocks[j / kv.bs];

			if (blk >= 0 && blk < kv.n_blocks)
				off[i] = ((int64_t)blk * kv.block_rows + j % kv.bs) * kv.row_len +
					 (int64_t)kvh * D + col * 8;
			else
				bad = min(bad, j);
		}
	}
	if (bad != INT_MAX)
		atomicMin(bad_from, bad);
#pragma unroll
	for (int i = 0; i < N; i++) {
		const int c = (int)threadIdx.x + i * NT;
		const int row = c / CPR, col = c % CPR;

		if (key0 + row != skip) {
			cp_async16(ks + row * RB + col * 16, kc + (off[i] < 0 ? 0 : off[i]),
				   off[i] >= 0);
			cp_async16(vs + row * RB + col * 16, vc + (off[i] < 0 ? 0 : off[i]),
				   off[i] >= 0);
		}
	}
}

#endif
