/* Helpers of the kernel lab programs (dev/cuda/*.cu): checked CUDA and
 * cuBLAS calls, deterministic cache contents that host and device compute
 * alike, bf16 rounding as the device does it, shuffled block tables and
 * event timing.
 *
 * Cache element i (a flat index into the K or V cache) is lab_val(i, seed):
 * a hash of i mapped to a multiple of 2^-15 in [-1, 1), stored as bf16. The
 * device fills the caches with it; the host reference recomputes the same
 * values for the rows it checks, so nothing large crosses the bus.
 */
#ifndef ATLAS_DEV_CUDA_LAB_CUH
#define ATLAS_DEV_CUDA_LAB_CUH

#include <algorithm>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#define CHECK(call)                                                                   \
	do {                                                                          \
		cudaError_t e_ = (call);                                              \
		if (e_ != cudaSuccess) {                                              \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,  \
				cudaGetErrorString(e_));                              \
			exit(1);                                                      \
		}                                                                     \
	} while (0)

#define CHECK_LAUNCH() CHECK(cudaGetLastError())

/* A cuBLAS or cublasLt call (for the programs that link them). */
#define LAB_BLAS_CHECK(call)                                                          \
	do {                                                                          \
		cublasStatus_t s_ = (call);                                           \
		if (s_ != CUBLAS_STATUS_SUCCESS) {                                    \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,  \
				cublasGetStatusString(s_));                           \
			exit(1);                                                      \
		}                                                                     \
	} while (0)

__host__ __device__ inline float lab_val(uint64_t i, uint64_t seed)
{
	uint64_t z = i * 0x9e3779b97f4a7c15ull + seed;

	z ^= z >> 31;
	z *= 0xbf58476d1ce4e5b9ull;
	z ^= z >> 29;
	z *= 0x94d049bb133111ebull;
	z ^= z >> 32;
	return (float)((int)(z & 0xffff) - 32768) * (1.0f / 32768.0f);
}

/* Round to bf16 (nearest even) and back, as __float2bfloat16_rn does for finite values. */
static inline float lab_bf16(float f)
{
	uint32_t b;

	memcpy(&b, &f, 4);
	b += 0x7fffu + ((b >> 16) & 1);
	b &= 0xffff0000u;
	memcpy(&f, &b, 4);
	return f;
}

__global__ void lab_fill_kernel(__nv_bfloat16 *x, int64_t n, uint64_t seed)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x)
		x[i] = __float2bfloat16_rn(lab_val((uint64_t)i, seed));
}

static inline void lab_fill(__nv_bfloat16 *x, int64_t n, uint64_t seed)
{
	lab_fill_kernel<<<4096, 256>>>(x, n, seed);
	CHECK_LAUNCH();
}

static uint64_t lab_rng = 0x1234567ull;

static inline uint64_t lab_next(void)
{
	uint64_t z = (lab_rng += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static inline float lab_uniform(void)
{
	return (float)((double)(lab_next() >> 11) * 0x1.0p-52 - 1.0);
}

static inline void lab_shuffle(std::vector<int32_t> &a)
{
	for (size_t i = a.size(); i > 1; i--)
		std::swap(a[i - 1], a[lab_next() % i]);
}

/* Device copy of a host vector. */
template <typename T> static inline T *lab_upload(const std::vector<T> &h)
{
	T *d;

	CHECK(cudaMalloc(&d, h.size() * sizeof(T) + 16));
	CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
	return d;
}

/* Errors of got against ref: max |got - ref| and ‖got - ref‖ / ‖ref‖ (a
 * non-finite value counts as bad). */
struct lab_err {
	double max_abs = 0.0, se = 0.0, ss = 0.0;
	long bad = 0;

	void add(double got, double ref)
	{
		if (!isfinite(got)) {
			bad++;
			return;
		}
		max_abs = std::max(max_abs, fabs(got - ref));
		se += (got - ref) * (got - ref);
		ss += ref * ref;
	}
	double rel(void) const { return ss > 0 ? sqrt(se / ss) : sqrt(se); }
	bool ok(double tol_abs) const { return !bad && max_abs <= tol_abs; }
};

/* Median milliseconds of reps runs of f (after warm-up runs), timed with events. */
template <typename F> static inline float lab_time(F f, int reps, cudaStream_t s)
{
	std::vector<float> ms;
	cudaEvent_t a, b;

	CHECK(cudaEventCreate(&a));
	CHECK(cudaEventCreate(&b));
	for (int i = 0; i < 3; i++)
		f();
	CHECK(cudaStreamSynchronize(s));
	for (int i = 0; i < reps; i++) {
		float x;

		CHECK(cudaEventRecord(a, s));
		f();
		CHECK(cudaEventRecord(b, s));
		CHECK(cudaEventSynchronize(b));
		CHECK(cudaEventElapsedTime(&x, a, b));
		ms.push_back(x);
	}
	CHECK(cudaGetLastError());
	CHECK(cudaEventDestroy(a));
	CHECK(cudaEventDestroy(b));
	std::sort(ms.begin(), ms.end());
	return ms[ms.size() / 2];
}

/* Median microseconds of one f() when n of them replay from a CUDA graph
 * (captured on stream s after warm-up runs): the device time of a step as
 * the engine replays it, without the host's launch gaps. */
template <typename F> static inline float lab_time_graph_us(F f, int n, int reps, cudaStream_t s)
{
	cudaGraph_t g;
	cudaGraphExec_t x;
	float ms;

	for (int i = 0; i < 3; i++)
		f();
	CHECK(cudaStreamSynchronize(s));
	CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
	for (int i = 0; i < n; i++)
		f();
	CHECK(cudaStreamEndCapture(s, &g));
	CHECK(cudaGraphInstantiate(&x, g, 0));
	ms = lab_time([&] { CHECK(cudaGraphLaunch(x, s)); }, reps, s);
	CHECK(cudaGraphExecDestroy(x));
	CHECK(cudaGraphDestroy(g));
	return ms * 1e3f / n;
}

#endif
