/* Internals of engine/model/: the safetensors reader, weight binding and
 * struct model, shared by the loader and the family folders. */
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

struct hf_json;

/* A loaded model: what every family shares. The family's own weights and
 * scratch hang off family_data. */
struct model {
	struct model_config cfg;
	struct kt_backend *be;          /* not owned */
	struct st_set *st;              /* weight files, mapped while the model loads (NULL once
					 * it has, every weight copied to the backend) and NULL for
					 * dummy weights */
	uint16_t *dummy;                /* [dummy_n] random bf16 values while dummy weights load */
	size_t dummy_n;
	int n_weights, weights_cap;
	struct kt_tensor **weights;     /* [n_weights] every bound weight, for info and freeing;
					 * the tensors themselves live in family_data */
	int max_tokens, max_out;        /* rows and logits rows of the largest step */
	bool head;                      /* the model's MTP head (model_load_head) */
	struct model_info info;
	void *family_data;              /* owned by the family (load / free) */
};

/* config.json (and generation_config.json, or NULL) into cfg (hf_config.c);
 * the dummy shapes build their JSON in memory and come through here too. */
int model_config_parse(const struct hf_json *conf, const struct hf_json *gen,
		       struct model_config *cfg, char *err, size_t errlen);

/* Find the tensor called name, check it and upload it into *dst: a matrix
 * [rows, cols], or with rows == 0 a vector [cols] held as [1, cols]. A model
 * without files (dummy) makes it instead: norms 1, biases 0, matrices
 * random (weights.c). */
int model_bind(struct model *m, struct kt_tensor *dst, const char *name, int64_t rows,
	       int64_t cols, char *err, size_t errlen);
/* model_bind of <prefix>.<l>.<suffix>: prefix "model.layers" for the
 * decoder's layers, "mtp.layers" for an MTP head's. */
int model_bind_layer(struct model *m, const char *prefix, int l, struct kt_tensor *dst,
		     const char *suffix, int64_t rows, int64_t cols, char *err, size_t errlen);
/* The most matrices model_bind_joined stacks. */
#define MODEL_JOIN_MAX 4
/* Matrices <prefix>.<l>.<suffixes[i]> [rows[i], cols] (i < n), of one
 * dtype, stacked into one *dst [Σ rows, cols] in that order: the weights of
 * products of one x (q, k and v; gate and up), so that one product makes
 * them all. Each part holds what model_bind would give it alone (dummy
 * weights too); kt_rows views of *dst are the parts. */
int model_bind_joined(struct model *m, struct kt_tensor *dst, const char *prefix, int l,
		      const char *const *suffixes, const int64_t *rows, int n, int64_t cols,
		      char *err, size_t errlen);
/* One matrix of a stack (model_bind_stack): rows [row0, row0 + rows) of
 * tensor name, which is a matrix [rows, cols] (slice < 0; row0 0) or holds
 * the matrix as rows row0.. of slice `slice` of [n_slices, full_rows, cols]. */
struct model_part {
	char name[128];
	int64_t slice;                  /* -1: a matrix of its own */
	int64_t n_slices, full_rows;    /* a slice's tensor: the shape the config implies */
	int64_t row0;
};
/* Upload n matrices [rows, cols], all of one dtype, back to back into *dst
 * [n * rows, cols]: matrices first .. first + n - 1 of a stack (a shard of
 * a layer's experts); `what` names it in messages. Dummy weights are made
 * as model_bind makes them, matrix i's the same whatever the shard. */
int model_bind_stack(struct model *m, struct kt_tensor *dst, const char *what,
		     const struct model_part *parts, int n, int first, int64_t rows, int64_t cols,
		     char *err, size_t errlen);
/* Rows of matrix name [full_rows, cols], gathered run after run into *dst
 * [sum of n, cols]: run i is rows row0[i] .. row0[i] + n[i] - 1. How a
 * family regroups a checkpoint's interleaved projection (a head's query and
 * gate rows, a key group's q, k, v, z rows) into the products it runs. */
int model_bind_rows(struct model *m, struct kt_tensor *dst, const char *name, int64_t full_rows,
		    int64_t cols, const int64_t *row0, const int64_t *n, int n_runs, char *err,
		    size_t errlen);
/* A vector [cols] held as f32 [1, cols] on every backend, each value plus
 * add: a zero-centred norm's 1 + w (add 1), a parameter that a kernel
 * reads in f32 (add 0). Dummy: zeros plus add. */
int model_bind_f32(struct model *m, struct kt_tensor *dst, const char *name, int64_t cols,
		   float add, char *err, size_t errlen);
/* After the family bound everything: log the tensors nobody took and note
 * the dtype that holds most of the bytes. */
void model_bind_done(struct model *m);
/* Free every bound weight. */
void model_free_weights(struct model *m);

#endif
