/* The turns' latency histograms and finish counts of ctl/metrics
 * (engine.h: struct atlas_turn_stats), recorded by the engine thread under
 * the engine's lock: no allocation, a scan of a few bounds per token. */
#include <string.h>

#include "engine/internal.h"

/* vLLM's spread, from a millisecond (a decode step of a small model) to
 * half a minute (a long prompt in a full queue). */
const double atlas_lat_bounds[ATLAS_LAT_BUCKETS - 1] = {
	0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
};

const char *const atlas_finish_names[ATLAS_FINISH_N] = {
	[ATLAS_FINISH_STOP] = "stop", [ATLAS_FINISH_LENGTH] = "length",
	[ATLAS_FINISH_EOS] = "eos", [ATLAS_FINISH_ERROR] = "error",
	[ATLAS_FINISH_CANCELLED] = "cancelled",
};

void latency_observe(struct atlas_lat_hist *h, uint64_t ns)
{
	const double s = (double)ns * 1e-9;
	int i = 0;
	while (i < ATLAS_LAT_BUCKETS - 1 && s > atlas_lat_bounds[i])
		i++;
	h->bucket[i]++;
	h->count++;
	h->sum_s += s;
}

void latency_finished(struct atlas_turn_stats *st, const char *finish)
{
	for (int i = 0; i < ATLAS_FINISH_N; i++)
		if (!strcmp(finish, atlas_finish_names[i])) {
			st->finished[i]++;
			return;
		}
}
