/* Reading an INI file over a configuration, with inih.
 *
 * inih hands over each `key = value` line; the line reader below feeds it the
 * file and keeps the facts that inih does not pass on: the line number,
 * whether the line is indented (inih's continuation lines) and where the
 * current section started. inih's line buffer is fixed at build time, so a
 * line too long for it is refused here instead of being cut in two.
 */
#include "config/config.h"
#include "config/keys.h"

#include <errno.h>
#include <ini.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

struct load {
	struct atlas_config *c;
	const char *path;
	FILE *file;
	char *line;                     /* getline's buffer */
	size_t cap;
	int lineno;                     /* of the line inih works on */
	bool indented;                  /* that line starts with whitespace */
	int section_line;               /* line of the newest [section] */
	const struct atlas_key *prev;   /* key of the newest key line, NULL after [section] */
	int *seen;                      /* [atlas_n_keys] line that set each key, 0 if none */
	int err_line;                   /* first error found here, 0 if none */
	int err_code;
	char msg[ATLAS_ERRLEN];
};

__attribute__((format(printf, 4, 5)))
static int fail(struct load *l, int line, int code, const char *fmt, ...)
{
	if (l->err_line)
		return 0;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(l->msg, sizeof l->msg, fmt, ap);
	va_end(ap);
	l->err_line = line;
	l->err_code = code;
	return 0;
}

static char *read_line(char *str, int num, void *stream)
{
	struct load *l = stream;
	if (l->err_line)
		return NULL;
	ssize_t n = getline(&l->line, &l->cap, l->file);
	if (n < 0)
		return NULL;
	l->lineno++;
	l->indented = l->line[0] == ' ' || l->line[0] == '\t';
	const char *start = l->line + strspn(l->line, " \t");
	if (*start == '[') {
		l->section_line = l->lineno;
		l->prev = NULL;
	}
	if (n >= num) {
		if (*start != '#' && *start != ';') {
			fail(l, l->lineno, -EINVAL, "line is longer than %d bytes", num - 2);
			return NULL;
		}
		/* A long comment says nothing: pass on its beginning. */
		n = num - 2;
		l->line[n++] = '\n';
	}
	memcpy(str, l->line, (size_t)n);
	str[n] = '\0';
	return str;
}

static int on_value(void *user, const char *section, const char *name, const char *value)
{
	struct load *l = user;
	if (l->err_line)
		return 0;
	const struct atlas_key *k = atlas_key_find(name);
	bool known_section = false;
	for (size_t i = 0; i < atlas_n_keys; i++)
		known_section |= !strcmp(atlas_keys[i].section, section);
	if (!*section)
		return fail(l, l->lineno, -EINVAL, "key '%s' comes before any [section]", name);
	if (!known_section)
		return fail(l, l->section_line, -EINVAL, "unknown section [%s]", section);
	if (!k)
		return fail(l, l->lineno, -EINVAL, "unknown key '%s' in section [%s]", name,
			    section);
	if (strcmp(k->section, section))
		return fail(l, l->lineno, -EINVAL, "key '%s' belongs in section [%s], not [%s]",
			    name, k->section, section);

	size_t idx = (size_t)(k - atlas_keys);
	bool append = l->indented && l->prev == k;
	if (!append && l->seen[idx])
		return fail(l, l->lineno, -EINVAL, "key '%s' is already set on line %d", name,
			    l->seen[idx]);
	char msg[ATLAS_ERRLEN];
	int rc = atlas_key_set(l->c, k, value, append, msg, sizeof msg);
	if (rc)
		return fail(l, l->lineno, rc, "%s", msg);
	l->prev = k;
	if (!append)
		l->seen[idx] = l->lineno;
	return 1;
}

int atlas_config_load(struct atlas_config *c, const char *path, char *err, size_t errlen)
{
	struct load l = { .c = c, .path = path };
	l.file = fopen(path, "r");
	if (!l.file)
		return atlas_errf(err, errlen, -errno, "%s: %s", path, strerror(errno));
	l.seen = calloc(atlas_n_keys, sizeof *l.seen);
	if (!l.seen) {
		fclose(l.file);
		return atlas_errf(err, errlen, -ENOMEM, "%s: out of memory", path);
	}

	int syntax_line = ini_parse_stream(read_line, &l, on_value, &l);
	int rc = 0;
	if (ferror(l.file))
		rc = atlas_errf(err, errlen, -EIO, "%s: read error", path);
	else if (syntax_line > 0 && (!l.err_line || syntax_line < l.err_line))
		rc = atlas_errf(err, errlen, -EINVAL,
				"%s:%d: expected [section], key = value or a # comment", path,
				syntax_line);
	else if (syntax_line < 0)
		rc = atlas_errf(err, errlen, -ENOMEM, "%s: out of memory", path);
	else if (l.err_line)
		rc = atlas_errf(err, errlen, l.err_code, "%s:%d: %s", path, l.err_line, l.msg);

	free(l.line);
	free(l.seen);
	fclose(l.file);
	return rc;
}
