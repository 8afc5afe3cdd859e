/* delta_rule: the gated delta rule of the Gated DeltaNet layers
 * (kernels/backend.h; the math and the kernels in cuda_delta_rule.cuh).
 *
 * Layout: out [T, Hv·dv] f32, qkv [T, 2·Hk·dk + Hv·dv] f32, ba [T, 2·Hv] f32,
 * a_log, dt_bias [1, Hv] f32, state [n_slots, F] f32 (head h's [dk, dv] at
 * float off + h·dk·dv), slot [T, 1] i32; dk, dv in {16, 32, 64, 128}.
 *
 * Kernel choice, from the step's shape on the host only (b->n_single,
 * b->segments), so a graph replays the same launches: a segment of at least
 * DR_CHUNK_MIN rows runs the chunked kernel (one launch per such segment);
 * every other row (decode rows, verify runs, short segments) runs the
 * recurrent kernel, one launch per maximal range of rows between long
 * segments, which finds its runs on the device. The segments only choose
 * kernels: the recurrent kernel alone is correct for any step, and a
 * segment that is not one run on the device is flagged as a fault.
 *
 * The chunked kernel needs more than 48 KiB of shared memory; its limit is
 * raised right before each launch (a host-side attribute, no allocation
 * and no stream work, so it is also fine while a graph is being captured).
 */
#include <errno.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_impl.h"
#include "kernels/cuda/cuda_delta_rule.cuh"

/* Segments of at least this many rows take the chunked kernel: below it
 * the recurrent kernel's few rows cost less than a chunk's fixed work. */
#define DR_CHUNK_MIN 64

static_assert(CUDA_FAULT_DELTA_RULE == (1u << 9), "the .cuh's fault bit is cuda_impl.h's");

template <int DK, int BV>
static int dr_launch_recurrent(struct cuda_backend *cu, const dr_args &a)
{
	const dim3 grid((unsigned)(a.r1 - a.r0), (unsigned)a.Hv, (unsigned)(a.dv / BV));

	dr_recurrent_kernel<DK, BV><<<grid, BV * DR_REC_P(DK, BV), 0, cu->stream>>>(a);
	CU_LAUNCHED();
	return 0;
}

template <int DK, int BV>
static int dr_launch_chunk(struct cuda_backend *cu, const dr_args &a, int row0, int n)
{
	const size_t smem = sizeof(float) * DR_CHUNK_FLOATS(DK, BV);
	const dim3 grid((unsigned)a.Hv, (unsigned)(a.dv / BV));

	CU_CHECK(cudaFuncSetAttribute(dr_chunk_kernel<DK, BV>,
				      cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
	dr_chunk_kernel<DK, BV><<<grid, DR_CHUNK_THREADS, smem, cu->stream>>>(a, row0, n);
	CU_LAUNCHED();
	return 0;
}

/* The recurrent kernel over rows [r0, r1), or the chunked one over the
 * segment [r0, r1), for the template of (dk, BV). */
template <int BV>
static int dr_launch(struct cuda_backend *cu, dr_args a, int dk, bool chunk, int r0, int r1)
{
	a.r0 = r0;
	a.r1 = r1;
	if (r1 <= r0)
		return 0;
	switch (dk) {
	case 16: return chunk ? dr_launch_chunk<16, BV>(cu, a, r0, r1 - r0)
			      : dr_launch_recurrent<16, BV>(cu, a);
	case 32: return chunk ? dr_launch_chunk<32, BV>(cu, a, r0, r1 - r0)
			      : dr_launch_recurrent<32, BV>(cu, a);
	case 64: return chunk ? dr_launch_chunk<64, BV>(cu, a, r0, r1 - r0)
			      : dr_launch_recurrent<64, BV>(cu, a);
	case 128: return chunk ? dr_launch_chunk<128, BV>(cu, a, r0, r1 - r0)
			       : dr_launch_recurrent<128, BV>(cu, a);
	default: return -EINVAL;
	}
}

static int dr_run(struct cuda_backend *cu, const dr_args &a, int dk, bool chunk, int r0, int r1)
{
	return a.dv == 16 ? dr_launch<16>(cu, a, dk, chunk, r0, r1)
			  : dr_launch<32>(cu, a, dk, chunk, r0, r1);
}

static bool dr_dim_ok(int d)
{
	return d == 16 || d == 32 || d == 64 || d == 128;
}

/* The segments lie in order, apart, within [n_single, T). */
static bool dr_segments_ok(const struct kt_batch *b, int T)
{
	int next = b->n_single;

	if (b->n_single < 0 || b->n_single > T || b->n_segments < 0 ||
	    (b->n_segments && !b->segments))
		return false;
	for (int i = 0; i < b->n_segments; i++) {
		const struct kt_segment *s = &b->segments[i];

		if (s->row < next || s->n_rows < 0 || s->n_rows > T - s->row)
			return false;
		next = s->row + s->n_rows;
	}
	return true;
}

static bool dr_args_ok(const struct kt_tensor *out, const struct kt_tensor *qkv,
		       const struct kt_tensor *ba, const struct kt_tensor *a_log,
		       const struct kt_tensor *dt_bias, const struct kt_tensor *state, int64_t off,
		       const struct kt_tensor *slot, const struct kt_batch *b, int Hk, int Hv,
		       int dk, int dv)
{
	int64_t T;

	if (!b || Hk <= 0 || Hv <= 0 || Hv % Hk || !dr_dim_ok(dk) || !dr_dim_ok(dv))
		return false;
	T = b->n_tokens;
	if (T < 0 || !cu_shape(qkv, KT_F32, T, 2 * (int64_t)Hk * dk + (int64_t)Hv * dv) ||
	    !cu_shape(ba, KT_F32, T, 2 * (int64_t)Hv) || !cu_shape(a_log, KT_F32, 1, Hv) ||
	    !cu_shape(dt_bias, KT_F32, 1, Hv) || !cu_shape(out, KT_F32, T, (int64_t)Hv * dv) ||
	    !cu_valid(state, KT_F32) || !cu_shape(slot, KT_I32, T, 1) ||
	    !cu_shape(&b->pos, KT_I32, T, 1))
		return false;
	if (off < 0 || off > state->cols || (int64_t)Hv * dk * dv > state->cols - off)
		return false;
	if (!dr_segments_ok(b, (int)T))
		return false;
	/* out and state are written while everything else is read. */
	const struct kt_tensor *ins[] = { qkv, ba, a_log, dt_bias, slot, &b->pos };
	for (const struct kt_tensor *in : ins)
		if (cu_overlap(out, in) || cu_overlap(state, in))
			return false;
	return !cu_overlap(out, state);
}

int cuda_delta_rule(struct kt_backend *be, const struct kt_tensor *out,
		    const struct kt_tensor *qkv, const struct kt_tensor *ba,
		    const struct kt_tensor *a_log, const struct kt_tensor *dt_bias,
		    const struct kt_tensor *state, int64_t off, const struct kt_tensor *slot,
		    const struct kt_batch *b, int n_k_heads, int n_v_heads, int k_dim, int v_dim)
{
	struct cuda_backend *cu = cu_of(be);
	dr_args a;
	int rc, lo;

	if (!dr_args_ok(out, qkv, ba, a_log, dt_bias, state, off, slot, b, n_k_heads, n_v_heads,
			k_dim, v_dim))
		return -EINVAL;
	if (!b->n_tokens)
		return 0;
	a.out = (float *)out->data;
	a.qkv = (const float *)qkv->data;
	a.ba = (const float *)ba->data;
	a.a_log = (const float *)a_log->data;
	a.dt_bias = (const float *)dt_bias->data;
	a.state = (float *)state->data;
	a.slot = (const int32_t *)slot->data;
	a.pos = (const int32_t *)b->pos.data;
	a.qkv_cols = qkv->cols;
	a.out_cols = out->cols;
	a.F = state->cols;
	a.off = off;
	a.n_slots = state->rows;
	a.Hk = n_k_heads;
	a.Hv = n_v_heads;
	a.dv = v_dim;
	a.r0 = a.r1 = 0;
	a.fault = cu->fault;
	CU_CHECK(cu_enter(cu));
	/* Rows [lo, seg.row) before each long segment go to the recurrent kernel. */
	lo = 0;
	for (int i = 0; i < b->n_segments; i++) {
		const struct kt_segment *s = &b->segments[i];

		if (s->n_rows < DR_CHUNK_MIN)
			continue;
		if ((rc = dr_run(cu, a, k_dim, false, lo, s->row)) ||
		    (rc = dr_run(cu, a, k_dim, true, s->row, s->row + s->n_rows)))
			return rc;
		lo = s->row + s->n_rows;
	}
	return dr_run(cu, a, k_dim, false, lo, b->n_tokens);
}
