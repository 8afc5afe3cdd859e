/* Hopper warpgroup MMA (wgmma) primitives: the 128-byte-swizzled tile
 * layout and its shared-memory descriptor, the fences and waits of the
 * asynchronous products, and the three product shapes that a prefill
 * attention with head_dim 128 needs: m64n64k16 and m64n128k16 with both
 * operands in shared memory (S = Q Kᵀ), and m64n128k16 with A in registers
 * and B transposed (O = P V). The prefill kernel
 * (cuda_attention_wgmma.cuh) and the lab (dev/cuda/wgmma_lab.cu, which
 * checks each product and layout against the host) use them.
 *
 * sm_90a only: call them from code that only an sm_90a build compiles
 * (ATT_WGMMA_DEVICE, cuda_attention_wgmma.cuh); an unused inline function
 * emits nothing, so other architectures build the header as well.
 */
#ifndef ATLAS_KERNELS_CUDA_WGMMA_CUH
#define ATLAS_KERNELS_CUDA_WGMMA_CUH

#include <stdint.h>

#include <cuda_bf16.h>

/* Byte offset of element (r, c) of a [rows][128] bf16 tile: two halves of
 * 64 columns, each `rows` rows of 128 bytes in groups of 8 rows (1,024
 * bytes, aligned to 1,024), the 16-byte chunk c of row r at chunk c ^ (r %
 * 8). That is wgmma's 128-byte swizzle: K-major when the columns are the
 * reduction (Q and K for Q Kᵀ), MN-major when they are N (V for P V). */
__host__ __device__ inline uint32_t sw128_off(int r, int c, int rows)
{
	const int cc = c % 64;

	return (uint32_t)((c / 64) * rows * 128 + r * 128 + (((cc / 8) ^ (r % 8)) * 16) +
			  (cc % 8) * 2);
}

/* A shared-memory matrix descriptor, 128-byte swizzle: the start address
 * (shared window), the leading and the stride byte offsets, each stored in
 * 16-byte units; base offset 0 (atoms aligned to 1,024). */
__device__ __forceinline__ uint64_t sw128_desc(uint32_t saddr, uint32_t lead, uint32_t stride)
{
	return (uint64_t)((saddr & 0x3ffff) >> 4) | (uint64_t)((lead >> 4) & 0x3fff) << 16 |
	       (uint64_t)((stride >> 4) & 0x3fff) << 32 | (uint64_t)1 << 62;
}

__device__ __forceinline__ uint32_t wg_smem(const void *p)
{
	return (uint32_t)__cvta_generic_to_shared(p);
}

/* The first 1,024-aligned byte of the dynamic shared memory (a launch asks
 * for 1 KB more than it uses). */
__device__ __forceinline__ unsigned char *wg_tiles(unsigned char *buf)
{
	return buf + ((1024 - (wg_smem(buf) & 1023)) & 1023);
}

__device__ __forceinline__ void wg_fence(void)
{
	asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wg_commit(void)
{
	asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int N> __device__ __forceinline__ void wg_wait(void)
{
	asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/* Make this thread's shared-memory stores visible to wgmma's reads (the
 * async proxy); a barrier after it makes every thread's. */
__device__ __forceinline__ void wg_proxy_fence(void)
{
	asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ uint32_t wg_pack(float lo, float hi)
{
	__nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);

	return *(uint32_t *)&v;
}

/* Keep the compiler from moving reads or writes of wgmma accumulators
 * across the asynchronous products: every register of r is "used and
 * changed" here, at this point of the program. */
template <int N> __device__ __forceinline__ void wg_pin(float (&r)[N])
{
#pragma unroll
	for (int i = 0; i < N; i++)
		asm volatile("" : "+f"(r[i])::"memory");
}

/* P's A fragments (each warp's 16 rows, the mma.sync m16n8k16 layout) from
 * S's accumulators of NK keys: key step kk is their n8 blocks 2 kk and
 * 2 kk + 1. */
template <int NK>
__device__ __forceinline__ void wg_p_frags(const float (&s)[NK / 2], uint32_t (&a)[NK / 16][4])
{
#pragma unroll
	for (int kk = 0; kk < NK / 16; kk++) {
		a[kk][0] = wg_pack(s[8 * kk], s[8 * kk + 1]);
		a[kk][1] = wg_pack(s[8 * kk + 2], s[8 * kk + 3]);
		a[kk][2] = wg_pack(s[8 * kk + 4], s[8 * kk + 5]);
		a[kk][3] = wg_pack(s[8 * kk + 6], s[8 * kk + 7]);
	}
}

/* The accumulator operands of the products' inline asm: the PTX register
 * list of 32 or 64 of them and the matching "+f" constraints. */
#define WG_REGS32 \
	"%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14," \
	"%15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27," \
	"%28, %29, %30, %31"
#define WG_REGS64 \
	WG_REGS32 ", " \
	"%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44," \
	"%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57," \
	"%58, %59, %60, %61, %62, %63"
#define WG_OUTS32(d) \
	"+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), \
	"+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), \
	"+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
	"+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
	"+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), \
	"+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), \
	"+f"(d[31])
#define WG_OUTS64(d) \
	WG_OUTS32(d), \
	"+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), \
	"+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), \
	"+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), \
	"+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), \
	"+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), \
	"+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), \
	"+f"(d[62]), "+f"(d[63])

/* d (64 x 64 f32, 32 a thread) += A (64 x 16, descriptor a) · B (64 x 16,
 * descriptor b)ᵀ, both K-major; accumulate 0 overwrites d. */
__device__ __forceinline__ void wgmma_64x64_ss(float (&d)[32], uint64_t a, uint64_t b, int accumulate)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
		     "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" WG_REGS32
		     "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
		     : WG_OUTS32(d)
		     : "l"(a), "l"(b), "r"(accumulate));
}

/* The same with B 128 rows (d: 64 x 128 f32, 64 a thread). */
__device__ __forceinline__ void wgmma_64x128_ss(float (&d)[64], uint64_t a, uint64_t b, int accumulate)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
		     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" WG_REGS64
		     "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
		     : WG_OUTS64(d)
		     : "l"(a), "l"(b), "r"(accumulate));
}

/* d (64 x 128 f32, 64 a thread) += A (64 x 16 bf16 in registers, the
 * mma.sync m16n8k16 A fragment of each warp's 16 rows) · B (16 x 128,
 * descriptor b, MN-major: transposed). */
__device__ __forceinline__ void wgmma_64x128_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b,
						int accumulate)
{
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
		     "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" WG_REGS64
		     "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
		     : WG_OUTS64(d)
		     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

#endif
