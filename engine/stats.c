/* One consistent snapshot of the engine for the ctl/ files. */
#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "engine/internal.h"

static void fill_slots(struct atlas_engine *e, struct atlas_engine_stats *o)
{
	o->n_slots = e->max_batch;
	for (int i = 0; i < e->max_batch; i++) {
		struct atlas_slot_stats *st = &o->slots[i];
		struct atlas_session *s = e->slots[i];
		st->slot = i;
		if (!s)
			continue;
		snprintf(st->session, sizeof st->session, "%s", s->name);
		st->state = s->state;
		st->position = (uint64_t)s->kv.n_tokens;
		kv_seq_count(&s->kv, st->kv_blocks);
		struct turn *t = session_newest(s);
		if (t && t->n_generated > 1 && t->t_last_ns > t->t_first_ns)
			st->tokens_per_s = (double)(t->n_generated - 1) /
					   ((double)(t->t_last_ns - t->t_first_ns) * 1e-9);
	}
}

static void fill_kv(struct atlas_engine *e, struct atlas_kv_stats *kv)
{
	kv->block_size = (uint32_t)e->kv.block_size;
	kv->bytes_per_block = e->kv.bytes_per_block;
	kv->blocks_total[ATLAS_TIER_HBM] = (uint64_t)e->kv.n_blocks;
	kv->blocks_used[ATLAS_TIER_HBM] = (uint64_t)(e->kv.n_blocks - e->kv.n_free);
	for (struct atlas_session *s = e->sessions; s; s = s->next)
		if (!s->closed && s->state == ATLAS_STATE_PARKED)
			kv->parked_sessions++;
	kv->preemptions_total = e->preemptions_total;
	kv->evictions_total = e->evictions_total;
}

int atlas_engine_stats(struct atlas_engine *e, struct atlas_engine_stats *o)
{
	memset(o, 0, sizeof *o);
	const struct model_config *mc = e->mc;
	snprintf(o->model, sizeof o->model, "%s", e->cfg.model);
	snprintf(o->architecture, sizeof o->architecture, "%s", mc->architecture);
	o->parameters = e->minfo.parameters;
	snprintf(o->dtype, sizeof o->dtype, "%s", e->minfo.dtype);
	snprintf(o->backend, sizeof o->backend, "%s", e->be->info.backend);
	snprintf(o->device, sizeof o->device, "%s", e->be->info.name);
	o->memory_total = e->be->info.memory_total;
	o->weights_bytes = e->minfo.device_bytes;
	o->kv_bytes = (uint64_t)e->kv.n_blocks * e->kv.bytes_per_block;
	o->step_weight_bytes = e->minfo.device_bytes - e->minfo.lookup_only_bytes;
	o->kv_bytes_per_token = e->kv.bytes_per_block / (uint64_t)e->kv.block_size;
	o->layers = mc->n_layers;
	o->hidden_size = mc->hidden_size;
	o->heads = mc->n_heads;
	o->kv_heads = mc->n_kv_heads;
	o->head_dim = mc->head_dim;
	o->vocab_size = mc->vocab_size;
	o->context = e->context;
	snprintf(o->spec.method, sizeof o->spec.method, "off");
	o->ep.ranks = 1;
	o->ep.hosts = 1;

	pthread_mutex_lock(&e->lock);
	o->sessions = e->n_sessions;
	o->turns_total = e->turns_total;
	o->prompt_tokens_total = e->prompt_tokens_total;
	o->generated_tokens_total = e->generated_tokens_total;
	o->steps_total = e->steps_total;
	o->step_tokens_total = e->step_tokens_total;
	o->busy_seconds_total = e->busy_s;
	o->uptime_s = (double)(atlas_now_ns() - e->t_open_ns) * 1e-9;
	fill_slots(e, o);
	fill_kv(e, &o->kv);
	pthread_mutex_unlock(&e->lock);
	return 0;
}
