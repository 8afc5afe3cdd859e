/* Binding the tensors of the weight files to the model by name.
 *
 * Each expected tensor must be present with a float dtype (F32, F16, BF16)
 * and exactly the shape the configuration implies; it is then handed to the
 * backend with kt_weight(), which copies it: the files are unmapped when the
 * model has loaded. Tensors nobody asked for (rotary
 * inv_freq buffers, an lm_head.weight next to tied embeddings) are logged at
 * debug level and ignored.
 */
#include "engine/model/internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/half.h"
#include "common/log.h"

static int check_shape(const struct st_tensor *t, int64_t rows, int64_t cols, char *err,
		       size_t errlen)
{
	const bool is_vector = rows == 0;
	char want[64], got[160];
	int n = 0;
	/* A matrix may come as [rows, 1, cols]: a depthwise conv1d's weight. */
	bool ok = is_vector ? t->n_dims == 1 && t->shape[0] == cols
			    : (t->n_dims == 2 || (t->n_dims == 3 && t->shape[1] == 1)) &&
			      t->shape[0] == rows && t->shape[t->n_dims - 1] == cols;

	if (ok)
		return 0;
	if (is_vector)
		snprintf(want, sizeof want, "[%" PRId64 "]", cols);
	else
		snprintf(want, sizeof want, "[%" PRId64 ", %" PRId64 "]", rows, cols);
	n += snprintf(got + n, sizeof got - (size_t)n, "[");
	for (int i = 0; i < t->n_dims && n < (int)sizeof got - 24; i++)
		n += snprintf(got + n, sizeof got - (size_t)n, "%s%" PRId64, i ? ", " : "",
			      t->shape[i]);
	snprintf(got + n, sizeof got - (size_t)n, "]");
	return atlas_errf(err, errlen, -EINVAL, "%s: tensor %s: shape %s, the config wants %s",
			  t->file, t->name, got, want);
}

/* Remember dst for model_info and for freeing. */
static int note_weight(struct model *m, struct kt_tensor *dst)
{
	if (m->n_weights == m->weights_cap) {
		int cap = m->weights_cap ? 2 * m->weights_cap : 64;
		struct kt_tensor **w = realloc(m->weights, (size_t)cap * sizeof *w);
		if (!w)
			return -ENOMEM;
		m->weights = w;
		m->weights_cap = cap;
	}
	m->weights[m->n_weights++] = dst;
	return 0;
}

/* bf16 bit patterns of 1.0 (the norm weights of dummy models). */
#define BF16_ONE 0x3f80

/* Make m->dummy hold at least n random bf16 values, uniform in ±0.035 (a
 * standard deviation near the 0.02 that models are initialised with), so
 * that activations stay finite through any number of layers. */
static int dummy_values(struct model *m, size_t n)
{
	if (n <= m->dummy_n)
		return 0;
	uint16_t *v = realloc(m->dummy, n * sizeof *v);
	if (!v)
		return -ENOMEM;
	uint64_t x = 0x2545f4914f6cdd1dull;
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		float f = ((float)(x >> 40) / (float)(1 << 24) * 2.0f - 1.0f) * 0.035f;
		uint32_t bits;
		memcpy(&bits, &f, sizeof bits);
		v[i] = (uint16_t)(bits >> 16);
	}
	m->dummy = v;
	m->dummy_n = n;
	return 0;
}

/* A dummy model's tensor: norm weights 1, biases 0, matrices random. A
 * vector is filled in a buffer of its own: the random values stay made
 * for the next matrix (making them again after every norm took a minute
 * for the 235B layer shape's 80 GB). */
static int bind_dummy(struct model *m, struct kt_tensor *dst, const char *name, int64_t rows,
		      int64_t cols, char *err, size_t errlen)
{
	const bool is_vector = rows == 0;
	const size_t n = (size_t)(is_vector ? 1 : rows) * (size_t)cols;
	uint16_t *vector = NULL;
	int rc = is_vector ? 0 : dummy_values(m, n);

	if (is_vector && !(vector = malloc(n * sizeof *vector)))
		rc = -ENOMEM;
	if (rc)
		return atlas_errf(err, errlen, rc, "dummy %s [%lld, %lld]: out of host memory", name,
				  (long long)rows, (long long)cols);
	if (is_vector) {
		uint16_t fill = strstr(name, "norm") ? BF16_ONE : 0;
		for (size_t i = 0; i < n; i++)
			vector[i] = fill;
	}
	rc = kt_weight(m->be, KT_BF16, is_vector ? vector : m->dummy, is_vector ? 1 : rows, cols,
		       false, dst);
	free(vector);
	if (rc)
		return atlas_errf(err, errlen, rc, "dummy %s [%lld, %lld]: backend: %s", name,
				  (long long)rows, (long long)cols, strerror(-rc));
	if ((rc = note_weight(m, dst))) {
		kt_free(m->be, dst);
		return atlas_errf(err, errlen, rc, "out of memory");
	}
	m->info.parameters += n;
	m->info.device_bytes += kt_nbytes(dst);
	return 0;
}

/* The tensor called name, present and of a float dtype. */
static int find_float(struct model *m, const char *name, struct st_tensor **out, char *err,
		      size_t errlen)
{
	struct st_tensor *t = st_find(m->st, name);
	if (!t)
		return atlas_errf(err, errlen, -ENOENT, "%s: tensor %s: missing", m->st->source,
				  name);
	if (!t->dtype_ok)
		return atlas_errf(err, errlen, -EINVAL,
				  "%s: tensor %s: dtype %s is not supported (F32, F16, BF16)",
				  t->file, name, t->dtype_name);
	*out = t;
	return 0;
}

int model_bind(struct model *m, struct kt_tensor *dst, const char *name, int64_t rows,
	       int64_t cols, char *err, size_t errlen)
{
	if (!m->st)
		return bind_dummy(m, dst, name, rows, cols, err, errlen);
	struct st_tensor *t;
	int rc;

	if ((rc = find_float(m, name, &t, err, errlen)) ||
	    (rc = check_shape(t, rows, cols, err, errlen)))
		return rc;
	rows = rows ? rows : 1;
	/* A copy, never an alias of the mapping: the files are unmapped once
	 * the model has loaded, so a weight file truncated or rewritten under
	 * a running daemon cannot fault it (SIGBUS). */
	rc = kt_weight(m->be, t->dtype, t->data, rows, cols, false, dst);
	if (rc)
		return atlas_errf(err, errlen, rc, "%s: tensor %s: backend: %s", t->file, name,
				  strerror(-rc));
	if ((rc = note_weight(m, dst))) {
		kt_free(m->be, dst);
		return atlas_errf(err, errlen, rc, "out of memory");
	}
	t->bound = true;
	m->info.parameters += (uint64_t)rows * (uint64_t)cols;
	m->info.file_bytes += t->nbytes;
	m->info.device_bytes += kt_nbytes(dst);
	return 0;
}

int model_bind_layer(struct model *m, const char *prefix, int l, struct kt_tensor *dst,
		     const char *suffix, int64_t rows, int64_t cols, char *err, size_t errlen)
{
	char name[128];
	snprintf(name, sizeof name, "%s.%d.%s", prefix, l, suffix);
	return model_bind(m, dst, name, rows, cols, err, errlen);
}

int model_bind_joined(struct model *m, struct kt_tensor *dst, const char *prefix, int l,
		      const char *const *suffixes, const int64_t *rows, int n, int64_t cols,
		      char *err, size_t errlen)
{
	struct st_tensor *t[MODEL_JOIN_MAX];
	enum kt_dtype dt = KT_BF16;
	int64_t total = 0, max_part = 0;
	char name[MODEL_JOIN_MAX][128];
	unsigned char *buf;
	size_t esz, off = 0;
	int rc;

	if (n < 1 || n > MODEL_JOIN_MAX)
		return atlas_errf(err, errlen, -EINVAL, "%s.%d: %d matrices to join", prefix, l, n);
	for (int i = 0; i < n; i++) {
		snprintf(name[i], sizeof name[i], "%s.%d.%s", prefix, l, suffixes[i]);
		total += rows[i];
		max_part = rows[i] > max_part ? rows[i] : max_part;
		if (!m->st)
			continue;
		if ((rc = find_float(m, name[i], &t[i], err, errlen)) ||
		    (rc = check_shape(t[i], rows[i], cols, err, errlen)))
			return rc;
		if (i && t[i]->dtype != t[0]->dtype)
			return atlas_errf(err, errlen, -EINVAL, "%s: tensor %s: dtype %s, %s's is %s",
					  t[i]->file, name[i], t[i]->dtype_name, name[0],
					  t[0]->dtype_name);
		dt = t[i]->dtype;
	}
	/* A dummy matrix is the first values of the dummy pool whatever its
	 * neighbours, as model_bind makes it alone. */
	if (!m->st && (rc = dummy_values(m, (size_t)max_part * (size_t)cols)))
		return atlas_errf(err, errlen, rc, "dummy %s: out of host memory", name[0]);
	esz = kt_dtype_size(dt);
	if (!(buf = malloc((size_t)total * (size_t)cols * esz)))
		return atlas_errf(err, errlen, -ENOMEM, "%s: [%lld, %lld]: out of host memory",
				  name[0], (long long)total, (long long)cols);
	for (int i = 0; i < n; i++) {
		const size_t bytes = (size_t)rows[i] * (size_t)cols * esz;

		memcpy(buf + off, m->st ? t[i]->data : (const void *)m->dummy, bytes);
		off += bytes;
		if (m->st) {
			t[i]->bound = true;
			m->info.file_bytes += t[i]->nbytes;
		}
	}
	rc = kt_weight(m->be, dt, buf, total, cols, false, dst);
	free(buf);
	if (rc)
		return atlas_errf(err, errlen, rc, "%s: [%lld, %lld]: backend: %s", name[0],
				  (long long)total, (long long)cols, strerror(-rc));
	if ((rc = note_weight(m, dst))) {
		kt_free(m->be, dst);
		return atlas_errf(err, errlen, rc, "out of memory");
	}
	m->info.parameters += (uint64_t)total * (uint64_t)cols;
	m->info.device_bytes += kt_nbytes(dst);
	return 0;
}

/* The tensor of part p, checked: its shape and dtype (that of the stack's
 * first part, *dt, once set). */
static int stack_part(struct model *m, const struct model_part *p, int64_t rows, int64_t cols,
		      enum kt_dtype *dt, bool first, struct st_tensor **out, char *err,
		      size_t errlen)
{
	struct st_tensor *t;
	int rc;

	if ((rc = find_float(m, p->name, &t, err, errlen)))
		return rc;
	if (p->slice < 0) {
		if ((rc = check_shape(t, rows, cols, err, errlen)))
			return rc;
	} else if (t->n_dims != 3 || t->shape[0] != p->n_slices || t->shape[1] != p->full_rows ||
		   t->shape[2] != cols || p->slice >= p->n_slices ||
		   p->row0 + rows > p->full_rows) {
		return atlas_errf(err, errlen, -EINVAL,
				  "%s: tensor %s: shape [%lld, %lld, %lld] (%d dims), the config "
				  "wants [%lld, %lld, %lld]", t->file, p->name,
				  (long long)t->shape[0], (long long)t->shape[1],
				  (long long)t->shape[2], t->n_dims, (long long)p->n_slices,
				  (long long)p->full_rows, (long long)cols);
	}
	if (!first && t->dtype != *dt)
		return atlas_errf(err, errlen, -EINVAL,
				  "%s: tensor %s: dtype %s, the other experts' is %s", t->file,
				  p->name, t->dtype_name, kt_dtype_name(*dt));
	*dt = t->dtype;
	*out = t;
	return 0;
}

/* A dummy stack: the dummy values of matrices [0, first + n), of which
 * the last n are this shard's. */
static int bind_dummy_stack(struct model *m, struct kt_tensor *dst, const char *what, int n,
			    int first, int64_t rows, int64_t cols, char *err, size_t errlen)
{
	const size_t part = (size_t)rows * (size_t)cols;
	int rc = dummy_values(m, (size_t)(first + n) * part);

	if (rc)
		return atlas_errf(err, errlen, rc, "dummy %s: out of host memory", what);
	rc = kt_weight(m->be, KT_BF16, m->dummy + (size_t)first * part, (int64_t)n * rows, cols,
		       false, dst);
	if (rc)
		return atlas_errf(err, errlen, rc, "dummy %s: backend: %s", what, strerror(-rc));
	if ((rc = note_weight(m, dst))) {
		kt_free(m->be, dst);
		return atlas_errf(err, errlen, rc, "out of memory");
	}
	m->info.parameters += (uint64_t)n * part;
	m->info.device_bytes += kt_nbytes(dst);
	return 0;
}

int model_bind_stack(struct model *m, struct kt_tensor *dst, const char *what,
		     const struct model_part *parts, int n, int first, int64_t rows, int64_t cols,
		     char *err, size_t errlen)
{
	if (!m->st)
		return n ? bind_dummy_stack(m, dst, what, n, first, rows, cols, err, errlen) : 0;
	enum kt_dtype dt = KT_F32;
	const size_t part_elems = (size_t)rows * (size_t)cols;
	unsigned char *buf = NULL;
	size_t esz = 0;
	int rc = 0;

	for (int i = 0; i < n && !rc; i++) {
		struct st_tensor *t = NULL;
		if ((rc = stack_part(m, &parts[i], rows, cols, &dt, i == 0, &t, err, errlen)))
			break;
		if (!buf) {
			esz = kt_dtype_size(dt);
			buf = malloc((size_t)n * part_elems * esz);
			if (!buf) {
				rc = atlas_errf(err, errlen, -ENOMEM,
						"%s: %d x [%lld, %lld]: out of host memory", what, n,
						(long long)rows, (long long)cols);
				break;
			}
		}
		const size_t off = parts[i].slice < 0 ? 0
			: ((size_t)parts[i].slice * (size_t)parts[i].full_rows +
			   (size_t)parts[i].row0) * (size_t)cols * esz;
		memcpy(buf + (size_t)i * part_elems * esz, (const char *)t->data + off,
		       part_elems * esz);
		t->bound = true;
		m->info.file_bytes += part_elems * esz;
	}
	if (!rc && n > 0) {
		rc = kt_weight(m->be, dt, buf, (int64_t)n * rows, cols, false, dst);
		if (rc)
			atlas_errf(err, errlen, rc, "%s: backend: %s", what, strerror(-rc));
		else if ((rc = note_weight(m, dst))) {
			kt_free(m->be, dst);
			atlas_errf(err, errlen, rc, "out of memory");
		} else {
			m->info.parameters += (uint64_t)n * part_elems;
			m->info.device_bytes += kt_nbytes(dst);
		}
	}
	free(buf);
	return rc;
}

/* The dtype that holds most of the weight bytes, for model_info. */
static void note_file_dtype(struct model *m)
{
	size_t bytes[KT_I32 + 1] = { 0 };
	int best = KT_F32;

	for (int i = 0; i < m->st->n_tensors; i++) {
		const struct st_tensor *t = &m->st->tensors[i];
		if (t->bound)
			bytes[t->dtype] += t->nbytes;
	}
	for (int d = 0; d <= KT_I32; d++)
		if (bytes[d] > bytes[best])
			best = d;
	snprintf(m->info.dtype, sizeof m->info.dtype, "%s", kt_dtype_name((enum kt_dtype)best));
}

void model_bind_done(struct model *m)
{
	free(m->dummy);
	m->dummy = NULL;
	m->dummy_n = 0;
	if (!m->st) {
		snprintf(m->info.dtype, sizeof m->info.dtype, "BF16");
		return;
	}
	for (int i = 0; i < m->st->n_tensors; i++)
		if (!m->st->tensors[i].bound)
			log_debug("%s: tensor %s: not used by %s, ignored", m->st->tensors[i].file,
				  m->st->tensors[i].name, m->cfg.architecture);
	note_file_dtype(m);
}

void model_free_weights(struct model *m)
{
	for (int i = 0; i < m->n_weights; i++)
		kt_free(m->be, m->weights[i]);
	free(m->weights);
	free(m->dummy);
	m->dummy = NULL;
	m->weights = NULL;
	m->n_weights = m->weights_cap = 0;
}

int model_bind_rows(struct model *m, struct kt_tensor *dst, const char *name, int64_t full_rows,
		    int64_t cols, const int64_t *row0, const int64_t *n, int n_runs, char *err,
		    size_t errlen)
{
	int64_t rows = 0;
	for (int i = 0; i < n_runs; i++) {
		if (row0[i] < 0 || n[i] < 0 || row0[i] + n[i] > full_rows)
			return atlas_errf(err, errlen, -EINVAL, "%s: rows %lld.. (%lld) outside %lld",
					  name, (long long)row0[i], (long long)n[i],
					  (long long)full_rows);
		rows += n[i];
	}
	if (!m->st)
		return bind_dummy(m, dst, name, rows, cols, err, errlen);
	struct st_tensor *t;
	int rc;

	if ((rc = find_float(m, name, &t, err, errlen)) ||
	    (rc = check_shape(t, full_rows, cols, err, errlen)))
		return rc;
	const size_t row_bytes = (size_t)cols * kt_dtype_size(t->dtype);
	unsigned char *buf = malloc((size_t)rows * row_bytes), *p = buf;
	if (!buf)
		return atlas_errf(err, errlen, -ENOMEM, "%s: out of host memory", name);
	for (int i = 0; i < n_runs; i++) {
		memcpy(p, (const char *)t->data + (size_t)row0[i] * row_bytes,
		       (size_t)n[i] * row_bytes);
		p += (size_t)n[i] * row_bytes;
	}
	rc = kt_weight(m->be, t->dtype, buf, rows, cols, false, dst);
	free(buf);
	if (rc)
		return atlas_errf(err, errlen, rc, "%s: tensor %s: backend: %s", t->file, name,
				  strerror(-rc));
	if ((rc = note_weight(m, dst))) {
		kt_free(m->be, dst);
		return atlas_errf(err, errlen, rc, "out of memory");
	}
	t->bound = true;
	m->info.parameters += (uint64_t)rows * (uint64_t)cols;
	m->info.file_bytes += (size_t)rows * row_bytes;
	m->info.device_bytes += kt_nbytes(dst);
	return 0;
}

/* Tensor t's n values as f32 plus add. */
static void vector_f32(const struct st_tensor *t, int64_t n, float add, float *out)
{
	const unsigned char *s = t->data;
	for (int64_t i = 0; i < n; i++) {
		uint16_t h;
		float v;
		if (t->dtype == KT_F32) {
			memcpy(&v, s + 4 * i, sizeof v);
		} else {
			memcpy(&h, s + 2 * i, sizeof h);
			v = half_bits_to_float(t->dtype == KT_F16 ? half_f16_bits(h)
								  : half_bf16_bits(h));
		}
		out[i] = v + add;
	}
}

int model_bind_f32(struct model *m, struct kt_tensor *dst, const char *name, int64_t cols,
		   float add, char *err, size_t errlen)
{
	struct st_tensor *t = NULL;
	int rc;

	if (m->st && ((rc = find_float(m, name, &t, err, errlen)) ||
		      (rc = check_shape(t, 0, cols, err, errlen))))
		return rc;
	float *v = malloc((size_t)cols * sizeof *v);
	if (!v)
		return atlas_errf(err, errlen, -ENOMEM, "%s: out of host memory", name);
	*dst = (struct kt_tensor){ 0 };
	if (t)
		vector_f32(t, cols, add, v);
	else
		for (int64_t i = 0; i < cols; i++)
			v[i] = add;
	if ((rc = kt_alloc(m->be, KT_F32, 1, cols, dst)) ||
	    (rc = kt_upload(m->be, dst, 0, v, (size_t)cols * sizeof *v))) {
		free(v);
		if (dst->data)
			kt_free(m->be, dst);
		return atlas_errf(err, errlen, rc, "%s: backend: %s", name, strerror(-rc));
	}
	free(v);
	if ((rc = note_weight(m, dst))) {
		kt_free(m->be, dst);
		return atlas_errf(err, errlen, rc, "out of memory");
	}
	if (t) {
		t->bound = true;
		m->info.file_bytes += t->nbytes;
	}
	m->info.parameters += (uint64_t)cols;
	m->info.device_bytes += kt_nbytes(dst);
	return 0;
}
