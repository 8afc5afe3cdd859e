/* Models: Hugging Face configuration, safetensors weights and the forward pass.
 *
 * model_config_load() reads config.json and generation_config.json; the
 * architecture named there picks a family from the family table (family.h),
 * which reads its own keys and lists the model's layer kinds. model_load()
 * memory-maps the weight files and lets the family bind every tensor it needs,
 * checking presence, dtype and shape against the configuration; errors name
 * the file and the tensor.
 *
 * model_forward() runs one engine step: T rows from any number of sequences,
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
#define MODEL_MAX_LAYERS 512
#define MODEL_MAX_MTP_LAYERS 8

enum model_rope_type { MODEL_ROPE_DEFAULT, MODEL_ROPE_LLAMA3 };

/* What a decoder layer mixes positions with. Attention layers keep paged K/V
 * (one cache per attention layer); linear-attention layers keep a fixed-size
 * recurrent state per sequence instead. */
enum model_mixer { MODEL_MIXER_ATTENTION, MODEL_MIXER_LINEAR };
/* What a decoder layer's MLP is. */
enum model_mlp { MODEL_MLP_DENSE, MODEL_MLP_MOE };

struct model_layer {
	uint8_t mixer;                  /* enum model_mixer */
	uint8_t mlp;                    /* enum model_mlp */
	int16_t cache;                  /* index among the layers of its mixer kind: which paged
					 * KV cache (attention) or recurrent state (linear) it owns */
};

struct model_family;

struct model_config {
	char architecture[64];          /* "Qwen3ForCausalLM", "LlamaForCausalLM" */
	const struct model_family *family;  /* the family-table entry that runs it */
	int vocab_size, hidden_size, intermediate_size;
	int n_layers, n_heads, n_kv_heads, head_dim;
	int max_position_embeddings;
	float rms_norm_eps;
	double rope_theta;
	int rope_dim;                   /* R: the first R dims of each head rotate (head_dim ·
					 * partial_rotary_factor; even, at most head_dim) */
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

	/* Mixture of experts (layers whose mlp is MODEL_MLP_MOE), set by the
	 * family; 0 experts when the model has none. */
	int n_experts;                  /* num_experts: E */
	int n_experts_per_tok;          /* num_experts_per_tok: k, at most KT_MOE_MAX_K */
	int moe_intermediate_size;      /* each expert's MLP width */
	bool norm_topk_prob;            /* the k routing weights divided by their sum */
	int n_moe_layers;

	/* Linear-attention (Gated DeltaNet) layers, set by a hybrid family:
	 * state per sequence and layer = the conv's last K - 1 inputs of its
	 * C = 2 * Hk * dk + Hv * dv channels, then Hv matrices [dk, dv]. */
	struct model_linear {
		int k_heads, v_heads;       /* Hk, Hv: linear_num_{key,value}_heads, Hk | Hv */
		int k_dim, v_dim;           /* dk, dv: linear_{key,value}_head_dim */
		int conv_kernel;            /* K: linear_conv_kernel_dim */
	} linear;
	int shared_expert_intermediate_size;  /* an MoE layer's shared expert, 0: none */

	/* Layer kinds, set by the family. */
	struct model_layer layers[MODEL_MAX_LAYERS];  /* [n_layers] */
	int n_attention_layers;         /* layers with a paged KV cache */
	int n_linear_layers;            /* layers with a recurrent state */
	int64_t linear_state_floats;    /* f32 values of one sequence's state in one linear layer */
	int n_mtp_layers;               /* layers of the model's multi-token-prediction head
					 * (model_load_head), 0 if it ships none */
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
	uint64_t expert_bytes;          /* of those, the MoE layers' experts (this rank's): a
					 * token reads k of each layer's E */
	char dtype[16];                 /* dtype of the weights in the files */
};

/* max_tokens: the most rows model_forward will be given in one step, and
 * max_out the most logits rows; scratch activations are sized for them here. */
int model_load(const char *dir, struct kt_backend *be, int max_tokens, int max_out,
	       struct model **out, char *err, size_t errlen);
/* The same for a known shape with random weights made on the backend
 * (load_format = dummy): benchmarks without weight files. */
int model_load_dummy(const char *shape, struct kt_backend *be, int max_tokens, int max_out,
		     struct model **out, char *err, size_t errlen);
/* The multi-token-prediction head of the model in dir (a shape name when
 * dummy) as a model of its own: its n_mtp_layers layers (full attention,
 * one paged KV cache each, its cfg lists them), with its own copy of the
 * embedding and the output head. A step of the head feeds row t the pair
 * (the model's final hidden row at position p, the token at p + 1), in
 * model_step.hidden and ids, at position p, and its logits guess the token
 * at p + 2. -ENOTSUP when the model ships no head or its family has none. */
/* Whether a model of config c has a head that model_load_head can load. */
bool model_config_has_head(const struct model_config *c);
int model_load_head(const char *dir, bool dummy, struct kt_backend *be, int max_tokens,
		    int max_out, struct model **out, char *err, size_t errlen);
void model_free(struct model *m);

/* The configuration of a known shape ("qwen3-8b", shapes.c), and the list
 * of names for messages and --list-shapes. */
int model_shape_config(const char *name, struct model_config *cfg, char *err, size_t errlen);
const char *model_shape_names(void);
const struct model_config *model_get_config(const struct model *m);
void model_get_info(const struct model *m, struct model_info *out);

/* The KV blocks of a step's sequences that are not on the device (the swap
 * tier's host slots, DESIGN §8) and those that attention must read with
 * them, laid out by the executor: every sequence's blocks [0, H) are
 * pieces, in sequence order, and rounds of up to `slots` pieces go through
 * the staging buffers one after another; model_attend folds each round,
 * then each token's positions from from[slot] = H * block_size on the
 * device, then finishes. With one round, the two buffers alternate by
 * layer: the next attention layer's pieces are gathered beside the
 * device's work on this one. */
struct model_staging {
	int n_pieces, n_rounds, slots;
	struct kt_tensor src;           /* [n_pieces, 1] i32: each piece's block (kv_stage ids:
					 * a device block, or KV_HOST_ID of a host slot) */
	const int32_t *src_host;        /* [n_pieces] the same on the host */
	struct kt_tensor span;          /* [n_rounds * T, 2] i32: round r's (row0, n) of each
					 * token, in rows r * T .. */
	struct kt_tensor from;          /* [block_tables rows, 1] i32 */
	struct kt_tensor ks[2], vs[2];  /* [slots * block_size, kv cols] staging, the cache dtype */
	uint64_t ticket[2];             /* the gather into each buffer (kv_stage) */
	int n_caches;                   /* attention layers: model_attend's order, 0 first */
	struct kt_att_state st;         /* [T rows] */
	const struct kt_tensor *pool;   /* every device block (kv_pool.blocks) */
	size_t block_bytes;             /* one block, all layers (device and host alike) */
	const void *host;               /* host tier memory (kt_host_alloc) */
	size_t host_slot_bytes;
	int64_t host_slots;
	size_t layer_bytes;             /* one attention layer's K and V rows of a block */
};

/* One step's tensors, all in backend memory. */
struct model_step {
	struct kt_tensor ids;           /* [T, 1] i32: the token fed at each row */
	struct kt_batch batch;          /* positions, sequence slots, block tables, the shape */
	const struct kt_tensor *kcache; /* [n_attention_layers] paged K caches */
	const struct kt_tensor *vcache; /* [n_attention_layers] paged V caches */
	struct kt_tensor out_rows;      /* [n_out, 1] i32: the rows that produce logits */
	/* out_rows holds 0, 1, ..., T - 1: every row gives logits, in order
	 * (what the caller knows on the host), so a forward may skip the
	 * gather of the out rows. false is always correct. */
	bool out_all;
	struct kt_tensor logits;        /* [n_out, vocab] f32 */
	struct model_staging *staged;   /* NULL: all KV of the step is on the device */
	/* The final hidden rows (after the last norm), [T, hidden] f32: a
	 * model's forward writes every row's here when hidden.data is set (what
	 * an MTP head reads); a head's forward reads its rows' input from here. */
	struct kt_tensor hidden;
	/* A head's final hidden rows of out_rows, [n_out, hidden] f32: the
	 * hidden input of the next draft's row. */
	struct kt_tensor hidden_out;
	/* The recurrent states of the linear-attention layers (n_linear_layers
	 * tensors [n_slots, linear_state_floats] f32, the layout of kt
	 * conv1d / delta_rule), and each row's state row [T, 1] i32; unused by
	 * a model without linear layers. */
	const struct kt_tensor *state;
	struct kt_tensor state_slot;
};

/* Attention of the step's rows over the paged cache of attention layer
 * `cache` (q, out [T, n_heads * head_dim]): the one way every family's
 * attention reads KV, whether all of it is on the device (one attention
 * op) or part of it is staged (s->staged: the parts folded in position
 * order, exact). */
int model_attend(struct model *m, const struct model_step *s, int cache,
		 const struct kt_tensor *out, const struct kt_tensor *q, int n_heads,
		 int n_kv_heads, int head_dim, float scale);

/* Run one step: write the rows' K/V (and states) and the logits of
 * s->out_rows. Asynchronous like every backend op. */
int model_forward(struct model *m, const struct model_step *s);

#endif
