#include "fake_model.h"

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct fake_spec fake_default_spec(void)
{
	return (struct fake_spec){ .arch = "Qwen3ForCausalLM", .vocab = 32, .hidden = 16,
				   .intermediate = 24, .layers = 2, .heads = 4, .kv_heads = 2,
				   .head_dim = 8 };
}

static float next_uniform(unsigned *state)
{
	*state = *state * 1103515245u + 12345u;
	return (float)((*state >> 8) & 0xffff) / 65536.0f - 0.5f;
}

void fake_model_add_tensor(struct fake_model *fm, const char *name, int64_t rows, int64_t cols,
			   unsigned *seed)
{
	size_t n = (size_t)(rows ? rows : 1) * (size_t)cols;
	size_t begin = fm->data_size;
	bool is_norm = strstr(name, "norm.weight") != NULL;

	fm->data = realloc(fm->data, begin + n * sizeof(float));
	float *v = (float *)(fm->data + begin);
	for (size_t i = 0; i < n; i++)
		v[i] = is_norm ? 1.0f + 0.2f * next_uniform(seed) : 0.5f * next_uniform(seed);
	fm->data_size = begin + n * sizeof(float);
	fm->parameters += n;

	json_t *shape = rows ? json_pack("[II]", (json_int_t)rows, (json_int_t)cols)
			     : json_pack("[I]", (json_int_t)cols);
	json_object_set_new(fm->header, name,
			    json_pack("{s:s, s:o, s:[II]}", "dtype", "F32", "shape", shape,
				      "data_offsets", (json_int_t)begin,
				      (json_int_t)fm->data_size));
}

static void add_layer(struct fake_model *fm, int l, unsigned *seed)
{
	const struct fake_spec *s = &fm->spec;
	const int64_t e = s->hidden, q = (int64_t)s->heads * s->head_dim;
	const int64_t kv = (int64_t)s->kv_heads * s->head_dim, in = s->intermediate;
	const bool qwen3 = strcmp(s->arch, "Qwen3ForCausalLM") == 0;
	const struct {
		const char *suffix;
		int64_t rows, cols;
		bool want;
	} t[] = {
		{ "input_layernorm.weight", 0, e, true },
		{ "self_attn.q_proj.weight", q, e, true },
		{ "self_attn.k_proj.weight", kv, e, true },
		{ "self_attn.v_proj.weight", kv, e, true },
		{ "self_attn.o_proj.weight", e, q, true },
		{ "self_attn.q_proj.bias", 0, q, s->attention_bias },
		{ "self_attn.k_proj.bias", 0, kv, s->attention_bias },
		{ "self_attn.v_proj.bias", 0, kv, s->attention_bias },
		{ "self_attn.o_proj.bias", 0, e, s->attention_bias },
		{ "self_attn.q_norm.weight", 0, s->head_dim, qwen3 },
		{ "self_attn.k_norm.weight", 0, s->head_dim, qwen3 },
		{ "post_attention_layernorm.weight", 0, e, true },
		{ "mlp.gate_proj.weight", in, e, true },
		{ "mlp.up_proj.weight", in, e, true },
		{ "mlp.down_proj.weight", e, in, true },
		{ "mlp.gate_proj.bias", 0, in, s->mlp_bias },
		{ "mlp.up_proj.bias", 0, in, s->mlp_bias },
		{ "mlp.down_proj.bias", 0, e, s->mlp_bias },
	};
	char name[128];

	for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
		if (!t[i].want)
			continue;
		snprintf(name, sizeof name, "model.layers.%d.%s", l, t[i].suffix);
		fake_model_add_tensor(fm, name, t[i].rows, t[i].cols, seed);
	}
}

void fake_model_init(struct fake_model *fm, const struct fake_spec *spec, unsigned seed)
{
	memset(fm, 0, sizeof *fm);
	fm->spec = *spec;
	fm->header = json_object();
	json_object_set_new(fm->header, "__metadata__", json_pack("{s:s}", "format", "pt"));
	fake_model_add_tensor(fm, "model.embed_tokens.weight", spec->vocab, spec->hidden, &seed);
	for (int l = 0; l < spec->layers; l++)
		add_layer(fm, l, &seed);
	fake_model_add_tensor(fm, "model.norm.weight", 0, spec->hidden, &seed);
	if (!spec->tie)
		fake_model_add_tensor(fm, "lm_head.weight", spec->vocab, spec->hidden, &seed);

	fm->config = json_pack(
		"{s:[s], s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:s, s:b, s:b, s:b, s:i, "
		"s:i, s:s, s:{s:s, s:f}}",
		"architectures", spec->arch, "vocab_size", spec->vocab, "hidden_size", spec->hidden,
		"intermediate_size", spec->intermediate, "num_hidden_layers", spec->layers,
		"num_attention_heads", spec->heads, "num_key_value_heads", spec->kv_heads,
		"head_dim", spec->head_dim, "max_position_embeddings", 256, "rms_norm_eps", 1e-6,
		"hidden_act", "silu", "tie_word_embeddings", spec->tie, "attention_bias",
		spec->attention_bias, "mlp_bias", spec->mlp_bias, "bos_token_id", 1, "eos_token_id",
		2, "dtype", "float32", "rope_parameters", "rope_type", "default", "rope_theta",
		10000.0);
}

void fake_model_free(struct fake_model *fm)
{
	json_decref(fm->config);
	json_decref(fm->header);
	free(fm->data);
	memset(fm, 0, sizeof *fm);
}

int fake_write_json(const char *path, json_t *json)
{
	return json_dump_file(json, path, JSON_INDENT(1)) ? -EIO : 0;
}

int fake_write_raw(const char *path, uint64_t header_len, const char *header, const void *data,
		   size_t size)
{
	unsigned char len[8];
	FILE *f = fopen(path, "wb");

	if (!f)
		return -errno;
	for (int i = 0; i < 8; i++)
		len[i] = (unsigned char)(header_len >> (8 * i));
	size_t ok = fwrite(len, 1, 8, f) + fwrite(header, 1, strlen(header), f);
	ok += size ? fwrite(data, 1, size, f) : 0;
	return fclose(f) || ok != 8 + strlen(header) + size ? -EIO : 0;
}

int fake_write_safetensors(const char *path, json_t *header, const void *data, size_t size)
{
	char *text = json_dumps(header, JSON_COMPACT);
	size_t n = strlen(text), padded = (n + 7) / 8 * 8;
	char *buf = malloc(padded + 1);

	memcpy(buf, text, n);
	memset(buf + n, ' ', padded - n);
	buf[padded] = '\0';
	int rc = fake_write_raw(path, padded, buf, data, size);
	free(buf);
	free(text);
	return rc;
}

int fake_model_write(const struct fake_model *fm, const char *dir)
{
	char path[4096];
	int rc;

	snprintf(path, sizeof path, "%s/config.json", dir);
	if ((rc = fake_write_json(path, fm->config)))
		return rc;
	snprintf(path, sizeof path, "%s/model.safetensors", dir);
	return fake_write_safetensors(path, fm->header, fm->data, fm->data_size);
}

char *fake_tmpdir(void)
{
	const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
	char *dir = malloc(strlen(base) + 32);

	sprintf(dir, "%s/atlas-model-XXXXXX", base);
	if (!mkdtemp(dir)) {
		free(dir);
		return NULL;
	}
	return dir;
}

static int remove_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
	return remove(path);
}

void fake_rmtree(const char *dir)
{
	nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}
