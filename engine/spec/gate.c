/* The auto gate (gate.h): step costs by rows, acceptance, the choice of k. */
#include "engine/spec/gate.h"

#include <errno.h>
#include <stdlib.h>

/* Weight of a new step time in the decaying mean. */
#define SPEC_COST_WEIGHT 0.125
/* What an older verify outcome still counts for, per newer one: about the
 * last ten outcomes decide, so a session that starts or stops copying
 * turns around within a few steps. */
#define SPEC_ACCEPT_DECAY 0.85
/* A session's first guess of alpha: one accepted of two tried. */
#define SPEC_ACCEPT_PRIOR_ACCEPTED 1.0
#define SPEC_ACCEPT_PRIOR_TRIED 2.0
/* Drafts must promise this much more throughput than plain decoding: less
 * is within the noise of the measured costs. */
#define SPEC_GATE_MARGIN 0.02

int spec_cost_init(struct spec_cost *c, int max_rows, int max_segs)
{
	c->max_rows = max_rows;
	c->max_segs = max_segs;
	c->fit = (struct spec_seg_fit){ 0 };
	c->seconds = calloc(((size_t)max_segs + 1) * ((size_t)max_rows + 1), sizeof *c->seconds);
	return c->seconds ? 0 : -ENOMEM;
}

void spec_cost_free(struct spec_cost *c)
{
	free(c->seconds);
	c->seconds = NULL;
}

/* Steps of `rows` rows with exactly the segments of row t: the measured
 * value, else interpolated between the nearest measured row counts, else
 * the nearest one; 0 when none is measured. */
static double at_rows(const double *t, int max_rows, int rows)
{
	int lo = rows < max_rows ? rows : max_rows, hi = rows;
	while (lo > 0 && !(t[lo] > 0))
		lo--;
	while (hi <= max_rows && !(t[hi] > 0))
		hi++;
	if (lo > 0 && lo == rows)
		return t[lo];
	if (lo > 0 && hi <= max_rows)
		return t[lo] + (t[hi] - t[lo]) * (double)(rows - lo) / (double)(hi - lo);
	if (lo > 0)
		return t[lo];
	return hi <= max_rows ? t[hi] : 0;
}

static double *cell(const struct spec_cost *c, int rows, int segs)
{
	return &c->seconds[(size_t)segs * ((size_t)c->max_rows + 1) + (size_t)rows];
}

/* What a step of segs verify segments costs over its rows, a + b segs,
 * from the decaying fit of the measured steps: by least squares once the
 * steps measured had different segment counts, before that all of it per
 * segment (the optimistic reading for fewer segments: they are tried, and
 * their cost separates the two). */
static double seg_extra(const struct spec_cost *c, int segs)
{
	const struct spec_seg_fit *f = &c->fit;
	if (!(f->w > 0) || !(f->x > 0))
		return 0;
	const double det = f->w * f->xx - f->x * f->x;
	double a = 0, b = f->y / f->x;
	if (det > 1e-9 * f->w * f->xx) {
		b = (f->w * f->xy - f->x * f->y) / det;
		a = (f->y - b * f->x) / f->w;
		if (b < 0) {
			b = 0;
			a = f->y / f->w;
		} else if (a < 0) {
			a = 0;
			b = f->xy / f->xx;
		}
	}
	return a + b * segs;
}

void spec_cost_add(struct spec_cost *c, int rows, int segs, double seconds)
{
	if (rows < 1 || rows > c->max_rows || segs < 0 || segs > c->max_segs || !(seconds > 0))
		return;
	double *t = cell(c, rows, segs);
	*t = *t > 0 ? *t + SPEC_COST_WEIGHT * (seconds - *t) : seconds;
	const double base = segs ? at_rows(c->seconds, c->max_rows, rows) : 0;
	if (base > 0) {
		struct spec_seg_fit *f = &c->fit;
		const double keep = 1 - SPEC_COST_WEIGHT, x = segs;
		const double y = seconds > base ? seconds - base : 0;
		f->w = keep * f->w + 1;
		f->x = keep * f->x + x;
		f->xx = keep * f->xx + x * x;
		f->y = keep * f->y + y;
		f->xy = keep * f->xy + x * y;
	}
}

double spec_cost_at(const struct spec_cost *c, int rows, int segs)
{
	const double base = at_rows(c->seconds, c->max_rows, rows);
	if (segs <= 0)
		return base;
	if (rows <= c->max_rows && segs <= c->max_segs && *cell(c, rows, segs) > 0)
		return *cell(c, rows, segs);
	return base + seg_extra(c, segs);
}

void spec_accept_init(struct spec_accept *a)
{
	a->accepted = SPEC_ACCEPT_PRIOR_ACCEPTED;
	a->tried = SPEC_ACCEPT_PRIOR_TRIED;
}

void spec_accept_add(struct spec_accept *a, int accepted, bool rejected)
{
	a->accepted = SPEC_ACCEPT_DECAY * a->accepted + accepted;
	a->tried = SPEC_ACCEPT_DECAY * a->tried + accepted + (rejected ? 1 : 0);
}

double spec_accept_rate(const struct spec_accept *a)
{
	return a->tried > 0 ? a->accepted / a->tried : 0;
}

int spec_gate_k(const struct spec_cost *c, double alpha, int others, int segs, int kmax,
		double extra)
{
	const double t0 = spec_cost_at(c, others + 1, segs);
	if (!(t0 > 0))
		return kmax;
	const double plain = (others + 1) / t0;
	double best = plain * (1 + SPEC_GATE_MARGIN), tokens = 1, a = 1;
	int best_k = 0;
	for (int k = 1; k <= kmax; k++) {
		a *= alpha;
		tokens += a;
		const double rate =
			(others + tokens) / (spec_cost_at(c, others + 1 + k, segs + 1) + k * extra);
		if (rate > best) {
			best = rate;
			best_k = k;
		}
	}
	return best_k;
}
