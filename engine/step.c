/* Running a planned step on the backend, and the logits requests of tools.
 * Engine thread, engine.lock not held: everything read here was copied into
 * the step's staging arrays while planning. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "engine/internal.h"

static int upload_i32(struct atlas_engine *e, const struct kt_tensor *dst, const int32_t *src,
		      int n)
{
	return kt_upload(e->be, dst, 0, src, (size_t)n * sizeof *src);
}

static int upload_table(struct atlas_engine *e, int slot, const struct kv_seq *seq)
{
	int32_t *row = e->tables + (size_t)slot * (size_t)e->max_blocks;
	int n = kv_seq_resolve(&e->kv, seq, row, e->max_blocks);
	if (n < 0)
		return n;
	size_t off = (size_t)slot * (size_t)e->max_blocks * sizeof *row;
	return kt_upload(e->be, &e->d_tables, off, row, (size_t)n * sizeof *row);
}

/* Decode batch sizes that get a graph of their own; a batch runs padded to
 * the next one (or to max_batch). Dense at the small end, where padding
 * costs the most relative to the work. */
static const int graph_batches[] = { 1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256 };

/* The context lengths of graph buckets start here and double. */
#define GRAPH_MIN_KV 256

static int graph_batch(const struct atlas_engine *e, int n)
{
	for (size_t i = 0; i < ATLAS_ARRAY_LEN(graph_batches); i++)
		if (graph_batches[i] >= n)
			return ATLAS_MIN(graph_batches[i], e->max_batch);
	return e->max_batch;
}

static int graph_kv(const struct atlas_engine *e, int max_kv)
{
	int b = GRAPH_MIN_KV;
	while (b < max_kv && b < e->context)
		b *= 2;
	return ATLAS_MIN(b, e->context);
}

/* One forward pass as the graph of kt_graph records it. */
struct forward_args {
	struct model *model;
	struct kt_tensor ids, out_rows, logits;
	struct kt_batch b;
	struct kv_pool *kv;
};

static int record_forward(void *ctx)
{
	struct forward_args *f = ctx;
	const struct model_step s = { .ids = f->ids, .batch = f->b, .kcache = f->kv->k,
				      .vcache = f->kv->v, .out_rows = f->out_rows,
				      .logits = f->logits };
	return model_forward(f->model, &s);
}

/* Fill the host side of kt_batch: the leading single-token sequences are
 * decode rows, the rest segments. Rows are laid out sequence by sequence. */
static void describe(struct atlas_engine *e, const int32_t *pos, const int32_t *seqslot,
		     int n_tokens, struct kt_batch *b)
{
	struct kt_segment *segs = e->step.segments;
	int row = 0, n = 0;
	b->n_single = 0;
	while (row < n_tokens) {
		int len = 1;
		while (row + len < n_tokens && seqslot[row + len] == seqslot[row] &&
		       pos[row + len] == pos[row] + len)
			len++;
		if (len == 1 && n == 0)
			b->n_single++;
		else
			segs[n++] = (struct kt_segment){ .row = row, .n_rows = len,
							 .pos0 = pos[row], .seq = seqslot[row] };
		row += len;
	}
	b->n_segments = n;
	b->segments = segs;
}

/* Upload the inputs, run the model, leave logits [n_out, vocab] in d_logits.
 * A step of decode rows only, each giving logits, replays the graph of its
 * bucket: padded with rows of the pad slot to the bucket's batch. The host
 * staging arrays have room for the padding (max_tokens > max_batch). */
static int forward(struct atlas_engine *e, int32_t *ids, int32_t *pos, int32_t *seqslot,
		   int n_tokens, int32_t *out_rows, int n_out)
{
	int rc, max_kv = 0;
	for (int i = 0; i < n_tokens; i++)
		max_kv = ATLAS_MAX(max_kv, pos[i] + 1);
	struct forward_args f = {
		.model = e->model, .kv = &e->kv,
		.b = { .block_size = e->kv.block_size, .block_tables = e->d_tables },
	};
	describe(e, pos, seqslot, n_tokens, &f.b);
	bool graph = e->graphs && f.b.n_single == n_tokens && n_out == n_tokens;
	for (int i = 0; graph && i < n_out; i++)
		graph = out_rows[i] == i;
	if (graph) {
		int padded = graph_batch(e, n_tokens);
		for (int i = n_tokens; i < padded; i++) {
			ids[i] = 0;
			pos[i] = 0;
			seqslot[i] = pad_slot(e);
			out_rows[i] = i;
		}
		n_tokens = n_out = f.b.n_single = padded;
		max_kv = graph_kv(e, max_kv);
	}
	f.b.n_tokens = n_tokens;
	f.b.max_kv_len = max_kv;
	f.b.pos = kt_rows(e->d_pos, 0, n_tokens);
	f.b.seq = kt_rows(e->d_seq, 0, n_tokens);
	f.ids = kt_rows(e->d_ids, 0, n_tokens);
	f.out_rows = kt_rows(e->d_out_rows, 0, n_out);
	f.logits = kt_rows(e->d_logits, 0, n_out);
	if ((rc = upload_i32(e, &f.ids, ids, n_tokens)) ||
	    (rc = upload_i32(e, &f.b.pos, pos, n_tokens)) ||
	    (rc = upload_i32(e, &f.b.seq, seqslot, n_tokens)) ||
	    (rc = upload_i32(e, &f.out_rows, out_rows, n_out)))
		return rc;
	if (graph)
		return kt_graph(e->be, (uint64_t)n_tokens << 32 | (uint64_t)max_kv, record_forward,
				&f);
	return record_forward(&f);
}

int step_run(struct atlas_engine *e, char *err, size_t errlen)
{
	struct step *st = &e->step;
	int rc;
	for (int i = 0; i < st->n_seqs; i++)
		if ((rc = upload_table(e, st->seqs[i].slot, &st->seqs[i].s->kv)))
			return atlas_errf(err, errlen, rc, "kv: cannot resolve block table (%s)",
					  strerror(-rc));
	rc = forward(e, st->ids, st->pos, st->seqslot, st->n_tokens, st->out_rows, st->n_out);
	if (rc)
		return atlas_errf(err, errlen, rc, "%s backend: forward pass failed (%s)",
				  e->be->info.backend, strerror(-rc));
	struct kt_tensor logits = kt_rows(e->d_logits, 0, st->n_out);
	rc = kt_sample(e->be, &logits, st->sample, st->n_out, st->sampled);
	if (rc)
		return atlas_errf(err, errlen, rc, "%s backend: sampling failed (%s)",
				  e->be->info.backend, strerror(-rc));
	return 0;
}

int step_run_logits_job(struct atlas_engine *e, struct logits_job *job)
{
	struct step *st = &e->step;
	struct kv_seq seq = { 0 };
	int chunk = ATLAS_MIN(e->cfg.chunk_size, e->max_out);
	int rc = 0;
	if (job->n + 1 > (size_t)e->context) {
		snprintf(job->err, sizeof job->err, "%zu tokens do not fit the context of %d",
			 job->n, e->context);
		return -E2BIG;
	}
	for (size_t done = 0; done < job->n && !rc; done += (size_t)chunk) {
		int n = (int)ATLAS_MIN((size_t)chunk, job->n - done);
		if ((rc = kv_seq_reserve(&e->kv, &seq, (int)done + n))) {
			snprintf(job->err, sizeof job->err,
				 "KV pool too small for %zu tokens (%d blocks; raise kv_memory)",
				 job->n, e->kv.n_blocks);
			break;
		}
		for (int i = 0; i < n; i++) {
			st->ids[i] = job->ids[done + (size_t)i];
			st->pos[i] = (int)done + i;
			st->seqslot[i] = tools_slot(e);
			st->out_rows[i] = i;
		}
		if ((rc = upload_table(e, tools_slot(e), &seq)) ||
		    (rc = forward(e, st->ids, st->pos, st->seqslot, n, st->out_rows, n))) {
			snprintf(job->err, sizeof job->err, "forward pass failed (%s)",
				 strerror(-rc));
			break;
		}
		seq.n_tokens = (int)done + n;
		size_t row = (size_t)e->vocab * sizeof(float);
		rc = kt_download(e->be, job->out + done * (size_t)e->vocab, &e->d_logits, 0,
				 (size_t)n * row);
		if (rc)
			snprintf(job->err, sizeof job->err, "cannot read logits (%s)", strerror(-rc));
	}
	kv_seq_free(&e->kv, &seq);
	return rc;
}
