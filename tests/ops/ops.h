/* The table-driven op test (tests/ops): what a case is, and the helpers its
 * family uses to build inputs, run ops on a backend and check what came out.
 *
 * A case is a row of a const table: a name, the op it tests, its family's
 * parameter struct, and the family (build, run, check). The runner
 * (test_ops.c) seeds a generator from the case's name, builds the inputs
 * once and runs the case on the backend under test; then
 *  - on the cpu backend, check() compares the results with the family's
 *    naive double-precision reference (its `cpu` argument is NULL);
 *  - on any other backend, the runner also runs the case on the cpu backend
 *    with the same inputs, and check() compares the two results with the
 *    op's tolerances for that backend.
 * Families whose checks need no cpu results (refusals, and properties a
 * backend promises about itself: graph replay, batch invariance, device-side
 * index checks) are `self_checked`: they run on the backend under test alone,
 * on every backend, and check() gets NULL for `cpu` there too.
 *
 * Memory: host buffers come from op_alloc() and backend tensors from
 * op_tensor()/op_weight(); the runner frees both when the case ends, so
 * families free nothing. A failed allocation, upload or download is a broken
 * case, not a result: op_ok() reports it and abandons the case.
 */
#ifndef ATLAS_TESTS_OPS_OPS_H
#define ATLAS_TESTS_OPS_OPS_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"

/* One opened backend and what the cases need to know of it. */
struct op_backend {
	struct kt_backend *be;
	const char *kind;               /* "cpu" or "cuda": what kt_backend_open was asked for */
	const struct kt_config *config; /* the limits it was opened with */
	enum kt_dtype weight_dtype;     /* what kt_weight() stores */
};

/* One case running: its generator, memory, tensors and checks (ops_run.c). */
struct op_run;

struct op_family {
	/* Host inputs from the case's generator. target is the backend under
	 * test: a family whose comparison depends on how that backend stores
	 * values (bf16 KV caches) builds the inputs for it. May be NULL. */
	void *(*build)(struct op_run *r, const void *params, const struct op_backend *target);
	/* Run the op(s) on b and return host copies of what they produced. Never
	 * draws random numbers: a case runs twice on the same inputs. */
	void *(*run)(struct op_run *r, const void *params, const void *in,
		     const struct op_backend *b);
	/* Record the checks of got (the backend under test) against the
	 * reference (cpu NULL) or against the cpu backend's results. */
	void (*check)(struct op_run *r, const void *params, const void *in, const void *got,
		      const void *cpu);
	bool self_checked;
};

struct op_case {
	const char *name;   /* unique; the runner's filter matches it or op */
	const char *op;     /* the kt_ops entry (or entries) under test */
	const struct op_family *family;
	const void *params; /* the family's parameter struct */
};

/* The cases of one file, registered in test_ops.c. */
struct op_list {
	const struct op_case *cases;
	size_t n;
};

#define OP_LIST(name, table) \
	const struct op_list name = { table, sizeof(table) / sizeof((table)[0]) }

/* Limits every backend of the run is opened with (both sides of a comparison
 * alike): rows past max_tokens and sampling rows past it run in chunks on
 * cuda, and the attention cases reach max_context. */
#define OP_MAX_TOKENS 256
#define OP_MAX_SEQS 16
#define OP_MAX_CONTEXT 4096
#define OP_MAX_HEADS 64
#define OP_MAX_HEAD_DIM 256

/* The name of the case being run. */
const char *op_case_name(const struct op_run *r);
/* A hash of that name: a case's kt_graph key, so that no case replays
 * another's graph. */
uint64_t op_case_key(const struct op_run *r);

/* Deterministic random numbers (splitmix64), seeded per case. */
uint64_t op_next(struct op_run *r);
double op_uniform(struct op_run *r, double lo, double hi);
int op_randint(struct op_run *r, int n); /* 0..n-1 */
/* Values in [-mag, -mag/100] ∪ [mag/100, mag]: random, never zero. */
void op_fill(struct op_run *r, float *x, size_t n, float mag);
void op_shuffle(struct op_run *r, int32_t *a, int n);

/* Zeroed host memory that lives until the case ends; never NULL. */
void *op_alloc(struct op_run *r, size_t bytes);
float *op_floats(struct op_run *r, size_t n);
double *op_doubles(struct op_run *r, size_t n);
int32_t *op_ints(struct op_run *r, size_t n);
void *op_dup(struct op_run *r, const void *src, size_t bytes);

/* bf16 as the devices round (nearest even, NaN kept quiet). */
uint16_t op_bf16_bits(float f);
float op_bf16_value(uint16_t h);
void op_round_bf16(float *x, size_t n);
/* v as a tensor of dtype dt holds it: bf16-rounded for bf16, unchanged for f32. */
float op_stored(enum kt_dtype dt, float v);

/* A second backend of like's kind opened with config c (cases that need
 * another instance: one thread, bad limits); closed when the case ends,
 * after its tensors are freed. */
const struct op_backend *op_open(struct op_run *r, const struct op_backend *like,
				 const struct kt_config *c);

/* Abandon the case (after reporting what) unless rc is 0: for calls that
 * set a case up, not for the results under test. */
void op_ok(struct op_run *r, int rc, const char *what);

/* A tensor of b, freed when the case ends, holding host (rows × cols of dt;
 * f32 host values for a bf16 tensor are rounded). host NULL: poisoned (NaN
 * for f32 and bf16, 0x7f7f7f7f for i32) so unwritten elements show. */
struct kt_tensor op_tensor(struct op_run *r, const struct op_backend *b, enum kt_dtype dt,
			   int64_t rows, int64_t cols, const float *host);
/* The same for raw bytes (i32 ids, bf16 bits): host holds kt_nbytes of it. */
struct kt_tensor op_tensor_raw(struct op_run *r, const struct op_backend *b, enum kt_dtype dt,
			       int64_t rows, int64_t cols, const void *host);
/* kt_weight() of src (src_dt, rows × cols), freed when the case ends. */
struct kt_tensor op_weight(struct op_run *r, const struct op_backend *b, enum kt_dtype src_dt,
			   const void *src, int64_t rows, int64_t cols);
/* A weight of bf16 values (also exact in f32) as kt_weight() makes it from
 * a bf16 source: values must already be bf16-exact. */
struct kt_tensor op_weight_bf16(struct op_run *r, const struct op_backend *b, const float *values,
				int64_t rows, int64_t cols);
/* Poison t again (as op_tensor with host NULL). */
void op_poison(struct op_run *r, const struct op_backend *b, const struct kt_tensor *t);
/* Upload host values over the whole tensor (f32 values; rounded for bf16). */
void op_set(struct op_run *r, const struct op_backend *b, const struct kt_tensor *t,
	    const float *host);
/* Download a whole f32 or bf16 tensor as f32 values (into the case's memory). */
float *op_get(struct op_run *r, const struct op_backend *b, const struct kt_tensor *t);
/* Download a whole i32 tensor (into the case's memory). */
int32_t *op_get_ints(struct op_run *r, const struct op_backend *b, const struct kt_tensor *t);

/* Checks (ops_check.c). Each records its error and tolerance; the case
 * passes when all do. `what` is printed as given (printf format). */
/* |got - ref| <= tol · scale per element (scale NULL: |ref|, at least
 * 1e-30), the references' form of error; the error shown is the largest
 * scaled one. Non-finite got fails. */
void op_check_rel(struct op_run *r, const float *got, const double *ref, const double *scale,
		  size_t n, double tol, const char *what, ...)
	__attribute__((format(printf, 7, 8)));
/* max |got - want| <= max_abs_tol and NMSE = Σ(got - want)² / Σ want² <=
 * nmse_tol (an infinite max_abs_tol: the NMSE alone), the comparisons'
 * form of error; got must be finite where want is. */
void op_check_close(struct op_run *r, const float *got, const float *want, size_t n,
		    double max_abs_tol, double nmse_tol, const char *what, ...)
	__attribute__((format(printf, 7, 8)));
/* Bitwise equality of n floats (NaN compared by bits too). */
void op_check_bits(struct op_run *r, const float *got, const float *want, size_t n,
		   const char *what, ...) __attribute__((format(printf, 5, 6)));
/* Equality of n i32 values. */
void op_check_ints(struct op_run *r, const int32_t *got, const int32_t *want, size_t n,
		   const char *what, ...) __attribute__((format(printf, 5, 6)));
/* Every one of n floats is NaN: poison the op must not have written. */
void op_check_poison(struct op_run *r, const float *got, size_t n, const char *what, ...)
	__attribute__((format(printf, 4, 5)));
/* A return code. */
void op_check_rc(struct op_run *r, int got, int want, const char *what, ...)
	__attribute__((format(printf, 4, 5)));
/* Anything else: ok, with what says what was expected. */
void op_check(struct op_run *r, bool ok, const char *what, ...)
	__attribute__((format(printf, 3, 4)));

/* Record one check (what: a printf format and its arguments); detail (or
 * NULL) says where a failing one went wrong. The checks above are made of it. */
void op_record(struct op_run *r, double err, double tol, bool ok, const char *detail,
	       const char *what, va_list ap);

/* An op given an index that only the device sees (a token id, position,
 * sequence slot or block id in backend memory) may refuse it (rc_call
 * -EINVAL, everything it would write left as before) or run and report it
 * at the next sync point (rc_sync -EINVAL) with each affected row marked as
 * mark says; both are the contract (kernels/cuda/cuda_impl.h). got and
 * before are rows × cols; bad[i] marks the affected rows. Returns true when
 * the op ran: the caller then checks the rows that were not affected. */
enum op_fault_mark { OP_FAULT_NAN, OP_FAULT_UNTOUCHED };
bool op_check_fault(struct op_run *r, int rc_call, int rc_sync, const float *got,
		    const float *before, const bool *bad, size_t rows, size_t cols,
		    enum op_fault_mark mark, const char *what);

/* Backend promises that are not the same on every backend. */
/* A row of a matmul gives the same bits in any batch of at most T rows
 * (DESIGN §4.1): always on cpu; on cuda on the GEMV path only (bf16 w,
 * T <= CUDA_GEMV_MAX_T, K % 8 == 0). */
bool op_matmul_invariant(const struct op_backend *b, int T, int K, enum kt_dtype w_dtype);
/* A token's attention gives the same bits alone as in any batch: the cpu
 * promises it; cuda picks its kernels and splits by the step's shape. */
bool op_attention_invariant(const struct op_backend *b);
/* A token's moe_matmul rows and moe_combine output give the same bits alone
 * as in any batch, and with the experts split over calls (ranks) as in one:
 * the cpu promises it; cuda is held to its tolerances. */
bool op_moe_invariant(const struct op_backend *b);

/* For the runner: run case c on test (and on cpu for comparison, unless test
 * is the cpu backend or the family is self_checked), print its line, and
 * return whether it passed. verbose prints every check. */
bool op_run_case(const struct op_case *c, const struct op_backend *test,
		 const struct op_backend *cpu, bool verbose);

#endif
