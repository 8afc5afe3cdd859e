/* Refusal and fault cases of sample and of the draw (kt_draw_rows,
 * kt_draw, kt_drawn): bad requests refused at the call with the ids left
 * alone; a device fault left by an op before a sampling launch or a draw
 * (an embedding's id past its table), reported there and only there,
 * whichever kernel samples; the draw's refusals of shapes other than
 * staged. ops_sample.c has the sampling itself.
 */
#include <errno.h>
#include <math.h>

#include "tests/ops/ops.h"

/* Refusals: a bad row beside a good one, rows other than n, no columns. */
enum sample_fault {
	NEGATIVE_TEMPERATURE, NAN_TEMPERATURE, INFINITE_TEMPERATURE, TOP_P_ABOVE_1,
	TOP_P_NEGATIVE, NEGATIVE_TOP_K, U_1, U_NEGATIVE, U_NAN, ROWS_NOT_N, NO_COLUMNS,
};

struct sample_fault_params {
	enum sample_fault fault;
};

struct sample_fault_out {
	int rc_call, rc_sync;
	int32_t ids[2];
};

static void *sample_fault_run(struct op_run *r, const void *params, const void *input,
			      const struct op_backend *b)
{
	const struct sample_fault_params *p = params;
	struct sample_fault_out *o = op_alloc(r, sizeof(*o));
	const float l[16] = { 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8 };
	struct kt_sample_row rows[2] = { { .temperature = 1.0f, .top_p = 1.0f, .u = 0.5f } };
	struct kt_tensor t = op_tensor(r, b, KT_F32, 2, 8, l);
	int n = 2;

	rows[1] = rows[0];
	switch (p->fault) {
	case NEGATIVE_TEMPERATURE: rows[1].temperature = -1.0f; break;
	case NAN_TEMPERATURE: rows[1].temperature = NAN; break;
	case INFINITE_TEMPERATURE: rows[1].temperature = INFINITY; break;
	case TOP_P_ABOVE_1: rows[1].top_p = 1.5f; break;
	case TOP_P_NEGATIVE: rows[1].top_p = -0.1f; break;
	case NEGATIVE_TOP_K: rows[1].top_k = -1; break;
	case U_1: rows[1].u = 1.0f; break;
	case U_NEGATIVE: rows[1].u = -0.1f; break;
	case U_NAN: rows[1].u = NAN; break;
	case ROWS_NOT_N: n = 1; break;
	case NO_COLUMNS: t = kt_reshape(t, 2, 0); break;
	}
	o->ids[0] = o->ids[1] = -7;
	o->rc_call = kt_sample(b->be, &t, rows, n, o->ids);
	o->rc_sync = kt_synchronize(b->be);
	return o;
}

static void sample_fault_check(struct op_run *r, const void *params, const void *input,
			       const void *got, const void *cpu)
{
	const struct sample_fault_out *g = got;
	const int32_t untouched[2] = { -7, -7 };

	op_check_rc(r, g->rc_call, -EINVAL, "refused at the call");
	op_check_rc(r, g->rc_sync, 0, "nothing to report at the sync point");
	op_check_ints(r, g->ids, untouched, 2, "ids left alone");
}

static const struct op_family sample_fault = { NULL, sample_fault_run, sample_fault_check, true };

/* A fault that an op before the sampling left on the device (an
 * embedding's id past its table: cuda accepts it at the call and reports it
 * at the next sync point) is reported by the sampling launch after it,
 * whichever kernel samples (cuda's sampling kernels copy the fault word to
 * the host themselves), and only there: the sync point after it and a
 * second sampling have nothing to report. A backend that refuses the id at
 * the call samples as usual. */
enum sample_after { AFTER_GREEDY, AFTER_TOP_K, AFTER_FULL, AFTER_DRAW, AFTER_DRAW_TOP_K };

struct sample_after_params {
	enum sample_after kind;
};

struct sample_after_out {
	int rc_embed, rc_sample, rc_sync, rc_again;
	int32_t ids[2], again[2];
};

static void *sample_after_run(struct op_run *r, const void *params, const void *input,
			      const struct op_backend *b)
{
	const struct sample_after_params *p = params;
	struct sample_after_out *o = op_alloc(r, sizeof(*o));
	const float l[16] = { 1, 2, 3, 4, 5, 6, 7, 8, 8, 7, 6, 5, 4, 3, 2, 1 };
	const float table[8 * 4] = { 0 };
	const int32_t ids[2] = { 1, 8 }; /* 8: past the table's 8 rows */
	struct kt_sample_row rows[2] = { { .temperature = 0.0f, .top_p = 1.0f, .u = 0.5f } };
	struct kt_tensor t = op_tensor(r, b, KT_F32, 2, 8, l);
	struct kt_tensor tab = op_tensor(r, b, KT_F32, 8, 4, table);
	struct kt_tensor idt = op_tensor_raw(r, b, KT_I32, 2, 1, ids);
	struct kt_tensor out = op_tensor(r, b, KT_F32, 2, 4, NULL);

	if (p->kind != AFTER_GREEDY && p->kind != AFTER_DRAW)
		rows[0].temperature = 0.7f;
	if (p->kind == AFTER_TOP_K || p->kind == AFTER_DRAW_TOP_K)
		rows[0].top_k = 4;
	rows[1] = rows[0];
	o->ids[0] = o->ids[1] = o->again[0] = o->again[1] = -7;
	o->rc_embed = kt_embed(b->be, &out, &tab, &idt);
	if (p->kind == AFTER_DRAW || p->kind == AFTER_DRAW_TOP_K) {
		/* staged, then the fault is reported where the draw is read */
		int kind = kt_draw_rows(b->be, rows, 2, 8);

		o->rc_sample = kind < 0 ? kind : kt_draw(b->be, &t);
		o->rc_sample = o->rc_sample ? o->rc_sample : kt_drawn(b->be, o->ids, 2);
		o->rc_sync = kt_synchronize(b->be);
		o->rc_again = kt_draw(b->be, &t);
		o->rc_again = o->rc_again ? o->rc_again : kt_drawn(b->be, o->again, 2);
		return o;
	}
	o->rc_sample = kt_sample(b->be, &t, rows, 2, o->ids);
	o->rc_sync = kt_synchronize(b->be);
	o->rc_again = kt_sample(b->be, &t, rows, 2, o->again);
	return o;
}

static void sample_after_check(struct op_run *r, const void *params, const void *input,
			       const void *got, const void *cpu)
{
	const struct sample_after_params *p = params;
	const struct sample_after_out *g = got;
	const int32_t argmax[2] = { 7, 0 };

	if (g->rc_embed) {
		op_check_rc(r, g->rc_embed, -EINVAL, "the id refused at the call");
		op_check_rc(r, g->rc_sample, 0, "nothing pending: the sampling runs");
	} else {
		op_check_rc(r, g->rc_sample, -EINVAL,
			    "the embedding's fault reported by the sampling after it");
	}
	op_check_rc(r, g->rc_sync, 0, "reported once: nothing at the next sync point");
	op_check_rc(r, g->rc_again, 0, "a second sampling has nothing to report");
	if (p->kind == AFTER_GREEDY || p->kind == AFTER_DRAW)
		op_check_ints(r, g->again, argmax, 2, "the second sampling's greedy ids");
	else
		op_check(r, g->again[0] >= 0 && g->again[0] < 8 && g->again[1] >= 0 &&
				    g->again[1] < 8,
			 "the second sampling's ids in range (%d, %d)", g->again[0], g->again[1]);
}

static const struct op_family sample_after = { NULL, sample_after_run, sample_after_check, true };

/* draw_rows refuses no rows, more rows than max_tokens (and max_seqs), no
 * rows given, no columns and a bad request; draw refuses logits of other
 * rows or columns than staged; drawn refuses more ids than the draw has
 * and a negative count; nothing is left pending by a refusal, and a
 * refused staging keeps the rows staged before. */
struct draw_fault_out {
	int rc_none, rc_many, rc_null, rc_cols, rc_bad, kind;
	int rc_rows, rc_width, rc_draw, rc_more, rc_negative, rc_drawn, rc_sync;
	int32_t ids[2];
};

static void *draw_fault_run(struct op_run *r, const void *params, const void *input,
			    const struct op_backend *b)
{
	struct draw_fault_out *o = op_alloc(r, sizeof(*o));
	const int n = OP_MAX_TOKENS + 44;
	const float l[16] = { 1, 2, 3, 4, 5, 6, 7, 8, 8, 7, 6, 5, 4, 3, 2, 1 };
	struct kt_sample_row *rows = op_alloc(r, (size_t)n * sizeof(*rows));
	struct kt_tensor t = op_tensor(r, b, KT_F32, 2, 8, l);
	struct kt_tensor wide = op_tensor(r, b, KT_F32, 3, 8, NULL);

	for (int i = 0; i < n; i++)
		rows[i] = (struct kt_sample_row){ .top_p = 1.0f };
	o->rc_none = kt_draw_rows(b->be, rows, 0, 8);
	o->rc_many = kt_draw_rows(b->be, rows, n, 8);
	o->rc_null = kt_draw_rows(b->be, NULL, 2, 8);
	o->rc_cols = kt_draw_rows(b->be, rows, 2, 0);
	o->kind = kt_draw_rows(b->be, rows, 2, 8); /* greedy: the rows staged */
	rows[1].temperature = -1.0f;
	o->rc_bad = kt_draw_rows(b->be, rows, 2, 8);
	o->rc_rows = kt_draw(b->be, &wide);
	const struct kt_tensor narrow = kt_reshape(kt_rows(wide, 0, 1), 2, 4);

	o->rc_width = kt_draw(b->be, &narrow);
	o->rc_draw = kt_draw(b->be, &t);
	o->rc_more = kt_drawn(b->be, o->ids, 3);
	o->rc_negative = kt_drawn(b->be, o->ids, -1);
	o->rc_drawn = kt_drawn(b->be, o->ids, 2);
	o->rc_sync = kt_synchronize(b->be);
	return o;
}

static void draw_fault_check(struct op_run *r, const void *params, const void *input,
			     const void *got, const void *cpu)
{
	const struct draw_fault_out *g = got;
	const int32_t argmax[2] = { 7, 0 };

	op_check_rc(r, g->rc_none, -EINVAL, "draw_rows refuses no rows");
	op_check_rc(r, g->rc_many, -EINVAL, "draw_rows refuses more rows than a step has");
	op_check_rc(r, g->rc_null, -EINVAL, "draw_rows refuses rows not given");
	op_check_rc(r, g->rc_cols, -EINVAL, "draw_rows refuses logits of no columns");
	op_check_rc(r, g->kind, 0, "greedy rows staged: kind 0");
	op_check_rc(r, g->rc_bad, -EINVAL, "draw_rows refuses a negative temperature");
	op_check_rc(r, g->rc_rows, -EINVAL, "draw refuses logits of more rows than staged");
	op_check_rc(r, g->rc_width, -EINVAL, "draw refuses logits of other columns");
	op_check_rc(r, g->rc_draw, 0, "draw runs the rows staged before the refusals");
	op_check_rc(r, g->rc_more, -EINVAL, "drawn refuses more ids than the draw has");
	op_check_rc(r, g->rc_negative, -EINVAL, "drawn refuses a negative count");
	op_check_rc(r, g->rc_drawn, 0, "drawn reads the draw");
	op_check_ints(r, g->ids, argmax, 2, "the greedy ids");
	op_check_rc(r, g->rc_sync, 0, "nothing to report at the sync point");
}

static const struct op_family draw_fault = { NULL, draw_fault_run, draw_fault_check, true };

#define FAULT(name, f) \
	{ name, "sample", &sample_fault, &(const struct sample_fault_params){ f } }
#define AFTER(name, k) \
	{ name, "sample", &sample_after, &(const struct sample_after_params){ k } }

static const struct op_case cases[] = {
	FAULT("sample: a negative temperature", NEGATIVE_TEMPERATURE),
	FAULT("sample: temperature NaN", NAN_TEMPERATURE),
	FAULT("sample: temperature infinite", INFINITE_TEMPERATURE),
	FAULT("sample: top_p above 1", TOP_P_ABOVE_1),
	FAULT("sample: a negative top_p", TOP_P_NEGATIVE),
	FAULT("sample: a negative top_k", NEGATIVE_TOP_K),
	FAULT("sample: u of 1", U_1),
	FAULT("sample: a negative u", U_NEGATIVE),
	FAULT("sample: u NaN", U_NAN),
	FAULT("sample: rows other than n", ROWS_NOT_N),
	FAULT("sample: logits of no columns", NO_COLUMNS),
	AFTER("sample: a device fault before a greedy launch", AFTER_GREEDY),
	AFTER("sample: a device fault before a top_k launch", AFTER_TOP_K),
	AFTER("sample: a device fault before a full sampling launch", AFTER_FULL),
	AFTER("sample: a device fault before a greedy draw", AFTER_DRAW),
	AFTER("sample: a device fault before a top_k draw", AFTER_DRAW_TOP_K),
	{ "sample: draw refusals", "sample", &draw_fault, NULL },
};

OP_LIST(ops_sample_faults, cases);
