/* One consistent snapshot of the engine for the ctl/ files. */
#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "engine/hss/disk.h"
#include "engine/internal.h"

static void fill_slots(struct atlas_engine *e, struct atlas_engine_stats *o)
{
	o->n_slots = e->sched.n_slots;
	for (int i = 0; i < e->sched.n_slots; i++) {
		struct atlas_slot_stats *st = &o->slots[i];
		struct sched_req *r = e->sched.slots[i];
		st->slot = i;
		if (!r)
			continue;
		struct atlas_session *s = session_of(r);
		snprintf(st->session, sizeof st->session, "%s", s->name);
		st->state = s->state;
		st->position = (uint64_t)r->seq.n_tokens;
		seq_count(&r->seq, st->kv_blocks);
		if (s->spec.draft_tokens)
			st->draft_acceptance = (double)s->spec.accepted / (double)s->spec.draft_tokens;
		snprintf(st->spec, sizeof st->spec, "%s", spec_slot_state(s));
		struct turn *t = session_newest(s);
		if (t && t->n_generated > 1 && t->t_last_ns > t->t_first_ns)
			st->tokens_per_s = (double)(t->n_generated - 1) /
					   ((double)(t->t_last_ns - t->t_first_ns) * 1e-9);
	}
}

/* Whether some of s's KV is in the swap tier (or on its way there). */
static bool parked(const struct atlas_session *s)
{
	for (int i = 0; i < s->req.seq.n_blocks; i++)
		if (s->req.seq.blocks[i].tier != KV_TIER_DEVICE || s->req.seq.blocks[i].moving)
			return true;
	return s->state == ATLAS_STATE_PARKED;
}

static void fill_kv(struct atlas_engine *e, struct atlas_kv_stats *kv)
{
	const struct seq_pool *pool = &e->x->pool;
	const struct kv_pool *p = &pool->kv;
	kv->block_size = (uint32_t)p->block_size;
	kv->bytes_per_block = p->bytes_per_block;
	kv->blocks_total[ATLAS_TIER_DEVICE] = (uint64_t)p->n_blocks;
	kv->blocks_used[ATLAS_TIER_DEVICE] = (uint64_t)(p->n_blocks - p->n_free);
	/* The host tier without the slots kept for staging disk I/O. */
	const int host_total = pool->host.n_blocks - pool->n_staging;
	kv->blocks_total[ATLAS_TIER_HOST] = (uint64_t)host_total;
	kv->blocks_used[ATLAS_TIER_HOST] = (uint64_t)(host_total - pool->host.n_free);
	if (pool->disk) {
		struct disk_stats d;
		disk_stats(pool->disk, &d);
		kv->blocks_total[ATLAS_TIER_DISK] = d.slots_total;
		kv->blocks_used[ATLAS_TIER_DISK] = d.slots_used;
		kv->read_latency_p50_s = (double)d.read_p50_ns * 1e-9;
		kv->read_latency_p99_s = (double)d.read_p99_ns * 1e-9;
	}
	kv->swap_out_bytes_total = pool->swap.out_bytes;
	kv->swap_out_ops_total = pool->swap.out_ops;
	kv->swap_in_bytes_total = pool->swap.in_bytes;
	kv->swap_in_ops_total = pool->swap.in_ops;
	kv->prefetch_hits_total = e->sched.prefetch_hits;
	kv->prefetch_misses_total = e->sched.prefetch_misses;
	kv->swap_errors_total = pool->swap.errors;
	kv->swap_drops_total = e->sched.drops;
	for (struct atlas_session *s = e->sessions; s; s = s->next)
		if (!s->closed && parked(s))
			kv->parked_sessions++;
	kv->preemptions_total = e->sched.preemptions;
	kv->evictions_total = e->sched.evictions;
	kv->staged_blocks_total = e->x->staged_blocks;
	kv->staged_bytes_total = e->x->staged_blocks * p->bytes_per_block;
}

int atlas_engine_stats(struct atlas_engine *e, struct atlas_engine_stats *o)
{
	memset(o, 0, sizeof *o);
	const struct model_config *mc = e->mc;
	snprintf(o->model, sizeof o->model, "%s", e->cfg.model);
	snprintf(o->architecture, sizeof o->architecture, "%s", mc->architecture);
	o->parameters = e->x->info.parameters;
	snprintf(o->dtype, sizeof o->dtype, "%s", e->x->info.dtype);
	snprintf(o->backend, sizeof o->backend, "%s", e->x->be->info.backend);
	snprintf(o->device, sizeof o->device, "%s", e->x->be->info.name);
	o->memory_total = e->x->be->info.memory_total;
	o->weights_bytes = e->x->info.device_bytes;
	o->kv_bytes = (uint64_t)e->x->pool.kv.n_blocks * e->x->pool.kv.bytes_per_block;
	o->step_weight_bytes = e->x->info.device_bytes - e->x->info.lookup_only_bytes;
	o->kv_bytes_per_token = e->x->pool.kv.bytes_per_block / (uint64_t)e->x->pool.kv.block_size;
	o->expert_bytes = e->x->info.expert_bytes;
	o->experts = mc->n_experts;
	o->experts_per_token = mc->n_experts_per_tok;
	o->layers = mc->n_layers;
	o->hidden_size = mc->hidden_size;
	o->heads = mc->n_heads;
	o->kv_heads = mc->n_kv_heads;
	o->head_dim = mc->head_dim;
	o->vocab_size = mc->vocab_size;
	o->context = e->context;
	o->ep.ranks = 1;
	o->ep.hosts = 1;
	o->ep.up = true;
	o->ep.experts_per_rank = mc->n_experts;
	if (e->ep)
		ep_head_stats(e->ep, mc->n_experts, &o->ep);
	o->ep.collectives_total = e->x->be->comm.calls;
	o->ep.collective_bytes_total = e->x->be->comm.bytes;
	o->ep.collective_seconds_total = (double)e->x->be->comm.ns * 1e-9;

	pthread_mutex_lock(&e->lock);
	o->sessions = e->n_sessions;
	o->turns_total = e->turns_total;
	o->prompt_tokens_total = e->prompt_tokens_total;
	o->generated_tokens_total = e->generated_tokens_total;
	o->steps_total = e->sched.steps;
	o->step_tokens_total = e->step_tokens_total;
	o->busy_seconds_total = e->busy_s;
	o->uptime_s = (double)(atlas_now_ns() - e->t_open_ns) * 1e-9;
	o->turns = e->turn_stats;
	fill_slots(e, o);
	fill_kv(e, &o->kv);
	spec_stats(e, &o->spec);
	pthread_mutex_unlock(&e->lock);
	return 0;
}
