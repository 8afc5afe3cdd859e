/* atlas logits: the logits of every position of one sequence, through the
 * engine's forward path, for differential tests against a reference. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/engine.h"
#include "engine/tokenizer/tokenizer.h"
#include "tools/atlas/cli.h"

static const char usage[] =
	"usage: atlas logits [OPTIONS] (--tokens IDS | --prompt TEXT)\n"
	"                    [--out FILE] [--top K]\n"
	"\n"
	"Run one fresh sequence through the model and write the logits of every\n"
	"position.\n"
	"\n"
	CLI_CONFIG_HELP
	"  --tokens IDS        the sequence as token ids: 1,2,3\n"
	"  --prompt TEXT       the sequence as text, encoded with the model's tokenizer\n"
	"                      with its special tokens, as tokenizer(TEXT) does\n"
	"  --out FILE          write the logits to FILE: little-endian float32,\n"
	"                      positions x vocabulary, row-major\n"
	"  --top K             print the K highest logits of each position, one line\n"
	"                      per position: POSITION ID:LOGIT ...\n"
	"  -h, --help          show this help\n";

enum { OPT_TOKENS = OPT_FIRST_OWN, OPT_PROMPT, OPT_OUT, OPT_TOP };

static const struct option options[] = {
	CLI_CONFIG_OPTIONS,
	{ "tokens", required_argument, NULL, OPT_TOKENS },
	{ "prompt", required_argument, NULL, OPT_PROMPT },
	{ "out", required_argument, NULL, OPT_OUT },
	{ "top", required_argument, NULL, OPT_TOP },
	{ "help", no_argument, NULL, 'h' },
	{ 0 },
};

struct request {
	struct cli_config config;
	const char *prompt;
	const char *out;
	long top;
	int32_t *ids;          /* --tokens, or the encoded prompt (malloc'd) */
	size_t n;
};

static int parse_args(int argc, char **argv, struct request *rq, bool *help)
{
	char err[ATLAS_ERRLEN];
	const char *tokens = NULL;
	int opt;
	while ((opt = cli_getopt(argc, argv, ":ho:", options)) != -1) {
		if (opt == '?')
			return EXIT_USAGE;
		if (cli_config_option(&rq->config, opt, optarg))
			continue;
		switch (opt) {
		case 'h':
			*help = true;
			return 0;
		case OPT_TOKENS:
			tokens = optarg;
			break;
		case OPT_PROMPT:
			rq->prompt = optarg;
			break;
		case OPT_OUT:
			rq->out = optarg;
			break;
		case OPT_TOP: {
			char *end;
			rq->top = strtol(optarg, &end, 10);
			if (*end || end == optarg || rq->top < 1 || rq->top > 1 << 20)
				return cli_usage(argv[0], "--top: '%s' is not a count from 1", optarg);
			break;
		}
		}
	}
	if (optind < argc)
		return cli_usage(argv[0], "unexpected argument '%s'", argv[optind]);
	if (!tokens == !rq->prompt)
		return cli_usage(argv[0], "give one of --tokens and --prompt");
	if (!rq->out && !rq->top)
		return cli_usage(argv[0], "give --out FILE, --top K or both");
	if (tokens) {
		if (cli_parse_ids(tokens, &rq->ids, &rq->n, err, sizeof err))
			return cli_usage(argv[0], "--tokens: %s", err);
		if (!rq->n)
			return cli_usage(argv[0], "--tokens: no token ids");
	}
	return 0;
}

static int encode_prompt(const char *cmd, struct atlas_engine *e, struct request *rq)
{
	const struct atlas_tokenizer *tok = atlas_engine_tokenizer(e);
	if (!tok)
		return cli_fail(cmd, "the model has no tokenizer.json: use --tokens");
	int rc = tok_encode(tok, rq->prompt, strlen(rq->prompt), true, &rq->ids, &rq->n);
	if (rc)
		return cli_fail(cmd, "--prompt: %s", rc == -EINVAL ? "not valid UTF-8" : strerror(-rc));
	if (!rq->n)
		return cli_fail(cmd, "--prompt: the text encodes to no tokens");
	return 0;
}

static int write_logits(const char *cmd, const char *path, float *logits, size_t count)
{
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
	for (size_t i = 0; i < count; i++) {
		uint32_t u;
		memcpy(&u, &logits[i], 4);
		u = __builtin_bswap32(u);
		memcpy(&logits[i], &u, 4);
	}
#endif
	FILE *f = fopen(path, "wb");
	if (!f)
		return cli_fail(cmd, "%s: %s", path, strerror(errno));
	bool ok = fwrite(logits, sizeof *logits, count, f) == count;
	ok &= fclose(f) == 0;
	return ok ? 0 : cli_fail(cmd, "%s: write failed", path);
}

/* The k highest of row[0..vocab) into ids, best first. */
static void top_k(const float *row, int vocab, int k, int32_t *ids)
{
	int n = 0;
	for (int32_t id = 0; id < vocab; id++) {
		if (n == k && row[id] <= row[ids[n - 1]])
			continue;
		int at = n < k ? n++ : k - 1;
		while (at > 0 && row[ids[at - 1]] < row[id]) {
			ids[at] = ids[at - 1];
			at--;
		}
		ids[at] = id;
	}
}

static int print_top(const char *cmd, const float *logits, size_t n, int vocab, int k)
{
	int32_t *ids = malloc((size_t)k * sizeof *ids);
	if (!ids)
		return cli_fail(cmd, "out of memory");
	for (size_t pos = 0; pos < n; pos++) {
		const float *row = logits + pos * (size_t)vocab;
		top_k(row, vocab, k, ids);
		printf("%zu", pos);
		for (int i = 0; i < k; i++)
			printf(" %d:%.9g", ids[i], row[ids[i]]);
		printf("\n");
	}
	free(ids);
	return fflush(stdout) ? cli_fail(cmd, "writing stdout failed") : 0;
}

static int run(const char *cmd, struct request *rq, struct atlas_engine *e)
{
	char err[ATLAS_ERRLEN];
	int status = rq->prompt ? encode_prompt(cmd, e, rq) : 0;
	if (status)
		return status;
	int vocab = atlas_engine_vocab_size(e);
	size_t count = rq->n * (size_t)vocab;
	float *logits = malloc(count * sizeof *logits);
	if (!logits)
		return cli_fail(cmd, "out of memory for %zu x %d logits", rq->n, vocab);
	if (atlas_engine_logits(e, rq->ids, rq->n, logits, err, sizeof err))
		status = cli_fail(cmd, "%s", err);
	if (!status && rq->top)
		status = print_top(cmd, logits, rq->n, vocab, (int)ATLAS_MIN(rq->top, vocab));
	if (!status && rq->out)
		status = write_logits(cmd, rq->out, logits, count);
	free(logits);
	return status;
}

static int open_and_run(const char *cmd, struct request *rq)
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
	status = run(cmd, rq, e);
	atlas_engine_close(e);
	return status;
}

int cmd_logits(int argc, char **argv)
{
	struct request rq = { 0 };
	bool help = false;
	int status = parse_args(argc, argv, &rq, &help);
	if (!status && help)
		fputs(usage, stdout);
	else if (!status)
		status = open_and_run(argv[0], &rq);
	free(rq.ids);
	return status;
}
