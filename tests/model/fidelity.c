#include "fidelity.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "common/err.h"

/* ---- reading the references ---- */

static int read_f32(const char *dir, const char *file, size_t n, float **out, char *err,
		    size_t errlen)
{
	char path[4200];
	snprintf(path, sizeof path, "%s/ref/%s", dir, file);
	FILE *f = fopen(path, "rb");
	if (!f)
		return atlas_errf(err, errlen, -errno, "%s: %s", path, strerror(errno));
	*out = malloc((n + 1) * sizeof(float));   /* one more, to see a longer file */
	size_t got = fread(*out, sizeof(float), n + 1, f);
	fclose(f);
	if (got != n)
		return atlas_errf(err, errlen, -EINVAL, "%s: %zu floats, want %zu", path, got, n);
	return 0;
}

static int32_t *int_list(json_t *a, int *n)
{
	size_t i;
	json_t *v;
	int32_t *out = malloc((json_array_size(a) + 1) * sizeof *out);
	json_array_foreach(a, i, v)
		out[i] = (int32_t)json_integer_value(v);
	*n = (int)json_array_size(a);
	return out;
}

static int parse_greedy(json_t *runs, struct ref_greedy *g, int *count)
{
	size_t i, j;
	json_t *run, *gap;
	if (!json_is_array(runs) || json_array_size(runs) > FID_MAX_PROMPTS)
		return -EINVAL;
	json_array_foreach(runs, i, run) {
		g[i].prompt = int_list(json_object_get(run, "prompt"), &g[i].n_prompt);
		g[i].tokens = int_list(json_object_get(run, "tokens"), &g[i].n_tokens);
		json_t *gaps = json_object_get(run, "gaps");
		if (json_array_size(gaps) != (size_t)g[i].n_tokens || !g[i].n_prompt)
			return -EINVAL;
		g[i].gaps = malloc(((size_t)g[i].n_tokens + 1) * sizeof(double));
		json_array_foreach(gaps, j, gap)
			g[i].gaps[j] = json_number_value(gap);
	}
	*count = (int)json_array_size(runs);
	return 0;
}

static int cmp_len(const void *a, const void *b)
{
	return ((const struct ref_seq *)a)->len - ((const struct ref_seq *)b)->len;
}

static int parse_ref(struct ref_model *r, json_t *j, char *err, size_t errlen)
{
	json_t *seqs = json_object_get(j, "sequences"), *s;
	size_t i;
	int n, rc;

	snprintf(r->dtype, sizeof r->dtype, "%s",
		 json_string_value(json_object_get(j, "dtype")) ?: "");
	r->lowp = strcmp(r->dtype, "float32") != 0;
	r->vocab = (int)json_integer_value(json_object_get(j, "vocab_size"));
	r->max_new_tokens = (int)json_integer_value(json_object_get(j, "max_new_tokens"));
	if (!r->max_new_tokens)
		r->max_new_tokens = 24;
	if (r->vocab <= 0 || !json_is_array(seqs) || json_array_size(seqs) < 2 ||
	    json_array_size(seqs) > FID_MAX_REF_SEQS || r->max_new_tokens > FID_NEW_TOKENS)
		return atlas_errf(err, errlen, -EINVAL, "%s/ref/ref.json: bad layout", r->dir);
	json_array_foreach(seqs, i, s) {
		struct ref_seq *q = &r->seqs[i];
		q->ids = int_list(json_object_get(s, "ids"), &q->len);
		r->n_seqs++;
		if (q->len <= 0 || q->len > FID_MAX_TOKENS || q->len > FID_MAX_CONTEXT)
			return atlas_errf(err, errlen, -EINVAL, "%s: sequence %zu: bad length",
					  r->dir, i);
		n = q->len * r->vocab;
		const char *f = json_string_value(json_object_get(s, "logits"));
		if (!f || (rc = read_f32(r->dir, f, (size_t)n, &q->logits, err, errlen)))
			return f ? rc : atlas_errf(err, errlen, -EINVAL, "%s: no logits", r->dir);
		f = json_string_value(json_object_get(s, "logits_upcast"));
		if (r->lowp && (!f || (rc = read_f32(r->dir, f, (size_t)n, &q->logits_upcast, err,
						     errlen))))
			return f ? rc
				 : atlas_errf(err, errlen, -EINVAL, "%s: no upcast logits", r->dir);
	}
	qsort(r->seqs, (size_t)r->n_seqs, sizeof r->seqs[0], cmp_len);
	int n_up = 0;
	if (parse_greedy(json_object_get(j, "greedy"), r->greedy, &r->n_greedy) ||
	    (r->lowp &&
	     (parse_greedy(json_object_get(j, "greedy_upcast"), r->greedy_upcast, &n_up) ||
	      n_up != r->n_greedy)))
		return atlas_errf(err, errlen, -EINVAL, "%s/ref/ref.json: bad greedy runs", r->dir);
	if (r->lowp) {
		json_t *d = json_object_get(j, "lowp_vs_upcast_max_abs");
		if (!json_is_number(d))
			return atlas_errf(err, errlen, -EINVAL, "%s: no lowp_vs_upcast_max_abs",
					  r->dir);
		r->lowp_vs_upcast = json_number_value(d);
		r->tol_lowp = 1e-3 + r->lowp_vs_upcast;
	}
	return 0;
}

static int cmp_name(const void *a, const void *b)
{
	return strcmp(((const struct ref_model *)a)->name, ((const struct ref_model *)b)->name);
}

int fid_find_models(struct ref_model *refs, int max, char *err, size_t errlen)
{
	char root[2048], path[2400];
	const char *env = getenv("ATLAS_FIDELITY_MODELS");
	const char *src = getenv("ATLAS_SOURCE_ROOT");
	struct dirent *e;
	int n = 0, rc = 0;

	snprintf(root, sizeof root, "%s", env ? env : "");
	if (!env)
		snprintf(root, sizeof root, "%s/tests/fidelity/models", src ? src : ".");
	DIR *d = opendir(root);
	if (!d)
		return 0;
	while ((e = readdir(d)) && n < max && !rc) {
		json_error_t je;
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof path, "%s/%s/ref/ref.json", root, e->d_name);
		json_t *j = json_load_file(path, 0, &je);
		if (!j)
			continue;
		struct ref_model *r = &refs[n++];
		memset(r, 0, sizeof *r);
		snprintf(r->dir, sizeof r->dir, "%s/%s", root, e->d_name);
		snprintf(r->name, sizeof r->name, "%s", e->d_name);
		rc = parse_ref(r, j, err, errlen);
		json_decref(j);
	}
	closedir(d);
	if (rc)
		return rc;
	qsort(refs, (size_t)n, sizeof *refs, cmp_name);
	return n;
}

/* ---- the paged-KV harness ---- */

static int alloc_kv(struct ref_model *r, struct kt_backend *be)
{
	const struct model_config *c = model_get_config(r->m);
	const int per_seq = FID_MAX_CONTEXT / FID_BLOCK, n_blocks = FID_MAX_SEQS * per_seq;
	struct fid_kv *kv = &r->kv;
	int32_t table[FID_MAX_SEQS * (FID_MAX_CONTEXT / FID_BLOCK)];
	int rc = 0;

	kv->n_layers = c->n_layers;
	kv->k = calloc((size_t)c->n_layers, sizeof *kv->k);
	kv->v = calloc((size_t)c->n_layers, sizeof *kv->v);
	for (int l = 0; l < c->n_layers && !rc; l++)
		rc = kt_alloc(be, be->info.kv_dtype, (int64_t)n_blocks * FID_BLOCK,
			      (int64_t)c->n_kv_heads * c->head_dim, &kv->k[l]) ||
		     kt_alloc(be, be->info.kv_dtype, (int64_t)n_blocks * FID_BLOCK,
			      (int64_t)c->n_kv_heads * c->head_dim, &kv->v[l]);
	kv->n_states = c->n_linear_layers;
	kv->state = calloc((size_t)c->n_linear_layers + 1, sizeof *kv->state);
	for (int l = 0; l < c->n_linear_layers && !rc; l++)
		rc = kt_alloc(be, KT_F32, FID_MAX_SEQS, c->linear_state_floats, &kv->state[l]);
	if (c->n_linear_layers && !rc)
		rc = kt_alloc(be, KT_I32, FID_MAX_TOKENS, 1, &kv->state_slot);
	/* Scattered blocks: slot s, block j lives at a permuted device block. */
	for (int i = 0; i < n_blocks; i++)
		table[i] = (int32_t)((i * 13 + 5) % n_blocks);
	return rc || kt_alloc(be, KT_I32, FID_MAX_SEQS, per_seq, &kv->block_tables) ||
	       kt_upload(be, &kv->block_tables, 0, table, sizeof table) ||
	       kt_alloc(be, KT_I32, FID_MAX_TOKENS, 1, &kv->ids) ||
	       kt_alloc(be, KT_I32, FID_MAX_TOKENS, 1, &kv->pos) ||
	       kt_alloc(be, KT_I32, FID_MAX_TOKENS, 1, &kv->seq) ||
	       kt_alloc(be, KT_I32, FID_MAX_TOKENS, 1, &kv->out_rows) ||
	       kt_alloc(be, KT_F32, FID_MAX_TOKENS, r->vocab, &kv->logits) ? -ENOMEM : 0;
}

bool fid_gather_rows;

/* One step of n tokens; logits of rows[0..n_out) into out [n_out, vocab]. */
static void step(struct ref_model *r, struct model *m, struct kt_backend *be, const int32_t *ids,
		 const int32_t *seq, const int32_t *pos, int n, const int32_t *rows, int n_out,
		 float *out)
{
	struct fid_kv *kv = &r->kv;
	const size_t ib = (size_t)n * sizeof(int32_t);
	int max_pos = 0;

	for (int t = 0; t < n; t++)
		max_pos = pos[t] > max_pos ? pos[t] : max_pos;
	assert_true(n > 0 && n <= FID_MAX_TOKENS && max_pos < FID_MAX_CONTEXT);
	assert_int_equal(kt_upload(be, &kv->ids, 0, ids, ib), 0);
	assert_int_equal(kt_upload(be, &kv->pos, 0, pos, ib), 0);
	assert_int_equal(kt_upload(be, &kv->seq, 0, seq, ib), 0);
	if (kv->n_states)
		assert_int_equal(kt_upload(be, &kv->state_slot, 0, seq, ib), 0);
	assert_int_equal(kt_upload(be, &kv->out_rows, 0, rows, (size_t)n_out * sizeof(int32_t)), 0);
	bool out_all = n_out == n && !fid_gather_rows;
	for (int t = 0; out_all && t < n_out; t++)
		out_all = rows[t] == t;

	const struct model_step s = {
		.ids = kt_rows(kv->ids, 0, n),
		.batch = { .n_tokens = n,
			   .block_size = FID_BLOCK,
			   .max_kv_len = max_pos + 1,
			   .pos = kt_rows(kv->pos, 0, n),
			   .seq = kt_rows(kv->seq, 0, n),
			   .block_tables = kv->block_tables },
		.kcache = kv->k,
		.vcache = kv->v,
		.out_rows = kt_rows(kv->out_rows, 0, n_out),
		.out_all = out_all,
		.logits = kt_rows(kv->logits, 0, n_out),
		.state = kv->state,
		.state_slot = kv->n_states ? kt_rows(kv->state_slot, 0, n) : (struct kt_tensor){ 0 },
	};
	assert_int_equal(model_forward(m, &s), 0);
	assert_int_equal(kt_download(be, out, &s.logits, 0, kt_nbytes(&s.logits)), 0);
}

void fid_step(struct ref_model *r, struct kt_backend *be, const int32_t *ids, int slot,
	      int pos0, int n, float *out)
{
	int32_t seq[FID_MAX_TOKENS], pos[FID_MAX_TOKENS], rows[FID_MAX_TOKENS];
	for (int t = 0; t < n; t++) {
		seq[t] = slot;
		pos[t] = pos0 + t;
		rows[t] = t;
	}
	step(r, r->m, be, ids, seq, pos, n, rows, n, out);
}

static void one_step(struct ref_model *r, struct model *m, struct kt_backend *be,
		     const struct ref_seq *q, int slot, float *out)
{
	int32_t seq[FID_MAX_TOKENS], pos[FID_MAX_TOKENS];
	for (int t = 0; t < q->len; t++) {
		seq[t] = slot;
		pos[t] = t;
	}
	step(r, m, be, q->ids, seq, pos, q->len, pos, q->len, out);
}

int fid_open(struct ref_model *r, struct kt_backend *be, char *err, size_t errlen)
{
	int rc = model_load(r->dir, be, FID_MAX_TOKENS, FID_MAX_TOKENS, &r->m, err, errlen);
	if (rc)
		return rc;
	if (model_get_config(r->m)->vocab_size != r->vocab)
		return atlas_errf(err, errlen, -EINVAL, "vocab %d, ref.json says %d",
				  model_get_config(r->m)->vocab_size, r->vocab);
	if (alloc_kv(r, be))
		return atlas_errf(err, errlen, -ENOMEM, "KV caches: backend allocation failed");
	for (int s = 0; s < r->n_seqs; s++) {
		struct ref_seq *q = &r->seqs[s];
		q->ours = malloc((size_t)q->len * (size_t)r->vocab * sizeof(float));
		one_step(r, r->m, be, q, 0, q->ours);
	}
	return 0;
}

static void free_greedy(struct ref_greedy *g, int n)
{
	for (int i = 0; i < n; i++) {
		free(g[i].prompt);
		free(g[i].tokens);
		free(g[i].gaps);
	}
}

void fid_close(struct ref_model *r, struct kt_backend *be)
{
	struct fid_kv *kv = &r->kv;
	struct kt_tensor *small[] = { &kv->block_tables, &kv->ids, &kv->pos, &kv->seq,
				      &kv->out_rows, &kv->logits };
	for (int l = 0; l < kv->n_layers; l++) {
		if (kv->k[l].data)
			kt_free(be, &kv->k[l]);
		if (kv->v[l].data)
			kt_free(be, &kv->v[l]);
	}
	for (size_t i = 0; i < sizeof small / sizeof small[0]; i++)
		if (small[i]->data)
			kt_free(be, small[i]);
	for (int l = 0; l < kv->n_states; l++)
		if (kv->state[l].data)
			kt_free(be, &kv->state[l]);
	if (kv->state_slot.data)
		kt_free(be, &kv->state_slot);
	free(kv->state);
	free(kv->k);
	free(kv->v);
	for (int s = 0; s < r->n_seqs; s++) {
		free(r->seqs[s].ids);
		free(r->seqs[s].logits);
		free(r->seqs[s].logits_upcast);
		free(r->seqs[s].ours);
	}
	free_greedy(r->greedy, r->n_greedy);
	if (r->lowp)
		free_greedy(r->greedy_upcast, r->n_greedy);
	model_free(r->m);
}

void fid_run_chunked(struct ref_model *r, struct kt_backend *be, const struct ref_seq *const *seqs,
		     const int *const *plans, float **outs, int n)
{
	const int first_slot = n == 1 ? 1 : 0; /* alone: not the slot of the one-step run */
	const size_t V = (size_t)r->vocab;
	int32_t ids[FID_MAX_TOKENS], seq[FID_MAX_TOKENS], pos[FID_MAX_TOKENS];
	int done[2] = { 0, 0 }, k = 0;
	float *out = malloc(FID_MAX_TOKENS * V * sizeof(float));

	while ((done[0] < seqs[0]->len) || (n > 1 && done[1] < seqs[1]->len)) {
		int quota[2] = { 0, 0 }, t = 0;
		for (int s = 0; s < n; s++) {
			quota[s] = seqs[s]->len - done[s];
			if (plans[s][k] < quota[s])
				quota[s] = plans[s][k];
			if (quota[s] > FID_MAX_TOKENS / 2)
				quota[s] = FID_MAX_TOKENS / 2;
		}
		/* Token by token, or one sequence's rows after the other's where
		 * linear-attention layers need a sequence's rows together. */
		const bool together = r->kv.n_states > 0;
		while (quota[0] || quota[1])
			for (int s = 0; s < n; s++)
				while (quota[s]) {
					ids[t] = seqs[s]->ids[done[s]];
					seq[t] = first_slot + s;
					pos[t++] = done[s]++;
					quota[s]--;
					if (!together)
						break;
				}
		int32_t rows[FID_MAX_TOKENS];
		for (int i = 0; i < t; i++)
			rows[i] = i;
		step(r, r->m, be, ids, seq, pos, t, rows, t, out);
		for (int i = 0; i < t; i++)
			memcpy(outs[seq[i] - first_slot] + (size_t)pos[i] * V, out + (size_t)i * V,
			       V * sizeof(float));
		if (plans[0][k] < 1000 || (n > 1 && plans[1][k] < 1000))
			k++;
	}
	free(out);
}

int fid_greedy(struct ref_model *r, struct kt_backend *be, const int32_t *prompt, int n_prompt,
	       int max_new, int32_t *tokens)
{
	const struct model_config *c = model_get_config(r->m);
	int32_t seq[FID_MAX_TOKENS] = { 0 }, pos[FID_MAX_TOKENS];
	float *logits = malloc((size_t)r->vocab * sizeof(float));
	int n = 0;

	for (int t = 0; t < n_prompt; t++)
		pos[t] = t;
	int32_t last = n_prompt - 1;
	step(r, r->m, be, prompt, seq, pos, n_prompt, &last, 1, logits);
	while (n < max_new) {
		int best = 0;
		for (int v = 1; v < r->vocab; v++)
			if (logits[v] > logits[best])
				best = v;
		tokens[n++] = best;
		bool eos = false;
		for (int e = 0; e < c->n_eos; e++)
			eos |= c->eos_token_ids[e] == best;
		if (eos || n == max_new)
			break;
		int32_t p = n_prompt + n - 1, zero = 0;
		step(r, r->m, be, &tokens[n - 1], seq, &p, 1, &zero, 1, logits);
	}
	free(logits);
	return n;
}

/* ---- the 4.x spelling ---- */

static json_t *v4_config(json_t *v5)
{
	json_t *c = json_deep_copy(v5);
	json_t *rope = json_deep_copy(json_object_get(c, "rope_parameters"));

	if (rope) {
		json_object_set(c, "rope_theta", json_object_get(rope, "rope_theta"));
		json_object_del(rope, "rope_theta");
		const char *type = json_string_value(json_object_get(rope, "rope_type"));
		bool scaled = type && strcmp(type, "default") != 0;
		json_object_set_new(c, "rope_scaling", scaled ? json_incref(rope) : json_null());
		json_object_del(c, "rope_parameters");
		json_decref(rope);
	}
	if (json_object_get(c, "dtype")) {
		json_object_set(c, "torch_dtype", json_object_get(c, "dtype"));
		json_object_del(c, "dtype");
	}
	return c;
}

static int copy_file(const char *from, const char *to)
{
	FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
	char buf[65536];
	size_t n;
	int rc = in && out ? 0 : -EIO;

	while (!rc && (n = fread(buf, 1, sizeof buf, in)) > 0)
		rc = fwrite(buf, 1, n, out) == n ? 0 : -EIO;
	if (in)
		fclose(in);
	if (out && fclose(out))
		rc = -EIO;
	return rc;
}

int fid_copy_as_v4(const char *src, const char *dst, char *err, size_t errlen)
{
	char from[8300], to[8300];
	struct dirent *e;
	struct stat sb;
	json_error_t je;
	int rc = 0;
	DIR *d = opendir(src);

	if (!d)
		return atlas_errf(err, errlen, -errno, "%s: %s", src, strerror(errno));
	while ((e = readdir(d)) && !rc) {
		snprintf(from, sizeof from, "%s/%s", src, e->d_name);
		snprintf(to, sizeof to, "%s/%s", dst, e->d_name);
		if (stat(from, &sb) || !S_ISREG(sb.st_mode))
			continue;
		if (strcmp(e->d_name, "config.json") != 0) {
			rc = copy_file(from, to);
			continue;
		}
		json_t *v5 = json_load_file(from, 0, &je);
		json_t *v4 = v5 ? v4_config(v5) : NULL;
		rc = v4 && json_dump_file(v4, to, JSON_INDENT(2)) == 0 ? 0 : -EIO;
		json_decref(v4);
		json_decref(v5);
	}
	closedir(d);
	return rc ? atlas_errf(err, errlen, rc, "copying %s to %s failed", src, dst) : 0;
}

int fid_logits_of_dir(struct ref_model *r, struct kt_backend *be, const char *dir,
		      const struct ref_seq *seq, float *out, char *err, size_t errlen)
{
	struct model *m;
	int rc = model_load(dir, be, FID_MAX_TOKENS, FID_MAX_TOKENS, &m, err, errlen);
	if (rc)
		return rc;
	one_step(r, m, be, seq, 0, out);
	model_free(m);
	return 0;
}
