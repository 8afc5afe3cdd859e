/* Small-batch y = x · wᵀ (+ bias) with bf16 weights: a tensor-core GEMV that
 * reads w once, without the x -> bf16 launch of the cuBLAS path
 * (dev/cuda/gemv_lab.cu and dev/cuda/README.md hold the measurements).
 *
 * Layout: x [T, K] f32 or bf16 (T <= CUDA_GEMV_MAX_T), w [N, K] bf16, y
 * [T, N] f32, bias NULL or [1, N] f32 or bf16.
 *
 * Arithmetic: the function of the cuBLAS path: x rounded to bf16 (here in
 * registers; a bf16 x is loaded as it is, the same bits), bf16 × bf16
 * products exact in f32, f32 accumulation, then + bias. Only the summation
 * order differs.
 *
 * Launch: one grid for one weight or for the products of one x (matmul_n:
 * each weight's blocks after those of the weights before it). A block of
 * GEMV_WARPS warps owns a tile of 8·NT rows of one w; warp v
 * takes the k-steps v, v + GEMV_WARPS, ... of GEMV_KSTEP values. A lane
 * (g, q) = (lane / 4, lane % 4) handles row g of each n-tile: per 16-byte
 * vector, 8 values of w at k = step + 32·j + 8·q (j < GEMV_U) and the 8
 * matching values of x for tokens g (and g + 8). w reaches the lane through
 * a ring of D = 8 / NT vectors in shared memory filled by cp.async, D - 1
 * vectors ahead (4 KB a warp in flight, whatever the register allocation);
 * x is loaded one vector ahead. An mma.sync m16n8k16 takes tokens as M and
 * rows of w as N; a lane's 8 values feed two mmas whose k order is a
 * permutation of the loaded order, the same for x and w (A and B fragments
 * hold a lane's k pairs {2q, 2q+1} and {2q+8, 2q+9}: physical 8q..8q+3 for
 * the first mma, 8q+4..8q+7 for the second), so no shuffle is needed. The
 * ring is private to its warp and a lane reads back only what it copied, so
 * the only barrier is the one before the warps' partial tiles are summed in
 * shared memory, in warp order, before the bias.
 *
 * Determinism: every output's order of operations depends on K alone: the
 * k-steps of a warp, the mmas of a vector, the warp sum and the bias come in
 * the same order whatever T, NT or the other rows are, and an mma's element
 * (token, row) depends only on that token's x and that row's w. A row of x
 * therefore gets the same bits for every T up to CUDA_GEMV_MAX_T.
 *
 * matmul_swiglu's GEMV (gemv_swiglu_kernel) tiles a stacked gate/up weight
 * so that a row's gate and up land in one block, and writes silu(gate) · up
 * instead of both: the same per-output arithmetic, then swiglu's.
 *
 * A product whose x is the out of a pending rmsnorm_product (one row)
 * takes that norm (cuda_gemv_norm.cuh) when it has at most
 * GEMV_NORM_MAX_BLOCKS blocks (as that cap counts them): its blocks norm
 * the row themselves, and the rmsnorm launch is gone. The entry points below
 * therefore expect only cu_keep_norm() of their callers, and call
 * cu_enter() themselves when they do not take it. Such a launch on
 * gemv_kernel takes 16 rows a block (NT = 2), as matmul_swiglu's normed
 * launch does: at NT = 1, Qwen3-0.6B's q/k/v are 512 blocks, four on most
 * multiprocessors, which leave 8,192 of its registers and 83 KB of shared
 * memory, less than a decode CTA's 23,552 and 108 KB. The attention's CTAs
 * were placed only as those blocks left (1.6 us from its first CTA to its
 * last, 0.16 us at NT = 2), o_proj after it late too, and batch 1 ran 2.5 %
 * slower on an H200 (docs/perf.md).
 *
 * On Hopper, products of up to 8 rows run the bulk GEMV instead
 * (cuda_gemv_bulk.cuh): a persistent grid streaming w through a ring of
 * bulk copies, with the arithmetic of the kernels here, output for output,
 * so that the kernel a T takes never changes a bit. It takes a pending
 * norm of any number of tiles (its blocks norm the row once each, a grid
 * of two a multiprocessor), except at K of one k-block (bulk_takes) where
 * gemv_kernel takes it (up to GEMV_NORM_MAX_BLOCKS blocks), and
 * matmul_swiglu's SwiGLU at any I. A product of GEMV_WIDE_ROWS rows or
 * more (an lm_head) stays on gemv_kernel, its norm launched apart. A
 * launch of an unnormed x whose blocks each stream more stages than its
 * ring of 4 holds (bulk_deep) stages x in shared memory where its rows fit
 * (bulk_stages_x), and otherwise gets a ring of 6.
 *
 * Before griddepcontrol.wait (cuda_pdl.cuh) a block reads only w.
 */
#include <type_traits>

#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_gemv.h"
#include "kernels/cuda/cuda_gemv_bulk.cuh"
#include "kernels/cuda/cuda_gemv_kernel.cuh"
#include "kernels/cuda/cuda_gemv_tile.cuh"
#include "kernels/cuda/cuda_impl.h"

/* Dynamic shared memory of a launch: the normed row's, when it norms it. */
template <typename XT>
static size_t gemv_dyn_smem(int K)
{
	return is_gemv_xs<XT>::value ? (size_t)K * sizeof(__nv_bfloat16) : 0;
}

/* f(x) with x a null const gemv_xs<NV> *, NV the fewest vectors a thread
 * that hold a row of K (at most GEMV_NORM_MAX_K): the launch of a normed row. */
template <typename F>
static auto with_norm_row(int K, F f)
{
	static_assert(5 * 4 * CUDA_THREADS >= GEMV_NORM_MAX_K, "5 vectors a thread hold a row");
	if (K <= 1 * 4 * CUDA_THREADS)
		return f((const gemv_xs<1> *)NULL);
	if (K <= 2 * 4 * CUDA_THREADS)
		return f((const gemv_xs<2> *)NULL);
	if (K <= 4 * 4 * CUDA_THREADS)
		return f((const gemv_xs<4> *)NULL);
	return f((const gemv_xs<5> *)NULL);
}

/* Blocks of a launch of these parts at NT. */
template <typename B>
static int64_t gemv_blocks(const gemv_parts<B> &parts, int NT)
{
	int64_t blocks = 0;

	for (int i = 0; i < parts.n; i++)
		blocks += (parts.N[i] + 8 * NT - 1) / (8 * NT);
	return blocks;
}

/* The most blocks of a launch that takes a pending norm, each block norming
 * the row again before its products: the blocks past those the GPU holds
 * at once do it on the launch's critical path. Counted as tiles of 8 rows
 * of w for matmul and matmul_n (a block takes two at NT = 2; the cap
 * kept its count, where it was measured and tested: the op case of N =
 * 8,200), and of 8 gate rows for matmul_swiglu. Qwen3-8B's q/k/v (768
 * tiles) take it, +1 % at batch 1 on an H100; with its gate/up product
 * (3,072) too, 1.6 % below that in the same call (docs/perf.md). */
#define GEMV_NORM_MAX_BLOCKS 1024

template <int NT, int TT, typename XT, typename B>
static int launch_tt(struct cuda_backend *cu, gemv_parts<B> parts, const XT *x, int T, int K)
{
	unsigned blocks = 0;

	for (int i = 0; i < parts.n; i++) {
		parts.blocks[i] = (parts.N[i] + 8 * NT - 1) / (8 * NT);
		blocks += (unsigned)parts.blocks[i];
	}
	cu_launch(cu->pdl, gemv_kernel<NT, TT, XT, B>, blocks, GEMV_WARPS * 32, gemv_dyn_smem<XT>(K),
		  cu->stream, parts, x, T, K);
	CU_LAUNCHED();
	return 0;
}

/* The tile shape; it changes the launch, never the arithmetic of an output.
 * Rows of w a block: 8 (NT = 1) keep the most blocks in flight; 16 (NT = 2)
 * read x half as often, which pays above 8 tokens (a full mma token tile)
 * once the rows of all the weights give enough blocks (measured on an H100
 * for one weight: dev/cuda/README.md). */
#define GEMV_NT2_MIN_N 2048

/* Rows of x the bulk GEMV takes (cuda_gemv_bulk.cuh), on a device that has it. */
#define GEMV_BULK_MAX_T 8

/* Rows of w from which a product of up to GEMV_BULK_MAX_T rows of x stays
 * on gemv_kernel, unnormed (a pending norm runs as its own launch first):
 * an lm_head. There one block a tile, launched in order, reads w faster on
 * an H200 than the bulk GEMV's persistent grid (the lab at one row:
 * Qwen3-8B 4096 -> 151936 at 3,971 GB/s against 3,209-3,502; 0.6B 1024 ->
 * 151936 at 3,746 against 3,310-3,397), which pays for the norm's launch:
 * in the engine Qwen3-0.6B batch 1 gained 1.4 %, 8B batch 1 1.0 % and
 * batch 8 1.1 %, 0.6B batch 8 level (docs/perf.md). Below it the bulk GEMV
 * is level or ahead. */
#define GEMV_WIDE_ROWS 65536

/* Such a product of K of one k-block (GEMV_KBLOCK; Qwen3-0.6B's 1,024)
 * takes 16 rows a block (NT = 2): a warp's one k-step of 8 rows is only
 * half the vectors its ring keeps in flight, so at 8 rows a block the GPU
 * asks for half the bytes it could. In the lab on an H200 (1024 -> 151936)
 * 3,980 GB/s at one row against 3,768, 4,008 against 3,519 at 8; at K =
 * 4096 it lost a fifth (3,239 against 4,077), where 8 rows fill the ring
 * over 4 k-steps. Qwen3-0.6B batch 1 +0.8 %, batch 8 +0.9 % (docs/perf.md). */
#define GEMV_WIDE_NT2_MAX_K GEMV_KBLOCK

/* Whether a product of these parts at T rows is that wide. */
template <typename B>
static bool gemv_wide(const gemv_parts<B> &parts, int T)
{
	int64_t rows = 0;

	for (int i = 0; i < parts.n; i++)
		rows += parts.N[i];
	return T <= GEMV_BULK_MAX_T && rows >= GEMV_WIDE_ROWS;
}

/* Whether the bulk GEMV takes a product of T rows of x, normed (x one row
 * that the launch norms, cuda_gemv_norm.cuh) or not. A normed row of K of
 * one k-block (GEMV_KBLOCK) stays on gemv_kernel: at that K a tile is a
 * single stage with little to overlap, and the bulk kernel's consumers norm
 * the row before their first mma (an H100, Qwen3-0.6B at batch 1, whose
 * q/k/v and gate/up are such launches: 1,008 tokens/s with them on the bulk
 * GEMV, 1,049 on gemv_kernel; unnormed, the same K at 8 rows was faster on
 * the bulk GEMV, 6,542 against 6,422; docs/perf.md). */
static bool bulk_takes(const struct cuda_backend *cu, int T, int K, bool normed)
{
	return cu->gemv_bulk_blocks > 0 && T <= GEMV_BULK_MAX_T && (!normed || K > GEMV_KBLOCK);
}

/* The bulk GEMV's grid for a launch of `tiles` tiles: a block a tile, up to
 * the persistent grid. */
static unsigned bulk_grid(const struct cuda_backend *cu, int64_t tiles)
{
	return (unsigned)(tiles < cu->gemv_bulk_blocks ? tiles : cu->gemv_bulk_blocks);
}

/* Whether a bulk launch of an unnormed x of T rows of K that bulk_deep
 * takes stages x in shared memory (cuda_gemv_bulk.cuh says why): its rows
 * fit GEMV_BULK_XS_MAX. Such a launch keeps the shallow ring, beside which
 * they fit. Only long launches stage: on an H200, staging every x that
 * fits lost 1.3 % at Qwen3-0.6B batch 8, whose K = 1,024 products stream
 * 1-2 stages a block; staged only where bulk_deep holds, the same batch
 * gained 1.4 % (lm_head) and Qwen3-8B batch 1 2.2 % (docs/perf.md).
 * Staging changes no arithmetic. */
static bool bulk_stages_x(int T, int K)
{
	return gemv_bulk_xs_bytes(T, K) <= GEMV_BULK_XS_MAX;
}

/* Whether a launch of `tiles` tiles of K takes the bulk GEMV's deep ring
 * (cuda_gemv_bulk.cuh; an unnormed x too wide to stage only): its blocks
 * each stream more stages (their tiles' k-blocks) than the shallow ring
 * holds. The depth changes no arithmetic. */
static bool bulk_deep(const struct cuda_backend *cu, int64_t tiles, int K)
{
	const int64_t grid = bulk_grid(cu, tiles);

	return (tiles + grid - 1) / grid * ((K + GEMV_KBLOCK - 1) / GEMV_KBLOCK) > GEMV_BULK_STAGES;
}

/* The bulk GEMV's shared memory for a normed row (NORM) or an x of T rows
 * of K that stages (XS) or not. */
template <bool NORM, bool XS, int S = GEMV_BULK_STAGES>
static size_t bulk_smem(int T, int K)
{
	return gemv_bulk_smem(NORM ? gemv_bulk_norm_bytes(K) : XS ? gemv_bulk_xs_bytes(T, K) : 0, S);
}

template <typename XT, typename B>
static int launch_bulk(struct cuda_backend *cu, gemv_parts<B> parts, const XT *x, int T, int K)
{
	constexpr bool norm = is_gemv_xs<XT>::value;
	constexpr int DEEP = gemv_bulk_deep_stages<XT>();
	const unsigned threads = GEMV_BULK_THREADS;
	int64_t tiles = 0;

	for (int i = 0; i < parts.n; i++) {
		parts.blocks[i] = (parts.N[i] + 7) / 8;
		tiles += parts.blocks[i];
	}
	const unsigned grid = bulk_grid(cu, tiles);
	const bool deep = bulk_deep(cu, tiles, K);

	cu->product_on_bulk = true;
	if constexpr (!norm)
		if (deep && bulk_stages_x(T, K)) {
			cu_launch(cu->pdl, gemv_bulk_kernel<XT, B, GEMV_BULK_STAGES, true>, grid,
				  threads, bulk_smem<norm, true>(T, K), cu->stream, parts, x, T, K);
			CU_LAUNCHED();
			return 0;
		}
	if (deep)
		cu_launch(cu->pdl, gemv_bulk_kernel<XT, B, DEEP>, grid, threads,
			  bulk_smem<norm, false, DEEP>(T, K), cu->stream, parts, x, T, K);
	else
		cu_launch(cu->pdl, gemv_bulk_kernel<XT, B>, grid, threads,
			  bulk_smem<norm, false>(T, K), cu->stream, parts, x, T, K);
	CU_LAUNCHED();
	return 0;
}

template <typename XT, typename B>
static int launch(struct cuda_backend *cu, const gemv_parts<B> &parts, const XT *x, int T, int K)
{
	int64_t rows = 0;

	static_assert(CUDA_GEMV_MAX_T <= 16, "gemv_kernel takes one token tile");
	if (bulk_takes(cu, T, K, is_gemv_xs<XT>::value) && !gemv_wide(parts, T))
		return launch_bulk(cu, parts, x, T, K);
	for (int i = 0; i < parts.n; i++)
		rows += parts.N[i];
	if (T <= 8 && K <= GEMV_WIDE_NT2_MAX_K && gemv_wide(parts, T))
		return launch_tt<2, 8>(cu, parts, x, T, K);
	if (T <= 8)
		return launch_tt<1, 8>(cu, parts, x, T, K);
	if (rows < GEMV_NT2_MIN_N)
		return launch_tt<1, 16>(cu, parts, x, T, K);
	return launch_tt<2, 16>(cu, parts, x, T, K);
}

/* matmul_swiglu at decode sizes: a block takes rows of the gate and the
 * same rows of the up of the stacked w [2I, K] and writes act = silu(g) * u,
 * rounded as swiglu stores it, instead of g and u. NT = 1: one n-tile of 4
 * gate rows over their 4 up rows (8 rows a block, as gemv_kernel<1> has:
 * up to 8 tokens); NT = 2: a tile of 8 gate rows and one of their 8 up rows
 * (as gemv_kernel<2>: above 8 tokens). Which rows share a tile changes no
 * output's arithmetic (the top of this file), so act has the bits of the
 * product and swiglu apart. In a tile's layout (gemv_tile_warp) weight row
 * j of element i is 2·(i % 4) + (i / 32 % 2) of its n-tile: with NT = 1,
 * the up of element i (j < 4) is element i + 2; with NT = 2, element i +
 * 128 (the second n-tile). */
template <int NT, int TT, typename XT, typename OT>
__device__ __forceinline__ void gemv_swiglu_body(OT *__restrict__ act,
						 const __nv_bfloat16 *__restrict__ w,
						 const XT *__restrict__ x, int T, int I, int K,
						 const gemv_norm &norm)
{
	constexpr int HALVES = TT / 8, D = GEMV_RING_VECTORS / NT, E = NT * 4 * 32;
	constexpr int ROWS = NT == 1 ? 4 : 8; /* gate rows a block */
	__shared__ __align__(16) uint4 ring[GEMV_WARPS][D][NT][32];
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
	const int64_t n0 = (int64_t)blockIdx.x * ROWS;
	const __nv_bfloat16 *wr[NT];
	const XT *xr[HALVES];
	bool wok[NT], xok[HALVES];

#pragma unroll
	for (int nt = 0; nt < NT; nt++) {
		/* lane row g of n-tile nt: gate or up, and which of their rows */
		const bool up = NT == 1 ? g >= 4 : nt == 1;
		const int64_t r = n0 + (NT == 1 ? (g & 3) : g);

		wok[nt] = r < I;
		wr[nt] = w + (wok[nt] ? r + (up ? (int64_t)I : 0) : 0) * K;
	}
	unsigned ticket = 0;
	float4 keep[is_gemv_xs<XT>::nv];

	gemv_rows_of<HALVES>(x, T, K, g, xr, xok);
	if constexpr (is_gemv_xs<XT>::value)
		gemv_tile_warp<NT, HALVES>(ring, warp, lane, w, wr, wok, xr, xok, K,
					   gemv_norm_hook<is_gemv_xs<XT>::nv>{ &norm, K, &ticket, &keep });
	else
		gemv_tile_warp<NT, HALVES>(ring, warp, lane, w, wr, wok, xr, xok, K);
	__syncthreads();
	for (int i = threadIdx.x; i < E; i += blockDim.x) {
		const int l = i % 32, c = i / 32 % 4, j = 2 * (l & 3) + (c & 1);
		const int t = (l >> 2) + (c >= 2 ? 8 : 0);
		const int64_t r = n0 + j;

		if (i >= 128 || (NT == 1 && j >= 4))
			continue; /* an up element: read with its gate's */
		if (t < T && r < I) {
			const float gi = gemv_tile_sum<NT>(ring, i);
			const float u = gemv_tile_sum<NT>(ring, NT == 1 ? i + 2 : i + 128);

			narrow_to(&act[(int64_t)t * I + r], gi / (1.0f + expf(-gi)) * u);
		}
	}
	if constexpr (is_gemv_xs<XT>::value)
		gemv_norm_finish<is_gemv_xs<XT>::nv>(norm, K, ticket, keep);
}

template <int NT, int TT, typename XT, typename OT>
__global__ void __launch_bounds__(GEMV_WARPS * 32, GEMV_MIN_BLOCKS(XT))
gemv_swiglu_kernel(OT *__restrict__ act, const __nv_bfloat16 *__restrict__ w,
		   const XT *__restrict__ x, int T, int I, int K, const gemv_norm norm)
{
	gemv_swiglu_body<NT, TT>(act, w, x, T, I, K, norm);
}

/* Registers a thread of the normed swiglu GEMV of a row of one vector a
 * thread (K <= 1,024: Qwen3-0.6B's gate/up, the only normed swiglu left on
 * this kernel on Hopper) may take. A multiprocessor's registers are split
 * between its 4 schedulers, 16,384 each; a block of 8 warps puts 2 on
 * each, and a bulk GEMV block (9 warps at 56: o_proj before this launch,
 * down after it) puts 3, 5,376 registers, on one. Beside such a block,
 * three blocks of this launch fit at 56 registers (16,128 in all) and not
 * at the 64 of GEMV_MIN_BLOCKS (17,664); Qwen3-0.6B's 384 blocks are
 * about three a multiprocessor. On an H200 at batch 1: +3.4 % tokens/s;
 * the stamps put the time in the swiglu after its PDL wait (4.5 -> 4.2 us)
 * and in o_proj (2.2 -> 2.1), not in down, placed as late as before
 * (docs/perf.md). ptxas fits the kernel in 56 without spills (sm_90a,
 * CUDA 13). */
#define GEMV_SWIGLU_NORM_REGS 56

/* gemv_swiglu_kernel's body in GEMV_SWIGLU_NORM_REGS registers
 * (__maxnreg__, which a kernel cannot have beside __launch_bounds__). */
template <int NT, int TT, typename XT, typename OT>
__global__ void __maxnreg__(GEMV_SWIGLU_NORM_REGS)
gemv_swiglu_norm_kernel(OT *__restrict__ act, const __nv_bfloat16 *__restrict__ w,
			const XT *__restrict__ x, int T, int I, int K, const gemv_norm norm)
{
	gemv_swiglu_body<NT, TT>(act, w, x, T, I, K, norm);
}

template <int NT, int TT, typename XT, typename OT>
static void launch_swiglu_tt(struct cuda_backend *cu, OT *act, const __nv_bfloat16 *w,
			     const XT *x, int T, int I, int K, const gemv_norm &norm)
{
	constexpr int ROWS = NT == 1 ? 4 : 8;
	const unsigned grid = (unsigned)((I + ROWS - 1) / ROWS);

	if constexpr (is_gemv_xs<XT>::value && is_gemv_xs<XT>::nv == 1)
		cu_launch(cu->pdl, gemv_swiglu_norm_kernel<NT, TT, XT, OT>, grid, GEMV_WARPS * 32,
			  gemv_dyn_smem<XT>(K), cu->stream, act, w, x, T, I, K, norm);
	else
		cu_launch(cu->pdl, gemv_swiglu_kernel<NT, TT, XT, OT>, grid, GEMV_WARPS * 32,
			  gemv_dyn_smem<XT>(K), cu->stream, act, w, x, T, I, K, norm);
}

/* The tiles of gemv_kernel's choice for the same T (launch() below). A
 * normed row (one row) takes the tile of 8 gate rows, half the blocks of
 * the tile of 4: each block norms the row again first, and at Qwen3-0.6B's
 * I = 3072 the 384 blocks fit the GPU at once where 768 took a second wave
 * (an H100, Qwen3-0.6B at batch 1: +5 % tokens/s with the tile of 8,
 * -2 % with the tile of 4; docs/perf.md). */
template <typename XT, typename OT>
static void launch_swiglu(struct cuda_backend *cu, OT *act, const __nv_bfloat16 *w, const XT *x,
			  int T, int I, int K, const gemv_norm &norm)
{
	constexpr int DEEP = gemv_bulk_deep_stages<XT>();
	constexpr bool normed = is_gemv_xs<XT>::value;
	const int tiles = (I + 3) / 4; /* the bulk GEMV's: 4 gate rows and their up rows */
	const bool bulk = bulk_takes(cu, T, K, normed), deep = bulk && bulk_deep(cu, tiles, K);
	const unsigned grid = bulk_grid(cu, tiles), threads = GEMV_BULK_THREADS;

	cu->product_on_bulk = bulk;

	if constexpr (!normed)
		if (deep && bulk_stages_x(T, K)) {
			cu_launch(cu->pdl, gemv_bulk_swiglu_kernel<XT, OT, GEMV_BULK_STAGES, true>,
				  grid, threads, bulk_smem<normed, true>(T, K), cu->stream, act, w, x,
				  T, I, K, norm);
			return;
		}
	if (deep)
		cu_launch(cu->pdl, gemv_bulk_swiglu_kernel<XT, OT, DEEP>, grid, threads,
			  bulk_smem<normed, false, DEEP>(T, K), cu->stream, act, w, x, T, I, K, norm);
	else if (bulk)
		cu_launch(cu->pdl, gemv_bulk_swiglu_kernel<XT, OT>, grid, threads,
			  bulk_smem<normed, false>(T, K), cu->stream, act, w, x, T, I, K, norm);
	else if constexpr (normed)
		launch_swiglu_tt<2, 8>(cu, act, w, x, T, I, K, norm);
	else if (T <= 8)
		launch_swiglu_tt<1, 8>(cu, act, w, x, T, I, K, norm);
	else
		launch_swiglu_tt<2, 16>(cu, act, w, x, T, I, K, norm);
}

template <typename XT>
static void launch_swiglu(struct cuda_backend *cu, const struct kt_tensor *act,
			  const __nv_bfloat16 *w, const XT *x, int T, int I, int K,
			  const gemv_norm &norm)
{
	if (act->dtype == KT_BF16)
		launch_swiglu(cu, (__nv_bfloat16 *)act->data, w, x, T, I, K, norm);
	else
		launch_swiglu(cu, (float *)act->data, w, x, T, I, K, norm);
}

int cuda_gemv_swiglu(struct cuda_backend *cu, const struct kt_tensor *act,
		     const struct kt_tensor *x, const struct kt_tensor *w)
{
	const int T = (int)x->rows, I = (int)(w->rows / 2), K = (int)x->cols;
	const __nv_bfloat16 *wd = (const __nv_bfloat16 *)w->data;
	gemv_norm norm = {};

	/* a normed row takes the tile of 8 gate rows: I / 8 blocks */
	if ((bulk_takes(cu, T, K, true) || (I + 7) / 8 <= GEMV_NORM_MAX_BLOCKS) &&
	    cuda_norm_take(cu, x, &norm)) {
		with_norm_row(K, [&](auto xs) { launch_swiglu(cu, act, wd, xs, T, I, K, norm); });
		CU_LAUNCHED();
		return 0;
	}
	CU_CHECK(cu_enter(cu));
	if (x->dtype == KT_BF16)
		launch_swiglu(cu, act, wd, (const __nv_bfloat16 *)x->data, T, I, K, norm);
	else
		launch_swiglu(cu, act, wd, (const float *)x->data, T, I, K, norm);
	CU_LAUNCHED();
	return 0;
}

bool cuda_gemv_takes(const struct kt_tensor *x, const struct kt_tensor *w)
{
	return w->dtype == KT_BF16 && x->rows >= 1 && x->rows <= CUDA_GEMV_MAX_T &&
	       x->cols % 8 == 0 && ((uintptr_t)x->data % 16) == 0 &&
	       ((uintptr_t)w->data % 16) == 0;
}

bool cuda_gemv_on_bulk(const struct cuda_backend *cu, const struct kt_tensor *x)
{
	return bulk_takes(cu, (int)x->rows, (int)x->cols, false);
}

template <typename B>
static int launch_bias(struct cuda_backend *cu, int n, const struct kt_tensor *const *ys,
		       const struct kt_tensor *x, const struct kt_tensor *const *ws,
		       const struct kt_tensor *const *biases)
{
	gemv_parts<B> parts = {};
	const int T = (int)x->rows, K = (int)x->cols;

	parts.n = n;
	for (int i = 0; i < n; i++) {
		parts.y[i] = (float *)ys[i]->data;
		parts.w[i] = (const __nv_bfloat16 *)ws[i]->data;
		parts.bias[i] = biases && biases[i] ? (const B *)biases[i]->data : NULL;
		parts.N[i] = (int)ws[i]->rows;
	}
	const bool wide = gemv_wide(parts, T);

	if (!wide && bulk_takes(cu, T, K, true) && cuda_norm_take(cu, x, &parts.norm))
		return with_norm_row(K, [&](auto xs) { return launch_bulk(cu, parts, xs, T, K); });
	if (gemv_blocks(parts, 1) <= GEMV_NORM_MAX_BLOCKS && cuda_norm_take(cu, x, &parts.norm))
		return with_norm_row(K, [&](auto xs) { return launch_tt<2, 8>(cu, parts, xs, T, K); });
	CU_CHECK(cu_enter(cu));
	if (x->dtype == KT_BF16)
		return launch(cu, parts, (const __nv_bfloat16 *)x->data, T, K);
	return launch(cu, parts, (const float *)x->data, T, K);
}

/* The biases' one dtype (f32 when there are none); -1 when they mix. */
static int bias_dtype(int n, const struct kt_tensor *const *biases)
{
	int dt = -1;

	for (int i = 0; i < n; i++)
		if (biases && biases[i]) {
			if (dt >= 0 && dt != (int)biases[i]->dtype)
				return -1;
			dt = (int)biases[i]->dtype;
		}
	return dt < 0 ? (int)KT_F32 : dt;
}

bool cuda_gemv_n_takes(int n, const struct kt_tensor *x, const struct kt_tensor *const *ws,
		       const struct kt_tensor *const *biases)
{
	if (n < 1 || n > KT_MATMUL_MAX_N || bias_dtype(n, biases) < 0)
		return false;
	for (int i = 0; i < n; i++)
		if (!cuda_gemv_takes(x, ws[i]))
			return false;
	return true;
}

int cuda_gemv_n(struct cuda_backend *cu, int n, const struct kt_tensor *const *ys,
		const struct kt_tensor *x, const struct kt_tensor *const *ws,
		const struct kt_tensor *const *biases)
{
	if (bias_dtype(n, biases) == KT_BF16)
		return launch_bias<__nv_bfloat16>(cu, n, ys, x, ws, biases);
	return launch_bias<float>(cu, n, ys, x, ws, biases);
}

int cuda_gemv(struct cuda_backend *cu, const struct kt_tensor *y, const struct kt_tensor *x,
	      const struct kt_tensor *w, const struct kt_tensor *bias)
{
	return cuda_gemv_n(cu, 1, &y, x, &w, &bias);
}

/* The shared memory of every bulk GEMV kernel (f32, bf16 and normed x,
 * staged or not, each bias and act dtype, either ring) above the 48 KB a
 * launch has without opting in. */
template <typename XT, int S, bool XS = false>
static int bulk_setup_ring(void)
{
	const size_t xbytes = is_gemv_xs<XT>::value ? gemv_bulk_norm_bytes(GEMV_NORM_MAX_K)
				: XS			 ? (size_t)GEMV_BULK_XS_MAX
							 : 0;
	const int bytes = (int)gemv_bulk_smem(xbytes, S);

	CU_CHECK(cudaFuncSetAttribute(gemv_bulk_kernel<XT, float, S, XS>,
				      cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
	CU_CHECK(cudaFuncSetAttribute(gemv_bulk_kernel<XT, __nv_bfloat16, S, XS>,
				      cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
	CU_CHECK(cudaFuncSetAttribute(gemv_bulk_swiglu_kernel<XT, float, S, XS>,
				      cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
	CU_CHECK(cudaFuncSetAttribute(gemv_bulk_swiglu_kernel<XT, __nv_bfloat16, S, XS>,
				      cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
	return 0;
}

template <typename XT>
static int bulk_setup(void)
{
	int rc = bulk_setup_ring<XT, GEMV_BULK_STAGES>();

	if constexpr (!is_gemv_xs<XT>::value)
		rc = rc ? rc : bulk_setup_ring<XT, GEMV_BULK_STAGES, true>();
	if constexpr (gemv_bulk_deep_stages<XT>() != GEMV_BULK_STAGES)
		rc = rc ? rc : bulk_setup_ring<XT, gemv_bulk_deep_stages<XT>()>();
	return rc;
}

int cuda_gemv_open(struct cuda_backend *cu)
{
	int sms = 0, major = 0, rc;

	cu->gemv_bulk_blocks = 0;
	CU_CHECK(cu_device(cu)); /* the attributes below are the current device's */
	CU_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, cu->device));
	if (major < 9)
		return 0;
	CU_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, cu->device));
	if ((rc = bulk_setup<float>()) || (rc = bulk_setup<__nv_bfloat16>()) ||
	    (rc = bulk_setup<gemv_xs<1>>()) || (rc = bulk_setup<gemv_xs<2>>()) ||
	    (rc = bulk_setup<gemv_xs<4>>()) || (rc = bulk_setup<gemv_xs<5>>()))
		return rc;
	cu->gemv_bulk_blocks = sms * GEMV_BULK_BLOCKS_PER_SM;
	return 0;
}
