/* Generated text: README, ctl/{slots,kv,spec,ep,engine,config} and a
 * session's status. One snapshot of the engine's stats per file, taken at
 * open. Conventions (DESIGN §2): one `key value` per line, base units,
 * ratios 0..1, a key alone when its value is empty. */
#include "fs/internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

static void kv_str(FILE *f, const char *key, const char *value)
{
	if (*value)
		fprintf(f, "%s %s\n", key, value);
	else
		fprintf(f, "%s\n", key);
}

static void kv_u64(FILE *f, const char *key, uint64_t v)
{
	fprintf(f, "%s %" PRIu64 "\n", key, v);
}

static void kv_dbl(FILE *f, const char *key, double v)
{
	fprintf(f, "%s %.6g\n", key, v);
}

/* Text of one line: line breaks of an engine message become spaces. */
static void one_line(char *dst, size_t len, const char *src)
{
	snprintf(dst, len, "%s", src);
	for (char *c = dst; *c; c++)
		if (*c == '\n' || *c == '\r')
			*c = ' ';
}

static void render_slots(FILE *f, const struct atlas_engine_stats *st)
{
	fprintf(f, "slot session state position kv_blocks_device kv_blocks_host kv_blocks_disk "
		   "draft_acceptance spec tokens_per_second\n");
	for (int i = 0; i < st->n_slots && i < ATLAS_MAX_SLOTS; i++) {
		const struct atlas_slot_stats *sl = &st->slots[i];
		fprintf(f, "%d %s %s %" PRIu64 " %u %u %u %.6g %s %.6g\n", sl->slot,
			sl->session[0] ? sl->session : "-", atlas_state_name(sl->state), sl->position,
			sl->kv_blocks[ATLAS_TIER_DEVICE], sl->kv_blocks[ATLAS_TIER_HOST],
			sl->kv_blocks[ATLAS_TIER_DISK], sl->draft_acceptance,
			sl->spec[0] ? sl->spec : "-", sl->tokens_per_s);
	}
}

static void render_kv(FILE *f, const struct atlas_kv_stats *kv)
{
	char key[64];
	kv_u64(f, "block_size_tokens", kv->block_size);
	kv_u64(f, "block_bytes", kv->bytes_per_block);
	for (int t = 0; t < ATLAS_TIERS; t++) {
		snprintf(key, sizeof key, "blocks_used_%s", atlas_tier_name((enum atlas_tier)t));
		kv_u64(f, key, kv->blocks_used[t]);
		snprintf(key, sizeof key, "blocks_capacity_%s", atlas_tier_name((enum atlas_tier)t));
		kv_u64(f, key, kv->blocks_total[t]);
	}
	kv_u64(f, "swap_out_bytes_total", kv->swap_out_bytes_total);
	kv_u64(f, "swap_in_bytes_total", kv->swap_in_bytes_total);
	kv_u64(f, "swap_out_ops_total", kv->swap_out_ops_total);
	kv_u64(f, "swap_in_ops_total", kv->swap_in_ops_total);
	kv_dbl(f, "read_latency_p50_seconds", kv->read_latency_p50_s);
	kv_dbl(f, "read_latency_p99_seconds", kv->read_latency_p99_s);
	kv_u64(f, "prefetch_hits_total", kv->prefetch_hits_total);
	kv_u64(f, "prefetch_misses_total", kv->prefetch_misses_total);
	kv_u64(f, "swap_errors_total", kv->swap_errors_total);
	kv_u64(f, "swap_drops_total", kv->swap_drops_total);
	kv_u64(f, "parked_sessions", kv->parked_sessions);
	kv_u64(f, "preemptions_total", kv->preemptions_total);
	kv_u64(f, "evictions_total", kv->evictions_total);
	kv_u64(f, "staged_blocks_total", kv->staged_blocks_total);
	kv_u64(f, "staged_bytes_total", kv->staged_bytes_total);
}

static void render_spec(FILE *f, const struct atlas_spec_stats *sp)
{
	char key[64];
	kv_str(f, "method", sp->method);
	kv_str(f, "draft_model", sp->draft_model[0] ? sp->draft_model : "-");
	kv_str(f, "mtp_head", sp->mtp_head ? "yes" : "no");
	kv_u64(f, "drafts_total", sp->drafts_total);
	kv_u64(f, "draft_tokens_total", sp->draft_tokens_total);
	kv_u64(f, "accepted_tokens_total", sp->accepted_tokens_total);
	for (int d = 0; d < ATLAS_SPEC_DRAFTERS; d++) {
		snprintf(key, sizeof key, "%s_drafts_total", sp->by_drafter[d].name);
		kv_u64(f, key, sp->by_drafter[d].drafts_total);
		snprintf(key, sizeof key, "%s_draft_tokens_total", sp->by_drafter[d].name);
		kv_u64(f, key, sp->by_drafter[d].draft_tokens_total);
		snprintf(key, sizeof key, "%s_accepted_tokens_total", sp->by_drafter[d].name);
		kv_u64(f, key, sp->by_drafter[d].accepted_tokens_total);
		snprintf(key, sizeof key, "%s_seconds_per_token", sp->by_drafter[d].name);
		kv_dbl(f, key, sp->by_drafter[d].seconds_per_token);
	}
	kv_u64(f, "draft_errors_total", sp->draft_errors_total);
	for (int i = 0; i < ATLAS_SPEC_POSITIONS; i++) {
		snprintf(key, sizeof key, "acceptance_position_%d", i + 1);
		kv_dbl(f, key, sp->acceptance_by_position[i]);
	}
	kv_dbl(f, "mean_accepted_length", sp->mean_accepted_length);
	kv_u64(f, "gated_total", sp->gated_total);
	kv_dbl(f, "step_seconds_decode", sp->step_seconds_decode);
	for (int i = 0; i < ATLAS_SPEC_POSITIONS; i++) {
		snprintf(key, sizeof key, "step_seconds_verify_%d", i + 1);
		kv_dbl(f, key, sp->step_seconds_verify[i]);
	}
}

static void render_ep(FILE *f, const struct atlas_ep_stats *ep)
{
	char key[64], line[512];
	kv_u64(f, "ranks", (uint64_t)ep->ranks);
	kv_u64(f, "hosts", (uint64_t)ep->hosts);
	kv_u64(f, "experts_per_rank", (uint64_t)ep->experts_per_rank);
	kv_str(f, "state", ep->up ? "up" : "down");
	if (!ep->up)
		kv_str(f, "why", ep->why);
	if (ep->ranks > 1) {
		kv_str(f, "address", ep->address);
		kv_u64(f, "epoch", ep->epoch);
	}
	kv_u64(f, "collectives_total", ep->collectives_total);
	kv_u64(f, "collective_bytes_total", ep->collective_bytes_total);
	kv_dbl(f, "collective_seconds_total", ep->collective_seconds_total);
	kv_u64(f, "commands_total", ep->commands_total);
	kv_u64(f, "command_bytes_total", ep->command_bytes_total);
	kv_u64(f, "epochs_lost_total", ep->epochs_lost_total);
	for (int r = 0; r < ep->ranks && ep->ranks > 1 && r < ATLAS_EP_RANKS; r++) {
		const struct atlas_ep_rank *k = &ep->rank[r];
		snprintf(key, sizeof key, "rank_%d", r);
		snprintf(line, sizeof line, "%s host=%s device=\"%s\" experts=%d-%d%s%s%s", k->state,
			 k->host[0] ? k->host : "-", k->device, k->expert_first, k->expert_last,
			 k->why[0] ? " why=\"" : "", k->why, k->why[0] ? "\"" : "");
		kv_str(f, key, line);
	}
}

static void render_engine(FILE *f, const struct atlas_engine_stats *st)
{
	kv_str(f, "model", st->model);
	kv_str(f, "architecture", st->architecture);
	kv_u64(f, "parameters", st->parameters);
	kv_str(f, "dtype", st->dtype);
	kv_str(f, "backend", st->backend);
	kv_str(f, "device", st->device);
	kv_u64(f, "memory_bytes", st->memory_total);
	kv_u64(f, "weights_bytes", st->weights_bytes);
	kv_u64(f, "kv_bytes", st->kv_bytes);
	kv_u64(f, "layers", (uint64_t)st->layers);
	kv_u64(f, "hidden_size", (uint64_t)st->hidden_size);
	kv_u64(f, "heads", (uint64_t)st->heads);
	kv_u64(f, "kv_heads", (uint64_t)st->kv_heads);
	kv_u64(f, "head_dim", (uint64_t)st->head_dim);
	kv_u64(f, "vocab_size", (uint64_t)st->vocab_size);
	kv_u64(f, "context_tokens", (uint64_t)st->context);
	kv_u64(f, "slots", (uint64_t)st->n_slots);
	kv_u64(f, "sessions", st->sessions);
	kv_u64(f, "turns_total", st->turns_total);
	kv_u64(f, "prompt_tokens_total", st->prompt_tokens_total);
	kv_u64(f, "generated_tokens_total", st->generated_tokens_total);
	kv_u64(f, "steps_total", st->steps_total);
	kv_u64(f, "step_tokens_total", st->step_tokens_total);
	kv_dbl(f, "busy_seconds_total", st->busy_seconds_total);
	kv_dbl(f, "uptime_seconds", st->uptime_s);
}

static void render_readme(FILE *f, const struct atlas_fs *fs, const struct atlas_engine_stats *st)
{
	const struct atlas_config *c = &fs->cfg;
	fprintf(f, "atlas: a language model served as files.\n\n");
	fprintf(f, "model     %s\n", st->model);
	fprintf(f, "          %s, %" PRIu64 " parameters, %s weights, %s backend on %s\n",
		st->architecture, st->parameters, st->dtype, st->backend, st->device);
	fprintf(f, "context   %d tokens per session\n", st->context);
	if (c->sessions > 0)
		fprintf(f, "sessions  s1 to s%d from the start, at most %d\n", c->sessions,
			c->max_sessions);
	else
		fprintf(f, "sessions  none from the start, at most %d\n", c->max_sessions);
	fprintf(f, "defaults  mode %s, temperature %g, top_p %g, top_k %d, max_tokens %d\n\n",
		atlas_mode_name(c->mode), (double)c->temperature, (double)c->top_p, c->top_k,
		c->max_tokens);
	fprintf(f,
		"Use:\n"
		"  echo 'Why is the sky blue?' > s1/in   commit a prompt (when the file is closed)\n"
		"  cat s1/out                            stream the answer; it ends with the turn\n"
		"  echo 'temperature 0' > s1/ctl         change a setting of s1\n"
		"  echo cancel > s1/ctl                  stop the running turn\n"
		"  echo reset > s1/ctl                   forget s1's history\n"
		"  mkdir NAME, rmdir NAME                make (yours) or remove a session\n\n"
		"A session directory:\n"
		"  in       write a prompt (UTF-8 text); it is committed at close. A write\n"
		"           fails with EBUSY while a turn runs, EFBIG past prompt_max, ENOSPC\n"
		"           when the mount's open prompts hold prompt_memory (or the\n"
		"           session's session_prompt_memory), EILSEQ for text\n"
		"           that is not UTF-8; then nothing of it is committed and\n"
		"           the turn a reader of out waits for fails, saying why\n"
		"  out      the newest turn's answer as a stream; a failed or cancelled turn\n"
		"           ends with an error (EIO, ECANCELED) after its text; `tail -f`\n"
		"           shows the turn that was newest when it started, then waits\n"
		"  ctl      settings, one `key value` per line; write lines to change them\n"
		"           (below); a bad line fails its write with EINVAL and reading\n"
		"           ctl back then ends with `# error: WHY`\n"
		"  history  every turn of the session; `tail -f s1/history` follows the\n"
		"           conversation; the oldest turns drop out past history_max\n"
		"  status   state, tokens, KV blocks, time to first token, tokens/s, last error\n\n");
	fprintf(f,
		"ctl settings and their values:\n"
		"  temperature  0 to 100 (0: greedy)   top_p       above 0, at most 1\n"
		"  top_k        0 (off) to 2^30        max_tokens  1 to 2^30\n"
		"  seed         0 to 2^64-1            mode        chat or raw\n"
		"  ignore_eos   0 or 1                 spec        off, auto, ngram, draft, mtp\n"
		"  spec_k       1 to %d\n"
		"  stop         one string per line, at most %d of %d bytes; `stop` alone clears\n"
		"  system       the system prompt of chat mode, at most %d bytes\n"
		"  (stop and system take the escapes \\n \\r \\t \\\\)\n"
		"  cancel       end the running turn;  reset  forget the history\n\n",
		ATLAS_SPEC_K_MAX, ATLAS_STOP_MAX, ATLAS_STOP_LEN - 1, ATLAS_SYSTEM_MAX - 1);
	fprintf(f,
		"ctl/:\n"
		"  slots    one line per engine slot\n"
		"  kv       KV cache blocks per tier and swapping\n"
		"  spec     speculative decoding\n"
		"  ep       expert parallelism\n"
		"  engine   model, backend, memory and totals\n"
		"  metrics  all of it in the Prometheus text format\n"
		"  config   the effective configuration\n");
}

static int render_config(const struct atlas_config *c, char **text, size_t *len)
{
	size_t n = atlas_config_format(c, false, NULL, 0);
	*text = malloc(n + 1);
	if (!*text)
		return -ENOMEM;
	*len = atlas_config_format(c, false, *text, n + 1);
	return 0;
}

int fs_render_node(struct atlas_fs *fs, enum fs_node node, char **text, size_t *len)
{
	if (node == NODE_CTL_CONFIG)
		return render_config(&fs->cfg, text, len);
	struct atlas_engine_stats *st = calloc(1, sizeof *st);
	if (!st)
		return -ENOMEM;
	int rc = atlas_engine_stats(fs->engine, st);
	if (rc < 0) {
		free(st);
		return rc;
	}
	if (node == NODE_CTL_METRICS) {
		rc = fs_render_metrics(st, text, len);
		free(st);
		return rc;
	}
	*text = NULL;
	FILE *f = open_memstream(text, len);
	if (!f) {
		free(st);
		return -ENOMEM;
	}
	switch (node) {
	case NODE_README:
		render_readme(f, fs, st);
		break;
	case NODE_CTL_SLOTS:
		render_slots(f, st);
		break;
	case NODE_CTL_KV:
		render_kv(f, &st->kv);
		break;
	case NODE_CTL_SPEC:
		render_spec(f, &st->spec);
		break;
	case NODE_CTL_EP:
		render_ep(f, &st->ep);
		break;
	case NODE_CTL_ENGINE:
		render_engine(f, st);
		break;
	default:
		rc = -ENOENT;
		break;
	}
	free(st);
	if (fclose(f) != 0 && !rc)
		rc = -ENOMEM;
	if (rc) {
		free(*text);
		*text = NULL;
	}
	return rc;
}

int fs_render_status(const struct atlas_session_status *st, char **text, size_t *len)
{
	char line[sizeof st->last_error];
	*text = NULL;
	FILE *f = open_memstream(text, len);
	if (!f)
		return -ENOMEM;
	kv_str(f, "state", atlas_state_name(st->state));
	fprintf(f, "slot %d\n", st->slot);
	kv_u64(f, "turns", st->turns);
	kv_u64(f, "prompt_tokens", st->prompt_tokens);
	kv_u64(f, "generated_tokens", st->generated_tokens);
	kv_u64(f, "context_tokens", st->context_tokens);
	kv_u64(f, "context_max", st->context_max);
	kv_u64(f, "kv_blocks_device", st->kv_blocks[ATLAS_TIER_DEVICE]);
	kv_u64(f, "kv_blocks_host", st->kv_blocks[ATLAS_TIER_HOST]);
	kv_u64(f, "kv_blocks_disk", st->kv_blocks[ATLAS_TIER_DISK]);
	kv_dbl(f, "ttft_seconds", st->ttft_s);
	kv_dbl(f, "tokens_per_second", st->tokens_per_s);
	one_line(line, sizeof line, st->finish);
	kv_str(f, "finish", line);
	one_line(line, sizeof line, st->last_error);
	kv_str(f, "last_error", line);
	if (fclose(f) != 0) {
		free(*text);
		*text = NULL;
		return -ENOMEM;
	}
	return 0;
}
