/* The cpu backend: the reference implementation of kernels/backend.h in
 * threaded C (OpenMP), with results that do not depend on the batch a token
 * is computed in (DESIGN §4.1). */
#ifndef ATLAS_KERNELS_CPU_H
#define ATLAS_KERNELS_CPU_H

#include <stddef.h>

#include "kernels/backend.h"

int kt_cpu_open(const struct kt_config *c, struct kt_backend **out, char *err, size_t errlen);

#endif
