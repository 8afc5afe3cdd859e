/* Known model shapes for dummy weights (load_format = dummy): the
 * config.json of each published model, reduced to what the loader reads,
 * built in memory and parsed by the same code as a file, so that a benchmark
 * can run a real shape without its files, whatever its family.
 *
 * The numbers are those of the Hugging Face configurations (Qwen/Qwen3-*,
 * meta-llama/Llama-3.*); atlas-tiny is the dense model this project shipped
 * before models/atlas-next.
 */
#include "engine/model/internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "engine/model/hf_json.h"

struct shape {
	const char *name;
	const char *json;               /* config.json, with eos_token_id */
};

#define QWEN3(v, e, i, l, h, kv, d, tied) \
	"{\"architectures\": [\"Qwen3ForCausalLM\"], \"vocab_size\": " #v ", " \
	"\"hidden_size\": " #e ", \"intermediate_size\": " #i ", \"num_hidden_layers\": " #l ", " \
	"\"num_attention_heads\": " #h ", \"num_key_value_heads\": " #kv ", \"head_dim\": " #d ", " \
	"\"max_position_embeddings\": 40960, \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000, " \
	"\"tie_word_embeddings\": " #tied ", \"torch_dtype\": \"bfloat16\", " \
	"\"eos_token_id\": [151645, 151643]}"

/* Qwen3-MoE: every layer's MLP is a mixture of experts. */
#define QWEN3_MOE(e, i, l, h, kv, experts, k, mi) \
	"{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"vocab_size\": 151936, " \
	"\"hidden_size\": " #e ", \"intermediate_size\": " #i ", \"num_hidden_layers\": " #l ", " \
	"\"num_attention_heads\": " #h ", \"num_key_value_heads\": " #kv ", \"head_dim\": 128, " \
	"\"num_experts\": " #experts ", \"num_experts_per_tok\": " #k ", " \
	"\"moe_intermediate_size\": " #mi ", \"norm_topk_prob\": true, " \
	"\"decoder_sparse_step\": 1, \"mlp_only_layers\": [], " \
	"\"max_position_embeddings\": 40960, \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000, " \
	"\"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", " \
	"\"eos_token_id\": [151645, 151643]}"

/* Llama 3.1 and 3.2: llama3 rope scaling, factor 8 (3.1) or 32 (3.2). */
#define LLAMA3(e, i, l, h, d, tied, factor) \
	"{\"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 128256, " \
	"\"hidden_size\": " #e ", \"intermediate_size\": " #i ", \"num_hidden_layers\": " #l ", " \
	"\"num_attention_heads\": " #h ", \"num_key_value_heads\": 8, \"head_dim\": " #d ", " \
	"\"max_position_embeddings\": 131072, \"rms_norm_eps\": 1e-5, \"rope_theta\": 500000, " \
	"\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": " #factor ", " \
	"\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, " \
	"\"original_max_position_embeddings\": 8192}, \"tie_word_embeddings\": " #tied ", " \
	"\"torch_dtype\": \"bfloat16\", \"bos_token_id\": 128000, \"eos_token_id\": 128001}"

/* The hybrid family: Gated DeltaNet layers, every fourth full attention
 * (head_dim 256, a quarter of it rotary, theta 1e7), MoE with a shared
 * expert in every layer, one MTP layer. */
#define HYBRID_MOE(arch, v, l, experts, k) \
	"{\"architectures\": [\"" arch "\"], \"vocab_size\": " #v ", " \
	"\"hidden_size\": 2048, \"intermediate_size\": 5120, \"num_hidden_layers\": " #l ", " \
	"\"num_attention_heads\": 16, \"num_key_value_heads\": 2, \"head_dim\": 256, " \
	"\"partial_rotary_factor\": 0.25, \"full_attention_interval\": 4, " \
	"\"linear_num_key_heads\": 16, \"linear_num_value_heads\": 32, " \
	"\"linear_key_head_dim\": 128, \"linear_value_head_dim\": 128, " \
	"\"linear_conv_kernel_dim\": 4, \"num_experts\": " #experts ", " \
	"\"num_experts_per_tok\": " #k ", \"moe_intermediate_size\": 512, " \
	"\"shared_expert_intermediate_size\": 512, \"norm_topk_prob\": true, " \
	"\"decoder_sparse_step\": 1, \"mlp_only_layers\": [], \"mtp_num_hidden_layers\": 1, " \
	"\"max_position_embeddings\": 262144, \"rms_norm_eps\": 1e-6, \"rope_theta\": 10000000, " \
	"\"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", " \
	"\"eos_token_id\": [151645, 151643]}"

static const struct shape shapes[] = {
	{ "qwen3-0.6b", QWEN3(151936, 1024, 3072, 28, 16, 8, 128, true) },
	{ "qwen3-1.7b", QWEN3(151936, 2048, 6144, 28, 16, 8, 128, true) },
	{ "qwen3-4b", QWEN3(151936, 2560, 9728, 36, 32, 8, 128, true) },
	{ "qwen3-8b", QWEN3(151936, 4096, 12288, 36, 32, 8, 128, false) },
	{ "qwen3-14b", QWEN3(151936, 5120, 17408, 40, 40, 8, 128, false) },
	{ "qwen3-30b-a3b", QWEN3_MOE(2048, 6144, 48, 32, 4, 128, 8, 768) },
	/* Qwen3-235B-A22B's layers (94 of them in the model; 4.8 GB of
	 * experts each), 8, 20 and 32 of them: 8 fit one 80 GB GPU; 20
	 * (102 GB) fit two 80 GB GPUs with expert parallelism but not one; 32
	 * (162 GB) fit two 141 GB GPUs but not one. */
	{ "qwen3-235b-a22b-8l", QWEN3_MOE(4096, 12288, 8, 64, 4, 128, 8, 1536) },
	{ "qwen3-235b-a22b-20l", QWEN3_MOE(4096, 12288, 20, 64, 4, 128, 8, 1536) },
	{ "qwen3-235b-a22b-32l", QWEN3_MOE(4096, 12288, 32, 64, 4, 128, 8, 1536) },
	/* A small Qwen3-MoE for tests (expert parallelism): 8 experts, top 2,
	 * layer 1 a dense MLP. */
	{ "qwen3-moe-test",
	  "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"vocab_size\": 512, "
	  "\"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 3, "
	  "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16, "
	  "\"num_experts\": 8, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32, "
	  "\"norm_topk_prob\": true, \"decoder_sparse_step\": 1, \"mlp_only_layers\": [1], "
	  "\"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-6, \"rope_theta\": 10000, "
	  "\"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", "
	  "\"eos_token_id\": 2}" },
	/* Qwen3-Next-80B-A3B's layers (48 in the model, 160 GB) and
	 * Qwen3.5-35B-A3B's (40, 70 GB), 20 and 32 of them: what one 80 GB
	 * GPU holds. */
	{ "qwen3-next-80b-a3b-20l", HYBRID_MOE("Qwen3NextForCausalLM", 151936, 20, 512, 10) },
	{ "qwen3.5-35b-a3b-32l", HYBRID_MOE("Qwen3_5MoeForCausalLM", 248320, 32, 256, 8) },
	/* A small hybrid for tests: layers linear, linear, linear, full; 8
	 * experts, top 2, a shared expert, an MTP layer. */
	{ "qwen3-next-test",
	  "{\"architectures\": [\"Qwen3NextForCausalLM\"], \"vocab_size\": 512, "
	  "\"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 4, "
	  "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16, "
	  "\"partial_rotary_factor\": 0.5, \"linear_num_key_heads\": 2, "
	  "\"linear_num_value_heads\": 4, \"linear_key_head_dim\": 16, "
	  "\"linear_value_head_dim\": 16, \"linear_conv_kernel_dim\": 4, "
	  "\"num_experts\": 8, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32, "
	  "\"shared_expert_intermediate_size\": 32, \"norm_topk_prob\": true, "
	  "\"mtp_num_hidden_layers\": 1, \"max_position_embeddings\": 4096, "
	  "\"rms_norm_eps\": 1e-6, \"rope_theta\": 10000, \"tie_word_embeddings\": false, "
	  "\"torch_dtype\": \"bfloat16\", \"eos_token_id\": 2}" },
	{ "llama-3.2-1b", LLAMA3(2048, 8192, 16, 32, 64, true, 32.0) },
	{ "llama-3.2-3b", LLAMA3(3072, 8192, 28, 24, 128, true, 32.0) },
	{ "llama-3.1-8b", LLAMA3(4096, 14336, 32, 32, 128, false, 8.0) },
	{ "atlas-tiny",
	  "{\"architectures\": [\"Qwen3ForCausalLM\"], \"vocab_size\": 4096, \"hidden_size\": 512, "
	  "\"intermediate_size\": 1536, \"num_hidden_layers\": 8, \"num_attention_heads\": 8, "
	  "\"num_key_value_heads\": 4, \"head_dim\": 64, \"max_position_embeddings\": 8192, "
	  "\"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000, \"tie_word_embeddings\": true, "
	  "\"torch_dtype\": \"bfloat16\", \"bos_token_id\": 0, \"eos_token_id\": [0, 2]}" },
};

int model_shape_config(const char *name, struct model_config *c, char *err, size_t errlen)
{
	const struct shape *s = NULL;

	for (size_t i = 0; i < ATLAS_ARRAY_LEN(shapes) && !s; i++)
		if (!strcmp(shapes[i].name, name))
			s = &shapes[i];
	if (!s)
		return atlas_errf(err, errlen, -ENOENT,
				  "dummy weights: no shape called '%s' (known: %s)", name,
				  model_shape_names());
	struct hf_json conf;
	json_error_t je;
	snprintf(conf.path, sizeof conf.path, "shape %s", name);
	conf.root = json_loads(s->json, 0, &je);
	if (!conf.root)
		return atlas_errf(err, errlen, -EINVAL, "%s: %s", conf.path, je.text);
	int rc = model_config_parse(&conf, NULL, c, err, errlen);
	json_decref(conf.root);
	return rc;
}

const char *model_shape_names(void)
{
	static char list[256];

	if (!list[0]) {
		size_t n = 0;
		for (size_t i = 0; i < ATLAS_ARRAY_LEN(shapes) && n < sizeof list; i++)
			n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "",
					      shapes[i].name);
	}
	return list;
}
