/* Rendering a configuration as INI text that atlas_config_load reads back to
 * the same values: ctl/config, `atlas config`, and with documentation the
 * shipped config/atlas.conf; and the key table as the manual page
 * atlas.conf(5) (`atlas config --man`). */
#include "config/config.h"
#include "config/keys.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define DOC_WIDTH 78     /* columns of a documentation comment line */
#define PIECE_WIDTH 96   /* bytes of escaped text per line, well below inih's 200 */

static const char header[] =
	"atlas configuration. Every key is shown with its documentation. Flags "
	"-o key=value of atlasd and atlas override the keys of this file. Text values "
	"take the escapes \\n (line break), \\t, \\\\, \\; and \\xHH; a long text value "
	"continues on indented lines, joined without a separator. Generated from the "
	"key table in config/config.c by `atlas config --defaults`.";

struct out {
	char *buf;
	size_t len;
	size_t pos;     /* bytes the whole text needs so far */
};

__attribute__((format(printf, 2, 3)))
static void put(struct out *o, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(o->pos < o->len ? o->buf + o->pos : NULL,
			  o->pos < o->len ? o->len - o->pos : 0, fmt, ap);
	va_end(ap);
	if (n > 0)
		o->pos += (size_t)n;
}

/* Documentation as `# ` lines of at most DOC_WIDTH columns. */
static void put_doc(struct out *o, const char *doc)
{
	const size_t room = DOC_WIDTH - 2;
	while (*doc) {
		size_t n = strcspn(doc, " ");   /* a line holds at least one word */
		while (doc[n]) {
			size_t next = n + 1 + strcspn(doc + n + 1, " ");
			if (next > room)
				break;
			n = next;
		}
		put(o, "# %.*s\n", (int)n, doc);
		doc += n;
		doc += strspn(doc, " ");
	}
}

/* Width of byte ch in escaped text, at its worst (at the edge of a piece). */
static size_t escaped_width(unsigned char ch)
{
	if (ch == '\\' || ch == '\n' || ch == '\t' || ch == '\r' || ch == ';')
		return 2;
	if (ch <= ' ' || ch == '#' || ch == 0x7f)
		return 4;
	return 1;
}

/* s[from..to) escaped so that inih hands it over unchanged: no line breaks,
 * no ';' that could start a comment, no whitespace at either end (inih trims
 * it) and no '#' that would start a continuation line as a comment. */
static void put_escaped(struct out *o, const char *s, size_t from, size_t to, bool continuation)
{
	for (size_t p = from; p < to; p++) {
		unsigned char ch = (unsigned char)s[p];
		bool edge = p == from || p + 1 == to;
		const char *esc = ch == '\\' ? "\\\\" : ch == '\n' ? "\\n" : ch == '\t' ? "\\t" :
				  ch == '\r' ? "\\r" : ch == ';' ? "\\;" : NULL;
		if (esc)
			put(o, "%s", esc);
		else if ((ch == ' ' && edge) || (ch == '#' && p == from && continuation) ||
			 ch < ' ' || ch == 0x7f)
			put(o, "\\x%02x", ch);
		else
			put(o, "%c", ch);
	}
}

/* `key = value`, a long text value broken into indented continuation lines
 * (never inside a UTF-8 character). */
static void put_value(struct out *o, const struct atlas_key *k, const char *v)
{
	size_t len = strlen(v);
	if (!len) {
		put(o, "%s =\n", k->name);
		return;
	}
	put(o, "%s = ", k->name);
	for (size_t from = 0; from < len;) {
		size_t to = from, width = 0;
		while (to < len) {
			size_t w = escaped_width((unsigned char)v[to]);
			bool inside_char = ((unsigned char)v[to] & 0xc0) == 0x80;
			if (to > from && width + w > PIECE_WIDTH && !inside_char)
				break;
			width += w;
			to++;
		}
		if (from)
			put(o, "\t");
		put_escaped(o, v, from, to, from > 0);
		put(o, "\n");
		from = to;
	}
}

size_t atlas_config_format(const struct atlas_config *c, bool documented, char *buf, size_t len)
{
	struct out o = { .buf = buf, .len = len };
	char value[ATLAS_SYSTEM_MAX > ATLAS_PATH_MAX ? ATLAS_SYSTEM_MAX : ATLAS_PATH_MAX];
	const char *section = NULL;

	if (len)
		buf[0] = '\0';
	if (documented)
		put_doc(&o, header);
	for (size_t i = 0; i < atlas_n_keys; i++) {
		const struct atlas_key *k = &atlas_keys[i];
		if (!section || strcmp(section, k->section)) {
			put(&o, "%s[%s]\n", section || documented ? "\n" : "", k->section);
			section = k->section;
		}
		if (documented) {
			put(&o, "\n");
			put_doc(&o, k->doc);
		}
		atlas_key_text(c, k, value, sizeof value);
		put_value(&o, k, value);
	}
	return o.pos;
}

/* ---- atlas.conf(5): the same table as a manual page ---- */

/* Text for roff: a backslash as \e, a line never starting with a control
 * character ('.' or '\''). */
static void put_roff(struct out *o, const char *s)
{
	if (*s == '.' || *s == '\'')
		put(o, "\\&");
	for (; *s; s++) {
		if (*s == '\\')
			put(o, "\\e");
		else if (*s == '-')
			put(o, "\\-");
		else
			put(o, "%c", *s);
	}
}

/* The values k takes, as atlas_key_set checks them. */
static void put_range(struct out *o, const struct atlas_key *k)
{
	switch (k->type) {
	case KEY_CHOICE:
	case KEY_ENUM:
		put(o, "One of");
		for (size_t i = 0; k->names[i]; i++)
			put(o, "%s %s", i ? "," : "", k->names[i]);
		put(o, ".");
		break;
	case KEY_INT:
		put(o, "An integer from %lld to %lld.", (long long)k->imin, (long long)k->imax);
		break;
	case KEY_SIZE:
		put(o, "A size from %lld to %lldG.", (long long)k->imin,
		    (long long)(k->imax >> 30));
		break;
	case KEY_FLOAT:
	case KEY_DOUBLE:
		put(o, "A number from %g (%s) to %g.", k->fmin, k->fmin_open ? "excluded" : "included",
		    k->fmax);
		break;
	case KEY_BOOL:
		put(o, "true or false (also yes/no, on/off, 1/0).");
		break;
	case KEY_U64:
		put(o, "An unsigned 64-bit integer.");
		break;
	case KEY_STRING:   /* any text: its documentation says what */
		break;
	}
}

size_t atlas_config_man(const char *version, char *buf, size_t len)
{
	struct out o = { .buf = buf, .len = len };
	if (len)
		buf[0] = '\0';
	put(&o, ".TH ATLAS.CONF 5 \"\" \"atlas %s\" \"File Formats\"\n", version);
	put(&o, ".SH NAME\natlas.conf \\- configuration of atlasd and atlas\n");
	put(&o, ".SH SYNOPSIS\n.I PREFIX/etc/atlas/atlas.conf\n.br\n"
	    ".B atlasd \\-\\-config\n.I FILE\n");
	put(&o, ".SH DESCRIPTION\nOne INI file of sections and\n.I key = value\nlines; "
	    "'#' and ';' start comments. ");
	put_roff(&o, "Text values take the escapes \\n (line break), \\t, \\\\, \\; and "
		 "\\xHH; a long text value continues on indented lines, joined without a "
		 "separator.");
	put(&o, "\n.PP\nPrecedence: the defaults below, then the file, then every\n"
	    ".B \\-o key=value\nflag in order. An installed atlasd reads\n"
	    ".I PREFIX/etc/atlas/atlas.conf\nwhen no\n.B \\-\\-config\nis given. Unknown keys and "
	    "values out of range stop startup with a message naming the file, line and key. "
	    "The effective configuration is readable in the mount at\n.IR ctl/config .\n");
	put(&o, ".SH KEYS\nEach key with its default.\n");
	const char *section = NULL;
	for (size_t i = 0; i < atlas_n_keys; i++) {
		const struct atlas_key *k = &atlas_keys[i];
		if (!section || strcmp(section, k->section)) {
			put(&o, ".SS [%s]\n", k->section);
			section = k->section;
		}
		put(&o, ".TP\n.B %s = ", k->name);
		put_roff(&o, k->def);
		put(&o, "\n");
		put_roff(&o, k->doc);
		put(&o, "\n");
		put_range(&o, k);
		put(&o, "\n");
	}
	put(&o, ".SH SEE ALSO\n.BR atlasd (8),\n.BR atlas (1)\n");
	return o.pos;
}
