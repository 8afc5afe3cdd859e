/* Known model shapes for dummy weights (load_format = dummy): the
 * config.json of each published model, reduced to what the forward pass
 * reads, so that a benchmark can run a real shape without its files.
 *
 * The numbers are those of the Hugging Face configurations (Qwen/Qwen3-*,
 * meta-llama/Llama-3.*); atlas-tiny is the model shipped in models/.
 */
#include "engine/model/model.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"

struct shape {
	const char *name;
	enum model_family family;
	int vocab, hidden, intermediate, layers, heads, kv_heads, head_dim, max_pos;
	bool tied;
};

static const struct shape shapes[] = {
	{ "qwen3-0.6b", MODEL_QWEN3, 151936, 1024, 3072, 28, 16, 8, 128, 40960, true },
	{ "qwen3-1.7b", MODEL_QWEN3, 151936, 2048, 6144, 28, 16, 8, 128, 40960, true },
	{ "qwen3-4b", MODEL_QWEN3, 151936, 2560, 9728, 36, 32, 8, 128, 40960, true },
	{ "qwen3-8b", MODEL_QWEN3, 151936, 4096, 12288, 36, 32, 8, 128, 40960, false },
	{ "qwen3-14b", MODEL_QWEN3, 151936, 5120, 17408, 40, 40, 8, 128, 40960, false },
	{ "llama-3.2-1b", MODEL_LLAMA, 128256, 2048, 8192, 16, 32, 8, 64, 131072, true },
	{ "llama-3.2-3b", MODEL_LLAMA, 128256, 3072, 8192, 28, 24, 8, 128, 131072, true },
	{ "llama-3.1-8b", MODEL_LLAMA, 128256, 4096, 14336, 32, 32, 8, 128, 131072, false },
	{ "atlas-tiny", MODEL_QWEN3, 4096, 512, 1536, 8, 8, 4, 64, 8192, true },
};

static void fill_qwen3(struct model_config *c)
{
	snprintf(c->architecture, sizeof c->architecture, "Qwen3ForCausalLM");
	c->rms_norm_eps = 1e-6f;
	c->rope_theta = 1000000.0;
	c->rope_type = MODEL_ROPE_DEFAULT;
	c->rope_factor = 1.0;
	c->qk_norm = true;
	c->bos_token_id = -1;
	c->n_eos = 2;
	c->eos_token_ids[0] = 151645;
	c->eos_token_ids[1] = 151643;
}

/* Llama 3.1 and 3.2: llama3 rope scaling, factor 8 (3.1) or 32 (3.2). */
static void fill_llama3(struct model_config *c, const char *name)
{
	snprintf(c->architecture, sizeof c->architecture, "LlamaForCausalLM");
	c->rms_norm_eps = 1e-5f;
	c->rope_theta = 500000.0;
	c->rope_type = MODEL_ROPE_LLAMA3;
	c->rope_factor = strstr(name, "3.2") ? 32.0 : 8.0;
	c->rope_low_freq_factor = 1.0;
	c->rope_high_freq_factor = 4.0;
	c->rope_original_max_position = 8192;
	c->bos_token_id = 128000;
	c->n_eos = 1;
	c->eos_token_ids[0] = 128001;
}

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
	memset(c, 0, sizeof *c);
	c->family = s->family;
	c->vocab_size = s->vocab;
	c->hidden_size = s->hidden;
	c->intermediate_size = s->intermediate;
	c->n_layers = s->layers;
	c->n_heads = s->heads;
	c->n_kv_heads = s->kv_heads;
	c->head_dim = s->head_dim;
	c->max_position_embeddings = s->max_pos;
	c->tie_word_embeddings = s->tied;
	c->dtype = KT_BF16;
	if (s->family == MODEL_QWEN3)
		fill_qwen3(c);
	else
		fill_llama3(c, name);
	if (!strcmp(name, "atlas-tiny")) {
		c->bos_token_id = 0;
		c->eos_token_ids[0] = 0;
		c->eos_token_ids[1] = 2;
	}
	return 0;
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
