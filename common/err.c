#include "common/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int atlas_errf(char *err, size_t errlen, int code, const char *fmt, ...)
{
	if (err && errlen) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return code;
}

void atlas_errprefix(char *err, size_t errlen, const char *fmt, ...)
{
	if (!err || !errlen)
		return;
	char prefix[ATLAS_ERRLEN], old[ATLAS_ERRLEN];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(prefix, sizeof prefix, fmt, ap);
	va_end(ap);
	snprintf(old, sizeof old, "%s", err);
	snprintf(err, errlen, "%s: %s", prefix, old);
}
