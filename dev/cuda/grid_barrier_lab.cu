/* grid_barrier_lab.cu: what a barrier over a persistent grid costs on this
 * GPU, against what a kernel boundary under PDL costs, with the memory
 * system idle and while every block streams weights.
 *
 * Why: a step of Qwen3-0.6B at batch 1 is 28 layers of five kernels, and
 * docs/perf.md found each boundary's chain, not its bytes, to be the cost.
 * A persistent layer kernel would replace boundaries with grid barriers;
 * it can only win if a barrier is cheaper than a boundary. Two engine
 * trials that put a barrier between two products (2026-11-28: o_proj ->
 * gate/up and down -> q/k/v; 2026-12-03: gate/up -> down) lost 15 % and
 * 3.6 % at 0.6B batch 1.
 *
 * Grid: 2 blocks a multiprocessor of 256 threads (the bulk GEMV's
 * consumer warps). R rounds of, each:
 *
 *   stream   (the loaded forms) every block reads its slice of the next
 *            `bytes` of a buffer far larger than L2 (16-byte loads,
 *            summed so they are not dropped), as a product of that many
 *            bytes of weights reads them;
 *   sync     one of:
 *     gen    count in a word, the last arrival resets it and moves a
 *            generation word on, the others poll the generation (the
 *            2026-11-28 and the first 2026-12-03 trial);
 *     mono   a 64-bit count never reset: each block's thread 0 adds 1 with
 *            release and polls with acquire for the count's next multiple
 *            of the grid (the second 2026-12-03 trial);
 *     cg     cooperative_groups' grid sync (a cooperative launch);
 *     kernel one kernel a round, R kernels under PDL in a CUDA graph (the
 *            engine's boundary: pdl_wait, pdl_launch_dependents);
 *     none   no sync (the loaded forms only: the stream's own time).
 *
 * Printed: µs a round (median of 7 runs of R rounds, each timed with
 * events), for bytes = 0 (idle), 4 MB and 6 MB (Qwen3-0.6B's o_proj and
 * down).
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90a -I. dev/cuda/grid_barrier_lab.cu -o /tmp/grid_barrier_lab
 *   /tmp/grid_barrier_lab [R]              (default 2000)
 */
#include "dev/cuda/lab.cuh"

#include <algorithm>
#include <vector>

#include <cooperative_groups.h>

#include "kernels/cuda/cuda_pdl.cuh"

enum sync_kind { SYNC_GEN, SYNC_MONO, SYNC_CG, SYNC_NONE };
static const char *sync_name[] = { "gen", "mono", "cg", "none" };

#define THREADS 256

struct lab_bar {
	unsigned count, gen;
	unsigned long long mono;
};

/* This block's slice of round r's bytes of buf (n16: 16-byte vectors of
 * buf), summed into acc. */
__device__ __forceinline__ void stream_slice(const uint4 *buf, int64_t n16, int64_t per_round,
					     int r, unsigned &acc)
{
	const int64_t per_block = per_round / gridDim.x;
	const int64_t base = ((int64_t)r * per_round + blockIdx.x * per_block) % (n16 - per_round);

	for (int64_t i = threadIdx.x; i < per_block; i += blockDim.x) {
		const uint4 v = __ldcs(buf + base + i);
		acc += v.x ^ v.y ^ v.z ^ v.w;
	}
}

__device__ __forceinline__ void sync_gen(lab_bar *b)
{
	__syncthreads();
	if (threadIdx.x == 0) {
		const unsigned gen = *(volatile unsigned *)&b->gen;

		__threadfence();
		if (atomicAdd(&b->count, 1u) == gridDim.x - 1) {
			b->count = 0;
			__threadfence();
			atomicAdd(&b->gen, 1u);
		} else {
			unsigned now;

			do
				asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n"
					     : "=r"(now)
					     : "l"(&b->gen)
					     : "memory");
			while (now == gen);
		}
		__threadfence();
	}
	__syncthreads();
}

/* (The engine's MLP launch lets blocks with nothing after the barrier
 * add without waiting; in a loop such a block would arrive for the next
 * round early, so here every block waits.) */
__device__ __forceinline__ void sync_mono(lab_bar *b)
{
	__syncthreads();
	if (threadIdx.x == 0) {
		unsigned long long old, now;

		asm volatile("atom.add.release.gpu.global.u64 %0, [%1], 1;\n"
			     : "=l"(old)
			     : "l"(&b->mono)
			     : "memory");
		const unsigned long long target = (old / gridDim.x + 1) * gridDim.x;

		do
			asm volatile("ld.acquire.gpu.global.u64 %0, [%1];\n"
				     : "=l"(now)
				     : "l"(&b->mono)
				     : "memory");
		while (now < target);
	}
	__syncthreads();
}

/* R rounds in one persistent launch. */
__global__ void __launch_bounds__(THREADS, 2)
rounds_kernel(lab_bar *b, const uint4 *buf, int64_t n16, int64_t per_round, int R, int kind,
	      unsigned *sink)
{
	unsigned acc = 0;

	for (int r = 0; r < R; r++) {
		if (per_round)
			stream_slice(buf, n16, per_round, r, acc);
		if (kind == SYNC_GEN)
			sync_gen(b);
		else if (kind == SYNC_MONO)
			sync_mono(b);
		else if (kind == SYNC_CG)
			cooperative_groups::this_grid().sync();
	}
	if (acc == 0x9e3779b9u)
		*sink = acc;
}

/* One round a launch, under PDL. */
__global__ void __launch_bounds__(THREADS, 2)
round_kernel(const uint4 *buf, int64_t n16, int64_t per_round, int r, unsigned *sink)
{
	unsigned acc = 0;

	pdl_wait();
	pdl_launch_dependents();
	if (per_round)
		stream_slice(buf, n16, per_round, r, acc);
	if (acc == 0x9e3779b9u)
		*sink = acc;
}

static float median(std::vector<float> v)
{
	std::sort(v.begin(), v.end());
	return v[v.size() / 2];
}

int main(int argc, char **argv)
{
	const int R = argc > 1 ? atoi(argv[1]) : 2000, runs = 7;
	const int64_t buf_bytes = (int64_t)4 << 30, n16 = buf_bytes / 16;
	const int64_t sizes[] = { 0, 4 << 20, 6 << 20 };
	int sms = 0, per_sm = 0;
	cudaDeviceProp prop;
	lab_bar *b;
	uint4 *buf;
	unsigned *sink;
	cudaStream_t st;
	cudaEvent_t e0, e1;

	setvbuf(stdout, NULL, _IOLBF, 0);
	CHECK(cudaGetDeviceProperties(&prop, 0));
	sms = prop.multiProcessorCount;
	CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, rounds_kernel, THREADS, 0));
	const int G = 2 * sms;
	printf("%s, %d multiprocessors, grid %d of %d threads (%d fit a multiprocessor), %d rounds\n",
	       prop.name, sms, G, THREADS, per_sm, R);
	if (per_sm < 2)
		return 1;
	CHECK(cudaMalloc(&b, sizeof(*b)));
	CHECK(cudaMemset(b, 0, sizeof(*b)));
	CHECK(cudaMalloc(&buf, buf_bytes));
	CHECK(cudaMemset(buf, 1, buf_bytes));
	CHECK(cudaMalloc(&sink, sizeof(*sink)));
	CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
	CHECK(cudaEventCreate(&e0));
	CHECK(cudaEventCreate(&e1));

	printf("%-8s %12s %12s %12s   (us a round)\n", "sync", "idle", "4 MB", "6 MB");
	/* cg last: a cooperative launch that failed to sync would hang the rest */
	const int order[] = { SYNC_NONE, SYNC_NONE + 1, SYNC_GEN, SYNC_MONO, SYNC_CG };

	for (int kind : order) {
		const bool graph = kind == SYNC_NONE + 1;

		printf("%-8s", graph ? "kernel" : sync_name[kind]);
		for (int64_t bytes : sizes) {
			const int64_t per_round = bytes / 16 / G * G;
			std::vector<float> t;
			cudaGraphExec_t exec = NULL;

			if (kind == SYNC_NONE && !bytes) {
				printf(" %12s", "-");
				continue;
			}
			if (graph) {
				cudaGraph_t g;
				cudaLaunchAttribute attr;
				cudaLaunchConfig_t cfg = {};

				attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
				attr.val.programmaticStreamSerializationAllowed = 1;
				cfg.gridDim = G;
				cfg.blockDim = THREADS;
				cfg.stream = st;
				cfg.attrs = &attr;
				cfg.numAttrs = 1;
				CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
				for (int r = 0; r < R; r++)
					CHECK(cudaLaunchKernelEx(&cfg, round_kernel, (const uint4 *)buf, n16,
								 per_round, r, sink));
				CHECK(cudaStreamEndCapture(st, &g));
				CHECK(cudaGraphInstantiate(&exec, g, 0));
				CHECK(cudaGraphDestroy(g));
			}
			for (int i = 0; i < runs + 1; i++) {
				float ms = 0;

				CHECK(cudaEventRecord(e0, st));
				if (graph) {
					CHECK(cudaGraphLaunch(exec, st));
				} else if (kind == SYNC_CG) {
					const uint4 *bp = buf;
					int k = kind;
					int rr = R;
					int64_t nn = n16, pr = per_round;
					void *args[] = { &b, &bp, &nn, &pr, &rr, &k, &sink };

					CHECK(cudaLaunchCooperativeKernel((void *)rounds_kernel, G, THREADS,
									  args, 0, st));
				} else {
					rounds_kernel<<<G, THREADS, 0, st>>>(b, buf, n16, per_round, R, kind,
									   sink);
					CHECK_LAUNCH();
				}
				CHECK(cudaEventRecord(e1, st));
				CHECK(cudaEventSynchronize(e1));
				CHECK(cudaEventElapsedTime(&ms, e0, e1));
				if (i)
					t.push_back(ms * 1000.0f / R);
			}
			printf(" %12.3f", median(t));
			fflush(stdout);
			if (exec)
				CHECK(cudaGraphExecDestroy(exec));
		}
		printf("\n");
	}
	return 0;
}
