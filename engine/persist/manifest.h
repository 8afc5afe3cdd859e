/* The manifest of kept sessions (kv_persist): what a stopping atlasd writes
 * next to the disk tier's named block file, and a starting one reads back.
 *
 * One JSON file, kv_dir/atlas-sessions.json, written whole to a temporary
 * name, synced and renamed over the old one, so a reader sees the previous
 * manifest or the new one, never half of one. It holds what the blocks need
 * to be trusted (the model's and the vocabulary's fingerprints, the block
 * geometry) and each session's name, settings, turns, context tokens and
 * the disk slots and hashes of its KV blocks. Text that is not UTF-8 (a raw
 * prompt may be any bytes) is kept as {"hex": "..."}.
 *
 * This file knows JSON and the structures below, nothing of the engine.
 */
#ifndef ATLAS_ENGINE_PERSIST_MANIFEST_H
#define ATLAS_ENGINE_PERSIST_MANIFEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PERSIST_MANIFEST "atlas-sessions.json"
#define PERSIST_BLOCKS "atlas-kv.blocks"
#define PERSIST_VERSION 1

struct persist_turn {
	uint64_t number;
	int mode;                   /* enum atlas_mode */
	char *prompt;               /* [prompt_len] owned */
	size_t prompt_len;
	size_t ctx_start, n_prompt, n_generated;
	char *out;                  /* [out_len] owned */
	size_t out_len;
	int error;                  /* 0 or a negative errno */
	char finish[16];
};

struct persist_session {
	char name[64];
	char *params;               /* atlas_params_format's lines; owned */
	uint64_t first_turn, next_turn;
	bool ended_with_eot;
	char last_error[256];
	int32_t *tokens;            /* [n_tokens] the context; owned */
	size_t n_tokens;
	int kv_tokens;              /* positions whose KV the blocks hold, 0: none kept */
	uint32_t *slots;            /* [n_blocks] disk slots of the named file; owned */
	uint64_t *sums;             /* [n_blocks] XXH3-64 of each slot's data; owned */
	int n_blocks;
	struct persist_turn *turns; /* [n_turns] owned */
	size_t n_turns;
};

struct persist_manifest {
	uint64_t model_id, vocab_id;    /* identity.h */
	int block_size;                 /* tokens per KV block */
	uint64_t block_bytes;           /* bytes of one block in memory */
	uint64_t slot_bytes;            /* bytes of one slot of the block file */
	struct persist_session *sessions;   /* [n_sessions] owned */
	size_t n_sessions;
};

/* Write m as dir/PERSIST_MANIFEST (atomically, synced). */
int persist_manifest_write(const char *dir, const struct persist_manifest *m, char *err,
			   size_t errlen);
/* Read dir/PERSIST_MANIFEST into m: -ENOENT when there is none, -EINVAL
 * (err says where) when it is not one this version wrote. */
int persist_manifest_read(const char *dir, struct persist_manifest *m, char *err, size_t errlen);
void persist_manifest_free(struct persist_manifest *m);
void persist_session_free(struct persist_session *s);

#endif
