/* atlas_engine_logits(): a tools request per call, run by the engine thread
 * through the scheduler like every other sequence, one at a time, its rows
 * returning logits instead of sampling (engine/logits.c). Engine thread,
 * engine.lock held. */
#ifndef ATLAS_ENGINE_LOGITS_H
#define ATLAS_ENGINE_LOGITS_H

#include <stdbool.h>

#include "engine/internal.h"

/* Queue the next job's request when none is running. */
void logits_job_start(struct atlas_engine *e);
/* A job waits to be started. */
bool logits_job_waiting(const struct atlas_engine *e);
/* The logits of position pos of r's job (vocab floats); the last one ends it. */
void logits_job_row(struct atlas_engine *e, struct sched_req *r, int pos, const float *row);
/* End r's job with an error. */
void logits_job_fail(struct atlas_engine *e, struct sched_req *r, int rc, const char *msg);

#endif
