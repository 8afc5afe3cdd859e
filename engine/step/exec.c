/* The executor (exec.h): opening the device side, and running one command.
 *
 * A run derives each row's position and slot from the sequences, uploads
 * the entries of the command's block tables that changed since the last run
 * (into the rows of its slots) and the rows' arrays (in one copy: a copy
 * costs the host microseconds while the device waits), runs the model (a
 * step of decode rows and short verifies whose rows all want logits replays
 * the CUDA graph of its bucket, padded with rows of the pad slot), samples
 * the out rows inside the forward pass, and its graph (kt_draw_rows before
 * it, kt_draw in it, kt_drawn after it), and downloads the kept logits.
 *
 * A command whose tables name host-tier slots (DESIGN §8) is laid out for
 * model_attend: each sequence's blocks up to its last host one are pieces
 * that attention streams through the staging buffers (the device ones among
 * them are gathered too, so that the staged part is one run of positions),
 * its table keeps only the device blocks after them (the host entries point
 * at the pad block, which nothing reads), and from[slot] says where they
 * start. Such a step runs without a graph and ends with a sync, so that no
 * host slot it reads is handed on while the device still reads it.
 */
#include "engine/step/exec.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"

/* Row counts that get a graph of their own; a step runs padded to the next
 * one (past the last, to the next multiple of GRAPH_ROWS_STEP; at most to
 * the largest step a command holds, whose rows and logits rows the buffers
 * have room for). Dense at the small end, where padding costs the most
 * relative to the work; coarse above, so that verifies of every length do
 * not each record a graph of their own. */
static const int graph_batches[] = { 1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256 };
#define GRAPH_ROWS_STEP 64

/* A sequence of at most DECODE_ROWS_MAX rows that all give logits (a
 * verify: the last token and up to ATLAS_SPEC_K_MAX drafts) runs as decode
 * rows when only decode rows come before it: each row attends on its own,
 * by its own position, split over the keys like any decode row. A step of
 * decode rows and verifies is then one attention launch, and when all its
 * rows give logits it replays a graph. A segment's kernel would read the
 * keys once for all its rows, but without splitting them: at long
 * contexts it is the slower one by far (docs/perf.md, "what a verify step
 * costs"). A prompt chunk stays a segment, so that no decode row shares its
 * matmuls with prompt rows (dense_forward.c). */
#define DECODE_ROWS_MAX (ATLAS_SPEC_K_MAX + 1)

/* The context lengths of graph buckets start here and double. */
#define GRAPH_MIN_KV 256

static int graph_batch(const struct exec *x, int n)
{
	const int most = ATLAS_MIN(x->lim.max_rows, x->lim.max_out);
	for (size_t i = 0; i < ATLAS_ARRAY_LEN(graph_batches); i++)
		if (graph_batches[i] >= n)
			return ATLAS_MIN(graph_batches[i], most);
	return ATLAS_MIN((n + GRAPH_ROWS_STEP - 1) / GRAPH_ROWS_STEP * GRAPH_ROWS_STEP, most);
}

static int graph_kv(const struct exec *x, int max_kv)
{
	int b = GRAPH_MIN_KV;
	while (b < max_kv && b < x->geo.context)
		b *= 2;
	return ATLAS_MIN(b, x->geo.context);
}

/* Bytes for the KV pool: kv_memory, or with 0 what is left on the device of
 * gpu_memory_fraction once everything else is allocated (cpu: a fixed size). */
static int kv_budget(struct exec *x, uint64_t *bytes, char *err, size_t errlen)
{
	const struct atlas_config *c = &x->cfg;
	uint64_t free_b, total_b;
	if (c->kv_memory) {
		*bytes = c->kv_memory;
		return 0;
	}
	if (strcmp(x->be->info.backend, "cuda")) {
		*bytes = ATLAS_KV_MEMORY_CPU_AUTO;
		return 0;
	}
	int rc = kt_memory(x->be, &free_b, &total_b);
	if (rc)
		return atlas_errf(err, errlen, rc, "kv_memory: cannot read the device's free memory");
	uint64_t used = total_b - free_b;
	uint64_t share = (uint64_t)((double)c->gpu_memory_fraction * (double)total_b);
	if (share <= used)
		return atlas_errf(err, errlen, -ENOMEM,
				  "kv_memory: the model and its buffers use %.2f GiB of the %.2f GiB "
				  "that gpu_memory_fraction %.2f allows on %s; nothing is left for "
				  "the KV cache (raise gpu_memory_fraction or set kv_memory)",
				  (double)used / (1 << 30), (double)share / (1 << 30),
				  c->gpu_memory_fraction, x->be->info.name);
	*bytes = share - used;
	log_info("kv_memory: %.2f GiB (gpu_memory_fraction %.2f of %.2f GiB, %.2f GiB in use)",
		 (double)*bytes / (1 << 30), c->gpu_memory_fraction, (double)total_b / (1 << 30),
		 (double)used / (1 << 30));
	return 0;
}

bool exec_keeps_hidden(const struct atlas_config *cfg, const struct model_config *mc)
{
	return cfg->mtp_head && model_config_has_head(mc);
}

/* The hidden rows of a model that keeps them, or of a head; zeroed, so
 * that the padding rows of a graphed step compute on finite values. */
static int alloc_hidden(struct exec *x)
{
	const struct step_limits *l = &x->lim;
	const int64_t e = x->mc->hidden_size;
	const bool head = x->part == EXEC_MTP_HEAD;
	int rc;
	if (!head && !exec_keeps_hidden(&x->cfg, x->mc))
		return 0;
	if ((rc = kt_alloc(x->be, KT_F32, l->max_rows, e, &x->d_hidden)) ||
	    (head && (rc = kt_alloc(x->be, KT_F32, l->max_out, e, &x->d_hidden_out))))
		return rc;
	void *zero = calloc((size_t)l->max_rows * (size_t)e, sizeof(float));
	if (!zero)
		return -ENOMEM;
	rc = kt_upload(x->be, &x->d_hidden, 0, zero, kt_nbytes(&x->d_hidden));
	free(zero);
	return rc;
}

static int alloc_buffers(struct exec *x, char *err, size_t errlen)
{
	struct kt_backend *be = x->be;
	const struct step_limits *l = &x->lim;
	const int rows = x->n_seq_slots + 1, vocab = x->geo.vocab;
	int rc;
	const size_t packed = 4 * (size_t)l->max_rows + (size_t)l->max_out;
	if ((rc = kt_alloc(be, KT_I32, (int64_t)packed, 1, &x->d_rows)) ||
	    (rc = kt_alloc(be, KT_I32, rows, x->geo.max_blocks, &x->d_tables)) ||
	    (rc = kt_alloc(be, KT_F32, l->max_out, vocab, &x->d_logits)) ||
	    (rc = alloc_hidden(x)))
		return atlas_errf(err, errlen, rc, "cannot allocate step buffers on the %s backend",
				  be->info.backend);
	x->ids = calloc((size_t)l->max_rows, sizeof *x->ids);
	x->pos = calloc((size_t)l->max_rows, sizeof *x->pos);
	x->seqslot = calloc((size_t)l->max_rows, sizeof *x->seqslot);
	x->stslot = calloc((size_t)l->max_rows, sizeof *x->stslot);
	x->out_rows = calloc((size_t)l->max_rows, sizeof *x->out_rows);
	x->h_rows = calloc(packed, sizeof *x->h_rows);
	x->h_tables_dev = calloc((size_t)rows * (size_t)x->geo.max_blocks, sizeof *x->h_tables_dev);
	x->sample = calloc((size_t)l->max_out, sizeof *x->sample);
	x->segments = calloc((size_t)l->max_seqs, sizeof *x->segments);
	x->tokens = calloc((size_t)l->max_out, sizeof *x->tokens);
	x->logits = malloc((size_t)l->max_out * (size_t)vocab * sizeof *x->logits);
	if (!x->ids || !x->pos || !x->seqslot || !x->stslot || !x->out_rows || !x->h_rows ||
	    !x->h_tables_dev || !x->sample || !x->segments ||
	    !x->tokens || !x->logits)
		return atlas_errf(err, errlen, -ENOMEM, "out of memory for step buffers");
	return 0;
}

/* Every block-table entry points into the pool: unused ones at block 0,
 * the pad slot's at the pad block (padding rows write and read only there).
 * h_tables_dev keeps what was uploaded: only upload_tables writes d_tables
 * after this. */
static int init_tables(struct exec *x)
{
	const size_t cols = (size_t)x->geo.max_blocks, rows = (size_t)x->n_seq_slots + 1;
	int32_t *t = x->h_tables_dev;
	for (size_t i = 0; i < cols; i++)
		t[(size_t)x->pad_slot * cols + i] = x->pool.kv.pad_block;
	return kt_upload(x->be, &x->d_tables, 0, t, rows * cols * sizeof *t);
}

static int load(struct exec *x, exec_join_fn join, void *ctx, char *err, size_t errlen)
{
	const struct atlas_config *c = &x->cfg;
	const bool dummy = !strcmp(c->load_format, "dummy");
	struct model_config mc;
	int rc = dummy ? model_shape_config(c->model, &mc, err, errlen)
		       : model_config_load(c->model, &mc, err, errlen);
	if (rc)
		return rc;
	if (c->context > mc.max_position_embeddings)
		return atlas_errf(err, errlen, -EINVAL,
				  "context: %d exceeds the model's max_position_embeddings %d",
				  c->context, mc.max_position_embeddings);
	x->geo.context = c->context ? c->context : mc.max_position_embeddings;
	x->geo.block_size = c->kv_block_size;
	/* In 64 bits: a context near INT_MAX (max_position_embeddings 2^31 - 1)
	 * would overflow the rounding. */
	x->geo.max_blocks = (int)(((int64_t)x->geo.context + c->kv_block_size - 1) /
				  c->kv_block_size);
	x->geo.n_slots = x->n_seq_slots + 1;
	x->geo.vocab = mc.vocab_size;
	x->pad_slot = x->n_seq_slots;
	if ((int64_t)x->lim.max_seqs * x->geo.max_blocks > INT32_MAX / 4)
		return atlas_errf(err, errlen, -EINVAL,
				  "context: %d positions for %d sequences need more block-table "
				  "entries than fit; set the key context lower", x->geo.context,
				  x->lim.max_seqs);
	x->lim.max_table = x->lim.max_seqs * x->geo.max_blocks;

	struct kt_config kc = {
		.backend = c->backend, .threads = c->threads, .device = c->device,
		.max_tokens = x->lim.max_rows, .max_seqs = x->geo.n_slots,
		.max_context = x->geo.context, .max_heads = mc.n_heads,
		/* the attention heads', and the delta rule's head dims */
		.max_head_dim = ATLAS_MAX(mc.head_dim, ATLAS_MAX(mc.linear.k_dim, mc.linear.v_dim)),
		.cpu_precision = c->cpu_precision,
		.cuda_pdl = c->cuda_pdl,
	};
	if ((rc = kt_backend_open(&kc, &x->be, err, errlen)))
		return rc;
	if (join && (rc = join(ctx, x->be, err, errlen)))
		return rc;
	if (x->part == EXEC_MTP_HEAD)
		rc = model_load_head(c->model, dummy, x->be, x->lim.max_rows, x->lim.max_out,
				     &x->model, err, errlen);
	else if (dummy)
		rc = model_load_dummy(c->model, x->be, x->lim.max_rows, x->lim.max_out, &x->model,
				      err, errlen);
	else
		rc = model_load(c->model, x->be, x->lim.max_rows, x->lim.max_out, &x->model, err,
				errlen);
	if (rc)
		return rc;
	x->mc = model_get_config(x->model);
	model_get_info(x->model, &x->info);
	x->graphs = x->be->info.graphs && c->cuda_graphs;
	/* The step buffers come before the KV pool, so that an automatic
	 * kv_memory sees every other allocation. */
	uint64_t kv_bytes = 0;
	if ((rc = alloc_buffers(x, err, errlen)) || (rc = kv_budget(x, &kv_bytes, err, errlen)))
		return rc;
	/* Recurrent states: one per sequence slot and one snapshot each, and
	 * the padding rows' of graphed steps. */
	if ((rc = seq_pool_init(&x->pool, x->be, x->mc, c->kv_block_size, kv_bytes,
				2 * x->n_seq_slots + 1, err, errlen)))
		return rc;
	x->pad_state = x->pool.state.n_layers ? state_slot_alloc(&x->pool.state) : -1;
	x->geo.state_slots = x->pool.state.n_layers ? x->pool.state.n_slots : 0;
	x->geo.n_blocks = x->pool.kv.n_blocks;
	if ((rc = init_tables(x)))
		return atlas_errf(err, errlen, rc, "cannot initialise the block tables");
	return 0;
}

int exec_open(const struct atlas_config *cfg, enum exec_part part, int n_seq_slots,
	      const struct step_limits *lim, struct exec **out, char *err, size_t errlen)
{
	return exec_open_joined(cfg, part, n_seq_slots, lim, NULL, NULL, out, err, errlen);
}

int exec_open_joined(const struct atlas_config *cfg, enum exec_part part, int n_seq_slots,
		     const struct step_limits *lim, exec_join_fn join, void *ctx,
		     struct exec **out, char *err, size_t errlen)
{
	struct exec *x = calloc(1, sizeof *x);
	if (!x)
		return atlas_errf(err, errlen, -ENOMEM, "out of memory");
	x->cfg = *cfg;
	x->part = part;
	x->n_seq_slots = n_seq_slots;
	x->lim = *lim;
	int rc = load(x, join, ctx, err, errlen);
	if (rc) {
		exec_close(x);
		return rc;
	}
	*out = x;
	return 0;
}

void exec_close(struct exec *x)
{
	if (!x)
		return;
	if (x->be) {
		struct kt_tensor *t[] = { &x->d_rows, &x->d_tables, &x->d_logits, &x->d_hidden,
					  &x->d_hidden_out };
		for (size_t i = 0; i < ATLAS_ARRAY_LEN(t); i++)
			if (t[i]->data)
				kt_free(x->be, t[i]);
		struct kt_tensor *st[] = { &x->stage.src, &x->stage.span, &x->stage.from,
					   &x->stage.ks[0], &x->stage.vs[0], &x->stage.ks[1],
					   &x->stage.vs[1], &x->stage.st.acc, &x->stage.st.ml };
		for (size_t i = 0; i < ATLAS_ARRAY_LEN(st); i++)
			if (st[i]->data)
				kt_free(x->be, st[i]);
		seq_pool_free(&x->pool);
		model_free(x->model);
		kt_backend_close(x->be);
	}
	free(x->h_src);
	free(x->h_span);
	free(x->h_from);
	free(x->h_tables);
	free(x->ids);
	free(x->pos);
	free(x->seqslot);
	free(x->stslot);
	free(x->out_rows);
	free(x->h_rows);
	free(x->h_tables_dev);
	free(x->sample);
	free(x->segments);
	free(x->tokens);
	free(x->logits);
	free(x);
}

int exec_staging_open(struct exec *x, uint64_t stage_bytes, char *err, size_t errlen)
{
	const struct kv_pool *kv = &x->pool.kv;
	struct model_staging *g = &x->stage;
	const struct step_limits *l = &x->lim;
	struct kt_backend *be = x->be;
	int rc;

	x->geo.host_blocks = x->pool.host.n_blocks;
	if (!x->pool.host.n_blocks || !kv->n_layers)
		return 0;
	g->layer_bytes = kv->bytes_per_block / (uint64_t)kv->n_layers;
	g->n_caches = kv->n_layers;
	/* Two buffers of K and V rows each: the memory holds 2 * slots layer slices. */
	g->slots = (int)ATLAS_MIN(ATLAS_MAX(stage_bytes / (2 * g->layer_bytes), 1),
				  (uint64_t)l->max_table);
	x->max_rounds = (l->max_table + g->slots - 1) / g->slots;
	g->pool = &kv->blocks;
	g->src_host = NULL;
	g->block_bytes = kv->bytes_per_block;
	g->host = x->pool.host.mem;
	g->host_slot_bytes = x->pool.host.slot_bytes;
	g->host_slots = x->pool.host.n_blocks;
	const int64_t stage_rows = (int64_t)g->slots * kv->block_size;
	const int heads = x->mc->n_heads, qcols = heads * x->mc->head_dim;
	if ((rc = kt_alloc(be, KT_I32, l->max_table, 1, &g->src)) ||
	    (rc = kt_alloc(be, KT_I32, (int64_t)x->max_rounds * l->max_rows, 2, &g->span)) ||
	    (rc = kt_alloc(be, KT_I32, x->n_seq_slots + 1, 1, &g->from)) ||
	    (rc = kt_alloc(be, kv->blocks.dtype, stage_rows, kv->row_cols, &g->ks[0])) ||
	    (rc = kt_alloc(be, kv->blocks.dtype, stage_rows, kv->row_cols, &g->vs[0])) ||
	    (rc = kt_alloc(be, kv->blocks.dtype, stage_rows, kv->row_cols, &g->ks[1])) ||
	    (rc = kt_alloc(be, kv->blocks.dtype, stage_rows, kv->row_cols, &g->vs[1])) ||
	    (rc = kt_alloc(be, KT_F32, l->max_rows, qcols, &g->st.acc)) ||
	    (rc = kt_alloc(be, KT_F32, l->max_rows, 2 * heads, &g->st.ml)))
		return atlas_errf(err, errlen, rc,
				  "kv_stage_memory: cannot allocate the staging buffers of %d blocks "
				  "(%.1f MiB) on the %s backend", g->slots,
				  2.0 * (double)g->slots * (double)g->layer_bytes / (1 << 20),
				  be->info.backend);
	x->h_src = calloc((size_t)l->max_table, sizeof *x->h_src);
	x->h_span = calloc((size_t)x->max_rounds * (size_t)l->max_rows * 2, sizeof *x->h_span);
	x->h_from = calloc((size_t)x->n_seq_slots + 1, sizeof *x->h_from);
	x->h_tables = calloc((size_t)l->max_table, sizeof *x->h_tables);
	g->src_host = x->h_src;
	if (!x->h_src || !x->h_span || !x->h_from || !x->h_tables)
		return atlas_errf(err, errlen, -ENOMEM, "out of memory for the staging layout");
	x->staging = true;
	log_info("kv: attention reads host-tier blocks through two staging buffers of %d blocks "
		 "of one layer (%.1f MiB)", g->slots,
		 2.0 * (double)g->slots * (double)g->layer_bytes / (1 << 20));
	return 0;
}

/* Lay out the pieces of c's host-tier blocks (see the top) into x->stage
 * and upload them; x->h_tables is the table to upload. Returns 0 with
 * stage.n_pieces 0 when every block is on the device. */
static int lay_out_staging(struct exec *x, const struct step_cmd *c)
{
	struct model_staging *g = &x->stage;
	const int T = c->n_rows, bs = x->geo.block_size;
	int n = 0, rc;

	g->n_pieces = g->n_rounds = 0;
	if (!x->staging)
		return 0;
	bool any = false;
	for (int i = 0; i < c->n_table && !any; i++)
		any = c->tables[i] < 0;
	if (!any)
		return 0;
	memcpy(x->h_tables, c->tables, (size_t)c->n_table * sizeof *x->h_tables);
	memset(x->h_from, 0, ((size_t)x->n_seq_slots + 1) * sizeof *x->h_from);
	for (int i = 0; i < c->n_seqs; i++) {
		const struct step_seq *q = &c->seqs[i];
		int h = 0;
		for (int b = 0; b < q->n_blocks; b++)
			if (c->tables[q->table + b] < 0)
				h = b + 1;
		for (int b = 0; b < h; b++) {
			x->h_src[n + b] = c->tables[q->table + b];
			x->h_tables[q->table + b] = x->pool.kv.pad_block;
		}
		x->h_from[q->slot] = h * bs;
		n += h;
	}
	if (!n)
		return 0;
	g->n_pieces = n;
	g->n_rounds = (n + g->slots - 1) / g->slots;
	x->staged_blocks += (uint64_t)n;
	for (int r = 0; r < g->n_rounds; r++) {
		const int p0 = r * g->slots, p1 = ATLAS_MIN(n, p0 + g->slots);
		int first = 0;
		for (int i = 0; i < c->n_seqs; i++) {
			const struct step_seq *q = &c->seqs[i];
			const int h = x->h_from[q->slot] / bs;
			const int a = ATLAS_MAX(first, p0), e = ATLAS_MIN(first + h, p1);
			for (int k = 0; k < q->n_rows; k++) {
				int32_t *sp = x->h_span + ((size_t)r * T + q->row + k) * 2;
				sp[0] = e > a ? (a - p0) * bs : 0;
				sp[1] = e > a ? (e - a) * bs : 0;
			}
			first += h;
		}
	}
	if ((rc = kt_upload(x->be, &g->src, 0, x->h_src, (size_t)n * sizeof *x->h_src)) ||
	    (rc = kt_upload(x->be, &g->span, 0, x->h_span,
			    (size_t)g->n_rounds * T * 2 * sizeof *x->h_span)) ||
	    (rc = kt_upload(x->be, &g->from, 0, x->h_from,
			    ((size_t)x->n_seq_slots + 1) * sizeof *x->h_from)))
		return rc;
	return 0;
}

/* One forward pass as the graph of kt_graph records it; with draw, the
 * draw of its logits rows (kt_draw, the requests staged before) too. */
struct forward_args {
	struct kt_backend *be;
	struct model *model;
	struct model_step s;
	bool draw;
};

static int record_forward(void *ctx)
{
	struct forward_args *f = ctx;
	int rc = model_forward(f->model, &f->s);
	if (rc || !f->draw)
		return rc;
	return kt_draw(f->be, &f->s.logits);
}

/* The step's rows on the host: position and slot of every row, the decode
 * rows and the segments of kt_batch, the rows that give logits. */
static void lay_out(struct exec *x, const struct step_cmd *c, struct kt_batch *b, int *max_kv)
{
	int n = 0, o = 0;
	*max_kv = 0;
	b->n_single = 0;
	for (int i = 0; i < c->n_seqs; i++) {
		const struct step_seq *q = &c->seqs[i];
		for (int r = 0; r < q->n_rows; r++) {
			x->pos[q->row + r] = q->pos0 + r;
			x->seqslot[q->row + r] = q->slot;
			x->stslot[q->row + r] = q->state_slot;
		}
		*max_kv = ATLAS_MAX(*max_kv, q->pos0 + q->n_rows);
		/* Out rows are in row order: count this sequence's. */
		int outs = 0;
		for (; o < c->n_out && c->out[o].row < q->row + q->n_rows; o++)
			outs += c->out[o].row >= q->row;
		const bool verify = q->n_rows <= DECODE_ROWS_MAX && outs == q->n_rows;
		if (n == 0 && (q->n_rows == 1 || verify))
			b->n_single += q->n_rows;
		else
			x->segments[n++] = (struct kt_segment){ .row = q->row, .n_rows = q->n_rows,
								.pos0 = q->pos0, .seq = q->slot };
	}
	b->n_segments = n;
	b->segments = x->segments;
	memcpy(x->ids, c->ids, (size_t)c->n_rows * sizeof *x->ids);
	/* a row that does not sample draws as a greedy one: its id is dropped,
	 * and the draw's kind is its sampled rows' */
	for (int i = 0; i < c->n_out; i++) {
		x->out_rows[i] = c->out[i].row;
		x->sample[i] = c->out[i].sample ? c->out[i].params
						: (struct kt_sample_row){ .top_p = 1.0f };
	}
}

/* Changed table entries closer than this many bytes go up in one copy,
 * with the unchanged ones between them: a copy costs the host a few
 * microseconds, more than a few KB more of it. */
#define TABLE_COPY_MERGE_BYTES 65536

static int upload_table_range(struct exec *x, size_t lo, size_t hi)
{
	int rc = kt_upload(x->be, &x->d_tables, lo * sizeof *x->h_tables_dev,
			   x->h_tables_dev + lo, (hi - lo) * sizeof *x->h_tables_dev);
	x->tables_stale |= rc != 0;
	return rc;
}

/* Upload the entries of the command's tables that differ from what
 * d_tables holds. A decode step's sequences gain a block every block_size
 * tokens, so most steps upload none; a batch of sequences that all gain one
 * at once is a few copies, not one a sequence. After a failed copy the
 * whole table goes up again. */
static int upload_tables(struct exec *x, const struct step_cmd *c)
{
	const int32_t *tables = x->stage.n_pieces ? x->h_tables : c->tables;
	const size_t cols = (size_t)x->geo.max_blocks;
	size_t lo = SIZE_MAX, hi = 0;
	int rc;
	for (int i = 0; i < c->n_seqs; i++) {
		const struct step_seq *q = &c->seqs[i];
		int32_t *dev = x->h_tables_dev + (size_t)q->slot * cols;
		const int32_t *t = tables + q->table;
		int b = 0, e = q->n_blocks;
		while (b < e && dev[b] == t[b])
			b++;
		while (e > b && dev[e - 1] == t[e - 1])
			e--;
		if (b == e)
			continue;
		memcpy(dev + b, t + b, (size_t)(e - b) * sizeof *t);
		const size_t from = (size_t)q->slot * cols + (size_t)b;
		const size_t to = (size_t)q->slot * cols + (size_t)e;
		if (lo != SIZE_MAX && (from >= hi ? from - hi : lo - to) * sizeof *t >
					      TABLE_COPY_MERGE_BYTES) {
			if ((rc = upload_table_range(x, lo, hi)))
				return rc;
			lo = SIZE_MAX;
			hi = 0;
		}
		lo = ATLAS_MIN(lo, from);
		hi = ATLAS_MAX(hi, to);
	}
	if (x->tables_stale) {
		x->tables_stale = false;
		return upload_table_range(x, 0, ((size_t)x->n_seq_slots + 1) * cols);
	}
	return lo == SIZE_MAX ? 0 : upload_table_range(x, lo, hi);
}

/* Pack the step's row arrays n_rows apart and upload them in one copy;
 * point the step's tensors at them. */
static int upload_rows(struct exec *x, struct model_step *s, int n_rows, int n_out)
{
	const size_t n = (size_t)n_rows;
	const int32_t *src[4] = { x->ids, x->pos, x->seqslot, x->stslot };
	for (size_t k = 0; k < 4; k++)
		memcpy(x->h_rows + k * n, src[k], n * sizeof *x->h_rows);
	memcpy(x->h_rows + 4 * n, x->out_rows, (size_t)n_out * sizeof *x->h_rows);
	s->ids = kt_rows(x->d_rows, 0, n_rows);
	s->batch.pos = kt_rows(x->d_rows, n_rows, n_rows);
	s->batch.seq = kt_rows(x->d_rows, 2 * n_rows, n_rows);
	if (x->pool.state.n_layers)
		s->state_slot = kt_rows(x->d_rows, 3 * n_rows, n_rows);
	s->out_rows = kt_rows(x->d_rows, 4 * n_rows, n_out);
	return kt_upload(x->be, &x->d_rows, 0, x->h_rows,
			 (4 * n + (size_t)n_out) * sizeof *x->h_rows);
}

/* Upload the rows, run the model, leave logits [n_out, vocab] in d_logits;
 * with draw, stage the rows' sampling requests and enqueue their draw
 * (kt_draw) after it. A step whose rows all run as decode rows (decodes
 * and short verifies), each giving logits, replays the graph of its
 * bucket and of its draw's kind: padded with rows of the pad slot (greedy
 * requests) to the bucket's row count, the draw inside it. */
static int forward(struct exec *x, const struct step_cmd *c, bool draw)
{
	int n_rows = c->n_rows, n_out = c->n_out, max_kv, rc, kind = 0;
	struct forward_args f = {
		.be = x->be,
		.model = x->model,
		.draw = draw,
		.s = { .kcache = x->pool.kv.k, .vcache = x->pool.kv.v,
		       .batch = { .block_size = x->geo.block_size, .block_tables = x->d_tables } },
	};
	f.s.batch.kv_block_rows = x->pool.kv.block_rows;
	lay_out(x, c, &f.s.batch, &max_kv);
	if ((rc = lay_out_staging(x, c)))
		return rc;
	if (x->stage.n_pieces)
		f.s.staged = &x->stage;
	bool out_all = n_out == n_rows;
	for (int i = 0; out_all && i < n_out; i++)
		out_all = x->out_rows[i] == i;
	const bool graph = x->graphs && f.s.batch.n_single == n_rows && out_all &&
			   !x->stage.n_pieces;
	f.s.out_all = out_all;
	if (graph) {
		int padded = graph_batch(x, n_rows);
		for (int i = n_rows; i < padded; i++) {
			x->ids[i] = 0;
			x->pos[i] = 0;
			x->seqslot[i] = x->pad_slot;
			x->stslot[i] = x->pad_state;
			x->out_rows[i] = i;
		}
		for (int i = n_out; i < padded; i++)
			x->sample[i] = (struct kt_sample_row){ .top_p = 1.0f };
		n_rows = n_out = f.s.batch.n_single = padded;
		max_kv = graph_kv(x, max_kv);
	}
	f.s.batch.n_tokens = n_rows;
	f.s.batch.max_kv_len = max_kv;
	f.s.logits = kt_rows(x->d_logits, 0, n_out);
	if (x->d_hidden.data)
		f.s.hidden = kt_rows(x->d_hidden, 0, n_rows);
	if (x->d_hidden_out.data)
		f.s.hidden_out = kt_rows(x->d_hidden_out, 0, n_out);
	if (x->pool.state.n_layers)
		f.s.state = x->pool.state.layers;
	if ((rc = upload_tables(x, c)) || (rc = upload_rows(x, &f.s, n_rows, n_out)))
		return rc;
	if (draw && (kind = kt_draw_rows(x->be, x->sample, n_out, x->geo.vocab)) < 0)
		return kind;
	if (graph)
		return kt_graph(x->be,
				(uint64_t)(draw ? 1 + kind : 0) << 61 | (uint64_t)n_rows << 32 |
					(uint64_t)max_kv,
				record_forward, &f);
	return record_forward(&f);
}

/* Copy the kept rows to the host, consecutive ones in one download. */
static int download_kept(struct exec *x, const struct step_cmd *c, int *n_keep)
{
	const size_t row = (size_t)x->geo.vocab * sizeof(float);
	int kept = 0;
	for (int i = 0; i < c->n_out;) {
		if (!c->out[i].keep) {
			i++;
			continue;
		}
		int j = i;
		while (j < c->n_out && c->out[j].keep)
			j++;
		int rc = kt_download(x->be, x->logits + (size_t)kept * (size_t)x->geo.vocab,
				     &x->d_logits, (size_t)i * row, (size_t)(j - i) * row);
		if (rc)
			return rc;
		kept += j - i;
		i = j;
	}
	*n_keep = kept;
	return 0;
}

int exec_launch(struct exec *x, const struct step_cmd *c, char *err, size_t errlen)
{
	const char *be = x->be->info.backend;
	bool sample = false;
	int rc;

	if ((rc = step_cmd_check(c, &x->lim, &x->geo, err, errlen))) {
		atlas_errprefix(err, errlen, "step %llu", (unsigned long long)c->number);
		return rc;
	}
	/* A step with sampled rows draws them (kt_draw) as part of its forward
	 * pass, and of its graph: the ids kt_sample gives. */
	for (int i = 0; i < c->n_out; i++)
		sample = sample || c->out[i].sample;
	x->launched_sample = sample;
	x->launched_graphs = x->be->graphs_recorded;
	if ((rc = forward(x, c, sample)))
		return atlas_errf(err, errlen, rc, "%s backend: forward pass failed (%s)", be,
				  strerror(-rc));
	return 0;
}

int exec_finish(struct exec *x, const struct step_cmd *c, struct step_result *r, char *err,
		size_t errlen)
{
	const char *be = x->be->info.backend;
	int rc;

	if (x->launched_sample && (rc = kt_drawn(x->be, x->tokens, c->n_out)))
		return atlas_errf(err, errlen, rc, "%s backend: sampling failed (%s)", be,
				  strerror(-rc));
	for (int i = 0; i < c->n_out; i++)
		if (!c->out[i].sample)
			x->tokens[i] = -1;
	if ((rc = download_kept(x, c, &r->n_keep)))
		return atlas_errf(err, errlen, rc, "%s backend: cannot read logits (%s)", be,
				  strerror(-rc));
	if (x->stage.n_pieces && (rc = kt_synchronize(x->be)))
		return atlas_errf(err, errlen, rc, "%s backend: a step over host-tier KV failed (%s)",
				  be, strerror(-rc));
	r->tokens = x->tokens;
	r->logits = x->logits;
	r->recorded = x->be->graphs_recorded != x->launched_graphs;
	return 0;
}

int exec_run(struct exec *x, const struct step_cmd *c, struct step_result *r, char *err,
	     size_t errlen)
{
	int rc = exec_launch(x, c, err, errlen);
	return rc ? rc : exec_finish(x, c, r, err, errlen);
}
