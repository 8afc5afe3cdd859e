/* Pieces shared by the subcommands: messages, options, configuration,
 * input, and waiting on the engine. */
#include "tools/atlas/cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "engine/engine.h"
#include "engine/tokenizer/tokenizer.h"

static void vmessage(const char *cmd, const char *fmt, va_list ap, const char *tail)
{
	char msg[ATLAS_ERRLEN];
	vsnprintf(msg, sizeof msg, fmt, ap);
	fprintf(stderr, "atlas %s: %s%s\n", cmd, msg, tail);
}

int cli_fail(const char *cmd, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vmessage(cmd, fmt, ap, "");
	va_end(ap);
	return 1;
}

int cli_usage(const char *cmd, const char *fmt, ...)
{
	char tail[96];
	snprintf(tail, sizeof tail, " (see atlas %s --help)", cmd);
	va_list ap;
	va_start(ap, fmt);
	vmessage(cmd, fmt, ap, tail);
	va_end(ap);
	return EXIT_USAGE;
}

int cli_getopt(int argc, char **argv, const char *shortopts, const struct option *longopts)
{
	opterr = 0;
	int opt = getopt_long(argc, argv, shortopts, longopts, NULL);
	if (opt != '?' && opt != ':')
		return opt;
	const char *arg = argv[optind - 1];
	if (opt == ':')
		cli_usage(argv[0], "option '%s' needs a value", arg);
	else if (arg[0] == '-' && arg[1] == '-')
		cli_usage(argv[0], "unknown option '%s'", arg);
	else
		cli_usage(argv[0], "unknown option '-%c'", optopt);
	return '?';
}

bool cli_config_option(struct cli_config *o, int opt, const char *arg)
{
	switch (opt) {
	case OPT_MODEL:
		o->model = arg;
		return true;
	case OPT_CONFIG:
		o->file = arg;
		return true;
	case 'o':
		/* Past the limit the option is still taken; building reports it. */
		if (o->n_overrides < CLI_MAX_OVERRIDES)
			o->overrides[o->n_overrides] = arg;
		o->n_overrides++;
		return true;
	}
	return false;
}

int cli_config_build(const char *cmd, const struct cli_config *o, struct atlas_config *c)
{
	char err[ATLAS_ERRLEN];
	atlas_config_defaults(c);
	if (o->file && atlas_config_load(c, o->file, err, sizeof err))
		return cli_fail(cmd, "%s", err);
	if (o->n_overrides > CLI_MAX_OVERRIDES)
		return cli_usage(cmd, "more than %d -o options", CLI_MAX_OVERRIDES);
	for (int i = 0; i < o->n_overrides; i++) {
		const char *eq = strchr(o->overrides[i], '=');
		char key[64];
		if (!eq || eq == o->overrides[i] || (size_t)(eq - o->overrides[i]) >= sizeof key)
			return cli_usage(cmd, "-o '%s': expected KEY=VALUE", o->overrides[i]);
		snprintf(key, sizeof key, "%.*s", (int)(eq - o->overrides[i]), o->overrides[i]);
		if (atlas_config_set(c, key, eq + 1, err, sizeof err))
			return cli_usage(cmd, "-o %s", err);
	}
	if (o->model) {
		if (strlen(o->model) >= sizeof c->model)
			return cli_usage(cmd, "--model: path longer than %zu bytes",
					 sizeof c->model - 1);
		snprintf(c->model, sizeof c->model, "%s", o->model);
	}
	if (atlas_config_validate(c, err, sizeof err))
		return cli_fail(cmd, "%s", err);
	enum atlas_log_level level;
	if (!atlas_log_parse_level(c->log_level, &level))
		atlas_log_set_level(level);
	return 0;
}

int cli_read_stdin(char **text, size_t *len)
{
	size_t cap = 4096, n = 0;
	char *buf = malloc(cap);
	if (!buf)
		return -ENOMEM;
	for (;;) {
		if (n + 1 == cap) {
			char *bigger = realloc(buf, cap * 2);
			if (!bigger) {
				free(buf);
				return -ENOMEM;
			}
			buf = bigger;
			cap *= 2;
		}
		ssize_t got = read(STDIN_FILENO, buf + n, cap - 1 - n);
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0) {
			int rc = -errno;
			free(buf);
			return rc;
		}
		if (got == 0)
			break;
		n += (size_t)got;
	}
	buf[n] = '\0';
	*text = buf;
	*len = n;
	return 0;
}

int cli_parse_ids(const char *text, int32_t **ids, size_t *n, char *err, size_t errlen)
{
	static const char sep[] = " ,\t\r\n";
	size_t count = 0, cap = 64;
	int32_t *out = malloc(cap * sizeof *out);
	if (!out)
		return atlas_errf(err, errlen, -ENOMEM, "out of memory");
	for (const char *p = text + strspn(text, sep); *p; p += strspn(p, sep)) {
		size_t len = strcspn(p, sep);
		char *end;
		errno = 0;
		long v = strtol(p, &end, 10);
		if (*p < '0' || *p > '9' || end != p + len || errno || v > INT32_MAX) {
			free(out);
			return atlas_errf(err, errlen, -EINVAL, "'%.*s' is not a token id",
					  (int)ATLAS_MIN(len, 32), p);
		}
		if (count == cap) {
			int32_t *bigger = realloc(out, 2 * cap * sizeof *out);
			if (!bigger) {
				free(out);
				return atlas_errf(err, errlen, -ENOMEM, "out of memory");
			}
			out = bigger;
			cap *= 2;
		}
		out[count++] = (int32_t)v;
		p += len;
	}
	*ids = out;
	*n = count;
	return 0;
}

int cli_load_tokenizer(const char *cmd, const char *model, struct atlas_tokenizer **tok)
{
	char err[ATLAS_ERRLEN];
	struct atlas_config *defaults = NULL;
	if (!model) {
		defaults = malloc(sizeof *defaults);
		if (!defaults)
			return cli_fail(cmd, "out of memory");
		atlas_config_defaults(defaults);
		model = atlas_config_model_dir(defaults);
	}
	int rc = tok_load(model, tok, err, sizeof err);
	free(defaults);
	return rc ? cli_fail(cmd, "%s", err) : 0;
}

int cli_open_engine(const char *cmd, const struct atlas_config *c, struct atlas_engine **e)
{
	char err[ATLAS_ERRLEN];
	struct atlas_config *copy = malloc(sizeof *copy);
	if (!copy)
		return cli_fail(cmd, "out of memory");
	*copy = *c;
	if (!copy->model[0])
		snprintf(copy->model, sizeof copy->model, "%s", atlas_config_model_dir(c));
	int rc = atlas_engine_open(copy, e, err, sizeof err);
	free(copy);
	return rc ? cli_fail(cmd, "%s", err) : 0;
}

static void on_notify(void *ctx, struct atlas_session *s)
{
	struct cli_waiter *w = ctx;
	pthread_mutex_lock(&w->lock);
	w->events++;
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
}

void cli_waiter_attach(struct cli_waiter *w, struct atlas_engine *e)
{
	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->cond, NULL);
	w->events = 0;
	atlas_engine_set_notify(e, on_notify, w);
}

uint64_t cli_waiter_events(struct cli_waiter *w)
{
	pthread_mutex_lock(&w->lock);
	uint64_t n = w->events;
	pthread_mutex_unlock(&w->lock);
	return n;
}

void cli_waiter_wait(struct cli_waiter *w, uint64_t seen)
{
	pthread_mutex_lock(&w->lock);
	while (w->events == seen)
		pthread_cond_wait(&w->cond, &w->lock);
	pthread_mutex_unlock(&w->lock);
}
