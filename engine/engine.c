/* The engine: opening, the engine thread and its loop.
 *
 * The loop, with engine.lock held except while the executor runs:
 *   housekeeping (free closed sessions, release the KV of reset ones)
 *   start the next tools request (atlas_engine_logits), if any
 *   plan a step (sched_plan) and apply what planning did to sessions;
 *     if there is no step, deliver notifications (callbacks run without
 *     the lock) and sleep until work arrives
 *   without the lock: deliver notifications, queue the command
 *     (exec_launch; a device's backend: the notifications after it, while
 *     the step runs) and wait for it (exec_finish)
 *   commit it (sched_commit) and hand its tokens and logits to their owners
 */
#include <errno.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/clock.h"
#include "engine/internal.h"
#include "engine/logits.h"

/* Logits rows a step can return: one per session slot, and chunks of this
 * many positions for atlas_engine_logits (each row is vocab floats). */
#define ENGINE_LOGITS_CHUNK 32

/* How often the engine thread looks at device copies in flight when it has
 * nothing else to do. */
#define ENGINE_MOVE_POLL_NS 200000

static void housekeeping(struct atlas_engine *e)
{
	struct atlas_session **pp = &e->sessions;
	while (*pp) {
		struct atlas_session *s = *pp;
		if (s->req.prefetch) {
			s->req.prefetch = false;
			sched_prefetch(&e->sched, &s->req);
		}
		if (s->closed && !s->intake_jobs) {
			*pp = s->next;
			sched_remove(&e->sched, &s->req);
			session_free(s);
			continue;
		}
		if (s->req.forgotten) {
			sched_drop(&e->sched, &s->req);
			spec_session_forget(e, &s->spec);
			s->req.forgotten = false;
		}
		pp = &s->next;
	}
}

/* The sessions marked for their notify callback since the last call, into
 * list; their marks cleared. Sessions are only freed by this thread, so the
 * pointers stay valid until it frees them. */
static int notify_take(struct atlas_engine *e, struct atlas_session **list)
{
	int n = 0;
	for (struct atlas_session *s = e->sessions; s; s = s->next)
		if (s->notify) {
			s->notify = false;
			if (!s->closed && n < e->cfg.max_sessions)
				list[n++] = s;
		}
	return e->notify_fn ? n : 0;
}

/* Their callbacks, without the lock. */
static void notify_run(struct atlas_engine *e, struct atlas_session **list, int n)
{
	for (int i = 0; i < n; i++)
		e->notify_fn(e->notify_ctx, list[i]);
}

/* Call the notify callback for every session marked since the last call;
 * how many were called. The lock was let go if any were: what other
 * threads did meanwhile (a turn submitted, its signal sent to no one) is
 * for the caller to look at again. */
static int deliver(struct atlas_engine *e, struct atlas_session **list)
{
	const int n = notify_take(e, list);
	if (!n)
		return 0;
	pthread_mutex_unlock(&e->lock);
	notify_run(e, list, n);
	pthread_mutex_lock(&e->lock);
	return n;
}

static bool pending_work(struct atlas_engine *e)
{
	for (struct atlas_session *s = e->sessions; s; s = s->next)
		if (s->notify || (s->closed && !s->intake_jobs) || s->req.forgotten)
			return true;
	return false;
}

/* What planning did to requests, told to their owners. */
static void apply_events(struct atlas_engine *e)
{
	for (int i = 0; i < e->sched.n_events; i++) {
		const struct sched_event *ev = &e->sched.events[i];
		if (ev->req->keep_all) {
			if (ev->kind == SCHED_FAILED)
				logits_job_fail(e, ev->req, -EIO, ev->msg);
			continue;
		}
		struct atlas_session *s = session_of(ev->req);
		switch (ev->kind) {
		case SCHED_ADMITTED:
			s->state = s->req.n_tokens - (size_t)s->req.seq.n_tokens > 1
					   ? ATLAS_STATE_PREFILL : ATLAS_STATE_DECODE;
			break;
		case SCHED_PREEMPTED:
			s->state = ATLAS_STATE_PARKED;
			break;
		case SCHED_FAILED:
			session_end_turn(s, -EIO, "error", ev->msg);
			snprintf(s->last_error, sizeof s->last_error, "%s", ev->msg);
			break;
		case SCHED_DROPPED:
			log_warn("session %s: %s", s->name, ev->msg);
			snprintf(s->last_error, sizeof s->last_error, "%s", ev->msg);
			break;
		}
		s->notify = true;
	}
	const struct step_cmd *c = &e->cmd;
	for (int i = 0; i < c->n_seqs; i++) {
		struct sched_req *r = e->sched.reqs_of[i];
		if (r->keep_all)
			continue;
		struct atlas_session *s = session_of(r);
		struct turn *t = session_newest(s);
		if (t && !t->stepped) {
			t->stepped = true;
			latency_observe(&e->turn_stats.queue, atlas_now_ns() - t->t_submit_ns);
		}
		bool last = (size_t)(c->seqs[i].pos0 + c->seqs[i].n_rows) == r->n_tokens;
		s->state = e->sched.drafts_of[i] || (c->seqs[i].n_rows == 1 && last)
				   ? ATLAS_STATE_DECODE : ATLAS_STATE_PREFILL;
		s->notify = true;
	}
	if (e->step_fn)
		for (int i = 0; i < e->cmd.n_out; i++)
			e->cmd.out[i].keep = 1;
}

/* Hand each sequence of the step its sampled tokens or its logits rows. */
static void deliver_result(struct atlas_engine *e, const struct step_result *res)
{
	const struct step_cmd *c = &e->cmd;
	int out = 0, kept = 0;
	for (int i = 0; i < c->n_seqs; i++) {
		const struct step_seq *q = &c->seqs[i];
		struct sched_req *r = e->sched.reqs_of[i];
		const bool current = !r->forgotten && r->epoch == e->sched.epoch_of[i];
		if (e->sched.drafts_of[i]) {
			spec_settle(e, i, res, out);
			for (; out < c->n_out && c->out[out].row < q->row + q->n_rows; out++)
				kept += c->out[out].keep;
			continue;
		}
		for (; out < c->n_out && c->out[out].row < q->row + q->n_rows; out++) {
			const float *row = c->out[out].keep
				? res->logits + (size_t)kept++ * (size_t)e->vocab : NULL;
			if (!current)
				continue;
			if (r->keep_all)
				logits_job_row(e, r, q->pos0 + c->out[out].row - q->row, row);
			else if (c->out[out].sample)
				session_accept_token(session_of(r), res->tokens[out]);
		}
	}
}

/* The gate's costs come from steps of decode rows and verify segments:
 * a prefill chunk's cost is not what a verify's is, steps that read
 * host-tier KV cost what the link does, not what their rows do, and a step
 * that recorded its graph costs the recording once. */
static void measure(struct atlas_engine *e, const struct step_result *res, double seconds)
{
	int segs = 0;
	if (e->x->stage.n_pieces || res->recorded)
		return;
	for (int i = 0; i < e->cmd.n_seqs; i++) {
		if (e->cmd.seqs[i].n_rows > 1 && !e->sched.drafts_of[i])
			return;
		segs += e->sched.drafts_of[i] > 0;
	}
	spec_measure(e, e->cmd.n_rows, segs, seconds);
}

/* Expert parallelism lost a rank (ep.h): every turn ends with an error
 * that says why, and every sequence drops its KV, which the workers no
 * longer hold; the next epoch starts from empty caches and each session's
 * next turn recomputes its context. */
static void ep_fail_all(struct atlas_engine *e, int rc, const char *why)
{
	for (struct sched_req *r = e->sched.reqs; r; r = r->next) {
		if (r->forgotten)
			continue;
		if (r->keep_all) {
			if (r->phase != REQ_IDLE)
				logits_job_fail(e, r, rc, why);
			continue;
		}
		struct atlas_session *s = session_of(r);
		if (r->phase != REQ_IDLE && !s->closed)
			session_end_turn(s, rc, "error", why);
		sched_drop(&e->sched, r);
	}
}

/* Whether steps may run: the group of ranks is up, or starts its next
 * epoch now that every worker is back. While it is down, turns fail at
 * once with the reason. */
static bool ep_ready(struct atlas_engine *e)
{
	char why[ATLAS_ERRLEN];
	if (ep_head_up(e->ep, NULL, 0))
		return true;
	int rc = ep_head_resume(e->ep, why, sizeof why);
	if (!rc) {
		log_info("ep: every rank is back; turns run again");
		return true;
	}
	char msg[ATLAS_ERRLEN];
	ep_head_up(e->ep, why, sizeof why);
	snprintf(msg, sizeof msg, "ep: %.500s", why);
	ep_fail_all(e, -EHOSTDOWN, msg);
	return false;
}

/* Run the planned step. The notifications marked until now (the last
 * step's tokens, this one's admissions) are delivered without the lock,
 * which the thread takes again only once the step has run: a callback
 * wakes a reader, which takes the lock to read, so the step no longer
 * waits behind the readers it woke. On a backend that queues its ops they
 * go out while the device runs the step, else before it. */
static void run_step(struct atlas_engine *e, struct atlas_session **list)
{
	char err[ATLAS_ERRLEN];
	struct step_result res;
	uint64_t t0 = atlas_now_ns();
	const bool queued = e->x->be->info.queued;
	const int n_notify = notify_take(e, list);
	pthread_mutex_unlock(&e->lock);
	if (!queued)
		notify_run(e, list, n_notify);
	int rc = e->ep ? ep_head_step(e->ep, &e->cmd, err, sizeof err) : 0;
	if (!rc)
		rc = exec_launch(e->x, &e->cmd, err, sizeof err);
	if (queued)
		notify_run(e, list, n_notify);
	if (!rc)
		rc = exec_finish(e->x, &e->cmd, &res, err, sizeof err);
	const uint64_t t1 = atlas_now_ns();
	if (!rc && e->step_fn)
		e->step_fn(e->step_ctx, &e->cmd, &res);
	pthread_mutex_lock(&e->lock);
	e->busy_s += (double)(atlas_now_ns() - t0) * 1e-9;
	if (!rc) {
		measure(e, &res, (double)(t1 - t0) * 1e-9);
		sched_commit(&e->sched, &e->cmd);
		e->step_tokens_total += (uint64_t)e->cmd.n_rows;
		deliver_result(e, &res);
		spec_absorb(e);
		return;
	}
	/* The step's KV is in an unknown state: its sequences fail and drop it. */
	log_error("engine step failed: %s", err);
	if (e->ep) {
		char why[ATLAS_ERRLEN];
		ep_head_lost(e->ep, rc, err);
		ep_head_up(e->ep, why, sizeof why);
		snprintf(err, sizeof err, "ep: %.500s", why);
		ep_fail_all(e, -EHOSTDOWN, err);
		return;
	}
	for (int i = 0; i < e->cmd.n_seqs; i++) {
		struct sched_req *r = e->sched.reqs_of[i];
		if (r->keep_all) {
			logits_job_fail(e, r, rc, err);
			continue;
		}
		struct atlas_session *s = session_of(r);
		if (s->closed || r->forgotten)
			continue;
		session_end_turn(s, -EIO, "error", err);
		sched_drop(&e->sched, r);
	}
}

/* Blocks are moving between tiers: sleep until a disk completion wakes the
 * thread, or briefly, to notice device copies that ended (they signal
 * nothing). */
void engine_wait_for_moves(struct atlas_engine *e)
{
	struct timespec t;
	clock_gettime(CLOCK_REALTIME, &t);
	t.tv_nsec += ENGINE_MOVE_POLL_NS;
	if (t.tv_nsec >= 1000000000) {
		t.tv_sec++;
		t.tv_nsec -= 1000000000;
	}
	pthread_cond_timedwait(&e->wake, &e->lock, &t);
}

/* The disk tier's I/O thread: a move's disk I/O ended. */
static void wake_engine(void *ctx)
{
	struct atlas_engine *e = ctx;
	pthread_cond_signal(&e->wake);
}

static void *engine_main(void *arg)
{
	struct atlas_engine *e = arg;
	struct atlas_session **list = calloc((size_t)e->cfg.max_sessions, sizeof *list);
	pthread_mutex_lock(&e->lock);
	while (!e->stop) {
		housekeeping(e);
		if (e->persist == PERSIST_ASKED) {
			deliver(e, list);
			persist_run(e);
			continue;
		}
		if (e->persist == PERSIST_DONE) {
			/* Kept: nothing runs again; closes and notifications still do. */
			deliver(e, list);
			if (!pending_work(e) && !e->stop)
				pthread_cond_wait(&e->wake, &e->lock);
			continue;
		}
		if (e->ep && !ep_ready(e)) {
			deliver(e, list);
			engine_wait_for_moves(e);
			continue;
		}
		logits_job_start(e);
		spec_plan(e);
		if (sched_plan(&e->sched, &e->cmd) > 0 || e->sched.n_events) {
			apply_events(e);
			if (e->cmd.n_seqs)
				run_step(e, list);
			else
				deliver(e, list);
			continue;
		}
		if (deliver(e, list) || pending_work(e) || e->stop || logits_job_waiting(e))
			continue;
		if (e->x->pool.n_active)
			engine_wait_for_moves(e);
		else
			pthread_cond_wait(&e->wake, &e->lock);
	}
	pthread_mutex_unlock(&e->lock);
	free(list);
	return NULL;
}

static void engine_free(struct atlas_engine *e)
{
	spec_close(e);
	sched_free(&e->sched);
	step_cmd_free(&e->cmd);
	ep_head_close(e->ep);
	exec_close(e->x);
	tok_free(e->tok);
	pthread_mutex_destroy(&e->lock);
	pthread_cond_destroy(&e->wake);
	pthread_cond_destroy(&e->job_done);
	pthread_cond_destroy(&e->intake_wake);
	free(e);
}

/* The draft rows of one step: verify segments take them out of the chunk
 * budget, at most ATLAS_SPEC_K_MAX per session. */
static int spec_rows(const struct atlas_config *c)
{
	return ATLAS_MIN(c->chunk_size, c->max_batch * ATLAS_SPEC_K_MAX);
}

/* A step holds every session's slot, or one tools request; every decode
 * row and every draft row gives logits. */
void engine_step_limits(const struct atlas_config *c, struct step_limits *l)
{
	*l = (struct step_limits){
		.max_seqs = c->max_batch,
		.max_rows = c->chunk_size + c->max_batch,
		.max_out = ATLAS_MAX(c->max_batch + spec_rows(c), ENGINE_LOGITS_CHUNK),
	};
}

/* The sessions' slots and the tools slot. */
int engine_seq_slots(const struct atlas_config *c)
{
	return c->max_batch + 1;
}

static int load(struct atlas_engine *e, char *err, size_t errlen)
{
	const struct atlas_config *c = &e->cfg;
	const int slots = c->max_batch;
	int rc = strcmp(c->load_format, "dummy") ? tok_load(c->model, &e->tok, err, errlen)
						  : -ENOENT;
	if (rc == -ENOENT) {
		log_info("%s: no tokenizer.json; prompts and output are token ids", c->model);
		e->tok = NULL;
	} else if (rc) {
		return rc;
	}
	struct step_limits lim;
	engine_step_limits(c, &lim);
	/* A draft model's memory first: an automatic kv_memory sees it. */
	if ((rc = spec_open(e, &lim, err, errlen)))
		return rc;
	if (c->ep > 1 && (rc = ep_head_open(c, &e->ep, err, errlen)))
		return rc;
	if ((rc = exec_open_joined(c, EXEC_MODEL, engine_seq_slots(c), &lim,
				   e->ep ? ep_head_join : NULL, e->ep, &e->x, err, errlen)))
		return rc;
	if (e->ep && (rc = ep_head_attach(e->ep, &e->x->pool, &e->x->lim, err, errlen)))
		return rc;
	e->mc = e->x->mc;
	e->vocab = e->x->geo.vocab;
	e->context = e->x->geo.context;
	if (e->tok && tok_vocab_size(e->tok) > e->vocab)
		return atlas_errf(err, errlen, -EINVAL,
				  "%s: the tokenizer has %d tokens but vocab_size is %d", c->model,
				  tok_vocab_size(e->tok), e->vocab);
	if ((rc = persist_load(e, err, errlen)) ||
	    (rc = seq_pool_tiers(&e->x->pool, c->kv_host_memory, c->kv_dir, persist_file(c),
				 c->kv_disk_memory, wake_engine, e, err, errlen)) ||
	    (rc = exec_staging_open(e->x, c->kv_stage_memory, err, errlen)))
		return rc;
	if ((rc = step_cmd_alloc(&e->cmd, &e->x->lim)) ||
	    (rc = sched_init(&e->sched, &e->x->pool, slots, c->chunk_size,
			     ATLAS_MIN(c->chunk_size, ENGINE_LOGITS_CHUNK), e->x->geo.max_blocks,
			     lim.max_seqs, c->kv_device_blocks_per_seq)))
		return atlas_errf(err, errlen, rc, "out of memory for the scheduler");
	if ((rc = spec_bind(e, err, errlen)))
		return rc;
	e->sched.spec_rows = spec_rows(c);
	if ((rc = persist_restore(e)))
		return atlas_errf(err, errlen, rc, "kv_persist: out of memory for the kept sessions");
	return 0;
}

int atlas_chunk_size(const struct atlas_config *c)
{
	if (c->chunk_size)
		return c->chunk_size;
	return strcmp(kt_backend_resolve(c->backend), "cuda") ? ATLAS_CHUNK_SIZE_CPU_AUTO
							       : ATLAS_CHUNK_SIZE_GPU_AUTO;
}

int atlas_engine_open(const struct atlas_config *cfg, struct atlas_engine **out, char *err,
		      size_t errlen)
{
	int rc = atlas_config_validate(cfg, err, errlen);
	if (rc)
		return rc;
	struct atlas_engine *e = calloc(1, sizeof *e);
	if (!e)
		return atlas_errf(err, errlen, -ENOMEM, "out of memory");
	e->cfg = *cfg;
	e->cfg.chunk_size = atlas_chunk_size(cfg);
	/* An empty `model` key means the model chosen at build time. */
	snprintf(e->cfg.model, sizeof e->cfg.model, "%s", atlas_config_model_dir(cfg));
	e->t_open_ns = atlas_now_ns();
	pthread_mutex_init(&e->lock, NULL);
	pthread_cond_init(&e->wake, NULL);
	pthread_cond_init(&e->job_done, NULL);
	pthread_cond_init(&e->intake_wake, NULL);
	if ((rc = load(e, err, errlen))) {
		engine_free(e);
		return rc;
	}
	if ((rc = intake_start(e)) || (rc = -pthread_create(&e->thread, NULL, engine_main, e))) {
		intake_stop(e);
		engine_free(e);
		return atlas_errf(err, errlen, rc, "cannot start the engine's threads");
	}
	log_info("engine: %s (%s, %d layers, %llu parameters, %s) on %s; KV %d blocks of %d tokens; "
		 "prompts in chunks of %d tokens",
		 e->cfg.model, e->mc->architecture, e->mc->n_layers,
		 (unsigned long long)e->x->info.parameters, e->x->info.dtype, e->x->be->info.name,
		 e->x->pool.kv.n_blocks, e->x->pool.kv.block_size, e->cfg.chunk_size);
	*out = e;
	return 0;
}

void atlas_engine_close(struct atlas_engine *e)
{
	if (!e)
		return;
	pthread_mutex_lock(&e->lock);
	e->stop = true;
	for (struct atlas_session *s = e->sessions; s; s = s->next)
		session_end_turn(s, -ECANCELED, "cancelled", NULL);
	pthread_cond_signal(&e->wake);
	pthread_mutex_unlock(&e->lock);
	intake_stop(e);
	pthread_join(e->thread, NULL);
	while (e->sessions) {
		struct atlas_session *s = e->sessions;
		e->sessions = s->next;
		sched_remove(&e->sched, &s->req);
		session_free(s);
	}
	engine_free(e);
}

void atlas_engine_set_notify(struct atlas_engine *e, atlas_notify_fn fn, void *ctx)
{
	pthread_mutex_lock(&e->lock);
	e->notify_fn = fn;
	e->notify_ctx = ctx;
	pthread_mutex_unlock(&e->lock);
}

void engine_on_step(struct atlas_engine *e, engine_step_fn fn, void *ctx)
{
	pthread_mutex_lock(&e->lock);
	e->step_fn = fn;
	e->step_ctx = ctx;
	pthread_mutex_unlock(&e->lock);
}

const struct atlas_tokenizer *atlas_engine_tokenizer(struct atlas_engine *e)
{
	return e->tok;
}

int atlas_engine_vocab_size(struct atlas_engine *e)
{
	return e->vocab;
}
