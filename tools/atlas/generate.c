/* atlas generate: one turn of one session, its output streamed to stdout. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "engine/engine.h"
#include "tools/atlas/cli.h"

static const char usage[] =
	"usage: atlas generate [OPTIONS] [PROMPT...]\n"
	"\n"
	"Answer PROMPT (the words joined by spaces; stdin when there are none) with\n"
	"the model and stream the answer to stdout, without a mount.\n"
	"\n"
	CLI_CONFIG_HELP
	"  --temperature X     sampling settings of the session, as in its ctl file\n"
	"  --top-p X\n"
	"  --top-k N\n"
	"  --max-tokens N\n"
	"  --seed N\n"
	"  --stop TEXT         stop string (repeatable; \\n \\t \\\\ escapes)\n"
	"  --mode chat|raw     chat applies the model's chat template\n"
	"  --system TEXT       system prompt of chat mode\n"
	"  --tokens IDS        the prompt as token ids: 1,2,3\n"
	"  --ids               print the generated token ids instead of the text\n"
	"  -h, --help          show this help\n";

enum { OPT_TEMPERATURE = OPT_FIRST_OWN, OPT_TOP_P, OPT_TOP_K, OPT_MAX_TOKENS, OPT_SEED,
       OPT_STOP, OPT_MODE, OPT_SYSTEM, OPT_TOKENS, OPT_IDS };

/* Each sampling option and the session setting (ctl key) it sets. */
static const struct option options[] = {
	CLI_CONFIG_OPTIONS,
	{ "temperature", required_argument, NULL, OPT_TEMPERATURE },
	{ "top-p", required_argument, NULL, OPT_TOP_P },
	{ "top-k", required_argument, NULL, OPT_TOP_K },
	{ "max-tokens", required_argument, NULL, OPT_MAX_TOKENS },
	{ "seed", required_argument, NULL, OPT_SEED },
	{ "stop", required_argument, NULL, OPT_STOP },
	{ "mode", required_argument, NULL, OPT_MODE },
	{ "system", required_argument, NULL, OPT_SYSTEM },
	{ "tokens", required_argument, NULL, OPT_TOKENS },
	{ "ids", no_argument, NULL, OPT_IDS },
	{ "help", no_argument, NULL, 'h' },
	{ 0 },
};
static const char *const setting_keys[] = {
	[OPT_TEMPERATURE - OPT_TEMPERATURE] = "temperature", [OPT_TOP_P - OPT_TEMPERATURE] = "top_p",
	[OPT_TOP_K - OPT_TEMPERATURE] = "top_k", [OPT_MAX_TOKENS - OPT_TEMPERATURE] = "max_tokens",
	[OPT_SEED - OPT_TEMPERATURE] = "seed", [OPT_STOP - OPT_TEMPERATURE] = "stop",
	[OPT_MODE - OPT_TEMPERATURE] = "mode", [OPT_SYSTEM - OPT_TEMPERATURE] = "system",
};

#define MAX_SETTINGS 64

struct request {
	struct cli_config config;
	int n_settings;
	const char *keys[MAX_SETTINGS];    /* ctl keys, in the order given */
	const char *values[MAX_SETTINGS];
	const char *tokens;                /* --tokens, NULL for text */
	int32_t *token_ids;                /* --tokens parsed (malloc'd) */
	size_t n_tokens;
	bool ids;
	char *prompt;                      /* malloc'd; NULL with --tokens */
	size_t prompt_len;
};

/* Apply the settings in order, as one batch of ctl lines. */
static int apply_settings(const struct request *rq, struct atlas_params *p, char *err,
			  size_t errlen)
{
	bool stop_seen = false;
	for (int i = 0; i < rq->n_settings; i++) {
		int rc = atlas_params_parse(p, rq->keys[i], rq->values[i], &stop_seen, err, errlen);
		if (rc)
			return rc;
	}
	return 0;
}

static char *join_words(int n, char **words, size_t *len)
{
	size_t total = 1;
	for (int i = 0; i < n; i++)
		total += strlen(words[i]) + 1;
	char *text = malloc(total), *p = text;
	if (!text)
		return NULL;
	for (int i = 0; i < n; i++)
		p += sprintf(p, "%s%s", i ? " " : "", words[i]);
	*len = (size_t)(p - text);
	return text;
}

static int parse_args(int argc, char **argv, struct request *rq, bool *help)
{
	int opt;
	while ((opt = cli_getopt(argc, argv, ":ho:", options)) != -1) {
		if (opt == '?')
			return EXIT_USAGE;
		if (opt == 'h') {
			*help = true;
			return 0;
		}
		if (cli_config_option(&rq->config, opt, optarg))
			continue;
		if (opt == OPT_TOKENS) {
			rq->tokens = optarg;
		} else if (opt == OPT_IDS) {
			rq->ids = true;
		} else {
			if (rq->n_settings == MAX_SETTINGS)
				return cli_usage(argv[0], "more than %d sampling options", MAX_SETTINGS);
			rq->keys[rq->n_settings] = setting_keys[opt - OPT_TEMPERATURE];
			rq->values[rq->n_settings++] = optarg;
		}
	}
	/* Bad values are usage errors: find them before the model loads. */
	char err[ATLAS_ERRLEN];
	struct atlas_params scratch = { 0 };
	if (apply_settings(rq, &scratch, err, sizeof err))
		return cli_usage(argv[0], "%s", err);

	int words = argc - optind;
	if (rq->tokens && words)
		return cli_usage(argv[0], "give a PROMPT or --tokens, not both");
	if (rq->tokens) {
		if (cli_parse_ids(rq->tokens, &rq->token_ids, &rq->n_tokens, err, sizeof err))
			return cli_usage(argv[0], "--tokens: %s", err);
		if (!rq->n_tokens)
			return cli_usage(argv[0], "--tokens: no token ids");
	} else if (words) {
		rq->prompt = join_words(words, argv + optind, &rq->prompt_len);
		if (!rq->prompt)
			return cli_fail(argv[0], "out of memory");
	} else {
		int rc = cli_read_stdin(&rq->prompt, &rq->prompt_len);
		if (rc)
			return cli_fail(argv[0], "reading stdin: %s", strerror(-rc));
	}
	return 0;
}

/* Submit the prompt; returns the turn number or a negative errno. */
static int submit(const struct request *rq, struct atlas_session *s, char *err, size_t errlen)
{
	if (rq->token_ids)
		return atlas_session_submit_tokens(s, rq->token_ids, rq->n_tokens, err, errlen);
	return atlas_session_submit(s, rq->prompt, rq->prompt_len, err, errlen);
}

static int write_all(const char *buf, size_t n)
{
	if (n && fwrite(buf, 1, n, stdout) != n)
		return -EIO;
	return fflush(stdout) ? -EIO : 0;
}

/* Stream the turn's text to stdout (or only wait for its end with --ids).
 * Returns the turn's end: 0 or -EIO / -ECANCELED; -EPIPE if stdout failed. */
static int stream(struct atlas_session *s, uint64_t turn, struct cli_waiter *w, bool print,
		  bool *newline)
{
	char buf[4096];
	uint64_t off = 0;
	*newline = true;
	for (;;) {
		uint64_t seen = cli_waiter_events(w);
		struct atlas_read r;
		int rc = atlas_session_read(s, turn, off, buf, sizeof buf, &r);
		if (rc < 0)
			return rc;
		if (r.n && print) {
			if (write_all(buf, r.n))
				return -EPIPE;
			*newline = buf[r.n - 1] == '\n';
		}
		off += r.n;
		if (!r.more)
			return r.error;
		if (!r.n)
			cli_waiter_wait(w, seen);
	}
}

static int print_ids(const char *cmd, struct atlas_session *s, uint64_t turn)
{
	int32_t *prompt, *gen;
	size_t n_prompt, n_gen;
	int rc = atlas_session_turn_tokens(s, turn, &prompt, &n_prompt, &gen, &n_gen);
	if (rc)
		return cli_fail(cmd, "turn %llu: %s", (unsigned long long)turn, strerror(-rc));
	for (size_t i = 0; i < n_gen; i++)
		printf("%s%d", i ? " " : "", gen[i]);
	printf("\n");
	free(prompt);
	free(gen);
	return fflush(stdout) ? cli_fail(cmd, "writing stdout failed") : 0;
}

/* Open a session, apply the settings, run the turn. */
static int run(const char *cmd, const struct request *rq, struct atlas_engine *e,
	       struct cli_waiter *w)
{
	char err[ATLAS_ERRLEN];
	struct atlas_session *s;
	if (atlas_session_open(e, "generate", &s, err, sizeof err))
		return cli_fail(cmd, "%s", err);
	struct atlas_params p;
	atlas_session_get_params(s, &p);
	int status = 0;
	if (apply_settings(rq, &p, err, sizeof err) || atlas_session_set_params(s, &p, err, sizeof err)) {
		status = cli_fail(cmd, "%s", err);
		goto out;
	}
	int turn = submit(rq, s, err, sizeof err);
	if (turn < 0) {
		status = cli_fail(cmd, "%s", err);
		goto out;
	}
	bool newline;
	int end = stream(s, (uint64_t)turn, w, !rq->ids, &newline);
	if (end == -EPIPE) {
		status = cli_fail(cmd, "writing stdout failed");
	} else if (end) {
		struct atlas_session_status st;
		atlas_session_status(s, &st);
		status = cli_fail(cmd, "%s", st.last_error[0] ? st.last_error : strerror(-end));
	} else if (rq->ids) {
		status = print_ids(cmd, s, (uint64_t)turn);
	} else if (!newline) {
		/* Text output is lines: a shell prompt must not follow the answer
		 * on its line, and tools that read lines must see the last one. */
		write_all("\n", 1);
	}
out:
	atlas_session_close(s);
	return status;
}

static int open_and_run(const char *cmd, const struct request *rq)
{
	struct atlas_config *cfg = malloc(sizeof *cfg);
	if (!cfg)
		return cli_fail(cmd, "out of memory");
	struct atlas_engine *e;
	int status = cli_config_build(cmd, &rq->config, cfg);
	if (!status)
		status = cli_open_engine(cmd, cfg, &e);
	free(cfg);
	if (status)
		return status;
	struct cli_waiter w;
	cli_waiter_attach(&w, e);
	status = run(cmd, rq, e, &w);
	atlas_engine_close(e);
	return status;
}

int cmd_generate(int argc, char **argv)
{
	struct request rq = { 0 };
	bool help = false;
	int status = parse_args(argc, argv, &rq, &help);
	if (!status && help)
		fputs(usage, stdout);
	else if (!status)
		status = open_and_run(argv[0], &rq);
	free(rq.prompt);
	free(rq.token_ids);
	return status;
}
