/* atlas config: print the effective configuration, the documented
 * defaults that config/atlas.conf ships, or the manual page atlas.conf(5). */
#include <stdio.h>
#include <stdlib.h>

#include "tools/atlas/cli.h"

static const char usage[] =
	"usage: atlas config [--config FILE] [-o KEY=VALUE ...] [--defaults | --man]\n"
	"\n"
	"Print the effective configuration as INI text: the defaults, FILE read over\n"
	"them, then the -o keys; the result is checked as a whole, as for atlasd.\n"
	"\n"
	CLI_CONFIG_HELP
	"  --defaults          print the defaults with every key's documentation\n"
	"                      instead: the text of the shipped config/atlas.conf\n"
	"  --man               print the manual page atlas.conf(5) (roff) instead\n"
	"  -h, --help          show this help\n";

enum { OPT_DEFAULTS = OPT_FIRST_OWN, OPT_MAN };

static const struct option options[] = {
	CLI_CONFIG_OPTIONS,
	{ "defaults", no_argument, NULL, OPT_DEFAULTS },
	{ "man", no_argument, NULL, OPT_MAN },
	{ "help", no_argument, NULL, 'h' },
	{ 0 },
};

/* c as INI text, or with c NULL the manual page. */
static int print_config(const char *cmd, const struct atlas_config *c, bool documented)
{
	size_t len = c ? atlas_config_format(c, documented, NULL, 0) :
		     atlas_config_man(ATLAS_VERSION, NULL, 0);
	char *text = malloc(len + 1);
	if (!text)
		return cli_fail(cmd, "out of memory");
	if (c)
		atlas_config_format(c, documented, text, len + 1);
	else
		atlas_config_man(ATLAS_VERSION, text, len + 1);
	int status = 0;
	if (fwrite(text, 1, len, stdout) != len || fflush(stdout))
		status = cli_fail(cmd, "writing stdout failed");
	free(text);
	return status;
}

int cmd_config(int argc, char **argv)
{
	struct cli_config o = { 0 };
	bool defaults = false, man = false;
	int opt;
	while ((opt = cli_getopt(argc, argv, ":ho:", options)) != -1) {
		if (opt == '?')
			return EXIT_USAGE;
		if (opt == 'h') {
			fputs(usage, stdout);
			return 0;
		}
		if (opt == OPT_DEFAULTS)
			defaults = true;
		else if (opt == OPT_MAN)
			man = true;
		else
			cli_config_option(&o, opt, optarg);
	}
	if (optind < argc)
		return cli_usage(argv[0], "unexpected argument '%s'", argv[optind]);
	if ((defaults || man) && (o.model || o.file || o.n_overrides))
		return cli_usage(argv[0], "--defaults and --man take no --model, --config or -o");
	if (defaults && man)
		return cli_usage(argv[0], "--defaults or --man, not both");
	if (man)
		return print_config(argv[0], NULL, false);

	struct atlas_config *c = malloc(sizeof *c);
	if (!c)
		return cli_fail(argv[0], "out of memory");
	int status = 0;
	if (defaults)
		atlas_config_defaults(c);
	else
		status = cli_config_build(argv[0], &o, c);
	if (!status)
		status = print_config(argv[0], c, defaults);
	free(c);
	return status;
}
