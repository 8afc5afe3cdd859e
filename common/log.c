/* Log lines (log.h): one formatted line, written in one call. */
#include "common/log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <syslog.h>
#include <time.h>

#include "common/clock.h"

static _Atomic int log_level = ATLAS_LOG_INFO;
static _Atomic int log_sink = ATLAS_LOG_STDERR;
static const char *const level_names[] = { "error", "warn", "info", "debug" };
static const int syslog_priority[] = { LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG };

void atlas_log_set_sink(enum atlas_log_sink sink, const char *ident)
{
	if (sink == ATLAS_LOG_SYSLOG)
		openlog(ident, LOG_PID, LOG_DAEMON);
	log_sink = sink;
}

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
	base = base ? base + 1 : file;
	/* One call per line so that lines from several threads do not interleave. */
	if (log_sink == ATLAS_LOG_SYSLOG) {
		syslog(syslog_priority[level], "%s %s:%d: %s", level_names[level], base, line, msg);
	} else if (log_sink == ATLAS_LOG_STDERR_WALL) {
		struct timespec ts;
		struct tm tm;
		char when[32];
		clock_gettime(CLOCK_REALTIME, &ts);
		strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", gmtime_r(&ts.tv_sec, &tm));
		fprintf(stderr, "[%s.%03ldZ] %-5s %s:%d: %s\n", when, ts.tv_nsec / 1000000,
			level_names[level], base, line, msg);
	} else {
		fprintf(stderr, "[%10.3f] %-5s %s:%d: %s\n", atlas_now_s(), level_names[level], base,
			line, msg);
	}
}
