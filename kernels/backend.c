/* Backend selection and the dtype table. */
#include "kernels/backend.h"

#include <errno.h>
#include <string.h>

#include "common/err.h"
#include "kernels/cpu/cpu.h"
#ifdef ATLAS_HAVE_CUDA
#include "kernels/cuda/cuda.h"
#endif

size_t kt_dtype_size(enum kt_dtype t)
{
	switch (t) {
	case KT_F32: return 4;
	case KT_F16: return 2;
	case KT_BF16: return 2;
	case KT_I32: return 4;
	}
	return 0;
}

const char *kt_dtype_name(enum kt_dtype t)
{
	switch (t) {
	case KT_F32: return "f32";
	case KT_F16: return "f16";
	case KT_BF16: return "bf16";
	case KT_I32: return "i32";
	}
	return "?";
}

const char *kt_backends_built(void)
{
#ifdef ATLAS_HAVE_CUDA
	return "cpu cuda";
#else
	return "cpu";
#endif
}

const char *kt_backend_resolve(const char *name)
{
	if (name && *name && strcmp(name, "auto"))
		return name;
#ifdef ATLAS_HAVE_CUDA
	if (kt_cuda_available())
		return "cuda";
#endif
	return "cpu";
}

int kt_backend_open(const struct kt_config *c, struct kt_backend **out, char *err, size_t errlen)
{
	const char *name = kt_backend_resolve(c->backend);
	if (strcmp(name, "cpu") == 0)
		return kt_cpu_open(c, out, err, errlen);
	if (strcmp(name, "cuda") == 0) {
#ifdef ATLAS_HAVE_CUDA
		return kt_cuda_open(c, out, err, errlen);
#else
		return atlas_errf(err, errlen, -ENOTSUP,
				  "backend cuda: this build has no CUDA backend (built: %s)",
				  kt_backends_built());
#endif
	}
	return atlas_errf(err, errlen, -EINVAL, "backend %s: unknown (auto, cpu or cuda)", name);
}
