/* Logging with a level and the source: to stderr with a monotonic timestamp
 * (the default), to stderr with the wall-clock time (a log file that stderr
 * was pointed at), or to syslog (a daemon). Never on the decode hot path. */
#ifndef ATLAS_COMMON_LOG_H
#define ATLAS_COMMON_LOG_H

enum atlas_log_level { ATLAS_LOG_ERROR, ATLAS_LOG_WARN, ATLAS_LOG_INFO, ATLAS_LOG_DEBUG };

enum atlas_log_sink { ATLAS_LOG_STDERR, ATLAS_LOG_STDERR_WALL, ATLAS_LOG_SYSLOG };

void atlas_log_set_level(enum atlas_log_level level);
/* Where lines go from now on; ATLAS_LOG_SYSLOG opens syslog as ident with
 * facility daemon. */
void atlas_log_set_sink(enum atlas_log_sink sink, const char *ident);
/* Parse "error", "warn", "info" or "debug"; -EINVAL otherwise. */
int atlas_log_parse_level(const char *name, enum atlas_log_level *out);

__attribute__((format(printf, 4, 5)))
void atlas_log_at(enum atlas_log_level level, const char *file, int line, const char *fmt, ...);

#define log_error(...) atlas_log_at(ATLAS_LOG_ERROR, __FILE__, __LINE__, __VA_ARGS__)
#define log_warn(...)  atlas_log_at(ATLAS_LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define log_info(...)  atlas_log_at(ATLAS_LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)
#define log_debug(...) atlas_log_at(ATLAS_LOG_DEBUG, __FILE__, __LINE__, __VA_ARGS__)

#endif
