/* Clocks. Monotonic time for durations and rates, wall time for uptime. */
#ifndef ATLAS_COMMON_CLOCK_H
#define ATLAS_COMMON_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t atlas_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline double atlas_now_s(void)
{
	return (double)atlas_now_ns() * 1e-9;
}

#endif
