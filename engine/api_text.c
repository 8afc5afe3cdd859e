/* The text forms of the public API: state and tier names, and the `key value`
 * lines of session settings (a session's ctl file). Pure functions of their
 * arguments, with no engine state. */
#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/utf8.h"
#include "engine/engine.h"

const char *atlas_state_name(enum atlas_state s)
{
	static const char *const names[] = { "idle", "queued", "prefill", "decode", "parked",
					     "error" };
	return (unsigned)s < ATLAS_ARRAY_LEN(names) ? names[s] : "?";
}

const char *atlas_tier_name(enum atlas_tier t)
{
	static const char *const names[] = { "device", "host", "disk" };
	return (unsigned)t < ATLAS_ARRAY_LEN(names) ? names[t] : "?";
}

/* Whether the NUL-terminated s is whole UTF-8 text (escapes are ASCII, so
 * a setting's raw value says it). */
static bool utf8_text(const char *s)
{
	size_t n = strlen(s), whole;
	return atlas_utf8_check(s, n, &whole) == 0 && whole == n;
}

/* Undo \n \r \t \\ escapes into out[cap]: -EINVAL for any other backslash
 * sequence, -E2BIG when it does not fit. A first pass checks, a second
 * writes: a bad value leaves out (a setting) as it was. */
static int unescape(const char *in, char *out, size_t cap, size_t *len)
{
	size_t n = 0;
	for (int write = 0; write < 2; write++) {
		n = 0;
		for (const char *c = in; *c; c++, n++) {
			char ch = *c;
			if (ch == '\\') {
				switch (*++c) {
				case 'n': ch = '\n'; break;
				case 'r': ch = '\r'; break;
				case 't': ch = '\t'; break;
				case '\\': ch = '\\'; break;
				default: return -EINVAL;
				}
			}
			if (write)
				out[n] = ch;
			else if (n + 1 >= cap)
				return -E2BIG;
		}
	}
	out[n] = 0;
	*len = n;
	return 0;
}

static size_t escape(const char *in, char *out, size_t cap)
{
	size_t n = 0;
	for (const char *c = in; *c && n + 2 < cap; c++) {
		const char *rep = NULL;
		switch (*c) {
		case '\n': rep = "\\n"; break;
		case '\r': rep = "\\r"; break;
		case '\t': rep = "\\t"; break;
		case '\\': rep = "\\\\"; break;
		}
		if (rep) {
			out[n++] = rep[0];
			out[n++] = rep[1];
		} else {
			out[n++] = *c;
		}
	}
	out[n] = 0;
	return n;
}

static int parse_float(const char *key, const char *v, float *out, char *err, size_t errlen)
{
	char *end;
	errno = 0;
	double d = strtod(v, &end);
	if (!*v || *end || errno || d != d || d > FLT_MAX || d < -FLT_MAX)
		return atlas_errf(err, errlen, -EINVAL, "%s: '%s' is not a number", key, v);
	*out = (float)d;
	return 0;
}

static int parse_long(const char *key, const char *v, long long lo, long long hi, long long *out,
		      char *err, size_t errlen)
{
	char *end;
	errno = 0;
	long long x = strtoll(v, &end, 10);
	if (!*v || *end || errno)
		return atlas_errf(err, errlen, -EINVAL, "%s: '%s' is not an integer", key, v);
	if (x < lo || x > hi)
		return atlas_errf(err, errlen, -EINVAL, "%s: %lld is not in [%lld, %lld]", key, x, lo,
				  hi);
	*out = x;
	return 0;
}

int atlas_params_parse(struct atlas_params *p, const char *key, const char *value,
		       bool *stop_seen, char *err, size_t errlen)
{
	long long x;
	int rc;
	if (strcmp(key, "temperature") == 0)
		return parse_float(key, value, &p->temperature, err, errlen);
	if (strcmp(key, "top_p") == 0)
		return parse_float(key, value, &p->top_p, err, errlen);
	if (strcmp(key, "top_k") == 0) {
		if ((rc = parse_long(key, value, 0, 1 << 30, &x, err, errlen)))
			return rc;
		p->top_k = (int)x;
		return 0;
	}
	if (strcmp(key, "max_tokens") == 0) {
		if ((rc = parse_long(key, value, 1, 1 << 30, &x, err, errlen)))
			return rc;
		p->max_tokens = (int)x;
		return 0;
	}
	if (strcmp(key, "seed") == 0) {
		char *end;
		errno = 0;
		unsigned long long s = strtoull(value, &end, 10);
		if (!*value || *end || errno || value[0] == '-')
			return atlas_errf(err, errlen, -EINVAL,
					  "seed: '%s' is not an unsigned integer", value);
		p->seed = s;
		return 0;
	}
	if (strcmp(key, "ignore_eos") == 0) {
		if ((rc = parse_long(key, value, 0, 1, &x, err, errlen)))
			return rc;
		p->ignore_eos = x;
		return 0;
	}
	if (strcmp(key, "spec") == 0) {
		if (atlas_spec_parse(value, &p->spec))
			return atlas_errf(err, errlen, -EINVAL, "spec: '%s' is not off, auto, ngram, draft or mtp",
					  value);
		return 0;
	}
	if (strcmp(key, "spec_k") == 0) {
		if ((rc = parse_long(key, value, 1, ATLAS_SPEC_K_MAX, &x, err, errlen)))
			return rc;
		p->spec_k = (int)x;
		return 0;
	}
	if (strcmp(key, "mode") == 0) {
		if (strcmp(value, "chat") == 0)
			p->mode = ATLAS_MODE_CHAT;
		else if (strcmp(value, "raw") == 0)
			p->mode = ATLAS_MODE_RAW;
		else
			return atlas_errf(err, errlen, -EINVAL, "mode: '%s' is not chat or raw",
					  value);
		return 0;
	}
	if (strcmp(key, "system") == 0) {
		size_t n;
		if (!utf8_text(value))
			return atlas_errf(err, errlen, -EILSEQ, "system: not UTF-8 text");
		rc = unescape(value, p->system, sizeof p->system, &n);
		if (rc == -E2BIG)
			return atlas_errf(err, errlen, -EINVAL, "system: longer than %d bytes",
					  ATLAS_SYSTEM_MAX - 1);
		if (rc)
			return atlas_errf(err, errlen, -EINVAL,
					  "system: bad escape (use \\n \\r \\t \\\\)");
		return 0;
	}
	if (strcmp(key, "stop") == 0) {
		if (stop_seen && !*stop_seen) {
			p->n_stop = 0;
			*stop_seen = true;
		}
		if (!*value)
			return 0;
		if (p->n_stop >= ATLAS_STOP_MAX)
			return atlas_errf(err, errlen, -EINVAL, "stop: at most %d strings",
					  ATLAS_STOP_MAX);
		if (!utf8_text(value))
			return atlas_errf(err, errlen, -EILSEQ, "stop: not UTF-8 text");
		size_t n;
		rc = unescape(value, p->stop[p->n_stop], ATLAS_STOP_LEN, &n);
		if (rc == -E2BIG)
			return atlas_errf(err, errlen, -EINVAL, "stop: longer than %d bytes",
					  ATLAS_STOP_LEN - 1);
		if (rc)
			return atlas_errf(err, errlen, -EINVAL,
					  "stop: bad escape (use \\n \\r \\t \\\\)");
		p->n_stop++;
		return 0;
	}
	return atlas_errf(err, errlen, -EINVAL,
			  "unknown setting '%s' (temperature, top_p, top_k, max_tokens, seed, "
			  "mode, ignore_eos, spec, spec_k, stop, system; commands: cancel, reset)",
			  key);
}

size_t atlas_params_format(const struct atlas_params *p, char *buf, size_t len)
{
	char esc[2 * ATLAS_SYSTEM_MAX];
	size_t n = 0;
	/* buf may be NULL with len 0 (a size query): no pointer arithmetic on it. */
#define OUT(...) n += (size_t)snprintf(n < len ? buf + n : NULL, n < len ? len - n : 0, __VA_ARGS__)
	OUT("temperature %g\n", p->temperature);
	OUT("top_p %g\n", p->top_p);
	OUT("top_k %d\n", p->top_k);
	OUT("max_tokens %d\n", p->max_tokens);
	OUT("seed %" PRIu64 "\n", p->seed);
	OUT("mode %s\n", p->mode == ATLAS_MODE_CHAT ? "chat" : "raw");
	OUT("ignore_eos %d\n", p->ignore_eos);
	OUT("spec %s\n", atlas_spec_name(p->spec));
	OUT("spec_k %d\n", p->spec_k);
	if (p->n_stop == 0)
		OUT("stop\n");
	for (int i = 0; i < p->n_stop; i++) {
		escape(p->stop[i], esc, sizeof esc);
		OUT("stop %s\n", esc);
	}
	escape(p->system, esc, sizeof esc);
	OUT(*esc ? "system %s\n" : "system\n", esc);
#undef OUT
	return n;
}
