/* The auto gate of speculative decoding (DESIGN §9): whether drafts pay.
 *
 * A verify of k drafts costs the step k more rows and one more verify
 * segment; it pays when the tokens it is expected to give per second of
 * step beat plain decoding's. The cost side is measured on this device:
 * the seconds of every step of decode rows and verify segments, by its
 * rows and its segments (spec_cost; on a GPU a verify at a long context
 * runs as a segment of its own, its attention launched on its own and its
 * step not replayed from a graph, which costs far more than its rows). The
 * gain side is a session's acceptance rate
 * alpha, the chance that a draft is accepted given the one before it was
 * (spec_accept, a decaying count of verify outcomes): k drafts give
 * 1 + alpha + ... + alpha^k tokens on average.
 *
 * With `others` rows and `segs` verify segments of other sessions in the
 * step, k drafts are worth it when (others + E(k)) / t(others + 1 + k,
 * segs + 1) beats (others + 1) / t(others + 1, segs) by SPEC_GATE_MARGIN:
 * the step is the whole batch's, so a verify that slows everyone down must
 * earn it. Decode-only steps are measured by their rows, and a row count
 * never measured costs what the nearest measured ones around it do (the
 * nearest one below when there is none above: an optimistic guess, so that
 * a new shape is tried and measured). A step with verify segments costs
 * what it was measured to cost; one never measured costs its rows as
 * decode rows plus a + b per segment, fitted to what measured steps with
 * segments cost over their rows (a decaying least-squares fit: where a
 * step with any segment loses its CUDA graph, a, and each segment adds its
 * attention launches, b); before any was measured, nothing extra.
 *
 * A drafter that runs a model costs its own seconds per draft token too
 * (extra in spec_gate_k). Its drafts exist only once they are paid for, so
 * nothing shows whether acceptance would have changed while the gate holds
 * them back: every SPEC_GATE_PROBE plans held back, one verify goes ahead.
 */
#ifndef ATLAS_ENGINE_SPEC_GATE_H
#define ATLAS_ENGINE_SPEC_GATE_H

#include <stdbool.h>

/* Plans a model drafter's session sits out between probes. */
#define SPEC_GATE_PROBE 32

/* Decaying sums of measured steps with verify segments: weight, segments
 * x, x^2, the seconds y they cost over their rows, x y. */
struct spec_seg_fit {
	double w, x, xx, y, xy;
};

struct spec_cost {
	double *seconds;            /* [max_segs + 1][max_rows + 1] decaying mean of a step's
				     * seconds by its segments and rows, 0: never measured;
				     * owned */
	int max_rows, max_segs;
	struct spec_seg_fit fit;    /* what verify segments add to a step over its rows */
};

int spec_cost_init(struct spec_cost *c, int max_rows, int max_segs);
void spec_cost_free(struct spec_cost *c);
/* A step of rows rows, segs of them in verify segments, took seconds. */
void spec_cost_add(struct spec_cost *c, int rows, int segs, double seconds);
/* The expected seconds of such a step (see the top); 0 when no step was
 * measured yet. */
double spec_cost_at(const struct spec_cost *c, int rows, int segs);

struct spec_accept {
	double accepted, tried;     /* decaying sums of accepted drafts and of drafts whose
				     * outcome is known (accepted, or the first rejected) */
};

void spec_accept_init(struct spec_accept *a);
/* A verify (or a check of drafts the gate held back) accepted `accepted`
 * drafts and then rejected one, or ran out of drafts (!rejected). */
void spec_accept_add(struct spec_accept *a, int accepted, bool rejected);
double spec_accept_rate(const struct spec_accept *a);

/* The number of drafts in [0, kmax] that makes the most tokens per second
 * of the step, for acceptance rate alpha beside `others` rows and `segs`
 * verify segments, when making a draft costs `extra` seconds (0: free); 0
 * when none beats plain decoding by the margin. */
int spec_gate_k(const struct spec_cost *c, double alpha, int others, int segs, int kmax,
		double extra);

#endif
