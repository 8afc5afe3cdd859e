/* test_ops: every op of kernels/backend.h from tables of cases, on one
 * backend, in the manner of llama.cpp's test-backend-ops.
 *
 *     test_ops [-v] BACKEND [FILTER]
 *
 * BACKEND cpu checks the cpu backend against double-precision references;
 * BACKEND cuda runs every case on cuda and on cpu with the same inputs and
 * compares them (ops.h says how). FILTER runs only the cases whose name or
 * op contains it; -v prints every check of every case. Prints one line per
 * case and a summary; exits 1 when a case fails, 77 (skipped) when the
 * backend is cuda and this build or machine has none.
 *
 * The case tables live in ops_*.c, one file per op family; a new file is
 * one entry of OP_FILES below. Environment: ATLAS_TEST_SEED changes every
 * case's inputs (each case seeds its generator from its name and this);
 * ATLAS_CUDA_DEVICE picks the GPU (default 0); ATLAS_TEST_CPU_PRECISION sets
 * the cpu backend's cpu_precision (bf16: its KV caches are bf16, which the
 * attention cases build their inputs for; meson test ops-cpu-bf16-attention);
 * ATLAS_TEST_CPU_ISA its cpu_isa (ops-cpu-bf16-attention-avx2).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#ifdef ATLAS_HAVE_CUDA
#include "kernels/cuda/cuda.h"
#endif
#include "tests/ops/ops.h"

#define OP_FILES(X) \
	X(ops_device) \
	X(ops_memory) \
	X(ops_host) \
	X(ops_rows) \
	X(ops_elementwise) \
	X(ops_norm) \
	X(ops_matmul) \
	X(ops_matmul_isa) \
	X(ops_matmul_n) \
	X(ops_matmul_swiglu) \
	X(ops_norm_product) \
	X(ops_rope_store) \
	X(ops_rope_attend) \
	X(ops_rope) \
	X(ops_attention) \
	X(ops_attention_faults) \
	X(ops_attention_parts) \
	X(ops_sample) \
	X(ops_sample_faults) \
	X(ops_moe_route) \
	X(ops_moe_matmul) \
	X(ops_moe_faults) \
	X(ops_moe_chain) \
	X(ops_gdn) \
	X(ops_gdn_split) \
	X(ops_gdn_faults) \
	X(ops_comm) \
	X(ops_graph)

#define DECLARE(name) extern const struct op_list name;
#define ENTRY(name) &name,
OP_FILES(DECLARE)
static const struct op_list *const lists[] = { OP_FILES(ENTRY) };

static const struct kt_config limits = {
	.threads = 0, .device = 0, .max_tokens = OP_MAX_TOKENS, .max_seqs = OP_MAX_SEQS,
	.max_context = OP_MAX_CONTEXT, .max_heads = OP_MAX_HEADS,
	.max_head_dim = OP_MAX_HEAD_DIM,
	.cuda_pdl = true, /* the engine's default (config/): ops overlap as in a step */
};

static struct kt_config configs[2];

static int usage(void)
{
	fprintf(stderr, "usage: test_ops [-v] cpu|cuda [FILTER]\n");
	return 2;
}

/* Open a backend of kind into *b; exits on failure (skips for a missing GPU). */
static void open_backend(const char *kind, struct kt_config *c, struct op_backend *b)
{
	char err[ATLAS_ERRLEN] = "";
	const char *dev = getenv("ATLAS_CUDA_DEVICE");
	struct kt_tensor probe;
	const float one = 1.0f;
	int rc;

	*c = limits;
	c->backend = kind;
	c->cpu_precision = getenv("ATLAS_TEST_CPU_PRECISION");
	c->cpu_isa = getenv("ATLAS_TEST_CPU_ISA");
	if (strcmp(kind, "cuda") == 0) {
		if (!strstr(kt_backends_built(), "cuda")) {
			printf("skip: no CUDA device (this build has no CUDA backend)\n");
			exit(77);
		}
#ifdef ATLAS_HAVE_CUDA
		if (!kt_cuda_available()) {
			printf("skip: no CUDA device\n");
			exit(77);
		}
#endif
		c->device = dev ? atoi(dev) : 0;
	}
	rc = kt_backend_open(c, &b->be, err, sizeof err);
	if (rc) {
		fprintf(stderr, "test_ops: backend %s: %s (%d)\n", kind, err, rc);
		exit(1);
	}
	b->kind = kind;
	b->config = c;
	rc = kt_weight(b->be, KT_F32, &one, 1, 1, false, &probe);
	if (rc) {
		fprintf(stderr, "test_ops: backend %s: kt_weight: %d\n", kind, rc);
		exit(1);
	}
	b->weight_dtype = probe.dtype;
	kt_free(b->be, &probe);
}

static bool selected(const struct op_case *c, const char *filter)
{
	return !filter || strstr(c->name, filter) || strstr(c->op, filter);
}

int main(int argc, char **argv)
{
	struct op_backend cpu, other, *test = &cpu;
	const char *kind, *filter;
	const struct op_case *fails[64];
	int argi = 1, n = 0, failed = 0;
	bool verbose = false;
	struct timespec t0, t1;

	if (argi < argc && strcmp(argv[argi], "-v") == 0) {
		verbose = true;
		argi++;
	}
	if (argi >= argc || argc - argi > 2)
		return usage();
	kind = argv[argi];
	filter = argi + 1 < argc ? argv[argi + 1] : NULL;
	if (strcmp(kind, "cpu") && strcmp(kind, "cuda"))
		return usage();
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (strcmp(kind, "cpu")) {
		open_backend(kind, &configs[1], &other);
		test = &other;
	}
	open_backend("cpu", &configs[0], &cpu);
	if (test == &cpu)
		printf("test_ops: cpu [%s] against double-precision references\n",
		       cpu.be->info.name);
	else
		printf("test_ops: %s [%s] against cpu [%s]\n", kind, test->be->info.name,
		       cpu.be->info.name);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (size_t l = 0; l < sizeof lists / sizeof lists[0]; l++) {
		for (size_t i = 0; i < lists[l]->n; i++) {
			const struct op_case *c = &lists[l]->cases[i];

			if (!selected(c, filter))
				continue;
			n++;
			if (!op_run_case(c, test, &cpu, verbose) && failed++ < 64)
				fails[failed - 1] = c;
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	printf("%d cases on %s: %d passed, %d failed (%.1f s)\n", n, kind, n - failed, failed,
	       (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
	for (int i = 0; i < failed && i < 64; i++)
		printf("  FAILED: %s\n", fails[i]->name);
	if (test != &cpu)
		kt_backend_close(test->be);
	kt_backend_close(cpu.be);
	if (!n) {
		fprintf(stderr, "test_ops: no case matches \"%s\"\n", filter ? filter : "");
		return 1;
	}
	return failed ? 1 : 0;
}
