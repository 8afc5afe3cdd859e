/* The users that configuration keys name (session_owner, ctl_owner): a
 * user name looked up in the passwd database, or a numeric uid. */
#include "config/config.h"

#include <ctype.h>
#include <errno.h>
#include <pwd.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/err.h"

int atlas_config_user(const char *text, uid_t *uid, gid_t *gid, char *err, size_t errlen)
{
	uid_t u = getuid();
	gid_t g = getgid();
	if (*text) {
		char buf[4096];
		struct passwd pw, *found = NULL;
		char *end;
		errno = 0;
		unsigned long n = strtoul(text, &end, 10);
		bool numeric = isdigit((unsigned char)*text) && !*end;
		if (numeric && (errno || n != (uid_t)n || (uid_t)n == (uid_t)-1))
			return atlas_errf(err, errlen, -EINVAL, "'%s' is not a uid", text);
		if (numeric)
			getpwuid_r((uid_t)n, &pw, buf, sizeof buf, &found);
		else
			getpwnam_r(text, &pw, buf, sizeof buf, &found);
		if (!numeric && !found)
			return atlas_errf(err, errlen, -ENOENT, "no user '%s'", text);
		u = numeric ? (uid_t)n : pw.pw_uid;
		if (found)
			g = pw.pw_gid;
	}
	if (uid)
		*uid = u;
	if (gid)
		*gid = g;
	return 0;
}
