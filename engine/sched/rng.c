/* Position-keyed random numbers (rng.h). */
#include "engine/sched/rng.h"

/* splitmix64's finalizer: a bijective mix with full avalanche. */
static uint64_t mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

float rng_uniform(uint64_t seed, uint64_t position)
{
	uint64_t r = mix64(mix64(seed) ^ position);
	return (float)(r >> 40) * (1.0f / 16777216.0f);
}
