/* The session table of the FUSE tree: session directories by name and by
 * inode id, their references, and their removal (rmdir, and every session
 * at the end of the mount). Each entry owns one engine session handle.
 *
 * A session lives while the table or an open handle refers to it: the
 * table's ref is dropped at removal, a handle's at release. A removed
 * session is no longer found by name, and by inode only for handles that
 * were open before (fstat of an open `out` after rmdir). */
#include "fs/internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"

int fs_session_create(struct atlas_fs *fs, const char *name, uid_t uid, gid_t gid,
		      struct fs_session **out, char *err, size_t errlen)
{
	struct fs_session *s = calloc(1, sizeof *s);
	if (!s)
		return atlas_errf(err, errlen, -ENOMEM, "session '%s': out of memory", name);
	int rc = atlas_session_open(fs->engine, name, &s->es, err, errlen);
	if (rc) {
		free(s);
		return rc;
	}
	s->fs = fs;
	s->uid = uid;
	s->gid = gid;
	s->key = (uintptr_t)s->es;
	snprintf(s->name, sizeof s->name, "%s", name);
	clock_gettime(CLOCK_REALTIME, &s->born);
	pthread_mutex_init(&s->lock, NULL);

	pthread_mutex_lock(&fs->lock);
	s->id = fs->next_id++;
	s->refs = out ? 2 : 1;
	struct fs_session **tail = &fs->sessions;
	while (*tail)
		tail = &(*tail)->next;
	*tail = s;
	pthread_mutex_unlock(&fs->lock);
	if (out)
		*out = s;
	return 0;
}

struct fs_session *fs_session_by_name(struct atlas_fs *fs, const char *name)
{
	pthread_mutex_lock(&fs->lock);
	struct fs_session *s = fs->sessions;
	while (s && (s->removed || strcmp(s->name, name) != 0))
		s = s->next;
	if (s)
		s->refs++;
	pthread_mutex_unlock(&fs->lock);
	return s;
}

struct fs_session *fs_session_by_id(struct atlas_fs *fs, uint64_t id, bool removed_too)
{
	pthread_mutex_lock(&fs->lock);
	struct fs_session *s = fs->sessions;
	while (s && ((s->removed && !removed_too) || s->id != id))
		s = s->next;
	if (s)
		s->refs++;
	pthread_mutex_unlock(&fs->lock);
	return s;
}

void fs_session_free(struct fs_session *s)
{
	pthread_mutex_destroy(&s->lock);
	free(s);
}

void fs_session_put(struct fs_session *s)
{
	struct atlas_fs *fs = s->fs;
	pthread_mutex_lock(&fs->lock);
	bool last = --s->refs == 0;
	if (last) {
		struct fs_session **pp = &fs->sessions;
		while (*pp != s)
			pp = &(*pp)->next;
		*pp = s->next;
	}
	pthread_mutex_unlock(&fs->lock);
	if (last)
		fs_session_free(s);
}

void fs_session_close(struct fs_session *s)
{
	pthread_mutex_lock(&s->lock);
	struct atlas_session *es = s->es;
	s->es = NULL;
	pthread_mutex_unlock(&s->lock);
	if (es)
		atlas_session_close(es);
}

int fs_session_remove(struct atlas_fs *fs, const char *name)
{
	pthread_mutex_lock(&fs->lock);
	struct fs_session *s = fs->sessions;
	while (s && (s->removed || strcmp(s->name, name) != 0))
		s = s->next;
	if (!s) {
		pthread_mutex_unlock(&fs->lock);
		return -ENOENT;
	}
	s->removed = true;   /* the list's ref now keeps it until this function ends */
	pthread_mutex_unlock(&fs->lock);

	fs_session_close(s);
	/* Parked readers and pollers of s are answered by the waker thread: no
	 * reply storm and no poll notification from inside this handler. */
	fs_wake_session(fs, s);
	fs_session_put(s);
	log_info("session %s removed", name);
	return 0;
}

struct fs_session *fs_session_take_next(struct atlas_fs *fs)
{
	pthread_mutex_lock(&fs->lock);
	struct fs_session *s = fs->sessions;
	while (s && s->removed)
		s = s->next;
	if (s)
		s->removed = true;
	pthread_mutex_unlock(&fs->lock);
	return s;
}
