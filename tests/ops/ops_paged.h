/* The paged KV world that the kv_store, attention and graph cases share:
 * sequences whose K/V live in shuffled, non-contiguous blocks of a poisoned
 * cache, through shuffled block-table rows, and the steps that fill and read
 * them (ops_paged.c).
 *
 * A world is built on the host from the case's generator (paged_build) and
 * then set up on each backend alike (paged_setup). Sequence s has positions
 * [0, hist) stored before the step (history, stored in chunks of shuffled
 * tokens without a step shape) and [hist, hist + step) new in the step. The
 * step's tokens are either shuffled with no step shape (every backend runs
 * its generic path) or, as the engine gives them, decode rows (step 1)
 * first and then one segment per prompt chunk (step > 1), or as the
 * executor lays out a step of decode rows and verifies: every token a
 * decode row, a sequence's tokens next to each other (SHAPE_DECODE_ROWS).
 *
 * Cache layout: K and V tensors of their own, blocks back to back
 * (kv_block_rows 0), or, as the engine's pool lays them out (engine/kv/kv.h),
 * layer `layer` of `layers` whose caches share one allocation block-major:
 * block j is rows [j * S, (j + 1) * S), S = layers * 2 * bs, holding layer
 * 0's K rows, layer 0's V rows, layer 1's K rows, ...; the world's K and V
 * caches are views from its layer's rows of block 0 to the end (the last
 * layer's V view ends exactly with the last block), kv_block_rows S. Every
 * other layer's rows stay poisoned: the checks read the whole allocation.
 *
 * Cache dtype: KV_NATIVE is what the backend asks for (info.kv_dtype: cpu
 * f32, cuda bf16), KV_F32 is f32 everywhere. When the backend under test
 * keeps a bf16 cache, q, k and v are given to an f32-cache backend already
 * rounded to bf16 (k_f32 below), so that both hold the same values: the
 * bf16 backend is given the raw values and must round them itself.
 */
#ifndef ATLAS_TESTS_OPS_OPS_PAGED_H
#define ATLAS_TESTS_OPS_OPS_PAGED_H

#include "tests/ops/ops.h"

#define PAGED_MAX_SEQS 8

enum paged_kv { KV_NATIVE, KV_F32 };
enum paged_shape { SHAPE_PLAIN, SHAPE_STEP, SHAPE_DECODE_ROWS };

struct paged_seq {
	int hist, step; /* positions stored before the step, and new in it */
};

struct paged_params {
	int n_heads, n_kv, D, bs;
	int n_seqs;
	struct paged_seq seqs[PAGED_MAX_SEQS];
	enum paged_kv kv;
	enum paged_shape shape;
	float qmag, kmag; /* magnitudes of q and k (v: 1): large q·k makes a peaky softmax */
	int layers, layer; /* layers > 0: block-major caches of layer `layer` (see the top) */
};

/* Tokens of one kv_store or attention call. */
struct paged_tokens {
	int T, n_single, n_segments;
	int32_t *seq, *pos;       /* [T] sequence index, position */
	int32_t *slot;            /* [T] block-table row of the sequence */
	struct kt_segment *segs;  /* [n_segments] (seq: the block-table row) */
};

struct paged_world {
	const struct paged_params *p;
	enum kt_dtype target_kv; /* cache dtype of the backend under test */
	double tol_min;          /* the least reference tolerance the backend's attention
				  * can meet: 5e-3 where it rounds the softmax weights to
				  * bf16 for P·V (|error| <= 2^-8 of Σ softmax · |v|) */
	int C, QC;               /* cache cols n_kv · D, q cols n_heads · D */
	int len[PAGED_MAX_SEQS], slot[PAGED_MAX_SEQS];
	int n_slots, bt_cols, n_blocks;
	int32_t *table;          /* [n_slots, bt_cols], -1 where unassigned */
	float *k[PAGED_MAX_SEQS], *v[PAGED_MAX_SEQS];         /* [len, C] raw */
	float *k_f32[PAGED_MAX_SEQS], *v_f32[PAGED_MAX_SEQS]; /* as an f32 cache is given them */
	int n_hist;
	struct paged_tokens *hist; /* [n_hist] history chunks */
	struct paged_tokens step;
	float *q;                  /* [step.T, QC], rounded like k_f32 */
	float scale;               /* 1 / sqrt(D) */
};

/* One world on one backend. */
struct paged_dev {
	enum kt_dtype kv;
	int block_rows;         /* the batches' kv_block_rows: 0 for caches of their own */
	struct kt_tensor kc, vc, table;
	struct kt_tensor all;   /* block-major: the allocation kc and vc are views of */
};

void paged_build(struct op_run *r, struct paged_world *w, const struct paged_params *p,
		 const struct op_backend *target);
/* The cache dtype of the world on b. */
enum kt_dtype paged_kv_dtype(const struct paged_params *p, const struct op_backend *b);
/* Poisoned caches (laid out as w's params say) and the block table on b. */
struct paged_dev paged_setup(struct op_run *r, const struct op_backend *b,
			     const struct paged_world *w);
/* The batch of tok on b (pos and seq uploaded; max_kv_len as given). */
struct kt_batch paged_batch(struct op_run *r, const struct op_backend *b,
			    const struct paged_world *w, const struct paged_dev *d,
			    const struct paged_tokens *tok, int max_kv_len);
/* The k and v rows [tok->T, C] of the tokens, as a cache of dtype kv is
 * given them (k_f32 for f32, raw for bf16). */
void paged_rows(struct op_run *r, const struct paged_world *w, enum kt_dtype kv,
		const struct paged_tokens *tok, float **k, float **v);
/* kv_store of the tokens' k and v rows; returns its rc. */
int paged_store(struct op_run *r, const struct op_backend *b, const struct paged_world *w,
		const struct paged_dev *d, const struct paged_tokens *tok);
/* Every history chunk, then the step; the first nonzero rc, or 0. */
int paged_store_all(struct op_run *r, const struct op_backend *b, const struct paged_world *w,
		    const struct paged_dev *d);
/* The step's largest pos + 1. */
int paged_max_len(const struct paged_tokens *tok);
/* Every cache row of the world on b, downloaded as f32: K rows then V rows
 * for caches of their own, the whole allocation for block-major ones;
 * paged_snapshot_rows() of them. */
float *paged_snapshot(struct op_run *r, const struct op_backend *b, const struct paged_world *w,
		      const struct paged_dev *d);
size_t paged_snapshot_rows(const struct paged_world *w);
/* The snapshot row of row `off` of block `block`'s K (is_v false) or V rows. */
size_t paged_snapshot_row(const struct paged_world *w, bool is_v, int32_t block, int off);
/* Check a snapshot: positions [0, hist) (upto_step false) or [0, hist + step)
 * of every sequence hold k_f32 / v_f32 bitwise where the table puts them;
 * every other row (other blocks, other layers) is still poison. */
void paged_check_caches(struct op_run *r, const struct paged_world *w, const float *snap,
			bool upto_step, const char *when);
/* Naive attention of the step in double over the logical arrays: ref and
 * mag (Σ softmax · |v|, the error scale) [step.T, QC]. */
void paged_reference(struct op_run *r, const struct paged_world *w, double *ref, double *mag);

#endif
