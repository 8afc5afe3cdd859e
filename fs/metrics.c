/* ctl/metrics: the engine's stats in the Prometheus text exposition format
 * 0.0.4. Names carry the atlas_ prefix and base units (seconds, bytes,
 * tokens); counters end in _total and nothing else does; the turns'
 * latencies are histograms named as vLLM's. */
#include "fs/internal.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static void family(FILE *f, const char *name, const char *type, const char *help)
{
	fprintf(f, "# HELP atlas_%s %s\n# TYPE atlas_%s %s\n", name, help, name, type);
}

/* A label value with \, " and line breaks escaped. */
static void label_value(FILE *f, const char *v)
{
	fputc('"', f);
	for (; *v; v++) {
		if (*v == '\\' || *v == '"')
			fprintf(f, "\\%c", *v);
		else if (*v == '\n')
			fputs("\\n", f);
		else
			fputc(*v, f);
	}
	fputc('"', f);
}

static void value_dbl(FILE *f, double v)
{
	if (isnan(v))
		fputs(" NaN\n", f);
	else if (isinf(v))
		fputs(v > 0 ? " +Inf\n" : " -Inf\n", f);
	else
		fprintf(f, " %.17g\n", v);
}

static void sample_u64(FILE *f, const char *name, uint64_t v)
{
	fprintf(f, "atlas_%s %" PRIu64 "\n", name, v);
}

static void sample_dbl(FILE *f, const char *name, double v)
{
	fprintf(f, "atlas_%s", name);
	value_dbl(f, v);
}

static void gauge_u64(FILE *f, const char *name, const char *help, uint64_t v)
{
	family(f, name, "gauge", help);
	sample_u64(f, name, v);
}

static void gauge_dbl(FILE *f, const char *name, const char *help, double v)
{
	family(f, name, "gauge", help);
	sample_dbl(f, name, v);
}

static void counter_u64(FILE *f, const char *name, const char *help, uint64_t v)
{
	family(f, name, "counter", help);
	sample_u64(f, name, v);
}

static void counter_dbl(FILE *f, const char *name, const char *help, double v)
{
	family(f, name, "counter", help);
	sample_dbl(f, name, v);
}

static void engine_metrics(FILE *f, const struct atlas_engine_stats *st)
{
	family(f, "engine_info", "gauge", "Model and backend of the engine (value 1).");
	fputs("atlas_engine_info{model=", f);
	label_value(f, st->model);
	fputs(",architecture=", f);
	label_value(f, st->architecture);
	fputs(",dtype=", f);
	label_value(f, st->dtype);
	fputs(",backend=", f);
	label_value(f, st->backend);
	fputs(",device=", f);
	label_value(f, st->device);
	fputs("} 1\n", f);
	gauge_u64(f, "model_parameters", "Parameters of the model.", st->parameters);
	gauge_u64(f, "model_layers", "Layers of the model.", (uint64_t)st->layers);
	gauge_u64(f, "context_tokens", "Tokens of one session's context.", (uint64_t)st->context);
	gauge_u64(f, "memory_bytes", "Memory of the device.", st->memory_total);
	gauge_u64(f, "weights_bytes", "Memory held by the weights.", st->weights_bytes);
	gauge_u64(f, "kv_bytes", "Memory held by the KV cache.", st->kv_bytes);
	gauge_u64(f, "slots", "Engine slots (sequences in one step).", (uint64_t)st->n_slots);
	gauge_u64(f, "sessions", "Open sessions.", st->sessions);
	counter_u64(f, "turns_total", "Turns submitted.", st->turns_total);
	counter_u64(f, "prompt_tokens_total", "Prompt tokens prefilled.", st->prompt_tokens_total);
	counter_u64(f, "generated_tokens_total", "Tokens generated.", st->generated_tokens_total);
	counter_u64(f, "steps_total", "Engine steps run.", st->steps_total);
	counter_u64(f, "step_tokens_total", "Tokens fed to engine steps.", st->step_tokens_total);
	counter_dbl(f, "busy_seconds_total", "Time the engine thread spent in steps.",
		    st->busy_seconds_total);
	gauge_dbl(f, "uptime_seconds", "Time since the engine started.", st->uptime_s);
}

static void slot_label(FILE *f, const char *name, const struct atlas_slot_stats *sl)
{
	fprintf(f, "atlas_%s{slot=\"%d\"}", name, sl->slot);
}

static void slot_metrics(FILE *f, const struct atlas_engine_stats *st)
{
	int n = st->n_slots < ATLAS_MAX_SLOTS ? st->n_slots : ATLAS_MAX_SLOTS;
	family(f, "slot_info", "gauge", "Session and state of each engine slot (value 1).");
	for (int i = 0; i < n; i++) {
		fprintf(f, "atlas_slot_info{slot=\"%d\",session=", st->slots[i].slot);
		label_value(f, st->slots[i].session);
		fputs(",state=", f);
		label_value(f, atlas_state_name(st->slots[i].state));
		fputs("} 1\n", f);
	}
	family(f, "slot_position_tokens", "gauge", "Tokens in the KV of each slot's sequence.");
	for (int i = 0; i < n; i++) {
		slot_label(f, "slot_position_tokens", &st->slots[i]);
		fprintf(f, " %" PRIu64 "\n", st->slots[i].position);
	}
	family(f, "slot_kv_blocks", "gauge", "KV blocks held by each slot, per tier.");
	for (int i = 0; i < n; i++)
		for (int t = 0; t < ATLAS_TIERS; t++)
			fprintf(f, "atlas_slot_kv_blocks{slot=\"%d\",tier=\"%s\"} %u\n",
				st->slots[i].slot, atlas_tier_name((enum atlas_tier)t),
				st->slots[i].kv_blocks[t]);
	family(f, "slot_draft_acceptance_ratio", "gauge",
	       "Share of draft tokens accepted in each slot (0..1).");
	for (int i = 0; i < n; i++) {
		slot_label(f, "slot_draft_acceptance_ratio", &st->slots[i]);
		value_dbl(f, st->slots[i].draft_acceptance);
	}
	family(f, "slot_tokens_per_second", "gauge", "Decode rate of each slot.");
	for (int i = 0; i < n; i++) {
		slot_label(f, "slot_tokens_per_second", &st->slots[i]);
		value_dbl(f, st->slots[i].tokens_per_s);
	}
}

static void tier_family(FILE *f, const char *name, const char *help, const uint64_t *v)
{
	family(f, name, "gauge", help);
	for (int t = 0; t < ATLAS_TIERS; t++)
		fprintf(f, "atlas_%s{tier=\"%s\"} %" PRIu64 "\n", name,
			atlas_tier_name((enum atlas_tier)t), v[t]);
}

static void kv_metrics(FILE *f, const struct atlas_kv_stats *kv)
{
	gauge_u64(f, "kv_block_size_tokens", "Tokens per KV block.", kv->block_size);
	gauge_u64(f, "kv_block_bytes", "Bytes of one KV block.", kv->bytes_per_block);
	tier_family(f, "kv_blocks_used", "KV blocks in use, per tier.", kv->blocks_used);
	tier_family(f, "kv_blocks_capacity", "KV blocks available, per tier.", kv->blocks_total);
	counter_u64(f, "kv_swap_out_bytes_total", "Bytes of KV swapped out.",
		    kv->swap_out_bytes_total);
	counter_u64(f, "kv_swap_in_bytes_total", "Bytes of KV swapped in.", kv->swap_in_bytes_total);
	counter_u64(f, "kv_swap_out_operations_total", "KV swap-out operations.",
		    kv->swap_out_ops_total);
	counter_u64(f, "kv_swap_in_operations_total", "KV swap-in operations.",
		    kv->swap_in_ops_total);
	family(f, "kv_read_latency_seconds", "gauge", "Latency of swap-tier reads, by quantile.");
	fputs("atlas_kv_read_latency_seconds{quantile=\"0.5\"}", f);
	value_dbl(f, kv->read_latency_p50_s);
	fputs("atlas_kv_read_latency_seconds{quantile=\"0.99\"}", f);
	value_dbl(f, kv->read_latency_p99_s);
	counter_u64(f, "kv_prefetch_hits_total",
		    "Turns whose KV a prefetch hint had brought back to the device.",
		    kv->prefetch_hits_total);
	counter_u64(f, "kv_prefetch_misses_total",
		    "Hinted turns whose KV was not back on the device yet.",
		    kv->prefetch_misses_total);
	counter_u64(f, "kv_swap_errors_total",
		    "Block moves of the swap tier that failed (a write keeps its source).",
		    kv->swap_errors_total);
	counter_u64(f, "kv_swap_drops_total",
		    "Sequences whose KV was dropped because the swap tier could not take it.",
		    kv->swap_drops_total);
	gauge_u64(f, "kv_parked_sessions", "Sessions with KV in the swap tier or preempted.",
		  kv->parked_sessions);
	counter_u64(f, "kv_preemptions_total",
		    "Running sequences that gave their KV back to make room.",
		    kv->preemptions_total);
	counter_u64(f, "kv_evictions_total",
		    "Idle sessions that gave their KV back to make room.", kv->evictions_total);
	counter_u64(f, "kv_staged_blocks_total",
		    "KV blocks attention streamed from the host tier through staging, per step.",
		    kv->staged_blocks_total);
	counter_u64(f, "kv_staged_bytes_total",
		    "Bytes of KV attention streamed from the host tier through staging.",
		    kv->staged_bytes_total);
}

static void spec_metrics(FILE *f, const struct atlas_spec_stats *sp)
{
	family(f, "spec_info", "gauge", "Speculative decoding method (value 1).");
	fputs("atlas_spec_info{method=", f);
	label_value(f, sp->method);
	fputs("} 1\n", f);
	counter_u64(f, "spec_drafts_total", "Drafts proposed.", sp->drafts_total);
	counter_u64(f, "spec_draft_tokens_total", "Draft tokens proposed.", sp->draft_tokens_total);
	counter_u64(f, "spec_accepted_tokens_total", "Draft tokens accepted.",
		    sp->accepted_tokens_total);
	family(f, "spec_drafter_drafts_total", "counter", "Drafts proposed, by drafter.");
	for (int d = 0; d < ATLAS_SPEC_DRAFTERS; d++) {
		fputs("atlas_spec_drafter_drafts_total{drafter=", f);
		label_value(f, sp->by_drafter[d].name);
		fprintf(f, "} %llu\n", (unsigned long long)sp->by_drafter[d].drafts_total);
	}
	family(f, "spec_drafter_accepted_tokens_total", "counter",
	       "Draft tokens accepted, by drafter.");
	for (int d = 0; d < ATLAS_SPEC_DRAFTERS; d++) {
		fputs("atlas_spec_drafter_accepted_tokens_total{drafter=", f);
		label_value(f, sp->by_drafter[d].name);
		fprintf(f, "} %llu\n", (unsigned long long)sp->by_drafter[d].accepted_tokens_total);
	}
	family(f, "spec_drafter_seconds_per_token", "gauge",
	       "A drafter's measured seconds per draft token of one session (0: none).");
	for (int d = 0; d < ATLAS_SPEC_DRAFTERS; d++) {
		fputs("atlas_spec_drafter_seconds_per_token{drafter=", f);
		label_value(f, sp->by_drafter[d].name);
		fputc('}', f);
		value_dbl(f, sp->by_drafter[d].seconds_per_token);
	}
	counter_u64(f, "spec_draft_errors_total",
		    "Drafter model runs that failed; their sessions decoded without drafts.",
		    sp->draft_errors_total);
	family(f, "spec_acceptance_ratio", "gauge",
	       "Share of drafts accepted at each draft position (0..1).");
	for (int i = 0; i < ATLAS_SPEC_POSITIONS; i++) {
		fprintf(f, "atlas_spec_acceptance_ratio{position=\"%d\"}", i + 1);
		value_dbl(f, sp->acceptance_by_position[i]);
	}
	gauge_dbl(f, "spec_mean_accepted_length_tokens", "Mean tokens accepted per draft.",
		  sp->mean_accepted_length);
	counter_u64(f, "spec_gated_total",
		    "Decode steps whose drafts the gate held back (they would not pay).",
		    sp->gated_total);
	gauge_dbl(f, "spec_step_decode_seconds",
		  "The gate's measured seconds of a step of one decode row.",
		  sp->step_seconds_decode);
	family(f, "spec_step_verify_seconds", "gauge",
	       "The gate's measured seconds of a step of one row and k drafts (0: not measured).");
	for (int i = 0; i < ATLAS_SPEC_POSITIONS; i++) {
		fprintf(f, "atlas_spec_step_verify_seconds{drafts=\"%d\"}", i + 1);
		value_dbl(f, sp->step_seconds_verify[i]);
	}
}

static void ep_metrics(FILE *f, const struct atlas_ep_stats *ep)
{
	gauge_u64(f, "ep_ranks", "Expert-parallel ranks.", (uint64_t)ep->ranks);
	gauge_u64(f, "ep_hosts", "Hosts of the expert-parallel ranks.", (uint64_t)ep->hosts);
	gauge_u64(f, "ep_experts_per_rank", "Experts held by each rank.",
		  (uint64_t)ep->experts_per_rank);
	counter_u64(f, "ep_collectives_total", "Collective operations run.", ep->collectives_total);
	counter_dbl(f, "ep_collective_seconds_total", "Time spent in collective operations.",
		    ep->collective_seconds_total);
	counter_u64(f, "ep_collective_bytes_total", "Bytes reduced by collective operations.",
		    ep->collective_bytes_total);
	gauge_u64(f, "ep_up", "1 while every expert-parallel rank is in the running epoch.",
		  ep->up ? 1 : 0);
	counter_u64(f, "ep_commands_total", "Step commands sent to the workers.",
		    ep->commands_total);
	counter_u64(f, "ep_epochs_lost_total", "Times a rank was lost and the group restarted.",
		    ep->epochs_lost_total);
}

static void histogram(FILE *f, const char *name, const char *help, const struct atlas_lat_hist *h)
{
	family(f, name, "histogram", help);
	uint64_t below = 0;
	for (int i = 0; i < ATLAS_LAT_BUCKETS; i++) {
		below += h->bucket[i];
		if (i < ATLAS_LAT_BUCKETS - 1)
			fprintf(f, "atlas_%s_bucket{le=\"%g\"} %" PRIu64 "\n", name, atlas_lat_bounds[i],
				below);
		else
			fprintf(f, "atlas_%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name, below);
	}
	fprintf(f, "atlas_%s_sum", name);
	value_dbl(f, h->sum_s);
	fprintf(f, "atlas_%s_count %" PRIu64 "\n", name, h->count);
}

static void turn_metrics(FILE *f, const struct atlas_turn_stats *t)
{
	histogram(f, "time_to_first_token_seconds",
		  "Time from a prompt's commit to its turn's first token.", &t->ttft);
	histogram(f, "inter_token_latency_seconds", "Time between two tokens of a turn.", &t->itl);
	histogram(f, "request_queue_time_seconds",
		  "Time from a prompt's commit to the first engine step of its turn.", &t->queue);
	family(f, "turns_finished_total", "counter", "Turns ended, by how they ended.");
	for (int i = 0; i < ATLAS_FINISH_N; i++)
		fprintf(f, "atlas_turns_finished_total{finished_reason=\"%s\"} %" PRIu64 "\n",
			atlas_finish_names[i], t->finished[i]);
}

int fs_render_metrics(const struct atlas_engine_stats *st, char **text, size_t *len)
{
	*text = NULL;
	FILE *f = open_memstream(text, len);
	if (!f)
		return -ENOMEM;
	engine_metrics(f, st);
	slot_metrics(f, st);
	kv_metrics(f, &st->kv);
	spec_metrics(f, &st->spec);
	ep_metrics(f, &st->ep);
	turn_metrics(f, &st->turns);
	if (fclose(f) != 0) {
		free(*text);
		*text = NULL;
		return -ENOMEM;
	}
	return 0;
}
