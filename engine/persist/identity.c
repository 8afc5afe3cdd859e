/* Fingerprints of a model directory (identity.h). */
#include "engine/persist/identity.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/err.h"

/* Bytes of each end of a weights file that the model fingerprint reads. */
#define IDENTITY_SAMPLE (1 << 20)

static bool ends_with(const char *s, const char *tail)
{
	size_t n = strlen(s), t = strlen(tail);
	return n >= t && strcmp(s + n - t, tail) == 0;
}

/* Hash len bytes of fd from off into st. */
static int hash_range(XXH3_state_t *st, int fd, off_t off, size_t len, char *buf)
{
	while (len) {
		ssize_t n = pread(fd, buf, len < IDENTITY_SAMPLE ? len : IDENTITY_SAMPLE, off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n ? -errno : -EIO;
		XXH3_64bits_update(st, buf, (size_t)n);
		off += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Name, size and content (whole, or both ends of a large file). */
static int hash_file(XXH3_state_t *st, int dfd, const char *name, bool whole, char *buf)
{
	int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC);
	struct stat sb;
	if (fd < 0)
		return -errno;
	int rc = fstat(fd, &sb) ? -errno : 0;
	if (!rc) {
		uint64_t size = (uint64_t)sb.st_size;
		XXH3_64bits_update(st, name, strlen(name) + 1);
		XXH3_64bits_update(st, &size, sizeof size);
		if (whole || size <= 2 * IDENTITY_SAMPLE) {
			rc = hash_range(st, fd, 0, (size_t)size, buf);
		} else {
			rc = hash_range(st, fd, 0, IDENTITY_SAMPLE, buf);
			if (!rc)
				rc = hash_range(st, fd, (off_t)(size - IDENTITY_SAMPLE),
						IDENTITY_SAMPLE, buf);
		}
	}
	close(fd);
	return rc;
}

int persist_identity(const char *model_dir, const char *backend, int vocab_size,
		     struct persist_identity *id, char *err, size_t errlen)
{
	struct dirent **names = NULL;
	int n = scandir(model_dir, &names, NULL, alphasort);
	if (n < 0)
		return atlas_errf(err, errlen, -errno, "kv_persist: cannot list %s: %s", model_dir,
				  strerror(errno));
	XXH3_state_t *model = XXH3_createState(), *vocab = XXH3_createState();
	char *buf = malloc(IDENTITY_SAMPLE);
	int dfd = open(model_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int rc = !model || !vocab || !buf ? -ENOMEM : dfd < 0 ? -errno : 0;
	const char *bad = "";
	if (!rc) {
		XXH3_64bits_reset(model);
		XXH3_64bits_reset(vocab);
		XXH3_64bits_update(model, backend, strlen(backend) + 1);
		XXH3_64bits_update(vocab, &vocab_size, sizeof vocab_size);
	}
	for (int i = 0; i < n; i++) {
		const char *f = names[i]->d_name;
		const bool json = ends_with(f, ".json"), weights = ends_with(f, ".safetensors");
		if (!rc && (json || weights))
			rc = hash_file(model, dfd, f, json, buf);
		if (!rc && (!strcmp(f, "tokenizer.json") || !strcmp(f, "tokenizer_config.json")))
			rc = hash_file(vocab, dfd, f, true, buf);
		if (rc && !*bad)
			bad = f;
	}
	if (!rc) {
		id->model = XXH3_64bits_digest(model);
		id->vocab = XXH3_64bits_digest(vocab);
	} else {
		atlas_errf(err, errlen, rc, "kv_persist: cannot read %s/%s: %s", model_dir, bad,
			   strerror(-rc));
	}
	for (int i = 0; i < n; i++)
		free(names[i]);
	free(names);
	if (dfd >= 0)
		close(dfd);
	free(buf);
	XXH3_freeState(model);
	XXH3_freeState(vocab);
	return rc;
}
