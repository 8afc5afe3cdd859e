/* Reading the keys of a Hugging Face config.json: the helpers that the
 * common part of the configuration (hf_config.c) and each family's own keys
 * (engine/model/<family>/) share, so that every message names the file and
 * the key the same way.
 *
 * A key whose value is JSON null counts as absent, as transformers treats it.
 */
#ifndef ATLAS_ENGINE_MODEL_HF_JSON_H
#define ATLAS_ENGINE_MODEL_HF_JSON_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/* A parsed JSON object and the file it came from (for messages). */
struct hf_json {
	char path[4096];
	json_t *root;                   /* a JSON object; owned by whoever loaded it */
};

/* obj[key], NULL when obj is NULL, the key is absent or its value is null. */
json_t *hf_get(json_t *obj, const char *key);

/* obj[key] as a non-negative int, or def when absent and not required. */
int hf_int(const struct hf_json *f, json_t *obj, const char *key, bool required, int def,
	   int *out, char *err, size_t errlen);
/* obj[key] as a number, or def when absent and not required. */
int hf_double(const struct hf_json *f, json_t *obj, const char *key, bool required, double def,
	      double *out, char *err, size_t errlen);
/* obj[key] as true or false, or def when absent. */
int hf_bool(const struct hf_json *f, json_t *obj, const char *key, bool def, bool *out,
	    char *err, size_t errlen);

#endif
