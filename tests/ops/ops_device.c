/* Cases of the backend object itself: its device info, the limits open
 * refuses, and the device index, for the kind under test.
 *
 * What differs by kind is said where it is checked: the cpu names its
 * thread count and keeps f32 KV caches without graphs; cuda names the GPU,
 * asks for bf16 caches, records graphs and refuses a device index past the
 * last GPU (the cpu ignores the index).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "tests/ops/ops.h"

enum device_case { DEVICE_INFO, DEVICE_THREADS, OPEN_BAD_LIMITS, OPEN_DEVICE_INDEX };

struct device_params {
	enum device_case what;
};

struct device_out {
	bool cpu;
	struct kt_device_info info, one; /* one: a second cpu backend of one thread */
	const char *kind, *built;
	long online;
	int threads;
	int rc[4];
	char err[4][ATLAS_ERRLEN];
	bool opened[4];
};

/* kt_backend_open with c; a backend that opens anyway is closed at once. */
static int try_open(const struct kt_config *c, char *err, bool *opened)
{
	struct kt_backend *be = NULL;
	int rc = kt_backend_open(c, &be, err, ATLAS_ERRLEN);

	*opened = be != NULL;
	kt_backend_close(be);
	return rc;
}

static void *device_run(struct op_run *r, const void *params, const void *input,
			const struct op_backend *b)
{
	const struct device_params *p = params;
	struct device_out *o = op_alloc(r, sizeof(*o));
	struct kt_config c = *b->config;

	o->cpu = strcmp(b->kind, "cpu") == 0;
	o->info = b->be->info;
	o->kind = b->kind;
	o->built = kt_backends_built();
	o->online = sysconf(_SC_NPROCESSORS_ONLN);
	o->threads = b->config->threads;
	c.backend = b->kind;
	switch (p->what) {
	case DEVICE_INFO: break;
	case DEVICE_THREADS:
		c.threads = 1;
		if (o->cpu)
			o->one = op_open(r, b, &c)->be->info;
		break;
	case OPEN_BAD_LIMITS:
		c.max_context = 0;
		o->rc[0] = try_open(&c, o->err[0], &o->opened[0]);
		c = *b->config;
		c.backend = b->kind;
		c.max_head_dim = 63;
		o->rc[1] = try_open(&c, o->err[1], &o->opened[1]);
		c.backend = "tpu";
		o->rc[2] = try_open(&c, o->err[2], &o->opened[2]);
		break;
	case OPEN_DEVICE_INDEX:
		c.device = 1000;
		o->rc[0] = try_open(&c, o->err[0], &o->opened[0]);
		break;
	}
	return o;
}

static void device_check(struct op_run *r, const void *params, const void *input, const void *got,
			 const void *cpu)
{
	const struct device_params *p = params;
	const struct device_out *g = got;
	const struct kt_device_info *i = &g->info;
	char want[64];

	switch (p->what) {
	case DEVICE_INFO:
		op_check(r, strcmp(i->backend, g->kind) == 0, "backend \"%s\"", i->backend);
		op_check(r, strlen(i->name) > 0, "name \"%s\"", i->name);
		op_check(r, i->memory_total > 0 && i->memory_free <= i->memory_total,
			 "memory %.1f GiB total, %.1f GiB free",
			 (double)i->memory_total / (1 << 30), (double)i->memory_free / (1 << 30));
		op_check(r, i->kv_dtype == (g->cpu ? KT_F32 : KT_BF16), "KV caches in %s",
			 kt_dtype_name(i->kv_dtype));
		op_check(r, i->graphs == !g->cpu, "graphs %s",
			 i->graphs ? "recorded" : "not recorded");
		op_check(r, strstr(g->built, g->kind) != NULL,
			 "\"%s\" among the backends built (%s)", g->kind, g->built);
		break;
	case DEVICE_THREADS:
		if (!g->cpu) {
			op_check(r, strncmp(i->name, "cpu", 3) != 0, "the device's name: \"%s\"",
				 i->name);
			break;
		}
		snprintf(want, sizeof want, "cpu (%ld thread", g->online);
		op_check(r, g->threads != 0 || strstr(i->name, want), "\"%s\" for all %ld cores",
			 i->name, g->online);
		op_check(r, strstr(g->one.name, "cpu (1 thread, ") != NULL, "\"%s\" for one thread",
			 g->one.name);
		break;
	case OPEN_BAD_LIMITS:
		op_check_rc(r, g->rc[0], -EINVAL, "max_context 0 refused");
		op_check(r, strstr(g->err[0], "max_context") && !g->opened[0],
			 "the message names max_context: \"%s\"", g->err[0]);
		op_check_rc(r, g->rc[1], -EINVAL, "an odd max_head_dim refused");
		op_check(r, strstr(g->err[1], "max_head_dim") && !g->opened[1],
			 "the message names max_head_dim: \"%s\"", g->err[1]);
		op_check_rc(r, g->rc[2], -EINVAL, "an unknown backend refused");
		op_check(r, strstr(g->err[2], "tpu") && !g->opened[2],
			 "the message names it: \"%s\"", g->err[2]);
		break;
	case OPEN_DEVICE_INDEX:
		if (g->cpu) {
			op_check_rc(r, g->rc[0], 0, "the cpu ignores the device index");
			break;
		}
		op_check_rc(r, g->rc[0], -ENODEV, "device 1000 refused");
		op_check(r, strstr(g->err[0], "out of range") && !g->opened[0],
			 "the message says so: \"%s\"", g->err[0]);
		break;
	}
}

static const struct op_family device = { NULL, device_run, device_check, true };

#define DEVICE(name, w) { name, "open", &device, &(const struct device_params){ w } }

static const struct op_case cases[] = {
	DEVICE("device info", DEVICE_INFO),
	DEVICE("device name: cpu threads, or the GPU", DEVICE_THREADS),
	DEVICE("open refuses bad limits and unknown backends", OPEN_BAD_LIMITS),
	DEVICE("open: a device index past the last device", OPEN_DEVICE_INDEX),
};

OP_LIST(ops_device, cases);
