/* The public API of the atlas inference engine: engine, session, turn, stats.
 *
 * Handles are opaque. All functions are thread-safe and return quickly: none
 * waits for generation. One engine thread per engine owns the scheduler and
 * the backend; it appends text to a turn's output and then calls the notify
 * callback, so that a reader parked on that session can be woken.
 *
 * A model directory without tokenizer files works through token ids: a prompt
 * is then decimal ids separated by spaces, commas or newlines, and the output
 * is each generated id followed by a space, the turn ending with a newline.
 *
 * Text that crosses this API is UTF-8. Output is released a whole character
 * at a time, and text that could still become a stop string is held back until
 * it is known not to be one.
 */
#ifndef ATLAS_ENGINE_ENGINE_H
#define ATLAS_ENGINE_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"

struct atlas_engine;
struct atlas_session;

enum atlas_state {
	ATLAS_STATE_IDLE,     /* no turn pending */
	ATLAS_STATE_QUEUED,   /* a turn waits for a slot */
	ATLAS_STATE_PREFILL,  /* reading its prompt */
	ATLAS_STATE_DECODE,   /* generating */
	ATLAS_STATE_PARKED,   /* preempted: KV released, resumes when memory frees */
	ATLAS_STATE_ERROR,    /* the newest turn failed; last_error says why */
};
const char *atlas_state_name(enum atlas_state s);

enum atlas_tier { ATLAS_TIER_DEVICE, ATLAS_TIER_HOST, ATLAS_TIER_DISK, ATLAS_TIERS };
const char *atlas_tier_name(enum atlas_tier t);

/* ---- engine ---- */

/* The prompt tokens of one step that c gives: its chunk_size, or for 0 the
 * default of the backend c->backend opens here (ATLAS_CHUNK_SIZE_*_AUTO). */
int atlas_chunk_size(const struct atlas_config *c);

/* Load the model atlas_config_model_dir(cfg) names, open the backend and start the engine
 * thread. cfg is copied; its chunk_size as atlas_chunk_size gives it. */
int atlas_engine_open(const struct atlas_config *cfg, struct atlas_engine **out, char *err,
		      size_t errlen);
/* Stop the engine thread, end every turn (ECANCELED) and free everything.
 * Every session must have been closed. */
void atlas_engine_close(struct atlas_engine *e);

/* Called on the engine thread, with no engine lock held, whenever a session's
 * output grows, its turn ends or its state changes. It must not block. */
typedef void (*atlas_notify_fn)(void *ctx, struct atlas_session *s);
void atlas_engine_set_notify(struct atlas_engine *e, atlas_notify_fn fn, void *ctx);

/* ---- sessions ---- */

/* A new session named `name` (unique; [A-Za-z0-9_.-], at most 63 bytes) with
 * the config's default settings, or the session of that name that kv_persist
 * brought back (its settings, turns and KV), if no handle has it yet.
 * -EEXIST, -EINVAL, -EMFILE (max_sessions). */
int atlas_session_open(struct atlas_engine *e, const char *name, struct atlas_session **out,
		       char *err, size_t errlen);
/* Cancel its turns, free its KV and forget it. The handle is invalid after. */
void atlas_session_close(struct atlas_session *s);
const char *atlas_session_name(const struct atlas_session *s);

/* Settings: what the session's ctl file shows and takes. */
struct atlas_params {
	float temperature;              /* 0 = greedy */
	float top_p;                    /* (0, 1], 1 = off */
	int top_k;                      /* 0 = off */
	int max_tokens;                 /* generated tokens per turn, >= 1 */
	uint64_t seed;
	enum atlas_mode mode;           /* chat or raw (never auto once a session exists) */
	bool ignore_eos;                /* generate max_tokens even past end-of-sequence
					 * tokens (benchmarks) */
	enum atlas_spec spec;           /* speculative decoding: off, auto, ngram, draft, mtp */
	int spec_k;                     /* most draft tokens one verify checks, 1..ATLAS_SPEC_K_MAX */
	int n_stop;
	char stop[ATLAS_STOP_MAX][ATLAS_STOP_LEN];
	char system[ATLAS_SYSTEM_MAX];  /* chat mode's system prompt, "" for none */
};

void atlas_session_get_params(struct atlas_session *s, struct atlas_params *out);
/* Whether p is valid for this session's model (e.g. chat mode needs a chat
 * template), without applying it. */
int atlas_session_check_params(struct atlas_session *s, const struct atlas_params *p, char *err,
			       size_t errlen);
/* Validate and apply; on error nothing changes. Applies to turns that start after. */
int atlas_session_set_params(struct atlas_session *s, const struct atlas_params *p, char *err,
			     size_t errlen);

/* Parse one `key value` setting into p (value: the rest of the line, with
 * \n \t \\ escapes for stop and system). `stop` appends a stop string; the
 * first `stop` of a batch of lines replaces the list, which the caller marks
 * by clearing *stop_seen before the batch. An empty value clears. */
int atlas_params_parse(struct atlas_params *p, const char *key, const char *value,
		       bool *stop_seen, char *err, size_t errlen);
/* Render p as `key value` lines, escaped so that atlas_params_parse reads them
 * back. Returns the length written (snprintf semantics). */
size_t atlas_params_format(const struct atlas_params *p, char *buf, size_t len);

/* ---- turns ---- */

/* A prompt that was not accepted before it reached the engine (a failed
 * write of it, text that is not UTF-8): a turn that fails at once with msg,
 * so that status shows it and a reader waiting for the next turn ends with
 * the error. -EBUSY (nothing recorded) while a turn runs. */
int atlas_session_reject(struct atlas_session *s, const char *msg);
/* Append a turn with this prompt (chat mode wraps it in the model's chat
 * template) and queue it. Returns the turn number (1, 2, ...) or a negative
 * errno: -EBUSY if a turn is still running, -ENOMEM. The text is copied and
 * tokenized later, on the engine's intake thread, so that this returns at
 * once whatever the prompt's length: a prompt the template or the tokenizer
 * refuses (bad UTF-8 included), one without tokens and one that does not fit
 * the context fail their turn with EIO and a message (status last_error),
 * and their text is not kept in the history. */
int atlas_session_submit(struct atlas_session *s, const char *text, size_t len, char *err,
			 size_t errlen);
/* The same with token ids (raw: appended as they are), checked here:
 * -EINVAL for an id outside the vocabulary. */
int atlas_session_submit_tokens(struct atlas_session *s, const int32_t *ids, size_t n,
				char *err, size_t errlen);
/* A hint that a turn comes soon (its prompt is being written): the engine
 * starts bringing the session's KV back from the swap tier, if it is there
 * and the device has room. Returns at once. */
void atlas_session_prefetch(struct atlas_session *s);
/* End the running or queued turn (its output ends with ECANCELED). */
void atlas_session_cancel(struct atlas_session *s);
/* Cancel, forget every turn and free the session's KV. */
void atlas_session_reset(struct atlas_session *s);

/* The newest turn's number, 0 if none yet. */
uint64_t atlas_session_newest_turn(struct atlas_session *s);

struct atlas_read {
	size_t n;        /* bytes copied into buf */
	bool more;       /* the turn may still produce bytes after off + n */
	int error;       /* when !more: 0 (ended normally) or -EIO / -ECANCELED */
};
/* Copy output of `turn` from byte offset `off`. Never blocks: if nothing is
 * available yet, r->n = 0 and r->more = true. A turn that has been forgotten
 * (reset) or dropped (history_max) reads as ended with -ECANCELED. */
int atlas_session_read(struct atlas_session *s, uint64_t turn, uint64_t off, char *buf,
		       size_t len, struct atlas_read *r);

/* The token ids of `turn`: what its prompt added to the context (template
 * included) and what it generated so far (malloc'd; caller frees both).
 * -ENOENT for a turn that does not exist (or was forgotten, or dropped for
 * history_max). */
int atlas_session_turn_tokens(struct atlas_session *s, uint64_t turn, int32_t **prompt,
			      size_t *n_prompt, int32_t **generated, size_t *n_generated);

/* The transcript as text (malloc'd, NUL-terminated; caller frees): when
 * history_max dropped the oldest turns, a line that counts them
 * ("### N earlier turns dropped (history_max)"); then per turn "### turn N
 * user" (raw mode: prompt), its prompt, "### turn N assistant" (output),
 * the answer so far, and once the turn has ended "### turn N end: FINISH".
 * Between resets and drops it only grows, so that a reader that follows it
 * (tail -f) reads on from where it was. */
int atlas_session_history(struct atlas_session *s, char **text, size_t *len);
/* Bytes of that transcript now, and of the answer text of every turn since
 * the last reset (dropped ones too), without making the text. */
int atlas_session_sizes(struct atlas_session *s, uint64_t *history, uint64_t *answers);

struct atlas_session_status {
	enum atlas_state state;
	int slot;                         /* engine slot, -1 when none */
	uint64_t turns;                   /* turns submitted */
	uint64_t prompt_tokens;           /* newest turn: tokens its prompt added */
	uint64_t generated_tokens;        /* newest turn: tokens generated */
	uint64_t context_tokens;          /* tokens in the session's context */
	uint64_t context_max;             /* the context limit */
	uint32_t kv_blocks[ATLAS_TIERS];  /* KV blocks held, per tier */
	double ttft_s;                    /* newest turn: submit to first token, -1 if none yet */
	double tokens_per_s;              /* newest turn: decode rate, 0 if none yet */
	char finish[16];                  /* newest turn: "", "stop", "length", "eos", "error", "cancelled" */
	char last_error[256];             /* "" if none */
};
int atlas_session_status(struct atlas_session *s, struct atlas_session_status *st);

/* ---- engine-wide stats (ctl/ files): one consistent snapshot ---- */

#define ATLAS_MAX_SLOTS 256
#define ATLAS_SPEC_POSITIONS ATLAS_SPEC_K_MAX

struct atlas_slot_stats {
	int slot;
	char session[64];                 /* "" when free */
	enum atlas_state state;
	uint64_t position;                /* tokens in the sequence's KV */
	uint32_t kv_blocks[ATLAS_TIERS];
	double draft_acceptance;          /* 0..1 of its session's draft tokens, 0 without any */
	char spec[8];                     /* its speculation now: "off", the drafter of its
					   * drafts ("ngram", "draft"), or "gated" (drafts would
					   * not pay; prompt lookup keeps checking them against
					   * the tokens that come, a draft model tries again
					   * every so often) */
	double tokens_per_s;
};

struct atlas_kv_stats {
	uint32_t block_size;
	uint64_t blocks_used[ATLAS_TIERS], blocks_total[ATLAS_TIERS];
	uint64_t bytes_per_block;
	uint64_t swap_out_bytes_total, swap_in_bytes_total;
	uint64_t swap_out_ops_total, swap_in_ops_total;
	double read_latency_p50_s, read_latency_p99_s;
	uint64_t prefetch_hits_total;     /* turns whose KV a prefetch hint had brought back */
	uint64_t prefetch_misses_total;   /* turns hinted whose KV was not back yet */
	uint64_t swap_errors_total;       /* block moves that failed (a write keeps its source) */
	uint64_t swap_drops_total;        /* sequences whose KV was dropped: no room to park */
	uint32_t parked_sessions;
	uint64_t preemptions_total;       /* running sequences that gave their KV back */
	uint64_t evictions_total;         /* idle sessions that gave their KV back */
	uint64_t staged_blocks_total;     /* blocks attention read through staging (each step
					   * counts each of its streamed blocks once) */
	uint64_t staged_bytes_total;      /* bytes those reads moved, all layers */
};

/* Drafters, in ctl/spec's order: prompt lookup, the draft model, the MTP head. */
#define ATLAS_SPEC_DRAFTERS 3

struct atlas_spec_stats {
	char method[16];                  /* a new session's spec setting: "off", "auto",
					   * "ngram", "draft", "mtp" */
	char draft_model[ATLAS_PATH_MAX]; /* the draft model's directory, "" without one */
	bool mtp_head;                    /* the model's MTP head is loaded */
	uint64_t drafts_total;            /* verifications of one session's drafts */
	uint64_t draft_tokens_total;      /* draft tokens verified */
	uint64_t accepted_tokens_total;   /* draft tokens the model agreed with */
	struct {
		char name[8];             /* "ngram", "draft", "mtp" */
		uint64_t drafts_total, draft_tokens_total, accepted_tokens_total;
		double seconds_per_token; /* its model's time per draft token of one session
					   * (0: runs no model, or not measured) */
	} by_drafter[ATLAS_SPEC_DRAFTERS];
	uint64_t draft_errors_total;      /* drafter model runs that failed (their sessions
					   * decoded without drafts) */
	uint64_t gated_total;             /* decode steps of sessions whose gate held drafts back */
	double acceptance_by_position[ATLAS_SPEC_POSITIONS];  /* accepted / verified, by the
							       * draft token's place */
	double mean_accepted_length;      /* accepted draft tokens per verification (the step
					   * makes one more token than that) */
	double step_seconds_decode;       /* the gate's cost model: a step of one decode row */
	double step_seconds_verify[ATLAS_SPEC_POSITIONS];  /* ... of one row and k drafts,
							    * k = 1..8 (0: not measured) */
};

/* Expert parallelism (ctl/ep): the group, and each rank (DESIGN §10). */
#define ATLAS_EP_RANKS 16

struct atlas_ep_rank {
	char state[8];                    /* "head", "up", "ready" (joined, waiting for the
					   * next epoch), "absent", "gone" */
	char host[64], device[128];
	int expert_first, expert_last;    /* the experts it holds */
	char why[160];                    /* "gone": what happened */
};

struct atlas_ep_stats {
	int ranks, hosts, experts_per_rank;  /* experts_per_rank: the most any rank holds */
	bool up;                          /* every rank is in the running epoch */
	unsigned epoch;
	char why[256];                    /* !up: why */
	char address[256];                /* where the head listens, "" with ep = 1 */
	uint64_t collectives_total, collective_bytes_total;
	double collective_seconds_total;
	uint64_t commands_total, command_bytes_total; /* step commands sent to the workers */
	uint64_t epochs_lost_total;
	struct atlas_ep_rank rank[ATLAS_EP_RANKS];
};

/* Latency histograms of turns (ctl/metrics, as vLLM's): the same bucket
 * bounds, in seconds, for all; bucket[i] counts the observations in
 * (bound[i-1], bound[i]], the last bucket those above the last bound. */
#define ATLAS_LAT_BUCKETS 16
extern const double atlas_lat_bounds[ATLAS_LAT_BUCKETS - 1];
struct atlas_lat_hist {
	uint64_t count;
	double sum_s;
	uint64_t bucket[ATLAS_LAT_BUCKETS];
};

/* How turns end: the finish of sK/status. */
enum atlas_finish { ATLAS_FINISH_STOP, ATLAS_FINISH_LENGTH, ATLAS_FINISH_EOS,
		    ATLAS_FINISH_ERROR, ATLAS_FINISH_CANCELLED, ATLAS_FINISH_N };
extern const char *const atlas_finish_names[ATLAS_FINISH_N];

struct atlas_turn_stats {
	struct atlas_lat_hist ttft;       /* commit to first token */
	struct atlas_lat_hist itl;        /* between two tokens of a turn */
	struct atlas_lat_hist queue;      /* commit to the turn's first engine step */
	uint64_t finished[ATLAS_FINISH_N];        /* turns ended, by finish */
};

struct atlas_engine_stats {
	char model[ATLAS_PATH_MAX];       /* model directory */
	char architecture[64];            /* "Qwen3ForCausalLM" */
	uint64_t parameters;
	char dtype[16];                   /* weights as stored in the files */
	char backend[16];
	char device[128];
	uint64_t memory_total, weights_bytes, kv_bytes;
	uint64_t step_weight_bytes;       /* weights one decode step reads (an untied
					   * input embedding only by row: not counted) */
	uint64_t kv_bytes_per_token;      /* K and V of one position, all layers */
	uint64_t expert_bytes;            /* of step_weight_bytes, the experts of MoE layers
					   * (this rank's): a token reads experts_per_token of
					   * each layer's experts */
	int experts, experts_per_token;   /* 0, 0 without MoE layers */
	int layers, hidden_size, heads, kv_heads, head_dim, vocab_size, context;
	uint64_t sessions, turns_total, prompt_tokens_total, generated_tokens_total;
	uint64_t steps_total, step_tokens_total;
	double busy_seconds_total;        /* engine thread time spent in steps */
	double uptime_s;
	int n_slots;
	struct atlas_slot_stats slots[ATLAS_MAX_SLOTS];
	struct atlas_kv_stats kv;
	struct atlas_spec_stats spec;
	struct atlas_ep_stats ep;
	struct atlas_turn_stats turns;
};
int atlas_engine_stats(struct atlas_engine *e, struct atlas_engine_stats *out);

/* ---- kept sessions (kv_persist) ---- */

/* Keep every session for the next start: end running turns (cancelled),
 * move all KV to the disk tier and write the manifest in kv_dir. Nothing
 * runs after it; close the engine next. Blocks until done; 0 without
 * kv_persist. */
int atlas_engine_persist(struct atlas_engine *e, char *err, size_t errlen);
/* Names of the sessions this start brought back that no atlas_session_open
 * has taken yet (at most max into names); returns how many there are. */
int atlas_engine_kept(struct atlas_engine *e, char (*names)[64], int max);

/* ---- expert parallelism ---- */

/* Be rank `rank` (1 .. ep-1) of the group whose head listens at
 * cfg->ep_address (DESIGN §10): load the shared layers and this rank's
 * experts and run the head's step commands, joining again whenever an
 * epoch ends. Returns 0 when its head went away for ep_join_timeout after
 * it served, an error when the head refused it (a mismatch, err says
 * which) or never answered. */
int atlas_ep_worker_run(const struct atlas_config *cfg, int rank, char *err, size_t errlen);

/* ---- tools: tokenizer and raw logits (the CLI, tests) ---- */

struct atlas_tokenizer;
/* The engine's tokenizer, NULL if the model directory has none. */
const struct atlas_tokenizer *atlas_engine_tokenizer(struct atlas_engine *e);
int atlas_engine_vocab_size(struct atlas_engine *e);
/* Logits of every position of one fresh sequence, [n × vocab] f32 row-major,
 * computed by the engine thread through the same forward path as sessions
 * (prefill chunks of cfg->chunk_size). */
int atlas_engine_logits(struct atlas_engine *e, const int32_t *ids, size_t n, float *out,
			char *err, size_t errlen);

#endif
