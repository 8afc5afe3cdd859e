/* How the splits of a decode launch (cuda_attention_decode.cuh) meet: each
 * CTA that ran a split of a row's keys leaves its unnormalised output o_s
 * [nh, D] and (m_s, l_s) for its heads, and one CTA merges them,
 *
 *   out = Σ o_s 2^(m_s - M) / Σ l_s 2^(m_s - M),   M = max m_s,
 *
 * with one arithmetic (decode_merge), whichever way the splits reach it:
 *
 *  - through global memory (decode_merge_splits): the splits write to the
 *    workspace, fence, and count themselves done on their (row, kv head,
 *    head chunk) counter; the CTA that counts last merges and puts the
 *    counter back to 0. Three round trips through L2 on the step's
 *    critical path (the fence, the count, the loads), each of them queued
 *    behind the next product's weights, which are already streaming;
 *  - through a cluster (decode_merge_cluster): a launch of at most
 *    DEC_CLUSTER_MAX_SPLITS splits (of those cuda_attention.cu picks) runs
 *    each (row, kv head, head chunk)'s splits as one thread block cluster. The splits leave their results in
 *    their own shared memory, meet at the cluster's barrier, and split 0
 *    reads them through distributed shared memory, over the
 *    multiprocessors' own network; a second barrier keeps every CTA until
 *    it has. Every CTA of the cluster takes part, those whose split starts
 *    past the row's keys too.
 *
 * Both read the same values (exact loads of f32) and merge them in the same
 * order, so out has the same bits either way.
 */
#ifndef ATLAS_KERNELS_CUDA_ATTENTION_MERGE_CUH
#define ATLAS_KERNELS_CUDA_ATTENTION_MERGE_CUH

#include <cooperative_groups.h>

#include "kernels/cuda/cuda_attention_common.cuh"

/* The decode kernel's geometry, which its merge shares. */
#define DEC_WARPS 4
#define DEC_HEADS 16       /* q heads per CTA: the m16 rows of the tiles */
#define DEC_MAX_SPLITS 64
/* The most splits a launch merges through a cluster: the portable cluster
 * size (a launch of more merges through global memory). */
#define DEC_CLUSTER_MAX_SPLITS 8

static_assert(DEC_MAX_SPLITS <= 64, "the merge weighs 2 splits per lane");

/* The merge of the n_act splits of heads h0..h0+nh-1 of row t into a.out
 * (A: decode_args). ml(row, s) is split s's (m, l) of head h0 + row (m NaN
 * after a bad block id), po(row, s, d) its unnormalised outputs d..d+3 of
 * that head. Called by every thread of one CTA; wts and inv_l are its
 * shared scratch. */
template <int D, typename A, typename ML, typename PO>
__device__ __forceinline__ void decode_merge(const A &a, int t, int h0, int nh, int n_act,
					     float (*wts)[DEC_MAX_SPLITS], float *inv_l,
					     const ML &ml, const PO &po)
{
	const int64_t o0 = ((int64_t)t * a.n_heads + h0) * D;

	/* Warp w weighs the splits of rows w, w + 4, ...: lane s holds splits s and s + 32. */
	for (int row = threadIdx.x >> 5; row < nh; row += DEC_WARPS) {
		const int lane = threadIdx.x & 31;
		const float2 none = make_float2(-INFINITY, 0.0f);
		const float2 v0 = lane < n_act ? ml(row, lane) : none;
		const float2 v1 = lane + 32 < n_act ? ml(row, lane + 32) : none;
		const bool bad = __any_sync(FULL_WARP, isnan(v0.x) || isnan(v1.x));
		const float M = warp_reduce(fmaxf(isnan(v0.x) ? -INFINITY : v0.x,
						  isnan(v1.x) ? -INFINITY : v1.x), op_max());
		const float f0 = exp2_fast(v0.x - M), f1 = exp2_fast(v1.x - M);
		const float L = warp_reduce(v0.y * f0 + v1.y * f1, op_sum());

		if (lane < n_act)
			wts[row][lane] = f0;
		if (lane + 32 < n_act)
			wts[row][lane + 32] = f1;
		if (lane == 0)
			inv_l[row] = bad ? NAN : 1.0f / L;
	}
	__syncthreads();
	/* Each thread merges 4 consecutive dims of a row (float4), with the
	 * loads of 8 splits in flight at a time. */
	for (int i = 4 * (int)threadIdx.x; i < nh * D; i += 4 * DEC_WARPS * 32) {
		const int row = i / D;
		const float *w = wts[row];
		float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
		int s = 0;

		for (; s + 8 <= n_act; s += 8) {
			float4 v[8];

#pragma unroll
			for (int u = 0; u < 8; u++)
				v[u] = po(row, s + u, i % D);
#pragma unroll
			for (int u = 0; u < 8; u++) {
				acc.x += v[u].x * w[s + u];
				acc.y += v[u].y * w[s + u];
				acc.z += v[u].z * w[s + u];
				acc.w += v[u].w * w[s + u];
			}
		}
		for (; s < n_act; s++) {
			const float4 v = po(row, s, i % D);

			acc.x += v.x * w[s];
			acc.y += v.y * w[s];
			acc.z += v.z * w[s];
			acc.w += v.w * w[s];
		}
		a.out.put4(o0 + i, make_float4(acc.x * inv_l[row], acc.y * inv_l[row],
					       acc.z * inv_l[row], acc.w * inv_l[row]));
	}
}

/* After a CTA wrote its split of row t, heads h0..h0+nh-1, to the
 * workspace (a.part_o, a.part_ml): count it done; the last of the n_act
 * splits that ran merges them all and resets the counter. Called by every
 * thread of the CTA. */
template <int D, typename A>
__device__ __forceinline__ void decode_merge_splits(const A &a, int t, int h0, int nh, int n_act,
						    float (*wts)[DEC_MAX_SPLITS], float *inv_l,
						    int *last)
{
	int *count = a.count + (int64_t)t * gridDim.y + blockIdx.y;
	const int64_t slot0 = ((int64_t)t * a.n_heads + h0) * a.splits;

	__threadfence();
	__syncthreads();
	if (threadIdx.x == 0) {
		*last = atomicAdd(count, 1) == n_act - 1;
		if (*last)
			*count = 0;
	}
	__syncthreads();
	if (!*last)
		return;
	__threadfence();
	decode_merge<D>(
		a, t, h0, nh, n_act, wts, inv_l,
		[&](int row, int s) { return __ldcg(&a.part_ml[slot0 + (int64_t)row * a.splits + s]); },
		[&](int row, int s, int d) {
			return __ldcg((const float4 *)(a.part_o +
						       (slot0 + (int64_t)row * a.splits + s) * D + d));
		});
}

/* After every CTA of a cluster (the splits of one row, kv head and head
 * chunk, split = rank) put its results in its own shared memory (o [nh,
 * D] at po, (m, l) [nh] at ml; those of a split that did not run are not
 * read): split 0 merges the n_act that ran. Called by every thread of
 * every CTA of the cluster. */
template <int D, typename A>
__device__ __forceinline__ void decode_merge_cluster(const A &a, int t, int h0, int nh, int n_act,
						     float (*wts)[DEC_MAX_SPLITS], float *inv_l,
						     float *po, float2 *ml)
{
	cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();

	cl.sync(); /* release the results, acquire the others' */
	if (cl.block_rank() == 0)
		decode_merge<D>(
			a, t, h0, nh, n_act, wts, inv_l,
			[&](int row, int s) { return *cl.map_shared_rank(ml + row, (unsigned)s); },
			[&](int row, int s, int d) {
				return *(const float4 *)cl.map_shared_rank(po + row * D + d,
									   (unsigned)s);
			});
	cl.sync(); /* no CTA leaves while split 0 reads its shared memory */
}

/* What a CTA of a cluster launch whose split starts past its row's keys
 * does: the cluster's two barriers, so that the splits that ran meet. */
__device__ __forceinline__ void decode_merge_cluster_idle(void)
{
	cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();

	cl.sync();
	cl.sync();
}

#endif
