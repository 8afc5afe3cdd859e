/* atlas: the command-line companion of atlasd. Dispatches to one subcommand
 * per file. */
#include <stdio.h>
#include <string.h>

#include "tools/atlas/cli.h"

#ifndef ATLAS_VERSION
#error "tools/meson.build defines ATLAS_VERSION"
#endif

static const struct command {
	const char *name;
	int (*run)(int argc, char **argv);
	const char *summary;
} commands[] = {
	{ "generate", cmd_generate, "answer a prompt, streaming the text to stdout (no mount)" },
	{ "tokenize", cmd_tokenize, "text on stdin to token ids" },
	{ "detokenize", cmd_detokenize, "token ids on stdin to text" },
	{ "logits", cmd_logits, "logits of every position of a sequence, to a file" },
	{ "bench", cmd_bench, "prefill and decode throughput, over batch sizes" },
	{ "config", cmd_config, "print the effective configuration or the defaults" },
};

static void print_usage(FILE *f)
{
	fprintf(f, "usage: atlas COMMAND [OPTIONS]\n\ncommands:\n");
	for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
		fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].summary);
	fprintf(f, "\n`atlas COMMAND --help` describes a command's options; "
		"`atlas --version` prints the version.\n");
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		print_usage(stderr);
		return EXIT_USAGE;
	}
	const char *name = argv[1];
	if (!strcmp(name, "--help") || !strcmp(name, "-h") || !strcmp(name, "help")) {
		print_usage(stdout);
		return 0;
	}
	if (!strcmp(name, "--version") || !strcmp(name, "-V")) {
		printf("atlas %s\n", ATLAS_VERSION);
		return 0;
	}
	for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
		if (!strcmp(name, commands[i].name))
			return commands[i].run(argc - 1, argv + 1);
	fprintf(stderr, "atlas: unknown command '%s' (see atlas --help)\n", name);
	return EXIT_USAGE;
}
