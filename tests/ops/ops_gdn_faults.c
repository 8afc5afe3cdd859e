/* Refusal cases of conv1d and delta_rule, in a small world: Hk = 1, Hv = 2,
 * dk = dv = 16, K = 4 (C = 64 channels, the delta rule's matrices at off =
 * 192 of a state of 3 rows of 704 floats), 3 rows: slot 1 at position 5,
 * then slot 0 at positions 0 and 1. Every float tensor is poison, each
 * allocated with room for the bad shapes.
 *
 * Shapes, heads, off and overlaps, on every backend: refused at the call
 * (-EINVAL), nothing written (every float still poison), nothing to report
 * at the sync point. Slot and position values (a slot out of range, one
 * sequence's rows apart or not at consecutive positions): the same, on the
 * cpu only (a device backend does not read them on the host); so is dk
 * past max_head_dim (the cpu's scratch holds max_head_dim). All checks
 * exact.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "tests/ops/ops.h"

enum { FT = 3, FHV = 2, FD = 16, FK = 4, FC = 64, FOFF = 192, FF = 704, FSLOTS = 3 };

/* conv1d's first, delta_rule's from DELTA_HV_HK. */
enum gdn_fault {
	CONV_X_COLS,         /* x [3, 63] for out [3, 64] */
	CONV_W_ROWS,         /* w [63, 4] */
	CONV_OUT_ROWS,       /* out [2, 64] */
	CONV_STATE_COLS,     /* state [3, 191]: one float short of K - 1 inputs */
	CONV_SLOT_ROWS,      /* slot [2, 1] */
	CONV_N_TOKENS,       /* b->n_tokens 4 */
	CONV_X_I32,          /* x of i32 */
	CONV_OUT_OVER_STATE, /* out is the state's memory */
	CONV_SLOT_RANGE,     /* a slot = state rows (cpu only) */
	CONV_SLOT_NEGATIVE,  /* a slot = -1 (cpu only) */
	CONV_POS_GAP,        /* a sequence at positions 0, 2 (cpu only) */
	CONV_SLOT_TWICE,     /* slots 1, 0, 1: one sequence's rows apart (cpu only) */
	CONV_POS_NEGATIVE,   /* a position -1 (cpu only) */
	DELTA_HV_HK,         /* Hk = 2, Hv = 3, every tensor to match */
	DELTA_HK_ZERO,       /* Hk = 0 */
	DELTA_OFF_NEGATIVE,  /* off = -1 */
	DELTA_OFF_PAST,      /* off = 193: the matrices pass the row's end by a float */
	DELTA_QKV_COLS,      /* qkv [3, 95] */
	DELTA_BA_COLS,       /* ba [3, 2] */
	DELTA_OUT_COLS,      /* out [3, 31] */
	DELTA_A_LOG_COLS,    /* a_log [1, 3] */
	DELTA_DK_LIMIT,      /* dk = 258, past max_head_dim, every tensor to match (cpu only) */
	DELTA_STATE_OVER_QKV, /* the state overlaps qkv */
	DELTA_SLOT_RANGE,    /* a slot = state rows (cpu only) */
	DELTA_SLOT_TWICE,    /* slots 1, 0, 1 (cpu only) */
};

struct fault_params {
	enum gdn_fault fault;
	bool host_checked;
};

enum { F_X, F_OUT, F_BA, F_AL, F_DT, F_STATE, F_W, N_FLOATS };

struct fault_out {
	bool asked;
	int rc_call, rc_sync;
	float *f[N_FLOATS];
	size_t nf[N_FLOATS];
};

static void *fault_run(struct op_run *r, const void *params, const void *input,
		       const struct op_backend *b)
{
	static const int64_t rows[N_FLOATS] = { 8, 8, 8, 1, 1, 4, 64 };
	static const int64_t cols[N_FLOATS] = { 1024, 1024, 64, 16, 16, 9000, 8 };
	const struct fault_params *p = params;
	struct fault_out *o = op_alloc(r, sizeof(*o));
	int32_t slot[FT] = { 1, 0, 0 }, pos[FT] = { 5, 0, 1 };
	struct kt_tensor f[N_FLOATS], x, out, ba, al, dt, state, w, ts, tp;
	float *nan_w = op_floats(r, 64 * 8);
	int Hk = 1, Hv = FHV, dk = FD, T = FT;
	int64_t off = FOFF;

	for (int i = 0; i < 64 * 8; i++)
		nan_w[i] = NAN;
	for (int i = 0; i < N_FLOATS; i++)
		f[i] = i == F_W ? op_weight(r, b, KT_F32, nan_w, rows[i], cols[i])
				: op_tensor(r, b, KT_F32, rows[i], cols[i], NULL);
	x = kt_reshape(f[F_X], FT, p->fault < DELTA_HV_HK ? FC : 2 * FD + FHV * FD);
	out = kt_reshape(f[F_OUT], FT, p->fault < DELTA_HV_HK ? FC : FHV * FD);
	ba = kt_reshape(f[F_BA], FT, 2 * FHV);
	al = kt_reshape(f[F_AL], 1, FHV);
	dt = kt_reshape(f[F_DT], 1, FHV);
	state = kt_reshape(f[F_STATE], FSLOTS, FF);
	w = kt_reshape(f[F_W], FC, FK);
	switch (p->fault) {
	case CONV_X_COLS: x = kt_reshape(x, FT, FC - 1); break;
	case CONV_W_ROWS: w = kt_reshape(w, FC - 1, FK); break;
	case CONV_OUT_ROWS: out = kt_reshape(out, FT - 1, FC); break;
	case CONV_STATE_COLS: state = kt_reshape(state, FSLOTS, (FK - 1) * FC - 1); break;
	case CONV_SLOT_ROWS: T = FT - 1; break;
	case CONV_N_TOKENS: break;
	case CONV_X_I32: x.dtype = KT_I32; break;
	case CONV_OUT_OVER_STATE: out = kt_reshape(state, FT, FC); break;
	case CONV_SLOT_RANGE: slot[0] = FSLOTS; break;
	case CONV_SLOT_NEGATIVE: slot[0] = -1; break;
	case CONV_POS_GAP: pos[2] = 2; break;
	case CONV_SLOT_TWICE: slot[2] = 1; pos[2] = 6; break;
	case CONV_POS_NEGATIVE: pos[0] = -1; break;
	case DELTA_HV_HK:
		Hk = 2;
		Hv = 3;
		x = kt_reshape(x, FT, 2 * 2 * FD + 3 * FD);
		out = kt_reshape(out, FT, 3 * FD);
		ba = kt_reshape(ba, FT, 6);
		al = kt_reshape(al, 1, 3);
		dt = kt_reshape(dt, 1, 3);
		state = kt_reshape(state, FSLOTS, FOFF + 3 * FD * FD);
		break;
	case DELTA_HK_ZERO: Hk = 0; x = kt_reshape(x, FT, FHV * FD); break;
	case DELTA_OFF_NEGATIVE: off = -1; break;
	case DELTA_OFF_PAST: off = FOFF + 1; break;
	case DELTA_QKV_COLS: x = kt_reshape(x, FT, 2 * FD + FHV * FD - 1); break;
	case DELTA_BA_COLS: ba = kt_reshape(ba, FT, FHV); break;
	case DELTA_OUT_COLS: out = kt_reshape(out, FT, FHV * FD - 1); break;
	case DELTA_A_LOG_COLS: al = kt_reshape(al, 1, FHV + 1); break;
	case DELTA_DK_LIMIT:
		dk = 258;
		x = kt_reshape(x, FT, 2 * 258 + FHV * FD);
		state = kt_reshape(state, FSLOTS, FOFF + FHV * 258 * FD);
		break;
	case DELTA_STATE_OVER_QKV: state = kt_reshape(f[F_X], FSLOTS, FF); break;
	case DELTA_SLOT_RANGE: slot[1] = FSLOTS; slot[2] = FSLOTS; break;
	case DELTA_SLOT_TWICE: slot[2] = 1; pos[2] = 6; break;
	}
	ts = op_tensor_raw(r, b, KT_I32, T, 1, slot);
	tp = op_tensor_raw(r, b, KT_I32, FT, 1, pos);
	struct kt_segment seg = { 1, 2, 0, 0 };
	struct kt_batch batch = {
		.n_tokens = p->fault == CONV_N_TOKENS ? FT + 1 : FT, .block_size = 16,
		.max_kv_len = 8, .pos = tp, .seq = tp,
		.block_tables = op_tensor_raw(r, b, KT_I32, FSLOTS, 1, op_ints(r, FSLOTS)),
		.n_single = 1, .n_segments = 1, .segments = &seg,
	};

	o->asked = !p->host_checked || strcmp(b->be->info.backend, "cpu") == 0;
	if (!o->asked)
		return o;
	if (p->fault < DELTA_HV_HK)
		o->rc_call = kt_conv1d(b->be, &out, &x, &w, &state, &ts, &batch);
	else
		o->rc_call = kt_delta_rule(b->be, &out, &x, &ba, &al, &dt, &state, off, &ts,
					   &batch, Hk, Hv, dk, FD);
	o->rc_sync = kt_synchronize(b->be);
	for (int i = 0; i < N_FLOATS; i++) {
		o->f[i] = op_get(r, b, &f[i]);
		o->nf[i] = (size_t)(f[i].rows * f[i].cols);
	}
	return o;
}

static void fault_check(struct op_run *r, const void *params, const void *input,
			const void *got, const void *cpu)
{
	static const char *const names[N_FLOATS] = { "x", "out", "ba", "a_log", "dt_bias",
						     "state", "w" };
	const struct fault_out *g = got;

	if (!g->asked) {
		op_check(r, true, "not asked of this backend: a cpu refusal (values it reads "
			 "on the host, its scratch)");
		return;
	}
	op_check_rc(r, g->rc_call, -EINVAL, "refused at the call");
	op_check_rc(r, g->rc_sync, 0, "nothing to report at the sync point");
	for (int i = 0; i < N_FLOATS; i++)
		op_check_poison(r, g->f[i], g->nf[i], "%s left alone", names[i]);
}

static const struct op_family fault = { NULL, fault_run, fault_check, true };

#define FAULT(name, op, f) { name, op, &fault, &(const struct fault_params){ .fault = f } }
#define HOST_FAULT(name, op, f) \
	{ name, op, &fault, &(const struct fault_params){ .fault = f, .host_checked = true } }

static const struct op_case cases[] = {
	FAULT("conv1d: x of other columns than out", "conv1d", CONV_X_COLS),
	FAULT("conv1d: w of other rows than channels", "conv1d", CONV_W_ROWS),
	FAULT("conv1d: out of other rows", "conv1d", CONV_OUT_ROWS),
	FAULT("conv1d: state a float short of K - 1 inputs", "conv1d", CONV_STATE_COLS),
	FAULT("conv1d: slot of other rows", "conv1d", CONV_SLOT_ROWS),
	FAULT("conv1d: n_tokens other than the rows", "conv1d", CONV_N_TOKENS),
	FAULT("conv1d: x of i32", "conv1d", CONV_X_I32),
	FAULT("conv1d: out over the state", "conv1d", CONV_OUT_OVER_STATE),
	HOST_FAULT("conv1d: a slot = state rows", "conv1d", CONV_SLOT_RANGE),
	HOST_FAULT("conv1d: a slot = -1", "conv1d", CONV_SLOT_NEGATIVE),
	HOST_FAULT("conv1d: a sequence at positions 0, 2", "conv1d", CONV_POS_GAP),
	HOST_FAULT("conv1d: one sequence's rows apart", "conv1d", CONV_SLOT_TWICE),
	HOST_FAULT("conv1d: a position -1", "conv1d", CONV_POS_NEGATIVE),
	FAULT("delta_rule: Hv = 3 not a multiple of Hk = 2", "delta_rule", DELTA_HV_HK),
	FAULT("delta_rule: Hk = 0", "delta_rule", DELTA_HK_ZERO),
	FAULT("delta_rule: off = -1", "delta_rule", DELTA_OFF_NEGATIVE),
	FAULT("delta_rule: off past the room of the matrices", "delta_rule", DELTA_OFF_PAST),
	FAULT("delta_rule: qkv of other columns", "delta_rule", DELTA_QKV_COLS),
	FAULT("delta_rule: ba of Hv columns", "delta_rule", DELTA_BA_COLS),
	FAULT("delta_rule: out of other columns", "delta_rule", DELTA_OUT_COLS),
	FAULT("delta_rule: a_log of other columns", "delta_rule", DELTA_A_LOG_COLS),
	HOST_FAULT("delta_rule: dk past max_head_dim", "delta_rule", DELTA_DK_LIMIT),
	FAULT("delta_rule: the state over qkv", "delta_rule", DELTA_STATE_OVER_QKV),
	HOST_FAULT("delta_rule: a slot = state rows", "delta_rule", DELTA_SLOT_RANGE),
	HOST_FAULT("delta_rule: one sequence's rows apart", "delta_rule", DELTA_SLOT_TWICE),
};

OP_LIST(ops_gdn_faults, cases);
