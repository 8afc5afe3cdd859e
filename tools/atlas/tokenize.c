/* atlas tokenize: text on stdin to token ids on stdout, with the model's
 * tokenizer alone (no weights are loaded). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/tokenizer/tokenizer.h"
#include "tools/atlas/cli.h"

static const char usage[] =
	"usage: atlas tokenize [--model DIR] [--special]\n"
	"\n"
	"Read UTF-8 text on stdin and print its token ids on one line, separated by\n"
	"spaces. Only the tokenizer is loaded (DIR/tokenizer.json).\n"
	"\n"
	"  --model DIR   model directory (default: the built-in default model)\n"
	"  --special     add the special tokens of the tokenizer's post-processor\n"
	"                (e.g. a BOS token), as encode(add_special_tokens=True)\n"
	"  -h, --help    show this help\n";

enum { OPT_SPECIAL = OPT_FIRST_OWN };

static const struct option options[] = {
	{ "model", required_argument, NULL, OPT_MODEL },
	{ "special", no_argument, NULL, OPT_SPECIAL },
	{ "help", no_argument, NULL, 'h' },
	{ 0 },
};

int cmd_tokenize(int argc, char **argv)
{
	const char *model = NULL;
	bool special = false;
	int opt;
	while ((opt = cli_getopt(argc, argv, ":h", options)) != -1) {
		switch (opt) {
		case 'h':
			fputs(usage, stdout);
			return 0;
		case OPT_MODEL:
			model = optarg;
			break;
		case OPT_SPECIAL:
			special = true;
			break;
		default:
			return EXIT_USAGE;
		}
	}
	if (optind < argc)
		return cli_usage(argv[0], "unexpected argument '%s' (the text comes on stdin)",
				 argv[optind]);

	struct atlas_tokenizer *tok;
	int status = cli_load_tokenizer(argv[0], model, &tok);
	if (status)
		return status;
	char *text;
	size_t len;
	int32_t *ids = NULL;
	size_t n = 0;
	int rc = cli_read_stdin(&text, &len);
	if (rc) {
		status = cli_fail(argv[0], "reading stdin: %s", strerror(-rc));
	} else {
		rc = tok_encode(tok, text, len, special, &ids, &n);
		if (rc)
			status = cli_fail(argv[0], "%s", rc == -EINVAL ? "the input is not valid UTF-8"
								   : strerror(-rc));
		free(text);
	}
	for (size_t i = 0; !status && i < n; i++)
		printf("%s%d", i ? " " : "", ids[i]);
	if (!status) {
		printf("\n");
		if (fflush(stdout))
			status = cli_fail(argv[0], "writing stdout failed");
	}
	free(ids);
	tok_free(tok);
	return status;
}
