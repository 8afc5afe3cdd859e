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

int spec_cost_init(struct spec_cost *c, int max_rows)
{
	c->max_rows = max_rows;
	c->seconds = calloc((size_t)max_rows + 1, sizeof *c->seconds);
	return c->seconds ? 0 : -ENOMEM;
}

void spec_cost_free(struct spec_cost *c)
{
	free(c->seconds);
	c->seconds = NULL;
}

void spec_cost_add(struct spec_cost *c, int rows, double seconds)
{
	if (rows < 1 || rows > c->max_rows || !(seconds > 0))
		return;
	double *t = &c->seconds[rows];
	*t = *t > 0 ? *t + SPEC_COST_WEIGHT * (seconds - *t) : seconds;
}

double spec_cost_at(const struct spec_cost *c, int rows)
{
	int lo = rows < c->max_rows ? rows : c->max_rows, hi = rows;
	while (lo > 0 && !(c->seconds[lo] > 0))
		lo--;
	while (hi <= c->max_rows && !(c->seconds[hi] > 0))
		hi++;
	if (lo > 0 && lo == rows)
		return c->seconds[lo];
	if (lo > 0 && hi <= c->max_rows)
		return c->seconds[lo] +
		       (c->seconds[hi] - c->seconds[lo]) * (double)(rows - lo) / (double)(hi - lo);
	if (lo > 0)
		return c->seconds[lo];
	return hi <= c->max_rows ? c->seconds[hi] : 0;
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

int spec_gate_k(const struct spec_cost *c, double alpha, int others, int kmax, double extra)
{
	const double t0 = spec_cost_at(c, others + 1);
	if (!(t0 > 0))
		return kmax;
	const double plain = (others + 1) / t0;
	double best = plain * (1 + SPEC_GATE_MARGIN), tokens = 1, a = 1;
	int best_k = 0;
	for (int k = 1; k <= kmax; k++) {
		a *= alpha;
		tokens += a;
		const double rate = (others + tokens) / (spec_cost_at(c, others + 1 + k) + k * extra);
		if (rate > best) {
			best = rate;
			best_k = k;
		}
	}
	return best_k;
}
