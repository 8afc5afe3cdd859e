/* atlasd's mountpoint, checked before the model loads: missing, stale (an
 * atlasd that was killed left its mount behind: recovered by a lazy unmount)
 * or already served by another atlasd (refused). */
#ifndef ATLAS_APPLIANCE_MOUNTPOINT_H
#define ATLAS_APPLIANCE_MOUNTPOINT_H

#include <stddef.h>

/* Resolve path into out (absolute), unmount a stale atlas mount on it and
 * check that it is a directory no atlasd serves. 0 or a negative errno with
 * a message in err that says what to run where atlasd cannot fix it. */
int mountpoint_prepare(const char *path, char *out, size_t len, char *err, size_t errlen);

#endif
