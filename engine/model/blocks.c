/* Pieces every family's forward pass shares (blocks.h). */
#include "engine/model/blocks.h"

#include <errno.h>
#include <stdlib.h>

#include "common/err.h"

#define TRY(op) do { int rc_ = (op); if (rc_) return rc_; } while (0)

int model_alloc(struct model *m, enum kt_dtype dtype, int64_t rows, int64_t cols,
		struct kt_tensor *t, const char *what, char *err, size_t errlen)
{
	int rc = kt_alloc(m->be, dtype, rows, cols, t);
	if (rc)
		return atlas_errf(err, errlen, rc,
				  "scratch %s [%lld, %lld]: backend allocation failed", what,
				  (long long)rows, (long long)cols);
	return 0;
}

int model_rope_table(struct model *m, struct kt_tensor *t, char *err, size_t errlen)
{
	const int half = m->cfg.rope_dim / 2;
	TRY(model_alloc(m, KT_F32, 1, half, t, "inv_freq", err, errlen));
	float *inv_freq = malloc((size_t)half * sizeof *inv_freq);
	if (!inv_freq)
		return atlas_errf(err, errlen, -ENOMEM, "rotary table: out of memory");
	model_rope_inv_freq(&m->cfg, inv_freq);
	int rc = kt_upload(m->be, t, 0, inv_freq, (size_t)half * sizeof *inv_freq);
	free(inv_freq);
	return rc ? atlas_errf(err, errlen, rc, "rotary table: upload failed") : 0;
}

int model_project(struct kt_backend *be, const struct kt_batch *b, const struct kt_tensor *y,
		  const struct kt_tensor *x, const struct kt_tensor *w,
		  const struct kt_tensor *bias)
{
	const int64_t T = x->rows, d = b->n_single;
	if (d <= 0 || d >= T)
		return kt_matmul(be, y, x, w, bias);
	const struct kt_tensor y0 = kt_rows(*y, 0, d), x0 = kt_rows(*x, 0, d);
	const struct kt_tensor y1 = kt_rows(*y, d, T - d), x1 = kt_rows(*x, d, T - d);
	TRY(kt_matmul(be, &y0, &x0, w, bias));
	return kt_matmul(be, &y1, &x1, w, bias);
}

int model_project_swiglu(struct kt_backend *be, const struct kt_batch *b,
			 const struct kt_tensor *act, const struct kt_tensor *gu,
			 const struct kt_tensor *x, const struct kt_tensor *w)
{
	const int64_t T = x->rows, d = b->n_single;
	if (d <= 0 || d >= T)
		return kt_matmul_swiglu(be, act, gu, x, w);
	const struct kt_tensor a0 = kt_rows(*act, 0, d), a1 = kt_rows(*act, d, T - d);
	const struct kt_tensor g0 = kt_rows(*gu, 0, d), g1 = kt_rows(*gu, d, T - d);
	const struct kt_tensor x0 = kt_rows(*x, 0, d), x1 = kt_rows(*x, d, T - d);
	TRY(kt_matmul_swiglu(be, &a0, &g0, &x0, w));
	return kt_matmul_swiglu(be, &a1, &g1, &x1, w);
}

int model_project_n(struct kt_backend *be, const struct kt_batch *b, int n,
		    const struct kt_tensor *const *ys, const struct kt_tensor *x,
		    const struct kt_tensor *const *ws, const struct kt_tensor *const *biases)
{
	const int64_t T = x->rows, d = b->n_single;
	struct kt_tensor y0[KT_MATMUL_MAX_N], y1[KT_MATMUL_MAX_N];
	const struct kt_tensor *p0[KT_MATMUL_MAX_N], *p1[KT_MATMUL_MAX_N];

	if (n < 1 || n > KT_MATMUL_MAX_N)
		return -EINVAL;
	if (d <= 0 || d >= T)
		return kt_matmul_n(be, n, ys, x, ws, biases);
	for (int i = 0; i < n; i++) {
		y0[i] = kt_rows(*ys[i], 0, d);
		y1[i] = kt_rows(*ys[i], d, T - d);
		p0[i] = &y0[i];
		p1[i] = &y1[i];
	}
	const struct kt_tensor x0 = kt_rows(*x, 0, d), x1 = kt_rows(*x, d, T - d);
	TRY(kt_matmul_n(be, n, p0, &x0, ws, biases));
	return kt_matmul_n(be, n, p1, &x1, ws, biases);
}

int model_head_input_alloc(struct model *m, struct model_head_input *h, char *err,
			   size_t errlen)
{
	const int64_t rows = 2 * (int64_t)m->max_tokens, e = m->cfg.hidden_size;
	TRY(model_alloc(m, KT_F32, rows, e, &h->halves, "MTP halves", err, errlen));
	TRY(model_alloc(m, KT_F32, rows, e, &h->pairs, "MTP pairs", err, errlen));
	TRY(model_alloc(m, KT_I32, rows, 1, &h->order, "MTP order", err, errlen));
	int32_t *order = malloc((size_t)rows * sizeof *order);
	if (!order)
		return atlas_errf(err, errlen, -ENOMEM, "out of memory");
	for (int t = 0; t < m->max_tokens; t++) {
		order[2 * t] = t;
		order[2 * t + 1] = m->max_tokens + t;
	}
	int rc = kt_upload(m->be, &h->order, 0, order, (size_t)rows * sizeof *order);
	free(order);
	return rc ? atlas_errf(err, errlen, rc, "MTP head: upload failed") : 0;
}

void model_head_input_free(struct model *m, struct model_head_input *h)
{
	struct kt_tensor *all[] = { &h->halves, &h->pairs, &h->order };
	for (size_t i = 0; i < ATLAS_ARRAY_LEN(all); i++)
		if (all[i]->data)
			kt_free(m->be, all[i]);
}

int model_head_input_run(struct model *m, const struct model_head_input *h,
			 const struct kt_tensor *embed, const struct model_step *s,
			 const struct kt_tensor *x)
{
	struct kt_backend *be = m->be;
	const int T = s->batch.n_tokens, M = m->max_tokens, E = m->cfg.hidden_size;
	const int64_t n_out = s->out_rows.rows;
	const float eps = m->cfg.rms_norm_eps;
	if (T <= 0 || T > M || s->ids.rows != T || s->hidden.rows < T || s->hidden.cols != E ||
	    n_out > m->max_out || s->logits.rows < n_out || s->logits.cols != m->cfg.vocab_size ||
	    (s->hidden_out.data && s->hidden_out.rows < n_out))
		return -EINVAL;
	const struct kt_tensor emb = kt_rows(h->halves, 0, T), hid = kt_rows(h->halves, M, T);
	const struct kt_tensor in = kt_rows(s->hidden, 0, T);
	const struct kt_tensor order = kt_rows(h->order, 0, 2 * (int64_t)T);
	const struct kt_tensor pairs = kt_rows(h->pairs, 0, 2 * (int64_t)T);
	const struct kt_tensor joined = kt_reshape(pairs, T, 2 * (int64_t)E);

	TRY(kt_embed(be, x, embed, &s->ids));
	TRY(kt_rmsnorm(be, &emb, x, NULL, &h->norm_e, eps));
	TRY(kt_rmsnorm(be, &hid, &in, NULL, &h->norm_h, eps));
	TRY(kt_gather_rows(be, &pairs, &h->halves, &order));
	return model_project(be, &s->batch, x, &joined, &h->fc, NULL);
}
