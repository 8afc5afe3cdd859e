/* The latency histogram (hist.h). */
#include "engine/hss/hist.h"

#define SUB (1u << HIST_SUB_BITS)

static unsigned bucket_of(uint64_t v)
{
	if (v < SUB)
		return (unsigned)v;
	/* v in [2^e, 2^(e+1)), e >= HIST_SUB_BITS */
	unsigned e = 63u - (unsigned)__builtin_clzll(v);
	unsigned sub = (unsigned)(v >> (e - HIST_SUB_BITS)) & (SUB - 1);
	return ((e - HIST_SUB_BITS + 1) << HIST_SUB_BITS) + sub;
}

/* The largest value that falls in bucket b. */
static uint64_t bucket_top(unsigned b)
{
	if (b < SUB)
		return b;
	unsigned e = (b >> HIST_SUB_BITS) + HIST_SUB_BITS - 1;
	uint64_t width = 1ull << (e - HIST_SUB_BITS);
	uint64_t low = (uint64_t)(SUB + (b & (SUB - 1))) << (e - HIST_SUB_BITS);
	return low + (width - 1);
}

void hist_add(struct lat_hist *h, uint64_t v)
{
	h->counts[bucket_of(v)]++;
	h->n++;
	if (v > h->max)
		h->max = v;
}

uint64_t hist_quantile(const struct lat_hist *h, double q)
{
	if (!h->n)
		return 0;
	/* The rank of the value: ceil(q * n), within [1, n]. */
	double x = q * (double)h->n;
	uint64_t rank = x <= 1 ? 1 : x >= (double)h->n ? h->n : (uint64_t)x;
	if ((double)rank < x)
		rank++;
	uint64_t seen = 0;
	for (unsigned b = 0; b < HIST_BUCKETS; b++) {
		seen += h->counts[b];
		if (seen >= rank) {
			uint64_t top = bucket_top(b);
			return top < h->max ? top : h->max;
		}
	}
	return h->max;
}
