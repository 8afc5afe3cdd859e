/* The one error convention of atlas.
 *
 * Functions return 0 (or a count) on success and a negative errno on failure.
 * Functions at an API edge also take a caller's buffer `err` of `errlen` bytes
 * and write a human message there; atlas_errf() does both in one statement:
 *
 *     return atlas_errf(err, errlen, -EINVAL, "%s: tensor %s: bad shape", file, name);
 *
 * `err` may be NULL (errlen 0): the code is still returned.
 */
#ifndef ATLAS_COMMON_ERR_H
#define ATLAS_COMMON_ERR_H

#include <stddef.h>

#define ATLAS_ERRLEN 512 /* a buffer size that fits every message atlas writes */

__attribute__((format(printf, 4, 5)))
int atlas_errf(char *err, size_t errlen, int code, const char *fmt, ...);

/* Prefix an existing message in place: "ctx: old message". */
__attribute__((format(printf, 3, 4)))
void atlas_errprefix(char *err, size_t errlen, const char *fmt, ...);

#define ATLAS_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define ATLAS_MIN(a, b) ((a) < (b) ? (a) : (b))
#define ATLAS_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif
