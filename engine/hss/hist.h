/* A latency histogram of fixed size for percentiles without allocation:
 * log-linear buckets, 2^HIST_SUB_BITS of them per power of two, so that a
 * percentile read from it is at most 1/8 above the true value (and never
 * above the largest value added). Values are nanoseconds here, but any
 * uint64_t works. Not thread-safe: its owner's lock covers it.
 */
#ifndef ATLAS_ENGINE_HSS_HIST_H
#define ATLAS_ENGINE_HSS_HIST_H

#include <stdint.h>

#define HIST_SUB_BITS 3
/* Values below 2^HIST_SUB_BITS have a bucket each; each power of two from
 * there to 2^63 has 2^HIST_SUB_BITS. */
#define HIST_BUCKETS ((64 - HIST_SUB_BITS + 1) << HIST_SUB_BITS)

struct lat_hist {
	uint64_t n;                      /* values added */
	uint64_t max;                    /* the largest of them */
	uint64_t counts[HIST_BUCKETS];   /* values per bucket */
};

void hist_add(struct lat_hist *h, uint64_t v);
/* The value at quantile q in [0, 1] (0.5: the median), rounded up to the top
 * of its bucket and capped at max; 0 when the histogram is empty. */
uint64_t hist_quantile(const struct lat_hist *h, double q);

#endif
