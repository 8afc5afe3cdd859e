/* skinny_lab: y[T, N] f32 = x[T, K] bf16 · w[N, K]ᵀ, w bf16, for the 17..128
 * rows of decode at batch 17..128, where the product still reads w once and
 * its cost is the weight bytes.
 *
 * Variants, each checked against a host reference in double and timed:
 *  - cublas: the tree's path there (cublasGemmEx, bf16 × bf16, f32 compute
 *    and output, CUBLAS_GEMM_DEFAULT);
 *  - lt: cublasLt's first 16 heuristic algorithms for the shape, each
 *    timed; the best one's time (its index in the heuristic's list is in
 *    the CSV);
 *  - b<BN>t<TM>w<WR>d<ST>[n<NW>]s<S>: the tiled kernel of
 *    skinny_kernels.cuh, BN rows of w a block, a token tile of TM, WR warps
 *    along the rows, ST stages, NW warps (8 if not named), K split S ways;
 *  - x<BN>t<TM>w<WR>d<ST>: its x-stationary kernel, x's k-chunk in shared
 *    memory, P blocks a split (one or two a multiprocessor over all splits).
 *
 * Weights are lab_val of the element index (dev/cuda/lab.cuh; the host
 * recomputes them for the reference); every timed launch reads a different
 * part of a 2 GiB pool so that L2 (50 MB) never holds them. Timing: a CUDA
 * graph of n back-to-back launches, replayed; the median of 8 replays over n.
 *
 * Build: nvcc -O3 -std=c++17 -arch=sm_90a -I. dev/cuda/skinny_lab.cu \
 *            -lcublasLt -lcublas -o /tmp/skinny_lab
 * Run:   /tmp/skinny_lab [csv-file]          every shape, T and variant
 *        /tmp/skinny_lab --one NAME K N T     3 launches of one variant, for a profiler
 */
#include <algorithm>
#include <functional>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <string>
#include <vector>

#include <cublasLt.h>
#include <cublas_v2.h>

#include "dev/cuda/lab.cuh"
#include "dev/cuda/skinny_kernels.cuh"


typedef __nv_bfloat16 bf16;

#define POOL_ELEMS ((uint64_t)1 << 30) /* 2 GiB of bf16 */
#define WS_BYTES ((size_t)32 << 20)
#define MAX_T 128
#define MAX_K 12288
#define MAX_N 24576
#define W_SEED 7 /* weights: lab_val(index, W_SEED) as bf16 */

static cudaStream_t stream;
static cublasHandle_t blas;
static cublasLtHandle_t lt;
static void *blas_ws;
static bf16 *pool, *xb;
static float *partial;
static unsigned *count;
static int sms;

/* ---- a launch of one variant on weights w ---------------------------------- */

typedef std::function<void(float *y, const bf16 *w)> launch_fn;

static launch_fn cublas_launch(int T, int N, int K)
{
	return [=](float *y, const bf16 *w) {
		const float one = 1.0f, zero = 0.0f;

		LAB_BLAS_CHECK(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &one, w,
					    CUDA_R_16BF, K, xb, CUDA_R_16BF, K, &zero, y, CUDA_R_32F,
					    N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
	};
}

struct lt_plan {
	cublasLtMatmulDesc_t op;
	cublasLtMatrixLayout_t a, b, c;
	std::vector<cublasLtMatmulHeuristicResult_t> algos;
};

static lt_plan lt_make(int T, int N, int K)
{
	lt_plan p;
	cublasLtMatmulPreference_t pref;
	const cublasOperation_t tr = CUBLAS_OP_T;
	const size_t ws = WS_BYTES;
	cublasLtMatmulHeuristicResult_t res[16];
	int n = 0;

	LAB_BLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
	LAB_BLAS_CHECK(
		cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &tr, sizeof tr));
	LAB_BLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, K, N, K));
	LAB_BLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, K, T, K));
	LAB_BLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, N, T, N));
	LAB_BLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
	LAB_BLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
		pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
	LAB_BLAS_CHECK(
		cublasLtMatmulAlgoGetHeuristic(lt, p.op, p.a, p.b, p.c, p.c, pref, 16, res, &n));
	p.algos.assign(res, res + n);
	cublasLtMatmulPreferenceDestroy(pref);
	return p;
}

static launch_fn lt_launch(const lt_plan &p, int i)
{
	return [=](float *y, const bf16 *w) {
		const float one = 1.0f, zero = 0.0f;

		LAB_BLAS_CHECK(cublasLtMatmul(lt, p.op, &one, w, p.a, xb, p.b, &zero, y, p.c, y,
					      p.c, &p.algos[i].algo, blas_ws, WS_BYTES, stream));
	};
}

template <int BN, int TM, int WR, int ST, int NW = SKINNY_WARPS>
static launch_fn skinny_launch(int T, int N, int K, int S)
{
	constexpr int smem = skinny_smem_bytes<BN, TM, ST>();

	CHECK(cudaFuncSetAttribute(skinny_kernel<BN, TM, WR, ST, NW>,
				   cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
	return [=](float *y, const bf16 *w) {
		skinny_args a = { y, partial, count, w, xb, T, N, K, S };

		skinny_kernel<BN, TM, WR, ST, NW><<<dim3((N + BN - 1) / BN, S), NW * 32, smem,
						stream>>>(a);
		CHECK_LAUNCH();
	};
}

template <int BN, int TM, int WR, int ST, int KC, int BPS = 1>
static launch_fn skinny_xs_launch(int T, int N, int K, int)
{
	constexpr int smem = skinny_xs_smem_bytes<BN, TM, ST, KC>();
	const int tiles = (N + BN - 1) / BN;
	int S = (K + KC - 1) / KC, P;

	while (K % S || K / S % SKINNY_BK)
		S++;
	P = std::min(tiles, std::max(1, BPS * sms / S));
	CHECK(cudaFuncSetAttribute(skinny_xs_kernel<BN, TM, WR, ST, KC>,
				   cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
	return [=](float *y, const bf16 *w) {
		skinny_xs_args a = { y, partial, count, w, xb, T, N, K, S, P };

		skinny_xs_kernel<BN, TM, WR, ST, KC><<<P * S, SKINNY_WARPS * 32, smem, stream>>>(a);
		CHECK_LAUNCH();
	};
}

struct config {
	int bn, tm, wr, st;
	launch_fn (*make)(int T, int N, int K, int S);
	bool xs; /* x-stationary: S follows from K */
	int nw;  /* warps a block, 0: SKINNY_WARPS */
};

static const config configs[] = {
	{ 64, 32, 4, 4, skinny_launch<64, 32, 4, 4> },   { 64, 32, 4, 8, skinny_launch<64, 32, 4, 8> },
	{ 64, 32, 4, 12, skinny_launch<64, 32, 4, 12> }, { 64, 64, 2, 4, skinny_launch<64, 64, 2, 4> },
	{ 64, 64, 2, 6, skinny_launch<64, 64, 2, 6> },   { 64, 64, 2, 8, skinny_launch<64, 64, 2, 8> },
	{ 32, 64, 2, 8, skinny_launch<32, 64, 2, 8> },   { 32, 64, 2, 12, skinny_launch<32, 64, 2, 12> },
	{ 64, 128, 2, 4, skinny_launch<64, 128, 2, 4> }, { 64, 128, 2, 6, skinny_launch<64, 128, 2, 6> },
	{ 64, 64, 4, 4, skinny_launch<64, 64, 4, 4, 16>, false, 16 },
	{ 64, 64, 4, 8, skinny_launch<64, 64, 4, 8, 16>, false, 16 },
	{ 128, 64, 8, 4, skinny_launch<128, 64, 8, 4, 16>, false, 16 },
	{ 128, 64, 8, 6, skinny_launch<128, 64, 8, 6, 16>, false, 16 },
	{ 128, 32, 8, 8, skinny_launch<128, 32, 8, 8, 16>, false, 16 },
	{ 64, 32, 4, 8, skinny_xs_launch<64, 32, 4, 8, 2048>, true },
	{ 128, 32, 8, 6, skinny_xs_launch<128, 32, 8, 6, 2048>, true },
	{ 64, 64, 2, 8, skinny_xs_launch<64, 64, 2, 8, 1024>, true },
	{ 64, 64, 4, 8, skinny_xs_launch<64, 64, 4, 8, 1024>, true },
	{ 32, 64, 2, 12, skinny_xs_launch<32, 64, 2, 12, 1024>, true },
	{ 128, 64, 4, 6, skinny_xs_launch<128, 64, 4, 6, 1024>, true },
	{ 64, 128, 2, 8, skinny_xs_launch<64, 128, 2, 8, 512>, true },
	{ 128, 128, 4, 6, skinny_xs_launch<128, 128, 4, 6, 512>, true },
	{ 64, 64, 2, 4, skinny_xs_launch<64, 64, 2, 4, 512, 2>, true },
	{ 32, 64, 2, 8, skinny_xs_launch<32, 64, 2, 8, 512, 2>, true },
	{ 64, 32, 4, 4, skinny_xs_launch<64, 32, 4, 4, 1024, 2>, true },
};

/* b<BN>t<TM>w<WR>d<ST>[n<NW>]s<S>, or x<BN>t<TM>w<WR>d<ST> */
static void config_name(char *name, size_t size, const config &c, int S)
{
	if (c.xs)
		snprintf(name, size, "x%dt%dw%dd%d", c.bn, c.tm, c.wr, c.st);
	else if (c.nw)
		snprintf(name, size, "b%dt%dw%dd%dn%ds%d", c.bn, c.tm, c.wr, c.st, c.nw, S);
	else
		snprintf(name, size, "b%dt%dw%dd%ds%d", c.bn, c.tm, c.wr, c.st, S);
}

/* ---- measurement ----------------------------------------------------------------- */

/* Copy bandwidth: bytes read + written per second of a 1 GiB D2D copy. */
static double copy_bandwidth(void)
{
	const size_t bytes = (size_t)1 << 30;
	char *a = (char *)pool, *b = a + bytes;
	const float ms = lab_time(
		[&] { CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream)); }, 6,
		stream);

	lab_fill(pool, POOL_ELEMS, W_SEED); /* the copy scrambled the pool */
	CHECK(cudaDeviceSynchronize());
	return 2.0 * bytes / (ms * 1e-3);
}

/* Seconds a launch: a graph of n launches, each on another part of the pool. */
static double time_launch(const launch_fn &f, float *y, int N, int K)
{
	const uint64_t nk = (uint64_t)N * K, span = POOL_ELEMS - nk;
	const int n = (int)std::min<uint64_t>(128, std::max<uint64_t>(16, (512ull << 20) / (nk * 2)));
	uint64_t i = 0;

	return lab_time_graph_us([&] { f(y, pool + (i++ * nk % span & ~(uint64_t)63)); }, n, 8,
				 stream) * 1e-6;
}

/* The rows a check looks at (the first and last 8, and 48 random ones),
 * their outputs in double from x as rounded, and Σ|x w| of each. */
struct reference {
	std::vector<int> rows;
	std::vector<double> sum, mag; /* [rows][T] */
};

static reference make_reference(const std::vector<float> &x, int T, int N, int K)
{
	reference ref;
	std::vector<float> wr(K);

	for (int i = 0; i < 8 && i < N; i++)
		ref.rows.push_back(i);
	for (int i = std::max(8, N - 8); i < N; i++)
		ref.rows.push_back(i);
	for (int i = 0; i < 48; i++)
		ref.rows.push_back(rand() % N);
	for (int r : ref.rows) {
		for (int k = 0; k < K; k++)
			wr[k] = lab_bf16(lab_val((uint64_t)r * K + k, W_SEED));
		for (int t = 0; t < T; t++) {
			double s = 0.0, m = 0.0;

			for (int k = 0; k < K; k++) {
				const double p = (double)x[(size_t)t * K + k] * wr[k];

				s += p;
				m += fabs(p);
			}
			ref.sum.push_back(s);
			ref.mag.push_back(m);
		}
	}
	return ref;
}

/* Max over the checked outputs of |y - ref| / Σ|x w| (inf for a non-finite
 * y anywhere: y is poisoned before the launch). */
static double check(const launch_fn &f, float *y, std::vector<float> &yh, const reference &ref,
		    int T, int N)
{
	double worst = 0.0;

	CHECK(cudaMemsetAsync(y, 0xff, (size_t)T * N * 4, stream));
	f(y, pool);
	CHECK(cudaMemcpyAsync(yh.data(), y, (size_t)T * N * 4, cudaMemcpyDeviceToHost, stream));
	CHECK(cudaStreamSynchronize(stream));
	for (int64_t i = 0; i < (int64_t)T * N; i++)
		if (!isfinite(yh[i]))
			return INFINITY;
	for (size_t i = 0; i < ref.rows.size(); i++)
		for (int t = 0; t < T; t++) {
			const size_t j = i * T + t;

			worst = std::max(worst, fabs(yh[(size_t)t * N + ref.rows[i]] - ref.sum[j]) /
							ref.mag[j]);
		}
	return worst;
}

struct shape {
	const char *name;
	int K, N;
};

static const shape shapes[] = {
	{ "8b qkv", 4096, 6144 },   { "8b o", 4096, 4096 },    { "8b gate_up", 4096, 24576 },
	{ "8b down", 12288, 4096 }, { "0.6b qkv", 1024, 4096 }, { "0.6b o", 2048, 1024 },
	{ "0.6b gate_up", 1024, 6144 }, { "0.6b down", 3072, 1024 },
};
static const int t_list[] = { 17, 32, 48, 64, 96, 128 };
static const int s_list[] = { 1, 2, 3, 4, 6, 8 };

/* The launch of the variant called name at this shape (empty if none). */
static launch_fn find_variant(const std::string &name, int T, int N, int K)
{
	if (name == "cublas")
		return cublas_launch(T, N, K);
	if (!name.compare(0, 2, "lt")) {
		static lt_plan p;
		const int i = atoi(name.c_str() + 2);

		p = lt_make(T, N, K);
		return i < (int)p.algos.size() ? lt_launch(p, i) : launch_fn();
	}
	for (const config &c : configs)
		for (int S : s_list) {
			char n[64];

			config_name(n, sizeof n, c, S);
			if (name == n && c.tm >= T && !(K % (SKINNY_BK * S)))
				return c.make(T, N, K, S);
		}
	return launch_fn();
}

/* skinny_lab --one NAME K N T: three launches of one variant, for a profiler. */
static int run_one(char **argv, float *y)
{
	const int K = atoi(argv[3]), N = atoi(argv[4]), T = atoi(argv[5]);
	const launch_fn f = find_variant(argv[2], T, N, K);
	std::vector<bf16> xh((size_t)T * K);

	if (!f) {
		fprintf(stderr, "no variant %s for K %d N %d T %d\n", argv[2], K, N, T);
		return 1;
	}
	for (size_t i = 0; i < xh.size(); i++)
		xh[i] = __float2bfloat16(lab_uniform());
	CHECK(cudaMemcpy(xb, xh.data(), xh.size() * 2, cudaMemcpyHostToDevice));
	for (int i = 0; i < 3; i++)
		f(y, pool + (uint64_t)i * N * K);
	CHECK(cudaDeviceSynchronize());
	return 0;
}

int main(int argc, char **argv)
{
	const bool one = argc == 6 && !strcmp(argv[1], "--one");
	FILE *csv = fopen(argc > 1 && !one ? argv[1] : "/dev/null", "w");
	cudaDeviceProp prop;
	float *y;
	std::vector<float> yh((size_t)MAX_T * MAX_N);
	bool failed = false;
	double copy_bw;

	CHECK(cudaGetDeviceProperties(&prop, 0));
	printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
	sms = prop.multiProcessorCount;
	CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
	LAB_BLAS_CHECK(cublasCreate(&blas));
	LAB_BLAS_CHECK(cublasLtCreate(&lt));
	LAB_BLAS_CHECK(cublasSetStream(blas, stream));
	CHECK(cudaMalloc(&blas_ws, WS_BYTES));
	LAB_BLAS_CHECK(cublasSetWorkspace(blas, blas_ws, WS_BYTES));
	CHECK(cudaMalloc(&pool, POOL_ELEMS * 2));
	CHECK(cudaMalloc(&xb, (size_t)MAX_T * MAX_K * 2));
	CHECK(cudaMalloc(&y, (size_t)MAX_T * MAX_N * 4));
	CHECK(cudaMalloc(&partial, (size_t)8 * MAX_T * MAX_N * 4));
	CHECK(cudaMalloc(&count, MAX_N * sizeof(unsigned)));
	CHECK(cudaMemset(count, 0, MAX_N * sizeof(unsigned)));
	lab_fill(pool, POOL_ELEMS, W_SEED);
	CHECK(cudaDeviceSynchronize());
	if (one)
		return run_one(argv, y);
	copy_bw = copy_bandwidth();
	printf("copy bandwidth (1 GiB D2D, read + write): %.0f GB/s\n", copy_bw / 1e9);
	fprintf(csv, "shape,K,N,T,variant,us,GBps,pct_copy,err\n");
	srand(1);
	for (const shape &s : shapes)
		for (int T : t_list) {
			const double wbytes = 2.0 * s.N * s.K;
			std::vector<float> x((size_t)T * s.K);
			std::vector<bf16> xh(x.size());
			std::string best_name;
			double best = 0, cub, ltb = 0;
			int lt_i = -1;

			for (size_t i = 0; i < x.size(); i++) {
				x[i] = lab_bf16((float)rand() / RAND_MAX * 2.0f - 1.0f);
				xh[i] = __float2bfloat16(x[i]);
			}
			CHECK(cudaMemcpy(xb, xh.data(), xh.size() * 2, cudaMemcpyHostToDevice));
			const reference ref = make_reference(x, T, s.N, s.K);
			auto run = [&](const std::string &name, const launch_fn &f) {
				const double err = check(f, y, yh, ref, T, s.N);
				const double sec = time_launch(f, y, s.N, s.K);
				const double gbs = wbytes / sec / 1e9;

				if (!(err <= 1e-4)) {
					printf("FAIL %s %s T %d: err %.3g\n", s.name, name.c_str(), T, err);
					failed = true;
				}
				fprintf(csv, "%s,%d,%d,%d,%s,%.2f,%.0f,%.1f,%.2e\n", s.name, s.K, s.N,
					T, name.c_str(), sec * 1e6, gbs, 100 * gbs * 1e9 / copy_bw, err);
				return gbs;
			};
			cub = run("cublas", cublas_launch(T, s.N, s.K));
			{
				lt_plan p = lt_make(T, s.N, s.K);

				for (int i = 0; i < (int)p.algos.size(); i++) {
					const double g = run("lt" + std::to_string(i), lt_launch(p, i));

					if (g > ltb)
						ltb = g, lt_i = i;
				}
			}
			for (const config &c : configs) {
				if (c.tm < T || (c.tm > 32 && c.tm / 2 >= T))
					continue;
				for (int S : s_list) {
					char name[64];
					double g;

					if (s.K % (SKINNY_BK * S) || (c.xs && S > 1))
						continue;
					config_name(name, sizeof name, c, S);
					g = run(name, c.make(T, s.N, s.K, S));
					if (g > best)
						best = g, best_name = name;
				}
			}
			printf("%-13s %5d %6d %3d | cublas %5.0f (%2.0f%%) | lt %5.0f (%2.0f%%, #%d) | "
			       "skinny %5.0f (%2.0f%%) %s\n",
			       s.name, s.K, s.N, T, cub, 100 * cub * 1e9 / copy_bw, ltb,
			       100 * ltb * 1e9 / copy_bw, lt_i, best, 100 * best * 1e9 / copy_bw,
			       best_name.c_str());
			fflush(stdout);
		}
	printf("%s\n", failed ? "CHECK FAILED" : "all checks passed (tol 1e-4 of sum|x w|)");
	fclose(csv);
	return failed;
}
