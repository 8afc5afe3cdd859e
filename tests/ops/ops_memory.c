/* Cases of backend memory: alloc, free, upload, download, weight, copy and
 * memory, each checked on the backend alone against exact expectations
 * (these ops move bytes or convert them exactly, so there is nothing to
 * compare with the cpu that the expectations do not say better).
 *
 *  - transfers: partial uploads land at their byte offset and nowhere else,
 *    downloads at offsets and of row views, ranges past the end refused;
 *  - alloc: bad shapes and dtypes refused, sizes past memory -ENOMEM, empty
 *    tensors distinct; free of a view, a copy or twice is harmless;
 *  - 700 allocations freed in random order, some left for close;
 *  - weight: f32, f16 and bf16 sources (every 16-bit pattern, sources at odd
 *    addresses, 3000 x 3000 past cuda's staging buffer) stored as the
 *    backend stores weights: an f32 store holds the exact value (NaN keeps
 *    its sign), a bf16 store that value rounded to nearest even; aliasing of
 *    outliving f32 sources (a host backend aliases an aligned one, a device
 *    backend copies), copies of the others;
 *  - copy: byte for byte between tensors of equal size, any dtypes;
 *    different sizes and overlaps refused;
 *  - memory: free <= total, total as the device info says.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "tests/ops/ops.h"

struct transfer_params {
	int rows, cols;
};

struct transfer_out {
	uintptr_t address;
	int rc_part, rc_past[4];
	float *host, *whole, *pieces, *view, *last;
	size_t n;
};

static void *transfer_build(struct op_run *r, const void *params, const struct op_backend *target)
{
	const struct transfer_params *p = params;
	size_t n = (size_t)p->rows * p->cols;
	float *host = op_floats(r, n + 3);

	op_fill(r, host, n + 3, 2.0f);
	return host;
}

static void *transfer_run(struct op_run *r, const void *params, const void *input,
			  const struct op_backend *b)
{
	const struct transfer_params *p = params;
	const float *src = input;
	struct transfer_out *o = op_alloc(r, sizeof(*o));
	const size_t n = (size_t)p->rows * p->cols, part = n >= 10 ? 3 : 1, at = n / 2;
	struct kt_tensor t = op_tensor(r, b, KT_F32, p->rows, p->cols, src), view;

	o->n = n;
	o->address = (uintptr_t)t.data;
	/* The expected contents: src with `part` new values at float `at`. */
	o->host = op_dup(r, src, n * sizeof(float));
	memcpy(o->host + at, src + n, part * sizeof(float));
	o->rc_part = kt_upload(b->be, &t, at * sizeof(float), src + n, part * sizeof(float));
	o->whole = op_get(r, b, &t);
	o->pieces = op_floats(r, n);
	op_ok(r, kt_download(b->be, o->pieces, &t, 0, at * sizeof(float)), "kt_download");
	op_ok(r, kt_download(b->be, o->pieces + at, &t, at * sizeof(float),
			     (n - at) * sizeof(float)), "kt_download");
	o->last = op_floats(r, 1);
	op_ok(r, kt_download(b->be, o->last, &t, (n - 1) * sizeof(float), sizeof(float)),
	      "kt_download");
	o->rc_past[0] = kt_upload(b->be, &t, (n - 1) * sizeof(float), src, 2 * sizeof(float));
	o->rc_past[1] = kt_upload(b->be, &t, sizeof(float), src, n * sizeof(float));
	o->rc_past[2] = kt_download(b->be, o->last, &t, SIZE_MAX, 4);
	o->rc_past[3] = kt_download(b->be, o->last, &t, n * sizeof(float), 1);
	view = kt_rows(t, p->rows / 2, p->rows - p->rows / 2);
	o->view = op_get(r, b, &view);
	o->whole = op_get(r, b, &t); /* after the refused calls */
	return o;
}

static void transfer_check(struct op_run *r, const void *params, const void *input,
			   const void *got, const void *cpu)
{
	const struct transfer_params *p = params;
	const struct transfer_out *g = got;
	const size_t n = g->n, row0 = (size_t)(p->rows / 2) * p->cols;

	op_check(r, g->address % 64 == 0, "the tensor 64-byte aligned (%#lx)",
		 (unsigned long)g->address);
	op_check_rc(r, g->rc_part, 0, "a partial upload");
	op_check_bits(r, g->whole, g->host, n, "the partial upload at its offset and nowhere else");
	op_check_bits(r, g->pieces, g->host, n, "downloads in two pieces at offsets");
	op_check_bits(r, g->last, g->host + n - 1, 1, "a download of the last value");
	op_check_bits(r, g->view, g->host + row0, n - row0, "a download of a row view");
	for (int i = 0; i < 4; i++)
		op_check_rc(r, g->rc_past[i], -EINVAL, "a transfer past the end (%d)", i);
}

static const struct op_family transfer = { transfer_build, transfer_run, transfer_check, true };

/* alloc and free, with the tensors kt_alloc'd here (not the case's). */
struct alloc_out {
	int rc_negative, rc_dtype, rc_huge, rc_empty[2];
	bool empty_distinct, view_free_harmless, cleared, copy_free_harmless;
};

static void *alloc_run(struct op_run *r, const void *params, const void *input,
		       const struct op_backend *b)
{
	struct alloc_out *o = op_alloc(r, sizeof(*o));
	struct kt_tensor t, e0 = { 0 }, e1 = { 0 }, bad, view, copy;
	const float v[6] = { 1, 2, 3, 4, 5, 6 };
	float back[6];

	o->rc_negative = kt_alloc(b->be, KT_F32, -1, 4, &bad);
	o->rc_dtype = kt_alloc(b->be, (enum kt_dtype)99, 1, 4, &bad);
	o->rc_huge = kt_alloc(b->be, KT_F32, INT64_MAX / 2, INT64_MAX / 2, &bad);
	o->rc_empty[0] = kt_alloc(b->be, KT_F32, 0, 5, &e0);
	o->rc_empty[1] = kt_alloc(b->be, KT_F32, 0, 5, &e1);
	o->empty_distinct = e0.data && e1.data && e0.data != e1.data;
	kt_free(b->be, &e0);
	kt_free(b->be, &e1);
	op_ok(r, kt_alloc(b->be, KT_F32, 3, 2, &t), "kt_alloc");
	op_ok(r, kt_upload(b->be, &t, 0, v, sizeof v), "kt_upload");
	view = kt_rows(t, 1, 2);
	copy = t;
	kt_free(b->be, &view);
	o->view_free_harmless = !kt_download(b->be, back, &t, 0, sizeof back) &&
				!memcmp(back, v, sizeof v);
	kt_free(b->be, &t);
	o->cleared = !t.data;
	kt_free(b->be, &copy);
	kt_free(b->be, &t);
	o->copy_free_harmless = true; /* reached: no crash, no abort */
	return o;
}

static void alloc_check(struct op_run *r, const void *params, const void *input, const void *got,
			const void *cpu)
{
	const struct alloc_out *g = got;

	op_check_rc(r, g->rc_negative, -EINVAL, "negative rows refused");
	op_check_rc(r, g->rc_dtype, -EINVAL, "an unknown dtype refused");
	op_check_rc(r, g->rc_huge, -ENOMEM, "a size past memory");
	op_check_rc(r, g->rc_empty[0], 0, "an empty tensor");
	op_check_rc(r, g->rc_empty[1], 0, "another empty tensor");
	op_check(r, g->empty_distinct, "empty tensors have distinct pointers");
	op_check(r, g->view_free_harmless, "freeing a view leaves the tensor");
	op_check(r, g->cleared, "kt_free clears the tensor");
	op_check(r, g->copy_free_harmless, "freeing a copy, and twice, is harmless");
}

static const struct op_family alloc = { NULL, alloc_run, alloc_check, true };

/* Many allocations on a backend of their own, freed in random order. */
enum { MANY = 700 };

struct many_out {
	int rc;
	int wrong;
};

static void *many_build(struct op_run *r, const void *params, const struct op_backend *target)
{
	int32_t *order = op_ints(r, MANY);

	for (int i = 0; i < MANY; i++)
		order[i] = i;
	op_shuffle(r, order, MANY);
	return order;
}

static void *many_run(struct op_run *r, const void *params, const void *input,
		      const struct op_backend *b)
{
	const int32_t *order = input;
	const struct op_backend *own = op_open(r, b, b->config);
	struct kt_tensor *t = op_alloc(r, MANY * sizeof(*t));
	struct many_out *o = op_alloc(r, sizeof(*o));

	for (int i = 0; i < MANY && !o->rc; i++) {
		float v = (float)i;

		o->rc = kt_alloc(own->be, KT_F32, 1 + i % 3, 1, &t[i]);
		o->rc = o->rc ? o->rc : kt_upload(own->be, &t[i], 0, &v, sizeof v);
	}
	for (int k = 0; k < MANY / 2 && !o->rc; k++)
		kt_free(own->be, &t[order[k]]);
	for (int k = MANY / 2; k < MANY && !o->rc; k++) {
		float v = -1.0f;

		o->rc = kt_download(own->be, &v, &t[order[k]], 0, sizeof v);
		o->wrong += v != (float)order[k];
	}
	return o; /* the rest is freed by kt_backend_close when the case ends */
}

static void many_check(struct op_run *r, const void *params, const void *input, const void *got,
		       const void *cpu)
{
	const struct many_out *g = got;

	op_check_rc(r, g->rc, 0, "700 allocations, uploads and downloads");
	op_check(r, !g->wrong, "the half left holds its values (%d do not)", g->wrong);
}

static const struct op_family many = { many_build, many_run, many_check, true };

/* kt_weight from each source dtype. */
enum weight_src { SRC_F32, SRC_F16, SRC_BF16, SRC_F16_ALL, SRC_BF16_ALL };

struct weight_params {
	enum weight_src src;
	int rows, cols;
	int skew; /* the source's byte offset from an aligned address */
};

struct weight_in {
	unsigned char *src; /* skew bytes, then the source */
	double *value;      /* each element's exact value, decoded by the test */
};

struct weight_out {
	int rc;
	enum kt_dtype dtype, want_dtype;
	int64_t rows, cols;
	float *got;
};

/* binary16 from its fields, in double. */
static double f16_value(uint16_t h)
{
	int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
	double v = e == 31 ? (m ? NAN : INFINITY) : e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);

	return s ? -v : v;
}

/* bfloat16 from its fields, in double. */
static double bf16_value(uint16_t h)
{
	int s = h >> 15, e = (h >> 7) & 255, m = h & 127;
	double v = e == 255 ? (m ? NAN : INFINITY) : e ? ldexp(128 + m, e - 134) : ldexp(m, -133);

	return s ? -v : v;
}

static enum kt_dtype src_dtype(enum weight_src s)
{
	return s == SRC_F32 ? KT_F32 : s == SRC_F16 || s == SRC_F16_ALL ? KT_F16 : KT_BF16;
}

static void *weight_build(struct op_run *r, const void *params, const struct op_backend *target)
{
	const struct weight_params *p = params;
	const size_t n = (size_t)p->rows * p->cols, elem = kt_dtype_size(src_dtype(p->src));
	struct weight_in *in = op_alloc(r, sizeof(*in));

	in->src = op_alloc(r, n * elem + (size_t)p->skew);
	in->value = op_doubles(r, n);
	for (size_t i = 0; i < n; i++) {
		unsigned char *at = in->src + p->skew + i * elem;
		float f = (float)op_uniform(r, 0.5, 50.0) * (op_next(r) & 1 ? 1.0f : -1.0f);
		uint16_t h = (uint16_t)i;

		switch (p->src) {
		case SRC_F32: memcpy(at, &f, 4); in->value[i] = f; continue;
		case SRC_F16: /* every exponent, subnormals included; finite only */
			h = (uint16_t)((op_next(r) & 0x83ff) | (uint16_t)(op_randint(r, 31) << 10));
			break;
		case SRC_BF16: h = op_bf16_bits(f); break;
		case SRC_F16_ALL:
		case SRC_BF16_ALL: break;
		}
		memcpy(at, &h, 2);
		in->value[i] = src_dtype(p->src) == KT_F16 ? f16_value(h) : bf16_value(h);
	}
	return in;
}

static void *weight_run(struct op_run *r, const void *params, const void *input,
			const struct op_backend *b)
{
	const struct weight_params *p = params;
	const struct weight_in *in = input;
	struct weight_out *o = op_alloc(r, sizeof(*o));
	struct kt_tensor t;

	o->want_dtype = b->weight_dtype;
	o->rc = kt_weight(b->be, src_dtype(p->src), in->src + p->skew, p->rows, p->cols, false, &t);
	if (o->rc)
		return o;
	o->dtype = t.dtype;
	o->rows = t.rows;
	o->cols = t.cols;
	o->got = op_get(r, b, &t);
	kt_free(b->be, &t);
	return o;
}

static void weight_check(struct op_run *r, const void *params, const void *input, const void *got,
			 const void *cpu)
{
	const struct weight_params *p = params;
	const struct weight_in *in = input;
	const struct weight_out *g = got;
	const size_t n = (size_t)p->rows * p->cols;
	size_t wrong = 0, first = 0;

	op_check_rc(r, g->rc, 0, "kt_weight from %s", kt_dtype_name(src_dtype(p->src)));
	if (g->rc)
		return;
	op_check(r, g->dtype == g->want_dtype && (g->dtype == KT_F32 || g->dtype == KT_BF16),
		 "stored as %s, the backend's weight dtype", kt_dtype_name(g->dtype));
	op_check(r, g->rows == p->rows && g->cols == p->cols, "shape kept");
	for (size_t i = 0; i < n; i++) {
		double v = in->value[i];
		float want = op_stored(g->dtype, (float)v);
		bool ok = isnan(v) ? isnan(g->got[i]) : !memcmp(&g->got[i], &want, sizeof want);

		/* An exact conversion keeps a NaN's sign; rounding to bf16 may not. */
		if (isnan(v) && g->dtype == KT_F32)
			ok = ok && !signbit(g->got[i]) == !signbit(v);
		if (!ok && !wrong++)
			first = i;
	}
	op_check(r, !wrong, "%zu values as the exact source value %s (%zu are not; first [%zu] "
		 "got %a want %a)", n, g->dtype == KT_F32 ? "" : "rounded to nearest even", wrong,
		 first, n ? (double)g->got[first] : 0.0, n ? in->value[first] : 0.0);
}

static const struct op_family weight = { weight_build, weight_run, weight_check, true };

/* Aliasing: f32 sources that outlive the backend may be aliased. The
 * aligned source is static: a backend that free()d an aliased weight would
 * abort in glibc. */
static float alias_src[4][8];

struct alias_out {
	bool host;     /* the backend's memory is host memory (cpu) */
	bool aliased;  /* the aligned outliving source was aliased */
	int rc[5];
	float *aligned, *copied, *misaligned;
	uintptr_t misaligned_at;
	float before[15];
};

static void *alias_run(struct op_run *r, const void *params, const void *input,
		       const struct op_backend *b)
{
	struct alias_out *o = op_alloc(r, sizeof(*o));
	float *src = &alias_src[0][0], *stack = op_floats(r, 15);
	unsigned char *odd = op_alloc(r, 15 * sizeof(float) + 1);
	struct kt_tensor a = { 0 }, c = { 0 }, m = { 0 }, refused, copy;

	for (int i = 0; i < 32; i++)
		src[i] = (float)i * 0.5f - 3.0f;
	for (int i = 0; i < 15; i++)
		stack[i] = (float)i * 0.25f + 1.0f;
	memcpy(o->before, stack, sizeof o->before);
	o->host = strcmp(b->be->info.backend, "cpu") == 0;
	o->rc[0] = kt_weight(b->be, KT_F32, src, 4, 8, true, &a);
	o->aliased = !o->rc[0] && a.data == (void *)src;
	o->aligned = o->rc[0] ? NULL : op_get(r, b, &a);
	copy = a;
	kt_free(b->be, &a); /* must not free() src */
	kt_free(b->be, &copy);
	o->rc[1] = kt_weight(b->be, KT_F32, stack, 3, 5, false, &c);
	stack[6] += 1.0f; /* a copy does not see later changes */
	o->copied = o->rc[1] ? NULL : op_get(r, b, &c);
	kt_free(b->be, &c);
	memcpy(odd + 1, o->before, sizeof o->before);
	o->rc[2] = kt_weight(b->be, KT_F32, odd + 1, 3, 5, true, &m);
	o->misaligned_at = (uintptr_t)m.data;
	o->misaligned = o->rc[2] ? NULL : op_get(r, b, &m);
	kt_free(b->be, &m);
	o->rc[3] = kt_weight(b->be, KT_I32, stack, 3, 5, false, &refused);
	o->rc[4] = kt_weight(b->be, KT_F32, NULL, 3, 5, false, &refused);
	return o;
}

static void alias_check(struct op_run *r, const void *params, const void *input, const void *got,
			const void *cpu)
{
	const struct alias_out *g = got;
	float src[32];

	for (int i = 0; i < 32; i++)
		src[i] = (float)i * 0.5f - 3.0f;
	for (int i = 0; i < 3; i++)
		op_check_rc(r, g->rc[i], 0, "kt_weight %d", i);
	op_check_rc(r, g->rc[3], -EINVAL, "an i32 source refused");
	op_check_rc(r, g->rc[4], -EINVAL, "a NULL source refused");
	if (g->rc[0] || g->rc[1] || g->rc[2])
		return;
	op_check(r, g->aliased == g->host, "an aligned outliving f32 source %s",
		 g->host ? "aliased (host memory)" : "copied (device memory)");
	op_check_bits(r, g->aligned, src, 32, "its values");
	op_check_bits(r, g->copied, g->before, 15, "a source that does not outlive: copied");
	op_check(r, g->misaligned_at % 64 == 0, "a misaligned outliving source: copied, aligned");
	op_check_bits(r, g->misaligned, g->before, 15, "its values");
}

static const struct op_family alias = { NULL, alias_run, alias_check, true };

/* kt_copy: bytes from src to dst of the same size, any dtypes. */
enum copy_kind { COPY_F32, COPY_I32_TO_F32, COPY_BF16_TO_F32, COPY_SIZES, COPY_OVERLAP };

struct copy_params {
	enum copy_kind kind;
	int rows, cols; /* of src */
};

struct copy_out {
	int rc;
	size_t bytes;
	unsigned char *src, *dst;
};

static void *copy_build(struct op_run *r, const void *params, const struct op_backend *target)
{
	const struct copy_params *p = params;
	size_t n = (size_t)p->rows * p->cols;
	float *v = op_floats(r, n);

	op_fill(r, v, n, 3.0f);
	return v;
}

static void *copy_run(struct op_run *r, const void *params, const void *input,
		      const struct op_backend *b)
{
	const struct copy_params *p = params;
	struct copy_out *o = op_alloc(r, sizeof(*o));
	const enum kt_dtype dt = p->kind == COPY_I32_TO_F32 ? KT_I32 :
				 p->kind == COPY_BF16_TO_F32 ? KT_BF16 : KT_F32;
	struct kt_tensor src = op_tensor_raw(r, b, dt, p->rows, p->cols, input), dst;
	const size_t bytes = kt_nbytes(&src);

	/* dst: the same bytes in another shape (f32), or a case's wrong one */
	dst = op_tensor(r, b, KT_F32, 1, (int64_t)(bytes / 4) + (p->kind == COPY_SIZES), NULL);
	if (p->kind == COPY_OVERLAP)
		dst = kt_reshape(kt_rows(kt_reshape(src, p->rows * p->cols, 1), 1,
					 p->rows * p->cols - 1), 1, p->rows * p->cols - 1);
	o->rc = kt_copy(b->be, &dst, &src);
	o->bytes = bytes;
	o->src = op_alloc(r, bytes);
	o->dst = op_alloc(r, kt_nbytes(&dst));
	op_ok(r, kt_download(b->be, o->src, &src, 0, bytes), "kt_download");
	op_ok(r, kt_download(b->be, o->dst, &dst, 0, kt_nbytes(&dst)), "kt_download");
	return o;
}

static void copy_check(struct op_run *r, const void *params, const void *input, const void *got,
		       const void *cpu)
{
	const struct copy_params *p = params;
	const struct copy_out *g = got;

	if (p->kind == COPY_SIZES || p->kind == COPY_OVERLAP) {
		op_check_rc(r, g->rc, -EINVAL, "refused");
		if (p->kind == COPY_SIZES)
			op_check_poison(r, (const float *)g->dst, g->bytes / 4 + 1,
					"dst left alone");
		else
			op_check(r, !memcmp(g->src, input, g->bytes), "src left alone");
		return;
	}
	op_check_rc(r, g->rc, 0, "kt_copy runs");
	op_check(r, !memcmp(g->dst, g->src, g->bytes), "dst holds src's %zu bytes", g->bytes);
	op_check(r, !memcmp(g->src, input, g->bytes), "src as uploaded");
}

static const struct op_family copy = { copy_build, copy_run, copy_check, true };

struct memory_out {
	int rc;
	uint64_t free_bytes, total, info_total;
};

static void *memory_run(struct op_run *r, const void *params, const void *input,
			const struct op_backend *b)
{
	struct memory_out *o = op_alloc(r, sizeof(*o));

	o->rc = kt_memory(b->be, &o->free_bytes, &o->total);
	o->info_total = b->be->info.memory_total;
	return o;
}

static void memory_check(struct op_run *r, const void *params, const void *input,
			 const void *got, const void *cpu)
{
	const struct memory_out *g = got;

	op_check_rc(r, g->rc, 0, "kt_memory runs");
	op_check(r, g->total > 0 && g->total == g->info_total,
		 "total %llu bytes, as the device info says", (unsigned long long)g->total);
	op_check(r, g->free_bytes <= g->total, "free %llu bytes at most the total",
		 (unsigned long long)g->free_bytes);
}

static const struct op_family memory = { NULL, memory_run, memory_check, true };

#define TRANSFER(name, r, c) \
	{ name, "upload/download", &transfer, &(const struct transfer_params){ r, c } }
#define WEIGHT(name, ...) \
	{ name, "weight", &weight, &(const struct weight_params){ __VA_ARGS__ } }
#define COPY(name, ...) { name, "copy", &copy, &(const struct copy_params){ __VA_ARGS__ } }

static const struct op_case cases[] = {
	TRANSFER("upload/download [6, 5]", 6, 5),
	TRANSFER("upload/download [7, 143]", 7, 143),
	TRANSFER("upload/download [1, 1]", 1, 1),
	{ "alloc/free: refusals, empty tensors, views and copies", "alloc", &alloc, NULL },
	{ "alloc/free: 700 tensors freed in random order", "alloc", &many, NULL },
	WEIGHT("weight f16, every bit pattern", .src = SRC_F16_ALL, .rows = 256, .cols = 256),
	WEIGHT("weight f16, every bit pattern, source at an odd address", .src = SRC_F16_ALL,
	       .rows = 256, .cols = 256, .skew = 1),
	WEIGHT("weight bf16, every bit pattern", .src = SRC_BF16_ALL, .rows = 256, .cols = 256),
	WEIGHT("weight bf16, every bit pattern, source at an odd address", .src = SRC_BF16_ALL,
	       .rows = 256, .cols = 256, .skew = 3),
	WEIGHT("weight f32 [37, 129]", .src = SRC_F32, .rows = 37, .cols = 129),
	WEIGHT("weight f32 [1, 7]", .src = SRC_F32, .rows = 1, .cols = 7),
	WEIGHT("weight f32 [3000, 3000] (past cuda's staging buffer)", .src = SRC_F32,
	       .rows = 3000, .cols = 3000),
	WEIGHT("weight f16 [37, 129]", .src = SRC_F16, .rows = 37, .cols = 129),
	WEIGHT("weight f16 [1, 7]", .src = SRC_F16, .rows = 1, .cols = 7),
	WEIGHT("weight f16 [1000, 3000]", .src = SRC_F16, .rows = 1000, .cols = 3000),
	WEIGHT("weight bf16 [37, 129]", .src = SRC_BF16, .rows = 37, .cols = 129),
	WEIGHT("weight bf16 [1, 7]", .src = SRC_BF16, .rows = 1, .cols = 7),
	WEIGHT("weight bf16 [1000, 3000]", .src = SRC_BF16, .rows = 1000, .cols = 3000),
	{ "weight: aliasing of outliving f32 sources, refusals", "weight", &alias, NULL },
	COPY("copy f32 [7, 129]", .kind = COPY_F32, .rows = 7, .cols = 129),
	COPY("copy f32 [1, 1]", .kind = COPY_F32, .rows = 1, .cols = 1),
	COPY("copy i32 [5, 10] into f32 [1, 50]", .kind = COPY_I32_TO_F32, .rows = 5, .cols = 10),
	COPY("copy bf16 [4, 6] into f32 [1, 12]", .kind = COPY_BF16_TO_F32, .rows = 4, .cols = 6),
	COPY("copy: sizes that differ", .kind = COPY_SIZES, .rows = 3, .cols = 4),
	COPY("copy: dst over src", .kind = COPY_OVERLAP, .rows = 3, .cols = 4),
	{ "memory: free and total", "memory", &memory, NULL },
};

OP_LIST(ops_memory, cases);
