/* Stop strings: text of a turn that could still become a stop string is
 * held back until more text decides it (engine/session.c releases the rest).
 */
#ifndef ATLAS_ENGINE_TEXT_STOP_H
#define ATLAS_ENGINE_TEXT_STOP_H

#include <stddef.h>

#include "config/config.h"

/* Scan text not yet released for stop strings.
 * Returns the offset of the earliest complete match, or -1 if none; then
 * *releasable is the length of the prefix of buf that cannot be the start of
 * a stop string (the rest must be held back until more text decides it).
 * With a match, *releasable is the match offset. */
long stop_scan(const char *buf, size_t len, const char stops[][ATLAS_STOP_LEN], int n_stop,
	       size_t *releasable);

#endif
