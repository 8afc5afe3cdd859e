/* Hopper warpgroup MMA (wgmma) lab, the first step towards the prefill
 * attention on it (kernels/cuda/cuda_attention_wgmma.cuh): the operand
 * layouts that attention needs, checked one product at a time against the
 * host, then the rate of an attention-shaped loop with its operands
 * resident in shared memory (an upper bound for a kernel that also streams
 * K and V).
 *
 * Why: the backend's prefill attention on mma.sync
 * (kernels/cuda/cuda_attention_prefill.cuh) ran at 253 TFLOP/s on an H200
 * (Qwen3-8B, 8K prompt); docs/perf.md's sums asked 337 or more for issue
 * 14's 40,000 tokens/s.
 * There every K and V fragment goes through ldmatrix into registers, 16
 * rows of a warp at a time; wgmma multiplies a warpgroup's 64 rows with its
 * B operand (and A, if asked) read from shared memory by the tensor cores.
 *
 * Layouts (all tiles bf16, [row][dim], D = 128): a tile is stored as two
 * halves of 64 dims, each a run of 128-byte rows (its 64 dims), in groups
 * of 8 rows (1,024 bytes, aligned to 1,024), the 16-byte chunk c of row r
 * at chunk c ^ (r % 8): the 128-byte swizzle. For S = Q Kᵀ, Q (A) and K (B)
 * are K-major (dims are the reduction); a 16-dim step is the descriptor's
 * start advanced 32 bytes within a half. For O = P V, V (B) is MN-major (dims
 * are N) and read transposed; a 16-key step advances 2,048 bytes; N = 128
 * spans both halves. P (A) comes from registers: each warp's 16 rows in the
 * mma.sync m16n8k16 A fragment, built from S's accumulators as the backend's
 * kernels build it now.
 *
 * Checks: S = Q Kᵀ (m64n64k16 and m64n128k16, 8 steps each) and O = P V
 * (m64n128k16, 4 steps), the latter for both readings of V's descriptor
 * offsets (leading = between the two 64-dim halves and stride = between
 * 8-key groups, or the reverse): the program says which one matches, and
 * the rates use it. Rates: each warpgroup of a CTA (one CTA a
 * multiprocessor) runs S = Q Kᵀ then O += P V on resident tiles: serially;
 * serially with a stand-in for the softmax (the rows' max, exp2 of every
 * score, the sums, O's rescale); and with the next step's Q Kᵀ issued
 * beside this step's P V, so that the next softmax runs while P V does.
 *
 * Measured (H200, 2026-12-02): every product matches; V's leading offset
 * is the one between its halves (cuda_attention_wgmma.cuh uses that
 * reading). Rates at 64 keys a step, 2 warpgroups: bare 954 TFLOP/s, with
 * the softmax 638, overlapped 759 (128 keys: 954, 635, 816).
 *
 * Build and run: see dev/cuda/README.md.
 */
#include "lab.cuh"
#include "kernels/cuda/cuda_wgmma.cuh"

#define WG_D 128
#define WG_ROWS 64                       /* rows of a warpgroup's tile */
#define WG_TILE_BYTES (WG_ROWS * WG_D * 2) /* a Q tile, 16 KB: two 8 KB halves */

/* S = Q Kᵀ of one 16-dim step for NK keys (64 or 128). */
template <int NK>
__device__ __forceinline__ void wgmma_qk(float (&s)[NK / 2], uint64_t a, uint64_t b, int acc)
{
	if constexpr (NK == 64)
		wgmma_64x64_ss(s, a, b, acc);
	else
		wgmma_64x128_ss(s, a, b, acc);
}

/* rows x 128 bf16 from global ([row][dim]) into a tile at t, every thread of the CTA. */
__device__ void tile_put(unsigned char *t, const __nv_bfloat16 *x, int rows)
{
	for (int i = threadIdx.x; i < rows * WG_D; i += blockDim.x)
		*(__nv_bfloat16 *)(t + sw128_off(i / WG_D, i % WG_D, rows)) = x[i];
}

/* Q Kᵀ's descriptors for dim step kk: Q rows WG_ROWS, K rows NK. */
__device__ __forceinline__ uint64_t q_desc(uint32_t q, int kk)
{
	return sw128_desc(q + (kk / 4) * WG_ROWS * 128 + (kk % 4) * 32, 16, 1024);
}

template <int NK> __device__ __forceinline__ uint64_t k_desc(uint32_t k, int kk)
{
	return sw128_desc(k + (kk / 4) * NK * 128 + (kk % 4) * 32, 16, 1024);
}

/* V's descriptor for key step kk of a tile of NK keys; halves_lead: the
 * leading offset is the one between the two 64-dim halves (else the stride
 * is). */
template <int NK> __device__ __forceinline__ uint64_t v_desc(uint32_t v, int kk, bool halves_lead)
{
	const uint32_t halves = NK * 128, groups = 1024;

	return sw128_desc(v + kk * 16 * 128, halves_lead ? halves : groups,
			  halves_lead ? groups : halves);
}

extern __shared__ unsigned char wg_buf[];

/* One warpgroup: s [64][NK] = q [64][128] · k [NK][128]ᵀ in f32. */
template <int NK>
__global__ void __launch_bounds__(128) qk_check_kernel(const __nv_bfloat16 *q,
							const __nv_bfloat16 *k, float *s)
{
	unsigned char *qt = wg_tiles(wg_buf), *kt = qt + WG_TILE_BYTES;
	const int w = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, tq = threadIdx.x & 3;
	float acc[NK / 2];

	tile_put(qt, q, WG_ROWS);
	tile_put(kt, k, NK);
	wg_proxy_fence();
	__syncthreads();
#pragma unroll
	for (int i = 0; i < NK / 2; i++)
		acc[i] = 0.0f;
	wg_pin(acc);
	wg_fence();
#pragma unroll
	for (int kk = 0; kk < WG_D / 16; kk++)
		wgmma_qk<NK>(acc, q_desc(wg_smem(qt), kk), k_desc<NK>(wg_smem(kt), kk), 1);
	wg_commit();
	wg_wait<0>();
	wg_pin(acc);
#pragma unroll
	for (int j = 0; j < NK / 8; j++) {
		const int r = 16 * w + g, c = 8 * j + 2 * tq;

		s[r * NK + c] = acc[4 * j];
		s[r * NK + c + 1] = acc[4 * j + 1];
		s[(r + 8) * NK + c] = acc[4 * j + 2];
		s[(r + 8) * NK + c + 1] = acc[4 * j + 3];
	}
}

/* One warpgroup: o [64][128] = p [64][64] · v [64][128], p from registers. */
__global__ void __launch_bounds__(128) pv_check_kernel(const __nv_bfloat16 *p,
						       const __nv_bfloat16 *v, float *o,
						       bool halves_lead)
{
	unsigned char *vt = wg_tiles(wg_buf);
	const int w = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, tq = threadIdx.x & 3;
	const int r0 = 16 * w + g, r1 = r0 + 8;
	float acc[64];
	uint32_t a[4][4];

	tile_put(vt, v, 64);
	wg_proxy_fence();
	__syncthreads();
#pragma unroll
	for (int kk = 0; kk < 4; kk++) {
		const int c = 16 * kk + 2 * tq;
		auto f = [&](int r, int cc) { return __bfloat162float(p[r * 64 + cc]); };

		a[kk][0] = wg_pack(f(r0, c), f(r0, c + 1));
		a[kk][1] = wg_pack(f(r1, c), f(r1, c + 1));
		a[kk][2] = wg_pack(f(r0, c + 8), f(r0, c + 9));
		a[kk][3] = wg_pack(f(r1, c + 8), f(r1, c + 9));
	}
#pragma unroll
	for (int i = 0; i < 64; i++)
		acc[i] = 0.0f;
	wg_pin(acc);
	wg_fence();
#pragma unroll
	for (int kk = 0; kk < 4; kk++)
		wgmma_64x128_rs(acc, a[kk], v_desc<64>(wg_smem(vt), kk, halves_lead), 1);
	wg_commit();
	wg_wait<0>();
	wg_pin(acc);
#pragma unroll
	for (int j = 0; j < 16; j++) {
		const int c = 8 * j + 2 * tq;

		o[r0 * WG_D + c] = acc[4 * j];
		o[r0 * WG_D + c + 1] = acc[4 * j + 1];
		o[r1 * WG_D + c] = acc[4 * j + 2];
		o[r1 * WG_D + c + 1] = acc[4 * j + 3];
	}
}

__device__ __forceinline__ float wg_exp2(float x)
{
	float y;

	asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
	return y;
}

/* The stand-in softmax of a step: the rows' max over the step (a thread
 * holds rows g and g + 8, 4 threads a row), P = 2^(s - max), the sums, and
 * each row's correction of O (returned, applied by the caller). */
template <int NK>
__device__ __forceinline__ void soft_step(float (&s)[NK / 2], float (&m)[2], float (&l)[2],
					  float (&corr)[2])
{
	float mx[2] = { m[0], m[1] };

#pragma unroll
	for (int i = 0; i < NK / 2; i++)
		mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
#pragma unroll
	for (int r = 0; r < 2; r++) {
		mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
		mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
		corr[r] = wg_exp2(m[r] - mx[r]);
		m[r] = mx[r];
		l[r] *= corr[r];
	}
#pragma unroll
	for (int i = 0; i < NK / 2; i++) {
		s[i] = wg_exp2(s[i] - m[(i >> 1) & 1]);
		l[(i >> 1) & 1] += s[i];
	}
}

template <int NK>
__device__ __forceinline__ void issue_qk(float (&s)[NK / 2], uint32_t q, uint32_t k)
{
#pragma unroll
	for (int kk = 0; kk < WG_D / 16; kk++)
		wgmma_qk<NK>(s, q_desc(q, kk), k_desc<NK>(k, kk), kk > 0);
}

template <int NK>
__device__ __forceinline__ void issue_pv(float (&o)[64], const uint32_t (&a)[NK / 16][4],
					 uint32_t v, bool halves_lead)
{
#pragma unroll
	for (int kk = 0; kk < NK / 16; kk++)
		wgmma_64x128_rs(o, a[kk], v_desc<NK>(v, kk, halves_lead), 1);
}

enum rate_mode { RATE_BARE, RATE_SOFT, RATE_OVERLAP, N_RATE_MODES };
static const char *rate_name[N_RATE_MODES] = { "bare", "softmax", "softmax, overlapped" };

/* WGS warpgroups a CTA, each with its own Q tile, sharing one K and one V
 * tile of NK keys, run `iters` steps of S = Q Kᵀ and O += P V (MODE: bare;
 * with the stand-in softmax and O's rescale; the same with the next step's
 * Q Kᵀ issued before this step's P V, so that the softmax runs while the
 * tensor cores work). The tiles' values are small and fixed: only the time
 * counts. sink keeps the result alive. */
template <int NK, int WGS, int MODE>
__global__ void __launch_bounds__(WGS * 128) rate_kernel(int iters, bool halves_lead, float *sink)
{
	unsigned char *t = wg_tiles(wg_buf);
	const int wg = threadIdx.x >> 7;
	const uint32_t q = wg_smem(t) + wg * WG_TILE_BYTES;
	const uint32_t k = wg_smem(t) + WGS * WG_TILE_BYTES, v = k + NK * WG_D * 2;
	const int bytes = WGS * WG_TILE_BYTES + 2 * NK * WG_D * 2;
	float o[64], s[NK / 2], s2[NK / 2], m[2] = { -1e30f, -1e30f }, l[2] = { 0.0f, 0.0f };
	float corr[2];
	uint32_t a[NK / 16][4];

	for (int i = threadIdx.x; i < bytes / 2; i += blockDim.x)
		((__nv_bfloat16 *)t)[i] = __float2bfloat16_rn(0.001f * (float)(i % 7 - 3));
	wg_proxy_fence();
	__syncthreads();
#pragma unroll
	for (int i = 0; i < 64; i++)
		o[i] = 0.0f;
	if constexpr (MODE != RATE_OVERLAP) {
		for (int it = 0; it < iters; it++) {
			wg_fence();
			issue_qk<NK>(s, q, k);
			wg_commit();
			wg_wait<0>();
			wg_pin(s);
			if constexpr (MODE == RATE_SOFT) {
				soft_step<NK>(s, m, l, corr);
#pragma unroll
				for (int i = 0; i < 64; i++)
					o[i] *= corr[(i >> 1) & 1];
			}
			wg_p_frags<NK>(s, a);
			wg_pin(o);
			wg_fence();
			issue_pv<NK>(o, a, v, halves_lead);
			wg_commit();
			wg_wait<0>();
			wg_pin(o);
		}
	} else {
		/* One step: P V of the scores in cur while the next step's Q Kᵀ
		 * fills nxt and its softmax runs. Two steps an iteration, so that
		 * s and s2 swap roles without indexing registers. */
		auto step = [&](float (&cur)[NK / 2], float (&nxt)[NK / 2]) {
			wg_p_frags<NK>(cur, a);
			wg_pin(o);
			wg_pin(nxt);
			wg_fence();
			issue_qk<NK>(nxt, q, k);
			wg_commit();
			issue_pv<NK>(o, a, v, halves_lead);
			wg_commit();
			wg_wait<1>();
			wg_pin(nxt);
			soft_step<NK>(nxt, m, l, corr);
			wg_wait<0>();
			wg_pin(o);
#pragma unroll
			for (int i = 0; i < 64; i++)
				o[i] *= corr[(i >> 1) & 1];
		};

		wg_fence();
		issue_qk<NK>(s, q, k);
		wg_commit();
		wg_wait<0>();
		wg_pin(s);
		soft_step<NK>(s, m, l, corr);
		for (int it = 0; it < iters; it += 2) {
			step(s, s2);
			step(s2, s);
		}
	}
	float sum = l[0] + l[1];

#pragma unroll
	for (int i = 0; i < 64; i++)
		sum += o[i];
	sink[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

static int failures;

static std::vector<__nv_bfloat16> host_bf16(size_t n, uint64_t seed, std::vector<float> &f)
{
	std::vector<__nv_bfloat16> b(n);

	f.resize(n);
	for (size_t i = 0; i < n; i++) {
		f[i] = lab_bf16(lab_val(i, seed));
		b[i] = __float2bfloat16_rn(f[i]);
	}
	return b;
}

/* Largest |got - want| over want's entries, against the largest |want|. */
static bool close_enough(const char *what, const std::vector<float> &got,
			 const std::vector<double> &want)
{
	double err = 0, mag = 0;

	for (size_t i = 0; i < want.size(); i++) {
		err = fmax(err, fabs(got[i] - want[i]));
		mag = fmax(mag, fabs(want[i]));
	}
	/* a wrong layout puts errors of the values' own size; rounding, 1e-5 of them */
	const bool ok = err <= 1e-3 * fmax(mag, 1.0);

	printf("  %-44s max_abs %.2e of %.2e%s\n", what, err, mag, ok ? "" : "  FAIL");
	return ok;
}

template <int NK> static void check_qk(void)
{
	std::vector<float> qf, kf;
	const std::vector<__nv_bfloat16> qb = host_bf16(WG_ROWS * WG_D, 11, qf);
	const std::vector<__nv_bfloat16> kb = host_bf16(NK * WG_D, 22, kf);
	std::vector<double> want(WG_ROWS * NK);
	std::vector<float> got(WG_ROWS * NK);
	const int smem = WG_TILE_BYTES + NK * WG_D * 2 + 1024;
	__nv_bfloat16 *q = lab_upload(qb), *k = lab_upload(kb);
	float *s;
	char what[64];

	for (int r = 0; r < WG_ROWS; r++)
		for (int c = 0; c < NK; c++) {
			double x = 0;

			for (int d = 0; d < WG_D; d++)
				x += (double)qf[r * WG_D + d] * kf[c * WG_D + d];
			want[r * NK + c] = x;
		}
	CHECK(cudaMalloc(&s, got.size() * 4));
	CHECK(cudaFuncSetAttribute(qk_check_kernel<NK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
				   smem));
	qk_check_kernel<NK><<<1, 128, smem>>>(q, k, s);
	CHECK_LAUNCH();
	CHECK(cudaMemcpy(got.data(), s, got.size() * 4, cudaMemcpyDeviceToHost));
	snprintf(what, sizeof what, "S = Q Kt, 64 x %d x 128 (m64n%dk16)", NK, NK);
	failures += !close_enough(what, got, want);
	CHECK(cudaFree(q));
	CHECK(cudaFree(k));
	CHECK(cudaFree(s));
}

/* O = P V with each reading of V's offsets; returns the first that matched, or -1. */
static int check_pv(void)
{
	std::vector<float> pf, vf;
	const std::vector<__nv_bfloat16> pb = host_bf16(64 * 64, 33, pf);
	const std::vector<__nv_bfloat16> vb = host_bf16(64 * WG_D, 44, vf);
	std::vector<double> want(64 * WG_D);
	std::vector<float> got(64 * WG_D);
	/* twice the tile: the reading that does not match may reach past it */
	const int smem = 2 * 64 * WG_D * 2 + 1024;
	__nv_bfloat16 *p = lab_upload(pb), *v = lab_upload(vb);
	float *o;
	int found = -1;

	for (int r = 0; r < 64; r++)
		for (int c = 0; c < WG_D; c++) {
			double x = 0;

			for (int j = 0; j < 64; j++)
				x += (double)pf[r * 64 + j] * vf[j * WG_D + c];
			want[r * WG_D + c] = x;
		}
	CHECK(cudaMalloc(&o, got.size() * 4));
	CHECK(cudaFuncSetAttribute(pv_check_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
				   smem));
	for (int lead = 1; lead >= 0; lead--) {
		CHECK(cudaMemset(o, 0, got.size() * 4));
		pv_check_kernel<<<1, 128, smem>>>(p, v, o, lead == 1);
		CHECK_LAUNCH();
		CHECK(cudaMemcpy(got.data(), o, got.size() * 4, cudaMemcpyDeviceToHost));
		const bool ok = close_enough(lead ? "O = P V, leading offset between halves"
						  : "O = P V, stride offset between halves",
					     got, want);

		if (ok && found < 0)
			found = lead;
	}
	if (found < 0) {
		printf("  O = P V: neither reading of V's descriptor matched  FAIL\n");
		failures++;
	}
	CHECK(cudaFree(p));
	CHECK(cudaFree(v));
	CHECK(cudaFree(o));
	return found;
}

template <int NK, int WGS, int MODE> static void rate(int sms, bool halves_lead)
{
	const int smem = WGS * WG_TILE_BYTES + 2 * NK * WG_D * 2 + 1024, iters = 4096;
	const double flops = (double)sms * WGS * iters * 4.0 * WG_ROWS * NK * WG_D;
	float *sink, ms;

	CHECK(cudaMalloc(&sink, (size_t)sms * WGS * 128 * 4));
	CHECK(cudaFuncSetAttribute(rate_kernel<NK, WGS, MODE>,
				   cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
	ms = lab_time([&] { rate_kernel<NK, WGS, MODE><<<sms, WGS * 128, smem>>>(iters, halves_lead, sink); },
		      5, 0);
	printf("  rate  keys %3d, %d warpgroups, %-20s %8.3f ms  %6.1f TFLOP/s\n", NK, WGS,
	       rate_name[MODE], ms, flops / (ms * 1e-3) / 1e12);
	CHECK(cudaFree(sink));
}

/* Three warpgroups leave 168 registers a thread: too few for two score
 * tiles beside O, and ptxas then serializes the products (C7512), so the
 * overlapped mode runs at two. */
template <int NK, int WGS> static void rates(int sms, bool halves_lead)
{
	rate<NK, WGS, RATE_BARE>(sms, halves_lead);
	rate<NK, WGS, RATE_SOFT>(sms, halves_lead);
	if constexpr (WGS == 2)
		rate<NK, WGS, RATE_OVERLAP>(sms, halves_lead);
}

int main(void)
{
	cudaDeviceProp prop;
	int lead;

	CHECK(cudaGetDeviceProperties(&prop, 0));
	printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
	printf("\n== layouts, against the host in float64\n");
	check_qk<64>();
	check_qk<128>();
	lead = check_pv();
	if (lead >= 0) {
		printf("\n== rates, operands resident in shared memory, one CTA an SM\n");
		rates<64, 2>(prop.multiProcessorCount, lead == 1);
		rates<64, 3>(prop.multiProcessorCount, lead == 1);
		rates<128, 2>(prop.multiProcessorCount, lead == 1);
	}
	printf("\n%s: %d check(s) failed\n", failures ? "FAIL" : "ok", failures);
	return failures ? 1 : 0;
}
