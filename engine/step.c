/* Running a planned step on the backend, and the logits requests of tools.
 * Engine thread, engine.lock not held: everything read here was copied into
 * the step's staging arrays while planning. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "engine/internal.h"

/* The slot whose block-table row belongs to atlas_engine_logits requests. */
static int tools_slot(const struct atlas_engine *e)
{
	return e->max_batch;
}

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

/* Upload the inputs, run the model, leave logits [n_out, vocab] in d_logits. */
static int forward(struct atlas_engine *e, const int32_t *ids, const int32_t *pos,
		   const int32_t *seqslot, int n_tokens, const int32_t *out_rows, int n_out)
{
	int rc, max_kv = 0;
	for (int i = 0; i < n_tokens; i++)
		max_kv = ATLAS_MAX(max_kv, pos[i] + 1);
	struct kt_tensor d_ids = kt_rows(e->d_ids, 0, n_tokens);
	struct kt_batch b = {
		.n_tokens = n_tokens,
		.block_size = e->kv.block_size,
		.max_kv_len = max_kv,
		.pos = kt_rows(e->d_pos, 0, n_tokens),
		.seq = kt_rows(e->d_seq, 0, n_tokens),
		.block_tables = e->d_tables,
	};
	struct kt_tensor d_rows = kt_rows(e->d_out_rows, 0, n_out);
	struct kt_tensor logits = kt_rows(e->d_logits, 0, n_out);
	if ((rc = upload_i32(e, &d_ids, ids, n_tokens)) ||
	    (rc = upload_i32(e, &b.pos, pos, n_tokens)) ||
	    (rc = upload_i32(e, &b.seq, seqslot, n_tokens)) ||
	    (rc = upload_i32(e, &d_rows, out_rows, n_out)))
		return rc;
	return model_forward(e->model, &d_ids, &b, e->kv.k, e->kv.v, &d_rows, &logits);
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
