/* Reading safetensors files: an 8-byte little-endian header length N, N
 * bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]}, ...,
 * "__metadata__": {...}}, then the data, offsets counted from its start.
 * The whole file is mapped read-only; every offset is checked against the
 * file's size and against the other tensors before anything points into it.
 * A sharded model lists its files in model.safetensors.index.json.
 */
#include "engine/model/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "common/file.h"
#include "common/log.h"

static const struct { const char *name; enum kt_dtype dtype; } st_dtypes[] = {
	{ "F32", KT_F32 }, { "F16", KT_F16 }, { "BF16", KT_BF16 },
};

static int map_file(const char *path, void **map, size_t *size, char *err, size_t errlen)
{
	struct stat sb;
	int fd = file_open_regular(path, err, errlen);
	if (fd < 0)
		return fd;
	if (fstat(fd, &sb) < 0) {
		int rc = -errno;
		close(fd);
		return atlas_errf(err, errlen, rc, "%s: %s", path, strerror(-rc));
	}
	if (sb.st_size < 8) {
		close(fd);
		return atlas_errf(err, errlen, -EINVAL, "%s: truncated: %lld bytes, no header",
				  path, (long long)sb.st_size);
	}
	*size = (size_t)sb.st_size;
	*map = mmap(NULL, *size, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (*map == MAP_FAILED)
		return atlas_errf(err, errlen, -errno, "%s: mmap: %s", path, strerror(errno));
	return 0;
}

static int parse_offsets(const char *path, const char *name, json_t *desc, size_t data_size,
			 size_t *begin, size_t *end, char *err, size_t errlen)
{
	json_t *offs = json_object_get(desc, "data_offsets");
	json_t *b = json_array_get(offs, 0), *e = json_array_get(offs, 1);

	if (!json_is_array(offs) || json_array_size(offs) != 2 || !json_is_integer(b) ||
	    !json_is_integer(e) || json_integer_value(b) < 0 ||
	    json_integer_value(e) < json_integer_value(b))
		return atlas_errf(err, errlen, -EINVAL,
				  "%s: tensor %s: data_offsets is not [begin, end], begin <= end",
				  path, name);
	if ((unsigned long long)json_integer_value(e) > data_size)
		return atlas_errf(err, errlen, -EINVAL,
				  "%s: tensor %s: data_offsets [%lld, %lld] past the end of the "
				  "data (%zu bytes; truncated file?)", path, name,
				  json_integer_value(b), json_integer_value(e), data_size);
	*begin = (size_t)json_integer_value(b);
	*end = (size_t)json_integer_value(e);
	return 0;
}

static int parse_shape(const char *path, const char *name, json_t *desc, struct st_tensor *t,
		       size_t *numel, char *err, size_t errlen)
{
	json_t *shape = json_object_get(desc, "shape");
	size_t i;
	json_t *d;

	if (!json_is_array(shape) || json_array_size(shape) > ST_MAX_DIMS)
		return atlas_errf(err, errlen, -EINVAL,
				  "%s: tensor %s: shape is not a list of at most %d sizes", path,
				  name, ST_MAX_DIMS);
	*numel = 1;
	t->n_dims = (int)json_array_size(shape);
	json_array_foreach(shape, i, d) {
		if (!json_is_integer(d) || json_integer_value(d) < 0 ||
		    json_integer_value(d) > ((json_int_t)1 << 40))
			return atlas_errf(err, errlen, -EINVAL, "%s: tensor %s: bad size in shape",
					  path, name);
		t->shape[i] = json_integer_value(d);
		if (t->shape[i] && *numel > (SIZE_MAX >> 8) / (size_t)t->shape[i])
			return atlas_errf(err, errlen, -EINVAL, "%s: tensor %s: shape too large",
					  path, name);
		*numel *= (size_t)t->shape[i];
	}
	return 0;
}

/* One header entry into t (the name is set by the caller). */
static int parse_tensor(const char *path, const char *name, json_t *desc, const char *data,
			size_t data_size, struct st_tensor *t, char *err, size_t errlen)
{
	json_t *dtype = json_object_get(desc, "dtype");
	size_t numel = 0, begin = 0, end = 0;
	int rc;

	if (!json_is_object(desc) || !json_is_string(dtype))
		return atlas_errf(err, errlen, -EINVAL,
				  "%s: tensor %s: not {dtype, shape, data_offsets}", path, name);
	snprintf(t->dtype_name, sizeof t->dtype_name, "%s", json_string_value(dtype));
	for (size_t i = 0; i < ATLAS_ARRAY_LEN(st_dtypes); i++)
		if (strcmp(t->dtype_name, st_dtypes[i].name) == 0) {
			t->dtype_ok = true;
			t->dtype = st_dtypes[i].dtype;
		}
	if ((rc = parse_shape(path, name, desc, t, &numel, err, errlen)) ||
	    (rc = parse_offsets(path, name, desc, data_size, &begin, &end, err, errlen)))
		return rc;
	if (t->dtype_ok && end - begin != numel * kt_dtype_size(t->dtype))
		return atlas_errf(err, errlen, -EINVAL,
				  "%s: tensor %s: data_offsets hold %zu bytes, shape and %s: %zu",
				  path, name, end - begin, t->dtype_name,
				  numel * kt_dtype_size(t->dtype));
	t->data = data + begin;
	t->nbytes = end - begin;
	t->file = path;
	return 0;
}

static int cmp_by_data(const void *a, const void *b)
{
	const struct st_tensor *x = *(struct st_tensor *const *)a,
			       *y = *(struct st_tensor *const *)b;
	return x->data < y->data ? -1 : x->data > y->data;
}

static int cmp_by_name(const void *a, const void *b)
{
	return strcmp(((const struct st_tensor *)a)->name, ((const struct st_tensor *)b)->name);
}

/* No two tensors of one file may share bytes (empty tensors share none). */
static int check_overlaps(const char *path, struct st_tensor *t, int n, char *err, size_t errlen)
{
	struct st_tensor **order = calloc((size_t)n + 1, sizeof *order);
	const struct st_tensor *last = NULL; /* the tensor that ends furthest so far */
	int rc = 0;

	if (!order)
		return atlas_errf(err, errlen, -ENOMEM, "%s: out of memory", path);
	for (int i = 0; i < n; i++)
		order[i] = &t[i];
	qsort(order, (size_t)n, sizeof *order, cmp_by_data);
	for (int i = 0; i < n && !rc; i++) {
		const char *begin = order[i]->data, *end = begin + order[i]->nbytes;
		if (!order[i]->nbytes)
			continue;
		if (last && begin < (const char *)last->data + last->nbytes)
			rc = atlas_errf(err, errlen, -EINVAL,
					"%s: tensor %s: data overlaps tensor %s", path,
					order[i]->name, last->name);
		if (!last || end > (const char *)last->data + last->nbytes)
			last = order[i];
	}
	free(order);
	return rc;
}

static int add_tensors(struct st_set *set, const char *path, json_t *header, const char *data,
		       size_t data_size, char *err, size_t errlen)
{
	size_t n = json_object_size(header);
	struct st_tensor *grown = realloc(set->tensors, (set->n_tensors + n) * sizeof *grown);
	struct st_tensor *first;
	const char *name;
	json_t *desc;
	int rc;

	if (!grown)
		return atlas_errf(err, errlen, -ENOMEM, "%s: out of memory", path);
	set->tensors = grown;
	first = &set->tensors[set->n_tensors];
	int added = 0;
	json_object_foreach(header, name, desc) {
		if (strcmp(name, "__metadata__") == 0)
			continue;
		struct st_tensor *t = &first[added];
		memset(t, 0, sizeof *t);
		t->name = strdup(name);
		if (!t->name)
			return atlas_errf(err, errlen, -ENOMEM, "%s: out of memory", path);
		set->n_tensors++;
		added++;
		rc = parse_tensor(path, name, desc, data, data_size, t, err, errlen);
		if (rc)
			return rc;
	}
	return check_overlaps(path, first, added, err, errlen);
}

static int parse_header(struct st_set *set, int file, char *err, size_t errlen)
{
	const char *path = set->paths[file];
	const unsigned char *p = set->maps[file];
	size_t size = set->sizes[file];
	uint64_t hlen = 0;
	json_error_t je;

	for (int i = 7; i >= 0; i--)
		hlen = hlen << 8 | p[i];
	if (hlen > size - 8)
		return atlas_errf(err, errlen, -EINVAL,
				  "%s: header length %llu past the end of the file (%zu bytes)",
				  path, (unsigned long long)hlen, size);
	json_t *header = json_loadb((const char *)p + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
	if (!header)
		return atlas_errf(err, errlen, -EINVAL, "%s: header: bad JSON at byte %d: %s", path,
				  je.position, je.text);
	int rc = 0;
	if (!json_is_object(header))
		rc = atlas_errf(err, errlen, -EINVAL, "%s: header: not a JSON object", path);
	else
		rc = add_tensors(set, path, header, (const char *)p + 8 + hlen, size - 8 - hlen,
				 err, errlen);
	json_decref(header);
	return rc;
}

static int add_file(struct st_set *set, const char *path, char *err, size_t errlen)
{
	int i = set->n_files;
	char **paths = realloc(set->paths, (size_t)(i + 1) * sizeof *paths);
	if (paths)
		set->paths = paths;
	void **maps = realloc(set->maps, (size_t)(i + 1) * sizeof *maps);
	if (maps)
		set->maps = maps;
	size_t *sizes = realloc(set->sizes, (size_t)(i + 1) * sizeof *sizes);
	if (sizes)
		set->sizes = sizes;
	if (!paths || !maps || !sizes || !(set->paths[i] = strdup(path)))
		return atlas_errf(err, errlen, -ENOMEM, "%s: out of memory", path);
	set->maps[i] = NULL;
	set->n_files++;
	return map_file(path, &set->maps[i], &set->sizes[i], err, errlen);
}

int st_open_file(const char *path, struct st_set *set, char *err, size_t errlen)
{
	int rc = add_file(set, path, err, errlen);
	if (rc)
		return rc;
	return parse_header(set, set->n_files - 1, err, errlen);
}

static int find_file(const struct st_set *set, const char *path)
{
	for (int i = 0; i < set->n_files; i++)
		if (strcmp(set->paths[i], path) == 0)
			return i;
	return -1;
}

static int sort_and_check(struct st_set *set, char *err, size_t errlen)
{
	qsort(set->tensors, (size_t)set->n_tensors, sizeof *set->tensors, cmp_by_name);
	for (int i = 1; i < set->n_tensors; i++)
		if (strcmp(set->tensors[i - 1].name, set->tensors[i].name) == 0)
			return atlas_errf(err, errlen, -EINVAL, "%s: tensor %s: also in %s",
					  set->tensors[i].file, set->tensors[i].name,
					  set->tensors[i - 1].file);
	return 0;
}

/* model.safetensors.index.json: {"weight_map": {tensor: file}}. Every file
 * it names is opened and every tensor it lists must be in its named file. */
static int open_index(const char *dir, const char *index, struct st_set *set, char *err,
		      size_t errlen)
{
	json_error_t je;
	FILE *fp = file_fopen_regular(index, err, errlen);
	if (!fp)
		return -errno;
	/* a stream: json_loadfd reads one byte a read(2) (tokenizer.c) */
	json_t *root = json_loadf(fp, JSON_REJECT_DUPLICATES, &je), *file;
	const char *name;
	char path[4096];
	int rc = 0;

	fclose(fp);
	if (!root)
		return atlas_errf(err, errlen, -EINVAL, "%s: line %d: %s", index, je.line, je.text);
	json_t *map = json_object_get(root, "weight_map");
	if (!json_is_object(map)) {
		rc = atlas_errf(err, errlen, -EINVAL,
				"%s: key weight_map: missing or not an object", index);
		goto out;
	}
	json_object_foreach(map, name, file) {
		const char *fname = json_string_value(file);
		if (!fname || !*fname || strchr(fname, '/')) {
			rc = atlas_errf(err, errlen, -EINVAL, "%s: tensor %s: bad file name", index,
					name);
			goto out;
		}
		snprintf(path, sizeof path, "%s/%s", dir, fname);
		if (find_file(set, path) < 0 && (rc = st_open_file(path, set, err, errlen))) {
			atlas_errprefix(err, errlen, "%s: tensor %s", index, name);
			goto out;
		}
	}
	if ((rc = sort_and_check(set, err, errlen)))
		goto out;
	json_object_foreach(map, name, file) {
		snprintf(path, sizeof path, "%s/%s", dir, json_string_value(file));
		struct st_tensor *t = st_find(set, name);
		if (!t || strcmp(t->file, path) != 0) {
			rc = atlas_errf(err, errlen, -EINVAL, "%s: tensor %s: not in %s", index,
					name, path);
			goto out;
		}
	}
out:
	json_decref(root);
	return rc;
}

int st_open_dir(const char *dir, struct st_set **out, char *err, size_t errlen)
{
	struct st_set *set = calloc(1, sizeof *set);
	char path[4096];
	int rc;

	if (!set)
		return atlas_errf(err, errlen, -ENOMEM, "%s: out of memory", dir);
	snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
	bool sharded = access(path, F_OK) == 0;
	if (!sharded)
		snprintf(path, sizeof path, "%s/model.safetensors", dir);
	if (!(set->source = strdup(path))) {
		free(set);
		return atlas_errf(err, errlen, -ENOMEM, "%s: out of memory", dir);
	}
	if (sharded) {
		rc = open_index(dir, path, set, err, errlen);
	} else {
		rc = st_open_file(path, set, err, errlen);
		if (!rc)
			rc = sort_and_check(set, err, errlen);
	}
	if (rc) {
		st_close(set);
		return rc;
	}
	log_debug("%s: %d tensors in %d file(s)", dir, set->n_tensors, set->n_files);
	*out = set;
	return 0;
}

void st_close(struct st_set *set)
{
	if (!set)
		return;
	for (int i = 0; i < set->n_tensors; i++)
		free(set->tensors[i].name);
	for (int i = 0; i < set->n_files; i++) {
		if (set->maps[i] && set->maps[i] != MAP_FAILED)
			munmap(set->maps[i], set->sizes[i]);
		free(set->paths[i]);
	}
	free(set->tensors);
	free(set->source);
	free(set->paths);
	free(set->maps);
	free(set->sizes);
	free(set);
}

struct st_tensor *st_find(struct st_set *set, const char *name)
{
	struct st_tensor key = { .name = (char *)name };
	return bsearch(&key, set->tensors, (size_t)set->n_tensors, sizeof *set->tensors,
		       cmp_by_name);
}
