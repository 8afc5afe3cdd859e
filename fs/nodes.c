/* The names of the tree: inodes, attributes, permissions, lookup,
 * directories, and the session directories made and removed with mkdir and
 * rmdir.
 *
 * Owners: a session and its files belong to the user who made it (mkdir)
 * or to session_owner (s1..sN), with modes for the owner alone; the root,
 * README and ctl/ belong to ctl_owner. The root is writable by everyone and
 * sticky, as /tmp is: anyone who reaches the mount may make a session, and
 * only its owner (or root) may remove it. Every request checks the caller
 * against these modes itself, so that they hold without
 * default_permissions too; other users see a session's name and owner, and
 * nothing inside it. */
#include "fs/internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"

const char *const fs_sfile_names[SF_END] = {
	[SF_DIR] = "", [SF_IN] = "in", [SF_OUT] = "out", [SF_CTL] = "ctl",
	[SF_HISTORY] = "history", [SF_STATUS] = "status",
};

/* Modes of a session's files, for its owner alone: prompts in, answers
 * out, settings both ways. */
static const mode_t sfile_modes[SF_END] = {
	[SF_DIR] = S_IFDIR | 0500, [SF_IN] = S_IFREG | 0200, [SF_OUT] = S_IFREG | 0400,
	[SF_CTL] = S_IFREG | 0600, [SF_HISTORY] = S_IFREG | 0400, [SF_STATUS] = S_IFREG | 0400,
};

struct fixed_node {
	fuse_ino_t parent;
	const char *name;
	mode_t mode;
};

static const struct fixed_node fixed[NODE_FIXED_END] = {
	[NODE_ROOT] = { NODE_ROOT, "", S_IFDIR | S_ISVTX | 0777 },
	[NODE_README] = { NODE_ROOT, "README", S_IFREG | 0444 },
	[NODE_CTL] = { NODE_ROOT, "ctl", S_IFDIR | 0555 },
	[NODE_CTL_SLOTS] = { NODE_CTL, "slots", S_IFREG | 0444 },
	[NODE_CTL_KV] = { NODE_CTL, "kv", S_IFREG | 0444 },
	[NODE_CTL_SPEC] = { NODE_CTL, "spec", S_IFREG | 0444 },
	[NODE_CTL_EP] = { NODE_CTL, "ep", S_IFREG | 0444 },
	[NODE_CTL_ENGINE] = { NODE_CTL, "engine", S_IFREG | 0444 },
	[NODE_CTL_METRICS] = { NODE_CTL, "metrics", S_IFREG | 0444 },
	[NODE_CTL_CONFIG] = { NODE_CTL, "config", S_IFREG | 0444 },
};

static fuse_ino_t session_ino(const struct fs_session *s, enum fs_sfile f)
{
	return FS_INO_SESSIONS + s->id * FS_INO_STRIDE + f;
}

bool fs_ino_session(fuse_ino_t ino, uint64_t *id, enum fs_sfile *f)
{
	if (ino < FS_INO_SESSIONS || (ino - FS_INO_SESSIONS) % FS_INO_STRIDE >= SF_END)
		return false;
	*id = (ino - FS_INO_SESSIONS) / FS_INO_STRIDE;
	*f = (enum fs_sfile)((ino - FS_INO_SESSIONS) % FS_INO_STRIDE);
	return true;
}

static void fill(fuse_ino_t ino, mode_t mode, uid_t uid, gid_t gid, const struct timespec *t,
		 struct stat *st)
{
	memset(st, 0, sizeof *st);
	st->st_ino = ino;
	st->st_mode = mode;
	st->st_nlink = S_ISDIR(mode) ? 2 : 1;
	st->st_uid = uid;
	st->st_gid = gid;
	st->st_blksize = 4096;
	st->st_atim = st->st_mtim = st->st_ctim = *t;
}

static unsigned count_sessions(struct atlas_fs *fs)
{
	unsigned n = 0;
	pthread_mutex_lock(&fs->lock);
	for (struct fs_session *s = fs->sessions; s; s = s->next)
		n += !s->removed;
	pthread_mutex_unlock(&fs->lock);
	return n;
}

/* Attributes of ino; -ENOENT for an unknown or stale inode. With
 * removed_too, the files of a removed session that is still open keep
 * their attributes (fstat of an open `out` after rmdir). */
static int node_attr(struct atlas_fs *fs, fuse_ino_t ino, bool removed_too, struct stat *st)
{
	if (ino >= NODE_ROOT && ino < NODE_FIXED_END) {
		fill(ino, fixed[ino].mode, fs->ctl_uid, fs->ctl_gid, &fs->born, st);
		if (ino == NODE_ROOT)
			st->st_nlink = 3 + count_sessions(fs);
		return 0;
	}
	uint64_t id;
	enum fs_sfile f;
	if (!fs_ino_session(ino, &id, &f))
		return -ENOENT;
	struct fs_session *s = fs_session_by_id(fs, id, removed_too);
	if (!s)
		return -ENOENT;
	fill(ino, sfile_modes[f], s->uid, s->gid, &s->born, st);
	/* history has its real size, so that tail -f and less +F follow it; out
	 * the bytes of every answer so far, which only grows (a size that fell
	 * would be taken for a truncation that out, a stream, cannot seek back
	 * over). */
	if (f == SF_HISTORY || f == SF_OUT) {
		uint64_t history = 0, answers = 0;
		pthread_mutex_lock(&s->lock);
		if (s->es)
			atlas_session_sizes(s->es, &history, &answers);
		pthread_mutex_unlock(&s->lock);
		st->st_size = (off_t)(f == SF_HISTORY ? history : answers);
	}
	fs_session_put(s);
	return 0;
}

/* Whether a caller may access a node of attributes st for mask, by the
 * bits of the owner (its uid) or of others; root needs no bit but an
 * execute bit of a file. */
static bool mode_allows(const struct fuse_ctx *c, const struct stat *st, int mask)
{
	if (c->uid == 0)
		return !(mask & X_OK) || S_ISDIR(st->st_mode) || (st->st_mode & 0111);
	mode_t bits = c->uid == st->st_uid ? st->st_mode >> 6 : st->st_mode;
	return (mask & (int)bits & 7) == (mask & 7);
}

int fs_permission(fuse_req_t req, fuse_ino_t ino, int mask)
{
	struct atlas_fs *fs = fuse_req_userdata(req);
	const struct fuse_ctx *c = fuse_req_ctx(req);
	struct stat st;
	int rc = node_attr(fs, ino, true, &st);
	if (rc)
		return rc;
	/* A session's file is reached through its directory: without
	 * default_permissions the kernel does not check that on a name it
	 * has cached for another user. */
	uint64_t id;
	enum fs_sfile f;
	if (fs_ino_session(ino, &id, &f) && f != SF_DIR) {
		struct stat dir;
		rc = node_attr(fs, ino - (fuse_ino_t)f, true, &dir);
		if (rc || !mode_allows(c, &dir, X_OK))
			return rc ? rc : -EACCES;
	}
	return mode_allows(c, &st, mask) ? 0 : -EACCES;
}

static void reply_entry(fuse_req_t req, struct atlas_fs *fs, fuse_ino_t ino)
{
	struct fuse_entry_param e;
	memset(&e, 0, sizeof e);
	int rc = node_attr(fs, ino, false, &e.attr);
	if (rc) {
		fuse_reply_err(req, -rc);
		return;
	}
	e.ino = ino;
	e.attr_timeout = e.entry_timeout = fs->cfg.attr_timeout;
	fuse_reply_entry(req, &e);
}

/* The inode of `name` in directory `parent`, or 0. */
static fuse_ino_t find(struct atlas_fs *fs, fuse_ino_t parent, const char *name)
{
	if (parent == NODE_ROOT || parent == NODE_CTL) {
		for (fuse_ino_t i = NODE_README; i < NODE_FIXED_END; i++)
			if (fixed[i].parent == parent && strcmp(fixed[i].name, name) == 0)
				return i;
		if (parent == NODE_CTL)
			return 0;
		struct fs_session *s = fs_session_by_name(fs, name);
		if (!s)
			return 0;
		fuse_ino_t ino = session_ino(s, SF_DIR);
		fs_session_put(s);
		return ino;
	}
	uint64_t id;
	enum fs_sfile f;
	if (!fs_ino_session(parent, &id, &f) || f != SF_DIR)
		return 0;
	for (int k = SF_FIRST_FILE; k < SF_END; k++)
		if (strcmp(fs_sfile_names[k], name) == 0)
			return parent + (fuse_ino_t)k;
	return 0;
}

void fs_op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct atlas_fs *fs = fuse_req_userdata(req);
	int rc = fs_permission(req, parent, X_OK);
	fuse_ino_t ino = rc ? 0 : find(fs, parent, name);
	if (rc)
		fuse_reply_err(req, -rc);
	else if (!ino)
		fuse_reply_err(req, ENOENT);
	else
		reply_entry(req, fs, ino);
}

void fs_op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	/* Inodes are computed, not allocated: nothing to drop. */
	fuse_reply_none(req);
}

void fs_op_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets)
{
	fuse_reply_none(req);
}

void fs_op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct atlas_fs *fs = fuse_req_userdata(req);
	struct stat st;
	int rc = fs_permission(req, ino, F_OK);
	if (!rc)
		rc = node_attr(fs, ino, true, &st);
	if (rc)
		fuse_reply_err(req, -rc);
	else
		fuse_reply_attr(req, &st, fs->cfg.attr_timeout);
}

void fs_op_access(fuse_req_t req, fuse_ino_t ino, int mask)
{
	fuse_reply_err(req, -fs_permission(req, ino, mask));
}

/* Truncating `in` or `ctl` (a shell's `>`) is accepted and changes nothing;
 * times are ignored; modes and owners are fixed. */
void fs_op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
		   struct fuse_file_info *fi)
{
	struct atlas_fs *fs = fuse_req_userdata(req);
	struct stat st;
	int rc = fs_permission(req, ino, F_OK);
	if (!rc)
		rc = node_attr(fs, ino, false, &st);
	if (!rc && (to_set & (FUSE_SET_ATTR_MODE | FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID)))
		rc = -EPERM;
	if (!rc && (to_set & FUSE_SET_ATTR_SIZE))
		rc = fs_permission(req, ino, W_OK);
	if (!rc && (to_set & FUSE_SET_ATTR_SIZE)) {
		uint64_t id;
		enum fs_sfile f;
		bool writable = fs_ino_session(ino, &id, &f) && (f == SF_IN || f == SF_CTL);
		if (!writable)
			rc = -EACCES;
		else if (attr->st_size != 0)
			rc = -EINVAL;
	}
	if (rc)
		fuse_reply_err(req, -rc);
	else
		fuse_reply_attr(req, &st, fs->cfg.attr_timeout);
}

/* A directory listing, taken at opendir so that readdir offsets stay valid. */
struct dir_entry {
	fuse_ino_t ino;
	mode_t mode;
	char name[64];
};

struct dir_list {
	size_t n;
	struct dir_entry e[];
};

static int dir_add(struct dir_list **dl, size_t *cap, fuse_ino_t ino, mode_t mode,
		   const char *name)
{
	if ((*dl)->n == *cap) {
		size_t ncap = *cap * 2;
		struct dir_list *n = realloc(*dl, sizeof *n + ncap * sizeof n->e[0]);
		if (!n)
			return -ENOMEM;
		*dl = n;
		*cap = ncap;
	}
	struct dir_entry *e = &(*dl)->e[(*dl)->n++];
	e->ino = ino;
	e->mode = mode;
	snprintf(e->name, sizeof e->name, "%s", name);
	return 0;
}

static int dir_snapshot(struct atlas_fs *fs, fuse_ino_t ino, struct dir_list **out)
{
	size_t cap = 16;
	struct dir_list *dl = malloc(sizeof *dl + cap * sizeof dl->e[0]);
	if (!dl)
		return -ENOMEM;
	dl->n = 0;
	int rc = dir_add(&dl, &cap, ino, S_IFDIR, ".");
	uint64_t id;
	enum fs_sfile f;
	if (ino == NODE_ROOT || ino == NODE_CTL) {
		rc = rc ? rc : dir_add(&dl, &cap, NODE_ROOT, S_IFDIR, "..");
		for (fuse_ino_t i = NODE_README; !rc && i < NODE_FIXED_END; i++)
			if (fixed[i].parent == ino)
				rc = dir_add(&dl, &cap, i, fixed[i].mode, fixed[i].name);
		if (ino == NODE_ROOT) {
			pthread_mutex_lock(&fs->lock);
			for (struct fs_session *s = fs->sessions; !rc && s; s = s->next)
				if (!s->removed)
					rc = dir_add(&dl, &cap, session_ino(s, SF_DIR), S_IFDIR, s->name);
			pthread_mutex_unlock(&fs->lock);
		}
	} else if (fs_ino_session(ino, &id, &f) && f == SF_DIR) {
		struct fs_session *s = fs_session_by_id(fs, id, false);
		if (!s) {
			free(dl);
			return -ENOENT;
		}
		fs_session_put(s);
		rc = rc ? rc : dir_add(&dl, &cap, NODE_ROOT, S_IFDIR, "..");
		for (int k = SF_FIRST_FILE; !rc && k < SF_END; k++)
			rc = dir_add(&dl, &cap, ino + (fuse_ino_t)k, sfile_modes[k], fs_sfile_names[k]);
	} else {
		rc = -ENOTDIR;
	}
	if (rc) {
		free(dl);
		return rc;
	}
	*out = dl;
	return 0;
}

void fs_op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct dir_list *dl;
	int rc = fs_permission(req, ino, R_OK);
	if (!rc)
		rc = dir_snapshot(fuse_req_userdata(req), ino, &dl);
	if (rc) {
		fuse_reply_err(req, -rc);
		return;
	}
	fi->fh = (uintptr_t)dl;
	if (fuse_reply_open(req, fi) != 0)
		free(dl);
}

void fs_op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		   struct fuse_file_info *fi)
{
	struct dir_list *dl = (struct dir_list *)(uintptr_t)fi->fh;
	char *buf = malloc(size);
	if (!buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	size_t used = 0;
	for (size_t i = (size_t)off; i < dl->n; i++) {
		struct stat st = { .st_ino = dl->e[i].ino, .st_mode = dl->e[i].mode };
		size_t n = fuse_add_direntry(req, buf + used, size - used, dl->e[i].name, &st,
					     (off_t)(i + 1));
		if (n > size - used)
			break;
		used += n;
	}
	fuse_reply_buf(req, buf, used);
	free(buf);
}

void fs_op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	free((void *)(uintptr_t)fi->fh);
	fuse_reply_err(req, 0);
}

void fs_op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
	struct atlas_fs *fs = fuse_req_userdata(req);
	if (parent != NODE_ROOT) {
		fuse_reply_err(req, find(fs, parent, name) ? EEXIST : EACCES);
		return;
	}
	if (find(fs, parent, name)) {
		fuse_reply_err(req, EEXIST);
		return;
	}
	char err[ATLAS_ERRLEN];
	struct fs_session *s;
	const struct fuse_ctx *c = fuse_req_ctx(req);
	int rc = fs_permission(req, parent, W_OK | X_OK);
	if (rc) {
		fuse_reply_err(req, -rc);
		return;
	}
	rc = fs_session_create(fs, name, c->uid, c->gid, &s, err, sizeof err);
	if (rc) {
		log_info("mkdir %s: %s", name, err);
		/* max_sessions reached: the tree has no room for another directory. */
		fuse_reply_err(req, rc == -EMFILE ? ENOSPC : -rc);
		return;
	}
	log_info("session %s made by uid %u", name, (unsigned)c->uid);
	fuse_ino_t ino = session_ino(s, SF_DIR);
	fs_session_put(s);
	reply_entry(req, fs, ino);
}

/* Whether the caller of req is root or the owner of ino. */
static bool owns(fuse_req_t req, fuse_ino_t ino)
{
	const struct fuse_ctx *c = fuse_req_ctx(req);
	struct stat st;
	return c->uid == 0 || (node_attr(fuse_req_userdata(req), ino, false, &st) == 0 &&
			       st.st_uid == c->uid);
}

void fs_op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct atlas_fs *fs = fuse_req_userdata(req);
	fuse_ino_t ino = find(fs, parent, name);
	int rc;
	if (!ino)
		rc = -ENOENT;
	else if (parent != NODE_ROOT)
		rc = -ENOTDIR;
	else if (ino < NODE_FIXED_END)
		rc = S_ISDIR(fixed[ino].mode) ? -EACCES : -ENOTDIR;
	else if (!owns(req, ino))
		rc = -EPERM;   /* the root is sticky (and writable by everyone) */
	else
		rc = fs_session_remove(fs, name);
	fuse_reply_err(req, -rc);
}

/* The tree's names are fixed: nothing is created, removed or renamed but
 * session directories. */
void fs_op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct atlas_fs *fs = fuse_req_userdata(req);
	fuse_reply_err(req, find(fs, parent, name) ? EACCES : ENOENT);
}

void fs_op_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
		  struct fuse_file_info *fi)
{
	fuse_reply_err(req, EACCES);
}

void fs_op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
		 dev_t rdev)
{
	fuse_reply_err(req, EACCES);
}

void fs_op_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
{
	fuse_reply_err(req, EACCES);
}

void fs_op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname)
{
	fuse_reply_err(req, EACCES);
}

void fs_op_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
		  const char *newname, unsigned int flags)
{
	struct atlas_fs *fs = fuse_req_userdata(req);
	fuse_reply_err(req, find(fs, parent, name) ? EACCES : ENOENT);
}
