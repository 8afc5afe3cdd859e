/* Small model directories written by the tests: config.json in the 5.x
 * spelling and an f32 model.safetensors with random weights. Tests edit the
 * JSON (config or safetensors header) before writing to make broken ones. */
#ifndef ATLAS_TESTS_MODEL_FAKE_MODEL_H
#define ATLAS_TESTS_MODEL_FAKE_MODEL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct fake_spec {
	const char *arch;               /* "Qwen3ForCausalLM" or "LlamaForCausalLM" */
	int vocab, hidden, intermediate, layers, heads, kv_heads, head_dim;
	bool tie, attention_bias, mlp_bias;
};

struct fake_model {
	struct fake_spec spec;
	json_t *config;                 /* config.json */
	json_t *header;                 /* the safetensors header, every tensor F32 */
	unsigned char *data;            /* the data section the header points into */
	size_t data_size;
	uint64_t parameters;            /* elements of all tensors */
};

/* A Qwen3 model: 2 layers, hidden 16, GQA 4/2 heads of 8, vocab 32, untied. */
struct fake_spec fake_default_spec(void);
void fake_model_init(struct fake_model *fm, const struct fake_spec *spec, unsigned seed);
void fake_model_free(struct fake_model *fm);
/* Append an F32 tensor [rows, cols] (rows 0: a vector [cols]) of random values. */
void fake_model_add_tensor(struct fake_model *fm, const char *name, int64_t rows, int64_t cols,
			   unsigned *seed);
/* Write config.json and model.safetensors into dir. */
int fake_model_write(const struct fake_model *fm, const char *dir);

int fake_write_json(const char *path, json_t *json);
/* A safetensors file: the header (padded to 8 bytes) after its length, then data. */
int fake_write_safetensors(const char *path, json_t *header, const void *data, size_t size);
/* The same with the header given as text and its length field as stored. */
int fake_write_raw(const char *path, uint64_t header_len, const char *header, const void *data,
		   size_t size);

/* A fresh directory under $TMPDIR (malloc()ed path) and its recursive removal. */
char *fake_tmpdir(void);
void fake_rmtree(const char *dir);

#endif
