/* graph_launch_lab.cu: what a CUDA graph launch of a decode step's size
 * costs the host, and how long the device waits for it.
 *
 * A traced decode step of Qwen3-8B replays a graph of 329-366 kernel nodes,
 * and cudaGraphLaunch took 215-256 us of host time (the device starts the
 * first node near the end of the call, so it idles for most of it). This
 * program captures graphs of N short kernels, as the engine does (stream
 * capture of launches on one stream), in several forms, and measures for
 * each, over 200 replays after 20 warm-ups:
 *
 *   launch   host time of cudaGraphLaunch (median, p90);
 *   step     host time of launch + cudaStreamSynchronize (median): what
 *            a step costs when the host waits for it, as the engine does;
 *   device   graph time on the device, event to event (median).
 *
 * Forms: plain <<<>>> launches; launches with programmatic stream
 * serialisation (the engine's cu_launch with PDL); PDL with every third
 * kernel plain (a cuBLAS product between atlas' kernels at batch 17 and
 * more); PDL kernels with a 256-byte parameter block; and each of those
 * instantiated and then cudaGraphUpload'ed.
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90a -I. dev/cuda/graph_launch_lab.cu -o /tmp/graph_launch_lab
 *   /tmp/graph_launch_lab [N...]          (default 100 229 366)
 */
#include "dev/cuda/lab.cuh"

#include <chrono>

#include "kernels/cuda/cuda_pdl.cuh"

/* A short kernel of the engine's kind: every block touches memory after
 * the PDL wait and lets the next kernel be placed. */
__global__ void tiny_kernel(float *p, int n)
{
	pdl_wait();
	pdl_launch_dependents();
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		p[i] = p[i] * 0.5f + 1.0f;
}

/* The same with a 256-byte parameter block, as a kernel taking a struct of
 * shapes and pointers has: a graph node keeps its parameters. */
struct big_params {
	float *p;
	int n;
	int pad[62];
};

__global__ void tiny_big_kernel(struct big_params a)
{
	pdl_wait();
	pdl_launch_dependents();
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < a.n)
		a.p[i] = a.p[i] * 0.5f + 1.0f;
}

enum form { PLAIN, PDL, PDL_MIXED, PDL_BIG };
static const char *form_name[] = { "plain", "pdl", "pdl+plain/3", "pdl,256B" };

static double now_us(void)
{
	return std::chrono::duration<double, std::micro>(
		       std::chrono::steady_clock::now().time_since_epoch())
		.count();
}

static cudaGraphExec_t capture(cudaStream_t s, float *buf, int n_nodes, enum form f)
{
	cudaGraph_t g;
	cudaGraphExec_t exec;
	const int n = 132 * 128;
	CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
	for (int i = 0; i < n_nodes; i++) {
		bool pdl = f != PLAIN && (f != PDL_MIXED || i % 3 != 0);
		if (f == PDL_BIG) {
			struct big_params a = {};
			a.p = buf;
			a.n = n;
			cu_launch(pdl, tiny_big_kernel, dim3(132), dim3(128), 0, s, a);
		} else {
			cu_launch(pdl, tiny_kernel, dim3(132), dim3(128), 0, s, buf, n);
		}
		CHECK_LAUNCH();
	}
	CHECK(cudaStreamEndCapture(s, &g));
	CHECK(cudaGraphInstantiate(&exec, g, 0));
	CHECK(cudaGraphDestroy(g));
	return exec;
}

static double median(std::vector<double> v, double q = 0.5)
{
	std::sort(v.begin(), v.end());
	return v[(size_t)(q * (double)(v.size() - 1))];
}

static void measure(cudaStream_t s, float *buf, int n_nodes, enum form f, bool upload)
{
	cudaGraphExec_t exec = capture(s, buf, n_nodes, f);
	if (upload)
		CHECK(cudaGraphUpload(exec, s));
	CHECK(cudaStreamSynchronize(s));
	cudaEvent_t e0, e1;
	CHECK(cudaEventCreate(&e0));
	CHECK(cudaEventCreate(&e1));
	std::vector<double> launch, step, device;
	for (int r = 0; r < 220; r++) {
		CHECK(cudaEventRecord(e0, s));
		double t0 = now_us();
		CHECK(cudaGraphLaunch(exec, s));
		double t1 = now_us();
		CHECK(cudaEventRecord(e1, s));
		CHECK(cudaStreamSynchronize(s));
		double t2 = now_us();
		float ms = 0;
		CHECK(cudaEventElapsedTime(&ms, e0, e1));
		if (r >= 20) {
			launch.push_back(t1 - t0);
			step.push_back(t2 - t0);
			device.push_back(ms * 1e3);
		}
	}
	printf("%5d %-12s %-6s %9.1f %9.1f %9.1f %9.1f %8.3f\n", n_nodes, form_name[f],
	       upload ? "yes" : "no", median(launch), median(launch, 0.9), median(step),
	       median(device), median(launch) / n_nodes);
	CHECK(cudaEventDestroy(e0));
	CHECK(cudaEventDestroy(e1));
	CHECK(cudaGraphExecDestroy(exec));
}

int main(int argc, char **argv)
{
	std::vector<int> sizes;
	for (int i = 1; i < argc; i++)
		sizes.push_back(atoi(argv[i]));
	if (sizes.empty())
		sizes = { 100, 229, 366 };
	cudaDeviceProp prop;
	CHECK(cudaGetDeviceProperties(&prop, 0));
	int driver = 0, runtime = 0;
	CHECK(cudaDriverGetVersion(&driver));
	CHECK(cudaRuntimeGetVersion(&runtime));
	printf("%s, driver %d, runtime %d\n", prop.name, driver, runtime);
	cudaStream_t s;
	CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	float *buf;
	CHECK(cudaMalloc(&buf, 132 * 128 * sizeof(float)));
	CHECK(cudaMemset(buf, 0, 132 * 128 * sizeof(float)));
	printf("%5s %-12s %-6s %9s %9s %9s %9s %8s\n", "nodes", "form", "upload", "launch",
	       "p90", "step", "device", "us/node");
	for (int n : sizes)
		for (int f = PLAIN; f <= PDL_BIG; f++)
			for (int up = 0; up < 2; up++)
				measure(s, buf, n, (enum form)f, up);
	CHECK(cudaFree(buf));
	CHECK(cudaStreamDestroy(s));
	return 0;
}
