/* Prefill attention of head_dim 128 on Hopper's warpgroup MMA (wgmma,
 * sm_90a): cuda_attention_prefill.cuh's kernel with each warpgroup's 64
 * packed rows multiplied by wgmma, where that kernel multiplies each warp's
 * 16 rows by mma.sync. cuda_attention.cu runs it for every head_dim-128
 * segment on a GPU of compute capability 9.0 when the build has sm_90a code.
 *
 * A CTA of WGS warpgroups takes 64 · WGS packed rows of one kv head (grid
 * and row packing as cuda_attention_prefill.cuh's). Each warpgroup rounds
 * its q rows to bf16 into a tile of its own in the 128-byte-swizzled layout
 * (cuda_wgmma.cuh); K and V tiles of ATT_TILE keys come through the block
 * table with cp.async into the same layout (wgmma_load_kv), a STAGES-deep
 * ring that the CTA's first 256 threads fill. Per tile, a warpgroup whose
 * rows see any of its keys runs S = q Kᵀ (8 m64n64k16 products, both
 * operands in shared memory), the softmax step that every
 * prefill kernel shares (softmax_tile: wgmma's accumulators of a warp are
 * the mma.sync fragments of its 16 rows), and O += P V (4 m64n128k16, P
 * from registers, V read transposed: its descriptor's leading offset is the
 * one between V's two 64-dim halves, the reading that dev/cuda/wgmma_lab.cu
 * found to hold).
 *
 * The same bits as the mma.sync kernels: each product's sums come out of
 * the tensor cores in the same order, 16 dims (keys) at a time, and the
 * softmax step is the same code (dev/cuda/attention_prefill.cu compares
 * every output bit). Why it is faster: a warpgroup's B operand goes from
 * shared memory straight into the tensor cores, once for 64 rows, where
 * every warp of the mma.sync kernels loads every K and V fragment into its
 * registers for its 16 (or 32) rows. MINB 2 fits two CTAs on a
 * multiprocessor (128 registers a thread, no spills), so that one's
 * softmax runs while the other's products do: Qwen3-8B's prompt of 8,192
 * tokens in chunks of 2,048 at 356 TFLOP/s against the mma.sync kernels'
 * 254, H200 (docs/perf.md). prefill_wgmma_pair says when; else MINB 1 (136
 * registers).
 *
 * A block id out of range makes the rows whose keys include it NaN and sets
 * CUDA_FAULT_ATTENTION. Each CTA reads its q rows before it writes the same
 * rows of out, so out may be q.
 */
#ifndef ATLAS_KERNELS_CUDA_ATTENTION_WGMMA_CUH
#define ATLAS_KERNELS_CUDA_ATTENTION_WGMMA_CUH

#include "kernels/cuda/cuda_attention_prefill.cuh"
#include "kernels/cuda/cuda_wgmma.cuh"

/* Device code that only an sm_90a build compiles: the kernel of any other
 * architecture traps (cuda_attention.cu never launches it there). */
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ATT_WGMMA_DEVICE 1
#else
#define ATT_WGMMA_DEVICE 0
#endif

/* The kernel variant: WGS warpgroups, a STAGES-deep ring, MINB CTAs a
 * multiprocessor asked of the register allocator. Shared memory: the q
 * tiles, then the ring, 1,024-aligned (the swizzle's atoms), hence 1 KB
 * more than they take. */
template <int WGS, int STAGES, int MINB> struct wgmma_cfg {
	static constexpr int D = 128;
	static constexpr int threads = WGS * 128;
	static constexpr int rows = WGS * 64;               /* packed rows a CTA */
	static constexpr int q_bytes = 64 * D * 2;          /* a warpgroup's q tile */
	static constexpr int kv_bytes = ATT_TILE * D * 2;   /* a K or a V tile */
	static constexpr int smem = WGS * q_bytes + STAGES * 2 * kv_bytes + 1024;
};

/* The K and V tiles of keys [key0, key0 + ATT_TILE) of kv head kvh into the
 * ring at ks and vs, swizzled (cuda_wgmma.cuh's layout: the 16-byte chunk c
 * of key r at half c / 8, row r, chunk (c % 8) ^ (r % 8)). The CTA's first
 * 256 threads copy, 4 a key: each thread 4 consecutive chunks of one key's
 * K and V row, so one block-id lookup (a division by the block size and a
 * 64-bit offset) serves 8 copies. Keys at or past key_end are zero-filled;
 * a key in a block whose id is out of range too, and the smallest such key
 * goes to *bad_from (shared, atomicMin), as load_kv_tile does for the
 * mma.sync kernels. Why not load_kv_tile: its 4 chunks a thread are of 4
 * keys, 4 lookups; with it, the loads were 363 of the main loop's 954
 * instructions, and the kernel was bound by issue (docs/perf.md). */
__device__ __forceinline__ void wgmma_load_kv(uint32_t ks, uint32_t vs, const prefill_args &a,
					      int kvh, int key0, int key_end, int *bad_from)
{
	const int row = threadIdx.x >> 2, c0 = 4 * (threadIdx.x & 3), j = key0 + row;
	int64_t off = -1;

	if (threadIdx.x >= 256)
		return;
	if (j < key_end) {
		const int32_t blk = a.blocks[j / a.kv.bs];

		if (blk >= 0 && blk < a.kv.n_blocks)
			off = ((int64_t)blk * a.kv.block_rows + j % a.kv.bs) * a.kv.row_len +
			      (int64_t)kvh * 128 + c0 * 8;
		else
			atomicMin(bad_from, j);
	}
#pragma unroll
	for (int i = 0; i < 4; i++) {
		const int c = c0 + i;
		const uint32_t at = (c / 8) * ATT_TILE * 128 + row * 128 + ((c % 8) ^ (row % 8)) * 16;

		cp_async16(ks + at, a.kc + (off < 0 ? 0 : off + 8 * i), off >= 0);
		cp_async16(vs + at, a.vc + (off < 0 ? 0 : off + 8 * i), off >= 0);
	}
}

/* A float[4 N] accumulator of wgmma seen as the N [4] fragments of mma.sync. */
template <int N> __device__ __forceinline__ float (&wgmma_frags(float (&r)[4 * N]))[N][4]
{
	return *reinterpret_cast<float (*)[N][4]>(&r);
}

#if ATT_WGMMA_DEVICE
/* Issue s [64][ATT_TILE] = q [64][128] · K [ATT_TILE][128]ᵀ: 8 products of 16
 * dims, the first overwriting s. qd, kd: the descriptors of the q and K
 * tiles' starts; a 16-dim step is 32 bytes on within a half of 64 dims, the
 * second half 64 rows (ATT_TILE rows) of 128 bytes on. A descriptor's start
 * is its low field, in 16-byte units, and the smem window keeps the sums
 * inside it, so the steps add to the descriptors. */
__device__ __forceinline__ void wgmma_issue_qk(float (&s)[32], uint64_t qd, uint64_t kd)
{
#pragma unroll
	for (int kk = 0; kk < 8; kk++) {
		const uint32_t q_at = (kk / 4) * 64 * 128 + (kk % 4) * 32;
		const uint32_t k_at = (kk / 4) * ATT_TILE * 128 + (kk % 4) * 32;

		wgmma_64x64_ss(s, qd + (q_at >> 4), kd + (k_at >> 4), kk > 0);
	}
}

/* Issue o [64][128] += P [64][ATT_TILE] · V [ATT_TILE][128]: 4 products of 16
 * keys, P from registers, V read transposed; vd: the descriptor of the V
 * tile's start, whose leading offset is the one between its two halves. A
 * 16-key step is 16 rows of 128 bytes on. */
__device__ __forceinline__ void wgmma_issue_pv(float (&o)[64], const uint32_t (&p)[4][4],
					       uint64_t vd)
{
#pragma unroll
	for (int kk = 0; kk < 4; kk++)
		wgmma_64x128_rs(o, p[kk], vd + ((kk * 16 * 128) >> 4), 1);
}
#endif

template <int WGS, int STAGES, int MINB>
__global__ void __launch_bounds__(WGS * 128, MINB) prefill_wgmma_kernel(prefill_args a)
{
#if ATT_WGMMA_DEVICE
	typedef wgmma_cfg<WGS, STAGES, MINB> cfg;
	constexpr int D = 128, QB = cfg::q_bytes, KB = cfg::kv_bytes;
	extern __shared__ unsigned char wga_smem[];
	__shared__ int bad_from;
	unsigned char *const base = wg_tiles(wga_smem);
	const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
	const int kvh = blockIdx.x, packed = a.n_rows * a.group;
	const int r_first = (int)(gridDim.y - 1 - blockIdx.y) * cfg::rows;
	const int key_end = a.pos0 + (min(r_first + cfg::rows, packed) - 1) / a.group + 1;
	const int n_tiles = (key_end + ATT_TILE - 1) / ATT_TILE;
	const int w0 = r_first + wg * 64; /* the warpgroup's first packed row */
	const int wg_max = w0 < packed ? a.pos0 + min(w0 + 63, packed - 1) / a.group : -1;
	const int64_t ld = (int64_t)a.n_heads * D;
	const uint32_t qs = wg_smem(base) + wg * QB, ring = wg_smem(base) + WGS * QB;
	const uint64_t qd = sw128_desc(qs, 16, 1024);
	unsigned char *const q_tile = base + wg * QB;
	float o[64], s[32], m[2], l[2];
	uint32_t p[4][4];
	int lim[2];

	pdl_wait();
	pdl_launch_dependents();
	if (threadIdx.x == 0)
		bad_from = INT_MAX;
	__syncthreads();
#pragma unroll
	for (int i = 0; i < STAGES - 1; i++) {
		if (i < n_tiles)
			wgmma_load_kv(ring + i * 2 * KB, ring + i * 2 * KB + KB, a, kvh,
				      i * ATT_TILE, key_end, &bad_from);
		cp_async_commit();
	}
	/* While the first tiles come: the warpgroup's q rows, 16 float4 loads a
	 * thread in flight, rounded as the mma.sync kernels round them. */
	{
		float4 x[16];

#pragma unroll
		for (int j = 0; j < 16; j++) {
			const int c = (threadIdx.x & 127) + j * 128, r = w0 + c / 32;

			x[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
			if (r < packed)
				x[j] = *(const float4 *)(a.q + (int64_t)(a.row0 + r / a.group) * ld +
							 (int64_t)(kvh * a.group + r % a.group) * D +
							 4 * (c % 32));
		}
#pragma unroll
		for (int j = 0; j < 16; j++) {
			const int c = (threadIdx.x & 127) + j * 128;

			*(uint2 *)(q_tile + sw128_off(c / 32, 4 * (c % 32), 64)) =
				make_uint2(pack_bf16(x[j].x, x[j].y), pack_bf16(x[j].z, x[j].w));
		}
	}
	wg_proxy_fence();
#pragma unroll
	for (int i = 0; i < 2; i++) {
		const int r = w0 + 16 * warp + (lane >> 2) + 8 * i;

		lim[i] = r < packed ? a.pos0 + r / a.group : -1;
		m[i] = -INFINITY;
		l[i] = 0.0f;
	}
#pragma unroll
	for (int i = 0; i < 64; i++)
		o[i] = 0.0f;
	for (int kt = 0; kt < n_tiles; kt++) {
		const int nx = kt + STAGES - 1;
		const uint32_t ks = ring + (kt % STAGES) * 2 * KB, vs = ks + KB;

		if (nx < n_tiles)
			wgmma_load_kv(ring + (nx % STAGES) * 2 * KB,
				      ring + (nx % STAGES) * 2 * KB + KB, a, kvh, nx * ATT_TILE,
				      key_end, &bad_from);
		cp_async_commit();
		cp_async_wait<STAGES - 1>();
		/* the copies (generic proxy) before wgmma's reads (async proxy) */
		wg_proxy_fence();
		__syncthreads();
		if (kt * ATT_TILE <= wg_max) {
			wg_pin(s);
			wg_fence();
			wgmma_issue_qk(s, qd, sw128_desc(ks, 16, 1024));
			wg_commit();
			wg_wait<0>();
			wg_pin(s);
			softmax_tile<D, ATT_TILE>(wgmma_frags<8>(s), wgmma_frags<16>(o), m, l,
						  kt * ATT_TILE + 2 * (lane & 3), lim[0], lim[1], a.sl2);
			wg_p_frags<ATT_TILE>(s, p);
			wg_pin(o);
			wg_fence();
			wgmma_issue_pv(o, p, sw128_desc(vs, ATT_TILE * 128, 1024));
			wg_commit();
			wg_wait<0>();
			wg_pin(o);
		}
		__syncthreads();
	}
#pragma unroll
	for (int i = 0; i < 2; i++) {
		const int r = w0 + 16 * warp + (lane >> 2) + 8 * i;
		float sum = l[i];

		sum += __shfl_xor_sync(FULL_WARP, sum, 1);
		sum += __shfl_xor_sync(FULL_WARP, sum, 2);
		if (r >= packed)
			continue;
		const int64_t at = (int64_t)(a.row0 + r / a.group) * ld +
				   (int64_t)(kvh * a.group + r % a.group) * D;
		const bool bad = lim[i] >= bad_from;
		const float inv = 1.0f / sum;

#pragma unroll
		for (int nd = 0; nd < D / 8; nd++) {
			const float x = o[4 * nd + 2 * i] * inv, y = o[4 * nd + 2 * i + 1] * inv;

			a.out.put2(at + 8 * nd + 2 * (lane & 3),
				   bad ? make_float2(NAN, NAN) : make_float2(x, y));
		}
	}
	if (threadIdx.x == 0 && bad_from != INT_MAX)
		atomicOr(a.fault, CUDA_FAULT_ATTENTION);
#else
	__trap();
#endif
}

/* Whether a segment's grid of ctas CTAs runs sooner at two CTAs a
 * multiprocessor than at one, on sms multiprocessors. Two pay when the grid
 * has more CTAs than multiprocessors, and either more than fit at two a
 * multiprocessor, or the CTAs' work is even: the segment has history of
 * half its rows or more, so that the latest CTA has at most 1.5 times the
 * keys of the mean one. A segment at the start of its sequence whose CTAs
 * all fit at two a multiprocessor runs its latest, longest CTAs beside
 * others to the end: Qwen3-0.6B's first chunk of 2,048 (256 CTAs on 132)
 * took 0.104 ms at two against 0.092 at one, its next chunks 0.207-0.412
 * against 0.235-0.530 (H200, dev/cuda/attention_prefill.cu, 2026-12-02). */
static inline bool prefill_wgmma_pair(const prefill_args &a, int64_t ctas, int sms)
{
	return ctas > sms && (ctas > 2 * (int64_t)sms || 2 * (int64_t)a.pos0 >= a.n_rows);
}

template <int WGS, int STAGES, int MINB> static inline cudaError_t prefill_wgmma_setup(void)
{
	return cudaFuncSetAttribute(prefill_wgmma_kernel<WGS, STAGES, MINB>,
				    cudaFuncAttributeMaxDynamicSharedMemorySize,
				    wgmma_cfg<WGS, STAGES, MINB>::smem);
}

template <int WGS, int STAGES, int MINB>
static inline void prefill_wgmma_launch(bool pdl, const prefill_args &a, int n_kv,
					cudaStream_t s)
{
	typedef wgmma_cfg<WGS, STAGES, MINB> cfg;
	const dim3 grid((unsigned)n_kv, (unsigned)prefill_tiles(a, cfg::rows));

	cu_launch(pdl, prefill_wgmma_kernel<WGS, STAGES, MINB>, grid, cfg::threads, cfg::smem, s,
		  a);
}

#endif
