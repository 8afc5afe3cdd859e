/* Refusal cases of the mixture-of-experts ops: moe_route, moe_matmul and
 * moe_combine given bad shapes or a bad plan, in a small world of 3 tokens
 * and 8 experts whose plan is moe_ref_plan's (ops_moe.h).
 *
 * Shapes, on every backend: refused at the call, nothing written (floats
 * and ids still poison, the plan as it was), nothing to report at the sync
 * point. Offsets, order and slot entries: the same, on the cpu only (a
 * device backend does not read them on the host). All checks exact.
 */
#include <errno.h>
#include <string.h>

#include "tests/ops/ops.h"
#include "tests/ops/ops_moe.h"

/* The world of a refusal: T = 3 tokens, E = 8 experts, k = 2 (A = 6),
 * K = 16, N = 8, a valid plan, every float poisoned, each tensor allocated
 * with room for the bad shapes (k = 17 rows, one more row or column). */
enum { FT = 3, FE = 8, FK = 2, FA = FT * FK, FKD = 16, FN = 8, FROOM = 64 };

/* In op order: moe_route's, moe_matmul's from MM_W_COLS, moe_combine's from
 * COMBINE_Y_ROWS (fault_run picks the op by range). */
enum moe_fault {
	ROUTE_K_ZERO,        /* ids [3, 0] */
	ROUTE_K_ABOVE_MAX,   /* E = 32, k = KT_MOE_MAX_K + 1, every tensor to match */
	ROUTE_K_ABOVE_E,     /* E = 4, k = 5, every tensor to match */
	ROUTE_W_COLS,        /* w [3, 3] */
	ROUTE_IDS_ROWS,      /* ids [4, 2] */
	ROUTE_ORDER_ROWS,    /* order [5, 1] */
	ROUTE_SLOT_COLS,     /* slot [3, 2] */
	ROUTE_OFFSETS_ROWS,  /* offsets [8, 1] */
	ROUTE_LOGITS_I32,    /* logits of i32 */
	ROUTE_W_OVER_LOGITS, /* w is logits' memory */
	MM_W_COLS,           /* w of K - 1 columns */
	MM_W_ROWS,           /* w rows not a multiple of N */
	MM_RANGE,            /* e0 + n_local = E + 1 */
	MM_E0_NEGATIVE,      /* e0 = -1 */
	MM_K_ABOVE_MAX,      /* k = KT_MOE_MAX_K + 1 with x [1, K] and A = 17 to match */
	MM_K_NEGATIVE,       /* k = -1 */
	MM_X_ROWS,           /* x [4, K] for k = 2, A = 6 */
	MM_SORTED_X_ROWS,    /* k = 0, x [3, K] for A = 6 */
	MM_Y_ROWS,           /* y [5, N] */
	MM_ORDER_ROWS,       /* order [7, 1] */
	MM_Y_OVER_X,         /* y is x's memory */
	MM_OFFSETS_DOWN,     /* offsets going down (cpu only) */
	MM_OFFSETS_END,      /* offsets[E] = A - 1 (cpu only) */
	MM_OFFSETS_START,    /* offsets[0] = 1 (cpu only) */
	MM_ORDER_RANGE,      /* an order entry = A (cpu only) */
	COMBINE_Y_ROWS,      /* y [5, N] */
	COMBINE_K_ABOVE_MAX, /* w [1, 17], y [17, N], slot [17, 1] */
	COMBINE_SLOT_ROWS,   /* slot [5, 1] */
	COMBINE_OUT_COLS,    /* out [3, N + 1] */
	COMBINE_OUT_OVER_Y,  /* out is y's memory */
	COMBINE_SLOT_RANGE,  /* a slot entry = A (cpu only) */
};

struct fault_params {
	enum moe_fault fault;
	bool host_checked; /* refused from the values of offsets, order or slot: cpu only */
};

/* The float tensors of the world, all poisoned: none may be written. */
enum { F_LOGITS, F_X, F_W, F_Y, F_OUT, F_CW, N_FLOATS };

struct fault_out {
	bool asked;
	int rc_call, rc_sync;
	float *f[N_FLOATS];   /* each float tensor, whole, after the call */
	size_t nf[N_FLOATS];
	int32_t *ids, *slot;  /* poisoned */
	int32_t *order, *offsets, *order_in, *offsets_in; /* the plan after and before */
	size_t n_ids, n_slot;
};

static void *fault_run(struct op_run *r, const void *params, const void *input,
		       const struct op_backend *b)
{
	static const int floats_cols[N_FLOATS] = { 32, FKD, 2 * FKD, FN + 1, FN + 1,
						   KT_MOE_MAX_K + 1 };
	const struct fault_params *p = params;
	struct fault_out *o = op_alloc(r, sizeof(*o));
	int32_t ids[FA], *order = op_ints(r, FROOM), *slot = op_ints(r, FROOM);
	int32_t *offsets = op_ints(r, FROOM);
	struct kt_tensor f[N_FLOATS], d_ids, d_order, d_slot, d_offsets;
	struct kt_tensor logits, x, w, y, out, cw, id, ord, sl, off;
	int k = FK, e0 = 0;

	for (int a = 0; a < FA; a++)
		ids[a] = (a * 3) % FE;
	moe_ref_plan(ids, FA, FE, order, slot, offsets);
	for (int i = 0; i < N_FLOATS; i++)
		f[i] = op_tensor(r, b, i == F_W ? b->weight_dtype : KT_F32, FROOM, floats_cols[i],
				 NULL);
	d_ids = op_tensor_raw(r, b, KT_I32, FROOM, KT_MOE_MAX_K + 1, NULL);
	d_slot = op_tensor_raw(r, b, KT_I32, FROOM, 2, NULL);
	d_order = op_tensor_raw(r, b, KT_I32, FROOM, 1, NULL);
	d_offsets = op_tensor_raw(r, b, KT_I32, FROOM, 1, NULL);
	logits = kt_reshape(f[F_LOGITS], FT, FE);
	x = kt_reshape(f[F_X], FT, FKD);
	w = kt_reshape(f[F_W], FE * FN, FKD);
	y = kt_reshape(f[F_Y], FA, FN);
	out = kt_reshape(f[F_OUT], FT, FN);
	cw = kt_reshape(f[F_CW], FT, FK);
	id = kt_reshape(d_ids, FT, FK);
	ord = kt_reshape(d_order, FA, 1);
	sl = kt_reshape(d_slot, FA, 1);
	off = kt_reshape(d_offsets, FE + 1, 1);
	switch (p->fault) {
	case ROUTE_K_ZERO:
		id = kt_reshape(id, FT, 0);
		cw = kt_reshape(cw, FT, 0);
		ord = kt_reshape(ord, 0, 1);
		sl = kt_reshape(sl, 0, 1);
		break;
	case ROUTE_K_ABOVE_MAX:
		k = KT_MOE_MAX_K + 1;
		logits = kt_reshape(logits, FT, 32);
		id = kt_reshape(id, FT, k);
		cw = kt_reshape(cw, FT, k);
		ord = kt_reshape(ord, FT * k, 1);
		sl = kt_reshape(sl, FT * k, 1);
		off = kt_reshape(off, 33, 1);
		break;
	case ROUTE_K_ABOVE_E:
		logits = kt_reshape(logits, FT, 4);
		id = kt_reshape(id, FT, 5);
		cw = kt_reshape(cw, FT, 5);
		ord = kt_reshape(ord, FT * 5, 1);
		sl = kt_reshape(sl, FT * 5, 1);
		off = kt_reshape(off, 5, 1);
		break;
	case ROUTE_W_COLS: cw = kt_reshape(cw, FT, FK + 1); break;
	case ROUTE_IDS_ROWS: id = kt_reshape(id, FT + 1, FK); break;
	case ROUTE_ORDER_ROWS: ord = kt_reshape(ord, FA - 1, 1); break;
	case ROUTE_SLOT_COLS: sl = kt_reshape(sl, FT, 2); break;
	case ROUTE_OFFSETS_ROWS: off = kt_reshape(off, FE, 1); break;
	case ROUTE_LOGITS_I32: logits.dtype = KT_I32; break;
	case ROUTE_W_OVER_LOGITS: cw = kt_reshape(logits, FT, FK); break;
	case MM_W_COLS: w = kt_reshape(w, FE * FN, FKD - 1); break;
	case MM_W_ROWS: w = kt_reshape(w, FE * FN - 1, FKD); break;
	case MM_RANGE: e0 = 1; break;
	case MM_E0_NEGATIVE: e0 = -1; w = kt_reshape(w, FN, FKD); break;
	case MM_K_ABOVE_MAX:
		k = KT_MOE_MAX_K + 1;
		x = kt_reshape(x, 1, FKD);
		y = kt_reshape(y, k, FN);
		ord = kt_reshape(ord, k, 1);
		break;
	case MM_K_NEGATIVE: k = -1; break;
	case MM_X_ROWS: x = kt_reshape(x, FT + 1, FKD); break;
	case MM_SORTED_X_ROWS: k = 0; break;
	case MM_Y_ROWS: y = kt_reshape(y, FA - 1, FN); break;
	case MM_ORDER_ROWS: ord = kt_reshape(ord, FA + 1, 1); break;
	case MM_Y_OVER_X: y = kt_reshape(x, FA, FN); break;
	case MM_OFFSETS_DOWN: offsets[3] = offsets[4] + 1; break;
	case MM_OFFSETS_END: offsets[FE] = FA - 1; break;
	case MM_OFFSETS_START: offsets[0] = 1; break;
	case MM_ORDER_RANGE: order[2] = FA; break;
	case COMBINE_Y_ROWS: y = kt_reshape(y, FA - 1, FN); break;
	case COMBINE_K_ABOVE_MAX:
		k = KT_MOE_MAX_K + 1;
		cw = kt_reshape(cw, 1, k);
		y = kt_reshape(y, k, FN);
		sl = kt_reshape(sl, k, 1);
		out = kt_reshape(out, 1, FN);
		break;
	case COMBINE_SLOT_ROWS: sl = kt_reshape(sl, FA - 1, 1); break;
	case COMBINE_OUT_COLS: out = kt_reshape(out, FT, FN + 1); break;
	case COMBINE_OUT_OVER_Y: out = kt_reshape(y, FT, FN); break;
	case COMBINE_SLOT_RANGE: slot[4] = FA; break;
	}
	o->order_in = order;
	o->offsets_in = offsets;
	op_ok(r, kt_upload(b->be, &d_order, 0, order, kt_nbytes(&d_order)), "kt_upload (order)");
	op_ok(r, kt_upload(b->be, &d_offsets, 0, offsets, kt_nbytes(&d_offsets)),
	      "kt_upload (offsets)");
	if (p->fault >= COMBINE_Y_ROWS)
		op_ok(r, kt_upload(b->be, &d_slot, 0, slot, FROOM * sizeof(int32_t)),
		      "kt_upload (slot)");
	o->asked = !p->host_checked || strcmp(b->be->info.backend, "cpu") == 0;
	if (!o->asked)
		return o;
	if (p->fault < MM_W_COLS)
		o->rc_call = kt_moe_route(b->be, &id, &cw, &ord, &sl, &off, &logits, true);
	else if (p->fault < COMBINE_Y_ROWS)
		o->rc_call = kt_moe_matmul(b->be, &y, &x, &w, &ord, &off, k, e0);
	else
		o->rc_call = kt_moe_combine(b->be, &out, &y, &cw, &sl);
	o->rc_sync = kt_synchronize(b->be);
	for (int i = 0; i < N_FLOATS; i++) {
		o->f[i] = op_get(r, b, &f[i]);
		o->nf[i] = (size_t)(f[i].rows * f[i].cols);
	}
	o->ids = op_get_ints(r, b, &d_ids);
	o->n_ids = (size_t)(d_ids.rows * d_ids.cols);
	o->order = op_get_ints(r, b, &d_order);
	o->offsets = op_get_ints(r, b, &d_offsets);
	if (p->fault < COMBINE_Y_ROWS) {
		o->slot = op_get_ints(r, b, &d_slot);
		o->n_slot = (size_t)(d_slot.rows * d_slot.cols);
	}
	return o;
}

static void fault_check(struct op_run *r, const void *params, const void *input,
			const void *got, const void *cpu)
{
	static const char *const names[N_FLOATS] = { "logits", "x", "w", "y", "out",
						     "the route's w and the combine's" };
	const struct fault_out *g = got;
	size_t written = 0;

	if (!g->asked) {
		op_check(r, true, "not asked of this backend: it reads the plan on the device");
		return;
	}
	op_check_rc(r, g->rc_call, -EINVAL, "refused at the call");
	op_check_rc(r, g->rc_sync, 0, "nothing to report at the sync point");
	for (int i = 0; i < N_FLOATS; i++)
		op_check_poison(r, g->f[i], g->nf[i], "%s left alone", names[i]);
	for (size_t j = 0; j < g->n_ids; j++)
		written += g->ids[j] != 0x7f7f7f7f;
	for (size_t j = 0; j < g->n_slot; j++)
		written += g->slot[j] != 0x7f7f7f7f;
	op_check(r, !written, "ids%s left alone (%zu values written)", g->n_slot ? " and slot" : "",
		 written);
	op_check_ints(r, g->order, g->order_in, FROOM, "order left alone");
	op_check_ints(r, g->offsets, g->offsets_in, FROOM, "offsets left alone");
}

static const struct op_family fault = { NULL, fault_run, fault_check, true };

#define FAULT(name, op, f) { name, op, &fault, &(const struct fault_params){ .fault = f } }
#define HOST_FAULT(name, op, f) \
	{ name, op, &fault, &(const struct fault_params){ .fault = f, .host_checked = true } }

static const struct op_case cases[] = {
	FAULT("moe_route: k = 0", "moe_route", ROUTE_K_ZERO),
	FAULT("moe_route: k = KT_MOE_MAX_K + 1", "moe_route", ROUTE_K_ABOVE_MAX),
	FAULT("moe_route: k above E", "moe_route", ROUTE_K_ABOVE_E),
	FAULT("moe_route: w of other columns", "moe_route", ROUTE_W_COLS),
	FAULT("moe_route: ids of other rows", "moe_route", ROUTE_IDS_ROWS),
	FAULT("moe_route: order of other rows", "moe_route", ROUTE_ORDER_ROWS),
	FAULT("moe_route: slot of two columns", "moe_route", ROUTE_SLOT_COLS),
	FAULT("moe_route: offsets of E rows", "moe_route", ROUTE_OFFSETS_ROWS),
	FAULT("moe_route: logits of i32", "moe_route", ROUTE_LOGITS_I32),
	FAULT("moe_route: w over logits", "moe_route", ROUTE_W_OVER_LOGITS),
	FAULT("moe_matmul: w of other columns", "moe_matmul", MM_W_COLS),
	FAULT("moe_matmul: w rows not whole experts", "moe_matmul", MM_W_ROWS),
	FAULT("moe_matmul: experts past E", "moe_matmul", MM_RANGE),
	FAULT("moe_matmul: e0 = -1", "moe_matmul", MM_E0_NEGATIVE),
	FAULT("moe_matmul: k = KT_MOE_MAX_K + 1", "moe_matmul", MM_K_ABOVE_MAX),
	FAULT("moe_matmul: k = -1", "moe_matmul", MM_K_NEGATIVE),
	FAULT("moe_matmul: x rows * k other than y's", "moe_matmul", MM_X_ROWS),
	FAULT("moe_matmul: k = 0, x rows other than y's", "moe_matmul", MM_SORTED_X_ROWS),
	FAULT("moe_matmul: y of other rows than order", "moe_matmul", MM_Y_ROWS),
	FAULT("moe_matmul: order of other rows than y", "moe_matmul", MM_ORDER_ROWS),
	FAULT("moe_matmul: y over x", "moe_matmul", MM_Y_OVER_X),
	HOST_FAULT("moe_matmul: offsets going down", "moe_matmul", MM_OFFSETS_DOWN),
	HOST_FAULT("moe_matmul: offsets ending short of T*k", "moe_matmul", MM_OFFSETS_END),
	HOST_FAULT("moe_matmul: offsets starting at 1", "moe_matmul", MM_OFFSETS_START),
	HOST_FAULT("moe_matmul: an order entry = T*k", "moe_matmul", MM_ORDER_RANGE),
	FAULT("moe_combine: y of other rows", "moe_combine", COMBINE_Y_ROWS),
	FAULT("moe_combine: k = KT_MOE_MAX_K + 1", "moe_combine", COMBINE_K_ABOVE_MAX),
	FAULT("moe_combine: slot of other rows", "moe_combine", COMBINE_SLOT_ROWS),
	FAULT("moe_combine: out of other columns", "moe_combine", COMBINE_OUT_COLS),
	FAULT("moe_combine: out over y", "moe_combine", COMBINE_OUT_OVER_Y),
	HOST_FAULT("moe_combine: a slot entry = T*k", "moe_combine", COMBINE_SLOT_RANGE),
};

OP_LIST(ops_moe_faults, cases);
