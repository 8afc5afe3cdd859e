/* Tests of model_config_load() (config.json in the transformers 4.x and 5.x
 * spellings, generation_config.json, defaults and refusals) and of
 * model_rope_inv_freq() against values computed here independently. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/err.h"
#include "engine/model/model.h"
#include "fake_model.h"

/* A llama3-scaled Llama config in the 5.x spelling. */
static json_t *llama_v5(void)
{
	return json_pack("{s:[s], s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:s, s:b, s:b, s:b,"
			 " s:i, s:[i,i], s:s, s:{s:s, s:f, s:f, s:f, s:f, s:i}}",
			 "architectures", "LlamaForCausalLM", "vocab_size", 320, "hidden_size", 64,
			 "intermediate_size", 128, "num_hidden_layers", 2, "num_attention_heads", 4,
			 "num_key_value_heads", 2, "head_dim", 16, "max_position_embeddings", 512,
			 "rms_norm_eps", 1e-5, "hidden_act", "silu", "tie_word_embeddings", 0,
			 "attention_bias", 1, "mlp_bias", 1, "bos_token_id", 1, "eos_token_id", 2,
			 3, "dtype", "bfloat16", "rope_parameters", "rope_type", "llama3",
			 "rope_theta", 500000.0, "factor", 8.0, "low_freq_factor", 1.0,
			 "high_freq_factor", 4.0, "original_max_position_embeddings", 64);
}

/* The same settings as transformers 4.x wrote them. */
static json_t *to_v4(json_t *v5)
{
	json_t *v4 = json_deep_copy(v5);
	json_t *rope = json_deep_copy(json_object_get(v4, "rope_parameters"));

	json_object_set(v4, "rope_theta", json_object_get(rope, "rope_theta"));
	json_object_del(rope, "rope_theta");
	json_object_set_new(v4, "rope_scaling", rope);
	json_object_del(v4, "rope_parameters");
	json_object_set(v4, "torch_dtype", json_object_get(v4, "dtype"));
	json_object_del(v4, "dtype");
	return v4;
}

static char *dir;

static int make_dir(void **state)
{
	dir = fake_tmpdir();
	return dir ? 0 : -1;
}

static int remove_dir(void **state)
{
	fake_rmtree(dir);
	free(dir);
	return 0;
}

static const char *path_in(const char *name)
{
	static char path[4096];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	return path;
}

/* Write config (and generation_config unless NULL) and load them. */
static int load(json_t *config, json_t *generation, struct model_config *c, char *err)
{
	unlink(path_in("generation_config.json"));
	assert_int_equal(fake_write_json(path_in("config.json"), config), 0);
	if (generation)
		assert_int_equal(fake_write_json(path_in("generation_config.json"), generation), 0);
	err[0] = '\0';
	int rc = model_config_load(dir, c, err, ATLAS_ERRLEN);
	if (rc)
		printf("  %d: %s\n", rc, err);
	return rc;
}

static void test_llama_v5(void **state)
{
	struct model_config c;
	char err[ATLAS_ERRLEN];
	json_t *j = llama_v5();

	assert_int_equal(load(j, NULL, &c, err), 0);
	assert_string_equal(c.architecture, "LlamaForCausalLM");
	assert_int_equal(c.n_attention_layers, 2);
	assert_int_equal(c.layers[1].mixer, MODEL_MIXER_ATTENTION);
	assert_int_equal(c.layers[1].cache, 1);
	assert_int_equal(c.vocab_size, 320);
	assert_int_equal(c.hidden_size, 64);
	assert_int_equal(c.intermediate_size, 128);
	assert_int_equal(c.n_layers, 2);
	assert_int_equal(c.n_heads, 4);
	assert_int_equal(c.n_kv_heads, 2);
	assert_int_equal(c.head_dim, 16);
	assert_int_equal(c.max_position_embeddings, 512);
	assert_float_equal(c.rms_norm_eps, 1e-5f, 0);
	assert_float_equal(c.rope_theta, 500000.0, 0);
	assert_int_equal(c.rope_type, MODEL_ROPE_LLAMA3);
	assert_float_equal(c.rope_factor, 8.0, 0);
	assert_float_equal(c.rope_low_freq_factor, 1.0, 0);
	assert_float_equal(c.rope_high_freq_factor, 4.0, 0);
	assert_int_equal(c.rope_original_max_position, 64);
	assert_false(c.tie_word_embeddings);
	assert_false(c.qk_norm);
	assert_true(c.attention_bias);
	assert_true(c.mlp_bias);
	assert_int_equal(c.dtype, KT_BF16);
	assert_int_equal(c.bos_token_id, 1);
	assert_int_equal(c.n_eos, 2);
	assert_int_equal(c.eos_token_ids[0], 2);
	assert_int_equal(c.eos_token_ids[1], 3);
	json_decref(j);
}

static void assert_same_config(const struct model_config *a, const struct model_config *b)
{
	assert_string_equal(a->architecture, b->architecture);
	assert_int_equal(a->family, b->family);
	assert_int_equal(a->vocab_size, b->vocab_size);
	assert_int_equal(a->hidden_size, b->hidden_size);
	assert_int_equal(a->intermediate_size, b->intermediate_size);
	assert_int_equal(a->n_layers, b->n_layers);
	assert_int_equal(a->n_heads, b->n_heads);
	assert_int_equal(a->n_kv_heads, b->n_kv_heads);
	assert_int_equal(a->head_dim, b->head_dim);
	assert_int_equal(a->max_position_embeddings, b->max_position_embeddings);
	assert_true(a->rms_norm_eps == b->rms_norm_eps);
	assert_true(a->rope_theta == b->rope_theta);
	assert_int_equal(a->rope_type, b->rope_type);
	assert_true(a->rope_factor == b->rope_factor);
	assert_true(a->rope_low_freq_factor == b->rope_low_freq_factor);
	assert_true(a->rope_high_freq_factor == b->rope_high_freq_factor);
	assert_int_equal(a->rope_original_max_position, b->rope_original_max_position);
	assert_int_equal(a->tie_word_embeddings, b->tie_word_embeddings);
	assert_int_equal(a->qk_norm, b->qk_norm);
	assert_int_equal(a->attention_bias, b->attention_bias);
	assert_int_equal(a->mlp_bias, b->mlp_bias);
	assert_int_equal(a->dtype, b->dtype);
	assert_int_equal(a->bos_token_id, b->bos_token_id);
	assert_int_equal(a->n_eos, b->n_eos);
	assert_memory_equal(a->eos_token_ids, b->eos_token_ids, sizeof a->eos_token_ids);
}

static void test_v4_spelling(void **state)
{
	struct model_config c5, c4;
	char err[ATLAS_ERRLEN];
	json_t *j5 = llama_v5(), *j4 = to_v4(j5);

	assert_int_equal(load(j5, NULL, &c5, err), 0);
	assert_int_equal(load(j4, NULL, &c4, err), 0);
	assert_same_config(&c5, &c4);

	/* the pre-4.45 key "type" inside rope_scaling */
	json_t *rope = json_object_get(j4, "rope_scaling");
	json_object_set(rope, "type", json_object_get(rope, "rope_type"));
	json_object_del(rope, "rope_type");
	assert_int_equal(load(j4, NULL, &c4, err), 0);
	assert_same_config(&c5, &c4);

	/* no scaling: rope_scaling null, rope_theta alone */
	json_object_set_new(j4, "rope_scaling", json_null());
	assert_int_equal(load(j4, NULL, &c4, err), 0);
	assert_int_equal(c4.rope_type, MODEL_ROPE_DEFAULT);
	assert_true(c4.rope_theta == 500000.0);
	json_decref(j4);
	json_decref(j5);
}

static void test_defaults_and_generation_config(void **state)
{
	struct model_config c;
	char err[ATLAS_ERRLEN];
	json_t *j = llama_v5();

	json_object_set_new(j, "architectures", json_pack("[s]", "Qwen3ForCausalLM"));
	json_object_del(j, "head_dim");
	json_object_del(j, "num_key_value_heads");
	json_object_del(j, "rope_parameters");
	json_object_del(j, "mlp_bias");
	json_object_del(j, "bos_token_id");
	json_object_del(j, "dtype");
	json_t *gen = json_pack("{s:i, s:[i,i,i]}", "bos_token_id", 7, "eos_token_id", 5, 6, 9);
	assert_int_equal(load(j, gen, &c, err), 0);
	assert_string_equal(c.architecture, "Qwen3ForCausalLM");
	assert_true(c.qk_norm);
	assert_int_equal(c.head_dim, 64 / 4);
	assert_int_equal(c.n_kv_heads, 4);
	assert_int_equal(c.rope_type, MODEL_ROPE_DEFAULT);
	assert_true(c.rope_theta == 10000.0);
	assert_int_equal(c.dtype, KT_F32);
	/* generation_config.json wins over config.json */
	assert_int_equal(c.bos_token_id, 7);
	assert_int_equal(c.n_eos, 3);
	assert_int_equal(c.eos_token_ids[2], 9);

	/* a single eos id, no bos anywhere */
	json_decref(gen);
	gen = json_pack("{s:i}", "eos_token_id", 11);
	assert_int_equal(load(j, gen, &c, err), 0);
	assert_int_equal(c.n_eos, 1);
	assert_int_equal(c.eos_token_ids[0], 11);
	assert_int_equal(c.bos_token_id, -1);
	json_decref(gen);
	json_decref(j);
}

/* Each refusal names config.json and the key. */
static void expect_refusal(json_t *j, int code, const char *key)
{
	struct model_config c;
	char err[ATLAS_ERRLEN];

	assert_int_equal(load(j, NULL, &c, err), code);
	assert_non_null(strstr(err, "config.json"));
	if (!strstr(err, key))
		fail_msg("message \"%s\" does not name %s", err, key);
}

static void test_refusals(void **state)
{
	json_t *j = llama_v5();
	json_t *rope = json_object_get(j, "rope_parameters");

	json_object_set_new(rope, "rope_type", json_string("yarn"));
	expect_refusal(j, -ENOTSUP, "rope_parameters.rope_type");
	json_object_set_new(rope, "rope_type", json_string("llama3"));
	json_object_del(rope, "low_freq_factor");
	expect_refusal(j, -EINVAL, "rope_parameters.low_freq_factor");
	json_object_set_new(rope, "low_freq_factor", json_real(1.0));

	json_object_set_new(j, "hidden_act", json_string("gelu"));
	expect_refusal(j, -ENOTSUP, "hidden_act");
	json_object_set_new(j, "hidden_act", json_string("silu"));

	json_object_set_new(j, "num_key_value_heads", json_integer(3));
	expect_refusal(j, -EINVAL, "num_key_value_heads");
	json_object_set_new(j, "num_key_value_heads", json_integer(2));

	json_object_set_new(j, "dtype", json_string("float8_e4m3fn"));
	expect_refusal(j, -ENOTSUP, "dtype");
	json_object_set_new(j, "dtype", json_string("bfloat16"));

	json_object_del(j, "hidden_size");
	expect_refusal(j, -EINVAL, "hidden_size");
	json_object_set_new(j, "hidden_size", json_string("64"));
	expect_refusal(j, -EINVAL, "hidden_size");
	json_object_set_new(j, "hidden_size", json_integer(64));

	json_object_set_new(j, "use_sliding_window", json_true());
	expect_refusal(j, -ENOTSUP, "use_sliding_window");
	json_object_del(j, "use_sliding_window");

	json_object_del(j, "architectures");
	json_object_set_new(j, "model_type", json_string("mistral"));
	expect_refusal(j, -ENOTSUP, "model_type");
	json_decref(j);
}

/* Default frequencies are theta^(-2i/D); these expectations come from the
 * formula in double precision, not from the code under test. */
static void test_rope_default(void **state)
{
	struct model_config c = { .head_dim = 32, .rope_dim = 32,
				  .rope_theta = 1e6,
				  .rope_type = MODEL_ROPE_DEFAULT };
	float inv[16];

	model_rope_inv_freq(&c, inv);
	for (int i = 0; i < 16; i++) {
		double want = pow(1e6, -2.0 * i / 32);
		assert_float_equal(inv[i], want, want * 2e-6);
	}
}

/* Partial rotary (Qwen3-Next's partial_rotary_factor 0.25 of head_dim 32):
 * R = 8 rotated dims, frequencies theta^(-2i/R) over i < R/2, from the
 * formula in double precision. */
static void test_rope_partial(void **state)
{
	struct model_config c = { .head_dim = 32, .rope_dim = 8, .rope_theta = 1e7,
				  .rope_type = MODEL_ROPE_DEFAULT };
	float inv[4];

	model_rope_inv_freq(&c, inv);
	for (int i = 0; i < 4; i++) {
		double want = pow(1e7, -2.0 * i / 8);
		assert_float_equal(inv[i], want, want * 2e-6);
	}
}

/* llama3 with D 16, theta 10000, factor 8, low 1, high 4, original 64: the
 * bands are high (i = 0, kept), middle (1, 2, interpolated) and low (3..7,
 * divided by 8). The values were computed with Meta's reference formula in
 * double precision (Python), independently of atlas. */
static void test_rope_llama3(void **state)
{
	static const double want[8] = { 1.0, 0.244384599, 0.013042256, 0.00395284708, 0.00125,
					0.000395284708, 0.000125, 3.95284708e-05 };
	struct model_config c = { .head_dim = 16, .rope_dim = 16, .rope_theta = 10000.0,
				  .rope_type = MODEL_ROPE_LLAMA3, .rope_factor = 8.0,
				  .rope_low_freq_factor = 1.0, .rope_high_freq_factor = 4.0,
				  .rope_original_max_position = 64 };
	float inv[8];

	model_rope_inv_freq(&c, inv);
	for (int i = 0; i < 8; i++)
		assert_float_equal(inv[i], want[i], want[i] * 2e-6);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_llama_v5),
		cmocka_unit_test(test_v4_spelling),
		cmocka_unit_test(test_defaults_and_generation_config),
		cmocka_unit_test(test_refusals),
		cmocka_unit_test(test_rope_default),
		cmocka_unit_test(test_rope_partial),
		cmocka_unit_test(test_rope_llama3),
	};
	return cmocka_run_group_tests_name("model_config", tests, make_dir, remove_dir);
}
