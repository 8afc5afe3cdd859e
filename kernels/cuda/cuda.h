/* The cuda backend: kernels/backend.h on one NVIDIA GPU, hand-written
 * kernels (.cu) for the memory-bound ops and cuBLAS for matrix products.
 * Weights are bf16 on the device, activations and the KV cache f32. */
#ifndef ATLAS_KERNELS_CUDA_H
#define ATLAS_KERNELS_CUDA_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/backend.h"

/* A CUDA device is present and its driver answers; prints nothing when not. */
bool kt_cuda_available(void);

/* Open device c->device; fills err (naming the device) on failure. */
int kt_cuda_open(const struct kt_config *c, struct kt_backend **out, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
