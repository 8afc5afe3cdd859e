/* Sessions belong to users, on a mount with allow_other, without
 * default_permissions (atlasd alone enforces it) and with: a session made
 * with mkdir is its maker's, s1..sN are session_owner's (here atlasd's
 * user, root), and only a session's owner and root may look inside it,
 * open its files or remove it; ctl/ is readable by everyone. Other users
 * run as forked children that switch to their uid, so the test needs root
 * (as CI runs it) and is skipped otherwise. */
#include "client.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "common/err.h"

/* Two users that are not root and not atlasd's. */
#define ALICE ((uid_t)65534)
#define BOB ((uid_t)65533)

enum op { OP_STAT, OP_READ, OP_WRITE, OP_LIST, OP_MKDIR, OP_RMDIR, OP_ACCESS_X, OP_ASK };

/* What a child reports: 0 or -errno, what it read or stat'd. */
struct result {
	int rc;
	uid_t uid;
	mode_t mode;
	char text[256];
};

static struct result *shared;

static int do_op(enum op op, const char *path, const char *text)
{
	struct stat st;
	char *got = NULL;
	size_t len;
	int rc = 0;
	switch (op) {
	case OP_STAT:
		rc = stat(path, &st) ? -errno : 0;
		shared->uid = st.st_uid;
		shared->mode = st.st_mode;
		break;
	case OP_READ:
		rc = get_file(path, &got, &len);
		break;
	case OP_WRITE:
		rc = put_file(path, text);
		break;
	case OP_LIST: {
		DIR *d = opendir(path);
		rc = d ? 0 : -errno;
		if (d)
			closedir(d);
		break;
	}
	case OP_MKDIR:
		rc = mkdir(path, 0755) ? -errno : 0;
		break;
	case OP_RMDIR:
		rc = rmdir(path) ? -errno : 0;
		break;
	case OP_ACCESS_X:
		rc = access(path, X_OK) ? -errno : 0;
		break;
	case OP_ASK: {   /* a prompt to path/in, then path/out */
		char p[600];
		snprintf(p, sizeof p, "%s/in", path);
		rc = put_file(p, text);
		snprintf(p, sizeof p, "%s/out", path);
		if (!rc)
			rc = get_file(p, &got, &len);
		break;
	}
	}
	if (got)
		snprintf(shared->text, sizeof shared->text, "%s", got);
	free(got);
	return rc;
}

/* Run op as uid (and its own group) in a child: its result. */
static struct result as(uid_t uid, enum op op, const char *path, const char *text)
{
	memset(shared, 0, sizeof *shared);
	pid_t pid = fork();
	if (pid == 0) {
		if (setgroups(0, NULL) || setresgid(uid, uid, uid) || setresuid(uid, uid, uid))
			_exit(2);
		shared->rc = do_op(op, path, text);
		_exit(0);
	}
	int status = -1;
	waitpid(pid, &status, 0);
	assert_int_equal(status, 0);
	return *shared;
}

static int rc_as(uid_t uid, enum op op, const char *path)
{
	return as(uid, op, path, "x").rc;
}

/* Another user sees s1's name and owner, and nothing inside it. */
static void test_others_session(void **state)
{
	struct result r = as(ALICE, OP_STAT, mpath(&D, "s1"), NULL);
	assert_int_equal(r.rc, 0);
	assert_int_equal(r.uid, 0);
	assert_int_equal(r.mode, S_IFDIR | 0500);
	assert_int_equal(rc_as(ALICE, OP_LIST, mpath(&D, "s1")), -EACCES);
	assert_int_equal(rc_as(ALICE, OP_ACCESS_X, mpath(&D, "s1")), -EACCES);
	assert_int_equal(rc_as(ALICE, OP_STAT, mpath(&D, "s2/status")), -EACCES);
	/* Names the owner looked up are in the kernel's cache for everyone:
	 * opening them still asks atlasd, which refuses. */
	submit("s1", "mine");
	free(answer("s1", NULL));
	struct stat st;
	assert_int_equal(stat(mpath(&D, "s1/history"), &st), 0);
	assert_int_equal(stat(mpath(&D, "s1/ctl"), &st), 0);
	assert_int_equal(rc_as(ALICE, OP_READ, mpath(&D, "s1/history")), -EACCES);
	assert_int_equal(rc_as(ALICE, OP_READ, mpath(&D, "s1/out")), -EACCES);
	assert_int_equal(rc_as(ALICE, OP_WRITE, mpath(&D, "s1/in")), -EACCES);
	assert_int_equal(rc_as(ALICE, OP_WRITE, mpath(&D, "s1/ctl")), -EACCES);
	assert_int_equal(rc_as(ALICE, OP_RMDIR, mpath(&D, "s1")), -EPERM);
	assert_value(mpath(&D, "s1/status"), "turns", "1");
	/* ctl/ and README are everyone's to read and no one's to write. */
	assert_int_equal(rc_as(ALICE, OP_READ, mpath(&D, "ctl/slots")), 0);
	assert_int_equal(rc_as(ALICE, OP_READ, mpath(&D, "README")), 0);
	assert_int_equal(rc_as(ALICE, OP_WRITE, mpath(&D, "ctl/config")), -EACCES);
	r = as(ALICE, OP_STAT, mpath(&D, "ctl"), NULL);
	assert_int_equal(r.uid, 0);
	assert_int_equal(r.mode, S_IFDIR | 0555);
}

/* A session made with mkdir is its maker's: they use it, another user
 * cannot, root can. */
static void test_own_session(void **state)
{
	assert_int_equal(rc_as(ALICE, OP_MKDIR, mpath(&D, "alice")), 0);
	struct result r = as(ALICE, OP_STAT, mpath(&D, "alice"), NULL);
	assert_int_equal(r.uid, ALICE);
	assert_int_equal(r.mode, S_IFDIR | 0500);
	r = as(ALICE, OP_STAT, mpath(&D, "alice/ctl"), NULL);
	assert_int_equal(r.rc, 0);
	assert_int_equal(r.uid, ALICE);
	assert_int_equal(r.mode, S_IFREG | 0600);
	assert_int_equal(rc_as(ALICE, OP_LIST, mpath(&D, "alice")), 0);
	assert_int_equal(as(ALICE, OP_WRITE, mpath(&D, "alice/ctl"), "max_tokens 3\n").rc, 0);
	r = as(ALICE, OP_ASK, mpath(&D, "alice"), "abcdef");
	assert_int_equal(r.rc, 0);
	assert_string_equal(r.text, "fed");
	r = as(ALICE, OP_READ, mpath(&D, "alice/history"), NULL);
	assert_int_equal(r.rc, 0);
	assert_non_null(strstr(r.text, "abcdef"));

	assert_int_equal(rc_as(BOB, OP_STAT, mpath(&D, "alice/status")), -EACCES);
	assert_int_equal(rc_as(BOB, OP_LIST, mpath(&D, "alice")), -EACCES);
	assert_int_equal(rc_as(BOB, OP_READ, mpath(&D, "alice/history")), -EACCES);
	assert_int_equal(rc_as(BOB, OP_READ, mpath(&D, "alice/out")), -EACCES);
	assert_int_equal(rc_as(BOB, OP_WRITE, mpath(&D, "alice/in")), -EACCES);
	assert_int_equal(rc_as(BOB, OP_WRITE, mpath(&D, "alice/ctl")), -EACCES);
	assert_int_equal(rc_as(BOB, OP_RMDIR, mpath(&D, "alice")), -EPERM);
	/* Names are one namespace: bob cannot take alice's. */
	assert_int_equal(rc_as(BOB, OP_MKDIR, mpath(&D, "alice")), -EEXIST);
	assert_int_equal(rc_as(ALICE, OP_RMDIR, mpath(&D, "s2")), -EPERM);

	/* Root acts on anyone's session. */
	char *text;
	size_t len;
	assert_int_equal(get_file(mpath(&D, "alice/history"), &text, &len), 0);
	assert_non_null(strstr(text, "abcdef"));
	free(text);
	assert_int_equal(rmdir(mpath(&D, "alice")), 0);
	/* The owner removes their own. */
	assert_int_equal(rc_as(BOB, OP_MKDIR, mpath(&D, "bob")), 0);
	assert_int_equal(rc_as(BOB, OP_RMDIR, mpath(&D, "bob")), 0);
}

/* The temporary directory (mkdtemp's, 0700) must let the other users
 * reach the mount. */
static int reachable(void **state)
{
	return chmod(D.dir, 0711);
}

int main(int argc, char **argv)
{
	if (geteuid() != 0) {
		fprintf(stderr, "not root: cannot act as other users\n");
		return SKIP;
	}
	shared = mmap(NULL, sizeof *shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
		      -1, 0);
	if (shared == MAP_FAILED)
		return 1;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_others_session, reachable),
		cmocka_unit_test_setup(test_own_session, reachable),
	};
	/* atlasd alone, then with the kernel checking the modes as well. */
	int rc = run_mounted_with(argc, argv, "fs-owner", tests, ATLAS_ARRAY_LEN(tests),
				  "allow_other,attr_timeout=30");
	if (!rc)
		rc = run_mounted_with(argc, argv, "fs-owner default_permissions", tests,
				      ATLAS_ARRAY_LEN(tests),
				      "allow_other,default_permissions,attr_timeout=30");
	return rc;
}
