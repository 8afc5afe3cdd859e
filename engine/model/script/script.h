/* The scripted family: AtlasScriptForCausalLM (model_type atlas_script), a
 * model whose answers are scripted, for testing the filesystem and pipelines
 * without weights (tests/fs/script-model, made by tools/mkscriptmodel.py).
 *
 * Vocabulary, fixed: ids 0-255 are the bytes, then
 *     256 <|endoftext|>  end of sequence          259 <|answer|>  a raw answer starts
 *     257 <|im_start|>   ChatML turn header       260 <|wait|>    a step without text
 *     258 <|im_end|>     end of turn
 *
 * The next token is a pure function of the sequence's context, read back
 * from the model's paged KV cache, so that it stays right when the engine
 * batches sequences, chunks prompts, preempts and recomputes.
 *
 * The answer being written is what follows the last opener of the context,
 * unless an end token (256 or 258) follows that opener:
 *   chat   opener `<|im_start|>assistant\n`; the question is the user text
 *          of the last `<|im_start|>user\n ... <|im_end|>` before it;
 *   raw    opener `<|answer|>`; the question is the text between the end
 *          token before it (or the start) and it, trailing newlines removed.
 * A context with no open answer is a raw prompt: the next token is
 * `<|answer|>`, which decodes to no text.
 *
 * The answer is the question reversed character by character (UTF-8, one
 * byte per token), then the end token of its mode (`<|im_end|>` in chat,
 * `<|endoftext|>` in raw): the engine ends the turn with finish "eos". A
 * question that starts with a script word scripts its turn:
 *   SLEEP ms TEXT  TEXT reversed; the forward of every step that emits a
 *                  token of this answer (its end included) sleeps ms
 *                  (decimal, at most SCRIPT_SLEEP_MAX_MS);
 *   FAIL TEXT      TEXT reversed, then the forward fails with -EIO where
 *                  the end token would come: the engine fails the step's
 *                  turns with EIO;
 *   SLOW TEXT      TEXT reversed, then `<|wait|>` tokens, each step sleeping
 *                  SCRIPT_WAIT_MS, until the turn is cancelled or reaches
 *                  max_tokens.
 * A word not followed by what it wants is plain text. A step sleeps once, as
 * long as the longest of its rows asks.
 *
 * Chat mode closes the previous answer in the context itself. Raw mode does
 * not: after an answer that did not end with its end token (cancelled,
 * failed, max_tokens, a stop string), a raw prompt reads as more of that
 * answer; write `reset` to ctl before it.
 *
 * The forward embeds each row's id as two small integers (id / 256, id %
 * 256: exact in bf16 and f16 too) with a fixed table, stores them as K and
 * V of its one attention layer (1 kv head, head_dim 2), and for every row
 * that wants logits downloads its sequence's block-table row and K rows,
 * decides the next token and uploads logits that make it the argmax by
 * SCRIPT_LOGIT_MARGIN. It works on every backend through kt_embed,
 * kt_kv_store, kt_download and kt_upload; the host round trip of every step
 * is fine for a test model. On cuda, a decode step's CUDA graph cannot be
 * recorded (the downloads) and is logged once per graph key; its steps then
 * run op by op (cuda_graphs = false avoids the log lines).
 *
 * script_rules.c decides the next token; script.c is the family entry and
 * the forward pass.
 */
#ifndef ATLAS_ENGINE_MODEL_SCRIPT_H
#define ATLAS_ENGINE_MODEL_SCRIPT_H

#include <stdint.h>

#include "engine/model/family.h"
#include "engine/model/internal.h"

enum script_token {
	SCRIPT_EOS = 256,
	SCRIPT_IM_START,
	SCRIPT_IM_END,
	SCRIPT_ANSWER,
	SCRIPT_WAIT,
	SCRIPT_VOCAB,                   /* vocab_size of config.json */
};

#define SCRIPT_SLEEP_MAX_MS 10000
#define SCRIPT_WAIT_MS 20
/* Logits: the next token 0, every other one -SCRIPT_LOGIT_MARGIN; even at
 * temperature 100 another token has a probability below 1e-40. */
#define SCRIPT_LOGIT_MARGIN 1e4f

extern const struct model_family script_family;

/* What comes after a context. */
struct script_next {
	int32_t token;                  /* the next token; -1: the step fails (FAIL) */
	unsigned sleep_ms;              /* the step that emits it sleeps this long */
};

/* The next token after ctx[0..n) (script_rules.c). */
void script_next(const int32_t *ctx, int n, struct script_next *out);

#endif
