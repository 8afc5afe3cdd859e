/* A strict checker of the Prometheus text exposition format 0.0.4 plus the
 * naming rules of atlas (atlas_ prefix; counters, and only they, end in
 * _total). */
#ifndef ATLAS_TESTS_FS_METRICS_CHECK_H
#define ATLAS_TESTS_FS_METRICS_CHECK_H

#include <stddef.h>

/* 0, or -1 with the first problem (and its line) in err. */
int check_prometheus(const char *text, char *err, size_t errlen);

#endif
