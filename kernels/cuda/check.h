/* Error checks of the cuda backend.
 *
 * Every CUDA runtime, cuBLAS and NCCL call goes through CU_CHECK /
 * BLAS_CHECK / NCCL_CHECK: on failure the call, the error and the caller's
 * file:line are logged and the enclosing function returns a negative errno
 * (-ENOMEM for allocation failures; NCCL: -EINVAL for a bad argument or
 * usage, -EPIPE for a peer's failure; -EIO otherwise). Kernel launches are
 * followed by CU_LAUNCHED(), which reports launch errors (bad configuration,
 * missing kernel image); faults during execution surface at the next
 * synchronizing call. CU_WARN is for teardown paths that cannot return an
 * error.
 */
#ifndef ATLAS_KERNELS_CUDA_CHECK_H
#define ATLAS_KERNELS_CUDA_CHECK_H

#include <errno.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

extern "C" {
#include "common/log.h"
}

static inline int cuda_fail(cudaError_t e, const char *call, const char *file, int line)
{
	atlas_log_at(ATLAS_LOG_ERROR, file, line, "cuda: %s: %s (%s)", call, cudaGetErrorString(e),
		     cudaGetErrorName(e));
	return e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;
}

static inline int blas_fail(cublasStatus_t s, const char *call, const char *file, int line)
{
	atlas_log_at(ATLAS_LOG_ERROR, file, line, "cublas: %s: %s", call, cublasGetStatusString(s));
	return s == CUBLAS_STATUS_ALLOC_FAILED ? -ENOMEM : -EIO;
}

static inline int nccl_errno(ncclResult_t r)
{
	switch (r) {
	case ncclInvalidArgument:
	case ncclInvalidUsage:
		return -EINVAL;
	case ncclRemoteError:
		return -EPIPE;
	default:
		return -EIO;
	}
}

static inline int nccl_fail(ncclResult_t r, const char *call, const char *file, int line)
{
	atlas_log_at(ATLAS_LOG_ERROR, file, line, "nccl: %s: %s", call, ncclGetErrorString(r));
	return nccl_errno(r);
}

#define CU_CHECK(call)                                                      \
	do {                                                                \
		cudaError_t e_ = (call);                                    \
		if (e_ != cudaSuccess)                                      \
			return cuda_fail(e_, #call, __FILE__, __LINE__);    \
	} while (0)

#define BLAS_CHECK(call)                                                    \
	do {                                                                \
		cublasStatus_t s_ = (call);                                 \
		if (s_ != CUBLAS_STATUS_SUCCESS)                            \
			return blas_fail(s_, #call, __FILE__, __LINE__);    \
	} while (0)

#define NCCL_CHECK(call)                                                    \
	do {                                                                \
		ncclResult_t r_ = (call);                                   \
		if (r_ != ncclSuccess)                                      \
			return nccl_fail(r_, #call, __FILE__, __LINE__);    \
	} while (0)

#define CU_LAUNCHED() CU_CHECK(cudaGetLastError())

#define CU_WARN(call)                                                       \
	do {                                                                \
		cudaError_t e_ = (call);                                    \
		if (e_ != cudaSuccess)                                      \
			(void)cuda_fail(e_, #call, __FILE__, __LINE__);     \
	} while (0)

#endif
