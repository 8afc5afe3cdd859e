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
 */
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_gemv_tile.cuh"
#include "kernels/cuda/cuda_impl.h"
#include "kernels/cuda/cuda_gemv.h"

/* The weights of one launch: products of one x (matmul_n), or one. Part
 * i has its blocks after those of the parts before it. */
template <typename B>
struct gemv_parts {
	float *y[KT_MATMUL_MAX_N];               /* [T, N_i] */
	const __nv_bfloat16 *w[KT_MATMUL_MAX_N]; /* [N_i, K] */
	const B *bias[KT_MATMUL_MAX_N];          /* [N_i] or NULL */
	int N[KT_MATMUL_MAX_N];
	int blocks[KT_MATMUL_MAX_N];
	int n;
};

/* TT bounds T: 8 (the lower half of one token tile) or 16 (one tile). The
 * explicit 1 block per multiprocessor lets ptxas keep more loads ahead (77
 * registers instead of 62 at TT = 16): 20% faster at 16 tokens on the
 * Qwen3-8B MLP shapes, the same at 8. */
template <int NT, int TT, typename XT, typename B>
__global__ void __launch_bounds__(GEMV_WARPS * 32, 1)
gemv_kernel(const __grid_constant__ gemv_parts<B> parts, const XT *__restrict__ x, int T, int K)
{
	constexpr int HALVES = TT / 8, D = GEMV_RING_VECTORS / NT, E = NT * 4 * 32;
	static_assert(TT == 8 || TT == 16, "one token tile at most");
	static_assert(E <= D * NT * 32 * 4, "a warp's partial tile fits in its ring");
	__shared__ __align__(16) uint4 ring[GEMV_WARPS][D][NT][32];
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
	int part = 0, block = blockIdx.x;

	while (part < parts.n - 1 && block >= parts.blocks[part])
		block -= parts.blocks[part++];

	const __nv_bfloat16 *__restrict__ w = parts.w[part];
	const B *__restrict__ bias = parts.bias[part];
	float *__restrict__ y = parts.y[part];
	const int N = parts.N[part];
	const int64_t n0 = (int64_t)block * 8 * NT;
	const __nv_bfloat16 *wr[NT];
	const XT *xr[HALVES];
	bool wok[NT], xok[HALVES];

#pragma unroll
	for (int nt = 0; nt < NT; nt++) {
		const int64_t r = n0 + nt * 8 + g;

		wok[nt] = r < N;
		wr[nt] = w + (wok[nt] ? r : 0) * K;
	}
#pragma unroll
	for (int h = 0; h < HALVES; h++) {
		xok[h] = h * 8 + g < T;
		xr[h] = x + (int64_t)(xok[h] ? h * 8 + g : 0) * K;
	}
	gemv_tile_warp<NT, HALVES>(ring, warp, lane, w, wr, wok, xr, xok, K);
	__syncthreads();
	for (int i = threadIdx.x; i < E; i += blockDim.x) {
		const int l = i % 32, c = i / 32 % 4, nt = i / 128;
		const int t = (l >> 2) + (c >= 2 ? 8 : 0);
		const int64_t r = n0 + nt * 8 + 2 * (l & 3) + (c & 1);

		if (t < T && r < N) {
			float s = gemv_tile_sum<NT>(ring, i);

			if (bias)
				s += widen(bias[r]);
			y[(int64_t)t * N + r] = s;
		}
	}
}

template <int NT, int TT, typename XT, typename B>
static int launch_tt(struct cuda_backend *cu, gemv_parts<B> parts, const XT *x, int T, int K)
{
	unsigned blocks = 0;

	for (int i = 0; i < parts.n; i++) {
		parts.blocks[i] = (parts.N[i] + 8 * NT - 1) / (8 * NT);
		blocks += (unsigned)parts.blocks[i];
	}
	cu_launch(cu->pdl, gemv_kernel<NT, TT, XT, B>, blocks, GEMV_WARPS * 32, 0, cu->stream,
		  parts, x, T, K);
	CU_LAUNCHED();
	return 0;
}

/* The tile shape; it changes the launch, never the arithmetic of an output.
 * Rows of w a block: 8 (NT = 1) keep the most blocks in flight; 16 (NT = 2)
 * read x half as often, which pays above 8 tokens (a full mma token tile)
 * once the rows of all the weights give enough blocks (measured on an H100
 * for one weight: dev/cuda/README.md). */
#define GEMV_NT2_MIN_N 2048

template <typename XT, typename B>
static int launch(struct cuda_backend *cu, const gemv_parts<B> &parts, const XT *x, int T, int K)
{
	int64_t rows = 0;

	static_assert(CUDA_GEMV_MAX_T <= 16, "gemv_kernel takes one token tile");
	for (int i = 0; i < parts.n; i++)
		rows += parts.N[i];
	if (T <= 8)
		return launch_tt<1, 8>(cu, parts, x, T, K);
	if (rows < GEMV_NT2_MIN_N)
		return launch_tt<1, 16>(cu, parts, x, T, K);
	return launch_tt<2, 16>(cu, parts, x, T, K);
}

bool cuda_gemv_takes(const struct kt_tensor *x, const struct kt_tensor *w)
{
	return w->dtype == KT_BF16 && x->rows >= 1 && x->rows <= CUDA_GEMV_MAX_T &&
	       x->cols % 8 == 0 && ((uintptr_t)x->data % 16) == 0 &&
	       ((uintptr_t)w->data % 16) == 0;
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
