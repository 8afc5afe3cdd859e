/* What the grouped expert kernels share (cuda_moe_gemv.cuh,
 * cuda_moe_gemm.cuh, cuda_moe_matmul.cu): how a block finds its rows in a
 * routing plan, and where a sorted row's activations come from.
 *
 * A plan (moe_route) sorts the R = T*k assignments by expert: expert e owns
 * the sorted rows offsets[e] .. offsets[e + 1] - 1. The kernels cut each
 * local expert's rows into tiles of at most `ch` rows (ceil(c_e / ch) tiles
 * for c_e rows) and number the tiles in expert order; block s of a launch
 * takes tile s. The count of tiles is only known on the device, so a launch
 * has an upper bound of blocks (moe_max_tiles: every local expert active
 * adds at most one partial tile) and the blocks past the last tile return at
 * once. Inactive experts cost nothing but their two offsets.
 */
#ifndef ATLAS_KERNELS_CUDA_MOE_CUH
#define ATLAS_KERNELS_CUDA_MOE_CUH

#include <stdint.h>

#include "kernels/cuda/cuda_impl.h"

/* One tile: rows row0 .. row0 + rows - 1 of expert e (absolute id); rows 0: none. */
struct moe_tile {
	int e, row0, rows;
};

/* Local experts whose offsets a lane reads ahead in one round of moe_find_tile. */
#define MOE_FIND_AHEAD 4

/* Most tiles of at most ch rows that R sorted rows of n_local experts make. */
static inline int64_t moe_max_tiles(int64_t R, int64_t n_local, int ch)
{
	return (R < n_local ? R : n_local) + R / ch;
}

/* Tile s of the plan over the local experts e0 .. e0 + n_local - 1 of
 * offsets [E + 1] (R sorted rows), in tiles of ch rows. Called by all 32
 * lanes of a warp, which all get the same tile. A lane reads the offsets
 * of experts lane, lane + 32, ... (MOE_FIND_AHEAD rounds in flight); a warp
 * scan numbers the tiles. Offsets outside [0, R] or decreasing set
 * fault_bit and count as an empty expert. */
__device__ __forceinline__ moe_tile moe_find_tile(const int32_t *__restrict__ offsets, int e0,
						  int n_local, int R, int ch, int64_t s,
						  unsigned fault_bit, unsigned *fault)
{
	const int lane = threadIdx.x & 31;
	int64_t carry = 0;

	for (int base = 0; base < n_local; base += 32 * MOE_FIND_AHEAD) {
		int lo[MOE_FIND_AHEAD], hi[MOE_FIND_AHEAD];

#pragma unroll
		for (int r = 0; r < MOE_FIND_AHEAD; r++) {
			const int e = base + 32 * r + lane;

			lo[r] = e < n_local ? offsets[e0 + e] : 0;
			hi[r] = e < n_local ? offsets[e0 + e + 1] : 0;
		}
#pragma unroll
		for (int r = 0; r < MOE_FIND_AHEAD; r++) {
			int n = 0, inc, row0, rows;
			int64_t first;
			unsigned hit;

			if (lo[r] < 0 || hi[r] < lo[r] || hi[r] > R)
				atomicOr(fault, fault_bit);
			else
				n = (hi[r] - lo[r] + ch - 1) / ch;
			inc = n;
			for (int o = 1; o < 32; o <<= 1) {
				const int v = __shfl_up_sync(0xffffffffu, inc, o);

				if (lane >= o)
					inc += v;
			}
			first = carry + inc - n;
			hit = __ballot_sync(0xffffffffu, s >= first && s < first + n);
			/* the hit lane's tile, computed by every lane before the
			 * branch so that lo and hi stay in registers */
			row0 = lo[r] + (int)((s - first) * ch);
			rows = min(ch, hi[r] - row0);
			if (hit) {
				const int src = __ffs(hit) - 1;
				moe_tile t;

				t.e = __shfl_sync(0xffffffffu, e0 + base + 32 * r + lane, src);
				t.row0 = __shfl_sync(0xffffffffu, row0, src);
				t.rows = __shfl_sync(0xffffffffu, rows, src);
				return t;
			}
			carry += __shfl_sync(0xffffffffu, inc, 31);
		}
	}
	return moe_tile{ 0, 0, 0 };
}

/* The x row of sorted row i: order[i] / k for token rows (k > 0), i itself
 * for rows already sorted (k == 0); -1 when order[i] is outside [0, R). */
__device__ __forceinline__ int moe_src_row(const int32_t *__restrict__ order, int i, int k, int R)
{
	int a;

	if (!k)
		return i;
	a = order[i];
	return a >= 0 && a < R ? a / k : -1;
}

#endif
