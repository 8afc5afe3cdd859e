/* One case running (see ops.h): its generator, the host memory and backend
 * tensors it owns, the record of its checks (ops_check.c makes them), and
 * the line the runner prints for it.
 *
 * A case that cannot be set up (an allocation or upload fails) is abandoned
 * with longjmp back to op_run_case(), which still frees what the case owned:
 * every buffer and tensor is recorded here as it is made.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cuda/cuda_gemv.h"
#include "tests/ops/ops.h"

/* One recorded check. */
struct op_check_rec {
	char what[160];
	char detail[240]; /* where a failing check went wrong */
	double err, tol;  /* tol 0: an exact check (err counts the misses) */
	bool ok;
};

/* A tensor the case made, freed on its backend when the case ends. */
struct op_owned {
	const struct op_backend *b;
	struct kt_tensor t;
};

struct op_run {
	const struct op_case *c;
	uint64_t rng;
	jmp_buf abandon;
	void **blocks;            /* host memory of op_alloc */
	size_t n_blocks, cap_blocks;
	struct op_owned *owned;
	size_t n_owned, cap_owned;
	struct op_check_rec *checks;
	size_t n_checks, cap_checks;
	struct kt_backend **opened; /* by op_open */
	size_t n_opened, cap_opened;
};

/* a (n used of *cap, elem bytes each) with room for one more; exits when
 * out of memory: the test cannot go on then. */
static void *grow(void *a, size_t n, size_t *cap, size_t elem)
{
	if (n < *cap)
		return a;
	*cap = *cap ? 2 * *cap : 64;
	a = realloc(a, *cap * elem);
	if (!a) {
		fprintf(stderr, "test_ops: out of host memory\n");
		exit(1);
	}
	return a;
}

const char *op_case_name(const struct op_run *r)
{
	return r->c->name;
}

/* splitmix64 */
uint64_t op_next(struct op_run *r)
{
	uint64_t z = (r->rng += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

double op_uniform(struct op_run *r, double lo, double hi)
{
	return lo + (hi - lo) * (double)(op_next(r) >> 11) * 0x1p-53;
}

int op_randint(struct op_run *r, int n)
{
	return (int)(op_next(r) % (uint64_t)n);
}

void op_fill(struct op_run *r, float *x, size_t n, float mag)
{
	for (size_t i = 0; i < n; i++) {
		double v = op_uniform(r, mag / 100.0, mag);

		x[i] = (float)(op_next(r) & 1 ? v : -v);
	}
}

void op_shuffle(struct op_run *r, int32_t *a, int n)
{
	for (int i = n - 1; i > 0; i--) {
		int j = op_randint(r, i + 1);
		int32_t t = a[i];

		a[i] = a[j];
		a[j] = t;
	}
}

void *op_alloc(struct op_run *r, size_t bytes)
{
	void *p = calloc(1, bytes ? bytes : 1);

	if (!p) {
		fprintf(stderr, "test_ops: %s: out of host memory (%zu bytes)\n", r->c->name,
			bytes);
		exit(1);
	}
	r->blocks = grow(r->blocks, r->n_blocks, &r->cap_blocks, sizeof(*r->blocks));
	r->blocks[r->n_blocks++] = p;
	return p;
}

float *op_floats(struct op_run *r, size_t n)
{
	return op_alloc(r, n * sizeof(float));
}

double *op_doubles(struct op_run *r, size_t n)
{
	return op_alloc(r, n * sizeof(double));
}

int32_t *op_ints(struct op_run *r, size_t n)
{
	return op_alloc(r, n * sizeof(int32_t));
}

void *op_dup(struct op_run *r, const void *src, size_t bytes)
{
	return memcpy(op_alloc(r, bytes), src, bytes);
}

uint16_t op_bf16_bits(float f)
{
	uint32_t b;

	memcpy(&b, &f, sizeof b);
	if ((b & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((b >> 16) | 0x40);
	b += 0x7fffu + ((b >> 16) & 1);
	return (uint16_t)(b >> 16);
}

float op_bf16_value(uint16_t h)
{
	uint32_t b = (uint32_t)h << 16;
	float f;

	memcpy(&f, &b, sizeof f);
	return f;
}

void op_round_bf16(float *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		x[i] = op_bf16_value(op_bf16_bits(x[i]));
}

float op_stored(enum kt_dtype dt, float v)
{
	return dt == KT_BF16 ? op_bf16_value(op_bf16_bits(v)) : v;
}

void op_record(struct op_run *r, double err, double tol, bool ok, const char *detail,
	       const char *what, va_list ap)
{
	struct op_check_rec *k;

	r->checks = grow(r->checks, r->n_checks, &r->cap_checks, sizeof(*r->checks));
	k = &r->checks[r->n_checks++];
	vsnprintf(k->what, sizeof k->what, what, ap);
	snprintf(k->detail, sizeof k->detail, "%s", detail ? detail : "");
	k->err = err;
	k->tol = tol;
	k->ok = ok;
}

/* op_record with the message's arguments given here. */
__attribute__((format(printf, 5, 6)))
static void recordf(struct op_run *r, double err, double tol, bool ok, const char *what, ...)
{
	va_list ap;

	va_start(ap, what);
	op_record(r, err, tol, ok, NULL, what, ap);
	va_end(ap);
}

void op_ok(struct op_run *r, int rc, const char *what)
{
	char buf[256];

	if (!rc)
		return;
	snprintf(buf, sizeof buf, "setting up the case: %s returned %d (%s)", what, rc,
		 strerror(rc < 0 ? -rc : rc));
	recordf(r, 1.0, 0.0, false, "%s", buf);
	longjmp(r->abandon, 1);
}

static struct kt_tensor own(struct op_run *r, const struct op_backend *b, struct kt_tensor t)
{
	r->owned = grow(r->owned, r->n_owned, &r->cap_owned, sizeof(*r->owned));
	r->owned[r->n_owned++] = (struct op_owned){ b, t };
	return t;
}

/* kt_nbytes(t) bytes of poison for t's dtype. */
static void *poison_bytes(struct op_run *r, const struct kt_tensor *t)
{
	size_t n = (size_t)(t->rows * t->cols), elem = kt_dtype_size(t->dtype);
	unsigned char *p = op_alloc(r, n * elem);
	const float nan_f32 = NAN;
	const uint16_t nan_16 = t->dtype == KT_F16 ? 0x7e00 : 0x7fc0;

	if (t->dtype == KT_I32) {
		memset(p, 0x7f, n * elem);
		return p;
	}
	for (size_t i = 0; i < n; i++) {
		if (t->dtype == KT_F32)
			memcpy(p + 4 * i, &nan_f32, 4);
		else
			memcpy(p + 2 * i, &nan_16, 2);
	}
	return p;
}

void op_poison(struct op_run *r, const struct op_backend *b, const struct kt_tensor *t)
{
	op_ok(r, kt_upload(b->be, t, 0, poison_bytes(r, t), kt_nbytes(t)), "kt_upload (poison)");
}

void op_set(struct op_run *r, const struct op_backend *b, const struct kt_tensor *t,
	    const float *host)
{
	size_t n = (size_t)(t->rows * t->cols);

	if (t->dtype == KT_BF16) {
		uint16_t *h = op_alloc(r, n * 2);

		for (size_t i = 0; i < n; i++)
			h[i] = op_bf16_bits(host[i]);
		op_ok(r, kt_upload(b->be, t, 0, h, n * 2), "kt_upload (bf16)");
	} else {
		op_ok(r, kt_upload(b->be, t, 0, host, kt_nbytes(t)), "kt_upload");
	}
}

const struct op_backend *op_open(struct op_run *r, const struct op_backend *like,
				 const struct kt_config *c)
{
	struct op_backend *b = op_alloc(r, sizeof(*b));
	struct kt_config *copy = op_dup(r, c, sizeof(*c));
	char err[256] = "", what[320];
	int rc;

	copy->backend = like->kind;
	*b = *like;
	b->config = copy;
	rc = kt_backend_open(copy, &b->be, err, sizeof err);
	snprintf(what, sizeof what, "kt_backend_open %s (%s)", like->kind, err);
	op_ok(r, rc, what);
	r->opened = grow(r->opened, r->n_opened, &r->cap_opened, sizeof(*r->opened));
	r->opened[r->n_opened++] = b->be;
	return b;
}

struct kt_tensor op_tensor_raw(struct op_run *r, const struct op_backend *b, enum kt_dtype dt,
			       int64_t rows, int64_t cols, const void *host)
{
	struct kt_tensor t;

	op_ok(r, kt_alloc(b->be, dt, rows, cols, &t), "kt_alloc");
	own(r, b, t);
	op_ok(r, kt_upload(b->be, &t, 0, host ? host : poison_bytes(r, &t), kt_nbytes(&t)),
	      "kt_upload");
	return t;
}

struct kt_tensor op_tensor(struct op_run *r, const struct op_backend *b, enum kt_dtype dt,
			   int64_t rows, int64_t cols, const float *host)
{
	struct kt_tensor t;

	if (!host || dt != KT_BF16)
		return op_tensor_raw(r, b, dt, rows, cols, host);
	op_ok(r, kt_alloc(b->be, dt, rows, cols, &t), "kt_alloc");
	own(r, b, t);
	op_set(r, b, &t, host);
	return t;
}

struct kt_tensor op_weight(struct op_run *r, const struct op_backend *b, enum kt_dtype src_dt,
			   const void *src, int64_t rows, int64_t cols)
{
	struct kt_tensor t;

	op_ok(r, kt_weight(b->be, src_dt, src, rows, cols, false, &t), "kt_weight");
	return own(r, b, t);
}

struct kt_tensor op_weight_bf16(struct op_run *r, const struct op_backend *b, const float *values,
				int64_t rows, int64_t cols)
{
	size_t n = (size_t)rows * (size_t)cols;
	uint16_t *h = op_alloc(r, n * 2);

	for (size_t i = 0; i < n; i++)
		h[i] = op_bf16_bits(values[i]);
	return op_weight(r, b, KT_BF16, h, rows, cols);
}

float *op_get(struct op_run *r, const struct op_backend *b, const struct kt_tensor *t)
{
	size_t n = (size_t)(t->rows * t->cols);
	float *out = op_floats(r, n);

	if (t->dtype == KT_BF16) {
		uint16_t *h = op_alloc(r, n * 2);

		op_ok(r, kt_download(b->be, h, t, 0, n * 2), "kt_download (bf16)");
		for (size_t i = 0; i < n; i++)
			out[i] = op_bf16_value(h[i]);
	} else {
		op_ok(r, kt_download(b->be, out, t, 0, n * 4), "kt_download");
	}
	return out;
}

int32_t *op_get_ints(struct op_run *r, const struct op_backend *b, const struct kt_tensor *t)
{
	int32_t *out = op_ints(r, (size_t)(t->rows * t->cols));

	op_ok(r, kt_download(b->be, out, t, 0, kt_nbytes(t)), "kt_download (i32)");
	return out;
}

bool op_matmul_invariant(const struct op_backend *b, int T, int K, enum kt_dtype w_dtype)
{
	if (strcmp(b->be->info.backend, "cpu") == 0)
		return true;
	return w_dtype == KT_BF16 && T <= CUDA_GEMV_MAX_T && K % 8 == 0;
}

bool op_attention_invariant(const struct op_backend *b)
{
	return strcmp(b->be->info.backend, "cpu") == 0;
}

bool op_moe_invariant(const struct op_backend *b)
{
	return strcmp(b->be->info.backend, "cpu") == 0;
}

/* FNV-1a of a case name. */
static uint64_t name_hash(const char *name)
{
	uint64_t h = 0xcbf29ce484222325ULL;

	for (const unsigned char *p = (const unsigned char *)name; *p; p++)
		h = (h ^ *p) * 0x100000001b3ULL;
	return h;
}

uint64_t op_case_key(const struct op_run *r)
{
	return name_hash(op_case_name(r));
}

/* Every case has its own inputs (a seed from its name), and they do not
 * change when cases are added or filtered out. */
static uint64_t name_seed(const char *name)
{
	const char *env = getenv("ATLAS_TEST_SEED");

	return name_hash(name) ^ (env ? strtoull(env, NULL, 0) : 0x5eed1234abcdULL);
}

/* The check the case line shows: the first failure, else the largest
 * err / tol among the checks with a tolerance. */
static const struct op_check_rec *headline(const struct op_run *r)
{
	const struct op_check_rec *best = NULL;
	double best_ratio = -1.0;

	for (size_t i = 0; i < r->n_checks; i++) {
		const struct op_check_rec *k = &r->checks[i];
		double ratio = k->tol > 0.0 ? k->err / k->tol : 0.0;

		if (!k->ok)
			return k;
		if (k->tol > 0.0 && ratio > best_ratio) {
			best = k;
			best_ratio = ratio;
		}
	}
	return best;
}

static void free_case(struct op_run *r)
{
	for (size_t i = r->n_owned; i-- > 0;)
		kt_free(r->owned[i].b->be, &r->owned[i].t);
	for (size_t i = 0; i < r->n_opened; i++)
		kt_backend_close(r->opened[i]);
	free(r->opened);
	for (size_t i = 0; i < r->n_blocks; i++)
		free(r->blocks[i]);
	free(r->owned);
	free(r->blocks);
	free(r->checks);
}

static double seconds(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Build, run and check; op_ok() may leave through r->abandon. */
static void run_phases(struct op_run *r, const struct op_backend *test,
		       const struct op_backend *cpu)
{
	const struct op_family *f = r->c->family;
	const void *p = r->c->params;
	void *in = f->build ? f->build(r, p, test) : NULL, *got, *ref = NULL;

	got = f->run(r, p, in, test);
	if (test != cpu && !f->self_checked)
		ref = f->run(r, p, in, cpu);
	f->check(r, p, in, got, ref);
}

/* run_phases() where op_ok() can abandon it; the failure stays recorded. */
static void run_guarded(struct op_run *r, const struct op_backend *test,
			const struct op_backend *cpu)
{
	if (!setjmp(r->abandon))
		run_phases(r, test, cpu);
}

bool op_run_case(const struct op_case *c, const struct op_backend *test,
		 const struct op_backend *cpu, bool verbose)
{
	struct op_run r = { .c = c, .rng = name_seed(c->name) };
	const struct op_check_rec *head;
	double t0 = seconds(), ms;
	bool ok = true;
	int rc;

	run_guarded(&r, test, cpu);
	/* A case must leave no fault behind for the next one to trip over. */
	rc = kt_synchronize(test->be);
	if (rc)
		recordf(&r, 1.0, 0.0, false, "the backend is clean after the case (synchronize "
			"returned %d)", rc);
	if (!r.n_checks)
		recordf(&r, 1.0, 0.0, false, "the case checked something");
	for (size_t i = 0; i < r.n_checks; i++)
		ok = ok && r.checks[i].ok;
	ms = (seconds() - t0) * 1e3;
	head = headline(&r);
	if (head && head->tol > 0.0)
		printf("  %-60s %-15s err %-9.3g tol %-9.3g %s", c->name, c->op, head->err,
		       head->tol, ok ? "OK" : "FAIL");
	else
		printf("  %-60s %-15s exact, %3zu checks      %s", c->name, c->op, r.n_checks,
		       ok ? "OK" : "FAIL");
	if (verbose)
		printf("  (%.0f ms)", ms);
	printf("\n");
	for (size_t i = 0; i < r.n_checks; i++) {
		const struct op_check_rec *k = &r.checks[i];

		if (!verbose && k->ok)
			continue;
		if (k->tol > 0.0)
			printf("      %-4s %s: %.3g (tol %.3g)%s%s\n", k->ok ? "ok" : "FAIL",
			       k->what, k->err, k->tol, k->detail[0] ? ": " : "", k->detail);
		else
			printf("      %-4s %s%s%s\n", k->ok ? "ok" : "FAIL", k->what,
			       k->detail[0] ? ": " : "", k->detail);
	}
	free_case(&r);
	return ok;
}
