/* The engine: loading, the engine thread and its loop.
 *
 * The loop, with engine.lock held except around the model:
 *   housekeeping (free closed sessions, release KV of reset ones)
 *   deliver notifications (callbacks run without the lock)
 *   run one tools request (atlas_engine_logits), if any
 *   plan a step; if there is none, sleep until work arrives
 *   run the step without the lock, then apply its sampled tokens
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/clock.h"
#include "engine/internal.h"

/* Logits rows a step can return: one per sequence, and chunks of this many
 * positions for atlas_engine_logits (each row is vocab floats). */
#define ENGINE_LOGITS_CHUNK 32

static void housekeeping(struct atlas_engine *e)
{
	struct atlas_session **pp = &e->sessions;
	while (*pp) {
		struct atlas_session *s = *pp;
		if (s->closed) {
			*pp = s->next;
			session_free(s);
			continue;
		}
		if (s->reset_pending) {
			session_drop_kv(s);
			s->reset_pending = false;
		}
		pp = &s->next;
	}
}

/* Call the notify callback for every session marked since the last call.
 * The callbacks run without the lock; sessions are only freed by this thread,
 * so the pointers stay valid meanwhile. */
static void deliver(struct atlas_engine *e, struct atlas_session **list)
{
	int n = 0;
	for (struct atlas_session *s = e->sessions; s; s = s->next)
		if (s->notify) {
			s->notify = false;
			if (!s->closed && n < e->cfg.max_sessions)
				list[n++] = s;
		}
	if (!n || !e->notify_fn)
		return;
	atlas_notify_fn fn = e->notify_fn;
	void *ctx = e->notify_ctx;
	pthread_mutex_unlock(&e->lock);
	for (int i = 0; i < n; i++)
		fn(ctx, list[i]);
	pthread_mutex_lock(&e->lock);
}

static bool pending_notify(struct atlas_engine *e)
{
	for (struct atlas_session *s = e->sessions; s; s = s->next)
		if (s->notify || s->closed || s->reset_pending)
			return true;
	return false;
}

static void run_job(struct atlas_engine *e)
{
	struct logits_job *job = e->jobs;
	e->jobs = job->next;
	pthread_mutex_unlock(&e->lock);
	job->rc = step_run_logits_job(e, job);
	pthread_mutex_lock(&e->lock);
	job->done = true;
	pthread_cond_broadcast(&e->job_done);
}

static void run_step(struct atlas_engine *e)
{
	char err[ATLAS_ERRLEN];
	uint64_t t0 = atlas_now_ns();
	pthread_mutex_unlock(&e->lock);
	int rc = step_run(e, err, sizeof err);
	pthread_mutex_lock(&e->lock);
	e->busy_s += (double)(atlas_now_ns() - t0) * 1e-9;
	if (!rc) {
		sched_finish(e);
		return;
	}
	/* The step's KV is in an unknown state: its sequences fail and drop it. */
	log_error("engine step failed: %s", err);
	for (int i = 0; i < e->step.n_seqs; i++) {
		struct atlas_session *s = e->step.seqs[i].s;
		if (s->closed)
			continue;
		session_end_turn(s, -EIO, "error", err);
		session_drop_kv(s);
	}
}

static void *engine_main(void *arg)
{
	struct atlas_engine *e = arg;
	struct atlas_session **list = calloc((size_t)e->cfg.max_sessions, sizeof *list);
	pthread_mutex_lock(&e->lock);
	while (!e->stop) {
		housekeeping(e);
		deliver(e, list);
		if (e->jobs) {
			run_job(e);
			continue;
		}
		if (sched_plan(e) > 0) {
			run_step(e);
			continue;
		}
		if (!pending_notify(e) && !e->jobs && !e->stop)
			pthread_cond_wait(&e->wake, &e->lock);
	}
	pthread_mutex_unlock(&e->lock);
	free(list);
	return NULL;
}

static int alloc_step(struct atlas_engine *e, char *err, size_t errlen)
{
	struct kt_backend *be = e->be;
	struct step *st = &e->step;
	int rows = e->max_batch + 2;
	int rc;
	if ((rc = kt_alloc(be, KT_I32, e->max_tokens, 1, &e->d_ids)) ||
	    (rc = kt_alloc(be, KT_I32, e->max_tokens, 1, &e->d_pos)) ||
	    (rc = kt_alloc(be, KT_I32, e->max_tokens, 1, &e->d_seq)) ||
	    (rc = kt_alloc(be, KT_I32, e->max_out, 1, &e->d_out_rows)) ||
	    (rc = kt_alloc(be, KT_I32, rows, e->max_blocks, &e->d_tables)) ||
	    (rc = kt_alloc(be, KT_F32, e->max_out, e->vocab, &e->d_logits)))
		return atlas_errf(err, errlen, rc, "cannot allocate step buffers on the %s backend",
				  be->info.backend);
	e->tables = calloc((size_t)rows * (size_t)e->max_blocks, sizeof *e->tables);
	st->seqs = calloc((size_t)rows, sizeof *st->seqs);
	st->ids = calloc((size_t)e->max_tokens, sizeof *st->ids);
	st->pos = calloc((size_t)e->max_tokens, sizeof *st->pos);
	st->seqslot = calloc((size_t)e->max_tokens, sizeof *st->seqslot);
	st->out_rows = calloc((size_t)e->max_tokens, sizeof *st->out_rows);
	st->sample = calloc((size_t)e->max_out, sizeof *st->sample);
	st->sampled = calloc((size_t)e->max_out, sizeof *st->sampled);
	st->segments = calloc((size_t)rows, sizeof *st->segments);
	if (!e->tables || !st->seqs || !st->ids || !st->pos || !st->seqslot || !st->out_rows ||
	    !st->sample || !st->sampled || !st->segments)
		return atlas_errf(err, errlen, -ENOMEM, "out of memory for step buffers");
	/* Unused block-table entries point at block 0, never past the pool. */
	return kt_upload(be, &e->d_tables, 0, e->tables,
			 (size_t)rows * (size_t)e->max_blocks * sizeof *e->tables);
}

static void free_step(struct atlas_engine *e)
{
	struct kt_tensor *t[] = { &e->d_ids, &e->d_pos, &e->d_seq, &e->d_out_rows, &e->d_tables,
				  &e->d_logits };
	for (size_t i = 0; i < ATLAS_ARRAY_LEN(t); i++)
		if (t[i]->data)
			kt_free(e->be, t[i]);
	struct step *st = &e->step;
	free(e->tables);
	free(st->seqs);
	free(st->ids);
	free(st->pos);
	free(st->seqslot);
	free(st->out_rows);
	free(st->sample);
	free(st->sampled);
	free(st->segments);
}

static void engine_free(struct atlas_engine *e)
{
	if (e->be) {
		free_step(e);
		if (e->kv.n_blocks)
			kv_pool_free(&e->kv);
		model_free(e->model);
		kt_backend_close(e->be);
	}
	tok_free(e->tok);
	pthread_mutex_destroy(&e->lock);
	pthread_cond_destroy(&e->wake);
	pthread_cond_destroy(&e->job_done);
	free(e);
}

/* Bytes for the KV pool: kv_memory, or with 0 what is left on the device of
 * gpu_memory_fraction once everything else is allocated (cpu: a fixed size). */
static int kv_budget(struct atlas_engine *e, uint64_t *bytes, char *err, size_t errlen)
{
	const struct atlas_config *c = &e->cfg;
	uint64_t free_b, total_b;
	if (c->kv_memory) {
		*bytes = c->kv_memory;
		return 0;
	}
	if (strcmp(e->be->info.backend, "cuda")) {
		*bytes = ATLAS_KV_MEMORY_CPU_AUTO;
		return 0;
	}
	int rc = kt_memory(e->be, &free_b, &total_b);
	if (rc)
		return atlas_errf(err, errlen, rc, "kv_memory: cannot read the device's free memory");
	uint64_t used = total_b - free_b;
	uint64_t share = (uint64_t)((double)c->gpu_memory_fraction * (double)total_b);
	if (share <= used)
		return atlas_errf(err, errlen, -ENOMEM,
				  "kv_memory: the model and its buffers use %.2f GiB of the %.2f GiB "
				  "that gpu_memory_fraction %.2f allows on %s; nothing is left for "
				  "the KV cache (raise gpu_memory_fraction or set kv_memory)",
				  (double)used / (1 << 30), (double)share / (1 << 30),
				  c->gpu_memory_fraction, e->be->info.name);
	*bytes = share - used;
	log_info("kv_memory: %.2f GiB (gpu_memory_fraction %.2f of %.2f GiB, %.2f GiB in use)",
		 (double)*bytes / (1 << 30), c->gpu_memory_fraction, (double)total_b / (1 << 30),
		 (double)used / (1 << 30));
	return 0;
}

/* The padding rows of a graphed step belong to the slot after the tools'
 * slot, whose block table points every position at the pool's pad block. */
static int point_pad_slot(struct atlas_engine *e)
{
	int32_t *row = e->tables + (size_t)pad_slot(e) * (size_t)e->max_blocks;
	for (int i = 0; i < e->max_blocks; i++)
		row[i] = e->kv.pad_block;
	return kt_upload(e->be, &e->d_tables, (size_t)pad_slot(e) * (size_t)e->max_blocks *
			 sizeof *row, row, (size_t)e->max_blocks * sizeof *row);
}

static int load(struct atlas_engine *e, char *err, size_t errlen)
{
	const struct atlas_config *c = &e->cfg;
	const bool dummy = !strcmp(c->load_format, "dummy");
	struct model_config mc;
	int rc = dummy ? model_shape_config(c->model, &mc, err, errlen)
		       : model_config_load(c->model, &mc, err, errlen);
	if (rc)
		return rc;
	rc = dummy ? -ENOENT : tok_load(c->model, &e->tok, err, errlen);
	if (rc == -ENOENT) {
		log_info("%s: no tokenizer.json; prompts and output are token ids", c->model);
		e->tok = NULL;
	} else if (rc) {
		return rc;
	}
	if (e->tok && tok_vocab_size(e->tok) > mc.vocab_size)
		return atlas_errf(err, errlen, -EINVAL,
				  "%s: the tokenizer has %d tokens but vocab_size is %d", c->model,
				  tok_vocab_size(e->tok), mc.vocab_size);
	if (c->context > mc.max_position_embeddings)
		return atlas_errf(err, errlen, -EINVAL,
				  "context: %d exceeds the model's max_position_embeddings %d",
				  c->context, mc.max_position_embeddings);
	e->context = c->context ? c->context : mc.max_position_embeddings;
	e->max_batch = c->max_batch;
	e->max_tokens = c->chunk_size + c->max_batch;
	e->max_out = ATLAS_MAX(c->max_batch, ENGINE_LOGITS_CHUNK);
	e->max_blocks = (e->context + c->kv_block_size - 1) / c->kv_block_size;
	e->vocab = mc.vocab_size;

	struct kt_config kc = {
		.backend = c->backend, .threads = c->threads, .device = c->device,
		.max_tokens = e->max_tokens, .max_seqs = e->max_batch + 2,
		.max_context = e->context, .max_heads = mc.n_heads, .max_head_dim = mc.head_dim,
	};
	if ((rc = kt_backend_open(&kc, &e->be, err, errlen)))
		return rc;
	rc = dummy ? model_load_dummy(c->model, e->be, e->max_tokens, e->max_out, &e->model, err,
				      errlen)
		   : model_load(c->model, e->be, e->max_tokens, e->max_out, &e->model, err, errlen);
	if (rc)
		return rc;
	e->mc = model_get_config(e->model);
	model_get_info(e->model, &e->minfo);
	e->graphs = e->be->info.graphs && c->cuda_graphs;
	/* The step buffers come before the KV pool, so that an automatic
	 * kv_memory sees every other allocation. */
	uint64_t kv_bytes = 0;
	if ((rc = alloc_step(e, err, errlen)) || (rc = kv_budget(e, &kv_bytes, err, errlen)))
		return rc;
	if ((rc = kv_pool_init(&e->kv, e->be, mc.n_attention_layers, mc.n_kv_heads, mc.head_dim,
			       c->kv_block_size, kv_bytes, err, errlen)))
		return rc;
	return point_pad_slot(e);
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
	/* An empty `model` key means the model chosen at build time. */
	snprintf(e->cfg.model, sizeof e->cfg.model, "%s", atlas_config_model_dir(cfg));
	e->t_open_ns = atlas_now_ns();
	pthread_mutex_init(&e->lock, NULL);
	pthread_cond_init(&e->wake, NULL);
	pthread_cond_init(&e->job_done, NULL);
	if ((rc = load(e, err, errlen))) {
		engine_free(e);
		return rc;
	}
	if ((rc = -pthread_create(&e->thread, NULL, engine_main, e))) {
		engine_free(e);
		return atlas_errf(err, errlen, rc, "cannot start the engine thread");
	}
	log_info("engine: %s (%s, %d layers, %llu parameters, %s) on %s; KV %d blocks of %d tokens",
		 e->cfg.model, e->mc->architecture, e->mc->n_layers,
		 (unsigned long long)e->minfo.parameters, e->minfo.dtype, e->be->info.name,
		 e->kv.n_blocks, e->kv.block_size);
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
	pthread_join(e->thread, NULL);
	while (e->sessions) {
		struct atlas_session *s = e->sessions;
		e->sessions = s->next;
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

const struct atlas_tokenizer *atlas_engine_tokenizer(struct atlas_engine *e)
{
	return e->tok;
}

int atlas_engine_vocab_size(struct atlas_engine *e)
{
	return e->vocab;
}

int atlas_engine_logits(struct atlas_engine *e, const int32_t *ids, size_t n, float *out,
			char *err, size_t errlen)
{
	for (size_t i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= e->vocab)
			return atlas_errf(err, errlen, -EINVAL,
					  "token id %d at position %zu is not below the vocabulary "
					  "size %d", ids[i], i, e->vocab);
	struct logits_job job = { .ids = ids, .n = n, .out = out };
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
