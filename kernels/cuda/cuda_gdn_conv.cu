/* conv1d of the Gated DeltaNet layers: the depthwise causal convolution over
 * each channel's last K inputs, then silu, with the conv state of each
 * sequence (kernels/backend.h, conv1d).
 *
 * Layout: out, x [T, C] f32 (apart); w [C, K] bf16 (a weight as kt_weight
 * stores it) or f32; state [n_slots, F] f32 whose first (K - 1) * C floats
 * of a row are the sequence's last K - 1 inputs [K - 1, C], oldest first;
 * slot [T, 1] i32 and b->pos [T, 1] i32 on the device.
 *
 *   out[t, c] = silu(sum over j < K of w[c, j] · in(pos[t] - K + 1 + j, c))
 *
 * in(p, c) is x at the row of t's sequence holding position p when that row
 * is in this step, the state's entry p - pos[r0] + K - 1 for p before the
 * first row r0 of t's run, and 0 for p < 0 (so a run starting at position 0
 * never reads its state row).
 *
 * Runs: a sequence's rows are consecutive at consecutive positions, so row
 * t continues the run of row t - 1 when both have the same slot and pos[t] =
 * pos[t - 1] + 1. Each thread finds its run's start by walking back at most
 * K - 1 rows (no input further back is needed), all on the device: no host
 * reads, so the op is graph-safe and needs no segment description.
 *
 * Launch: two grid-stride kernels over (row, channel), channels fastest so
 * that a warp reads consecutive x, w and state floats. conv1d_out_kernel
 * writes every output from the old state; then conv1d_state_kernel, for
 * the last row of each run only, shifts the state: entry j becomes
 * in(pos[last] - K + 2 + j). A thread owns one channel of a state row and
 * goes through j ascending; the old entry it reads for j is j + n_run > j
 * (n_run >= 1 rows in the run), not yet overwritten: in place is safe.
 *
 * A slot outside [0, n_slots) or a negative position sets
 * CUDA_FAULT_CONV1D; the row's outputs are NaN and its run's state is left
 * alone.
 *
 * Sums: f32, j ascending (fmaf); silu(s) = s / (1 + e^-s).
 */
#include <errno.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_impl.h"

struct conv_args {
	float *out;
	const float *x;
	float *state;
	const int32_t *slot, *pos;
	int64_t T, C, F, n_slots;
	int K;
	unsigned *fault;
};

/* Row t - 1 and row t belong to one run. */
__device__ __forceinline__ bool conv_continues(const conv_args &a, int64_t t)
{
	return a.slot[t - 1] == a.slot[t] && a.pos[t - 1] == a.pos[t] - 1;
}

/* The first row of t's run, or t - (K - 1) when the run goes back further
 * (then every input t needs is a row of this step). */
__device__ __forceinline__ int64_t conv_run_start(const conv_args &a, int64_t t)
{
	int64_t r0 = t;

	while (r0 > 0 && t - r0 < a.K - 1 && conv_continues(a, r0))
		r0--;
	return r0;
}

/* in(p, c) for the run of row t that starts (or is seen from) row r0; the
 * state row is srow. p <= pos[t]. */
__device__ __forceinline__ float conv_in(const conv_args &a, int64_t t, int64_t r0,
					 const float *srow, int64_t p, int64_t c)
{
	const int64_t pt = a.pos[t], p0 = a.pos[r0];

	if (p < 0)
		return 0.0f;
	if (p >= p0)
		return a.x[(t - (pt - p)) * a.C + c];
	return srow[(p - p0 + a.K - 1) * a.C + c];
}

/* The row's slot and position are usable; else flags the fault. */
__device__ __forceinline__ bool conv_row_ok(const conv_args &a, int64_t t)
{
	const int32_t s = a.slot[t];

	if (s >= 0 && s < a.n_slots && a.pos[t] >= 0)
		return true;
	atomicOr(a.fault, CUDA_FAULT_CONV1D);
	return false;
}

template <typename W>
__global__ void conv1d_out_kernel(conv_args a, const W *w)
{
	const int64_t n = a.T * a.C;

	for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n;
	     e += (int64_t)gridDim.x * blockDim.x) {
		const int64_t t = e / a.C, c = e % a.C;
		int64_t r0;
		const float *srow;
		float s = 0.0f;

		if (!conv_row_ok(a, t)) {
			a.out[e] = __int_as_float(0x7fc00000);
			continue;
		}
		r0 = conv_run_start(a, t);
		srow = a.state + (int64_t)a.slot[r0] * a.F;
		for (int j = 0; j < a.K; j++)
			s = fmaf(widen(w[c * a.K + j]),
				 conv_in(a, t, r0, srow, (int64_t)a.pos[t] - a.K + 1 + j, c), s);
		a.out[e] = s / (1.0f + expf(-s));
	}
}

__global__ void conv1d_state_kernel(conv_args a)
{
	const int64_t n = a.T * a.C;

	for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n;
	     e += (int64_t)gridDim.x * blockDim.x) {
		const int64_t t = e / a.C, c = e % a.C;
		int64_t r0;
		float *srow;

		/* Only the last row of a run writes its state. */
		if (t + 1 < a.T && conv_continues(a, t + 1))
			continue;
		/* The out kernel has flagged a bad row already. */
		if (a.slot[t] < 0 || a.slot[t] >= a.n_slots || a.pos[t] < 0)
			continue;
		r0 = conv_run_start(a, t);
		srow = a.state + (int64_t)a.slot[t] * a.F;
		for (int j = 0; j < a.K - 1; j++)
			srow[j * a.C + c] =
				conv_in(a, t, r0, srow, (int64_t)a.pos[t] - a.K + 2 + j, c);
	}
}

int cuda_conv1d(struct kt_backend *be, const struct kt_tensor *out, const struct kt_tensor *x,
		const struct kt_tensor *w, const struct kt_tensor *state,
		const struct kt_tensor *slot, const struct kt_batch *b)
{
	struct cuda_backend *cu = cu_of(be);
	conv_args a;
	int64_t T, C, K;
	unsigned blocks;

	if (!b || !cu_valid(x, KT_F32))
		return -EINVAL;
	T = x->rows;
	C = x->cols;
	if (T != b->n_tokens || !cu_shape(out, KT_F32, T, C) || !cu_float(w) || w->rows != C ||
	    w->cols < 1 || w->cols > INT32_MAX || !cu_valid(state, KT_F32) ||
	    !cu_shape(slot, KT_I32, T, 1) || !cu_shape(&b->pos, KT_I32, T, 1))
		return -EINVAL;
	K = w->cols;
	if ((K - 1) * C > state->cols)
		return -EINVAL;
	/* out is written while x and the state are read; the state while x,
	 * w, slot and pos are read. */
	if (cu_overlap(out, x) || cu_overlap(out, w) || cu_overlap(out, state) ||
	    cu_overlap(out, slot) || cu_overlap(out, &b->pos) || cu_overlap(state, x) ||
	    cu_overlap(state, w) || cu_overlap(state, slot) || cu_overlap(state, &b->pos))
		return -EINVAL;
	if (!T || !C)
		return 0;
	a.out = (float *)out->data;
	a.x = (const float *)x->data;
	a.state = (float *)state->data;
	a.slot = (const int32_t *)slot->data;
	a.pos = (const int32_t *)b->pos.data;
	a.T = T;
	a.C = C;
	a.F = state->cols;
	a.n_slots = state->rows;
	a.K = (int)K;
	a.fault = cu->fault;
	blocks = cu_blocks(T * C);
	CU_CHECK(cu_enter(cu));
	if (w->dtype == KT_BF16)
		conv1d_out_kernel<<<blocks, CUDA_THREADS, 0, cu->stream>>>(
			a, (const __nv_bfloat16 *)w->data);
	else
		conv1d_out_kernel<<<blocks, CUDA_THREADS, 0, cu->stream>>>(
			a, (const float *)w->data);
	CU_LAUNCHED();
	/* K == 1 keeps no inputs. */
	if (K > 1) {
		conv1d_state_kernel<<<blocks, CUDA_THREADS, 0, cu->stream>>>(a);
		CU_LAUNCHED();
	}
	return 0;
}
