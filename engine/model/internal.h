/* Internals of engine/model/: the safetensors reader, the weight table and
 * struct model, shared by the loader and the forward pass. */
#ifndef ATLAS_ENGINE_MODEL_INTERNAL_H
#define ATLAS_ENGINE_MODEL_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/model/model.h"
#include "kernels/backend.h"

#define ST_MAX_DIMS 8

/* One tensor of a safetensors file. data points into the file's mapping. */
struct st_tensor {
	char *name;                     /* owned */
	const char *file;               /* the path of its file (owned by the file) */
	char dtype_name[16];            /* as the header spells it: "F32", "BF16", "I64" */
	bool dtype_ok;                  /* dtype is F32, F16 or BF16 */
	enum kt_dtype dtype;            /* valid when dtype_ok */
	int n_dims;
	int64_t shape[ST_MAX_DIMS];
	const void *data;               /* inside the mapping */
	size_t nbytes;
	bool bound;                     /* taken by the model (the rest is logged and ignored) */
};

/* The weight files of a model directory: one model.safetensors or the shards
 * of model.safetensors.index.json, all memory-mapped for the model's life. */
struct st_set {
	char *source;                   /* owned: the file that lists the tensors
					 * (model.safetensors or the index), for messages */
	int n_files;
	char **paths;                   /* [n_files] owned */
	void **maps;                    /* [n_files] mmap()ed whole files */
	size_t *sizes;                  /* [n_files] bytes of each file */
	int n_tensors;
	struct st_tensor *tensors;      /* [n_tensors] sorted by name */
};

/* Open the weights of dir; errors name the file and the tensor or key. */
int st_open_dir(const char *dir, struct st_set **out, char *err, size_t errlen);
/* Open one file (also used for each shard). */
int st_open_file(const char *path, struct st_set *set, char *err, size_t errlen);
void st_close(struct st_set *set);
/* The tensor called name, or NULL. */
struct st_tensor *st_find(struct st_set *set, const char *name);

/* The weights of one decoder layer; an absent bias has data == NULL. Shapes
 * with Hq = n_heads, Hkv = n_kv_heads, D = head_dim, E = hidden, I = intermediate. */
struct layer_weights {
	struct kt_tensor attn_norm;     /* [1, E] */
	struct kt_tensor wq, wk, wv;    /* [Hq*D, E], [Hkv*D, E], [Hkv*D, E] */
	struct kt_tensor bq, bk, bv;    /* [1, Hq*D], [1, Hkv*D], [1, Hkv*D] (attention_bias) */
	struct kt_tensor q_norm, k_norm;  /* [1, D] (qk_norm) */
	struct kt_tensor wo, bo;        /* [E, Hq*D], [1, E] (attention_bias) */
	struct kt_tensor ffn_norm;      /* [1, E] */
	struct kt_tensor w_gate, w_up;  /* [I, E] */
	struct kt_tensor w_down;        /* [E, I] */
	struct kt_tensor b_gate, b_up, b_down;  /* [1, I], [1, I], [1, E] (mlp_bias) */
};

/* Activations of one step, sized at load for max_tokens rows (max_out for
 * the logits side) and viewed per step with kt_rows(); all f32, owned. */
struct scratch {
	struct kt_tensor x;             /* [max_tokens, E] the residual stream */
	struct kt_tensor xn;            /* [max_tokens, E] normed input of a block */
	struct kt_tensor proj;          /* [max_tokens, E] output of o_proj / down_proj */
	struct kt_tensor q;             /* [max_tokens, Hq*D] */
	struct kt_tensor k, v;          /* [max_tokens, Hkv*D] */
	struct kt_tensor att;           /* [max_tokens, Hq*D] attention output */
	struct kt_tensor gate, up;      /* [max_tokens, I] */
	struct kt_tensor out_h;         /* [max_out, E] final hidden rows that get logits */
	struct kt_tensor inv_freq;      /* [1, D/2] rotary inverse frequencies */
};

struct model {
	struct model_config cfg;
	struct kt_backend *be;          /* not owned */
	struct st_set *st;              /* weight files, mapped while the model lives; NULL for
					 * dummy weights */
	uint16_t *dummy;                /* [dummy_n] random bf16 values while dummy weights load */
	size_t dummy_n;
	struct kt_tensor embed;         /* [V, E] */
	struct kt_tensor final_norm;    /* [1, E] */
	struct kt_tensor lm_head;       /* [V, E]; a copy of embed's handle when tied */
	struct layer_weights *layers;   /* [n_layers] owned */
	int n_weights;
	struct kt_tensor **weights;     /* [n_weights] every bound weight, for info and freeing */
	struct scratch s;
	int max_tokens, max_out;
	struct model_info info;
};

/* Bind and upload every weight of m->cfg from m->st (weights.c). */
int model_bind_weights(struct model *m, char *err, size_t errlen);
void model_free_weights(struct model *m);

/* The dense families (dense.c): scratch sized for max_tokens / max_out, and
 * one step as model_forward() describes it. */
int dense_alloc_scratch(struct model *m, char *err, size_t errlen);
void dense_free_scratch(struct model *m);
int dense_forward(struct model *m, const struct kt_tensor *ids, const struct kt_batch *b,
		  const struct kt_tensor *kcache, const struct kt_tensor *vcache,
		  const struct kt_tensor *out_rows, const struct kt_tensor *logits);

#endif
