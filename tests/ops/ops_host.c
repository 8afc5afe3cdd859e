/* Cases of the swap tier's ops: host_alloc, copy_async and copy_done.
 *
 *  - host memory is aligned to KT_HOST_ALIGN and holds what is copied in;
 *  - copies of spans of a tensor go down to host memory and back up into
 *    another tensor byte for byte, at any offset, finishing in ticket order;
 *  - a copy is ordered after the ops enqueued before it: it sees what a
 *    kt_copy just wrote;
 *  - more copies than the backend keeps in flight: the excess is refused
 *    with -EAGAIN and goes through once earlier ones finish;
 *  - spans outside the tensor and tickets never handed out are refused.
 * All run on the backend under test alone (self-checked): on the cpu a copy
 * has finished when copy_async returns, on cuda it runs on its own stream.
 */
#include <errno.h>
#include <string.h>

#include "tests/ops/ops.h"

/* Bounded wait for a ticket: copy_done polled until it is not 0. */
static int wait_copy(const struct op_backend *b, uint64_t ticket)
{
	int rc = 0;
	for (long i = 0; i < 100000000L && rc == 0; i++)
		rc = kt_copy_done(b->be, ticket);
	return rc;
}

enum host_kind { HOST_SPANS, HOST_ORDERED, HOST_MANY, HOST_REFUSALS };

struct host_params {
	enum host_kind kind;
	int spans;                  /* copies of span_bytes each */
	int span_bytes;             /* a multiple of 4 */
};

struct host_out {
	bool aligned;
	int rc_down, rc_up, rc_done;  /* the first failure of each, 0: none */
	int refused[4];
	size_t bytes;
	unsigned char *want, *host, *back;
	int again;                  /* copies refused with -EAGAIN, then retried */
	bool bounded;               /* the backend keeps fewer copies in flight than a HOST_MANY
				     * case starts (cuda: CUDA_COPY_RING), so some must wait */
};

static void *host_build(struct op_run *r, const void *params, const struct op_backend *target)
{
	const struct host_params *p = params;
	size_t n = (size_t)p->spans * (size_t)p->span_bytes / 4;
	float *v = op_floats(r, n);
	op_fill(r, v, n, 5.0f);
	return v;
}

/* Copy every span between t and host (down to host, or up), in reverse
 * order of their place going down so that offsets and order both count,
 * retrying what the backend has no room for; then wait for the last. */
static void copy_spans(struct op_run *r, const struct host_params *p, const struct op_backend *b,
		       struct host_out *o, void *host, const struct kt_tensor *t, bool down,
		       int *first_rc)
{
	uint64_t ticket = 0, last = 0;
	for (int k = 0; k < p->spans; k++) {
		const int i = down ? p->spans - 1 - k : k;
		const size_t off = (size_t)i * (size_t)p->span_bytes;
		int rc;
		while ((rc = kt_copy_async(b->be, (char *)host + off, t, off, (size_t)p->span_bytes,
					   down, &ticket)) == -EAGAIN) {
			o->again++;
			if (!o->rc_done && wait_copy(b, last) < 0)
				o->rc_done = -EIO;
		}
		if (rc && !*first_rc)
			*first_rc = rc;
		last = ticket;
	}
	if (wait_copy(b, last) != 1 && !o->rc_done)
		o->rc_done = -EIO;
}

/* Down into the host memory, then up into another tensor. */
static void spans(struct op_run *r, const struct host_params *p, const float *in,
		  const struct op_backend *b, struct host_out *o, void *host)
{
	const int64_t cols = (int64_t)p->spans * p->span_bytes / 4;
	struct kt_tensor src = op_tensor(r, b, KT_F32, 1, cols, NULL);
	if (p->kind == HOST_ORDERED) {
		/* src gets its values from a kt_copy enqueued just before the
		 * copies down: they must see its result. */
		struct kt_tensor from = op_tensor(r, b, KT_F32, 1, cols, in);
		op_ok(r, kt_copy(b->be, &src, &from), "kt_copy");
	} else {
		op_set(r, b, &src, in);
	}
	copy_spans(r, p, b, o, host, &src, true, &o->rc_down);
	memcpy(o->host, host, o->bytes);
	struct kt_tensor dst = op_tensor(r, b, KT_F32, 1, cols, NULL);
	copy_spans(r, p, b, o, host, &dst, false, &o->rc_up);
	op_ok(r, kt_download(b->be, o->back, &dst, 0, o->bytes), "kt_download");
}

static void *host_run(struct op_run *r, const void *params, const void *input,
		      const struct op_backend *b)
{
	const struct host_params *p = params;
	struct host_out *o = op_alloc(r, sizeof(*o));
	void *host = NULL;
	o->bytes = (size_t)p->spans * (size_t)p->span_bytes;
	o->want = op_dup(r, input, o->bytes);
	o->host = op_alloc(r, o->bytes);
	o->back = op_alloc(r, o->bytes);
	op_ok(r, kt_host_alloc(b->be, o->bytes, &host), "kt_host_alloc");
	o->aligned = (uintptr_t)host % KT_HOST_ALIGN == 0;
	o->bounded = !strcmp(b->kind, "cuda");
	if (p->kind == HOST_REFUSALS) {
		struct kt_tensor t = op_tensor(r, b, KT_F32, 1, (int64_t)(o->bytes / 4), NULL);
		uint64_t ticket = 0;
		o->refused[0] = kt_copy_async(b->be, host, &t, 4, o->bytes, true, &ticket);
		o->refused[1] = kt_copy_async(b->be, host, &t, o->bytes + 4, 4, false, &ticket);
		o->refused[2] = kt_copy_async(b->be, NULL, &t, 0, 4, true, &ticket);
		o->refused[3] = kt_copy_done(b->be, UINT64_MAX);
	} else {
		spans(r, p, input, b, o, host);
	}
	kt_host_free(b->be, host);
	return o;
}

static void host_check(struct op_run *r, const void *params, const void *input, const void *got,
		       const void *cpu)
{
	const struct host_params *p = params;
	const struct host_out *g = got;
	op_check(r, g->aligned, "host memory aligned to %d", KT_HOST_ALIGN);
	if (p->kind == HOST_REFUSALS) {
		op_check_rc(r, g->refused[0], -EINVAL, "a span past the tensor's end");
		op_check_rc(r, g->refused[1], -EINVAL, "an offset past the tensor's end");
		op_check_rc(r, g->refused[2], -EINVAL, "no host memory");
		op_check_rc(r, g->refused[3], -EINVAL, "a ticket never handed out");
		return;
	}
	op_check_rc(r, g->rc_down, 0, "copies down start");
	op_check_rc(r, g->rc_up, 0, "copies up start");
	op_check_rc(r, g->rc_done, 0, "every copy finishes");
	op_check(r, !memcmp(g->host, g->want, g->bytes), "host memory holds the %d spans",
		 p->spans);
	op_check(r, !memcmp(g->back, g->want, g->bytes), "the tensor copied up holds them");
	if (p->kind == HOST_MANY && g->bounded)
		op_check(r, g->again > 0, "copies past those in flight wait for room (%d did)",
			 g->again);
}

static const struct op_family host = { host_build, host_run, host_check, true };

#define HOST(name, ...) { name, "copy_async", &host, &(const struct host_params){ __VA_ARGS__ } }

static const struct op_case cases[] = {
	HOST("host copies: 1 span of 4 bytes", .kind = HOST_SPANS, .spans = 1, .span_bytes = 4),
	HOST("host copies: 7 spans of 8 KiB", .kind = HOST_SPANS, .spans = 7, .span_bytes = 8192),
	HOST("host copies: 3 spans of 2.3 MB (a Qwen3-8B block)", .kind = HOST_SPANS, .spans = 3,
	     .span_bytes = 2359296),
	HOST("host copies: after the kt_copy enqueued before them", .kind = HOST_ORDERED,
	     .spans = 16, .span_bytes = 65536),
	HOST("host copies: 3000 in flight, more than a backend keeps", .kind = HOST_MANY,
	     .spans = 3000, .span_bytes = 256),
	HOST("host copies: refusals", .kind = HOST_REFUSALS, .spans = 2, .span_bytes = 64),
};

OP_LIST(ops_host, cases);
