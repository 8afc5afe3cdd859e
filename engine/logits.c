/* The logits of every position of a fresh sequence, for tools and tests
 * (atlas_engine_logits, logits.h). */
#include "engine/logits.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

static struct logits_job *job_of(struct sched_req *r)
{
	return (struct logits_job *)((char *)r - offsetof(struct logits_job, req));
}

static void finish(struct atlas_engine *e, struct logits_job *job, int rc, const char *msg)
{
	if (msg)
		snprintf(job->err, sizeof job->err, "%s", msg);
	job->rc = rc;
	sched_remove(&e->sched, &job->req);
	seq_free(&e->x->pool, &job->req.seq);
	free(job->req.tokens);
	job->req.tokens = NULL;
	for (struct logits_job **pp = &e->jobs; *pp; pp = &(*pp)->next)
		if (*pp == job) {
			*pp = job->next;
			break;
		}
	job->done = true;
	pthread_cond_broadcast(&e->job_done);
}

void logits_job_start(struct atlas_engine *e)
{
	struct logits_job *job = e->jobs;
	if (!job || job->started)
		return;
	job->started = true;
	job->req.keep_all = true;
	sched_add(&e->sched, &job->req);
	sched_queue(&e->sched, &job->req);
}

bool logits_job_waiting(const struct atlas_engine *e)
{
	return e->jobs && !e->jobs->started;
}

void logits_job_row(struct atlas_engine *e, struct sched_req *r, int pos, const float *row)
{
	struct logits_job *job = job_of(r);
	memcpy(job->out + (size_t)pos * (size_t)e->vocab, row, (size_t)e->vocab * sizeof *row);
	if ((size_t)pos + 1 == job->n)
		finish(e, job, 0, NULL);
}

void logits_job_fail(struct atlas_engine *e, struct sched_req *r, int rc, const char *msg)
{
	finish(e, job_of(r), rc, msg);
}

int atlas_engine_logits(struct atlas_engine *e, const int32_t *ids, size_t n, float *out,
			char *err, size_t errlen)
{
	for (size_t i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= e->vocab)
			return atlas_errf(err, errlen, -EINVAL,
					  "token id %d at position %zu is not below the vocabulary "
					  "size %d", ids[i], i, e->vocab);
	if (n + 1 > (size_t)e->context)
		return atlas_errf(err, errlen, -E2BIG,
				  "logits: %zu tokens do not fit the context of %d", n, e->context);
	if (!n)
		return 0;
	struct logits_job job = { .n = n, .out = out };
	sched_req_init(&job.req);
	if (sched_req_append(&job.req, ids, n))
		return atlas_errf(err, errlen, -ENOMEM, "out of memory");
	pthread_mutex_lock(&e->lock);
	struct logits_job **pp = &e->jobs;
	while (*pp)
		pp = &(*pp)->next;
	*pp = &job;
	pthread_cond_signal(&e->wake);
	while (!job.done)
		pthread_cond_wait(&e->job_done, &e->lock);
	pthread_mutex_unlock(&e->lock);
	if (job.rc)
		return atlas_errf(err, errlen, job.rc, "logits: %s", job.err);
	return 0;
}
