/* Where an installed atlas finds its files (config.h): the default model
 * under the install prefix's datadir and atlas.conf under its sysconfdir,
 * both found from the running binary's own path so that a tree installed
 * with `meson install --destdir` works where it lies. A binary that is not
 * installed (the build directory) uses the source tree's model. */
#include "config/config.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#if !defined(ATLAS_DEFAULT_MODEL) || !defined(ATLAS_SOURCE_MODEL) || !defined(ATLAS_BINDIR) || \
	!defined(ATLAS_DATADIR) || !defined(ATLAS_SYSCONFDIR)
#error "config/meson.build defines the install directories"
#endif

/* The install prefix the running binary lies under: its directory with
 * bindir taken off the end. -ENOENT for a binary outside a bindir. */
static int install_prefix(char *buf, size_t len)
{
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	if (n <= 0)
		return -ENOENT;
	exe[n] = 0;
	char *slash = strrchr(exe, '/');
	if (!slash)
		return -ENOENT;
	*slash = 0;
	const char *bindir = ATLAS_BINDIR;
	size_t dir_len = strlen(exe), bin_len = strlen(bindir);
	if (bindir[0] == '/')   /* an absolute bindir: installed only right there */
		return strcmp(exe, bindir) ? -ENOENT :
		       (snprintf(buf, len, "/") < (int)len ? 0 : -ENAMETOOLONG);
	if (dir_len <= bin_len || strcmp(exe + dir_len - bin_len, bindir) ||
	    exe[dir_len - bin_len - 1] != '/')
		return -ENOENT;
	exe[dir_len - bin_len - 1] = 0;
	return snprintf(buf, len, "%s", exe) < (int)len ? 0 : -ENAMETOOLONG;
}

/* prefix/dir/name (dir absolute: dir/name) when the binary is installed and
 * the file exists. */
static int installed(const char *dir, const char *name, char *buf, size_t len)
{
	char prefix[PATH_MAX];
	int rc = install_prefix(prefix, sizeof prefix);
	if (rc)
		return rc;
	int n = dir[0] == '/' ? snprintf(buf, len, "%s/%s", dir, name) :
		snprintf(buf, len, "%s/%s/%s", prefix, dir, name);
	if (n < 0 || (size_t)n >= len)
		return -ENAMETOOLONG;
	return access(buf, F_OK) ? -errno : 0;
}

static char default_model[PATH_MAX];
static pthread_once_t default_model_once = PTHREAD_ONCE_INIT;

static void find_default_model(void)
{
	char path[PATH_MAX];
	if (ATLAS_DEFAULT_MODEL[0])
		snprintf(default_model, sizeof default_model, "%s", ATLAS_DEFAULT_MODEL);
	else if (installed(ATLAS_DATADIR, "atlas/models/atlas-next/config.json", path,
			   sizeof path) == 0)
		snprintf(default_model, sizeof default_model, "%.*s", (int)(strrchr(path, '/') - path),
			 path);
	else
		snprintf(default_model, sizeof default_model, "%s", ATLAS_SOURCE_MODEL);
}

const char *atlas_config_default_model(void)
{
	pthread_once(&default_model_once, find_default_model);
	return default_model;
}

int atlas_config_installed_file(char *buf, size_t len)
{
	return installed(ATLAS_SYSCONFDIR, "atlas/atlas.conf", buf, len);
}
