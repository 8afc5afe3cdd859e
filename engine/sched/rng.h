/* The random numbers that drive sampling (kt_sample_row.u).
 *
 * The number for a token is a pure function of the session's seed and the
 * token's position in the context. A sampled token therefore does not
 * depend on which other sequences share the step, on chunking, or on whether
 * the sequence was preempted and recomputed (DESIGN §4.1).
 */
#ifndef ATLAS_ENGINE_SCHED_RNG_H
#define ATLAS_ENGINE_SCHED_RNG_H

#include <stdint.h>

/* Uniform in [0, 1) with 24 random bits. */
float rng_uniform(uint64_t seed, uint64_t position);

#endif
