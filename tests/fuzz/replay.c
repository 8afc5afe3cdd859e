/* Replay a fuzz target's corpus without libFuzzer: replay_X FILE|DIR...
 * runs every file (every file of a directory) through the target once, so
 * that the committed corpora (tests/fuzz/corpus/) are checked with gcc and
 * under the sanitizer build too. A crash or sanitizer report fails it. */
#include "fuzz.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int run_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		perror(path);
		return -1;
	}
	size_t cap = 4096, n = 0;
	uint8_t *buf = malloc(cap);
	for (size_t r; buf && (r = fread(buf + n, 1, cap - n, f)) > 0;) {
		n += r;
		if (n == cap)
			buf = realloc(buf, cap *= 2);
	}
	fclose(f);
	if (!buf)
		return -1;
	/* An exact-size copy, so that a read past the input's end is caught. */
	uint8_t *input = malloc(n ? n : 1);
	memcpy(input, buf, n);
	free(buf);
	LLVMFuzzerTestOneInput(input, n);
	free(input);
	return 0;
}

static int cmp_names(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int run_dir(const char *path, int *count)
{
	DIR *d = opendir(path);
	if (!d) {
		perror(path);
		return -1;
	}
	char **names = NULL;
	size_t n = 0;
	for (struct dirent *e; (e = readdir(d));)
		if (e->d_name[0] != '.') {
			names = realloc(names, (n + 1) * sizeof *names);
			names[n++] = strdup(e->d_name);
		}
	closedir(d);
	qsort(names, n, sizeof *names, cmp_names);
	int rc = 0;
	for (size_t i = 0; i < n; i++) {
		char file[4096];
		snprintf(file, sizeof file, "%s/%s", path, names[i]);
		if (!rc && run_file(file) == 0)
			(*count)++;
		else
			rc = -1;
		free(names[i]);
	}
	free(names);
	return rc;
}

int main(int argc, char **argv)
{
	int count = 0, rc = 0;
	for (int i = 1; i < argc && !rc; i++) {
		struct stat st;
		if (stat(argv[i], &st) != 0) {
			perror(argv[i]);
			rc = -1;
		} else if (S_ISDIR(st.st_mode)) {
			rc = run_dir(argv[i], &count);
		} else if ((rc = run_file(argv[i])) == 0) {
			count++;
		}
	}
	printf("%d inputs replayed\n", count);
	if (!rc && count == 0)
		fprintf(stderr, "no inputs\n");
	return rc || count == 0 ? 1 : 0;
}
