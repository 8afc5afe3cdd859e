/* The cpu backend object: open, close, device info, the ops table and the
 * per-thread scratch.
 *
 * Kernels: cpu_precision and cpu_isa (kernels/backend.h) pick how bf16
 * weights are stored and multiplied (cpu_memory.c, cpu_matmul.c); the
 * instruction set comes from the CPU's flags unless named.
 *
 * Threads: kt_config.threads (0 = all online cores) is the team size of every
 * OpenMP region of this backend. Scratch is one allocation split into one
 * cache-line-aligned region per thread, sized from max_context and
 * max_head_dim at open.
 */
#include "kernels/cpu/cpu.h"

#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "kernels/comm_socket.h"
#include "kernels/cpu/cpu_impl.h"
#include "kernels/cpu/cpu_simd.h"

#define CPU_ALIGN 64

static size_t align_up(size_t n)
{
	return (n + CPU_ALIGN - 1) & ~(size_t)(CPU_ALIGN - 1);
}

struct cpu_scratch *cpu_scratch_self(struct cpu_backend *cpu)
{
	int t = omp_get_thread_num();
	return &cpu->scratch[t < cpu->threads ? t : 0];
}

static int scratch_init(struct cpu_backend *cpu)
{
	size_t scores = align_up((size_t)CPU_ATT_HEADS * cpu->max_context * sizeof(float));
	size_t acc = align_up((size_t)CPU_ATT_HEADS * cpu->max_head_dim * sizeof(float));
	size_t ml = align_up(2 * CPU_ATT_HEADS * sizeof(float));
	size_t half = align_up((size_t)(cpu->max_head_dim / 2 + 1) * sizeof(float));
	size_t cands = align_up(CPU_SAMPLE_CHUNK * sizeof(struct cpu_cand));
	size_t gdn = align_up(3 * (size_t)cpu->max_head_dim * sizeof(float));
	size_t xbuf = cpu->bf16 ? (size_t)CPU_XBUF_ROWS * CPU_DP_MAX_K * sizeof(uint16_t) : 0;
	size_t per_thread = scores + acc + ml + 2 * half + cands + gdn + xbuf;

	cpu->scratch = calloc((size_t)cpu->threads, sizeof(*cpu->scratch));
	cpu->scratch_mem = aligned_alloc(CPU_ALIGN, per_thread * (size_t)cpu->threads);
	if (!cpu->scratch || !cpu->scratch_mem)
		return -ENOMEM;
	for (int t = 0; t < cpu->threads; t++) {
		char *p = (char *)cpu->scratch_mem + per_thread * (size_t)t;
		struct cpu_scratch *s = &cpu->scratch[t];
		s->scores = (float *)p;
		s->acc = (float *)(p + scores);
		s->ml = (float *)(p + scores + acc);
		s->cos = (float *)(p + scores + acc + ml);
		s->sin = (float *)(p + scores + acc + ml + half);
		s->cands = (struct cpu_cand *)(p + scores + acc + ml + 2 * half);
		s->gdn = (float *)(p + scores + acc + ml + 2 * half + cands);
		s->xbuf = xbuf ? (uint16_t *)(p + scores + acc + ml + 2 * half + cands + gdn) : NULL;
	}
	return 0;
}

static const char *const isa_names[] = { "generic", "avx2", "avx512bf16", "amx" };

static void fill_info(struct cpu_backend *cpu)
{
	struct kt_device_info *info = &cpu->base.info;
	long page = sysconf(_SC_PAGESIZE);
	long total = sysconf(_SC_PHYS_PAGES);
	long avail = sysconf(_SC_AVPHYS_PAGES);

	snprintf(info->name, sizeof info->name, "cpu (%d thread%s, %s, %s %s)", cpu->threads,
		 cpu->threads == 1 ? "" : "s", cpu_isa_name(), cpu->bf16 ? "bf16" : "f32",
		 isa_names[cpu->isa]);
	snprintf(info->backend, sizeof info->backend, "cpu");
	info->memory_total = page > 0 && total > 0 ? (uint64_t)page * (uint64_t)total : 0;
	info->memory_free = page > 0 && avail > 0 ? (uint64_t)page * (uint64_t)avail : 0;
	info->kv_dtype = cpu->bf16 ? KT_BF16 : KT_F32;
	info->att_p_bf16 = cpu->bf16 && cpu->isa == CPU_ISA_AMX;
	info->matmul_x_bf16 = false;
}

static void cpu_close(struct kt_backend *be)
{
	struct cpu_backend *cpu = cpu_of(be);

	comm_socket_close(cpu->comm);
	cpu_free_all(cpu);
	pthread_mutex_destroy(&cpu->lock);
	free(cpu->scratch_mem);
	free(cpu->scratch);
	free(cpu->draw_req);
	free(cpu->drawn_ids);
	free(cpu);
}

static int cpu_synchronize(struct kt_backend *be)
{
	return 0;
}

/* No graphs on the cpu: the ops run as they are enqueued. */
static int cpu_graph(struct kt_backend *be, uint64_t key, int (*record)(void *ctx), void *ctx)
{
	(void)be;
	(void)key;
	return record(ctx);
}

static int cpu_copy(struct kt_backend *be, const struct kt_tensor *dst,
		    const struct kt_tensor *src)
{
	const size_t n = kt_nbytes(src);

	(void)be;
	if (!dst->data || !src->data || kt_nbytes(dst) != n || cpu_overlap(dst, src))
		return -EINVAL;
	/* the caller's thread alone (cpu_impl.h, Threads) */
	memcpy(dst->data, src->data, n);
	return 0;
}

static int cpu_memory(struct kt_backend *be, uint64_t *free_bytes, uint64_t *total_bytes)
{
	long page = sysconf(_SC_PAGESIZE), avail = sysconf(_SC_AVPHYS_PAGES);
	long total = sysconf(_SC_PHYS_PAGES);

	(void)be;
	if (page <= 0 || avail < 0 || total <= 0)
		return -EIO;
	*free_bytes = (uint64_t)avail * (uint64_t)page;
	*total_bytes = (uint64_t)total * (uint64_t)page;
	return 0;
}

static const struct kt_ops cpu_ops = {
	.close = cpu_close,
	.alloc = cpu_alloc,
	.free = cpu_free,
	.upload = cpu_upload,
	.download = cpu_download,
	.weight = cpu_weight,
	.synchronize = cpu_synchronize,
	.embed = cpu_embed,
	.rmsnorm = cpu_rmsnorm,
	.matmul = cpu_matmul,
	.rope = cpu_rope,
	.kv_store = cpu_kv_store,
	.rope_store = cpu_rope_store,
	.attention = cpu_attention,
	.attention_part = cpu_attention_part,
	.attention_staged = cpu_attention_staged,
	.attention_finish = cpu_attention_finish,
	.kv_stage = cpu_kv_stage,
	.swiglu = cpu_swiglu,
	.add = cpu_add,
	.gather_rows = cpu_gather_rows,
	.moe_route = cpu_moe_route,
	.moe_matmul = cpu_moe_matmul,
	.moe_combine = cpu_moe_combine,
	.comm_open = cpu_comm_open,
	.comm_id = cpu_comm_id,
	.allreduce = cpu_allreduce,
	.comm_close = cpu_comm_close,
	.sample = cpu_sample,
	.draw_rows = cpu_draw_rows,
	.draw = cpu_draw,
	.drawn = cpu_drawn,
	.graph = cpu_graph,
	.copy = cpu_copy,
	.memory = cpu_memory,
	.host_alloc = cpu_host_alloc,
	.host_free = cpu_host_free,
	.copy_async = cpu_copy_async,
	.copy_done = cpu_copy_done,
	.copy_wait = cpu_copy_wait,
	.conv1d = cpu_conv1d,
	.delta_rule = cpu_delta_rule,
	.rmsnorm_gated = cpu_rmsnorm_gated,
	.sigmoid_mul = cpu_sigmoid_mul,
};

/* cpu_precision and cpu_isa of c into cpu. */
static int set_kernels(struct cpu_backend *cpu, const struct kt_config *c, char *err,
		       size_t errlen)
{
	const char *p = c->cpu_precision, *isa = c->cpu_isa;

	if (p && strcmp(p, "f32") && strcmp(p, "bf16"))
		return atlas_errf(err, errlen, -EINVAL,
				  "backend cpu: cpu_precision %s: must be f32 or bf16", p);
	cpu->bf16 = p && !strcmp(p, "bf16");
	if (!isa || !strcmp(isa, "auto")) {
		cpu->isa = CPU_ISA_AMX;
		while (!cpu_isa_supported(cpu->isa))
			cpu->isa--;
		return 0;
	}
	for (cpu->isa = CPU_ISA_GENERIC; cpu->isa <= CPU_ISA_AMX; cpu->isa++)
		if (!strcmp(isa, isa_names[cpu->isa]))
			return cpu_isa_supported(cpu->isa) ? 0 : atlas_errf(
				err, errlen, -ENOTSUP, "backend cpu: cpu_isa %s: this CPU lacks it", isa);
	return atlas_errf(err, errlen, -EINVAL,
			  "backend cpu: cpu_isa %s: must be auto, amx, avx512bf16, avx2 or generic",
			  isa);
}

static int check_config(const struct kt_config *c, char *err, size_t errlen)
{
	if (c->threads < 0)
		return atlas_errf(err, errlen, -EINVAL, "backend cpu: threads %d: must be >= 0",
				  c->threads);
	if (c->max_context <= 0)
		return atlas_errf(err, errlen, -EINVAL, "backend cpu: max_context %d: must be > 0",
				  c->max_context);
	if (c->max_head_dim <= 0 || c->max_head_dim % 2)
		return atlas_errf(err, errlen, -EINVAL,
				  "backend cpu: max_head_dim %d: must be even and > 0",
				  c->max_head_dim);
	return 0;
}

int kt_cpu_open(const struct kt_config *c, struct kt_backend **out, char *err, size_t errlen)
{
	struct cpu_backend *cpu;
	int rc = check_config(c, err, errlen);

	if (rc)
		return rc;
	cpu = calloc(1, sizeof(*cpu));
	if (!cpu)
		return atlas_errf(err, errlen, -ENOMEM, "backend cpu: out of memory");
	cpu->base.ops = &cpu_ops;
	cpu->threads = c->threads;
	if (cpu->threads == 0) {
		long online = sysconf(_SC_NPROCESSORS_ONLN);
		cpu->threads = online > 0 ? (int)online : 1;
	}
	cpu->max_context = c->max_context;
	cpu->max_head_dim = c->max_head_dim;
	cpu->draw_cap = c->max_tokens > c->max_seqs ? c->max_tokens : c->max_seqs;
	pthread_mutex_init(&cpu->lock, NULL);
	const size_t draw_rows = (size_t)(cpu->draw_cap > 0 ? cpu->draw_cap : 1);
	cpu->draw_req = calloc(draw_rows, sizeof(*cpu->draw_req));
	cpu->drawn_ids = calloc(draw_rows, sizeof(*cpu->drawn_ids));
	if (!cpu->draw_req || !cpu->drawn_ids) {
		cpu_close(&cpu->base);
		return atlas_errf(err, errlen, -ENOMEM, "backend cpu: out of memory");
	}
	if ((rc = set_kernels(cpu, c, err, errlen))) {
		cpu_close(&cpu->base);
		return rc;
	}
	rc = scratch_init(cpu);
	if (rc) {
		int threads = cpu->threads;
		cpu_close(&cpu->base);
		return atlas_errf(err, errlen, rc,
				  "backend cpu: scratch for %d threads, max_context %d: out of memory",
				  threads, c->max_context);
	}
	fill_info(cpu);
	*out = &cpu->base;
	return 0;
}
