/* Error checks of io_uring calls, the swap tier's counterpart of
 * kernels/cuda/check.h.
 *
 * liburing returns a count or 0 on success and a negative errno on failure.
 * Every io_uring call of engine/hss/ goes through URING_CHECK (a failure is
 * an error) or URING_TRY (a failure the caller falls back from, such as
 * fixed-buffer registration over RLIMIT_MEMLOCK): on failure the call, the
 * error and the caller's file:line are logged. Either evaluates to the call's
 * result, because the I/O thread cannot simply return: it decides between a
 * retry and giving up. Errors that a retry clears (see uring_transient) are
 * logged at debug level only.
 */
#ifndef ATLAS_ENGINE_HSS_URING_CHECK_H
#define ATLAS_ENGINE_HSS_URING_CHECK_H

#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "common/log.h"

/* The kernel was short of memory for requests (EAGAIN), its completion
 * queue had a backlog (EBUSY), or a signal came first (EINTR). */
static inline bool uring_transient(int rc)
{
	return rc == -EAGAIN || rc == -EBUSY || rc == -EINTR;
}

static inline int uring_checked(int rc, enum atlas_log_level level, const char *call,
				const char *file, int line)
{
	if (rc < 0)
		atlas_log_at(uring_transient(rc) ? ATLAS_LOG_DEBUG : level, file, line,
			     "io_uring: %s: %s", call, strerror(-rc));
	return rc;
}

#define URING_CHECK(call) uring_checked((call), ATLAS_LOG_ERROR, #call, __FILE__, __LINE__)
#define URING_TRY(call)   uring_checked((call), ATLAS_LOG_WARN, #call, __FILE__, __LINE__)

#endif
