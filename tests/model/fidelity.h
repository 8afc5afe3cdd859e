/* The reference data of tests/fidelity/models/ (see test_fidelity.c) and the
 * small paged-KV harness that runs model_forward on it. */
#ifndef ATLAS_TESTS_MODEL_FIDELITY_H
#define ATLAS_TESTS_MODEL_FIDELITY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/model/model.h"

#define FID_MAX_MODELS 16
#define FID_MAX_REF_SEQS 8
#define FID_MAX_PROMPTS 4
#define FID_NEW_TOKENS 64      /* most greedy tokens a reference may ask for */
#define FID_MAX_TOKENS 256     /* tokens of one step */
#define FID_MAX_SEQS 2         /* slots of the block table */
#define FID_BLOCK 16           /* KV rows per block */
#define FID_MAX_CONTEXT 256    /* positions per sequence */

struct ref_seq {
	int32_t *ids;                   /* [len] */
	int len;
	float *logits;                  /* [len, vocab] transformers, the model's dtype */
	float *logits_upcast;           /* [len, vocab] transformers, float32 upcast (lowp only) */
	float *ours;                    /* [len, vocab] atlas, the whole sequence in one step */
};

struct ref_greedy {
	int32_t *prompt;
	int n_prompt;
	int32_t *tokens;                /* what generate() produced */
	double *gaps;                   /* [n_tokens] top-2 logit gap at each step */
	int n_tokens;
};

/* Paged caches and step tensors for one model, in backend memory. */
struct fid_kv {
	int n_layers;
	struct kt_tensor *k, *v;        /* [n_layers] of [blocks * FID_BLOCK, n_kv * D] */
	struct kt_tensor block_tables;  /* [FID_MAX_SEQS, FID_MAX_CONTEXT / FID_BLOCK] */
	struct kt_tensor ids, pos, seq, out_rows;  /* [FID_MAX_TOKENS, 1] i32 */
	struct kt_tensor logits;        /* [FID_MAX_TOKENS, vocab] f32 */
	/* Linear-attention layers' recurrent states: one row per sequence slot
	 * (a row's state row is its slot), n_states of them. */
	int n_states;
	struct kt_tensor *state;        /* [n_states] of [FID_MAX_SEQS, linear_state_floats] f32 */
	struct kt_tensor state_slot;    /* [FID_MAX_TOKENS, 1] i32 */
};

struct ref_model {
	char dir[4096];
	char name[256];
	char dtype[16];                 /* "float32", "bfloat16", "float16" */
	bool lowp;                      /* bf16 or f16: the upcast data exists */
	int vocab;
	double lowp_vs_upcast;          /* transformers' own lowp vs float32 max-abs */
	double tol_lowp;
	int n_seqs;                     /* sorted by length, shortest first */
	struct ref_seq seqs[FID_MAX_REF_SEQS];
	int max_new_tokens;             /* generate()'s max_new_tokens */
	int n_greedy;
	struct ref_greedy greedy[FID_MAX_PROMPTS];
	struct ref_greedy greedy_upcast[FID_MAX_PROMPTS];
	struct model *m;
	struct fid_kv kv;
};

/* Parse every <dir>/<name>/ref/ref.json; returns the count or -errno. */
int fid_find_models(struct ref_model *refs, int max, char *err, size_t errlen);
/* Load the model, make its caches and run every sequence in one step (ours). */
int fid_open(struct ref_model *r, struct kt_backend *be, char *err, size_t errlen);
void fid_close(struct ref_model *r, struct kt_backend *be);

/* Run seqs[0..n) (n <= 2) together: step k takes plans[s][k] tokens of
 * sequence s (1000 and up: all the rest), interleaving the sequences
 * token by token; logits of every token into outs[s] [len, vocab]. */
void fid_run_chunked(struct ref_model *r, struct kt_backend *be, const struct ref_seq *const *seqs,
		     const int *const *plans, float **outs, int n);
/* Steps whose rows all give logits in order tell the model so (a
 * model_step's out_all), as the executor does; with this set they do not,
 * and the model gathers the out rows. */
extern bool fid_gather_rows;

/* One step of n tokens of sequence slot `slot` at positions pos0..; the
 * logits of every row into out [n, vocab]. */
void fid_step(struct ref_model *r, struct kt_backend *be, const int32_t *ids, int slot,
	      int pos0, int n, float *out);
/* Greedy decoding: prompt in one step, then one token per step, stopping
 * after max_new tokens or at an eos id. Returns the number of tokens. */
int fid_greedy(struct ref_model *r, struct kt_backend *be, const int32_t *prompt, int n_prompt,
	       int max_new, int32_t *tokens);

/* Copy a model directory (without ref/), config.json rewritten in the
 * transformers 4.x spelling: top-level rope_theta, rope_scaling, torch_dtype. */
int fid_copy_as_v4(const char *src, const char *dst, char *err, size_t errlen);
/* Load the model in dir (same shapes as r) and return seq's logits of one step. */
int fid_logits_of_dir(struct ref_model *r, struct kt_backend *be, const char *dir,
		      const struct ref_seq *seq, float *out, char *err, size_t errlen);

#endif
