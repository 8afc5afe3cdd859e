/* moe_bench: the grouped expert product of moe_matmul, y[i] = x[src(i)] ·
 * w_eᵀ over a routing plan, with the kernels the backend runs
 * (kernels/cuda/cuda_moe_gemv.cuh, cuda_moe_gemm.cuh, chosen as
 * kernels/cuda/cuda_moe_launch.cuh does).
 *
 * Shapes: Qwen3-30B-A3B's experts: hidden 2048, moe_intermediate 768, 128
 * experts, top-8. gate_up: x [T, 2048] token rows gathered through the plan
 * (k = 8), w [128 · 1536, 2048] bf16 (gate and up of an expert stacked);
 * down: x [T·8, 768] rows already in sorted order (k = 0), w [128 · 2048,
 * 768]. Decode (T = 1, 8, 64) runs the GEMV variants, prefill (T = 2048) the
 * GEMM variants; "tree" is the backend's choice for the shape.
 *
 * Plans: each token picks 8 distinct experts uniformly at random (host),
 * sorted stably by expert as moe_route does. Correctness first: odd shapes
 * (N = 24, K = 40), a hot expert with more rows than a tile, a partial
 * expert range (e0 > 0, rows of other experts must stay untouched), then
 * every timed shape; each variant's y (poisoned with NaN before) against a
 * reference kernel in double (a warp per output): max |y - ref| / Σ|x·w|
 * over the rows checked must stay below 5e-4 (x rounded to bf16 in both).
 *
 * Timing: a CUDA graph of n launches replayed (median of 10), the launches
 * rotating over MOE_LAYERS copies of the weights so that L2 (50 MB) never
 * holds them. Printed per case: µs, weight GB/s (bytes of the active
 * experts' weights, each read once), % of the device-copy bandwidth
 * (cudaMemcpy D2D of 1 GiB, bytes read + written), TFLOP/s (2·R·N·K). For
 * decode also the layer's two products together against the bytes-read
 * bound (weights + x + y).
 *
 * Build (from the repository root; H100/H200):
 *   nvcc -O3 -std=c++17 -arch=sm_90a -I. dev/cuda/moe_bench.cu -o /tmp/moe_bench
 * Run: /tmp/moe_bench            exits non-zero when a check fails
 */
#include "dev/cuda/lab.cuh"
#include "kernels/cuda/cuda_moe_launch.cuh"

typedef __nv_bfloat16 bf16;

#define MOE_E 128
#define MOE_K 8
#define MOE_HIDDEN 2048
#define MOE_INTER 768
#define MOE_LAYERS 4
#define MOE_TOL 5e-4

/* A routing plan on the host and the device. */
struct plan {
	int T, k, E, R, active;
	std::vector<int32_t> order, offsets, row_e; /* [R], [E + 1], [R]: expert of a sorted row */
	int32_t *order_d, *offsets_d, *row_e_d;
};

/* T tokens, k distinct experts each of E; hot: every token's first pick is expert 0. */
static plan make_plan(int T, int k, int E, bool hot)
{
	plan p;
	std::vector<int32_t> ids((size_t)T * k), next(E + 1, 0);

	p.T = T;
	p.k = k;
	p.E = E;
	p.R = T * k;
	for (int t = 0; t < T; t++)
		for (int j = 0; j < k; j++) {
			int e;
			bool dup;

			do {
				e = hot && !j ? 0 : (int)(lab_next() % E);
				dup = false;
				for (int i = 0; i < j; i++)
					dup |= ids[(size_t)t * k + i] == e;
			} while (dup);
			ids[(size_t)t * k + j] = e;
		}
	p.offsets.assign(E + 1, 0);
	for (int a = 0; a < p.R; a++)
		p.offsets[ids[a] + 1]++;
	p.active = 0;
	for (int e = 0; e < E; e++) {
		p.active += p.offsets[e + 1] > 0;
		p.offsets[e + 1] += p.offsets[e];
	}
	p.order.resize(p.R);
	p.row_e.resize(p.R);
	for (int e = 0; e < E; e++)
		next[e] = p.offsets[e];
	for (int a = 0; a < p.R; a++) {
		p.order[next[ids[a]]] = a;
		p.row_e[next[ids[a]]++] = ids[a];
	}
	p.order_d = lab_upload(p.order);
	p.offsets_d = lab_upload(p.offsets);
	p.row_e_d = lab_upload(p.row_e);
	return p;
}

static void free_plan(plan &p)
{
	CHECK(cudaFree(p.order_d));
	CHECK(cudaFree(p.offsets_d));
	CHECK(cudaFree(p.row_e_d));
}

/* ref[j], mag[j] = y and Σ|x·w| of sorted row rows[j / N], column j % N, in
 * double, a warp per output; 0, 0 for rows of experts outside [e0, e0 +
 * n_local). x [T or R, K] f32 rounded to bf16, w [n_local · N, K]. */
__global__ void ref_kernel(double *ref, double *mag, const int32_t *rows, int n_rows,
			   const float *x, const bf16 *w, const int32_t *order,
			   const int32_t *row_e, int N, int K, int k, int e0, int n_local)
{
	const int lane = threadIdx.x & 31;
	const int64_t n_out = (int64_t)n_rows * N;

	for (int64_t j = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32; j < n_out;
	     j += (int64_t)gridDim.x * blockDim.x / 32) {
		const int i = rows[j / N], n = (int)(j % N), e = row_e[i];
		double s = 0.0, a = 0.0;

		if (e >= e0 && e < e0 + n_local) {
			const float *xr = x + (int64_t)(k ? order[i] / k : i) * K;
			const bf16 *wr = w + ((int64_t)(e - e0) * N + n) * K;

			for (int kk = lane; kk < K; kk += 32) {
				const double p = (double)__bfloat162float(__float2bfloat16_rn(xr[kk])) *
						 (double)__bfloat162float(wr[kk]);

				s += p;
				a += fabs(p);
			}
			for (int o = 16; o > 0; o >>= 1) {
				s += __shfl_xor_sync(0xffffffffu, s, o);
				a += __shfl_xor_sync(0xffffffffu, a, o);
			}
		}
		if (!lane) {
			ref[j] = s;
			mag[j] = a;
		}
	}
}

/* A kernel variant: enqueue y for plan p. */
typedef cudaError_t (*launch_fn)(cudaStream_t, float *, const float *, const bf16 *,
				 const int32_t *, const int32_t *, int, int, int, int, int, int,
				 int, unsigned *);

template <int NT, int TT>
static cudaError_t v_gemv(cudaStream_t s, float *y, const float *x, const bf16 *w,
			  const int32_t *order, const int32_t *offsets, int R, int N, int K, int k,
			  int E, int e0, int n_local, unsigned *fault)
{
	return moe_gemv_launch<NT, TT>(s, y, x, w, order, offsets, R, N, K, k, e0, n_local, fault);
}

template <int BM>
static cudaError_t v_gemm(cudaStream_t s, float *y, const float *x, const bf16 *w,
			  const int32_t *order, const int32_t *offsets, int R, int N, int K, int k,
			  int E, int e0, int n_local, unsigned *fault)
{
	return moe_gemm_launch<BM>(s, y, x, w, order, offsets, R, N, K, k, e0, n_local, fault);
}

struct variant {
	const char *name;
	launch_fn launch;
	bool decode; /* timed at decode shapes (else at prefill) */
};

static const struct variant variants[] = {
	{ "tree", moe_launch, true },       { "gemv8", v_gemv<1, 8>, true },
	{ "gemv16", v_gemv<1, 16>, true },  { "gemv16n2", v_gemv<2, 16>, true },
	{ "gemm64", v_gemm<64>, false },    { "gemm128", v_gemm<128>, false },
};
#define N_VARIANTS (int)(sizeof variants / sizeof variants[0])

static cudaStream_t stream;
static unsigned *fault_d;
static int failures;

/* One product: y [R, N] from x and the weights at w (n_local experts from e0). */
struct product {
	const char *name;
	int N, K, k, e0, n_local;
	const float *x;
	const bf16 *w;
	float *y;
};

/* Check variant v on plan p against the reference (sorted rows: all up to
 * 4096, else every 7th); rows of non-local experts must keep the poison. */
static double check(const struct variant &v, const plan &p, const product &q)
{
	std::vector<int32_t> rows;
	const int step = p.R <= 4096 ? 1 : 7;
	double *ref_d, *mag_d, worst = 0.0;
	int32_t *rows_d;
	std::vector<double> ref, mag;
	std::vector<float> y((size_t)p.R * q.N);
	unsigned fault = 0;

	for (int i = 0; i < p.R; i += step)
		rows.push_back(i);
	ref.resize(rows.size() * q.N);
	mag.resize(rows.size() * q.N);
	rows_d = lab_upload(rows);
	CHECK(cudaMalloc(&ref_d, ref.size() * sizeof(double)));
	CHECK(cudaMalloc(&mag_d, mag.size() * sizeof(double)));
	ref_kernel<<<4096, 256, 0, stream>>>(ref_d, mag_d, rows_d, (int)rows.size(), q.x, q.w,
					    p.order_d, p.row_e_d, q.N, q.K, q.k, q.e0, q.n_local);
	CHECK_LAUNCH();
	CHECK(cudaMemsetAsync(q.y, 0xff, y.size() * sizeof(float), stream));
	CHECK(v.launch(stream, q.y, q.x, q.w, p.order_d, p.offsets_d, p.R, q.N, q.K, q.k, p.E,
		       q.e0, q.n_local, fault_d));
	CHECK(cudaMemcpyAsync(y.data(), q.y, y.size() * sizeof(float), cudaMemcpyDeviceToHost,
			      stream));
	CHECK(cudaMemcpyAsync(ref.data(), ref_d, ref.size() * sizeof(double),
			      cudaMemcpyDeviceToHost, stream));
	CHECK(cudaMemcpyAsync(mag.data(), mag_d, mag.size() * sizeof(double),
			      cudaMemcpyDeviceToHost, stream));
	CHECK(cudaMemcpyAsync(&fault, fault_d, sizeof fault, cudaMemcpyDeviceToHost, stream));
	CHECK(cudaStreamSynchronize(stream));
	for (size_t r = 0; r < rows.size(); r++) {
		const int i = rows[r], e = p.row_e[i];
		const bool local = e >= q.e0 && e < q.e0 + q.n_local;

		for (int n = 0; n < q.N; n++) {
			const float got = y[(size_t)i * q.N + n];
			const size_t j = r * q.N + n;
			uint32_t bits;

			memcpy(&bits, &got, 4);
			if (!local)
				worst = std::max(worst, bits == 0xffffffffu ? 0.0 : INFINITY);
			else if (!isfinite(got))
				worst = INFINITY;
			else if (mag[j] > 0)
				worst = std::max(worst, fabs(got - ref[j]) / mag[j]);
			else
				worst = std::max(worst, got == 0.0f ? 0.0 : INFINITY);
		}
	}
	if (fault)
		worst = INFINITY;
	CHECK(cudaFree(rows_d));
	CHECK(cudaFree(ref_d));
	CHECK(cudaFree(mag_d));
	return worst;
}

static void report_check(const char *what, const struct variant &v, const plan &p,
			 const product &q)
{
	const double err = check(v, p, q);

	printf("check %-28s %-9s T %5d R %6d N %5d K %5d e0 %3d n_local %3d: err %.2e %s\n", what,
	       v.name, p.T, p.R, q.N, q.K, q.e0, q.n_local, err, err <= MOE_TOL ? "ok" : "FAIL");
	failures += !(err <= MOE_TOL);
}

/* Copy bandwidth: bytes read + written per second of a 1 GiB D2D copy. */
static double copy_bandwidth(void)
{
	const size_t bytes = (size_t)1 << 30;
	char *a, *b;
	float ms;

	CHECK(cudaMalloc(&a, bytes));
	CHECK(cudaMalloc(&b, bytes));
	ms = lab_time([&] { CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream)); },
		      10, stream);
	CHECK(cudaFree(a));
	CHECK(cudaFree(b));
	return 2.0 * bytes / (ms * 1e-3);
}

/* µs of one launch of v, the launches rotating over the layers' weights
 * (w_layers: MOE_LAYERS copies, layer_elems apart). */
static double time_variant(const struct variant &v, const plan &p, const product &q,
			   const bf16 *w_layers, size_t layer_elems)
{
	int li = 0;

	return lab_time_graph_us(
		[&] {
			CHECK(v.launch(stream, q.y, q.x, w_layers + (size_t)(li++ % MOE_LAYERS) * layer_elems,
				       p.order_d, p.offsets_d, p.R, q.N, q.K, q.k, p.E, q.e0,
				       q.n_local, fault_d));
		},
		4 * MOE_LAYERS, 10, stream);
}

/* Correctness on small odd shapes for every variant: a hot expert with 37
 * rows (several GEMV tiles), then one with 300 (several GEMM tiles). */
static void check_small(void)
{
	const int N = 24, K = 40, E = 8;
	const int shapes[2][2] = { { 37, 3 }, { 300, 2 } };

	for (const auto &sh : shapes) {
		plan p = make_plan(sh[0], sh[1], E, true);
		std::vector<float> xh((size_t)p.R * K);
		float *x, *y;
		bf16 *w;

		for (float &v : xh)
			v = lab_uniform();
		x = lab_upload(xh);
		CHECK(cudaMalloc(&y, (size_t)p.R * N * sizeof(float)));
		CHECK(cudaMalloc(&w, (size_t)E * N * K * sizeof(bf16)));
		lab_fill(w, (int64_t)E * N * K, 7);
		for (const struct variant &v : variants) {
			report_check("small gather", v, p, product{ "", N, K, p.k, 0, E, x, w, y });
			report_check("small sorted", v, p, product{ "", N, K, 0, 0, E, x, w, y });
			report_check("small experts 2..4", v, p,
				     product{ "", N, K, p.k, 2, 3, x, w, y });
		}
		CHECK(cudaFree(x));
		CHECK(cudaFree(y));
		CHECK(cudaFree(w));
		free_plan(p);
	}
}

int main(void)
{
	const int decode_t[] = { 1, 8, 64 };
	const size_t gu_elems = (size_t)MOE_E * 2 * MOE_INTER * MOE_HIDDEN;
	const size_t dn_elems = (size_t)MOE_E * MOE_HIDDEN * MOE_INTER;
	const int T_max = 2048, R_max = T_max * MOE_K;
	std::vector<float> xh((size_t)T_max * MOE_HIDDEN), hh((size_t)R_max * MOE_INTER);
	bf16 *w_gu, *w_dn;
	float *x, *h, *y;
	double bw;
	cudaDeviceProp prop;

	CHECK(cudaGetDeviceProperties(&prop, 0));
	CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
	CHECK(cudaMalloc(&fault_d, sizeof(unsigned)));
	CHECK(cudaMemset(fault_d, 0, sizeof(unsigned)));
	CHECK(moe_gemm_prepare<64>());
	CHECK(moe_gemm_prepare<128>());
	bw = copy_bandwidth();
	printf("%s: device copy %.0f GB/s (read + write)\n", prop.name, bw * 1e-9);
	check_small();

	for (float &v : xh)
		v = lab_uniform();
	for (float &v : hh)
		v = lab_uniform();
	x = lab_upload(xh);
	h = lab_upload(hh);
	CHECK(cudaMalloc(&y, (size_t)R_max * MOE_HIDDEN * sizeof(float)));
	CHECK(cudaMalloc(&w_gu, gu_elems * MOE_LAYERS * sizeof(bf16)));
	CHECK(cudaMalloc(&w_dn, dn_elems * MOE_LAYERS * sizeof(bf16)));
	lab_fill(w_gu, (int64_t)(gu_elems * MOE_LAYERS), 1);
	lab_fill(w_dn, (int64_t)(dn_elems * MOE_LAYERS), 2);
	CHECK(cudaDeviceSynchronize());

	for (int ti = 0; ti < 4; ti++) {
		const bool decode = ti < 3;
		const int T = decode ? decode_t[ti] : T_max;
		plan p = make_plan(T, MOE_K, MOE_E, false);
		const product gu = { "gate_up", 2 * MOE_INTER, MOE_HIDDEN, MOE_K, 0, MOE_E, x, w_gu, y };
		const product dn = { "down", MOE_HIDDEN, MOE_INTER, 0, 0, MOE_E, h, w_dn, y };
		const product *prods[2] = { &gu, &dn };
		double best_us[2] = { 0, 0 };

		printf("\nT %d: R %d rows, %d of %d experts active\n", T, p.R, p.active, MOE_E);
		for (const struct variant &v : variants) {
			if (v.decode != decode && strcmp(v.name, "tree"))
				continue;
			for (int pi = 0; pi < 2; pi++) {
				const product &q = *prods[pi];
				const size_t elems = pi ? dn_elems : gu_elems;
				const double wbytes = (double)p.active * q.N * q.K * 2;
				double us;

				report_check(q.name, v, p, q);
				us = time_variant(v, p, q, q.w, elems);
				printf("  %-8s %-9s %9.1f us  weights %7.0f GB/s  %5.1f%% of copy  "
				       "%7.1f TFLOP/s\n",
				       q.name, v.name, us, wbytes / (us * 1e-6) * 1e-9,
				       100.0 * wbytes / (us * 1e-6) / bw,
				       2.0 * p.R * q.N * q.K / (us * 1e-6) * 1e-12);
				if (!strcmp(v.name, "tree"))
					best_us[pi] = us;
			}
		}
		if (decode) {
			/* the bytes-read bound of both products: weights, x rows, y rows */
			const double bytes = (double)p.active * 2 * MOE_INTER * MOE_HIDDEN * 2 * 2 +
					     (double)T * MOE_HIDDEN * 4 + (double)p.R * 2 * MOE_INTER * 4 +
					     (double)p.R * MOE_INTER * 4 + (double)p.R * MOE_HIDDEN * 4;
			const double us = best_us[0] + best_us[1];

			printf("  layer (tree gate_up + down): %.1f us, %.0f GB/s, %.1f%% of the "
			       "bytes-read bound at copy bandwidth\n",
			       us, bytes / (us * 1e-6) * 1e-9, 100.0 * bytes / (us * 1e-6) / bw);
		}
		free_plan(p);
	}
	CHECK(cudaFree(x));
	CHECK(cudaFree(h));
	CHECK(cudaFree(y));
	CHECK(cudaFree(w_gu));
	CHECK(cudaFree(w_dn));
	printf("\n%s\n", failures ? "SOME CHECKS FAILED" : "all checks passed");
	return failures ? 1 : 0;
}
