#include "common/log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "common/clock.h"

static _Atomic int log_level = ATLAS_LOG_INFO;
static const char *const level_names[] = { "error", "warn", "info", "debug" };

void atlas_log_set_level(enum atlas_log_level level)
{
	log_level = level;
}

int atlas_log_parse_level(const char *name, enum atlas_log_level *out)
{
	for (int i = 0; i <= ATLAS_LOG_DEBUG; i++)
		if (strcmp(name, level_names[i]) == 0) {
			*out = (enum atlas_log_level)i;
			return 0;
		}
	return -EINVAL;
}

void atlas_log_at(enum atlas_log_level level, const char *file, int line, const char *fmt, ...)
{
	if ((int)level > log_level)
		return;
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	const char *base = strrchr(file, '/');
	/* One fprintf per line so that lines from several threads do not interleave. */
	fprintf(stderr, "[%10.3f] %-5s %s:%d: %s\n", atlas_now_s(), level_names[level],
		base ? base + 1 : file, line, msg);
}
