/* Rotary position embedding in place, rotate-half pairing (GPT-NeoX, Hugging
 * Face), over the first R = 2 * inv_freq.cols dims of each head (R < D is
 * partial rotary: the other D - R dims pass unchanged), with Qwen3's
 * per-head RMSNorm (q_norm, k_norm) fused in front, as the cpu backend
 * computes them.
 *
 * Norm (when norm_w): each head's D values as cpu_rmsnorm does a row: the
 * sum of squares in double, var = (float)(ss / D), inv = 1/sqrtf(var + eps),
 * x = w * (x * inv). The squares of f32 values are exact in double, so only
 * the order of the double sum differs from the cpu, which almost never shows
 * in the f32 var.
 *
 * Rotation: x[i] and x[i + R/2] rotated by the f32 angle (float)pos *
 * inv_freq[i], with cosf/sinf (the accurate library functions, not the
 * __cosf intrinsics) and unfused products (__fmul_rn), so the result matches
 * the cpu within the last bits of cosf/sinf.
 *
 * Layout: x [T, n_heads * D] f32, pos [T, 1] i32 (device), inv_freq
 * [1, R/2] f32 (0 < R <= D), norm_w NULL or [1, D] f32 or bf16 (a weight as
 * kt_weight stores it).
 *
 * Launch: one block of CUDA_THREADS per token. The block first puts the
 * token's R/2 cos/sin pairs in shared memory; then each warp takes whole
 * heads (warp v: heads v, v + 8, ...), lane l holding pairs l, l + 32, ...
 * and the unrotated tail dims R + l, R + l + 32, ... in registers from load
 * through norm and rotation to store, the head's sum of squares reduced by a
 * butterfly shuffle. With R == D the tail is empty and the kernel does what
 * it did before partial rotary, operation for operation. A negative
 * position leaves the token alone and sets CUDA_FAULT_ROPE.
 */
#include <errno.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_impl.h"
#include "kernels/cuda/cuda_reduce.cuh"

/* Pairs a lane holds: R/2 <= CUDA_MAX_HEAD_DIM/2 spread over 32 lanes. */
#define ROPE_PAIRS (CUDA_MAX_HEAD_DIM / 64)
/* Unrotated dims a lane holds: D - R < CUDA_MAX_HEAD_DIM spread over 32 lanes. */
#define ROPE_TAIL (CUDA_MAX_HEAD_DIM / 32)

/* Normalise one head held as pairs (a[j], b[j]) = (x[i], x[i + R/2]),
 * i = lane + 32·j < n_pairs = R/2, and the tail c[j] = x[R + lane + 32·j]
 * of n_tail = D - R dims, as cpu_rmsnorm does a row of D. */
template <typename W>
__device__ __forceinline__ void norm_head(float (&a)[ROPE_PAIRS], float (&b)[ROPE_PAIRS],
					  float (&c)[ROPE_TAIL], const W *w, int lane,
					  int n_pairs, int n_tail, float eps)
{
	const int R = 2 * n_pairs;
	double ss = 0.0;
	float inv;

#pragma unroll
	for (int j = 0; j < ROPE_PAIRS; j++)
		if (lane + 32 * j < n_pairs)
			ss += (double)a[j] * a[j] + (double)b[j] * b[j];
#pragma unroll
	for (int j = 0; j < ROPE_TAIL; j++)
		if (lane + 32 * j < n_tail)
			ss += (double)c[j] * c[j];
	ss = warp_reduce(ss, op_sum());
	inv = 1.0f / sqrtf((float)(ss / (double)(R + n_tail)) + eps);
#pragma unroll
	for (int j = 0; j < ROPE_PAIRS; j++) {
		const int i = lane + 32 * j;

		if (i < n_pairs) {
			a[j] = widen(w[i]) * (a[j] * inv);
			b[j] = widen(w[i + n_pairs]) * (b[j] * inv);
		}
	}
#pragma unroll
	for (int j = 0; j < ROPE_TAIL; j++) {
		const int i = lane + 32 * j;

		if (i < n_tail)
			c[j] = widen(w[R + i]) * (c[j] * inv);
	}
}

/* n_pairs = R/2 rotated pairs of each head of D dims. */
template <typename W>
__global__ void rope_kernel(float *x, const int32_t *pos, const float *inv_freq, const W *norm_w,
			    float eps, int n_heads, int D, int n_pairs, unsigned *fault)
{
	__shared__ float cs[CUDA_MAX_HEAD_DIM / 2], sn[CUDA_MAX_HEAD_DIM / 2];
	const int half = n_pairs, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const int tail = D - 2 * half;
	const int32_t p = pos[blockIdx.x];
	float *xt = x + (int64_t)blockIdx.x * n_heads * D;

	if (p < 0) {
		if (threadIdx.x == 0)
			atomicOr(fault, CUDA_FAULT_ROPE);
		return;
	}
	for (int i = threadIdx.x; i < half; i += blockDim.x) {
		float angle = (float)p * inv_freq[i];

		cs[i] = cosf(angle);
		sn[i] = sinf(angle);
	}
	__syncthreads();
	for (int h = warp; h < n_heads; h += blockDim.x >> 5) {
		float *xa = xt + (int64_t)h * D, *xb = xa + half, *xc = xa + 2 * half;
		float a[ROPE_PAIRS], b[ROPE_PAIRS], c[ROPE_TAIL];

#pragma unroll
		for (int j = 0; j < ROPE_PAIRS; j++) {
			const int i = lane + 32 * j;

			a[j] = i < half ? xa[i] : 0.0f;
			b[j] = i < half ? xb[i] : 0.0f;
		}
#pragma unroll
		for (int j = 0; j < ROPE_TAIL; j++) {
			const int i = lane + 32 * j;

			c[j] = i < tail ? xc[i] : 0.0f;
		}
		if (norm_w)
			norm_head(a, b, c, norm_w, lane, half, tail, eps);
#pragma unroll
		for (int j = 0; j < ROPE_PAIRS; j++) {
			const int i = lane + 32 * j;

			if (i < half) {
				xa[i] = __fmul_rn(a[j], cs[i]) - __fmul_rn(b[j], sn[i]);
				xb[i] = __fmul_rn(b[j], cs[i]) + __fmul_rn(a[j], sn[i]);
			}
		}
		/* The tail changes only when the norm scaled it. */
		if (norm_w) {
#pragma unroll
			for (int j = 0; j < ROPE_TAIL; j++) {
				const int i = lane + 32 * j;

				if (i < tail)
					xc[i] = c[j];
			}
		}
	}
}

static bool rope_args_ok(const struct cuda_backend *cu, const struct kt_tensor *x,
			 const struct kt_tensor *pos, const struct kt_tensor *inv_freq,
			 int n_heads, int head_dim, const struct kt_tensor *norm_w, float eps)
{
	if (n_heads <= 0 || head_dim <= 0 || head_dim % 2 || head_dim > cu->max_head_dim)
		return false;
	if (!cu_valid(x, KT_F32) || x->rows > INT32_MAX)
		return false;
	if (x->cols != (int64_t)n_heads * head_dim || !cu_shape(pos, KT_I32, x->rows, 1) ||
	    !cu_valid(inv_freq, KT_F32) || inv_freq->rows != 1 || inv_freq->cols < 1 ||
	    2 * inv_freq->cols > head_dim)
		return false;
	if (cu_overlap(x, pos) || cu_overlap(x, inv_freq))
		return false;
	if (norm_w && (!cu_float(norm_w) || norm_w->rows != 1 || norm_w->cols != head_dim ||
		       cu_overlap(x, norm_w) || !(eps >= 0.0f)))
		return false;
	return true;
}

int cuda_rope(struct kt_backend *be, const struct kt_tensor *x, const struct kt_tensor *pos,
	      const struct kt_tensor *inv_freq, int n_heads, int head_dim,
	      const struct kt_tensor *norm_w, float eps)
{
	struct cuda_backend *cu = cu_of(be);
	const unsigned T = (unsigned)(x && x->rows > 0 ? x->rows : 0);
	float *xd;
	const int32_t *pd;
	const float *fd;

	if (!rope_args_ok(cu, x, pos, inv_freq, n_heads, head_dim, norm_w, eps))
		return -EINVAL;
	if (!T)
		return 0;
	xd = (float *)x->data;
	pd = (const int32_t *)pos->data;
	fd = (const float *)inv_freq->data;
	CU_CHECK(cu_enter(cu));
	if (norm_w && norm_w->dtype == KT_BF16)
		rope_kernel<<<T, CUDA_THREADS, 0, cu->stream>>>(
			xd, pd, fd, (const __nv_bfloat16 *)norm_w->data, eps, n_heads, head_dim,
			(int)inv_freq->cols, cu->fault);
	else
		rope_kernel<<<T, CUDA_THREADS, 0, cu->stream>>>(
			xd, pd, fd, norm_w ? (const float *)norm_w->data : (const float *)NULL, eps,
			n_heads, head_dim, (int)inv_freq->cols, cu->fault);
	CU_LAUNCHED();
	return 0;
}
