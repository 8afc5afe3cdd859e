/* The scripted family's entry (script.h): its config.json checks, its
 * buffers and its forward pass, which keeps the context's token ids in the
 * paged KV cache, reads each sequence's context back through its block
 * table and writes logits for the token that script_rules.c picks. */
#include "engine/model/script/script.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "common/log.h"
#include "engine/model/hf_json.h"

#define TRY(op) do { int rc_ = (op); if (rc_) return rc_; } while (0)

/* The values a token id is stored as: one K (and V) row of the cache. */
#define SCRIPT_COLS 2
#define SCRIPT_DEFAULT_CONTEXT 4096

/* model.family_data of a script model. Host arrays are sized at load for
 * the largest step (max_tokens rows, max_out logits rows) and the longest
 * context (max_position_embeddings), so that the forward allocates nothing. */
struct script_model {
	struct kt_tensor table;         /* [SCRIPT_VOCAB, 2] id -> (id / 256, id % 256) */
	struct kt_tensor codes;         /* [max_tokens, 2] f32: the step's rows embedded */
	int max_context;                /* positions one sequence may have */
	int32_t *pos, *seq;             /* [max_tokens] the step's positions and slots */
	int32_t *out_rows;              /* [max_out] the rows that want logits */
	int32_t *blocks;                /* [max_context] one sequence's block-table row */
	unsigned char *kv;              /* [max_context * 2 * 4] its K rows as stored */
	int32_t *ctx;                   /* [max_context] its context read back */
	float *logits;                  /* [max_out, SCRIPT_VOCAB] */
};

static int parse_config(const struct hf_json *f, int variant, struct model_config *c, char *err,
			size_t errlen)
{
	/* One attention layer of one kv head of two values: a token id per
	 * cache row. The other shapes are what that layer implies. */
	const struct { const char *key; int have, want; } shape[] = {
		{ "vocab_size", c->vocab_size, SCRIPT_VOCAB },
		{ "hidden_size", c->hidden_size, SCRIPT_COLS },
		{ "num_hidden_layers", c->n_layers, 1 },
		{ "num_attention_heads", c->n_heads, 1 },
		{ "num_key_value_heads", c->n_kv_heads, 1 },
		{ "head_dim", c->head_dim, SCRIPT_COLS },
	};
	for (size_t i = 0; i < ATLAS_ARRAY_LEN(shape); i++)
		if (shape[i].have != shape[i].want)
			return atlas_errf(err, errlen, -EINVAL,
					  "%s: key %s: %d, the script model wants %d", f->path,
					  shape[i].key, shape[i].have, shape[i].want);
	if (!c->max_position_embeddings)
		c->max_position_embeddings = SCRIPT_DEFAULT_CONTEXT;
	c->layers[0] = (struct model_layer){ .mixer = MODEL_MIXER_ATTENTION,
					     .mlp = MODEL_MLP_DENSE, .cache = 0 };
	c->n_attention_layers = 1;
	return 0;
}

static int upload_table(struct model *m, struct script_model *sm, char *err, size_t errlen)
{
	float table[SCRIPT_VOCAB * SCRIPT_COLS];
	for (int id = 0; id < SCRIPT_VOCAB; id++) {
		table[id * SCRIPT_COLS] = (float)(id / 256);
		table[id * SCRIPT_COLS + 1] = (float)(id % 256);
	}
	int rc = kt_weight(m->be, KT_F32, table, SCRIPT_VOCAB, SCRIPT_COLS, false, &sm->table);
	return rc ? atlas_errf(err, errlen, rc, "script model: id table: backend allocation failed")
		  : 0;
}

static int script_load(struct model *m, char *err, size_t errlen)
{
	struct script_model *sm = calloc(1, sizeof *sm);
	if (!sm)
		return atlas_errf(err, errlen, -ENOMEM, "out of memory");
	m->family_data = sm;
	model_bind_done(m);
	sm->max_context = m->cfg.max_position_embeddings;
	size_t ctx = (size_t)sm->max_context;
	sm->pos = calloc((size_t)m->max_tokens, sizeof *sm->pos);
	sm->seq = calloc((size_t)m->max_tokens, sizeof *sm->seq);
	sm->out_rows = calloc((size_t)m->max_out, sizeof *sm->out_rows);
	sm->blocks = calloc(ctx, sizeof *sm->blocks);
	sm->kv = calloc(ctx * SCRIPT_COLS, sizeof(float));
	sm->ctx = calloc(ctx, sizeof *sm->ctx);
	sm->logits = calloc((size_t)m->max_out * SCRIPT_VOCAB, sizeof *sm->logits);
	if (!sm->pos || !sm->seq || !sm->out_rows || !sm->blocks || !sm->kv || !sm->ctx ||
	    !sm->logits)
		return atlas_errf(err, errlen, -ENOMEM, "script model: out of host memory");
	int rc = upload_table(m, sm, err, errlen);
	if (rc)
		return rc;
	rc = kt_alloc(m->be, KT_F32, m->max_tokens, SCRIPT_COLS, &sm->codes);
	return rc ? atlas_errf(err, errlen, rc, "script model: scratch: backend allocation failed")
		  : 0;
}

static void script_free(struct model *m)
{
	struct script_model *sm = m->family_data;
	if (!sm)
		return;
	if (sm->table.data)
		kt_free(m->be, &sm->table);
	if (sm->codes.data)
		kt_free(m->be, &sm->codes);
	free(sm->pos);
	free(sm->seq);
	free(sm->out_rows);
	free(sm->blocks);
	free(sm->kv);
	free(sm->ctx);
	free(sm->logits);
	free(sm);
	m->family_data = NULL;
}

/* An IEEE half as a float: subnormal, infinity or NaN (never an id), normal. */
static float half_to_float(uint16_t h)
{
	int e = (h >> 10) & 0x1f, f = h & 0x3ff;
	float v;
	if (e == 0)
		v = ldexpf((float)f, -24);
	else if (e == 31)
		v = NAN;
	else
		v = ldexpf((float)(f | 0x400), e - 25);
	return h & 0x8000 ? -v : v;
}

/* Value i of the K rows as the cache stores them. */
static float kv_value(const unsigned char *kv, enum kt_dtype dt, size_t i)
{
	uint16_t h;
	uint32_t bits;
	float v;
	switch (dt) {
	case KT_F32:
		memcpy(&v, kv + i * 4, 4);
		return v;
	case KT_BF16:
		memcpy(&h, kv + i * 2, 2);
		bits = (uint32_t)h << 16;
		memcpy(&v, &bits, 4);
		return v;
	case KT_F16:
		memcpy(&h, kv + i * 2, 2);
		return half_to_float(h);
	default:
		return NAN;
	}
}

/* The first n token ids of the sequence in slot, read back from the cache
 * through its block table into sm->ctx. */
static int read_context(struct model *m, const struct model_step *s, int slot, int n)
{
	struct script_model *sm = m->family_data;
	const struct kt_batch *b = &s->batch;
	const struct kt_tensor *k = &s->kcache[0];
	const int bs = b->block_size, n_blocks = (n + bs - 1) / bs;
	const int64_t stride = kt_kv_block_rows(b);
	const size_t row = (size_t)k->cols * kt_dtype_size(k->dtype);

	/* Its forward reads the cache itself, not through model_attend: a
	 * context partly on the host tier is beyond this test model. */
	if (s->staged && s->staged->n_pieces)
		return -ENOTSUP;
	if (n > sm->max_context || n_blocks > b->block_tables.cols || slot < 0 ||
	    slot >= b->block_tables.rows || k->cols != SCRIPT_COLS)
		return -EINVAL;
	TRY(kt_download(m->be, sm->blocks, &b->block_tables,
			(size_t)slot * (size_t)b->block_tables.cols * sizeof *sm->blocks,
			(size_t)n_blocks * sizeof *sm->blocks));
	for (int i = 0; i < n_blocks; i++) {
		int rows = ATLAS_MIN(bs, n - i * bs);
		if (sm->blocks[i] < 0 || sm->blocks[i] * stride + bs > k->rows)
			return -EINVAL;
		TRY(kt_download(m->be, sm->kv + (size_t)i * (size_t)bs * row, k,
				(size_t)(sm->blocks[i] * stride) * row, (size_t)rows * row));
	}
	for (int p = 0; p < n; p++) {
		float hi = kv_value(sm->kv, k->dtype, (size_t)p * SCRIPT_COLS);
		float lo = kv_value(sm->kv, k->dtype, (size_t)p * SCRIPT_COLS + 1);
		long id = lrintf(hi) * 256 + lrintf(lo);
		if (!(hi >= 0 && lo >= 0 && lo < 256) || id >= SCRIPT_VOCAB) {
			log_error("script model: slot %d position %d: the KV cache holds (%g, %g), "
				  "not a token id", slot, p, hi, lo);
			return -EIO;
		}
		sm->ctx[p] = (int32_t)id;
	}
	return 0;
}

static int script_forward(struct model *m, const struct model_step *s)
{
	struct script_model *sm = m->family_data;
	struct kt_backend *be = m->be;
	const struct kt_batch *b = &s->batch;
	const int T = b->n_tokens, n_out = (int)s->out_rows.rows;

	if (T <= 0 || T > m->max_tokens || s->ids.rows != T || n_out > m->max_out ||
	    s->logits.rows < n_out || s->logits.cols != SCRIPT_VOCAB)
		return -EINVAL;
	const struct kt_tensor codes = kt_rows(sm->codes, 0, T);
	TRY(kt_embed(be, &codes, &sm->table, &s->ids));
	TRY(kt_kv_store(be, &s->kcache[0], &s->vcache[0], &codes, &codes, b));
	if (n_out == 0)
		return 0;

	TRY(kt_download(be, sm->pos, &b->pos, 0, (size_t)T * sizeof *sm->pos));
	TRY(kt_download(be, sm->seq, &b->seq, 0, (size_t)T * sizeof *sm->seq));
	TRY(kt_download(be, sm->out_rows, &s->out_rows, 0, (size_t)n_out * sizeof *sm->out_rows));
	unsigned sleep_ms = 0;
	for (int i = 0; i < n_out; i++) {
		int r = sm->out_rows[i];
		if (r < 0 || r >= T)
			return -EINVAL;
		TRY(read_context(m, s, sm->seq[r], sm->pos[r] + 1));
		struct script_next next;
		script_next(sm->ctx, sm->pos[r] + 1, &next);
		if (next.token < 0) {
			log_error("script model: a FAIL turn (slot %d) fails this step on purpose",
				  sm->seq[r]);
			return -EIO;
		}
		float *row = sm->logits + (size_t)i * SCRIPT_VOCAB;
		for (int v = 0; v < SCRIPT_VOCAB; v++)
			row[v] = v == next.token ? 0 : -SCRIPT_LOGIT_MARGIN;
		sleep_ms = ATLAS_MAX(sleep_ms, next.sleep_ms);
	}
	TRY(kt_upload(be, &s->logits, 0, sm->logits,
		      (size_t)n_out * SCRIPT_VOCAB * sizeof *sm->logits));
	if (sleep_ms) {
		struct timespec ts = { .tv_sec = sleep_ms / 1000,
				       .tv_nsec = (long)(sleep_ms % 1000) * 1000000 };
		while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
			;
	}
	return 0;
}

const struct model_family script_family = {
	.name = "script",
	.parse_config = parse_config,
	.load = script_load,
	.free = script_free,
	.forward = script_forward,
};
