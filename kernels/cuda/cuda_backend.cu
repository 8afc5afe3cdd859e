/* The cuda backend object: availability, open, close, device info and the
 * ops table.
 *
 * Open makes kt_config.device current, checks that this build's kernels run
 * on it, and creates everything the ops need so that they never allocate: the
 * stream, a cuBLAS handle bound to it with its own workspace, the fault word,
 * the pinned and device buffers of sample and draw, a first matmul workspace
 * (max_tokens rows of CUDA_XBF16_MIN_COLS, grown by weight()), the split
 * partials of decode attention and moe_route's chunk counts. Close also
 * destroys the NCCL communicator of comm_open.
 *
 * Nothing here prints on a machine without a GPU: kt_cuda_available() only
 * asks cudaGetDeviceCount (libcudart loads the driver on first use), and
 * open reports a missing device through err.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "common/err.h"
}
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_impl.h"

#define CUDA_XBF16_MIN_COLS 1024

bool kt_cuda_available(void)
{
	int n = 0;

	if (cudaGetDeviceCount(&n) != cudaSuccess) {
		(void)cudaGetLastError();
		return false;
	}
	return n > 0;
}

static void cuda_close(struct kt_backend *be)
{
	struct cuda_backend *cu = cu_of(be);

	CU_WARN(cu_device(cu));
	if (cu->stream)
		CU_WARN(cudaStreamSynchronize(cu->stream));
	cuda_comm_close(cu);
	cuda_graphs_free(cu);
	cuda_attention_close(cu);
	cuda_moe_close(cu);
	cuda_transfer_close(cu);
	cuda_free_all(cu);
	if (cu->blas)
		cublasDestroy(cu->blas);
	CU_WARN(cudaFree(cu->blas_ws));
	CU_WARN(cudaFree(cu->xbf16));
	CU_WARN(cudaFree(cu->stage));
	CU_WARN(cudaFree(cu->fault));
	CU_WARN(cudaFree(cu->rows_dev));
	CU_WARN(cudaFree(cu->sample_part));
	CU_WARN(cudaFree(cu->sample_count));
	CU_WARN(cudaFree(cu->sample_cand));
	CU_WARN(cudaFree(cu->norm_count));
	CU_WARN(cudaFreeHost(cu->fault_host));
	CU_WARN(cudaFreeHost(cu->rows_host));
	CU_WARN(cudaFreeHost(cu->draw_host));
	CU_WARN(cudaFreeHost(cu->ids_host));
	if (cu->stream)
		CU_WARN(cudaStreamDestroy(cu->stream));
	pthread_mutex_destroy(&cu->lock);
	free(cu);
}

static const struct kt_ops cuda_ops = {
	cuda_close,
	cuda_alloc,
	cuda_free,
	cuda_upload,
	cuda_download,
	cuda_weight,
	cuda_synchronize,
	cuda_embed,
	cuda_rmsnorm,
	cuda_matmul,
	cuda_rope,
	cuda_kv_store,
	cuda_attention,
	cuda_attention_part,
	cuda_attention_staged,
	cuda_attention_finish,
	cuda_kv_stage,
	cuda_copy_wait,
	cuda_swiglu,
	cuda_add,
	cuda_gather_rows,
	cuda_moe_route,
	cuda_moe_matmul,
	cuda_moe_combine,
	cuda_comm_open,
	cuda_comm_id,
	cuda_allreduce,
	cuda_comm_end,
	cuda_sample,
	cuda_draw_rows,
	cuda_draw,
	cuda_drawn,
	cuda_graph,
	cuda_copy,
	cuda_memory,
	cuda_host_alloc,
	cuda_host_free,
	cuda_copy_async,
	cuda_copy_done,
	cuda_conv1d,
	cuda_delta_rule,
	cuda_rmsnorm_gated,
	cuda_sigmoid_mul,
	cuda_matmul_n,
	cuda_rope_store,
	cuda_matmul_swiglu,
	cuda_rmsnorm_product,
};

static int check_config(const struct kt_config *c, char *err, size_t errlen)
{
	if (c->max_tokens <= 0 || c->max_context <= 0 || c->max_seqs < 0)
		return atlas_errf(err, errlen, -EINVAL,
				  "backend cuda: max_tokens %d, max_context %d, max_seqs %d: "
				  "must be > 0", c->max_tokens, c->max_context, c->max_seqs);
	if (c->max_head_dim <= 0 || c->max_head_dim % 2 || c->max_head_dim > CUDA_MAX_HEAD_DIM)
		return atlas_errf(err, errlen, -EINVAL,
				  "backend cuda: max_head_dim %d: must be even, > 0 and <= %d",
				  c->max_head_dim, CUDA_MAX_HEAD_DIM);
	return 0;
}

/* The device index, checked against the devices present. */
static int pick_device(const struct kt_config *c, char *err, size_t errlen)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);

	if (e != cudaSuccess) {
		(void)cudaGetLastError();
		return atlas_errf(err, errlen, -ENODEV, "backend cuda: no usable CUDA device: %s",
				  cudaGetErrorString(e));
	}
	if (n <= 0)
		return atlas_errf(err, errlen, -ENODEV, "backend cuda: no CUDA device");
	if (c->device < 0 || c->device >= n)
		return atlas_errf(err, errlen, -ENODEV,
				  "backend cuda: device %d: out of range (this machine has %d CUDA "
				  "device%s, 0..%d)", c->device, n, n == 1 ? "" : "s", n - 1);
	return 0;
}

/* Everything the ops need; returns the failing step's name in *what. */
static cudaError_t make_resources(struct cuda_backend *cu, const char **what)
{
	const size_t rows_bytes = (size_t)cu->sample_cap * sizeof(*cu->rows_host);
	const size_t ids_bytes = (size_t)cu->sample_cap * sizeof(*cu->ids_host);
	cudaError_t e;

#define STEP(call)                        \
	do {                              \
		*what = #call;            \
		if ((e = (call)))         \
			return e;         \
	} while (0)
	STEP(cudaStreamCreateWithFlags(&cu->stream, cudaStreamNonBlocking));
	STEP(cudaMalloc(&cu->blas_ws, CUDA_BLAS_WS_BYTES));
	STEP(cudaMalloc((void **)&cu->fault, sizeof(*cu->fault)));
	STEP(cudaMemsetAsync(cu->fault, 0, sizeof(*cu->fault), cu->stream));
	STEP(cudaHostAlloc((void **)&cu->fault_host, sizeof(*cu->fault_host), cudaHostAllocMapped));
	STEP(cudaHostGetDevicePointer((void **)&cu->fault_map, cu->fault_host, 0));
	STEP(cudaMallocHost((void **)&cu->rows_host, rows_bytes));
	STEP(cudaHostAlloc((void **)&cu->draw_host, rows_bytes, cudaHostAllocMapped));
	STEP(cudaHostGetDevicePointer((void **)&cu->draw_map, cu->draw_host, 0));
	STEP(cudaHostAlloc((void **)&cu->ids_host, ids_bytes, cudaHostAllocMapped));
	STEP(cudaHostGetDevicePointer((void **)&cu->ids_map, cu->ids_host, 0));
	STEP(cudaMalloc((void **)&cu->rows_dev, rows_bytes));
	STEP(cudaMalloc((void **)&cu->sample_part,
			(size_t)cu->sample_cap * CUDA_SAMPLE_MAX_CHUNKS * sizeof(*cu->sample_part)));
	STEP(cudaMalloc((void **)&cu->sample_count, (size_t)cu->sample_cap * sizeof(unsigned)));
	STEP(cudaMalloc((void **)&cu->sample_cand, (size_t)CUDA_SAMPLE_TOPK_ROWS *
							   CUDA_SAMPLE_TOPK_CAND *
							   sizeof(*cu->sample_cand)));
	STEP(cudaMemsetAsync(cu->sample_count, 0, (size_t)cu->sample_cap * sizeof(unsigned),
			     cu->stream));
	STEP(cudaMalloc((void **)&cu->norm_count, sizeof(*cu->norm_count)));
	STEP(cudaMemsetAsync(cu->norm_count, 0, sizeof(*cu->norm_count), cu->stream));
	STEP(cuda_transfer_open(cu));
#undef STEP
	*what = "matmul workspace";
	return cuda_grow_xbf16(cu, CUDA_XBF16_MIN_COLS) ? cudaErrorMemoryAllocation : cudaSuccess;
}

static int make_blas(struct cuda_backend *cu, const char **what)
{
	*what = "cublasCreate";
	if (cublasCreate(&cu->blas) != CUBLAS_STATUS_SUCCESS)
		return -EIO;
	*what = "cublasSetStream";
	if (cublasSetStream(cu->blas, cu->stream) != CUBLAS_STATUS_SUCCESS)
		return -EIO;
	*what = "cublasSetWorkspace";
	if (cublasSetWorkspace(cu->blas, cu->blas_ws, CUDA_BLAS_WS_BYTES) != CUBLAS_STATUS_SUCCESS)
		return -EIO;
	return 0;
}

static int setup(struct cuda_backend *cu, char *err, size_t errlen)
{
	struct kt_device_info *info = &cu->base.info;
	struct cudaDeviceProp prop;
	const char *what;
	size_t free_b = 0, total_b = 0;
	cudaError_t e = cudaSetDevice(cu->device);

	if (!e)
		e = cudaGetDeviceProperties(&prop, cu->device);
	if (e)
		return atlas_errf(err, errlen, -EIO, "backend cuda: device %d: %s", cu->device,
				  cudaGetErrorString(e));
	if ((e = cuda_probe_kernels())) {
		(void)cudaGetLastError();
		return atlas_errf(err, errlen, -ENOTSUP,
				  "backend cuda: device %d (%s, compute capability %d.%d): this "
				  "build has no kernels for it (%s); rebuild with -Dgpu_arch=%d%d",
				  cu->device, prop.name, prop.major, prop.minor,
				  cudaGetErrorString(e), prop.major, prop.minor);
	}
	if ((e = make_resources(cu, &what)))
		return atlas_errf(err, errlen, e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO,
				  "backend cuda: device %d (%s): %s: %s", cu->device, prop.name,
				  what, cudaGetErrorString(e));
	if (make_blas(cu, &what))
		return atlas_errf(err, errlen, -EIO, "backend cuda: device %d (%s): %s failed",
				  cu->device, prop.name, what);
	if ((e = cudaMemGetInfo(&free_b, &total_b)))
		return atlas_errf(err, errlen, -EIO, "backend cuda: device %d: cudaMemGetInfo: %s",
				  cu->device, cudaGetErrorString(e));
	snprintf(info->name, sizeof info->name, "%.*s", (int)sizeof info->name - 1, prop.name);
	snprintf(info->backend, sizeof info->backend, "cuda");
	snprintf(info->pci_bus_id, sizeof info->pci_bus_id, "%04x:%02x:%02x.0",
		 (unsigned)prop.pciDomainID & 0xffff, (unsigned)prop.pciBusID & 0xff,
		 (unsigned)prop.pciDeviceID & 0xff);
	info->memory_total = total_b;
	info->memory_free = free_b;
	info->kv_dtype = KT_BF16;
	info->att_p_bf16 = true;
	info->matmul_x_bf16 = true;
	info->graphs = true;
	info->queued = true;
	cu->pdl = cu->pdl && prop.major >= 9;
	return 0;
}

int kt_cuda_open(const struct kt_config *c, struct kt_backend **out, char *err, size_t errlen)
{
	struct cuda_backend *cu;
	int rc = check_config(c, err, errlen);

	if (rc || (rc = pick_device(c, err, errlen)))
		return rc;
	cu = (struct cuda_backend *)calloc(1, sizeof(*cu));
	if (!cu)
		return atlas_errf(err, errlen, -ENOMEM, "backend cuda: out of memory");
	cu->base.ops = &cuda_ops;
	cu->device = c->device;
	cu->max_tokens = c->max_tokens;
	cu->max_context = c->max_context;
	cu->max_head_dim = c->max_head_dim;
	cu->pdl = c->cuda_pdl;
	cu->sample_cap = c->max_tokens > c->max_seqs ? c->max_tokens : c->max_seqs;
	pthread_mutex_init(&cu->lock, NULL);
	rc = setup(cu, err, errlen);
	if (!rc && (rc = cuda_gemv_open(cu)))
		atlas_errf(err, errlen, rc, "backend cuda: device %d: GEMV setup: %s", cu->device,
			   strerror(-rc));
	if (!rc && (rc = cuda_attention_open(cu, c)))
		atlas_errf(err, errlen, rc, "backend cuda: device %d: attention workspace: %s",
			   cu->device, strerror(-rc));
	if (!rc && (rc = cuda_moe_open(cu, c)))
		atlas_errf(err, errlen, rc, "backend cuda: device %d: MoE workspace: %s",
			   cu->device, strerror(-rc));
	if (rc) {
		cuda_close(&cu->base);
		return rc;
	}
	*out = &cu->base;
	return 0;
}
