/* A strict checker of ctl/metrics: the Prometheus text format and atlas's
 * naming rules (metrics_check.h). */
#include "metrics_check.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FAMILIES 256
#define MAX_SERIES 4096

struct family {
	char name[128];
	char type[16];
	bool help, samples_done;
};

struct checker {
	struct family fam[MAX_FAMILIES];
	int n_fam;
	int current;                /* family whose samples are being listed, -1 */
	char *series[MAX_SERIES];   /* name{labels} seen */
	int n_series;
	int line;
	char *err;
	size_t errlen;
};

__attribute__((format(printf, 2, 3)))
static int bad(struct checker *c, const char *fmt, ...)
{
	int n = snprintf(c->err, c->errlen, "line %d: ", c->line);
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(c->err + n, c->errlen - (size_t)n, fmt, ap);
	va_end(ap);
	return -1;
}

/* Length of a metric or label name at s (0 if none). */
static size_t name_len(const char *s, bool colon)
{
	size_t n = 0;
	while (isalpha((unsigned char)s[n]) || s[n] == '_' || (colon && s[n] == ':') ||
	       (n && isdigit((unsigned char)s[n])))
		n++;
	return n;
}

static struct family *find(struct checker *c, const char *name, size_t n)
{
	for (int i = 0; i < c->n_fam; i++)
		if (strlen(c->fam[i].name) == n && !strncmp(c->fam[i].name, name, n))
			return &c->fam[i];
	return NULL;
}

static struct family *add(struct checker *c, const char *name, size_t n)
{
	if (c->n_fam == MAX_FAMILIES || n >= sizeof c->fam[0].name)
		return NULL;
	struct family *f = &c->fam[c->n_fam++];
	memset(f, 0, sizeof *f);
	memcpy(f->name, name, n);
	return f;
}

static int comment(struct checker *c, const char *l)
{
	bool help = !strncmp(l, "# HELP ", 7), type = !strncmp(l, "# TYPE ", 7);
	if (!help && !type)
		return bad(c, "a comment that is neither HELP nor TYPE");
	const char *name = l + 7;
	size_t n = name_len(name, true);
	if (!n || name[n] != ' ' || !name[n + 1])
		return bad(c, "HELP or TYPE without a name and text");
	struct family *f = find(c, name, n);
	if (f && (f->samples_done || (type && f->type[0]) || (help && f->help)))
		return bad(c, "%s repeated or after its samples", type ? "TYPE" : "HELP");
	if (!f && !(f = add(c, name, n)))
		return bad(c, "too many families");
	if (c->current >= 0 && &c->fam[c->current] != f)
		c->fam[c->current].samples_done = true;
	c->current = -1;
	if (help) {
		f->help = true;
		return 0;
	}
	const char *t = name + n + 1;
	if (strcmp(t, "counter") && strcmp(t, "gauge") && strcmp(t, "histogram") &&
	    strcmp(t, "summary") && strcmp(t, "untyped"))
		return bad(c, "unknown type '%s'", t);
	snprintf(f->type, sizeof f->type, "%s", t);
	return 0;
}

/* {a="x",b="y"} at *p; advances past it. */
static int labels(struct checker *c, const char **p)
{
	const char *s = *p + 1;
	while (*s != '}') {
		size_t n = name_len(s, false);
		if (!n || s[n] != '=' || s[n + 1] != '"')
			return bad(c, "bad label");
		s += n + 2;
		while (*s != '"') {
			if (!*s || *s == '\n')
				return bad(c, "unterminated label value");
			if (*s == '\\') {
				s++;
				if (*s != '\\' && *s != '"' && *s != 'n')
					return bad(c, "bad escape in a label value");
			}
			s++;
		}
		s++;
		if (*s == ',')
			s++;
		else if (*s != '}')
			return bad(c, "labels not separated by ','");
	}
	*p = s + 1;
	return 0;
}

static int value(struct checker *c, const char *v, double *out)
{
	if (!strcmp(v, "NaN") || !strcmp(v, "+Inf") || !strcmp(v, "-Inf")) {
		*out = !strcmp(v, "NaN") ? NAN : v[0] == '+' ? INFINITY : -INFINITY;
		return 0;
	}
	char *end;
	*out = strtod(v, &end);
	if (end == v || *end || isalpha((unsigned char)v[0]))
		return bad(c, "bad value '%s'", v);
	return 0;
}

static int sample(struct checker *c, const char *l)
{
	size_t n = name_len(l, true);
	if (!n)
		return bad(c, "a sample without a metric name");
	if (strncmp(l, "atlas_", 6) != 0)
		return bad(c, "metric without the atlas_ prefix");
	struct family *f = find(c, l, n);
	/* A histogram's samples: NAME_bucket{le=...}, NAME_sum, NAME_count. */
	static const char *const parts[] = { "_bucket", "_sum", "_count" };
	for (size_t i = 0; !f && i < sizeof parts / sizeof parts[0]; i++) {
		size_t k = strlen(parts[i]);
		if (n > k && !strncmp(l + n - k, parts[i], k)) {
			f = find(c, l, n - k);
			if (f && strcmp(f->type, "histogram"))
				return bad(c, "%s of %s, which is not a histogram", parts[i], f->name);
		}
	}
	if (!f || !f->type[0])
		return bad(c, "sample before its TYPE");
	if (f->samples_done)
		return bad(c, "samples of %s are not one group", f->name);
	bool total = n > 6 && !strncmp(l + n - 6, "_total", 6);
	bool counter = !strcmp(f->type, "counter");
	if (total != counter)
		return bad(c, "%s: only counters end in _total", f->name);
	if (c->current >= 0 && &c->fam[c->current] != f)
		c->fam[c->current].samples_done = true;
	c->current = (int)(f - c->fam);
	const char *p = l + n;
	if (*p == '{' && labels(c, &p))
		return -1;
	if (*p != ' ')
		return bad(c, "no value");
	size_t key_len = (size_t)(p - l);
	for (int i = 0; i < c->n_series; i++)
		if (strlen(c->series[i]) == key_len && !strncmp(c->series[i], l, key_len))
			return bad(c, "series repeated");
	if (c->n_series == MAX_SERIES)
		return bad(c, "too many series");
	c->series[c->n_series++] = strndup(l, key_len);
	char v[64];
	const char *sp = strchr(p + 1, ' ');
	size_t vl = sp ? (size_t)(sp - p - 1) : strlen(p + 1);
	if (!vl || vl >= sizeof v)
		return bad(c, "bad value");
	memcpy(v, p + 1, vl);
	v[vl] = 0;
	double x;
	if (value(c, v, &x))
		return -1;
	if (counter && !(x >= 0))
		return bad(c, "counter %s is negative or NaN", f->name);
	if (sp) {
		char *end;
		strtoll(sp + 1, &end, 10);
		if (end == sp + 1 || *end)
			return bad(c, "bad timestamp");
	}
	return 0;
}

int check_prometheus(const char *text, char *err, size_t errlen)
{
	struct checker *c = calloc(1, sizeof *c);
	c->current = -1;
	c->err = err;
	c->errlen = errlen;
	int rc = 0;
	size_t len = strlen(text);
	if (!len || text[len - 1] != '\n')
		rc = bad(c, "the text does not end with a line break");
	char *copy = strdup(text);
	for (char *l = copy, *next; !rc && l && *l; l = next) {
		next = strchr(l, '\n');
		*next++ = 0;
		c->line++;
		if (!*l)
			rc = bad(c, "empty line");
		else if (l[0] == '#')
			rc = comment(c, l);
		else
			rc = sample(c, l);
	}
	for (int i = 0; !rc && i < c->n_fam; i++)
		if (!c->fam[i].help || !c->fam[i].type[0])
			rc = bad(c, "%s lacks HELP or TYPE", c->fam[i].name);
	if (!rc && !c->n_series)
		rc = bad(c, "no samples");
	for (int i = 0; i < c->n_series; i++)
		free(c->series[i]);
	free(copy);
	free(c);
	return rc;
}
