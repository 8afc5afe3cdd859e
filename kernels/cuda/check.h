/* Error checks of the cuda backend.
 *
 * Every CUDA runtime and cuBLAS call goes through CU_CHECK / BLAS_CHECK: on
 * failure the call, the error and the caller's file:line are logged and the
 * enclosing function returns a negative errno (-ENOMEM for allocation
 * failures, -EIO otherwise). Kernel launches are followed by CU_LAUNCHED(),
 * which reports launch errors (bad configuration, missing kernel image);
 * faults during execution surface at the next synchronizing call. CU_WARN is
 * for teardown paths that cannot return an error.
 */
#ifndef ATLAS_KERNELS_CUDA_CHECK_H
#define ATLAS_KERNELS_CUDA_CHECK_H

#include <errno.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

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

#define CU_LAUNCHED() CU_CHECK(cudaGetLastError())

#define CU_WARN(call)                                                       \
	do {                                                                \
		cudaError_t e_ = (call);                                    \
		if (e_ != cudaSuccess)                                      \
			(void)cuda_fail(e_, #call, __FILE__, __LINE__);     \
	} while (0)

#endif
