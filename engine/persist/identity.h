/* What persisted KV and tokens must match to be used again (kv_persist):
 * fingerprints of a model directory, XXH3-64 over its files.
 *
 *   model  every *.json and *.safetensors file's name and size, the whole of
 *          each JSON file, the first and last MiB of each weights file, and
 *          the backend's name (KV computed on another backend differs in its
 *          last bits, which would break the exactness of a continuation).
 *          Reading every weight would take as long as loading them; a
 *          different checkpoint of the same shapes differs in those MiB.
 *   vocab  the tokenizer's files (tokenizer.json, tokenizer_config.json) and
 *          the vocabulary size: tokens saved under one vocab mean the same
 *          text under another with the same fingerprint.
 */
#ifndef ATLAS_ENGINE_PERSIST_IDENTITY_H
#define ATLAS_ENGINE_PERSIST_IDENTITY_H

#include <stddef.h>
#include <stdint.h>

struct persist_identity {
	uint64_t model;
	uint64_t vocab;
};

int persist_identity(const char *model_dir, const char *backend, int vocab_size,
		     struct persist_identity *id, char *err, size_t errlen);

#endif
