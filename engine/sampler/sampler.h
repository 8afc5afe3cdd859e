/* Sampling decisions that live above the backend: the random numbers that
 * drive kt_sample(), and stop strings.
 *
 * The random number for a token is a pure function of the session's seed and
 * the token's position in the context. A sampled token therefore does not
 * depend on which other sequences share the step, on chunking, or on whether
 * the sequence was preempted and recomputed (DESIGN §4.1).
 */
#ifndef ATLAS_ENGINE_SAMPLER_H
#define ATLAS_ENGINE_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "config/config.h"

/* Uniform in [0, 1) with 24 random bits. */
float sampler_uniform(uint64_t seed, uint64_t position);

/* Scan text not yet released for stop strings.
 * Returns the offset of the earliest complete match, or -1 if none; then
 * *releasable is the length of the prefix of buf that cannot be the start of
 * a stop string (the rest must be held back until more text decides it).
 * With a match, *releasable is the match offset. */
long stop_scan(const char *buf, size_t len, const char stops[][ATLAS_STOP_LEN], int n_stop,
	       size_t *releasable);

#endif
