/* Models: Hugging Face configuration, safetensors weights and the forward pass.
 *
 * model_load() reads a model directory (config.json, generation_config.json,
 * model.safetensors or model-*.safetensors with model.safetensors.index.json),
 * memory-maps the weight files, checks every tensor's presence, dtype and
 * shape against the configuration, and hands each weight to the backend with
 * kt_weight(). Errors name the file and the tensor.
 *
 * model_forward() runs one engine step: T tokens from any number of sequences,
 * positions and cache rows given by a kt_batch; it writes their K/V into the
 * paged caches and produces logits for the rows the step asks for.
 */
#ifndef ATLAS_ENGINE_MODEL_H
#define ATLAS_ENGINE_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"

#define MODEL_MAX_EOS 8

enum model_family { MODEL_QWEN3, MODEL_LLAMA };
enum model_rope_type { MODEL_ROPE_DEFAULT, MODEL_ROPE_LLAMA3 };

struct model_config {
	char architecture[64];          /* "Qwen3ForCausalLM", "LlamaForCausalLM" */
	enum model_family family;
	int vocab_size, hidden_size, intermediate_size;
	int n_layers, n_heads, n_kv_heads, head_dim;
	int max_position_embeddings;
	float rms_norm_eps;
	double rope_theta;
	enum model_rope_type rope_type;
	double rope_factor, rope_low_freq_factor, rope_high_freq_factor;  /* llama3 scaling */
	int rope_original_max_position;
	bool tie_word_embeddings;
	bool qk_norm;                   /* per-head RMSNorm of q and k (Qwen3) */
	bool attention_bias;            /* biases on q, k, v, o projections */
	bool mlp_bias;
	enum kt_dtype dtype;            /* torch_dtype / dtype of config.json */
	int32_t bos_token_id;           /* -1 if none */
	int n_eos;
	int32_t eos_token_ids[MODEL_MAX_EOS];  /* generation_config.json first, else config.json */
};

/* Parse dir/config.json (transformers 4.x and 5.x spellings) and
 * dir/generation_config.json (optional). Unsupported architectures,
 * activations or rope types fail with a message naming the key. */
int model_config_load(const char *dir, struct model_config *cfg, char *err, size_t errlen);

/* The inverse frequencies of the rotary embedding, [head_dim / 2], with the
 * configured scaling applied (what the forward pass uploads once). */
void model_rope_inv_freq(const struct model_config *cfg, float *inv_freq);

struct model;

struct model_info {
	uint64_t parameters;            /* elements of all weights */
	uint64_t file_bytes;            /* bytes of weight data in the files */
	uint64_t device_bytes;          /* bytes the backend holds for weights */
	uint64_t lookup_only_bytes;     /* of those, an untied input embedding: read by row only */
	char dtype[16];                 /* dtype of the weights in the files */
};

/* max_tokens: the most tokens model_forward will be given in one step, and
 * max_out the most logits rows; scratch activations are sized for them here. */
int model_load(const char *dir, struct kt_backend *be, int max_tokens, int max_out,
	       struct model **out, char *err, size_t errlen);
/* The same for a known shape with random weights made on the backend
 * (load_format = dummy): benchmarks without weight files. */
int model_load_dummy(const char *shape, struct kt_backend *be, int max_tokens, int max_out,
		     struct model **out, char *err, size_t errlen);
void model_free(struct model *m);

/* The configuration of a known shape ("qwen3-8b", shapes.c), and the list
 * of names for messages and --list-shapes. */
int model_shape_config(const char *name, struct model_config *cfg, char *err, size_t errlen);
const char *model_shape_names(void);
const struct model_config *model_get_config(const struct model *m);
void model_get_info(const struct model *m, struct model_info *out);

/* One step. ids [T, 1] i32; b describes the tokens' positions and cache rows;
 * kcache[l], vcache[l] are layer l's paged caches; out_rows [n_out, 1] i32
 * picks which of the T rows produce logits, written to logits [n_out, vocab]
 * f32 (all tensors in backend memory). Asynchronous like every backend op. */
int model_forward(struct model *m, const struct kt_tensor *ids, const struct kt_batch *b,
		  const struct kt_tensor *kcache, const struct kt_tensor *vcache,
		  const struct kt_tensor *out_rows, const struct kt_tensor *logits);

#endif
