/* The manifest of kept sessions (manifest.h): JSON through jansson. */
#include "engine/persist/manifest.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"

/* ---- writing ---- */

static json_t *hex_u64(uint64_t v)
{
	char b[17];
	snprintf(b, sizeof b, "%016" PRIx64, v);
	return json_string(b);
}

/* Text as a JSON string, or {"hex": ...} when it is not UTF-8. */
static json_t *text(const char *s, size_t n)
{
	json_t *j = json_stringn(s ? s : "", n);
	if (j)
		return j;
	char *h = malloc(2 * n + 1);
	if (!h)
		return NULL;
	for (size_t i = 0; i < n; i++)
		snprintf(h + 2 * i, 3, "%02x", (unsigned char)s[i]);
	j = json_pack("{s:s#}", "hex", h, (int)(2 * n));
	free(h);
	return j;
}

static json_t *turn_json(const struct persist_turn *t)
{
	return json_pack("{s:I, s:i, s:o, s:I, s:I, s:I, s:o, s:i, s:s}",
			 "number", (json_int_t)t->number, "mode", t->mode,
			 "prompt", text(t->prompt, t->prompt_len),
			 "ctx_start", (json_int_t)t->ctx_start, "n_prompt", (json_int_t)t->n_prompt,
			 "n_generated", (json_int_t)t->n_generated,
			 "out", text(t->out, t->out_len), "error", t->error,
			 "finish", t->finish);
}

static json_t *session_json(const struct persist_session *s)
{
	json_t *tokens = json_array(), *slots = json_array(), *sums = json_array(),
	       *turns = json_array();
	json_t *j = json_pack("{s:s, s:s, s:I, s:I, s:b, s:s, s:i, s:o, s:o, s:o, s:o}",
			      "name", s->name, "params", s->params ? s->params : "",
			      "first_turn", (json_int_t)s->first_turn,
			      "next_turn", (json_int_t)s->next_turn,
			      "ended_with_eot", s->ended_with_eot, "last_error", s->last_error,
			      "kv_tokens", s->kv_tokens, "tokens", tokens, "slots", slots,
			      "sums", sums, "turns", turns);
	if (!j)
		return NULL;
	int bad = 0;
	for (size_t i = 0; i < s->n_tokens; i++)
		bad |= json_array_append_new(tokens, json_integer(s->tokens[i]));
	for (int i = 0; i < s->n_blocks; i++) {
		bad |= json_array_append_new(slots, json_integer(s->slots[i]));
		bad |= json_array_append_new(sums, hex_u64(s->sums[i]));
	}
	for (size_t i = 0; i < s->n_turns; i++)
		bad |= json_array_append_new(turns, turn_json(&s->turns[i]));
	if (bad) {
		json_decref(j);
		return NULL;
	}
	return j;
}

int persist_manifest_write(const char *dir, const struct persist_manifest *m, char *err,
			   size_t errlen)
{
	json_t *sessions = json_array();
	json_t *root = json_pack("{s:i, s:o, s:o, s:i, s:I, s:I, s:o}", "atlas_sessions",
				 PERSIST_VERSION, "model", hex_u64(m->model_id), "vocab",
				 hex_u64(m->vocab_id), "block_size", m->block_size,
				 "block_bytes", (json_int_t)m->block_bytes,
				 "slot_bytes", (json_int_t)m->slot_bytes, "sessions", sessions);
	int bad = !root;
	for (size_t i = 0; !bad && i < m->n_sessions; i++)
		bad |= json_array_append_new(sessions, session_json(&m->sessions[i]));
	if (bad) {
		json_decref(root);
		return atlas_errf(err, errlen, -ENOMEM, "kv_persist: out of memory for the manifest");
	}
	char tmp[4200], path[4200];
	snprintf(tmp, sizeof tmp, "%s/%s.tmp", dir, PERSIST_MANIFEST);
	snprintf(path, sizeof path, "%s/%s", dir, PERSIST_MANIFEST);
	int rc = 0;
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || json_dumpfd(root, fd, JSON_COMPACT) || fsync(fd))
		rc = errno ? -errno : -EIO;
	if (fd >= 0 && close(fd) && !rc)
		rc = -errno;
	if (!rc && rename(tmp, path))
		rc = -errno;
	json_decref(root);
	if (rc) {
		unlink(tmp);
		return atlas_errf(err, errlen, rc, "kv_persist: cannot write %s: %s", path,
				  strerror(-rc));
	}
	/* The rename itself is durable once the directory is. */
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0) {
		fsync(dfd);
		close(dfd);
	}
	return 0;
}

/* ---- reading ---- */

static int parse_u64(json_t *j, uint64_t *v)
{
	const char *s = json_string_value(j);
	char *end;
	if (!s || strlen(s) != 16)
		return -EINVAL;
	*v = strtoull(s, &end, 16);
	return *end ? -EINVAL : 0;
}

static int hexval(char c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* A text field back into malloc'd bytes. */
static int parse_text(json_t *j, char **out, size_t *len)
{
	const char *s;
	size_t n;
	json_t *hex = json_is_object(j) ? json_object_get(j, "hex") : NULL;
	if (json_is_string(j)) {
		s = json_string_value(j);
		n = json_string_length(j);
	} else if (json_is_string(hex) && json_string_length(hex) % 2 == 0) {
		s = json_string_value(hex);
		n = json_string_length(hex) / 2;
	} else {
		return -EINVAL;
	}
	char *b = malloc(n + 1);
	if (!b)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		if (!hex) {
			b[i] = s[i];
			continue;
		}
		int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
		if (hi < 0 || lo < 0) {
			free(b);
			return -EINVAL;
		}
		b[i] = (char)(hi << 4 | lo);
	}
	b[n] = 0;
	*out = b;
	*len = n;
	return 0;
}

static int parse_turn(json_t *j, struct persist_turn *t)
{
	json_t *prompt, *out;
	json_int_t number, ctx_start, n_prompt, n_generated;
	const char *finish;
	if (json_unpack(j, "{s:I, s:i, s:o, s:I, s:I, s:I, s:o, s:i, s:s}", "number", &number,
			"mode", &t->mode, "prompt", &prompt, "ctx_start", &ctx_start, "n_prompt",
			&n_prompt, "n_generated", &n_generated, "out", &out, "error", &t->error,
			"finish", &finish) ||
	    number < 1 || ctx_start < 0 || n_prompt < 0 || n_generated < 0)
		return -EINVAL;
	t->number = (uint64_t)number;
	t->ctx_start = (size_t)ctx_start;
	t->n_prompt = (size_t)n_prompt;
	t->n_generated = (size_t)n_generated;
	snprintf(t->finish, sizeof t->finish, "%s", finish);
	int rc = parse_text(prompt, &t->prompt, &t->prompt_len);
	return rc ? rc : parse_text(out, &t->out, &t->out_len);
}

static int parse_session(json_t *j, struct persist_session *s)
{
	json_t *tokens, *slots, *sums, *turns;
	const char *name, *params, *last_error;
	json_int_t first, next;
	int eot;
	if (json_unpack(j, "{s:s, s:s, s:I, s:I, s:b, s:s, s:i, s:o, s:o, s:o, s:o}", "name",
			&name, "params", &params, "first_turn", &first, "next_turn", &next,
			"ended_with_eot", &eot, "last_error", &last_error, "kv_tokens",
			&s->kv_tokens, "tokens", &tokens, "slots", &slots, "sums", &sums, "turns",
			&turns) ||
	    !json_is_array(tokens) || !json_is_array(slots) || !json_is_array(sums) ||
	    !json_is_array(turns) || json_array_size(slots) != json_array_size(sums) ||
	    strlen(name) >= sizeof s->name || first < 1 || next < first || s->kv_tokens < 0)
		return -EINVAL;
	snprintf(s->name, sizeof s->name, "%s", name);
	snprintf(s->last_error, sizeof s->last_error, "%s", last_error);
	s->first_turn = (uint64_t)first;
	s->next_turn = (uint64_t)next;
	s->ended_with_eot = eot;
	s->n_tokens = json_array_size(tokens);
	s->n_blocks = (int)json_array_size(slots);
	s->n_turns = json_array_size(turns);
	s->params = strdup(params);
	s->tokens = calloc(s->n_tokens + 1, sizeof *s->tokens);
	s->slots = calloc((size_t)s->n_blocks + 1, sizeof *s->slots);
	s->sums = calloc((size_t)s->n_blocks + 1, sizeof *s->sums);
	s->turns = calloc(s->n_turns + 1, sizeof *s->turns);
	if (!s->params || !s->tokens || !s->slots || !s->sums || !s->turns)
		return -ENOMEM;
	for (size_t i = 0; i < s->n_tokens; i++) {
		json_t *t = json_array_get(tokens, i);
		if (!json_is_integer(t) || json_integer_value(t) < 0 ||
		    json_integer_value(t) > INT32_MAX)
			return -EINVAL;
		s->tokens[i] = (int32_t)json_integer_value(t);
	}
	for (int i = 0; i < s->n_blocks; i++) {
		json_t *slot = json_array_get(slots, (size_t)i);
		if (!json_is_integer(slot) || json_integer_value(slot) < 0 ||
		    json_integer_value(slot) > INT32_MAX ||
		    parse_u64(json_array_get(sums, (size_t)i), &s->sums[i]))
			return -EINVAL;
		s->slots[i] = (uint32_t)json_integer_value(slot);
	}
	for (size_t i = 0; i < s->n_turns; i++) {
		int rc = parse_turn(json_array_get(turns, i), &s->turns[i]);
		if (rc)
			return rc;
	}
	return (size_t)s->kv_tokens > s->n_tokens ? -EINVAL : 0;
}

int persist_manifest_read(const char *dir, struct persist_manifest *m, char *err, size_t errlen)
{
	char path[4200];
	json_error_t je;
	json_t *sessions;
	json_int_t block_bytes, slot_bytes;
	int version;
	memset(m, 0, sizeof *m);
	snprintf(path, sizeof path, "%s/%s", dir, PERSIST_MANIFEST);
	if (access(path, F_OK))
		return -errno;
	json_t *root = json_load_file(path, 0, &je);
	if (!root)
		return atlas_errf(err, errlen, -EINVAL, "%s:%d: %s", path, je.line, je.text);
	json_t *model, *vocab;
	int rc = 0;
	if (json_unpack(root, "{s:i, s:o, s:o, s:i, s:I, s:I, s:o}", "atlas_sessions", &version,
			"model", &model, "vocab", &vocab, "block_size", &m->block_size,
			"block_bytes", &block_bytes, "slot_bytes", &slot_bytes, "sessions",
			&sessions) ||
	    version != PERSIST_VERSION || !json_is_array(sessions) ||
	    parse_u64(model, &m->model_id) || parse_u64(vocab, &m->vocab_id)) {
		rc = atlas_errf(err, errlen, -EINVAL, "%s: not a version %d manifest", path,
				PERSIST_VERSION);
		goto out;
	}
	m->block_bytes = (uint64_t)block_bytes;
	m->slot_bytes = (uint64_t)slot_bytes;
	m->n_sessions = json_array_size(sessions);
	m->sessions = calloc(m->n_sessions + 1, sizeof *m->sessions);
	if (!m->sessions) {
		rc = atlas_errf(err, errlen, -ENOMEM, "%s: out of memory", path);
		goto out;
	}
	for (size_t i = 0; i < m->n_sessions; i++)
		if ((rc = parse_session(json_array_get(sessions, i), &m->sessions[i]))) {
			atlas_errf(err, errlen, rc, "%s: session %zu: %s", path, i,
				   rc == -ENOMEM ? "out of memory" : "malformed");
			goto out;
		}
out:
	json_decref(root);
	if (rc)
		persist_manifest_free(m);
	return rc;
}

void persist_session_free(struct persist_session *s)
{
	for (size_t i = 0; s->turns && i < s->n_turns; i++) {
		free(s->turns[i].prompt);
		free(s->turns[i].out);
	}
	free(s->turns);
	free(s->params);
	free(s->tokens);
	free(s->slots);
	free(s->sums);
	memset(s, 0, sizeof *s);
}

void persist_manifest_free(struct persist_manifest *m)
{
	for (size_t i = 0; m->sessions && i < m->n_sessions; i++)
		persist_session_free(&m->sessions[i]);
	free(m->sessions);
	memset(m, 0, sizeof *m);
}
