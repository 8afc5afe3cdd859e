/* Kernel lab: times each op of the cpu backend at realistic shapes (hidden
 * 1024, 16 heads, head_dim 64/128, T = 1 and 512, context 2048, vocab
 * 151936) and prints the median of N runs with its throughput.
 *
 *     bench_ops [threads]      (0 or nothing: all online cores)
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/cpu.h"

#define HIDDEN 1024
#define INTER 3072
#define VOCAB 151936
#define CONTEXT 2048
#define BS 16

static struct kt_backend *be;
static uint64_t rng = 0x1234567;

static float frand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (float)((rng >> 11) * 0x1p-53 * 2.0 - 1.0);
}

static void die(const char *what, int rc)
{
	fprintf(stderr, "bench_ops: %s: %s\n", what, strerror(-rc));
	exit(1);
}

/* A random f32 tensor (i32: 0..mod-1 when mod > 0). */
static struct kt_tensor tensor(enum kt_dtype dt, int64_t rows, int64_t cols, int mod)
{
	struct kt_tensor t;
	size_t n = (size_t)rows * cols;
	float *f = malloc(n * 4);
	int rc = kt_alloc(be, dt, rows, cols, &t);

	if (rc || !f)
		die("alloc", rc ? rc : -ENOMEM);
	for (size_t i = 0; i < n; i++) {
		if (dt == KT_I32)
			((int32_t *)f)[i] = mod ? (int32_t)(i % (size_t)mod) : 0;
		else
			f[i] = frand();
	}
	kt_upload(be, &t, 0, f, n * 4);
	free(f);
	return t;
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* What one benchmark runs: an op call on fixed arguments. */
struct job {
	int (*run)(struct job *j);
	struct kt_tensor a, b, c, d, e;
	struct kt_batch batch;
	struct kt_sample_row row;
	int n_heads, n_kv, D;
};

static void report(const char *op, const char *shape, struct job *j, int reps, double flop,
		   double bytes)
{
	double t[64], med;
	int rc;

	if (reps > 64)
		reps = 64;
	for (int i = 0; i < 2; i++)
		if ((rc = j->run(j)))
			die(op, rc);
	for (int i = 0; i < reps; i++) {
		double t0 = now();

		j->run(j);
		t[i] = now() - t0;
	}
	qsort(t, reps, sizeof(double), cmp_double);
	med = t[reps / 2];
	printf("| %-12s | %-38s | %10.3f | %8.2f | %8.2f |\n", op, shape, med * 1e3,
	       flop / med * 1e-9, bytes / med * 1e-9);
}

static int run_matmul(struct job *j) { return kt_matmul(be, &j->a, &j->b, &j->c, NULL); }
static int run_rmsnorm(struct job *j) { return kt_rmsnorm(be, &j->a, &j->b, &j->c, &j->d, 1e-6f); }
static int run_rope(struct job *j) { return kt_rope(be, &j->a, &j->b, &j->c, j->n_heads, j->D, NULL, 0.0f); }
static int run_swiglu(struct job *j) { return kt_swiglu(be, &j->a, &j->b, &j->c); }
static int run_add(struct job *j) { return kt_add(be, &j->a, &j->b); }
static int run_embed(struct job *j) { return kt_embed(be, &j->a, &j->b, &j->c); }
static int run_kv_store(struct job *j)
{
	return kt_kv_store(be, &j->a, &j->b, &j->d, &j->d, &j->batch);
}
static int run_attention(struct job *j)
{
	return kt_attention(be, &j->e, &j->c, &j->a, &j->b, &j->batch, j->n_heads, j->n_kv, j->D,
			    1.0f / sqrtf((float)j->D));
}
static int run_sample(struct job *j)
{
	int32_t id;

	return kt_sample(be, &j->a, &j->row, 1, &id);
}

static void free_job(struct job *j)
{
	kt_free(be, &j->a);
	kt_free(be, &j->b);
	kt_free(be, &j->c);
	kt_free(be, &j->d);
	kt_free(be, &j->e);
	kt_free(be, &j->batch.pos);
	kt_free(be, &j->batch.seq);
	kt_free(be, &j->batch.block_tables);
}

static void bench_matmul(int T, int K, int N)
{
	struct job j = { .run = run_matmul };
	char shape[64];

	j.a = tensor(KT_F32, T, N, 0);
	j.b = tensor(KT_F32, T, K, 0);
	j.c = tensor(KT_F32, N, K, 0);
	snprintf(shape, sizeof shape, "T=%d K=%d N=%d", T, K, N);
	report("matmul", shape, &j, T > 1 ? 5 : 30, 2.0 * T * K * N, 4.0 * ((double)N * K + T * (K + N)));
	free_job(&j);
}

static void bench_rows(int T)
{
	struct job j = { .run = run_rmsnorm };
	char shape[64];

	j.a = tensor(KT_F32, T, HIDDEN, 0);
	j.b = tensor(KT_F32, T, HIDDEN, 0);
	j.c = tensor(KT_F32, T, HIDDEN, 0);
	j.d = tensor(KT_F32, 1, HIDDEN, 0);
	snprintf(shape, sizeof shape, "T=%d D=%d +residual", T, HIDDEN);
	report("rmsnorm", shape, &j, 30, 5.0 * T * HIDDEN, 16.0 * T * HIDDEN);
	free_job(&j);

	j = (struct job){ .run = run_rope, .n_heads = 16, .D = 128 };
	j.a = tensor(KT_F32, T, 16 * 128, 0);
	j.b = tensor(KT_I32, T, 1, CONTEXT);
	j.c = tensor(KT_F32, 1, 64, 0);
	snprintf(shape, sizeof shape, "T=%d heads=16 D=128", T);
	report("rope", shape, &j, 30, 6.0 * T * 16 * 128, 8.0 * T * 16 * 128);
	free_job(&j);

	j = (struct job){ .run = run_swiglu };
	j.a = tensor(KT_F32, T, INTER, 0);
	j.b = tensor(KT_F32, T, INTER, 0);
	j.c = tensor(KT_F32, T, INTER, 0);
	snprintf(shape, sizeof shape, "T=%d I=%d", T, INTER);
	report("swiglu", shape, &j, 30, 5.0 * T * INTER, 12.0 * T * INTER);
	free_job(&j);

	j = (struct job){ .run = run_add };
	j.a = tensor(KT_F32, T, HIDDEN, 0);
	j.b = tensor(KT_F32, T, HIDDEN, 0);
	snprintf(shape, sizeof shape, "T=%d D=%d", T, HIDDEN);
	report("add", shape, &j, 30, 1.0 * T * HIDDEN, 12.0 * T * HIDDEN);
	free_job(&j);

	j = (struct job){ .run = run_embed };
	j.a = tensor(KT_F32, T, HIDDEN, 0);
	j.b = tensor(KT_F32, 32768, HIDDEN, 0);
	j.c = tensor(KT_I32, T, 1, 32768);
	snprintf(shape, sizeof shape, "T=%d V=32768 H=%d", T, HIDDEN);
	report("embed", shape, &j, 30, 0, 8.0 * T * HIDDEN);
	free_job(&j);
}

/* One sequence of CONTEXT positions in reversed blocks; the step's T tokens
 * are its last T positions (T = 1: decode; larger: a prefill chunk). */
static void bench_attention(int T, int n_heads, int n_kv, int D)
{
	struct job j = { .run = run_attention, .n_heads = n_heads, .n_kv = n_kv, .D = D };
	int blocks = CONTEXT / BS;
	int32_t *bt = malloc(sizeof(int32_t) * blocks), *pos = malloc(sizeof(int32_t) * T);
	char shape[64];
	double keys = 0;

	for (int i = 0; i < blocks; i++)
		bt[i] = blocks - 1 - i;
	for (int t = 0; t < T; t++) {
		pos[t] = CONTEXT - T + t;
		keys += pos[t] + 1;
	}
	j.a = tensor(KT_F32, CONTEXT, n_kv * D, 0);
	j.b = tensor(KT_F32, CONTEXT, n_kv * D, 0);
	j.c = tensor(KT_F32, T, n_heads * D, 0);
	j.d = tensor(KT_F32, T, n_kv * D, 0);
	j.e = tensor(KT_F32, T, n_heads * D, 0);
	j.batch = (struct kt_batch){ .n_tokens = T, .block_size = BS, .max_kv_len = CONTEXT };
	j.batch.pos = tensor(KT_I32, T, 1, 0);
	j.batch.seq = tensor(KT_I32, T, 1, 0);
	j.batch.block_tables = tensor(KT_I32, 1, blocks, 0);
	kt_upload(be, &j.batch.pos, 0, pos, sizeof(int32_t) * T);
	kt_upload(be, &j.batch.block_tables, 0, bt, sizeof(int32_t) * blocks);

	snprintf(shape, sizeof shape, "T=%d ctx=%d kv=%d D=%d", T, CONTEXT, n_kv, D);
	j.run = run_kv_store;
	report("kv_store", shape, &j, 30, 0, 16.0 * T * n_kv * D);
	j.run = run_attention;
	snprintf(shape, sizeof shape, "T=%d ctx=%d heads=%d/%d D=%d", T, CONTEXT, n_heads, n_kv, D);
	report("attention", shape, &j, T > 1 ? 5 : 30, 4.0 * keys * n_heads * D,
	       T > 1 ? 8.0 * CONTEXT * n_kv * D : 8.0 * keys * n_kv * D);
	free_job(&j);
	free(bt);
	free(pos);
}

static void bench_sample(const char *what, float temperature, int top_k, float top_p, float u,
			 bool flat)
{
	struct job j = { .run = run_sample };

	j.row = (struct kt_sample_row){ .temperature = temperature, .top_k = top_k, .top_p = top_p,
					.u = u };
	float *l = malloc(sizeof(float) * VOCAB);

	/* Logit-like: a few strong candidates over a broad tail; or all equal. */
	for (int i = 0; i < VOCAB; i++)
		l[i] = flat ? 0.0f : 4.0f * frand() + (i % 9973 == 0 ? 12.0f : 0.0f);
	j.a = tensor(KT_F32, 1, VOCAB, 0);
	kt_upload(be, &j.a, 0, l, sizeof(float) * VOCAB);
	free(l);
	report("sample", what, &j, 30, 0, 4.0 * VOCAB);
	free_job(&j);
}

int main(int argc, char **argv)
{
	struct kt_config c = { .backend = "cpu", .threads = argc > 1 ? atoi(argv[1]) : 0,
			       .max_tokens = 512, .max_seqs = 16, .max_context = CONTEXT,
			       .max_heads = 16, .max_head_dim = 128 };
	char err[256];
	int rc = kt_cpu_open(&c, &be, err, sizeof err);

	if (rc) {
		fprintf(stderr, "bench_ops: %s\n", err);
		return 1;
	}
	printf("backend: %s, median of N runs\n\n", be->info.name);
	printf("| %-12s | %-38s | %10s | %8s | %8s |\n", "op", "shape", "ms", "GFLOP/s", "GB/s");
	printf("|--------------|----------------------------------------|------------|----------|----------|\n");
	bench_matmul(1, HIDDEN, VOCAB);
	for (int T = 1; T <= 512; T *= 512) {
		bench_matmul(T, HIDDEN, 16 * 128);
		bench_matmul(T, HIDDEN, INTER);
		bench_matmul(T, INTER, HIDDEN);
		bench_rows(T);
		bench_attention(T, 16, 8, 128);
		bench_attention(T, 16, 16, 64);
	}
	bench_sample("V=151936 greedy", 0.0f, 0, 1.0f, 0.5f, false);
	bench_sample("V=151936 T=0.7 top_k=20 top_p=0.8", 0.7f, 20, 0.8f, 0.5f, false);
	bench_sample("V=151936 T=0.7 top_p=0.95", 0.7f, 0, 0.95f, 0.5f, false);
	bench_sample("V=151936 T=1 (no top-k/p) u=0.5", 1.0f, 0, 1.0f, 0.5f, false);
	bench_sample("V=151936 flat, T=1 u=0.999 (worst)", 1.0f, 0, 1.0f, 0.999f, true);
	kt_backend_close(be);
	return 0;
}
