/* Keeping sessions across a restart (kv_persist, DESIGN §8).
 *
 * Stop (atlas_engine_persist, on the engine thread): every turn still
 * running ends as cancelled; every session's KV moves to the disk tier,
 * whose file has a name in kv_dir (PERSIST_BLOCKS); once the moves have
 * ended the file is synced and the manifest (persist/manifest.h) written:
 * each session's name, settings, turns, context tokens, and the disk slots
 * and hashes of its KV blocks.
 *
 * Start (load, then restore, before the engine thread runs): the manifest
 * is read and checked against this model (persist/identity.h). Another
 * vocabulary: nothing comes back and the manifest is renamed .stale. Another
 * model, backend or block geometry: the sessions come back without their
 * KV, which their next turn recomputes. Otherwise each session's KV blocks
 * are claimed in the block file as they are; a block whose data no longer
 * match their hash (the disk tier checks every read) makes that session
 * recompute its context (sched: SCHED_DROPPED). Each case says so in a log
 * line. Sessions come back as open sessions of the engine that no handle
 * holds yet: atlas_session_open of their name takes them, and
 * atlas_engine_kept lists them (the filesystem makes their directories).
 *
 * The manifest stays in place after a start: the slots it lists stay
 * claimed until their session moves its KV back, and a later write there
 * changes the data under the hash, so after a crash a start comes back to
 * the last stop, with the KV that still matches. A stop writes a new one.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "engine/hss/disk.h"
#include "engine/internal.h"
#include "engine/persist/identity.h"
#include "engine/persist/manifest.h"

const char *persist_file(const struct atlas_config *c)
{
	return c->kv_persist ? PERSIST_BLOCKS : NULL;
}

/* Set the manifest aside under a name no start reads. */
static void set_aside(const char *dir)
{
	char from[4200], to[4200];
	snprintf(from, sizeof from, "%s/%s", dir, PERSIST_MANIFEST);
	snprintf(to, sizeof to, "%s/%s.stale", dir, PERSIST_MANIFEST);
	if (rename(from, to))
		log_warn("kv_persist: cannot rename %s: %s", from, strerror(errno));
}

static void forget_kv(struct persist_manifest *m)
{
	for (size_t i = 0; i < m->n_sessions; i++) {
		m->sessions[i].kv_tokens = 0;
		m->sessions[i].n_blocks = 0;
	}
}

int persist_load(struct atlas_engine *e, char *err, size_t errlen)
{
	const struct atlas_config *c = &e->cfg;
	if (!c->kv_persist)
		return 0;
	if (e->x->mc->n_linear_layers)
		log_info("kv_persist: %s has linear-attention layers, whose recurrent state the "
			 "block file does not hold: kept sessions come back with their history "
			 "and settings, and their next turn recomputes the context",
			 e->x->mc->architecture);
	struct persist_identity id;
	int rc = persist_identity(c->model, e->x->be->info.name, e->vocab, &id, err, errlen);
	if (rc)
		return rc;
	e->model_id = id.model;
	e->vocab_id = id.vocab;
	struct persist_manifest *m = calloc(1, sizeof *m);
	if (!m)
		return atlas_errf(err, errlen, -ENOMEM, "out of memory");
	char why[512];
	rc = persist_manifest_read(c->kv_dir, m, why, sizeof why);
	if (rc == -EINVAL) {
		log_warn("kv_persist: %s; starting without kept sessions (the file is now %s.stale)",
			 why, PERSIST_MANIFEST);
		set_aside(c->kv_dir);
	} else if (rc && rc != -ENOENT) {
		log_warn("kv_persist: %s; starting without kept sessions", why);
	} else if (!rc && m->vocab_id != id.vocab) {
		log_warn("kv_persist: the sessions kept in %s were written with another tokenizer; "
			 "they are not brought back (the file is now %s.stale)", c->kv_dir,
			 PERSIST_MANIFEST);
		set_aside(c->kv_dir);
		rc = -ESTALE;
	} else if (!rc && (m->model_id != id.model || m->block_size != e->x->pool.kv.block_size ||
			   m->block_bytes != (uint64_t)e->x->pool.kv.bytes_per_block)) {
		log_warn("kv_persist: the KV kept in %s was computed by another model, backend or "
			 "KV layout; %zu sessions come back and recompute their contexts",
			 c->kv_dir, m->n_sessions);
		forget_kv(m);
	}
	if (rc) {
		persist_manifest_free(m);
		free(m);
		m = NULL;
	}
	bool any_kv = false;
	for (size_t i = 0; m && i < m->n_sessions; i++)
		any_kv |= m->sessions[i].n_blocks > 0;
	if (!any_kv) {
		/* No slot of the block file is worth anything: start it empty. */
		char path[4200];
		snprintf(path, sizeof path, "%s/%s", c->kv_dir, PERSIST_BLOCKS);
		if (unlink(path) && errno != ENOENT)
			log_warn("kv_persist: cannot remove %s: %s", path, strerror(errno));
	}
	e->kept = m;
	return 0;
}

/* Apply the `key value` lines of text to p. */
static int parse_params(struct atlas_params *p, const char *text, char *err, size_t errlen)
{
	char *copy = strdup(text), *save = NULL;
	bool stop_seen = false;
	int rc = copy ? 0 : -ENOMEM;
	for (char *line = copy ? strtok_r(copy, "\n", &save) : NULL; !rc && line;
	     line = strtok_r(NULL, "\n", &save)) {
		char *value = strchr(line, ' ');
		if (value)
			*value++ = 0;
		rc = atlas_params_parse(p, line, value ? value : "", &stop_seen, err, errlen);
	}
	free(copy);
	return rc;
}

static int restore_turns(struct atlas_session *s, struct persist_session *k)
{
	s->turns = calloc(k->n_turns + 1, sizeof *s->turns);
	if (!s->turns)
		return -ENOMEM;
	s->turns_cap = k->n_turns + 1;
	for (size_t i = 0; i < k->n_turns; i++) {
		struct persist_turn *pt = &k->turns[i];
		struct turn *t = calloc(1, sizeof *t);
		if (!t)
			return -ENOMEM;
		*t = (struct turn){ .number = pt->number, .mode = (enum atlas_mode)pt->mode,
				    .prompt = pt->prompt, .prompt_len = pt->prompt_len,
				    .ctx_start = pt->ctx_start, .n_prompt = pt->n_prompt,
				    .n_generated = pt->n_generated, .out = pt->out,
				    .out_len = pt->out_len, .out_cap = pt->out_len, .done = true,
				    .error = pt->error };
		snprintf(t->finish, sizeof t->finish, "%s", pt->finish);
		pt->prompt = pt->out = NULL;   /* the turn owns them now */
		s->turns[s->n_turns++] = t;
	}
	return 0;
}

/* One kept session as an open session that no handle holds yet. */
static int restore_session(struct atlas_engine *e, struct persist_session *k)
{
	char err[ATLAS_ERRLEN];
	struct atlas_session *s;
	int rc = atlas_session_open(e, k->name, &s, err, sizeof err);
	if (rc) {
		log_warn("kv_persist: session %s does not come back: %s", k->name, err);
		return rc;
	}
	s->kept = true;
	s->held = false;
	struct atlas_params p = s->params;
	if ((rc = parse_params(&p, k->params, err, sizeof err)) ||
	    (rc = params_validate(e, &p, err, sizeof err)))
		log_warn("kv_persist: session %s: its settings (%s) give way to the defaults",
			 k->name, err);
	else
		s->params = p;
	s->first_turn = k->first_turn;
	s->next_turn = k->next_turn;
	s->ended_with_eot = k->ended_with_eot;
	snprintf(s->last_error, sizeof s->last_error, "%s", k->last_error);
	if ((rc = restore_turns(s, k)) || (rc = sched_req_append(&s->req, k->tokens, k->n_tokens)))
		return rc;
	if (k->n_tokens > (size_t)e->context) {
		log_warn("kv_persist: session %s: its context of %zu tokens is more than this "
			 "engine's %d; its next turn fails", k->name, k->n_tokens, e->context);
		return 0;
	}
	if (k->kv_tokens > 0 && (rc = seq_adopt_disk(&e->x->pool, &s->req.seq, k->kv_tokens,
						     k->slots, k->sums, k->n_blocks)))
		log_warn("kv_persist: session %s: its KV blocks cannot be claimed (%s); its next "
			 "turn recomputes its context", k->name, strerror(-rc));
	return 0;
}

int persist_restore(struct atlas_engine *e)
{
	struct persist_manifest *m = e->kept;
	if (!m)
		return 0;
	e->kept = NULL;
	struct seq_pool *pool = &e->x->pool;
	if (m->slot_bytes != disk_slot_bytes(pool->disk)) {
		log_warn("kv_persist: the block file's slots were %llu bytes and are %zu now; the "
			 "kept sessions recompute their contexts", (unsigned long long)m->slot_bytes,
			 disk_slot_bytes(pool->disk));
		forget_kv(m);
	}
	size_t back = 0, with_kv = 0;
	int rc = 0;
	for (size_t i = 0; i < m->n_sessions && rc != -ENOMEM; i++) {
		rc = restore_session(e, &m->sessions[i]);
		back += !rc;
	}
	for (struct atlas_session *s = e->sessions; s; s = s->next)
		with_kv += s->kept && s->req.seq.n_blocks > 0;
	if (back)
		log_info("kv_persist: %zu sessions back from %s, %zu with their KV on disk", back,
			 e->cfg.kv_dir, with_kv);
	persist_manifest_free(m);
	free(m);
	return rc == -ENOMEM ? rc : 0;
}

/* ---- stop ---- */

/* KV worth keeping: written positions, of models with attention layers
 * only (a recurrent state has no place in the block file: without it the
 * attention layers' KV alone cannot resume a session). */
static int kv_to_keep(const struct atlas_engine *e, const struct atlas_session *s)
{
	return !e->x->mc->n_linear_layers && !s->req.forgotten ? s->req.seq.n_tokens : 0;
}

/* Start the moves that are left; whether any is on its way. */
static bool move_all_to_disk(struct atlas_engine *e)
{
	struct seq_pool *pool = &e->x->pool;
	bool moving = false;
	seq_pool_poll(pool);
	for (struct atlas_session *s = e->sessions; s; s = s->next) {
		const int n = kv_to_keep(e, s);
		if (s->closed || !n || s->req.seq.move_error)
			continue;
		seq_to_disk(pool, &s->req.seq, n);
		moving |= s->req.seq.n_moving > 0;
	}
	return moving || pool->n_active > 0;
}

static int keep_session(struct atlas_engine *e, struct atlas_session *s, struct persist_session *k)
{
	char params[8192];
	atlas_params_format(&s->params, params, sizeof params);
	snprintf(k->name, sizeof k->name, "%s", s->name);
	snprintf(k->last_error, sizeof k->last_error, "%s", s->last_error);
	k->params = strdup(params);
	k->first_turn = s->first_turn;
	k->next_turn = s->next_turn;
	k->ended_with_eot = s->ended_with_eot;
	k->tokens = s->req.tokens;          /* borrowed until the manifest is written */
	k->n_tokens = s->req.n_tokens;
	k->turns = calloc(s->n_turns + 1, sizeof *k->turns);
	if (!k->params || !k->turns)
		return -ENOMEM;
	k->n_turns = s->n_turns;
	for (size_t i = 0; i < s->n_turns; i++) {
		const struct turn *t = s->turns[i];
		k->turns[i] = (struct persist_turn){
			.number = t->number, .mode = (int)t->mode, .prompt = t->prompt,
			.prompt_len = t->prompt_len, .ctx_start = t->ctx_start,
			.n_prompt = t->n_prompt, .n_generated = t->n_generated, .out = t->out,
			.out_len = t->out_len, .error = t->error };
		snprintf(k->turns[i].finish, sizeof k->turns[i].finish, "%s", t->finish);
	}
	const int n = kv_to_keep(e, s);
	const int nb = n ? kv_blocks_for(&e->x->pool.kv, n) : 0;
	if (!nb)
		return 0;
	k->slots = calloc((size_t)nb, sizeof *k->slots);
	k->sums = calloc((size_t)nb, sizeof *k->sums);
	if (!k->slots || !k->sums)
		return -ENOMEM;
	if (seq_disk_slots(&e->x->pool, &s->req.seq, n, k->slots, k->sums)) {
		log_warn("kv_persist: session %s: its KV did not all reach the disk tier (%s); its "
			 "next turn recomputes its context", s->name,
			 s->req.seq.move_error ? strerror(-s->req.seq.move_error) : "no room");
		return 0;
	}
	k->kv_tokens = n;
	k->n_blocks = nb;
	return 0;
}

/* What the manifest borrowed goes back to its sessions before it is freed. */
static void unborrow(struct persist_manifest *m)
{
	for (size_t i = 0; i < m->n_sessions; i++) {
		struct persist_session *k = &m->sessions[i];
		k->tokens = NULL;
		for (size_t t = 0; k->turns && t < k->n_turns; t++)
			k->turns[t].prompt = k->turns[t].out = NULL;
	}
}

static int write_manifest(struct atlas_engine *e, char *err, size_t errlen)
{
	struct persist_manifest m = {
		.model_id = e->model_id, .vocab_id = e->vocab_id,
		.block_size = e->x->pool.kv.block_size,
		.block_bytes = (uint64_t)e->x->pool.kv.bytes_per_block,
		.slot_bytes = disk_slot_bytes(e->x->pool.disk),
	};
	size_t n = 0, blocks = 0;
	for (struct atlas_session *s = e->sessions; s; s = s->next)
		n += !s->closed;
	m.sessions = calloc(n + 1, sizeof *m.sessions);
	int rc = m.sessions ? 0 : -ENOMEM;
	for (struct atlas_session *s = e->sessions; !rc && s; s = s->next)
		if (!s->closed) {
			rc = keep_session(e, s, &m.sessions[m.n_sessions]);
			blocks += (size_t)m.sessions[m.n_sessions++].n_blocks;
		}
	if (rc)
		atlas_errf(err, errlen, rc, "kv_persist: out of memory for the manifest");
	else if ((rc = disk_tier_sync(e->x->pool.disk)))
		atlas_errf(err, errlen, rc, "kv_persist: syncing %s/%s: %s", e->cfg.kv_dir,
			   PERSIST_BLOCKS, strerror(-rc));
	else if (!(rc = persist_manifest_write(e->cfg.kv_dir, &m, err, errlen)))
		log_info("kv_persist: %zu sessions kept in %s (%zu KV blocks)", m.n_sessions,
			 e->cfg.kv_dir, blocks);
	unborrow(&m);
	persist_manifest_free(&m);
	return rc;
}

void persist_run(struct atlas_engine *e)
{
	for (struct atlas_session *s = e->sessions; s; s = s->next) {
		session_end_turn(s, -ECANCELED, "cancelled", "atlasd stopped during this turn");
		s->req.seq.move_error = 0;
	}
	while (move_all_to_disk(e))
		engine_wait_for_moves(e);
	e->persist_rc = write_manifest(e, e->persist_err, sizeof e->persist_err);
	e->persist = PERSIST_DONE;
	pthread_cond_broadcast(&e->job_done);
}

int atlas_engine_persist(struct atlas_engine *e, char *err, size_t errlen)
{
	if (!e->cfg.kv_persist)
		return 0;
	pthread_mutex_lock(&e->lock);
	if (e->persist == PERSIST_NONE)
		e->persist = PERSIST_ASKED;
	pthread_cond_signal(&e->wake);
	while (e->persist != PERSIST_DONE)
		pthread_cond_wait(&e->job_done, &e->lock);
	const int rc = e->persist_rc;
	if (rc)
		snprintf(err, errlen, "%s", e->persist_err);
	pthread_mutex_unlock(&e->lock);
	return rc;
}

int atlas_engine_kept(struct atlas_engine *e, char (*names)[64], int max)
{
	int n = 0;
	pthread_mutex_lock(&e->lock);
	for (struct atlas_session *s = e->sessions; s; s = s->next)
		if (s->kept && !s->held && !s->closed) {
			if (n < max)
				snprintf(names[n], sizeof names[n], "%s", s->name);
			n++;
		}
	pthread_mutex_unlock(&e->lock);
	return n;
}
