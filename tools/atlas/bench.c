/* atlas bench: prefill and decode throughput of the engine, decode over a
 * sweep of batch sizes (concurrent sessions) at a short and a long context,
 * against the device's bandwidth bound (bench_report.c). Prompts are
 * deterministic pseudo-random token ids, so that no tokenizer is needed and
 * runs compare; --dummy-weights needs no model files either. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/clock.h"
#include "common/log.h"
#include "engine/engine.h"
#include "tools/atlas/bench.h"
#include "tools/atlas/cli.h"

/* Context of the short decode runs: prompts this long, so that decode reads
 * mostly weights. */
#define SHORT_CONTEXT 32
#define MAX_POINTS 32

static const char usage[] =
	"usage: atlas bench [OPTIONS]\n"
	"\n"
	"Measure prefill throughput (a prompt of N token ids, max_tokens 1: N over the\n"
	"time to its first token) and decode throughput (B sessions at once, greedy\n"
	"unless --temperature, ignore_eos: each first prefills its context, then all\n"
	"generate together; tokens generated over the time from the step where every\n"
	"one has its first token to the end of the last). Decode runs at a short\n"
	"context (32) and at --context.\n"
	"Decode rows also give the bytes read per token and the share of the bound that\n"
	"the device's measured copy bandwidth sets. On a GPU whose driver reports its\n"
	"power (NVML, sampled every 5 ms), prefill and decode rows of 50 ms or more\n"
	"also give its mean power, joules a token, mean SM clock and the share of\n"
	"samples with the clock held back for power (at the board's limit a kernel\n"
	"that finishes sooner may only slow the others). max_batch and\n"
	"max_sessions are raised to the largest batch if needed. A row whose KV cannot\n"
	"fit the pool (and the host tier) or the context is skipped, saying so, instead\n"
	"of run. The defaults suit the backend: a GPU's are given below, the cpu's in\n"
	"brackets.\n"
	"On a terminal, stderr shows the progress of the row that runs.\n"
	"\n"
	CLI_CONFIG_HELP
	"  --dummy-weights     random weights of a known shape instead of model files\n"
	"  --arch A            with --dummy-weights: qwen3 (default), qwen3.5, llama or atlas\n"
	"                      (qwen3 --shape 30b-a3b, 235b-a22b-8l: Qwen3-MoE; qwen3\n"
	"                      --shape next-80b-a3b-20l, qwen3.5 --shape 35b-a3b-32l: hybrid)\n"
	"  --shape S           with --dummy-weights: qwen3 0.6b 1.7b 4b 8b 14b,\n"
	"                      llama 3.2-1b 3.2-3b 3.1-8b, atlas tiny (default 0.6b)\n"
	"  --prompt-tokens N,...\n"
	"                      prompt lengths for prefill (default 512,2048,8192 [128,512])\n"
	"  --prefill-runs N    timed prefills of each length, the median reported; above 1\n"
	"                      one more runs first, not reported: the first prompt of a\n"
	"                      length pays for what is set up once (default 3 [1])\n"
	"  --gen-tokens N      tokens each decode session generates, >= 2 (default 128 [32])\n"
	"  --batch B,...       decode batch sizes at the short context (default\n"
	"                      1,8,32,64,128 [1,4,8])\n"
	"  --context N         the long context of decode, 0 for none (default 8192 [1024])\n"
	"  --context-batch B,...\n"
	"                      decode batch sizes at the long context (default\n"
	"                      1,8,32,64,128 [1,4])\n"
	"  --resume N,...      the swap tier: a session of N tokens is pushed out of the\n"
	"                      device's KV pool by a second one, then its next turn brings\n"
	"                      its KV back: resume (time to that turn's first token, from\n"
	"                      the tier named) beside prefill (recomputing the N tokens).\n"
	"                      Needs kv_memory holding N to `context` tokens and a\n"
	"                      [swap] tier; runs only these rows\n"
	"  --verify K,...      verify steps of K drafts per session beside a decode\n"
	"                      step, at the batch sizes of --verify-batch (default 1,32)\n"
	"                      and --verify-context (default 512), on the executor alone;\n"
	"                      runs only these rows; with -o draft_model=DIR, also the\n"
	"                      draft model's decode step and each verify plus K of them\n"
	"  --verify-batch B,...\n"
	"  --verify-context N\n"
	"  --spec-prompt FILE  answer the text in FILE greedily (--gen-tokens tokens) with\n"
	"                      speculation off, then on (spec auto, or --spec): tokens\n"
	"                      per second, acceptance, acceptance by draft position;\n"
	"                      repeatable; runs only these rows\n"
	"  --spec MODE         speculative decoding of the prefill and decode rows'\n"
	"                      sessions: off (default), auto, ngram or draft\n"
	"  --temperature X     the decode rows' sessions sample at temperature X, each\n"
	"                      with its own seed (default 0: greedy)\n"
	"  --top-p X           with --temperature: their top_p (default 1: off)\n"
	"  --top-k N           with --temperature: their top_k (default 0: off). A new\n"
	"                      session of the mount samples with the config's\n"
	"                      temperature, top_p and top_k (atlas config)\n"
	"  --csv               print CSV instead of a table\n"
	"  --csv-out FILE      write CSV to FILE as well as the table\n"
	"  -h, --help          show this help\n";

enum {
	OPT_PROMPT_TOKENS = OPT_FIRST_OWN, OPT_GEN_TOKENS, OPT_BATCH, OPT_CSV, OPT_DUMMY, OPT_ARCH,
	OPT_SHAPE, OPT_CONTEXT, OPT_CONTEXT_BATCH, OPT_CSV_OUT, OPT_RESUME, OPT_VERIFY,
	OPT_VERIFY_BATCH, OPT_VERIFY_CONTEXT, OPT_SPEC_PROMPT, OPT_SPEC, OPT_PREFILL_RUNS,
	OPT_TEMPERATURE, OPT_TOP_P, OPT_TOP_K,
};

static const struct option options[] = {
	CLI_CONFIG_OPTIONS,
	{ "prompt-tokens", required_argument, NULL, OPT_PROMPT_TOKENS },
	{ "prefill-runs", required_argument, NULL, OPT_PREFILL_RUNS },
	{ "gen-tokens", required_argument, NULL, OPT_GEN_TOKENS },
	{ "batch", required_argument, NULL, OPT_BATCH },
	{ "context", required_argument, NULL, OPT_CONTEXT },
	{ "context-batch", required_argument, NULL, OPT_CONTEXT_BATCH },
	{ "dummy-weights", no_argument, NULL, OPT_DUMMY },
	{ "arch", required_argument, NULL, OPT_ARCH },
	{ "shape", required_argument, NULL, OPT_SHAPE },
	{ "csv", no_argument, NULL, OPT_CSV },
	{ "csv-out", required_argument, NULL, OPT_CSV_OUT },
	{ "resume", required_argument, NULL, OPT_RESUME },
	{ "verify", required_argument, NULL, OPT_VERIFY },
	{ "verify-batch", required_argument, NULL, OPT_VERIFY_BATCH },
	{ "verify-context", required_argument, NULL, OPT_VERIFY_CONTEXT },
	{ "spec-prompt", required_argument, NULL, OPT_SPEC_PROMPT },
	{ "spec", required_argument, NULL, OPT_SPEC },
	{ "temperature", required_argument, NULL, OPT_TEMPERATURE },
	{ "top-p", required_argument, NULL, OPT_TOP_P },
	{ "top-k", required_argument, NULL, OPT_TOP_K },
	{ "help", no_argument, NULL, 'h' },
	{ 0 },
};

struct bench {
	const char *cmd;
	struct cli_config config;
	int n_prompts, prompts[MAX_POINTS];
	int n_batches, batches[MAX_POINTS];
	int n_long_batches, long_batches[MAX_POINTS];
	int n_resumes, resumes[MAX_POINTS];  /* --resume: contexts of the swap rows */
	int n_verify, verify[MAX_POINTS];    /* --verify: drafts of the verify rows */
	int n_verify_batches, verify_batches[MAX_POINTS];
	int verify_context;
	int n_spec_prompts;                  /* --spec-prompt files */
	const char *spec_prompts[MAX_POINTS];
	enum atlas_spec spec;                /* --spec of the decode rows' sessions */
	struct atlas_params sampling;        /* --temperature, --top-p, --top-k of their
					      * sampling (only those fields) */
	int long_context;              /* -1 until given or set by the backend's defaults */
	int gen_tokens;                /* 0 until given or set by the backend's defaults */
	int prefill_runs;              /* 0 until given or set by the backend's defaults */
	bool csv, dummy;
	bool progress;                 /* stderr is a terminal: show the running row */
	char row[64];                  /* what runs now, for the progress line */
	const char *csv_path;  /* --csv-out */
	FILE *table, *csv_file; /* where the report goes, either may be NULL */
	const char *arch, *shape;
	char shape_name[64];   /* arch-shape: the dummy model */
	struct atlas_engine *e;
	struct cli_waiter waiter;
	struct bench_bound bound;
	struct bench_power power; /* the GPU's power samples, where NVML has them */
	int vocab, context;
	uint64_t kv_blocks, block_size;  /* the KV pool, to skip runs that cannot fit */
	uint64_t host_blocks;            /* the host tier, which long contexts stream from */
	uint64_t rng;          /* xorshift64 state of the prompt ids */
	int sessions_opened;   /* for unique session names */
};

static int parse_list(const char *cmd, const char *opt, const char *text, int lo, int hi,
		      int *out, int *n)
{
	char err[ATLAS_ERRLEN];
	int32_t *ids;
	size_t count;
	if (cli_parse_ids(text, &ids, &count, err, sizeof err))
		return cli_usage(cmd, "%s: %s", opt, err);
	int status = 0;
	if (!count || count > MAX_POINTS)
		status = cli_usage(cmd, "%s: give 1 to %d values", opt, MAX_POINTS);
	for (size_t i = 0; !status && i < count; i++) {
		if (ids[i] < lo || ids[i] > hi)
			status = cli_usage(cmd, "%s: %d is not in %d..%d", opt, ids[i], lo, hi);
		out[i] = ids[i];
	}
	*n = (int)count;
	free(ids);
	return status;
}

/* One sampling setting of the decode rows, in the session's syntax
 * (atlas_params_parse); its range is the session's to check. */
static int parse_setting(const char *cmd, const char *key, const char *arg,
			 struct atlas_params *p)
{
	char err[ATLAS_ERRLEN];
	bool stop_seen = false;

	if (atlas_params_parse(p, key, arg, &stop_seen, err, sizeof err))
		return cli_usage(cmd, "%s", err);
	return 0;
}

static int parse_args(int argc, char **argv, struct bench *b, bool *help)
{
	int opt, n, status = 0;
	while (!status && (opt = cli_getopt(argc, argv, ":ho:", options)) != -1) {
		if (opt == '?')
			return EXIT_USAGE;
		if (cli_config_option(&b->config, opt, optarg))
			continue;
		switch (opt) {
		case 'h':
			*help = true;
			return 0;
		case OPT_PROMPT_TOKENS:
			status = parse_list(argv[0], "--prompt-tokens", optarg, 1, 1 << 24, b->prompts,
					    &b->n_prompts);
			break;
		case OPT_PREFILL_RUNS:
			status = parse_list(argv[0], "--prefill-runs", optarg, 1, 99, &b->prefill_runs,
					    &n);
			if (!status && n != 1)
				status = cli_usage(argv[0], "--prefill-runs: give one value");
			break;
		case OPT_GEN_TOKENS:
			status = parse_list(argv[0], "--gen-tokens", optarg, 2, 1 << 20, &b->gen_tokens,
					    &n);
			if (!status && n != 1)
				status = cli_usage(argv[0], "--gen-tokens: give one value");
			break;
		case OPT_BATCH:
			status = parse_list(argv[0], "--batch", optarg, 1, 256, b->batches,
					    &b->n_batches);
			break;
		case OPT_CONTEXT:
			status = parse_list(argv[0], "--context", optarg, 0, 1 << 24, &b->long_context,
					    &n);
			if (!status && n != 1)
				status = cli_usage(argv[0], "--context: give one value");
			break;
		case OPT_CONTEXT_BATCH:
			status = parse_list(argv[0], "--context-batch", optarg, 1, 256,
					    b->long_batches, &b->n_long_batches);
			break;
		case OPT_DUMMY:
			b->dummy = true;
			break;
		case OPT_ARCH:
			b->arch = optarg;
			break;
		case OPT_SHAPE:
			b->shape = optarg;
			break;
		case OPT_CSV:
			b->csv = true;
			break;
		case OPT_CSV_OUT:
			b->csv_path = optarg;
			break;
		case OPT_RESUME:
			status = parse_list(argv[0], "--resume", optarg, 1, 1 << 24, b->resumes,
					    &b->n_resumes);
			break;
		case OPT_VERIFY:
			status = parse_list(argv[0], "--verify", optarg, 1, ATLAS_SPEC_K_MAX, b->verify,
					    &b->n_verify);
			break;
		case OPT_VERIFY_BATCH:
			status = parse_list(argv[0], "--verify-batch", optarg, 1, 256,
					    b->verify_batches, &b->n_verify_batches);
			break;
		case OPT_VERIFY_CONTEXT:
			status = parse_list(argv[0], "--verify-context", optarg, 1, 1 << 24,
					    &b->verify_context, &n);
			if (!status && n != 1)
				status = cli_usage(argv[0], "--verify-context: give one value");
			break;
		case OPT_TEMPERATURE:
			status = parse_setting(argv[0], "temperature", optarg, &b->sampling);
			break;
		case OPT_TOP_P:
			status = parse_setting(argv[0], "top_p", optarg, &b->sampling);
			break;
		case OPT_TOP_K:
			status = parse_setting(argv[0], "top_k", optarg, &b->sampling);
			break;
		case OPT_SPEC:
			if (atlas_spec_parse(optarg, &b->spec))
				status = cli_usage(argv[0], "--spec: '%s' is not off, auto, ngram or draft",
						   optarg);
			break;
		case OPT_SPEC_PROMPT:
			if (b->n_spec_prompts == MAX_POINTS)
				status = cli_usage(argv[0], "--spec-prompt: at most %d files", MAX_POINTS);
			else
				b->spec_prompts[b->n_spec_prompts++] = optarg;
			break;
		}
	}
	if (!status && optind < argc)
		status = cli_usage(argv[0], "unexpected argument '%s'", argv[optind]);
	if (!status && !b->dummy && (b->arch || b->shape))
		status = cli_usage(argv[0], "--arch and --shape go with --dummy-weights");
	return status;
}

static int32_t next_id(struct bench *b)
{
	b->rng ^= b->rng << 13;
	b->rng ^= b->rng >> 7;
	b->rng ^= b->rng << 17;
	return (int32_t)(b->rng % (uint64_t)b->vocab);
}

/* Open n sessions, raw, generating past end-of-sequence tokens, greedy or
 * with --temperature and --top-p (a seed each), with --spec (off by
 * default: the decode rows are plain decoding's). */
static int open_sessions(struct bench *b, struct atlas_session **s, int n)
{
	char err[ATLAS_ERRLEN], name[32];
	for (int i = 0; i < n; i++) {
		snprintf(name, sizeof name, "bench%d", ++b->sessions_opened);
		if (atlas_session_open(b->e, name, &s[i], err, sizeof err))
			return cli_fail(b->cmd, "%s", err);
		struct atlas_params p;
		atlas_session_get_params(s[i], &p);
		p.temperature = b->sampling.temperature;
		p.top_p = b->sampling.top_p;
		p.top_k = b->sampling.top_k;
		p.seed = (uint64_t)b->sessions_opened;
		p.mode = ATLAS_MODE_RAW;
		p.ignore_eos = true;
		p.n_stop = 0;
		p.spec = b->spec;
		if (atlas_session_set_params(s[i], &p, err, sizeof err))
			return cli_fail(b->cmd, "session %s: %s", name, err);
	}
	return 0;
}

/* Submit n_prompt fresh ids to each of s[0..n) as a turn of max_tokens. */
static int submit(struct bench *b, struct atlas_session **s, int n, int n_prompt,
		  int max_tokens)
{
	char err[ATLAS_ERRLEN];
	int32_t *ids = malloc((size_t)n_prompt * sizeof *ids);
	if (!ids)
		return cli_fail(b->cmd, "out of memory");
	int status = 0;
	for (int i = 0; i < n && !status; i++) {
		struct atlas_params p;
		atlas_session_get_params(s[i], &p);
		p.max_tokens = max_tokens;
		for (int j = 0; j < n_prompt; j++)
			ids[j] = next_id(b);
		if (atlas_session_set_params(s[i], &p, err, sizeof err) ||
		    atlas_session_submit_tokens(s[i], ids, (size_t)n_prompt, err, sizeof err) < 0)
			status = cli_fail(b->cmd, "session %s: %s", atlas_session_name(s[i]), err);
	}
	free(ids);
	return status;
}

struct progress {
	double t_all_started;      /* every session has its first token */
	uint64_t gen_all_started;  /* tokens generated by then, over all sessions */
	uint64_t staged_all_started; /* KV bytes streamed from the host tier by then */
	double t_end;
	uint64_t gen_end;
	uint64_t staged_end;
};

static uint64_t staged_bytes(struct bench *b)
{
	struct atlas_engine_stats *st = malloc(sizeof *st);
	uint64_t n = st && !atlas_engine_stats(b->e, st) ? st->kv.staged_bytes_total : 0;
	free(st);
	return n;
}

/* Wait for the turns of s[0..n) to end, noting when all had begun to decode. */
static int wait_turns(struct bench *b, struct atlas_session **s, int n, struct progress *pr)
{
	struct atlas_session_status st;
	const double t0 = atlas_now_s();
	double shown = t0;
	pr->t_all_started = -1;
	for (;;) {
		uint64_t seen = cli_waiter_events(&b->waiter);
		double now = atlas_now_s();
		uint64_t gen = 0;
		int started = 0, ended = 0;
		for (int i = 0; i < n; i++) {
			atlas_session_status(s[i], &st);
			if (!strcmp(st.finish, "error") || !strcmp(st.finish, "cancelled"))
				return cli_fail(b->cmd, "%s: %s", atlas_session_name(s[i]),
						st.last_error[0] ? st.last_error : st.finish);
			gen += st.generated_tokens;
			started += st.generated_tokens > 0;
			ended += st.finish[0] != '\0';
		}
		if (started == n && pr->t_all_started < 0) {
			pr->t_all_started = now;
			pr->gen_all_started = gen;
			pr->staged_all_started = staged_bytes(b);
		}
		if (ended == n) {
			pr->t_end = now;
			pr->gen_end = gen;
			pr->staged_end = staged_bytes(b);
			if (b->progress)
				fputs("\r\033[K", stderr);
			return 0;
		}
		if (b->progress && now - shown >= 0.5) {
			shown = now;
			fprintf(stderr, "\r\033[Kbench: %s: %d of %d sessions generating, %llu tokens, "
				"%.0f s", b->row, started, n, (unsigned long long)gen, now - t0);
		}
		cli_waiter_wait(&b->waiter, seen);
	}
}

static void close_sessions(struct atlas_session **s, int n)
{
	for (int i = 0; i < n; i++)
		if (s[i])
			atlas_session_close(s[i]);
}

/* Why batch sessions of `tokens` tokens each cannot run, or NULL: checked
 * before a row runs, so that the engine never has to refuse it. */
static const char *cannot_fit(const struct bench *b, int batch, int tokens)
{
	uint64_t per_seq = ((uint64_t)tokens + b->block_size - 1) / b->block_size;
	if (tokens > b->context)
		return "longer than the context";
	if (per_seq * (uint64_t)batch > b->kv_blocks + b->host_blocks)
		return b->host_blocks ? "its KV does not fit the pool and the host tier"
				      : "its KV does not fit the pool (raise kv_memory)";
	return NULL;
}

/* One session prefills n_prompt tokens (new random ids): its prompt tokens
 * and the time to its first token. */
static int prefill_once(struct bench *b, int n_prompt, uint64_t *tokens, double *seconds)
{
	struct atlas_session *s[1] = { NULL };
	struct progress pr;
	double t0 = atlas_now_s();
	int status = open_sessions(b, s, 1);
	if (!status)
		status = submit(b, s, 1, n_prompt, 1);
	if (!status)
		status = wait_turns(b, s, 1, &pr);
	if (!status) {
		struct atlas_session_status st;
		atlas_session_status(s[0], &st);
		*tokens = st.prompt_tokens;
		*seconds = st.ttft_s >= 0 ? st.ttft_s : pr.t_all_started - t0;
	}
	close_sessions(s, 1);
	return status;
}

static int cmp_double(const void *a, const void *b)
{
	const double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* The median of prefill_runs prefills of n_prompt tokens; with more than
 * one, after one that is not reported: the first prompt of a length pays
 * once for what later ones reuse (on cuda, cuBLAS choosing and the driver
 * loading the kernels of its matrix shapes), which a server that has seen
 * the length before does not see, and which the peer scripts leave out of
 * their medians as well. */
static int prefill(struct bench *b, int n_prompt, struct bench_result *r)
{
	double times[100];
	const int runs = b->prefill_runs, first = runs > 1 ? -1 : 0;
	int status = 0;
	*r = (struct bench_result){ .test = "prefill", .batch = 1, .context = n_prompt };
	if ((r->why = cannot_fit(b, 1, n_prompt + 1))) {
		r->skipped = true;
		return 0;
	}
	for (int i = first; !status && i < runs; i++) {
		struct bench_power_mark m0, m1;
		const bool power = i >= 0 && !bench_power_read(&b->power, &m0);

		snprintf(b->row, sizeof b->row, "prefill of %d tokens, run %d of %d", n_prompt,
			 i + 1, runs);
		status = prefill_once(b, n_prompt, &r->tokens, &times[i < 0 ? 0 : i]);
		if (!status && power && !bench_power_read(&b->power, &m1))
			bench_power_add(r, &m0, &m1, r->tokens);
	}
	if (!status) {
		qsort(times, (size_t)runs, sizeof *times, cmp_double);
		r->seconds = runs % 2 ? times[runs / 2]
				      : (times[runs / 2 - 1] + times[runs / 2]) / 2;
	}
	return status;
}

/* batch sessions prefill `context` tokens (a turn of one token), then each
 * submits one more token and all generate gen_tokens together. */
static int decode(struct bench *b, int batch, int context, struct bench_result *r)
{
	*r = (struct bench_result){ .test = "decode", .batch = batch, .context = context };
	if ((r->why = cannot_fit(b, batch, context + b->gen_tokens + 2))) {
		r->skipped = true;
		return 0;
	}
	snprintf(b->row, sizeof b->row, "decode, batch %d at %d tokens", batch, context);
	struct atlas_session **s = calloc((size_t)batch, sizeof *s);
	if (!s)
		return cli_fail(b->cmd, "out of memory");
	struct progress pr;
	int status = open_sessions(b, s, batch);
	if (!status)
		status = submit(b, s, batch, context - 1, 1);
	if (!status)
		status = wait_turns(b, s, batch, &pr);
	struct atlas_engine_stats *st0 = malloc(sizeof *st0), *st1 = malloc(sizeof *st1);
	if (!status && (!st0 || !st1 || atlas_engine_stats(b->e, st0)))
		status = cli_fail(b->cmd, "cannot read the engine's stats");
	struct bench_power_mark m0, m1;
	const bool power = !status && !bench_power_read(&b->power, &m0);
	if (!status)
		status = submit(b, s, batch, 1, b->gen_tokens);
	if (!status)
		status = wait_turns(b, s, batch, &pr);
	if (!status && power && !bench_power_read(&b->power, &m1))
		bench_power_add(r, &m0, &m1, pr.gen_end);
	if (!status && atlas_engine_stats(b->e, st1))
		status = cli_fail(b->cmd, "cannot read the engine's stats");
	if (!status) {
		r->tokens = pr.gen_end - pr.gen_all_started;
		r->seconds = pr.t_end - pr.t_all_started;
		r->staged_bytes = pr.staged_end - pr.staged_all_started;
		r->ep_ranks = st1->ep.ranks;
		r->steps = st1->steps_total - st0->steps_total;
		r->collectives = st1->ep.collectives_total - st0->ep.collectives_total;
		r->collective_bytes = st1->ep.collective_bytes_total -
				      st0->ep.collective_bytes_total;
		r->collective_seconds = st1->ep.collective_seconds_total -
					st0->ep.collective_seconds_total;
	}
	free(st0);
	free(st1);
	close_sessions(s, batch);
	free(s);
	return status;
}

/* The tier most of s's KV blocks are in, once they have left the device
 * (their moves out run in the background; a minute at most). */
static const char *tier_of(struct atlas_session *s)
{
	struct atlas_session_status st;
	double t0 = atlas_now_s();
	do {
		atlas_session_status(s, &st);
	} while (st.kv_blocks[ATLAS_TIER_DEVICE] && atlas_now_s() - t0 < 60 && !usleep(1000));
	int best = 0;
	for (int t = 1; t < ATLAS_TIERS; t++)
		if (st.kv_blocks[t] > st.kv_blocks[best])
			best = t;
	static const char *const names[ATLAS_TIERS] = { "resume-device", "resume-host",
							"resume-disk" };
	return names[best];
}

/* Session a prefills n tokens (the recompute row), session b prefills
 * nearly the whole pool, pushing a's KV out of it, then a's next turn
 * brings it back (the resume row: the time to that turn's first token). */
static int resume(struct bench *b, int n, struct bench_result *pre, struct bench_result *res)
{
	struct atlas_session *s[2] = { NULL, NULL };
	struct progress pr;
	*pre = (struct bench_result){ .test = "prefill", .batch = 1, .context = n };
	*res = (struct bench_result){ .test = "resume", .batch = 1, .context = n };
	/* b's prompt takes the whole pool but two blocks: every block of a's
	 * but those must go. */
	const uint64_t pool = b->kv_blocks * b->block_size;
	snprintf(b->row, sizeof b->row, "resume of %d tokens", n);
	const int64_t push = (int64_t)pool - 2 * (int64_t)b->block_size;
	if ((uint64_t)n + 2 > pool || n + 2 > b->context || push < 1 || push + 2 > b->context) {
		pre->skipped = res->skipped = true;
		pre->why = res->why = "needs a KV pool of n to `context` tokens";
		return 0;
	}
	int status = open_sessions(b, s, 2);
	if (!status)
		status = submit(b, s, 1, n, 1);
	if (!status)
		status = wait_turns(b, s, 1, &pr);
	if (!status) {
		struct atlas_session_status st;
		atlas_session_status(s[0], &st);
		pre->tokens = st.prompt_tokens;
		pre->seconds = st.ttft_s;
		status = submit(b, s + 1, 1, (int)push, 1);
	}
	if (!status)
		status = wait_turns(b, s + 1, 1, &pr);
	if (!status) {
		atlas_session_close(s[1]);
		s[1] = NULL;
		res->test = tier_of(s[0]);
		status = submit(b, s, 1, 1, 1);
	}
	if (!status)
		status = wait_turns(b, s, 1, &pr);
	if (!status) {
		struct atlas_session_status st;
		atlas_session_status(s[0], &st);
		res->tokens = (uint64_t)n;
		res->seconds = st.ttft_s;
	}
	close_sessions(s, 2);
	return status;
}

static int run(struct bench *b)
{
	struct bench_result r;
	struct atlas_engine_stats *st = malloc(sizeof *st);
	if (!st || atlas_engine_stats(b->e, st)) {
		free(st);
		return cli_fail(b->cmd, "cannot read the engine's stats");
	}
	b->vocab = st->vocab_size;
	b->context = st->context;
	b->kv_blocks = st->kv.blocks_total[0];
	b->host_blocks = st->kv.blocks_total[ATLAS_TIER_HOST];
	b->block_size = st->kv.block_size;
	b->bound.step_weight_bytes = st->step_weight_bytes;
	b->bound.kv_bytes_per_token = st->kv_bytes_per_token;
	b->bound.expert_bytes = st->expert_bytes;
	b->bound.experts = st->experts;
	b->bound.experts_per_token = st->experts_per_token;
	free(st);
	b->rng = 0x9e3779b97f4a7c15ull;
	/* A first short run pages the weights in and records the first graph; it
	 * is not reported. */
	snprintf(b->row, sizeof b->row, "warming up");
	int status = decode(b, 1, SHORT_CONTEXT, &r);
	if (!status && b->table && b->sampling.temperature > 0)
		fprintf(b->table, "sampling   decode rows at temperature %g, top_p %g, top_k %d, a "
			"seed a session\n", b->sampling.temperature, b->sampling.top_p,
			b->sampling.top_k);
	if (!status)
		bench_print_header(b->e, &b->bound, b->table, b->csv_file);
	for (int i = 0; !status && i < b->n_resumes; i++) {
		struct bench_result pre;
		if (!(status = resume(b, b->resumes[i], &pre, &r))) {
			bench_print_result(&pre, &b->bound, b->gen_tokens, b->table, b->csv_file);
			bench_print_result(&r, &b->bound, b->gen_tokens, b->table, b->csv_file);
		}
	}
	if (b->n_resumes)
		return status;
	for (int i = 0; !status && i < b->n_spec_prompts; i++)
		status = bench_spec_prompt(b->cmd, b->e, &b->waiter, b->spec_prompts[i],
					   b->gen_tokens,
					   b->spec == ATLAS_SPEC_OFF ? ATLAS_SPEC_AUTO : b->spec,
					   i == 0, b->table, b->csv_file);
	if (b->n_spec_prompts)
		return status;
	for (int i = 0; !status && i < b->n_prompts; i++)
		if (!(status = prefill(b, b->prompts[i], &r)))
			bench_print_result(&r, &b->bound, b->gen_tokens, b->table, b->csv_file);
	for (int i = 0; !status && i < b->n_batches; i++)
		if (!(status = decode(b, b->batches[i], SHORT_CONTEXT, &r)))
			bench_print_result(&r, &b->bound, b->gen_tokens, b->table, b->csv_file);
	for (int i = 0; !status && b->long_context && i < b->n_long_batches; i++)
		if (!(status = decode(b, b->long_batches[i], b->long_context, &r)))
			bench_print_result(&r, &b->bound, b->gen_tokens, b->table, b->csv_file);
	return status;
}

/* The rows not given on the command line: a GPU's sweep, or on the cpu one
 * that ends in minutes on a small machine. */
static void set_defaults(struct bench *b, bool cuda)
{
	static const int gpu_prompts[] = { 512, 2048, 8192 }, cpu_prompts[] = { 128, 512 };
	static const int gpu_batches[] = { 1, 8, 32, 64, 128 }, cpu_batches[] = { 1, 4, 8 };
	static const int cpu_long_batches[] = { 1, 4 };
	if (!b->n_prompts) {
		b->n_prompts = cuda ? 3 : 2;
		memcpy(b->prompts, cuda ? gpu_prompts : cpu_prompts, (size_t)b->n_prompts * sizeof(int));
	}
	if (!b->n_batches) {
		b->n_batches = cuda ? 5 : 3;
		memcpy(b->batches, cuda ? gpu_batches : cpu_batches, (size_t)b->n_batches * sizeof(int));
	}
	if (!b->n_long_batches) {
		b->n_long_batches = cuda ? 5 : 2;
		memcpy(b->long_batches, cuda ? gpu_batches : cpu_long_batches,
		       (size_t)b->n_long_batches * sizeof(int));
	}
	if (b->long_context < 0)
		b->long_context = cuda ? 8192 : 1024;
	if (!b->gen_tokens)
		b->gen_tokens = cuda ? 128 : 32;
	if (!b->prefill_runs)
		b->prefill_runs = cuda ? 3 : 1;
}

static int open_and_run(struct bench *b)
{
	char err[ATLAS_ERRLEN];
	struct atlas_config *cfg = malloc(sizeof *cfg);
	if (!cfg)
		return cli_fail(b->cmd, "out of memory");
	int status = cli_config_build(b->cmd, &b->config, cfg);
	if (!status && b->dummy) {
		snprintf(cfg->load_format, sizeof cfg->load_format, "dummy");
		snprintf(cfg->model, sizeof cfg->model, "%s-%s", b->arch ? b->arch : "qwen3",
			 b->shape ? b->shape : "0.6b");
	}
	struct kt_device_info info = { 0 };
	if (!status && !b->n_verify &&
	    bench_copy_bandwidth(cfg, &b->bound.bandwidth, &info, err, sizeof err))
		status = cli_fail(b->cmd, "%s", err);
	const bool cuda = !strcmp(info.backend, "cuda");
	set_defaults(b, cuda);
	int widest = 1;
	for (int i = 0; i < b->n_batches; i++)
		widest = ATLAS_MAX(widest, b->batches[i]);
	for (int i = 0; b->long_context && i < b->n_long_batches; i++)
		widest = ATLAS_MAX(widest, b->long_batches[i]);
	for (int i = 0; b->n_verify && i < b->n_verify_batches; i++)
		widest = ATLAS_MAX(widest, b->verify_batches[i]);
	cfg->max_batch = ATLAS_MAX(cfg->max_batch, widest);
	cfg->max_sessions = ATLAS_MAX(cfg->max_sessions, widest);
	if (!status && b->n_verify) {
		FILE *table = b->csv ? NULL : stdout, *csv = b->csv ? stdout : NULL;
		for (int i = 0; !status && i < b->n_verify_batches; i++)
			status = bench_verify(b->cmd, cfg, b->verify_batches[i], b->verify_context,
					      b->verify, b->n_verify, i == 0, table, csv);
		free(cfg);
		return status;
	}
	if (!status && cfg->kv_host_memory &&
	    bench_host_bandwidth(cfg, &b->bound.host_bandwidth, err, sizeof err))
		status = cli_fail(b->cmd, "%s", err);
	if (!status && b->progress)
		fprintf(stderr, "bench: loading %s%s\n", cfg->model,
			b->dummy ? " (making random weights)" : "");
	if (!status)
		status = cli_open_engine(b->cmd, cfg, &b->e);
	/* The rows are the report: the engine's line per turn is not, unless
	 * asked for with -o log_level=debug. */
	if (!status && !strcmp(cfg->log_level, "info"))
		atlas_log_set_level(ATLAS_LOG_WARN);
	free(cfg);
	if (status)
		return status;
	b->table = b->csv ? NULL : stdout;
	b->csv_file = b->csv ? stdout : NULL;
	if (b->csv_path && !(b->csv_file = fopen(b->csv_path, "w")))
		status = cli_fail(b->cmd, "%s: %s", b->csv_path, strerror(errno));
	cli_waiter_attach(&b->waiter, b->e);
	if (!status)
		bench_power_open(&b->power, info.pci_bus_id);
	if (!status)
		status = run(b);
	bench_power_close(&b->power);
	if (b->csv_path && b->csv_file && fclose(b->csv_file) && !status)
		status = cli_fail(b->cmd, "%s: %s", b->csv_path, strerror(errno));
	atlas_engine_close(b->e);
	return status;
}

int cmd_bench(int argc, char **argv)
{
	struct bench *b = calloc(1, sizeof *b);
	if (!b)
		return cli_fail(argv[0], "out of memory");
	*b = (struct bench){ .cmd = argv[0], .long_context = -1, .sampling.top_p = 1.0f,
			     .n_verify_batches = 2, .verify_batches = { 1, 32 },
			     .verify_context = 512, .progress = isatty(STDERR_FILENO) };
	bool help = false;
	int status = parse_args(argc, argv, b, &help);
	if (!status && !help && (b->sampling.top_p != 1.0f || b->sampling.top_k) &&
	    b->sampling.temperature == 0)
		status = cli_usage(argv[0], "--top-p and --top-k go with --temperature");
	if (!status && help)
		fputs(usage, stdout);
	else if (!status)
		status = open_and_run(b);
	free(b);
	return status;
}
