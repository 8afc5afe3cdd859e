/* Tests of engine/model/ without reference data: config.json in both
 * transformers spellings, the rotary frequencies, and every way a model
 * directory can be broken, each of which must fail with a code and a message
 * that names the file and the tensor or key. The broken directories are
 * written here from a small valid model (fake_model.c). */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/err.h"
#include "engine/model/model.h"
#include "fake_model.h"

static struct kt_backend *be;

static int open_backend(void **state)
{
	struct kt_config c = { .backend = "cpu", .threads = 1, .max_tokens = 64, .max_seqs = 2,
			       .max_context = 256, .max_heads = 16, .max_head_dim = 64 };
	char err[ATLAS_ERRLEN];
	int rc = kt_backend_open(&c, &be, err, sizeof err);
	if (rc)
		fprintf(stderr, "%s\n", err);
	return rc;
}

static int close_backend(void **state)
{
	kt_backend_close(be);
	return 0;
}

static char *write_model(const struct fake_model *fm)
{
	char *dir = fake_tmpdir();
	assert_non_null(dir);
	assert_int_equal(fake_model_write(fm, dir), 0);
	return dir;
}

static char *path_in(const char *dir, const char *name)
{
	static char path[4096];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	return path;
}

/* model_load(dir) must fail with code and a message holding every needle. */
static void expect_load_error(const char *dir, int code, const char *const *needles)
{
	struct model *m = NULL;
	char err[ATLAS_ERRLEN] = "";
	int rc = model_load(dir, be, 16, 4, &m, err, sizeof err);

	printf("  %s -> %d: %s\n", dir, rc, err);
	assert_int_equal(rc, code);
	assert_null(m);
	for (; *needles; needles++)
		if (!strstr(err, *needles))
			fail_msg("message \"%s\" does not name \"%s\"", err, *needles);
}

#define EXPECT_LOAD_ERROR(dir, code, ...) \
	expect_load_error(dir, code, (const char *const[]){ __VA_ARGS__, NULL })

/* A json object inside the safetensors header, by tensor name. */
static json_t *tensor(struct fake_model *fm, const char *name)
{
	json_t *t = json_object_get(fm->header, name);
	assert_non_null(t);
	return t;
}

static void test_load_valid(void **state)
{
	struct fake_model fm;
	struct fake_spec spec = fake_default_spec();
	struct model *m = NULL;
	struct model_info info;
	char err[ATLAS_ERRLEN] = "";

	fake_model_init(&fm, &spec, 1);
	uint64_t parameters = fm.parameters;
	/* A buffer that transformers keeps in some checkpoints: ignored. */
	unsigned seed = 1;
	fake_model_add_tensor(&fm, "model.layers.0.self_attn.rotary_emb.inv_freq", 0, 4, &seed);
	char *dir = write_model(&fm);
	if (model_load(dir, be, 16, 4, &m, err, sizeof err))
		fail_msg("%s", err);
	model_get_info(m, &info);
	assert_int_equal(info.parameters, parameters);
	fm.parameters = parameters;
	assert_int_equal(info.file_bytes, fm.parameters * 4);
	assert_int_equal(info.device_bytes, fm.parameters * 4);
	assert_string_equal(info.dtype, "f32");
	const struct model_config *c = model_get_config(m);
	assert_string_equal(c->architecture, "Qwen3ForCausalLM");
	assert_int_equal(c->n_attention_layers, c->n_layers);
	assert_int_equal(c->n_linear_layers, 0);
	assert_true(c->qk_norm);
	assert_int_equal(c->head_dim, spec.head_dim);

	/* Steps that do not fit what the model was loaded for are refused. */
	struct kt_tensor ids, rows, logits;
	assert_int_equal(kt_alloc(be, KT_I32, 32, 1, &ids), 0);
	assert_int_equal(kt_alloc(be, KT_I32, 8, 1, &rows), 0);
	assert_int_equal(kt_alloc(be, KT_F32, 8, spec.vocab, &logits), 0);
	struct model_step s = { .ids = kt_rows(ids, 0, 17),
				.batch = { .n_tokens = 17, .block_size = 16 },
				.out_rows = kt_rows(rows, 0, 1), .logits = logits };
	assert_int_equal(model_forward(m, &s), -EINVAL);
	s.ids = kt_rows(ids, 0, 2);
	s.batch.n_tokens = 3;
	assert_int_equal(model_forward(m, &s), -EINVAL);
	s.batch.n_tokens = 2;
	s.out_rows = kt_rows(rows, 0, 5);
	assert_int_equal(model_forward(m, &s), -EINVAL);
	kt_free(be, &ids);
	kt_free(be, &rows);
	kt_free(be, &logits);
	model_free(m);
	fake_rmtree(dir);
	free(dir);
	fake_model_free(&fm);
}

static void test_load_llama_tied_bias(void **state)
{
	struct fake_model fm;
	struct fake_spec spec = fake_default_spec();
	struct model *m = NULL;
	struct model_info info;
	char err[ATLAS_ERRLEN] = "";

	spec.arch = "LlamaForCausalLM";
	spec.tie = spec.attention_bias = spec.mlp_bias = true;
	fake_model_init(&fm, &spec, 2);
	char *dir = write_model(&fm);
	assert_int_equal(model_load(dir, be, 16, 4, &m, err, sizeof err), 0);
	model_get_info(m, &info);
	assert_int_equal(info.parameters, fm.parameters);
	assert_false(model_get_config(m)->qk_norm);
	model_free(m);

	/* The same files read as untied: lm_head.weight is missing. */
	json_object_set_new(fm.config, "tie_word_embeddings", json_false());
	assert_int_equal(fake_write_json(path_in(dir, "config.json"), fm.config), 0);
	EXPECT_LOAD_ERROR(dir, -ENOENT, "model.safetensors", "lm_head.weight");
	fake_rmtree(dir);
	free(dir);
	fake_model_free(&fm);
}

/* Each case: edit a valid model, write it, and expect the error. */
static void test_broken_tensors(void **state)
{
	struct fake_spec spec = fake_default_spec();
	struct fake_model fm;
	char *dir;

	/* wrong shape: q_proj transposed (same number of elements) */
	fake_model_init(&fm, &spec, 3);
	json_object_set_new(tensor(&fm, "model.layers.1.self_attn.q_proj.weight"), "shape",
			    json_pack("[i,i]", spec.hidden, spec.heads * spec.head_dim));
	dir = write_model(&fm);
	EXPECT_LOAD_ERROR(dir, -EINVAL, "model.safetensors",
			  "model.layers.1.self_attn.q_proj.weight", "shape");
	fake_rmtree(dir);
	free(dir);
	fake_model_free(&fm);

	/* wrong dtype: I32 has the size of F32, so only the dtype is wrong */
	fake_model_init(&fm, &spec, 3);
	json_object_set_new(tensor(&fm, "model.norm.weight"), "dtype", json_string("I32"));
	dir = write_model(&fm);
	EXPECT_LOAD_ERROR(dir, -EINVAL, "model.safetensors", "model.norm.weight", "I32");
	fake_rmtree(dir);
	free(dir);
	fake_model_free(&fm);

	/* missing tensor */
	fake_model_init(&fm, &spec, 3);
	json_object_del(fm.header, "model.layers.1.mlp.up_proj.weight");
	dir = write_model(&fm);
	EXPECT_LOAD_ERROR(dir, -ENOENT, "model.safetensors", "model.layers.1.mlp.up_proj.weight",
			  "missing");
	fake_rmtree(dir);
	free(dir);
	fake_model_free(&fm);

	/* offsets past the end of the data */
	fake_model_init(&fm, &spec, 3);
	json_object_set_new(tensor(&fm, "model.layers.0.mlp.down_proj.weight"), "data_offsets",
			    json_pack("[I,I]", (json_int_t)16, (json_int_t)fm.data_size + 64));
	dir = write_model(&fm);
	EXPECT_LOAD_ERROR(dir, -EINVAL, "model.safetensors", "model.layers.0.mlp.down_proj.weight",
			  "past the end");
	fake_rmtree(dir);
	free(dir);
	fake_model_free(&fm);

	/* two tensors on the same bytes */
	fake_model_init(&fm, &spec, 3);
	json_object_set(tensor(&fm, "model.layers.0.self_attn.v_proj.weight"), "data_offsets",
			json_object_get(tensor(&fm, "model.layers.0.self_attn.k_proj.weight"),
					"data_offsets"));
	dir = write_model(&fm);
	EXPECT_LOAD_ERROR(dir, -EINVAL, "model.safetensors", "model.layers.0.self_attn.",
			  "overlaps");
	fake_rmtree(dir);
	free(dir);
	fake_model_free(&fm);

	/* offsets that disagree with shape and dtype */
	fake_model_init(&fm, &spec, 3);
	json_object_set_new(tensor(&fm, "model.layers.0.input_layernorm.weight"), "data_offsets",
			    json_pack("[i,i]", 0, 8));
	dir = write_model(&fm);
	EXPECT_LOAD_ERROR(dir, -EINVAL, "model.safetensors",
			  "model.layers.0.input_layernorm.weight", "data_offsets");
	fake_rmtree(dir);
	free(dir);
	fake_model_free(&fm);
}

static void test_broken_files(void **state)
{
	struct fake_spec spec = fake_default_spec();
	struct fake_model fm;
	const char *st;

	fake_model_init(&fm, &spec, 4);
	char *dir = write_model(&fm);
	st = path_in(dir, "model.safetensors");

	/* truncated in the data: the last tensor runs past the end */
	FILE *f = fopen(st, "rb");
	assert_non_null(f);
	assert_int_equal(fseek(f, 0, SEEK_END), 0);
	long size = ftell(f);
	fclose(f);
	assert_int_equal(truncate(st, size - 100), 0);
	EXPECT_LOAD_ERROR(dir, -EINVAL, "model.safetensors", "lm_head.weight", "past the end");
	/* truncated inside the length field */
	assert_int_equal(truncate(st, 5), 0);
	EXPECT_LOAD_ERROR(dir, -EINVAL, "model.safetensors", "truncated");
	/* header length past the end of the file */
	assert_int_equal(fake_write_raw(st, (uint64_t)1 << 40, "{}      ", NULL, 0), 0);
	EXPECT_LOAD_ERROR(dir, -EINVAL, "model.safetensors", "header length");
	/* header that is not JSON */
	assert_int_equal(fake_write_raw(st, 16, "{\"a\": [1, 2,    ", NULL, 0), 0);
	EXPECT_LOAD_ERROR(dir, -EINVAL, "model.safetensors", "header", "JSON");
	/* a FIFO where the weights belong: refused, not waited on for a writer */
	assert_int_equal(unlink(st), 0);
	assert_int_equal(mkfifo(st, 0600), 0);
	EXPECT_LOAD_ERROR(dir, -EINVAL, "model.safetensors", "not a regular file");
	/* no weights at all */
	assert_int_equal(unlink(st), 0);
	EXPECT_LOAD_ERROR(dir, -ENOENT, "model.safetensors");

	/* unsupported architecture */
	assert_int_equal(fake_model_write(&fm, dir), 0);
	json_object_set_new(fm.config, "architectures", json_pack("[s]", "MistralForCausalLM"));
	assert_int_equal(fake_write_json(path_in(dir, "config.json"), fm.config), 0);
	EXPECT_LOAD_ERROR(dir, -ENOTSUP, "config.json", "architectures", "MistralForCausalLM");
	/* config.json that is not JSON */
	assert_int_equal(fake_write_raw(path_in(dir, "config.json"), 0, "", "{\"a\":", 5), 0);
	EXPECT_LOAD_ERROR(dir, -EINVAL, "config.json");
	/* a FIFO named config.json */
	assert_int_equal(unlink(path_in(dir, "config.json")), 0);
	assert_int_equal(mkfifo(path_in(dir, "config.json"), 0600), 0);
	EXPECT_LOAD_ERROR(dir, -EINVAL, "config.json", "not a regular file");
	/* no config.json */
	assert_int_equal(unlink(path_in(dir, "config.json")), 0);
	EXPECT_LOAD_ERROR(dir, -ENOENT, "config.json");

	fake_rmtree(dir);
	free(dir);
	fake_model_free(&fm);
}

/* Split the fake model over two shard files and an index. */
static void write_sharded(struct fake_model *fm, const char *dir, json_t *weight_map)
{
	json_t *halves[2] = { json_object(), json_object() }, *desc;
	const char *name;
	int i = 0;

	json_object_foreach(fm->header, name, desc) {
		if (strcmp(name, "__metadata__") == 0)
			continue;
		int half = i++ % 2;
		json_object_set(halves[half], name, desc);
		json_object_set_new(weight_map, name,
				    json_sprintf("model-%05d-of-00002.safetensors", half + 1));
	}
	for (int h = 0; h < 2; h++) {
		char file[64];
		snprintf(file, sizeof file, "model-%05d-of-00002.safetensors", h + 1);
		assert_int_equal(fake_write_safetensors(path_in(dir, file), halves[h], fm->data,
							fm->data_size), 0);
		json_decref(halves[h]);
	}
	json_t *index = json_pack("{s:{s:I}, s:O}", "metadata", "total_size",
				  (json_int_t)fm->data_size, "weight_map", weight_map);
	assert_int_equal(fake_write_json(path_in(dir, "model.safetensors.index.json"), index), 0);
	json_decref(index);
}

static void test_sharded(void **state)
{
	struct fake_spec spec = fake_default_spec();
	struct fake_model fm;
	struct model *m = NULL;
	struct model_info info;
	char err[ATLAS_ERRLEN] = "";
	json_t *map = json_object();

	fake_model_init(&fm, &spec, 5);
	char *dir = fake_tmpdir();
	assert_int_equal(fake_write_json(path_in(dir, "config.json"), fm.config), 0);
	write_sharded(&fm, dir, map);
	assert_int_equal(model_load(dir, be, 16, 4, &m, err, sizeof err), 0);
	model_get_info(m, &info);
	assert_int_equal(info.parameters, fm.parameters);
	model_free(m);

	/* the index names a shard that does not exist */
	char shard[64];
	snprintf(shard, sizeof shard, "%s",
		 json_string_value(json_object_get(map, "model.norm.weight")));
	json_object_set_new(map, "model.norm.weight",
			    json_string("model-00003-of-00002.safetensors"));
	json_t *index = json_pack("{s:O}", "weight_map", map);
	assert_int_equal(fake_write_json(path_in(dir, "model.safetensors.index.json"), index), 0);
	EXPECT_LOAD_ERROR(dir, -ENOENT, "model.safetensors.index.json", "model.norm.weight",
			  "model-00003-of-00002.safetensors");
	/* the index puts a tensor in the other shard */
	shard[strlen("model-0000")] = shard[strlen("model-0000")] == '1' ? '2' : '1';
	json_object_set_new(map, "model.norm.weight", json_string(shard));
	assert_int_equal(fake_write_json(path_in(dir, "model.safetensors.index.json"), index), 0);
	EXPECT_LOAD_ERROR(dir, -EINVAL, "model.safetensors.index.json", "model.norm.weight", shard);
	/* an index that is not JSON */
	const char *index_path = path_in(dir, "model.safetensors.index.json");
	assert_int_equal(fake_write_raw(index_path, 0, "", "[", 1), 0);
	EXPECT_LOAD_ERROR(dir, -EINVAL, "model.safetensors.index.json");

	json_decref(index);
	json_decref(map);
	fake_rmtree(dir);
	free(dir);
	fake_model_free(&fm);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_load_valid),
		cmocka_unit_test(test_load_llama_tied_bias),
		cmocka_unit_test(test_broken_tensors),
		cmocka_unit_test(test_broken_files),
		cmocka_unit_test(test_sharded),
	};
	return cmocka_run_group_tests_name("model_loader", tests, open_backend, close_backend);
}
