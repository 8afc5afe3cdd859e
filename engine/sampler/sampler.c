/* Position-keyed random numbers and the stop-string scan. */
#include "engine/sampler/sampler.h"

#include <string.h>

/* splitmix64's finalizer: a bijective mix with full avalanche. */
static uint64_t mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

float sampler_uniform(uint64_t seed, uint64_t position)
{
	uint64_t r = mix64(mix64(seed) ^ position);
	return (float)(r >> 40) * (1.0f / 16777216.0f);
}

long stop_scan(const char *buf, size_t len, const char stops[][ATLAS_STOP_LEN], int n_stop,
	       size_t *releasable)
{
	size_t hold = len;
	for (size_t i = 0; i < len; i++) {
		for (int s = 0; s < n_stop; s++) {
			size_t sl = strlen(stops[s]);
			if (sl == 0)
				continue;
			size_t avail = len - i;
			if (avail >= sl) {
				if (memcmp(buf + i, stops[s], sl) == 0) {
					*releasable = i;
					return (long)i;
				}
			} else if (hold == len && memcmp(buf + i, stops[s], avail) == 0) {
				hold = i;
			}
		}
	}
	*releasable = hold;
	return -1;
}
