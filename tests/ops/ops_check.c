/* The checks of ops.h: each computes its error, and where a failing one
 * went wrong, and records them with op_record(). */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "tests/ops/ops.h"

void op_check_rel(struct op_run *r, const float *got, const double *ref, const double *scale,
		  size_t n, double tol, const char *what, ...)
{
	double max_rel = 0.0;
	size_t worst = 0, bad = 0;
	char detail[240] = "";
	va_list ap;

	for (size_t i = 0; i < n; i++) {
		double s = scale ? scale[i] : fabs(ref[i]);
		double e = fabs((double)got[i] - ref[i]) / (s > 1e-30 ? s : 1e-30);

		if (!isfinite(got[i]))
			e = INFINITY;
		if (!(e <= tol))
			bad++;
		if (e > max_rel || (bad == 1 && !(e <= tol))) {
			max_rel = e;
			worst = i;
		}
	}
	if (bad)
		snprintf(detail, sizeof detail,
			 "%zu of %zu elements off; worst [%zu]: got %.9g want %.9g", bad, n, worst,
			 (double)got[worst], ref[worst]);
	va_start(ap, what);
	op_record(r, max_rel, tol, !bad, detail, what, ap);
	va_end(ap);
}

/* op_record with the message's arguments given here. */
__attribute__((format(printf, 6, 7)))
static void recordf(struct op_run *r, double err, double tol, bool ok, const char *detail,
		    const char *what, ...)
{
	va_list ap;

	va_start(ap, what);
	op_record(r, err, tol, ok, detail, what, ap);
	va_end(ap);
}

void op_check_close(struct op_run *r, const float *got, const float *want, size_t n,
		    double max_abs_tol, double nmse_tol, const char *what, ...)
{
	double max_abs = 0.0, se = 0.0, ss = 0.0, nmse;
	size_t bad = 0, worst = 0;
	char name[128], detail[240];
	va_list ap;

	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)got[i] - (double)want[i]);

		if (isfinite(want[i]) && !isfinite(got[i])) {
			if (!bad++)
				worst = i;
			continue;
		}
		if (d > max_abs && !bad) {
			max_abs = d;
			worst = i;
		}
		se += d * d;
		ss += (double)want[i] * want[i];
	}
	nmse = ss > 0.0 ? se / ss : se;
	va_start(ap, what);
	vsnprintf(name, sizeof name, what, ap);
	va_end(ap);
	snprintf(detail, sizeof detail,
		 "%zu non-finite; largest difference at [%zu]: got %.9g want %.9g", bad, worst,
		 n ? (double)got[worst] : 0.0, n ? (double)want[worst] : 0.0);
	/* An infinite max_abs_tol bounds the NMSE alone (one line, not two). */
	if (isfinite(max_abs_tol))
		recordf(r, bad ? INFINITY : max_abs, max_abs_tol, !bad && max_abs <= max_abs_tol,
			detail, "%s: max abs", name);
	recordf(r, bad ? INFINITY : nmse, nmse_tol, !bad && nmse <= nmse_tol,
		isfinite(max_abs_tol) ? NULL : detail, "%s: nmse", name);
}

void op_check_bits(struct op_run *r, const float *got, const float *want, size_t n,
		   const char *what, ...)
{
	size_t bad = 0, first = 0;
	char detail[240] = "";
	va_list ap;

	for (size_t i = 0; i < n; i++)
		if (memcmp(&got[i], &want[i], sizeof(float)) && !bad++)
			first = i;
	if (bad)
		snprintf(detail, sizeof detail,
			 "%zu of %zu values differ in their bits; first [%zu]: got %.9g want %.9g",
			 bad, n, first, (double)got[first], (double)want[first]);
	va_start(ap, what);
	op_record(r, (double)bad, 0.0, !bad, detail, what, ap);
	va_end(ap);
}

void op_check_ints(struct op_run *r, const int32_t *got, const int32_t *want, size_t n,
		   const char *what, ...)
{
	size_t bad = 0, first = 0;
	char detail[240] = "";
	va_list ap;

	for (size_t i = 0; i < n; i++)
		if (got[i] != want[i] && !bad++)
			first = i;
	if (bad)
		snprintf(detail, sizeof detail, "%zu of %zu differ; first [%zu]: got %d want %d",
			 bad, n, first, got[first], want[first]);
	va_start(ap, what);
	op_record(r, (double)bad, 0.0, !bad, detail, what, ap);
	va_end(ap);
}

void op_check_poison(struct op_run *r, const float *got, size_t n, const char *what, ...)
{
	size_t bad = 0, first = 0;
	char detail[240] = "";
	va_list ap;

	for (size_t i = 0; i < n; i++)
		if (!isnan(got[i]) && !bad++)
			first = i;
	if (bad)
		snprintf(detail, sizeof detail,
			 "%zu of %zu poisoned values were written; first [%zu] = %.9g", bad, n,
			 first, (double)got[first]);
	va_start(ap, what);
	op_record(r, (double)bad, 0.0, !bad, detail, what, ap);
	va_end(ap);
}

void op_check_rc(struct op_run *r, int got, int want, const char *what, ...)
{
	char detail[64] = "";
	va_list ap;

	if (got != want)
		snprintf(detail, sizeof detail, "returned %d, want %d", got, want);
	va_start(ap, what);
	op_record(r, got == want ? 0.0 : 1.0, 0.0, got == want, detail, what, ap);
	va_end(ap);
}

void op_check(struct op_run *r, bool ok, const char *what, ...)
{
	va_list ap;

	va_start(ap, what);
	op_record(r, ok ? 0.0 : 1.0, 0.0, ok, NULL, what, ap);
	va_end(ap);
}

/* a and b hold the same bits, or are both NaN. */
static bool same_value(float a, float b)
{
	return (isnan(a) && isnan(b)) || !memcmp(&a, &b, sizeof a);
}

bool op_check_fault(struct op_run *r, int rc_call, int rc_sync, const float *got,
		    const float *before, const bool *bad, size_t rows, size_t cols,
		    enum op_fault_mark mark, const char *what)
{
	size_t changed = 0, unmarked = 0;

	if (rc_call) {
		op_check_rc(r, rc_call, -EINVAL, "%s: refused at the call", what);
		op_check_rc(r, rc_sync, 0, "%s: refused, so nothing to report at the sync point",
			    what);
		for (size_t i = 0; i < rows * cols; i++)
			changed += !same_value(got[i], before[i]);
		op_check(r, !changed, "%s: refused, so nothing written (%zu values were)", what,
			 changed);
		return false;
	}
	op_check_rc(r, rc_sync, -EINVAL, "%s: accepted at the call, reported at the sync point",
		    what);
	for (size_t i = 0; i < rows; i++)
		for (size_t j = 0; bad[i] && j < cols; j++)
			unmarked += mark == OP_FAULT_NAN ? !isnan(got[i * cols + j])
							 : !same_value(got[i * cols + j],
								       before[i * cols + j]);
	op_check(r, !unmarked, "%s: affected rows %s (%zu values not)", what,
		 mark == OP_FAULT_NAN ? "NaN" : "left alone", unmarked);
	return true;
}
