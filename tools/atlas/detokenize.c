/* atlas detokenize: token ids on stdin to text on stdout, with the model's
 * tokenizer alone (no weights are loaded). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/tokenizer/tokenizer.h"
#include "tools/atlas/cli.h"

static const char usage[] =
	"usage: atlas detokenize [--model DIR] [--skip-special]\n"
	"\n"
	"Read token ids on stdin (separated by spaces, commas or line breaks) and\n"
	"print their text, as it is: no line break is added. Only the tokenizer is\n"
	"loaded (DIR/tokenizer.json).\n"
	"\n"
	"  --model DIR      model directory (default: the built-in default model)\n"
	"  --skip-special   leave out special tokens, as decode(skip_special_tokens=True)\n"
	"  -h, --help       show this help\n";

enum { OPT_SKIP_SPECIAL = OPT_FIRST_OWN };

static const struct option options[] = {
	{ "model", required_argument, NULL, OPT_MODEL },
	{ "skip-special", no_argument, NULL, OPT_SKIP_SPECIAL },
	{ "help", no_argument, NULL, 'h' },
	{ 0 },
};

static int decode(const char *cmd, const struct atlas_tokenizer *tok, const char *input,
		  bool skip_special)
{
	char err[ATLAS_ERRLEN];
	int32_t *ids;
	size_t n;
	if (cli_parse_ids(input, &ids, &n, err, sizeof err))
		return cli_fail(cmd, "stdin: %s", err);
	for (size_t i = 0; i < n; i++) {
		if (ids[i] >= tok_vocab_size(tok)) {
			int status = cli_fail(cmd, "token id %d is not below the vocabulary size %d",
					      ids[i], tok_vocab_size(tok));
			free(ids);
			return status;
		}
	}
	char *text;
	size_t len;
	int rc = tok_decode(tok, ids, n, skip_special, &text, &len);
	free(ids);
	if (rc)
		return cli_fail(cmd, "%s", strerror(-rc));
	int status = 0;
	if (fwrite(text, 1, len, stdout) != len || fflush(stdout))
		status = cli_fail(cmd, "writing stdout failed");
	free(text);
	return status;
}

int cmd_detokenize(int argc, char **argv)
{
	const char *model = NULL;
	bool skip_special = false;
	int opt;
	while ((opt = cli_getopt(argc, argv, ":h", options)) != -1) {
		switch (opt) {
		case 'h':
			fputs(usage, stdout);
			return 0;
		case OPT_MODEL:
			model = optarg;
			break;
		case OPT_SKIP_SPECIAL:
			skip_special = true;
			break;
		default:
			return EXIT_USAGE;
		}
	}
	if (optind < argc)
		return cli_usage(argv[0], "unexpected argument '%s' (the ids come on stdin)",
				 argv[optind]);

	struct atlas_tokenizer *tok;
	int status = cli_load_tokenizer(argv[0], model, &tok);
	if (status)
		return status;
	char *input = NULL;
	size_t len;
	int rc = cli_read_stdin(&input, &len);
	if (rc)
		status = cli_fail(argv[0], "reading stdin: %s", strerror(-rc));
	else
		status = decode(argv[0], tok, input, skip_special);
	free(input);
	tok_free(tok);
	return status;
}
