/* atlas bench's rows of speculative decoding (options --verify and
 * --spec-prompt of bench.c).
 *
 * verify: the executor alone, on the config's model or dummy shape: the
 * seconds of a step of B sequences that each feed one row and k drafts,
 * beside a decode step (k = 0, replayed from its CUDA graph where the
 * backend has them), at one context. The KV of the positions before the
 * step is never written: its values do not change the time. From the
 * ratio follows the speedup a session would see at acceptance rate a:
 * (1 + a + ... + a^k) tokens per step for ratio times a decode step.
 * With a draft_model, its own decode step at the same batch and context
 * is timed too ("draft"), and each verify row gets a "+draft" row: the
 * verify plus k draft steps, what a step of the draft-model drafter costs
 * (its catch-up feeds one row more per accepted draft: not counted).
 *
 * spec-prompt: a prompt from a file answered greedily by one session with
 * speculation off, then on (spec auto, as shipped, or the mode of --spec):
 * decode tokens per second of each, whether the two texts are the same, how
 * many drafts were accepted, and the engine's acceptance by draft position
 * so far (the share of the drafts at place j that were kept, of those
 * checked).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/err.h"
#include "engine/step/exec.h"
#include "tools/atlas/bench.h"
#include "tools/atlas/cli.h"

/* Draft counts one --verify list holds. */
#define MAX_VERIFY_KS 32

/* Steps timed per row, after the warm-up ones (the first records graphs). */
#define VERIFY_WARMUP 3
#define VERIFY_STEPS 20

static const double verify_rates[] = { 0.6, 0.8, 0.9 };

/* The command of `batch` sequences at position context, each 1 + k rows
 * that all draw greedily. */
static int lay_out(struct exec *x, struct seq *seqs, int batch, int context, int k,
		   struct step_cmd *c)
{
	c->n_seqs = c->n_rows = c->n_out = c->n_table = 0;
	for (int i = 0; i < batch; i++) {
		const int n = 1 + k;
		int blocks = seq_resolve(&x->pool, &seqs[i], context + n, c->tables + c->n_table,
					 x->lim.max_table - c->n_table);
		if (blocks < 0)
			return blocks;
		c->seqs[c->n_seqs++] = (struct step_seq){ .slot = i, .row = c->n_rows, .n_rows = n,
							  .pos0 = context, .table = c->n_table,
							  .n_blocks = blocks, .state_slot = -1 };
		c->n_table += blocks;
		for (int r = 0; r < n; r++, c->n_rows++) {
			c->ids[c->n_rows] = (int32_t)((7919u * (unsigned)(i + r + 1)) %
						      (unsigned)x->geo.vocab);
			c->out[c->n_out++] = (struct step_out){ .row = c->n_rows, .sample = 1,
								.params = { .top_p = 1, .u = 0.5f } };
		}
	}
	c->number++;
	return 0;
}

static int time_steps(struct exec *x, const struct step_cmd *c, double *seconds, char *err,
		      size_t errlen)
{
	struct step_result res;
	int rc;
	for (int i = 0; i < VERIFY_WARMUP; i++)
		if ((rc = exec_run(x, c, &res, err, errlen)))
			return rc;
	const double t0 = atlas_now_s();
	for (int i = 0; i < VERIFY_STEPS; i++)
		if ((rc = exec_run(x, c, &res, err, errlen)))
			return rc;
	*seconds = (atlas_now_s() - t0) / VERIFY_STEPS;
	return 0;
}

static void print_verify(const char *what, int batch, int context, int k, double t, double t0,
			 FILE *table, FILE *csv)
{
	double speedup[ATLAS_ARRAY_LEN(verify_rates)];
	for (size_t j = 0; j < ATLAS_ARRAY_LEN(verify_rates); j++) {
		double tokens = 1, a = 1;
		for (int i = 0; i < k; i++)
			tokens += (a *= verify_rates[j]);
		speedup[j] = tokens * t0 / t;
	}
	if (table && !strcmp(what, "draft"))
		fprintf(table, "%-8s %6d %8d %7s %10.3f %9.3f %9s %9s %9s\n", what, batch, context,
			"-", t * 1e3, t / t0, "-", "-", "-");
	else if (table)
		fprintf(table, "%-8s %6d %8d %7d %10.3f %9.3f %9.2f %9.2f %9.2f\n", what, batch,
			context, k, t * 1e3, t / t0, speedup[0], speedup[1], speedup[2]);
	if (csv)
		fprintf(csv, "%s,%d,%d,%d,%.6g,%.6g,%.4g,%.4g,%.4g\n", what, batch, context, k, t,
			t / t0, speedup[0], speedup[1], speedup[2]);
}

/* Seconds of a step of `batch` sequences at `context`, each feeding one
 * row (t[0]) and one row and ks[i] drafts (t[1 + i]), on model dir. */
static int time_verify(const struct atlas_config *cfg, const char *dir, int batch, int context,
		       const int *ks, int n_ks, double *t, char *err, size_t errlen)
{
	struct atlas_config c0 = *cfg;
	snprintf(c0.model, sizeof c0.model, "%s", dir);
	const struct step_limits lim = { .max_seqs = batch,
					 .max_rows = batch * (ATLAS_SPEC_K_MAX + 1),
					 .max_out = batch * (ATLAS_SPEC_K_MAX + 1) };
	struct exec *x;
	int rc = exec_open(&c0, EXEC_MODEL, batch, &lim, &x, err, errlen);
	if (rc)
		return rc;
	struct seq *seqs = calloc((size_t)batch, sizeof *seqs);
	struct step_cmd c = { 0 };
	rc = seqs && !step_cmd_alloc(&c, &x->lim) ? 0 : atlas_errf(err, errlen, -ENOMEM,
								   "out of memory");
	for (int i = 0; seqs && i < batch; i++)
		seq_init(&seqs[i]);
	if (!rc && context + ATLAS_SPEC_K_MAX + 1 > x->geo.context)
		rc = atlas_errf(err, errlen, -EINVAL, "%s: context %d and a verify of %d rows do not "
				"fit the model's %d positions", dir, context, ATLAS_SPEC_K_MAX + 1,
				x->geo.context);
	for (int i = 0; !rc && i < batch; i++) {
		if (seq_reserve(&x->pool, &seqs[i], context + ATLAS_SPEC_K_MAX + 1))
			rc = atlas_errf(err, errlen, -ENOSPC, "%s: %d sequences of %d tokens do not "
					"fit the KV pool of %d blocks", dir, batch,
					context + ATLAS_SPEC_K_MAX + 1, x->pool.kv.n_blocks);
		seq_commit(&seqs[i], context);
	}
	for (int i = -1; !rc && i < n_ks; i++)
		if (!(rc = lay_out(x, seqs, batch, context, i < 0 ? 0 : ks[i], &c)))
			rc = time_steps(x, &c, &t[i + 1], err, errlen);
	for (int i = 0; seqs && i < batch; i++)
		seq_free(&x->pool, &seqs[i]);
	free(seqs);
	step_cmd_free(&c);
	exec_close(x);
	return rc;
}

int bench_verify(const char *cmd, const struct atlas_config *cfg, int batch, int context,
		 const int *ks, int n_ks, bool header, FILE *table, FILE *csv)
{
	char err[ATLAS_ERRLEN];
	double t[1 + MAX_VERIFY_KS], t_draft = 0;
	/* The draft model's decode step, measured alone before the model is
	 * loaded: a draft token costs about one such step. */
	if (cfg->draft_model[0] &&
	    time_verify(cfg, cfg->draft_model, batch, context, NULL, 0, &t_draft, err, sizeof err))
		return cli_fail(cmd, "verify: draft_model: %s", err);
	if (n_ks > MAX_VERIFY_KS)
		return cli_fail(cmd, "verify: at most %d draft counts", MAX_VERIFY_KS);
	if (time_verify(cfg, atlas_config_model_dir(cfg), batch, context, ks, n_ks, t, err,
			sizeof err))
		return cli_fail(cmd, "verify: %s", err);
	if (header) {
		if (table)
			fprintf(table, "\n%-8s %6s %8s %7s %10s %9s %9s %9s %9s\n", "step", "batch",
				"context", "drafts", "ms/step", "x decode", "at 0.6", "at 0.8",
				"at 0.9");
		if (csv)
			fprintf(csv, "step,batch,context,drafts,seconds,x_decode,speedup_0.6,"
				     "speedup_0.8,speedup_0.9\n");
	}
	print_verify("decode", batch, context, 0, t[0], t[0], table, csv);
	if (t_draft > 0)
		print_verify("draft", batch, context, 0, t_draft, t[0], table, csv);
	for (int i = 0; i < n_ks; i++) {
		print_verify("verify", batch, context, ks[i], t[i + 1], t[0], table, csv);
		if (t_draft > 0)
			print_verify("+draft", batch, context, ks[i], t[i + 1] + ks[i] * t_draft,
				     t[0], table, csv);
	}
	return 0;
}

/* The whole of a small file, NUL-terminated. */
static char *read_text(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	char *buf = NULL;
	size_t cap = 0, n = 0, got;
	do {
		if (n + 4096 + 1 > cap) {
			char *p = realloc(buf, cap = 2 * cap + 4096 + 1);
			if (!p) {
				free(buf);
				fclose(f);
				return NULL;
			}
			buf = p;
		}
		n += got = fread(buf + n, 1, cap - n - 1, f);
	} while (got > 0);
	fclose(f);
	buf[n] = 0;
	*len = n;
	return buf;
}

struct spec_run {
	double tokens_per_s;
	uint64_t drafted, accepted;
	double by_position[ATLAS_SPEC_POSITIONS];  /* the engine's, after this run */
	int spec_k;                                /* the session's most drafts a step */
	char *text;
};

/* One turn of the prompt with spec set to mode; the answer's text. */
static int answer(const char *cmd, struct atlas_engine *e, struct cli_waiter *w, int number,
		  const char *prompt, size_t len, int max_tokens, enum atlas_spec mode,
		  struct spec_run *out)
{
	char err[ATLAS_ERRLEN], name[32];
	struct atlas_session *s;
	struct atlas_engine_stats *st = malloc(sizeof *st);
	if (!st)
		return cli_fail(cmd, "out of memory");
	snprintf(name, sizeof name, "spec%d", number);
	int status = atlas_session_open(e, name, &s, err, sizeof err) ? cli_fail(cmd, "%s", err) : 0;
	if (status) {
		free(st);
		return status;
	}
	struct atlas_params p;
	atlas_session_get_params(s, &p);
	p.temperature = 0;
	p.mode = ATLAS_MODE_RAW;
	p.ignore_eos = true;
	p.n_stop = 0;
	p.max_tokens = max_tokens;
	p.spec = mode;
	atlas_engine_stats(e, st);
	const uint64_t drafted = st->spec.draft_tokens_total, accepted = st->spec.accepted_tokens_total;
	if (atlas_session_set_params(s, &p, err, sizeof err) ||
	    atlas_session_submit(s, prompt, len, err, sizeof err) < 0)
		status = cli_fail(cmd, "%s", err);
	struct atlas_session_status ss;
	while (!status) {
		const uint64_t seen = cli_waiter_events(w);
		atlas_session_status(s, &ss);
		if (!strcmp(ss.finish, "error") || !strcmp(ss.finish, "cancelled"))
			status = cli_fail(cmd, "%s", ss.last_error[0] ? ss.last_error : ss.finish);
		else if (ss.finish[0])
			break;
		else
			cli_waiter_wait(w, seen);
	}
	size_t n;
	if (!status && atlas_session_history(s, &out->text, &n))
		status = cli_fail(cmd, "out of memory");
	if (!status) {
		atlas_engine_stats(e, st);
		out->tokens_per_s = ss.tokens_per_s;
		out->drafted = st->spec.draft_tokens_total - drafted;
		out->accepted = st->spec.accepted_tokens_total - accepted;
		memcpy(out->by_position, st->spec.acceptance_by_position, sizeof out->by_position);
		out->spec_k = p.spec_k;
	}
	atlas_session_close(s);
	free(st);
	return status;
}

int bench_spec_prompt(const char *cmd, struct atlas_engine *e, struct cli_waiter *w,
		      const char *path, int max_tokens, enum atlas_spec mode, bool header,
		      FILE *table, FILE *csv)
{
	static int number;
	size_t len;
	char *prompt = read_text(path, &len);
	if (!prompt)
		return cli_fail(cmd, "%s: %s", path, strerror(errno));
	struct spec_run off = { 0 }, on = { 0 };
	int status = answer(cmd, e, w, ++number, prompt, len, max_tokens, ATLAS_SPEC_OFF, &off);
	if (!status)
		status = answer(cmd, e, w, ++number, prompt, len, max_tokens, mode, &on);
	if (!status) {
		const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
		const bool same = !strcmp(off.text, on.text);
		const double acc = on.drafted ? (double)on.accepted / (double)on.drafted : 0;
		const double speedup = off.tokens_per_s > 0 ? on.tokens_per_s / off.tokens_per_s : 0;
		if (table && header)
			fprintf(table, "\n%-24s %7s %10s %10s %8s %9s %9s %5s\n", "spec-prompt",
				"tokens", "off tok/s", "on tok/s", "speedup", "drafted", "accepted",
				"same");
		if (table)
			fprintf(table, "%-24.24s %7d %10.1f %10.1f %8.2f %9llu %8.0f%% %5s\n", base,
				max_tokens, off.tokens_per_s, on.tokens_per_s, speedup,
				(unsigned long long)on.drafted, 100 * acc, same ? "yes" : "NO");
		if (table && on.drafted) {
			fprintf(table, "%-24s acceptance by draft position:", "");
			for (int j = 0; j < on.spec_k && j < ATLAS_SPEC_POSITIONS; j++)
				fprintf(table, " %d: %.0f%%", j + 1, 100 * on.by_position[j]);
			fputc('\n', table);
		}
		if (csv && header)
			fprintf(csv, "spec_prompt,tokens,off_tokens_per_s,on_tokens_per_s,speedup,"
				     "drafted,acceptance,same\n");
		if (csv)
			fprintf(csv, "%s,%d,%.6g,%.6g,%.4g,%llu,%.4g,%d\n", base, max_tokens,
				off.tokens_per_s, on.tokens_per_s, speedup,
				(unsigned long long)on.drafted, acc, same);
		if (!same) {
			size_t at = 0;
			while (off.text[at] && off.text[at] == on.text[at])
				at++;
			fprintf(stderr, "%s: %s: the answers differ from byte %zu of the transcript "
				"(bitwise equal on the cpu backend; on cuda a verify row's logits "
				"differ from a decode row's within the backend's tolerance, which can "
				"flip a near tie)\n", cmd, path, at);
		}
	}
	free(off.text);
	free(on.text);
	free(prompt);
	return status;
}
