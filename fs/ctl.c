/* A session's ctl file: its settings as `key value` lines, and the line
 * protocol written to it (settings, `cancel`, `reset`).
 *
 * The lines written through one handle form a batch. Each write is checked
 * at once, so that a bad line fails its own write with EINVAL (EILSEQ for
 * system or stop text that is not UTF-8); the batch is
 * applied at flush (close), all lines or none. Shells write a redirection
 * line by line (bash's printf does), so applying each write on its own would
 * let `printf 'a 1\nbad\n' > ctl` change half the settings. Each complete
 * line is checked once, on top of the lines before it (a batch of many
 * lines costs their length, not its square). After a failed write (a bad
 * line, or too many bytes) later writes and the flush fail with its error
 * and nothing is applied. The setting names and values are the engine's (atlas_params_parse
 * and atlas_params_format); this file only splits lines and picks out the
 * commands. Why the last refused write was refused is shown when ctl is read
 * back, as a comment line (`# error: ...`) that a batch written back skips. */
#include "fs/internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"

/* Commands one write may carry; more is refused rather than truncated. */
#define CTL_MAX_COMMANDS 64

enum ctl_cmd { CMD_NONE, CMD_CANCEL, CMD_RESET };

int fs_ctl_text(struct fs_session *s, char **text, size_t *len)
{
	struct atlas_params p;
	char error[sizeof s->ctl_error];
	pthread_mutex_lock(&s->lock);
	if (s->es)
		atlas_session_get_params(s->es, &p);
	bool gone = !s->es;
	memcpy(error, s->ctl_error, sizeof error);
	pthread_mutex_unlock(&s->lock);
	if (gone)
		return -ENOENT;
	size_t n = atlas_params_format(&p, NULL, 0);
	size_t extra = *error ? strlen("# error: \n") + strlen(error) : 0;
	*text = malloc(n + extra + 1);
	if (!*text)
		return -ENOMEM;
	*len = atlas_params_format(&p, *text, n + 1);
	if (*error)
		*len += (size_t)snprintf(*text + *len, extra + 1, "# error: %s\n", error);
	return 0;
}

/* Parse one line into p or a command. */
static int parse_line(char *line, struct atlas_params *p, bool *stop_seen, bool *settings,
		      enum ctl_cmd *cmd, char *err, size_t errlen)
{
	size_t n = strlen(line);
	if (n && line[n - 1] == '\r')
		line[--n] = 0;
	line += strspn(line, " \t");
	if (!*line || *line == '#')   /* blank, or a comment such as the error line */
		return 0;
	char *value = line + strcspn(line, " \t");
	if (*value)
		*value++ = 0;   /* the value is the rest of the line after one separator */
	if (strcmp(line, "cancel") == 0 || strcmp(line, "reset") == 0) {
		if (*value)
			return atlas_errf(err, errlen, -EINVAL, "%s takes no value", line);
		*cmd = line[0] == 'c' ? CMD_CANCEL : CMD_RESET;
		return 0;
	}
	*settings = true;
	return atlas_params_parse(p, line, value, stop_seen, err, errlen);
}

/* What the lines of a batch set: the settings, from those of the session
 * when the parse began, and the commands in order. */
struct fs_ctl_parse {
	struct atlas_params p;
	enum ctl_cmd cmds[CTL_MAX_COMMANDS];
	size_t n_cmds;
	bool stop_seen, settings;
};

/* Start st from the session's settings: 0 or -ENOENT. */
static int parse_begin(struct fs_session *s, struct fs_ctl_parse *st, char *err, size_t errlen)
{
	memset(st, 0, sizeof *st);
	pthread_mutex_lock(&s->lock);
	if (s->es)
		atlas_session_get_params(s->es, &st->p);
	const bool gone = !s->es;
	pthread_mutex_unlock(&s->lock);
	return gone ? atlas_errf(err, errlen, -ENOENT, "the session is removed") : 0;
}

/* Parse buf[0..size) as lines into st: 0, -EINVAL, -ENOMEM. */
static int parse_lines(struct fs_ctl_parse *st, const char *buf, size_t size, char *err,
		       size_t errlen)
{
	if (memchr(buf, 0, size))
		return atlas_errf(err, errlen, -EINVAL, "NUL byte in a setting");
	char *text = malloc(size + 1);
	if (!text)
		return atlas_errf(err, errlen, -ENOMEM, "out of memory");
	memcpy(text, buf, size);
	text[size] = 0;
	int rc = 0;
	/* memchr within the text, not strchr: a sanitizer's strchr measures the
	 * whole rest of the string first, which made a batch cost its square. */
	for (char *line = text, *next; !rc && line; line = next) {
		next = memchr(line, '\n', size - (size_t)(line - text));
		if (next)
			*next++ = 0;
		enum ctl_cmd cmd = CMD_NONE;
		rc = parse_line(line, &st->p, &st->stop_seen, &st->settings, &cmd, err, errlen);
		if (!rc && cmd != CMD_NONE && st->n_cmds == CTL_MAX_COMMANDS)
			rc = atlas_errf(err, errlen, -EINVAL, "too many commands in one batch");
		if (!rc && cmd != CMD_NONE)
			st->cmds[st->n_cmds++] = cmd;
	}
	free(text);
	return rc;
}

/* Check st's settings against the session (apply false), or set them and
 * run its commands. 0, -EINVAL, -ENOENT. */
static int parse_end(struct fs_session *s, const struct fs_ctl_parse *st, bool apply, char *err,
		     size_t errlen)
{
	int rc = 0;
	pthread_mutex_lock(&s->lock);
	if (!s->es)
		rc = atlas_errf(err, errlen, -ENOENT, "the session is removed");
	if (!rc && st->settings)
		rc = apply ? atlas_session_set_params(s->es, &st->p, err, errlen)
			   : atlas_session_check_params(s->es, &st->p, err, errlen);
	for (size_t i = 0; !rc && apply && i < st->n_cmds; i++) {
		if (st->cmds[i] == CMD_CANCEL)
			atlas_session_cancel(s->es);
		else
			atlas_session_reset(s->es);
	}
	pthread_mutex_unlock(&s->lock);
	return rc;
}

/* The error a batch fails with: -ENOENT, -ENOMEM and -EILSEQ (text that
 * is not UTF-8) as they are, any other as -EINVAL. */
static int batch_error(struct fs_session *s, int rc, const char *err)
{
	log_info("session %s: ctl: %s", s->name, err);
	pthread_mutex_lock(&s->lock);
	snprintf(s->ctl_error, sizeof s->ctl_error, "%s", err);
	pthread_mutex_unlock(&s->lock);
	return rc == -ENOENT || rc == -ENOMEM || rc == -EILSEQ ? rc : -EINVAL;
}

int fs_ctl_write(struct fs_session *s, struct fs_ctl_batch *b, const char *buf, size_t size)
{
	char err[ATLAS_ERRLEN] = "";
	if (b->failed)
		return b->failed;
	if (size > s->fs->cfg.prompt_max - b->len)
		return b->failed = -EFBIG;
	int held = fs_hold(s, size);
	if (held)
		return b->failed = held;
	char *n = realloc(b->text, b->len + size);
	if (!n) {
		fs_unhold(s, size);
		return b->failed = -ENOMEM;
	}
	b->text = n;
	memcpy(b->text + b->len, buf, size);
	b->len += size;
	/* Check the new complete lines, each once, on top of the earlier ones;
	 * an unfinished one waits. */
	const char *end = memrchr(b->text + b->checked, '\n', b->len - b->checked);
	if (!end)
		return 0;
	int rc = 0;
	if (!b->parsed) {
		b->parsed = malloc(sizeof *b->parsed);
		rc = b->parsed ? parse_begin(s, b->parsed, err, sizeof err)
			       : atlas_errf(err, sizeof err, -ENOMEM, "out of memory");
	}
	if (!rc)
		rc = parse_lines(b->parsed, b->text + b->checked,
				 (size_t)(end - (b->text + b->checked)), err, sizeof err);
	if (!rc)
		rc = parse_end(s, b->parsed, false, err, sizeof err);
	b->checked = (size_t)(end - b->text) + 1;
	return rc ? (b->failed = batch_error(s, rc, err)) : 0;
}

/* Every line again, from the session's settings now: another handle may
 * have changed the keys this batch does not set. */
int fs_ctl_flush(struct fs_session *s, struct fs_ctl_batch *b)
{
	char err[ATLAS_ERRLEN] = "";
	int rc = b->failed;
	if (!rc && b->len) {
		struct fs_ctl_parse st;
		rc = parse_begin(s, &st, err, sizeof err);
		if (!rc)
			rc = parse_lines(&st, b->text, b->len, err, sizeof err);
		if (!rc)
			rc = parse_end(s, &st, true, err, sizeof err);
		if (rc) {
			rc = batch_error(s, rc, err);
		} else {
			pthread_mutex_lock(&s->lock);
			s->ctl_error[0] = 0;
			pthread_mutex_unlock(&s->lock);
		}
	}
	fs_unhold(s, b->len);
	free(b->text);
	b->text = NULL;
	b->len = b->checked = 0;
	b->failed = 0;
	free(b->parsed);
	b->parsed = NULL;
	return rc;
}

void fs_ctl_batch_free(struct fs_session *s, struct fs_ctl_batch *b)
{
	fs_unhold(s, b->len);
	free(b->text);
	free(b->parsed);
	b->text = NULL;
	b->parsed = NULL;
	b->len = b->checked = 0;
}
