/* The GEMV at 1 to 8 rows of x on Hopper (cuda_gemv.cu): a persistent grid
 * whose blocks stream w through a ring of bulk copies, in a header so that
 * the kernel lab (dev/cuda/gemv_lab.cu) times the very kernels the backend
 * launches.
 *
 * Why: gemv_kernel's blocks own 8 rows of w each and live for a few
 * microseconds; each starts with an empty cp.async ring, and a lane issues a
 * copy for every 16 bytes. Alone on an H100 at one row (the lab), it reads
 * the Qwen3-8B MLP shapes at 80 % of the copy bandwidth, this kernel at
 * 91 %; 4096 x 4096 is level (72 %), and the Qwen3-0.6B shapes of K = 1024
 * (one k-block a tile) are 15-18 % slower. In the engine, with the kernels
 * around it, batch 1 gained 1.5 % (Qwen3-8B) and 3.1 % (0.6B), batch 8
 * 4.8 % and 1.5 %; with the norms taken too (below), Qwen3-8B batch 1
 * gained 8.0 % more (docs/perf.md).
 *
 * Tiling: a launch's w is a list of tiles of 8 rows (a tile policy below
 * says which rows and where the outputs go). Block b of G owns tiles b,
 * b + G, b + 2G, ...: at any moment the grid reads one window of w, not G
 * runs far apart (on an H200, against a run of tiles a block: Qwen3-8B
 * batch 1 +3.7 %, 0.6B batch 1 +1.2 % and batch 8 +1.5 %, the same bits;
 * docs/perf.md). Its last warp is the producer: its lane 0 keeps
 * GEMV_BULK_STAGES stages of its tiles in flight, through the tiles.
 * A stage is one k-block (GEMV_KBLOCK values) of a tile's 8 rows, one bulk
 * copy a row, into rows GEMV_BULK_PITCH bytes apart (64 bytes past the
 * k-block, so that the lanes of rows g and g + 1 read other banks). A
 * stage's `full` barrier counts its bytes; each of the GEMV_WARPS consumer
 * warps arrives on its `empty` barrier once it has read it, and the
 * producer, waiting there, refills it. The producer takes no part in the
 * consumers' barriers (named barrier 1 of GEMV_WARPS warps).
 * (Tried: the producer as lane 0 of a consumer warp, refilling once every
 * warp had left the stage, or whichever warp left it last. With the norms
 * taken too they gave Qwen3-8B batch 1 4.5-5.3 % but lost 8-12 % at batch
 * 8 on an H100: docs/perf.md.)
 *
 * Arithmetic: a warp reads from the stage exactly the vectors
 * gemv_tile_warp would have copied for it (k-steps warp, warp +
 * GEMV_WARPS, ... of GEMV_KSTEP values), feeds the same mmas in the same
 * order, and the block sums the warps' partial tiles in warp order: every
 * output has the bits gemv_kernel gives it (the lab checks this bit for
 * bit), so a row of x still gets the same bits for every T up to
 * CUDA_GEMV_MAX_T, whichever kernel a T takes.
 *
 * A launch that norms its row (cuda_gemv_norm.cuh) has its consumer warps
 * norm it (block_reduce over their threads, at named barrier 1) while the
 * producer streams: the producer never waits on the norm, so the first
 * stages land while the row is normed.
 *
 * A launch of any other x may stage it (XS; cuda_gemv.cu decides): its
 * consumer warps copy x's rows into shared memory first, rounded to bf16
 * as the mma takes them (the same bits), GEMV_BULK_XS_LD(K) values a row,
 * and read it from there. Read from global memory, x is a load a warp
 * every stage, and a load that misses L1 waits behind the block's own
 * stream: on an H200, ncu put 58 % of the warps' stall cycles on such
 * loads (4096 -> 12288 at one row), and staging x gained Qwen3-8B batch 1
 * 2.2 % (docs/perf.md). A launch whose blocks stream only a few stages
 * loses by it: the copy is one more round trip before the first mma.
 *
 * Before griddepcontrol.wait (cuda_pdl.cuh) a block reads only w: the
 * producer reads nothing else and does not wait for the kernel before, so
 * its first stages (a ring of them) are asked for while that kernel may
 * still run.
 *
 * Shared memory (dynamic): the normed row when the launch norms it (K bf16
 * values at offset 0, where gemv_norm_row_smem has it) or the staged x,
 * the ring, the consumer warps' partial tiles of two tiles (a tile's sum
 * is read while the next tile's partials are written) and the stages'
 * barriers.
 */
#ifndef ATLAS_KERNELS_CUDA_GEMV_BULK_CUH
#define ATLAS_KERNELS_CUDA_GEMV_BULK_CUH

#include <stddef.h>
#include <stdint.h>

#include "kernels/cuda/cuda_bulk.cuh"
#include "kernels/cuda/cuda_gemv_kernel.cuh"

/* Ring depth: 4 stages of 16.5 KB, two blocks a multiprocessor (76 KB
 * each). On an H100, one block a multiprocessor with 6 stages lost 30 % at
 * Qwen3-8B batch 1 in the engine, and 6 or 8 stages read at about half the
 * rate in the lab (dev/cuda/README.md), for a reason not found.
 *
 * A launch of an unnormed x whose blocks each stream more than
 * GEMV_BULK_STAGES stages, and which does not stage x, takes the deep ring
 * instead (cuda_gemv.cu): 6 stages, still two blocks a multiprocessor.
 * Under PDL in the lab (an H100, 2026-11-28), 6 stages read the Qwen3-8B
 * shapes at one row up to 9 % faster than 4 and the 0.6B lm_head 12 %
 * faster, but the 0.6B
 * products of K = 1,024 into 2,048 and 3,072 rows 10-17 % slower (a block
 * streams 1-3 stages there). In the engine (docs/perf.md) batch 8 gained 2
 * % on both models; batch 1 did not gain, and a normed row's launches with
 * 5 stages (the most that two blocks of the widest normed row fit) lost
 * 0.9 % at Qwen3-8B batch 1: they keep 4. */
#define GEMV_BULK_STAGES 4
#define GEMV_BULK_DEEP_STAGES 6
#define GEMV_BULK_BLOCKS_PER_SM 2
#define GEMV_BULK_PITCH (GEMV_KBLOCK * 2 + 64)
#define GEMV_BULK_STAGE (8 * GEMV_BULK_PITCH)

/* Threads of a block: the consumer warps and the producer warp. */
#define GEMV_BULK_THREADS ((GEMV_WARPS + 1) * 32)

/* Staged x (above): the most bytes of its rows (one row up to K = 19,424,
 * 8 rows up to K = 2,400), and their stride in values. 32 values past K put
 * the rows' 64-byte runs that a quarter of a warp reads (4 lanes of rows g
 * and g + 1) in other banks. With the shallow ring, two blocks still fit a
 * multiprocessor (the assert below). */
#define GEMV_BULK_XS_MAX (38 * 1024)
#define GEMV_BULK_XS_LD(K) ((K) + 32)

/* Bytes of x a block holds before its ring: the normed row, or staged x. */
__host__ __device__ static constexpr size_t gemv_bulk_norm_bytes(int K)
{
	return (size_t)K * 2;
}

__host__ __device__ static constexpr size_t gemv_bulk_xs_bytes(int T, int K)
{
	return (size_t)T * GEMV_BULK_XS_LD(K) * 2;
}

/* Where the ring starts in dynamic shared memory, after xbytes of x. */
__host__ __device__ static constexpr size_t gemv_bulk_ring_offset(size_t xbytes)
{
	return (xbytes + 127) / 128 * 128;
}

/* Dynamic shared memory of a launch of S stages (the kernel lab tries others). */
static constexpr size_t gemv_bulk_smem(size_t xbytes, int S = GEMV_BULK_STAGES)
{
	return gemv_bulk_ring_offset(xbytes) + (size_t)S * GEMV_BULK_STAGE +
	       2 * GEMV_WARPS * 128 * sizeof(float) + 2 * S * sizeof(uint64_t);
}

/* The deep ring's stages for an x of type XT (a gemv_xs, a normed row,
 * keeps the shallow ring). */
template <typename XT>
static constexpr int gemv_bulk_deep_stages()
{
	return is_gemv_xs<XT>::value ? GEMV_BULK_STAGES : GEMV_BULK_DEEP_STAGES;
}

static_assert(GEMV_BULK_BLOCKS_PER_SM * (gemv_bulk_smem(0, GEMV_BULK_DEEP_STAGES) + 1024) <=
		      228 * 1024,
	      "two blocks of the deep ring fit a Hopper multiprocessor (1 KB reserved a block)");
static_assert(GEMV_BULK_BLOCKS_PER_SM * (gemv_bulk_smem(GEMV_BULK_XS_MAX) + 1024) <= 228 * 1024,
	      "two blocks of the shallow ring and staged x fit a Hopper multiprocessor");

/* The block's loop over its tiles. Tiles: a policy with
 *   int tiles;                                   tiles of the launch
 *   const __nv_bfloat16 *row(int t, int j);     row j of tile t, NULL past w
 *   void store(int t, int i, float s, part);     output i (< 128) of tile t:
 *       s is the warps' sum of element i, part the tile's partials (part[v][e]
 *       is element e of warp v), for outputs that read another element;
 * the element layout is gemv_tile_warp's at NT = 1: element i = c·32 + lane
 * is accumulator c of lane `lane` (token (lane >> 2) + 8·(c >= 2), row
 * 2·(lane & 3) + (c & 1) of the tile). Every thread of the block
 * (GEMV_BULK_THREADS) calls it; after_wait runs on the consumer warps right
 * after the wait, before x is read (as in gemv_tile_warp), and may make x
 * in shared memory; x: T rows ldx values apart; xbytes: the bytes of x in
 * shared memory (the ring starts after them). */
template <int S, typename XT, typename Tiles, typename H>
__device__ __forceinline__ void gemv_bulk_run(const Tiles &tl, unsigned char *mem, int K,
					      const XT *x, int T, int ldx, size_t xbytes,
					      const H &after_wait)
{
	unsigned char *base = mem + gemv_bulk_ring_offset(xbytes);
	float(*part)[GEMV_WARPS][128] = (float(*)[GEMV_WARPS][128])(base + S * GEMV_BULK_STAGE);
	const uint32_t ring = smem_addr(base);
	const uint32_t full = smem_addr(&part[2][0][0]), empty = full + 8 * S;
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
	const int kw = warp * GEMV_KSTEP + 8 * (lane & 3);
	const int nkb = (K + GEMV_KBLOCK - 1) / GEMV_KBLOCK;
	const int G = (int)gridDim.x, b = (int)blockIdx.x;
	const int owned = b < tl.tiles ? (tl.tiles - b + G - 1) / G : 0; /* tiles b + i·G */

	if (threadIdx.x == 0) {
		for (int s = 0; s < S; s++) {
			mbar_init(full + 8 * s, 1);
			mbar_init(empty + 8 * s, GEMV_WARPS);
		}
		mbar_fence_init();
	}
	__syncthreads();
	if (warp == GEMV_WARPS) {
		/* the producer: stage `it` is tile b + (it / nkb)·G, k-block it % nkb */
		const int its = owned * nkb;

		if (lane == 0)
			for (int it = 0; it < its; it++) {
				const int s = it % S, t = b + it / nkb * G, k0 = it % nkb * GEMV_KBLOCK;
				const unsigned bytes = (unsigned)min(GEMV_KBLOCK, K - k0) * 2;
				const __nv_bfloat16 *src[8];
				unsigned rows = 0;

#pragma unroll
				for (int j = 0; j < 8; j++) {
					src[j] = tl.row(t, j);
					rows += src[j] != NULL;
				}
				if (it >= S)
					mbar_wait(empty + 8 * s, (unsigned)(it / S - 1) & 1);
				mbar_arrive_expect(full + 8 * s, rows * bytes);
#pragma unroll
				for (int j = 0; j < 8; j++)
					if (src[j])
						bulk_copy(ring + s * GEMV_BULK_STAGE + j * GEMV_BULK_PITCH,
							  src[j] + k0, bytes, full + 8 * s);
			}
		return;
	}
	pdl_wait();
	pdl_launch_dependents();
	after_wait();

	const bool xok[1] = { g < T };
	const XT *const xr[1] = { x + (int64_t)(xok[0] ? g : 0) * ldx };
	int it = 0;

	for (int i = 0; i < owned; i++) {
		const int t = b + i * G;
		float acc[4] = { 0.0f, 0.0f, 0.0f, 0.0f };

		for (int kb = 0; kb < nkb; kb++, it++) {
			const int s = it % S, k0 = kb * GEMV_KBLOCK + kw;
			/* gemv_tile_warp's vectors of this warp in this k-block */
			const bool mine = kb * GEMV_KBLOCK + warp * GEMV_KSTEP < K;
			gemv_x<XT> xn[GEMV_U];

			if (mine)
#pragma unroll
				for (int u = 0; u < GEMV_U; u++)
					xn[u].load(xr[0], xok[0], k0 + 32 * u, K);
			mbar_wait(full + 8 * s, (unsigned)(it / S) & 1);
			if (mine)
#pragma unroll
				for (int u = 0; u < GEMV_U; u++) {
					uint4 wv = make_uint4(0u, 0u, 0u, 0u);
					uint32_t xa[4];

					if (k0 + 32 * u < K)
						wv = lds128(ring + s * GEMV_BULK_STAGE + g * GEMV_BULK_PITCH +
							    (kw + 32 * u) * 2);
					xn[u].pack(xa);
#pragma unroll
					for (int h = 0; h < 2; h++) {
						const uint32_t a[4] = { xa[2 * h], 0u, xa[2 * h + 1], 0u };

						mma_16816(acc, a, h ? wv.z : wv.x, h ? wv.w : wv.y);
					}
				}
			__syncwarp();
			if (lane == 0)
				mbar_arrive(empty + 8 * s);
		}
#pragma unroll
		for (int c = 0; c < 4; c++)
			part[i & 1][warp][c * 32 + lane] = acc[c];
		asm volatile("bar.sync 1, %0;\n" ::"n"(GEMV_WARPS * 32) : "memory");
		if (threadIdx.x < 128) {
			float sum = 0.0f;

#pragma unroll
			for (int v = 0; v < GEMV_WARPS; v++)
				sum += part[i & 1][v][threadIdx.x];
			tl.store(t, (int)threadIdx.x, sum, part[i & 1]);
		}
	}
}

/* Tiles of the weights of one x (gemv_parts): part i's tiles after those
 * of the parts before it. */
template <typename B>
struct gemv_bulk_parts {
	const gemv_parts<B> &p;
	int K, T;
	int tiles;

	__device__ __forceinline__ const __nv_bfloat16 *row(int t, int j) const
	{
		const int i = gemv_part_of(p, t);
		const int64_t r = (int64_t)t * 8 + j;

		return r < p.N[i] ? p.w[i] + r * K : NULL;
	}
	__device__ __forceinline__ void store(int t, int e, float s,
					      const float (&)[GEMV_WARPS][128]) const
	{
		const int i = gemv_part_of(p, t), l = e % 32, c = e / 32;
		const int tok = (l >> 2) + (c >= 2 ? 8 : 0);
		const int64_t r = (int64_t)t * 8 + 2 * (l & 3) + (c & 1);

		if (tok < T && r < p.N[i]) {
			if (p.bias[i])
				s += widen(p.bias[i][r]);
			p.y[i][(int64_t)tok * p.N[i] + r] = s;
		}
	}
};

/* The consumer warps' hook of a launch that stages x: its T rows of K (f32
 * or bf16 in global memory) into xs, GEMV_BULK_XS_LD(K) values apart, in
 * bf16 as gemv_x packs them for the mma; K a multiple of 8. A thread loads
 * up to 4 vectors of 8 values before it stores any, so their round trips
 * overlap. */
template <typename XT>
struct gemv_bulk_stage_x {
	const XT *x;
	__nv_bfloat16 *xs;
	int T, K;

	__device__ __forceinline__ void operator()() const
	{
		constexpr int THREADS = GEMV_WARPS * 32, U = 4;
		const int n8 = K / 8, n = T * n8;

		for (int i0 = (int)threadIdx.x; i0 < n; i0 += U * THREADS) {
			gemv_x<XT> v[U];

#pragma unroll
			for (int u = 0; u < U; u++) {
				const int i = i0 + u * THREADS;

				v[u].load(x + (int64_t)(i / n8) * K, i < n, i % n8 * 8, K);
			}
#pragma unroll
			for (int u = 0; u < U; u++) {
				const int i = i0 + u * THREADS;
				uint32_t a[4];

				if (i >= n)
					break;
				v[u].pack(a);
				*(uint4 *)(xs + (int64_t)(i / n8) * GEMV_BULK_XS_LD(K) + i % n8 * 8) =
					make_uint4(a[0], a[1], a[2], a[3]);
			}
		}
		asm volatile("bar.sync 1, %0;\n" ::"n"(THREADS) : "memory");
	}
};

/* gemv_bulk_run on x as the launch has it. A normed row (gemv_xs) is made
 * in shared memory by the consumer warps' hook, and the block that counts
 * last stores rmsnorm's x + res; XS: x is staged in shared memory
 * (gemv_bulk_stage_x) and read from there; otherwise x is read as it is. */
template <int S, bool XS, typename XT, typename Tiles>
__device__ __forceinline__ void gemv_bulk_run_x(const Tiles &tl, unsigned char *mem, int K,
						const XT *x, int T, const gemv_norm &norm)
{
	constexpr int NV = is_gemv_xs<XT>::nv, THREADS = GEMV_WARPS * 32;

	if constexpr (is_gemv_xs<XT>::value) {
		unsigned ticket = 0;
		float4 keep[NV];

		gemv_bulk_run<S>(tl, mem, K, (const XT *)gemv_norm_row_smem<NV>(), T, K,
				 gemv_bulk_norm_bytes(K),
				 gemv_norm_hook<NV, THREADS>{ &norm, K, &ticket, &keep });
		if (threadIdx.x < THREADS)
			gemv_norm_finish<NV, THREADS>(norm, K, ticket, keep);
	} else if constexpr (XS) {
		__nv_bfloat16 *xs = (__nv_bfloat16 *)mem;

		gemv_bulk_run<S>(tl, mem, K, (const gemv_xs<1> *)xs, T, GEMV_BULK_XS_LD(K),
				 gemv_bulk_xs_bytes(T, K), gemv_bulk_stage_x<XT>{ x, xs, T, K });
	} else {
		gemv_bulk_run<S>(tl, mem, K, x, T, K, 0, gemv_no_hook());
	}
}

/* gemv_kernel's products (parts.blocks: each part's tiles of 8 rows) at up
 * to 8 rows of x (f32, bf16, or a normed row; XS: staged). */
template <typename XT, typename B, int S = GEMV_BULK_STAGES, bool XS = false>
__global__ void __launch_bounds__(GEMV_BULK_THREADS, GEMV_BULK_BLOCKS_PER_SM)
gemv_bulk_kernel(const __grid_constant__ gemv_parts<B> parts, const XT *__restrict__ x, int T, int K)
{
	extern __shared__ __align__(128) unsigned char gemv_bulk_mem[];
	int tiles = 0;

	for (int i = 0; i < parts.n; i++)
		tiles += parts.blocks[i];

	const gemv_bulk_parts<B> tl = { parts, K, T, tiles };

	gemv_bulk_run_x<S, XS>(tl, gemv_bulk_mem, K, x, T, parts.norm);
}

/* Tiles of a stacked gate/up w [2I, K] for matmul_swiglu: tile t holds gate
 * rows 4t..4t+3 as rows 0-3 and their up rows as rows 4-7, so that element
 * i's up (row j + 4) is element i + 2 (gemv_swiglu_kernel's tile at NT = 1). */
template <typename OT>
struct gemv_bulk_swiglu {
	OT *act;
	const __nv_bfloat16 *w;
	int I, K, T;
	int tiles;

	__device__ __forceinline__ const __nv_bfloat16 *row(int t, int j) const
	{
		const int64_t r = (int64_t)t * 4 + (j & 3);

		return r < I ? w + (r + (j >= 4 ? (int64_t)I : 0)) * K : NULL;
	}
	__device__ __forceinline__ void store(int t, int e, float gi,
					      const float (&part)[GEMV_WARPS][128]) const
	{
		const int l = e % 32, c = e / 32, j = 2 * (l & 3) + (c & 1);
		const int tok = (l >> 2) + (c >= 2 ? 8 : 0);
		const int64_t r = (int64_t)t * 4 + j;

		if (j >= 4 || tok >= T || r >= I)
			return; /* an up element: read with its gate's */
		float u = 0.0f;

#pragma unroll
		for (int v = 0; v < GEMV_WARPS; v++)
			u += part[v][e + 2];
		narrow_to(&act[(int64_t)tok * I + r], gi / (1.0f + expf(-gi)) * u);
	}
};

/* gemv_swiglu_kernel's act = silu(x · gateᵀ) · (x · upᵀ) at up to 8 rows of
 * x (f32, bf16, or a normed row; XS: staged). */
template <typename XT, typename OT, int S = GEMV_BULK_STAGES, bool XS = false>
__global__ void __launch_bounds__(GEMV_BULK_THREADS, GEMV_BULK_BLOCKS_PER_SM)
gemv_bulk_swiglu_kernel(OT *__restrict__ act, const __nv_bfloat16 *__restrict__ w,
			const XT *__restrict__ x, int T, int I, int K, const gemv_norm norm)
{
	extern __shared__ __align__(128) unsigned char gemv_bulk_mem[];
	const gemv_bulk_swiglu<OT> tl = { act, w, I, K, T, (I + 3) / 4 };

	gemv_bulk_run_x<S, XS>(tl, gemv_bulk_mem, K, x, T, norm);
}

#endif
