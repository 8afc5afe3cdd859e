/* RMSNorm with the fused residual add, as the cpu backend computes it:
 * x += residual (when given); var = mean(x²) summed in double;
 * out = w * (x * 1/sqrt(var + eps)).
 *
 * Layout: out, x, residual [R, D] f32; w [1, D] f32 or bf16 (a weight as
 * kt_weight stores it). rmsnorm's out may be bf16 instead (apart from x
 * and residual): the f32 value rounded to nearest even as it is stored,
 * the bits that the product reading it would have rounded it to.
 *
 * Launch: one block of CUDA_THREADS per row. Pass 1 adds the residual,
 * writes x and sums squares (per thread, then block_reduce); pass 2 writes
 * out. Every element is read and written by the same thread in both passes,
 * so out may be x or residual.
 *
 * Rows of D a multiple of 4 and at most NORM_VEC_MAX_D (every model's
 * hidden size) take rmsnorm_vec_kernel: each thread loads all its float4s
 * of x and residual into registers before it stores anything. The loads are
 * then independent and in flight together; in the plain loop each load waits
 * for the store before it (out and x may alias), and a decode step's row of
 * 4096 took 15 us on an H100 instead of a few (ncu, 2026-11-22).
 *
 * rmsnorm_product: one row that the GEMV can norm (out bf16, D a multiple
 * of 8 and at most GEMV_NORM_MAX_K, the vector kernel's alignment) is not
 * launched; it waits in cu->norm_pending for the product after it, whose
 * GEMV takes it (cuda_norm_take, cuda_gemv_norm.cuh) and computes it with
 * this file's arithmetic. Any other op launches it first (cu_enter).
 *
 * rmsnorm_gated (the gated norm of the delta rule's heads): out = w * (x *
 * inv) * silu(z), the same var and inv, silu(z) = z / (1 + e^-z). Its rows
 * are one head each (D = v_dim, 128 in Qwen3-Next), so a warp takes a row
 * (CUDA_THREADS / 32 rows per block); lane l reads and writes elements
 * l, l + 32, ... in both passes, so out may be x.
 */
#include <errno.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_gemv.h"
#include "kernels/cuda/cuda_gemv_norm.cuh"
#include "kernels/cuda/cuda_impl.h"
#include "kernels/cuda/cuda_norm.cuh"
#include "kernels/cuda/cuda_pdl.cuh"
#include "kernels/cuda/cuda_reduce.cuh"

template <typename W, typename O>
__global__ void rmsnorm_kernel(O *out, float *x, const float *res, const W *w, int64_t D,
			       float eps)
{
	__shared__ double part[32];
	const int64_t off = blockIdx.x * D;
	float *xr = x + off;
	O *o = out + off;
	double ss = 0.0;
	float inv;

	pdl_wait();
	pdl_launch_dependents();
	for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
		float v = xr[d];

		if (res) {
			v += res[off + d];
			xr[d] = v;
		}
		ss += (double)v * v;
	}
	ss = block_reduce(ss, op_sum(), 0.0, part);
	inv = 1.0f / sqrtf((float)(ss / (double)D) + eps);
	for (int64_t d = threadIdx.x; d < D; d += blockDim.x)
		narrow_to(&o[d], widen(w[d]) * (xr[d] * inv));
}

template <typename W, typename O>
__global__ void rmsnorm_vec_kernel(O *out, float *x, const float *res, const W *w,
				   int64_t D, float eps)
{
	__shared__ double part[32];
	const int64_t off = blockIdx.x * D, D4 = D / 4;
	float4 *xr = reinterpret_cast<float4 *>(x + off);
	O *o = out + off;
	const float4 *rr = res ? reinterpret_cast<const float4 *>(res + off) : NULL;
	float4 v[NORM_VEC];
	float inv;

	pdl_wait();
	pdl_launch_dependents();
	norm_vec_load(v, xr, rr, D4);
	if (rr) {
#pragma unroll
		for (int j = 0; j < NORM_VEC; j++)
			if (norm_vec_index(j) < D4)
				xr[norm_vec_index(j)] = v[j];
	}
	inv = norm_vec_inv(v, D4, eps, part);
#pragma unroll
	for (int j = 0; j < NORM_VEC; j++)
		if (norm_vec_index(j) < D4)
			narrow4_to(o, norm_vec_index(j),
				   norm_vec_out(weights4(w, norm_vec_index(j)), v[j], inv));
}

/* The vector kernel applies: D fits the registers and rows are 16-byte aligned. */
static bool vec_ok(const struct kt_tensor *out, const struct kt_tensor *x, const float *res,
		   const struct kt_tensor *w, int64_t D)
{
	const uintptr_t a = (uintptr_t)out->data | (uintptr_t)x->data | (uintptr_t)res |
			    (uintptr_t)w->data;

	return D % 4 == 0 && D <= NORM_VEC_MAX_D && a % 16 == 0;
}

template <typename O, typename W>
static void launch_rmsnorm(struct cuda_backend *cu, bool vec, O *out, float *x, const float *res,
			   const W *w, int64_t R, int64_t D, float eps)
{
	if (vec)
		cu_launch(cu->pdl, rmsnorm_vec_kernel<W, O>, (unsigned)R, CUDA_THREADS, 0, cu->stream, out,
			  x, res, w, D, eps);
	else
		cu_launch(cu->pdl, rmsnorm_kernel<W, O>, (unsigned)R, CUDA_THREADS, 0, cu->stream, out, x,
			  res, w, D, eps);
}

template <typename O>
static void launch_rmsnorm(struct cuda_backend *cu, bool vec, O *out, float *x, const float *res,
			   const struct kt_tensor *w, int64_t R, int64_t D, float eps)
{
	if (w->dtype == KT_BF16)
		launch_rmsnorm(cu, vec, out, x, res, (const __nv_bfloat16 *)w->data, R, D, eps);
	else
		launch_rmsnorm(cu, vec, out, x, res, (const float *)w->data, R, D, eps);
}

/* rmsnorm's arguments: 0 or -EINVAL. */
static int rmsnorm_args(const struct kt_tensor *out, const struct kt_tensor *x,
			const struct kt_tensor *residual, const struct kt_tensor *w, float eps)
{
	int64_t R, D;
	bool out16;

	if (!cu_valid(x, KT_F32))
		return -EINVAL;
	R = x->rows;
	D = x->cols;
	out16 = out && out->dtype == KT_BF16;
	if (!cu_shape(out, out16 ? KT_BF16 : KT_F32, R, D) || !cu_float(w) || w->rows != 1 ||
	    w->cols != D)
		return -EINVAL;
	if (residual && !cu_shape(residual, KT_F32, R, D))
		return -EINVAL;
	if (!cu_same_or_apart(out, x) ||
	    (residual && (!cu_same_or_apart(out, residual) || !cu_same_or_apart(x, residual))))
		return -EINVAL;
	if (out16 && (cu_overlap(out, x) || (residual && cu_overlap(out, residual))))
		return -EINVAL;
	if (!(eps >= 0.0f) || R > INT32_MAX)
		return -EINVAL;
	return 0;
}

/* Enqueue rmsnorm on checked arguments. */
static void rmsnorm_launch(struct cuda_backend *cu, const struct kt_tensor *out,
			   const struct kt_tensor *x, const float *res, const struct kt_tensor *w,
			   float eps)
{
	const int64_t R = x->rows, D = x->cols;
	/* vec_ok wants out 16-byte aligned; a bf16 row of out then starts
	 * 8-byte aligned (D % 4 == 0), what narrow4_to's stores need */
	const bool vec = vec_ok(out, x, res, w, D);

	if (out->dtype == KT_BF16)
		launch_rmsnorm(cu, vec, (__nv_bfloat16 *)out->data, (float *)x->data, res, w, R, D,
			       eps);
	else
		launch_rmsnorm(cu, vec, (float *)out->data, (float *)x->data, res, w, R, D, eps);
}

int cuda_rmsnorm(struct kt_backend *be, const struct kt_tensor *out, const struct kt_tensor *x,
		 const struct kt_tensor *residual, const struct kt_tensor *w, float eps)
{
	struct cuda_backend *cu = cu_of(be);
	int rc = rmsnorm_args(out, x, residual, w, eps);

	if (rc)
		return rc;
	if (!x->rows || !x->cols)
		return 0;
	CU_CHECK(cu_enter(cu));
	rmsnorm_launch(cu, out, x, residual ? (const float *)residual->data : NULL, w, eps);
	CU_LAUNCHED();
	return 0;
}

/* rmsnorm_product: a row the GEMV can norm (one row, out bf16 for the
 * product's x, the vector kernel's shape) is left pending for the product
 * after it; anything else runs as rmsnorm. */
int cuda_rmsnorm_product(struct kt_backend *be, const struct kt_tensor *out,
			 const struct kt_tensor *x, const struct kt_tensor *residual,
			 const struct kt_tensor *w, float eps)
{
	struct cuda_backend *cu = cu_of(be);
	const float *res = residual ? (const float *)residual->data : NULL;
	int rc = rmsnorm_args(out, x, residual, w, eps);

	if (rc)
		return rc;
	if (x->rows != 1 || out->dtype != KT_BF16 || x->cols > GEMV_NORM_MAX_K ||
	    x->cols % 8 || !vec_ok(out, x, res, w, x->cols) || !cu->norm_count)
		return cuda_rmsnorm(be, out, x, residual, w, eps);
	CU_CHECK(cu_enter(cu));
	cu->norm_pending.out = *out;
	cu->norm_pending.x = *x;
	cu->norm_pending.res = residual ? *residual : (struct kt_tensor){};
	cu->norm_pending.w = *w;
	cu->norm_pending.eps = eps;
	cu->norm_pending.set = true;
	return 0;
}

cudaError_t cuda_norm_flush(struct cuda_backend *cu)
{
	struct cuda_norm_pending *p = &cu->norm_pending;

	p->set = false;
	rmsnorm_launch(cu, &p->out, &p->x, (const float *)p->res.data, &p->w, p->eps);
	return cudaGetLastError();
}

bool cuda_norm_take(struct cuda_backend *cu, const struct kt_tensor *x, struct gemv_norm *n)
{
	struct cuda_norm_pending *p = &cu->norm_pending;

	if (!p->set || x->data != p->out.data || x->dtype != KT_BF16 || x->rows != 1 ||
	    x->cols != p->out.cols)
		return false;
	p->set = false;
	n->x = (float *)p->x.data;
	n->res = (const float *)p->res.data;
	n->w = p->w.data;
	n->w_bf16 = p->w.dtype == KT_BF16;
	n->eps = p->eps;
	n->count = cu->norm_count;
	return true;
}

template <typename W>
__global__ void rmsnorm_gated_kernel(float *out, const float *x, const float *z, const W *w,
				     int64_t R, int64_t D, float eps)
{
	const int lane = threadIdx.x & 31;
	const int64_t r = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
	const float *xr = x + r * D, *zr = z + r * D;
	float *o = out + r * D;
	double ss = 0.0;
	float inv;

	if (r >= R)
		return;
	for (int64_t d = lane; d < D; d += 32)
		ss += (double)xr[d] * xr[d];
	ss = warp_reduce(ss, op_sum());
	inv = 1.0f / sqrtf((float)(ss / (double)D) + eps);
	for (int64_t d = lane; d < D; d += 32) {
		const float zv = zr[d];

		o[d] = widen(w[d]) * (xr[d] * inv) * (zv / (1.0f + expf(-zv)));
	}
}

int cuda_rmsnorm_gated(struct kt_backend *be, const struct kt_tensor *out,
		       const struct kt_tensor *x, const struct kt_tensor *z,
		       const struct kt_tensor *w, float eps)
{
	struct cuda_backend *cu = cu_of(be);
	const int rows_per_block = CUDA_THREADS / 32;
	int64_t R, D, blocks;

	if (!cu_valid(x, KT_F32))
		return -EINVAL;
	R = x->rows;
	D = x->cols;
	if (!cu_shape(out, KT_F32, R, D) || !cu_shape(z, KT_F32, R, D) || !cu_float(w) ||
	    w->rows != 1 || w->cols != D)
		return -EINVAL;
	if (!cu_same_or_apart(out, x) || cu_overlap(out, z) || cu_overlap(out, w))
		return -EINVAL;
	if (!(eps >= 0.0f))
		return -EINVAL;
	if (!R || !D)
		return 0;
	blocks = (R + rows_per_block - 1) / rows_per_block;
	if (blocks > INT32_MAX)
		return -EINVAL;
	CU_CHECK(cu_enter(cu));
	if (w->dtype == KT_BF16)
		rmsnorm_gated_kernel<<<(unsigned)blocks, CUDA_THREADS, 0, cu->stream>>>(
			(float *)out->data, (const float *)x->data, (const float *)z->data,
			(const __nv_bfloat16 *)w->data, R, D, eps);
	else
		rmsnorm_gated_kernel<<<(unsigned)blocks, CUDA_THREADS, 0, cu->stream>>>(
			(float *)out->data, (const float *)x->data, (const float *)z->data,
			(const float *)w->data, R, D, eps);
	CU_LAUNCHED();
	return 0;
}
