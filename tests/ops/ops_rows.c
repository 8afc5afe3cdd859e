/* Cases of the row copies: embed (rows of a table by token id) and
 * gather_rows (rows of an activation by index).
 *
 * Both are copies, so every comparison is bitwise: against the table's rows
 * (reference), and cuda against cpu. A bf16 table is a weight as kt_weight
 * stores it from bf16 values (the cpu widens it to f32 exactly, cuda keeps
 * bf16 and widens on the fly). Ids include the first and last row and
 * repeats. The refusals: bad shapes are refused before anything is written;
 * an out-of-range id is in backend memory, so a backend may refuse it or
 * fault at the next sync point (op_check_fault).
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "tests/ops/ops.h"

enum rows_op { ROWS_EMBED, ROWS_GATHER };

struct rows_params {
	enum rows_op op;
	int V, H, T;     /* table [V, H], T ids */
	bool bf16_table; /* a weight from bf16 values (embed only) */
};

struct rows_in {
	float *table;
	int32_t *ids;
};

struct rows_out {
	int rc;
	float *out;
};

static void *rows_build(struct op_run *r, const void *params, const struct op_backend *target)
{
	const struct rows_params *p = params;
	struct rows_in *in = op_alloc(r, sizeof(*in));

	in->table = op_floats(r, (size_t)p->V * p->H);
	op_fill(r, in->table, (size_t)p->V * p->H, 2.0f);
	if (p->bf16_table)
		op_round_bf16(in->table, (size_t)p->V * p->H);
	in->ids = op_ints(r, (size_t)p->T);
	for (int t = 0; t < p->T; t++)
		in->ids[t] = t == 0 ? 0 : t == 1 ? p->V - 1 : t % 3 == 2 ? in->ids[t - 1]
							: op_randint(r, p->V);
	return in;
}

static void *rows_run(struct op_run *r, const void *params, const void *input,
		      const struct op_backend *b)
{
	const struct rows_params *p = params;
	const struct rows_in *in = input;
	struct rows_out *o = op_alloc(r, sizeof(*o));
	struct kt_tensor table, ids, out;

	table = p->bf16_table ? op_weight_bf16(r, b, in->table, p->V, p->H)
			      : op_tensor(r, b, KT_F32, p->V, p->H, in->table);
	ids = op_tensor_raw(r, b, KT_I32, p->T, 1, in->ids);
	out = op_tensor(r, b, KT_F32, p->T, p->H, NULL);
	o->rc = p->op == ROWS_EMBED ? kt_embed(b->be, &out, &table, &ids)
				    : kt_gather_rows(b->be, &out, &table, &ids);
	o->out = op_get(r, b, &out);
	return o;
}

static void rows_check(struct op_run *r, const void *params, const void *input, const void *got,
		       const void *cpu)
{
	const struct rows_params *p = params;
	const struct rows_in *in = input;
	const struct rows_out *g = got, *c = cpu;
	float *want;

	op_check_rc(r, g->rc, 0, "the op runs");
	if (c) {
		op_check_bits(r, g->out, c->out, (size_t)p->T * p->H, "rows equal to the cpu's");
		return;
	}
	want = op_floats(r, (size_t)p->T * p->H);
	for (int t = 0; t < p->T; t++)
		memcpy(want + (size_t)t * p->H, in->table + (size_t)in->ids[t] * p->H,
		       (size_t)p->H * sizeof(float));
	op_check_bits(r, g->out, want, (size_t)p->T * p->H, "rows equal to the table's");
}

static const struct op_family rows = { rows_build, rows_run, rows_check, false };

#define EMBED(name, ...) \
	{ name, "embed", &rows, &(const struct rows_params){ .op = ROWS_EMBED, __VA_ARGS__ } }
#define GATHER(name, ...) { name, "gather_rows", &rows, \
	&(const struct rows_params){ .op = ROWS_GATHER, __VA_ARGS__ } }

/* What a refusal case breaks. */
enum rows_fault {
	FAULT_ID_PAST_TABLE, /* an id equal to V */
	FAULT_ID_NEGATIVE,   /* an id of -1 */
	FAULT_OUT_COLS,      /* out one column short */
	FAULT_OUT_ROWS,      /* out one row short of the ids */
	FAULT_OUT_OVERLAPS,  /* out is rows of x itself */
	FAULT_IDS_COLS,      /* ids [T, 2] */
};

struct rows_fault_params {
	enum rows_op op;
	enum rows_fault fault;
};

enum { FV = 50, FH = 24, FT = 7 };

struct rows_fault_out {
	int rc_call, rc_sync;
	int32_t ids[FT];
	float *table, *out; /* out as the op left it (table: the source) */
};

static void *fault_run(struct op_run *r, const void *params, const void *input,
		       const struct op_backend *b)
{
	const struct rows_fault_params *p = params;
	struct rows_fault_out *o = op_alloc(r, sizeof(*o));
	const int32_t ids[FT] = { 3, 49, 0, 3, 17, 17, 48 };
	struct kt_tensor table, idt, out;

	/* The table's values are a pure function of the index, so that
	 * run needs no generator. */
	o->table = op_floats(r, FV * FH);
	for (int i = 0; i < FV * FH; i++)
		o->table[i] = (float)(i % 97) * 0.25f - 7.0f;
	memcpy(o->ids, ids, sizeof ids);
	if (p->fault == FAULT_ID_PAST_TABLE)
		o->ids[1] = FV;
	if (p->fault == FAULT_ID_NEGATIVE)
		o->ids[4] = -1;
	table = op_tensor(r, b, KT_F32, FV, FH, o->table);
	idt = op_tensor_raw(r, b, KT_I32, FT, 1, o->ids);
	out = op_tensor(r, b, KT_F32, FT + 1, FH, NULL);
	if (p->fault == FAULT_IDS_COLS)
		idt = kt_reshape(idt, 3, 2);
	struct kt_tensor dst = kt_rows(out, 0, FT);
	if (p->fault == FAULT_OUT_COLS)
		dst = kt_reshape(dst, FT, FH - 1);
	if (p->fault == FAULT_OUT_ROWS)
		dst = kt_rows(out, 0, FT - 1);
	if (p->fault == FAULT_OUT_OVERLAPS)
		dst = kt_rows(table, 1, FT);
	o->rc_call = p->op == ROWS_EMBED ? kt_embed(b->be, &dst, &table, &idt)
					 : kt_gather_rows(b->be, &dst, &table, &idt);
	o->rc_sync = kt_synchronize(b->be);
	o->out = op_get(r, b, &out);
	if (p->fault == FAULT_OUT_OVERLAPS)
		o->out = op_get(r, b, &table);
	return o;
}

static void fault_check(struct op_run *r, const void *params, const void *input, const void *got,
			const void *cpu)
{
	const struct rows_fault_params *p = params;
	const struct rows_fault_out *g = got;
	float *before = op_floats(r, (FT + 1) * FH), *want = op_floats(r, FT * FH);
	bool bad[FT + 1] = { false };

	if (p->fault == FAULT_OUT_OVERLAPS) {
		op_check_rc(r, g->rc_call, -EINVAL, "an output over the table is refused");
		op_check_bits(r, g->out, g->table, FV * FH, "the table is left alone");
		return;
	}
	for (size_t i = 0; i < (FT + 1) * FH; i++)
		before[i] = NAN;
	if (p->fault != FAULT_ID_PAST_TABLE && p->fault != FAULT_ID_NEGATIVE) {
		op_check_rc(r, g->rc_call, -EINVAL, "a bad shape is refused at the call");
		op_check_rc(r, g->rc_sync, 0, "nothing to report at the sync point");
		op_check_poison(r, g->out, (FT + 1) * FH, "nothing written");
		return;
	}
	for (int t = 0; t < FT; t++) {
		bad[t] = g->ids[t] < 0 || g->ids[t] >= FV;
		if (!bad[t])
			memcpy(want + t * FH, g->table + g->ids[t] * FH, FH * sizeof(float));
	}
	if (!op_check_fault(r, g->rc_call, g->rc_sync, g->out, before, bad, FT + 1, FH,
			    OP_FAULT_NAN, "an out-of-range index"))
		return;
	for (int t = 0; t < FT; t++)
		if (!bad[t])
			op_check_bits(r, g->out + t * FH, want + t * FH, FH, "row %d copied", t);
	op_check_poison(r, g->out + FT * FH, FH, "the row past out left alone");
}

static const struct op_family rows_fault = { NULL, fault_run, fault_check, true };

#define FAULT(name, op, o, f) \
	{ name, op, &rows_fault, &(const struct rows_fault_params){ o, f } }

static const struct op_case cases[] = {
	EMBED("embed f32 V=50 H=24 T=7", .V = 50, .H = 24, .T = 7),
	EMBED("embed f32 V=513 H=96 T=7", .V = 513, .H = 96, .T = 7),
	EMBED("embed bf16 V=1000 H=257 T=1", .V = 1000, .H = 257, .T = 1, .bf16_table = true),
	EMBED("embed bf16 V=1000 H=257 T=64", .V = 1000, .H = 257, .T = 64, .bf16_table = true),
	EMBED("embed f32 V=1 H=3 T=5 (one row)", .V = 1, .H = 3, .T = 5),
	GATHER("gather_rows n=5 of 7 H=24", .V = 7, .H = 24, .T = 5),
	GATHER("gather_rows n=9 of 300 H=4096", .V = 300, .H = 4096, .T = 9),
	GATHER("gather_rows n=100 of 5 H=33", .V = 5, .H = 33, .T = 100),
	GATHER("gather_rows n=1 of 1 H=1", .V = 1, .H = 1, .T = 1),
	FAULT("embed: an id past the table", "embed", ROWS_EMBED, FAULT_ID_PAST_TABLE),
	FAULT("embed: a negative id", "embed", ROWS_EMBED, FAULT_ID_NEGATIVE),
	FAULT("embed: out one column short", "embed", ROWS_EMBED, FAULT_OUT_COLS),
	FAULT("embed: out one row short", "embed", ROWS_EMBED, FAULT_OUT_ROWS),
	FAULT("embed: ids of two columns", "embed", ROWS_EMBED, FAULT_IDS_COLS),
	FAULT("embed: out over the table", "embed", ROWS_EMBED, FAULT_OUT_OVERLAPS),
	FAULT("gather_rows: a negative index", "gather_rows", ROWS_GATHER, FAULT_ID_NEGATIVE),
	FAULT("gather_rows: an index past x", "gather_rows", ROWS_GATHER, FAULT_ID_PAST_TABLE),
	FAULT("gather_rows: out one row short", "gather_rows", ROWS_GATHER, FAULT_OUT_ROWS),
	FAULT("gather_rows: out over x", "gather_rows", ROWS_GATHER, FAULT_OUT_OVERLAPS),
};

OP_LIST(ops_rows, cases);
