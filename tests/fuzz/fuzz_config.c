/* Fuzz target: config.json through model_config_parse, as a model's
 * config.json; an input with a NUL byte is split there, the rest being its
 * generation_config.json. A configuration it accepts must give rotary
 * frequencies (model_rope_inv_freq) without faults. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/hf_json.h"
#include "engine/model/internal.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *nul = memchr(data, 0, size);
	size_t conf_len = nul ? (size_t)(nul - data) : size;
	struct hf_json conf = { .path = "config.json" }, gen = { .path = "generation_config.json" };
	conf.root = json_loadb((const char *)data, conf_len, JSON_REJECT_DUPLICATES, NULL);
	if (nul)
		gen.root = json_loadb((const char *)nul + 1, size - conf_len - 1,
				      JSON_REJECT_DUPLICATES, NULL);
	if (json_is_object(conf.root) && (!gen.root || json_is_object(gen.root))) {
		struct model_config cfg;
		char err[512];
		if (model_config_parse(&conf, gen.root ? &gen : NULL, &cfg, err, sizeof err) == 0 &&
		    cfg.rope_dim > 0) {
			float *inv = malloc((size_t)cfg.rope_dim / 2 * sizeof *inv + 1);
			model_rope_inv_freq(&cfg, inv);
			free(inv);
		}
	}
	json_decref(conf.root);
	json_decref(gen.root);
	return 0;
}
