/* config.json and generation_config.json of a Hugging Face model directory.
 *
 * transformers 4.x writes the rotary settings as top-level rope_theta plus an
 * optional rope_scaling object and the dtype as torch_dtype; 5.x writes one
 * rope_parameters object {rope_type, rope_theta, factor, ...} and dtype. Both
 * are read into the same struct model_config.
 */
#include "engine/model/internal.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "common/file.h"
#include "engine/model/family.h"
#include "engine/model/hf_json.h"

static int load_json(const char *dir, const char *name, bool required, struct hf_json *f,
		     char *err, size_t errlen)
{
	json_error_t je;

	snprintf(f->path, sizeof f->path, "%s/%s", dir, name);
	f->root = NULL;
	FILE *fp = file_fopen_regular(f->path, err, errlen);
	if (!fp)
		return errno == ENOENT && !required ? 0 : -errno;
	f->root = json_loadf(fp, JSON_REJECT_DUPLICATES, &je);
	fclose(fp);
	if (!f->root)
		return atlas_errf(err, errlen, -EINVAL, "%s: line %d: %s", f->path, je.line,
				  je.text);
	if (!json_is_object(f->root)) {
		json_decref(f->root);
		f->root = NULL;
		return atlas_errf(err, errlen, -EINVAL, "%s: not a JSON object", f->path);
	}
	return 0;
}

/* architectures[0], or model_type when there is no list, picks the table row. */
static int parse_architecture(const struct hf_json *f, struct model_config *cfg, int *variant,
			      char *err, size_t errlen)
{
	json_t *archs = hf_get(f->root, "architectures");
	const struct model_arch *row;
	const char *name;

	if (archs) {
		if (!json_is_array(archs) || json_array_size(archs) != 1 ||
		    !json_is_string(json_array_get(archs, 0)))
			return atlas_errf(err, errlen, -EINVAL,
					  "%s: key architectures: want a list of one name",
					  f->path);
		name = json_string_value(json_array_get(archs, 0));
		row = model_arch_find(name, NULL);
		if (!row)
			return atlas_errf(err, errlen, -ENOTSUP,
					  "%s: key architectures: %s is not supported (%s)", f->path,
					  name, model_arch_names());
	} else if (json_is_string(hf_get(f->root, "model_type"))) {
		name = json_string_value(hf_get(f->root, "model_type"));
		row = model_arch_find(NULL, name);
		if (!row)
			return atlas_errf(err, errlen, -ENOTSUP,
					  "%s: key model_type: %s is not supported (%s)", f->path,
					  name, model_arch_names());
	} else {
		return atlas_errf(err, errlen, -EINVAL, "%s: key architectures: missing", f->path);
	}
	snprintf(cfg->architecture, sizeof cfg->architecture, "%s", row->architecture);
	cfg->family = row->family;
	*variant = row->variant;
	return 0;
}

static int parse_dtype(const struct hf_json *f, struct model_config *cfg, char *err,
		       size_t errlen)
{
	static const struct { const char *name; enum kt_dtype dtype; } names[] = {
		{ "float32", KT_F32 }, { "bfloat16", KT_BF16 }, { "float16", KT_F16 },
	};
	const char *key = hf_get(f->root, "dtype") ? "dtype" : "torch_dtype";
	json_t *v = hf_get(f->root, key);

	cfg->dtype = KT_F32; /* torch's default when a config names none */
	if (!v)
		return 0;
	const char *s = json_string_value(v);
	for (size_t i = 0; s && i < ATLAS_ARRAY_LEN(names); i++)
		if (strcmp(s, names[i].name) == 0) {
			cfg->dtype = names[i].dtype;
			return 0;
		}
	return atlas_errf(err, errlen, -ENOTSUP,
			  "%s: key %s: %s is not supported (float32, bfloat16, float16)", f->path,
			  key, s ? s : "(not a string)");
}

/* The rotary settings: the object that holds rope_type and its parameters
 * (5.x rope_parameters, 4.x rope_scaling) and where rope_theta lives. */
static int parse_rope(const struct hf_json *f, struct model_config *cfg, char *err,
		      size_t errlen)
{
	const char *obj_key = "rope_parameters";
	json_t *rope = hf_get(f->root, obj_key);
	int rc;

	if (rope && !hf_get(rope, "rope_type") && !hf_get(rope, "rope_theta") &&
	    json_is_object(hf_get(rope, "full_attention")))
		rope = hf_get(rope, "full_attention"); /* keyed by layer type */
	if (!rope) {
		obj_key = "rope_scaling";
		rope = hf_get(f->root, obj_key);
	}
	if (rope && !json_is_object(rope))
		return atlas_errf(err, errlen, -EINVAL, "%s: key %s: not an object", f->path,
				  obj_key);
	/* rope_theta: in the rotary object (5.x), else at the top (4.x) */
	rc = hf_double(f, hf_get(rope, "rope_theta") ? rope : f->root, "rope_theta", false, 10000.0,
			&cfg->rope_theta, err, errlen);
	if (rc)
		return rc;
	if (!(cfg->rope_theta > 0))
		return atlas_errf(err, errlen, -EINVAL, "%s: key rope_theta: must be positive",
				  f->path);

	/* partial_rotary_factor: in the rotary object (5.x), else at the top (4.x) */
	double partial = 1.0;
	rc = hf_double(f, hf_get(rope, "partial_rotary_factor") ? rope : f->root,
		       "partial_rotary_factor", false, 1.0, &partial, err, errlen);
	if (rc)
		return rc;
	/* transformers' int(head_dim * factor), once the factor is known to be in (0, 1] */
	cfg->rope_dim = partial > 0 && partial <= 1 ? (int)(cfg->head_dim * partial) : 0;
	if (cfg->rope_dim < 2 || cfg->rope_dim % 2)
		return atlas_errf(err, errlen, -EINVAL,
				  "%s: key partial_rotary_factor: %g of head_dim %d must give an "
				  "even number of rotated dims, at least 2", f->path, partial,
				  cfg->head_dim);

	cfg->rope_type = MODEL_ROPE_DEFAULT;
	cfg->rope_factor = 1.0;
	cfg->rope_low_freq_factor = cfg->rope_high_freq_factor = 0.0;
	cfg->rope_original_max_position = 0;
	if (!rope)
		return 0;


	json_t *type = hf_get(rope, "rope_type");
	if (!type)
		type = hf_get(rope, "type"); /* the older spelling of rope_scaling */
	const char *tname = type ? json_string_value(type) : "default";
	if (!tname)
		return atlas_errf(err, errlen, -EINVAL, "%s: key %s.rope_type: not a string",
				  f->path, obj_key);
	if (strcmp(tname, "default") == 0)
		return 0;
	if (strcmp(tname, "llama3") != 0)
		return atlas_errf(err, errlen, -ENOTSUP,
				  "%s: key %s.rope_type: %s is not supported (default, llama3)",
				  f->path, obj_key, tname);

	cfg->rope_type = MODEL_ROPE_LLAMA3;
	char key[96];
	static const char *const params[] = { "factor", "low_freq_factor", "high_freq_factor" };
	double *dst[] = { &cfg->rope_factor, &cfg->rope_low_freq_factor,
			  &cfg->rope_high_freq_factor };
	for (size_t i = 0; i < ATLAS_ARRAY_LEN(params); i++) {
		snprintf(key, sizeof key, "%s.%s", obj_key, params[i]);
		if (!json_is_number(hf_get(rope, params[i])))
			return atlas_errf(err, errlen, -EINVAL,
					  "%s: key %s: missing or not a number", f->path, key);
		*dst[i] = json_number_value(hf_get(rope, params[i]));
	}
	json_t *omax = hf_get(rope, "original_max_position_embeddings");
	if (!json_is_integer(omax) || json_integer_value(omax) <= 0 ||
	    json_integer_value(omax) > INT32_MAX)
		return atlas_errf(err, errlen, -EINVAL,
				  "%s: key %s.original_max_position_embeddings: missing or not a "
				  "positive integer", f->path, obj_key);
	cfg->rope_original_max_position = (int)json_integer_value(omax);
	if (!(cfg->rope_factor >= 1.0) ||
	    !(cfg->rope_high_freq_factor > cfg->rope_low_freq_factor) ||
	    !(cfg->rope_low_freq_factor > 0))
		return atlas_errf(err, errlen, -EINVAL,
				  "%s: key %s: llama3 wants factor >= 1 and high_freq_factor > "
				  "low_freq_factor > 0", f->path, obj_key);
	return 0;
}

/* eos_token_id: an integer or a list of them; bos_token_id: an integer. */
static int parse_special_ids(const struct hf_json *f, struct model_config *cfg, bool *have_eos,
			     bool *have_bos, char *err, size_t errlen)
{
	json_t *eos = hf_get(f->root, "eos_token_id");
	json_t *bos = hf_get(f->root, "bos_token_id");

	if (eos && !*have_eos) {
		size_t n = json_is_array(eos) ? json_array_size(eos) : 1;
		if (n > MODEL_MAX_EOS)
			return atlas_errf(err, errlen, -EINVAL,
					  "%s: key eos_token_id: more than %d ids", f->path,
					  MODEL_MAX_EOS);
		for (size_t i = 0; i < n; i++) {
			json_t *v = json_is_array(eos) ? json_array_get(eos, i) : eos;
			if (!json_is_integer(v) || json_integer_value(v) < 0 ||
			    json_integer_value(v) > INT32_MAX)
				return atlas_errf(err, errlen, -EINVAL,
						  "%s: key eos_token_id: want ids", f->path);
			cfg->eos_token_ids[i] = (int32_t)json_integer_value(v);
		}
		cfg->n_eos = (int)n;
		*have_eos = true;
	}
	if (bos && !*have_bos) {
		if (!json_is_integer(bos) || json_integer_value(bos) < 0 ||
		    json_integer_value(bos) > INT32_MAX)
			return atlas_errf(err, errlen, -EINVAL, "%s: key bos_token_id: not an id",
					  f->path);
		cfg->bos_token_id = (int32_t)json_integer_value(bos);
		*have_bos = true;
	}
	return 0;
}

static int parse_sizes(const struct hf_json *f, struct model_config *cfg, char *err,
		       size_t errlen)
{
	json_t *r = f->root;
	int rc;

	if ((rc = hf_int(f, r, "vocab_size", true, 0, &cfg->vocab_size, err, errlen)) ||
	    (rc = hf_int(f, r, "hidden_size", true, 0, &cfg->hidden_size, err, errlen)) ||
	    (rc = hf_int(f, r, "intermediate_size", false, 0, &cfg->intermediate_size, err,
			  errlen)) ||
	    (rc = hf_int(f, r, "num_hidden_layers", true, 0, &cfg->n_layers, err, errlen)) ||
	    (rc = hf_int(f, r, "num_attention_heads", true, 0, &cfg->n_heads, err, errlen)))
		return rc;
	if (cfg->n_heads == 0)
		return atlas_errf(err, errlen, -EINVAL,
				  "%s: key num_attention_heads: must be positive", f->path);
	if ((rc = hf_int(f, r, "num_key_value_heads", false, cfg->n_heads, &cfg->n_kv_heads, err,
			  errlen)) ||
	    (rc = hf_int(f, r, "head_dim", false, cfg->hidden_size / cfg->n_heads, &cfg->head_dim,
			  err, errlen)) ||
	    (rc = hf_int(f, r, "max_position_embeddings", false, 0,
			 &cfg->max_position_embeddings, err, errlen)))
		return rc;

	static const char *const positive[] = { "vocab_size", "hidden_size",
						"num_hidden_layers", "num_key_value_heads",
						"head_dim" };
	const int values[] = { cfg->vocab_size, cfg->hidden_size, cfg->n_layers, cfg->n_kv_heads,
			       cfg->head_dim };
	for (size_t i = 0; i < ATLAS_ARRAY_LEN(positive); i++)
		if (values[i] <= 0)
			return atlas_errf(err, errlen, -EINVAL, "%s: key %s: must be positive",
					  f->path, positive[i]);
	if (cfg->n_layers > MODEL_MAX_LAYERS)
		return atlas_errf(err, errlen, -ENOTSUP,
				  "%s: key num_hidden_layers: %d is more than %d", f->path,
				  cfg->n_layers, MODEL_MAX_LAYERS);
	if (cfg->n_heads % cfg->n_kv_heads)
		return atlas_errf(err, errlen, -EINVAL,
				  "%s: key num_key_value_heads: %d does not divide %d heads",
				  f->path, cfg->n_kv_heads, cfg->n_heads);
	if (cfg->head_dim % 2)
		return atlas_errf(err, errlen, -EINVAL, "%s: key head_dim: %d is odd", f->path,
				  cfg->head_dim);
	return 0;
}

/* What the family wrote: a context length and layer kinds that add up. */
static int check_layers(const struct hf_json *f, const struct model_config *cfg, char *err,
			size_t errlen)
{
	int count[2] = { 0, 0 };

	if (cfg->max_position_embeddings <= 0)
		return atlas_errf(err, errlen, -EINVAL,
				  "%s: key max_position_embeddings: must be positive", f->path);
	for (int l = 0; l < cfg->n_layers; l++) {
		const struct model_layer *y = &cfg->layers[l];
		if (y->mixer > MODEL_MIXER_LINEAR || y->cache != count[y->mixer]++)
			return atlas_errf(err, errlen, -EINVAL,
					  "%s: %s: layer %d: bad layer kind or cache index",
					  f->path, cfg->architecture, l);
	}
	/* intermediate_size: what every dense MLP needs (an all-MoE model,
	 * Qwen3.5's, may leave it out) */
	if (cfg->n_moe_layers < cfg->n_layers && cfg->intermediate_size <= 0)
		return atlas_errf(err, errlen, -EINVAL,
				  "%s: key intermediate_size: missing or not positive", f->path);
	if (count[MODEL_MIXER_ATTENTION] != cfg->n_attention_layers ||
	    count[MODEL_MIXER_LINEAR] != cfg->n_linear_layers ||
	    (cfg->n_linear_layers > 0) != (cfg->linear_state_floats > 0))
		return atlas_errf(err, errlen, -EINVAL, "%s: %s: layer counts do not add up",
				  f->path, cfg->architecture);
	return 0;
}

static int parse_config(const struct hf_json *f, struct model_config *cfg, char *err,
			size_t errlen)
{
	json_t *r = f->root;
	double eps;
	int variant = 0, rc;

	if ((rc = parse_architecture(f, cfg, &variant, err, errlen)) ||
	    (rc = parse_sizes(f, cfg, err, errlen)) || (rc = parse_dtype(f, cfg, err, errlen)) ||
	    (rc = parse_rope(f, cfg, err, errlen)))
		return rc;

	json_t *act = hf_get(r, "hidden_act");
	if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0))
		return atlas_errf(err, errlen, -ENOTSUP,
				  "%s: key hidden_act: %s is not supported (silu)", f->path,
				  json_is_string(act) ? json_string_value(act) : "(not a string)");

	bool sliding = false;
	if ((rc = hf_double(f, r, "rms_norm_eps", false, 1e-6, &eps, err, errlen)) ||
	    (rc = hf_bool(f, r, "tie_word_embeddings", false, &cfg->tie_word_embeddings, err,
			   errlen)) ||
	    (rc = hf_bool(f, r, "attention_bias", false, &cfg->attention_bias, err, errlen)) ||
	    (rc = hf_bool(f, r, "mlp_bias", false, &cfg->mlp_bias, err, errlen)) ||
	    (rc = hf_bool(f, r, "use_sliding_window", false, &sliding, err, errlen)))
		return rc;
	if (!(eps > 0))
		return atlas_errf(err, errlen, -EINVAL, "%s: key rms_norm_eps: must be positive",
				  f->path);
	cfg->rms_norm_eps = (float)eps;
	if (sliding)
		return atlas_errf(err, errlen, -ENOTSUP,
				  "%s: key use_sliding_window: sliding windows are not supported",
				  f->path);
	/* The layers of a multi-token-prediction head (Qwen3-Next and Qwen3.5
	 * spell it mtp_num_hidden_layers, DeepSeek-V3 num_nextn_predict_layers). */
	const char *mtp_key = hf_get(r, "mtp_num_hidden_layers") ? "mtp_num_hidden_layers"
								 : "num_nextn_predict_layers";
	if ((rc = hf_int(f, r, mtp_key, false, 0, &cfg->n_mtp_layers, err, errlen)))
		return rc;
	if (cfg->n_mtp_layers < 0 || cfg->n_mtp_layers > MODEL_MAX_MTP_LAYERS)
		return atlas_errf(err, errlen, -EINVAL, "%s: key %s: %d is not in [0, %d]", f->path,
				  mtp_key, cfg->n_mtp_layers, MODEL_MAX_MTP_LAYERS);
	if ((rc = cfg->family->parse_config(f, variant, cfg, err, errlen)))
		return rc;
	return check_layers(f, cfg, err, errlen);
}

int model_config_parse(const struct hf_json *conf, const struct hf_json *gen,
		       struct model_config *cfg, char *err, size_t errlen)
{
	bool have_eos = false, have_bos = false;
	int rc;

	memset(cfg, 0, sizeof *cfg);
	cfg->bos_token_id = -1;
	rc = parse_config(conf, cfg, err, errlen);
	if (!rc && gen)
		rc = parse_special_ids(gen, cfg, &have_eos, &have_bos, err, errlen);
	if (!rc)
		rc = parse_special_ids(conf, cfg, &have_eos, &have_bos, err, errlen);
	return rc;
}

int model_config_load(const char *dir, struct model_config *cfg, char *err, size_t errlen)
{
	struct hf_json conf, gen;
	int rc;

	rc = load_json(dir, "config.json", true, &conf, err, errlen);
	if (rc)
		return rc;
	rc = load_json(dir, "generation_config.json", false, &gen, err, errlen);
	if (rc)
		goto out_conf;
	rc = model_config_parse(&conf, gen.root ? &gen : NULL, cfg, err, errlen);
	json_decref(gen.root);
out_conf:
	json_decref(conf.root);
	return rc;
}

/* As transformers computes it: the default frequencies base^(-2i/D) in f32,
 * then for llama3 the wavelength bands of _compute_llama3_parameters: long
 * wavelengths divided by factor, short ones kept, the middle interpolated. */
void model_rope_inv_freq(const struct model_config *cfg, float *inv_freq)
{
	const int half = cfg->rope_dim / 2;
	const float base = (float)cfg->rope_theta;

	for (int i = 0; i < half; i++)
		inv_freq[i] = 1.0f / powf(base, (float)(2 * i) / (float)cfg->rope_dim);
	if (cfg->rope_type != MODEL_ROPE_LLAMA3)
		return;

	const float factor = (float)cfg->rope_factor;
	const float low = (float)cfg->rope_low_freq_factor;
	const float high = (float)cfg->rope_high_freq_factor;
	const float old_len = (float)cfg->rope_original_max_position;
	const float low_freq_wavelen = old_len / low;
	const float high_freq_wavelen = old_len / high;

	for (int i = 0; i < half; i++) {
		const float wavelen = (float)(2 * M_PI) / inv_freq[i];
		if (wavelen > low_freq_wavelen) {
			inv_freq[i] /= factor;
		} else if (!(wavelen < high_freq_wavelen)) {
			const float smooth = (old_len / wavelen - low) / (high - low);
			inv_freq[i] = (1 - smooth) * inv_freq[i] / factor + smooth * inv_freq[i];
		}
	}
}
