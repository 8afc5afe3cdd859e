/* Logging to stderr with a level, a monotonic timestamp and the source.
 * Never on the decode hot path. */
#ifndef ATLAS_COMMON_LOG_H
#define ATLAS_COMMON_LOG_H

enum atlas_log_level { ATLAS_LOG_ERROR, ATLAS_LOG_WARN, ATLAS_LOG_INFO, ATLAS_LOG_DEBUG };

void atlas_log_set_level(enum atlas_log_level level);
/* Parse "error", "warn", "info" or "debug"; -EINVAL otherwise. */
int atlas_log_parse_level(const char *name, enum atlas_log_level *out);

__attribute__((format(printf, 4, 5)))
void atlas_log_at(enum atlas_log_level level, const char *file, int line, const char *fmt, ...);

#define log_error(...) atlas_log_at(ATLAS_LOG_ERROR, __FILE__, __LINE__, __VA_ARGS__)
#define log_warn(...)  atlas_log_at(ATLAS_LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define log_info(...)  atlas_log_at(ATLAS_LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)
#define log_debug(...) atlas_log_at(ATLAS_LOG_DEBUG, __FILE__, __LINE__, __VA_ARGS__)

#endif
