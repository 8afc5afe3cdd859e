/* Pieces shared by the subcommands of the `atlas` tool (DESIGN §6).
 *
 * Every subcommand is `int cmd_NAME(int argc, char **argv)` with argv[0] the
 * subcommand's name; it returns the exit status: 0, 1 for a failure (one line
 * on stderr), 2 for a usage error.
 */
#ifndef ATLAS_TOOLS_CLI_H
#define ATLAS_TOOLS_CLI_H

#include <getopt.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"

#define EXIT_USAGE 2

struct atlas_engine;

int cmd_generate(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_config(int argc, char **argv);

/* "atlas CMD: message" on stderr; returns 1. */
__attribute__((format(printf, 2, 3)))
int cli_fail(const char *cmd, const char *fmt, ...);
/* The same with a pointer to --help; returns EXIT_USAGE. */
__attribute__((format(printf, 2, 3)))
int cli_usage(const char *cmd, const char *fmt, ...);

/* getopt_long over argv with messages of our own: returns the option, -1 at
 * the end, or '?' after printing a usage error (exit with EXIT_USAGE). The
 * short options string must start with ':'. */
int cli_getopt(int argc, char **argv, const char *shortopts, const struct option *longopts);

/* Options that pick the configuration: --model DIR, --config FILE and
 * -o KEY=VALUE (repeatable). Subcommands put CLI_CONFIG_OPTIONS into their
 * option table and hand those options to cli_config_option. */
enum { OPT_MODEL = 0x100, OPT_CONFIG, OPT_FIRST_OWN };
#define CLI_CONFIG_OPTIONS \
	{ "model", required_argument, NULL, OPT_MODEL }, \
	{ "config", required_argument, NULL, OPT_CONFIG }
#define CLI_CONFIG_HELP \
	"  --model DIR         model directory (default: the config's model key)\n" \
	"  --config FILE       INI file read over the defaults (see atlas config)\n" \
	"  -o KEY=VALUE        set one config key, after the file (repeatable)\n"

#define CLI_MAX_OVERRIDES 64

struct cli_config {
	const char *model;
	const char *file;
	int n_overrides;
	const char *overrides[CLI_MAX_OVERRIDES];   /* "key=value", from argv */
};

/* Take opt if it is one of the config options; false if it is not. */
bool cli_config_option(struct cli_config *o, int opt, const char *arg);
/* Defaults < file < -o < --model, validated, the model directory resolved.
 * Returns 0, or the exit status after printing the error. */
int cli_config_build(const char *cmd, const struct cli_config *o, struct atlas_config *c);

/* All of stdin, NUL-terminated (malloc'd). */
int cli_read_stdin(char **text, size_t *len);
/* Token ids separated by spaces, commas or line breaks (malloc'd). */
int cli_parse_ids(const char *text, int32_t **ids, size_t *n, char *err, size_t errlen);

/* Load the tokenizer of model (NULL: the built-in default model).
 * Returns 0, or 1 after printing the error. */
struct atlas_tokenizer;
int cli_load_tokenizer(const char *cmd, const char *model, struct atlas_tokenizer **tok);

/* Open the engine for cmd, an empty model key resolved to the built-in
 * default model. Returns 0, or 1 after printing the error. */
int cli_open_engine(const char *cmd, const struct atlas_config *c, struct atlas_engine **e);

/* Sleeping until the engine reports progress: the engine's notify callback
 * bumps a counter. Read the counter, look at the sessions, and wait for the
 * counter to move on; a notification in between is never missed. The
 * engine may call back until atlas_engine_close returns: the waiter must
 * outlive the engine. */
struct cli_waiter {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	uint64_t events;
};
void cli_waiter_attach(struct cli_waiter *w, struct atlas_engine *e);
uint64_t cli_waiter_events(struct cli_waiter *w);
void cli_waiter_wait(struct cli_waiter *w, uint64_t seen);

#endif
