/* A session's ctl file: its settings as `key value` lines, and the line
 * protocol written to it (settings, `cancel`, `reset`).
 *
 * The lines written through one handle form a batch. Each write is checked
 * at once, so that a bad line fails its own write with EINVAL; the batch is
 * applied at flush (close), all lines or none. Shells write a redirection
 * line by line (bash's printf does), so applying each write on its own would
 * let `printf 'a 1\nbad\n' > ctl` change half the settings. After a failed
 * write the batch is poisoned: later writes fail too and the flush applies
 * nothing. The setting names and values are the engine's (atlas_params_parse
 * and atlas_params_format); this file only splits lines and picks out the
 * commands. */
#include "fs/internal.h"

#include <errno.h>
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
	pthread_mutex_lock(&s->lock);
	if (s->es)
		atlas_session_get_params(s->es, &p);
	bool gone = !s->es;
	pthread_mutex_unlock(&s->lock);
	if (gone)
		return -ENOENT;
	size_t n = atlas_params_format(&p, NULL, 0);
	*text = malloc(n + 1);
	if (!*text)
		return -ENOMEM;
	*len = atlas_params_format(&p, *text, n + 1);
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
	if (!*line)
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

/* Parse buf[0..size) as lines; with `apply`, set them and run the commands.
 * Every line parses or nothing changes. 0, -EINVAL for a bad batch, -ENOENT
 * once the session is removed, -ENOMEM. */
static int run_lines(struct fs_session *s, const char *buf, size_t size, bool apply)
{
	char err[ATLAS_ERRLEN] = "";
	char *text = malloc(size + 1);
	if (!text)
		return -ENOMEM;
	memcpy(text, buf, size);
	text[size] = 0;
	int rc = 0;
	if (memchr(text, 0, size))
		rc = atlas_errf(err, sizeof err, -EINVAL, "NUL byte in a setting");

	pthread_mutex_lock(&s->lock);
	struct atlas_params p;
	enum ctl_cmd cmds[CTL_MAX_COMMANDS];
	size_t n_cmds = 0;
	bool stop_seen = false, settings = false;
	if (!rc && !s->es)
		rc = atlas_errf(err, sizeof err, -ENOENT, "the session is removed");
	if (!rc)
		atlas_session_get_params(s->es, &p);
	for (char *line = text, *next; !rc && line; line = next) {
		next = strchr(line, '\n');
		if (next)
			*next++ = 0;
		enum ctl_cmd cmd = CMD_NONE;
		rc = parse_line(line, &p, &stop_seen, &settings, &cmd, err, sizeof err);
		if (!rc && cmd != CMD_NONE && n_cmds == CTL_MAX_COMMANDS)
			rc = atlas_errf(err, sizeof err, -EINVAL, "too many commands in one write");
		if (!rc && cmd != CMD_NONE)
			cmds[n_cmds++] = cmd;
	}
	if (!rc && settings)
		rc = apply ? atlas_session_set_params(s->es, &p, err, sizeof err)
			   : atlas_session_check_params(s->es, &p, err, sizeof err);
	for (size_t i = 0; !rc && apply && i < n_cmds; i++) {
		if (cmds[i] == CMD_CANCEL)
			atlas_session_cancel(s->es);
		else
			atlas_session_reset(s->es);
	}
	pthread_mutex_unlock(&s->lock);
	free(text);
	if (rc) {
		log_info("session %s: ctl: %s", s->name, err);
		return rc == -ENOENT ? rc : -EINVAL;
	}
	return 0;
}

int fs_ctl_write(struct fs_session *s, struct fs_ctl_batch *b, const char *buf, size_t size)
{
	if (b->poisoned)
		return -EINVAL;
	if (size > FS_IN_MAX - b->len)
		return -EFBIG;
	char *n = realloc(b->text, b->len + size);
	if (!n)
		return -ENOMEM;
	b->text = n;
	memcpy(b->text + b->len, buf, size);
	b->len += size;
	/* Check the complete lines; an unfinished one waits for the flush. */
	const char *end = memrchr(b->text, '\n', b->len);
	int rc = end ? run_lines(s, b->text, (size_t)(end - b->text), false) : 0;
	if (rc == -EINVAL)
		b->poisoned = true;
	return rc;
}

int fs_ctl_flush(struct fs_session *s, struct fs_ctl_batch *b)
{
	int rc = 0;
	if (!b->poisoned && b->len)
		rc = run_lines(s, b->text, b->len, true);
	b->len = 0;
	b->poisoned = false;
	return rc;
}

void fs_ctl_batch_free(struct fs_ctl_batch *b)
{
	free(b->text);
	b->text = NULL;
	b->len = 0;
}
