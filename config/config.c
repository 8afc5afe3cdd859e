/* The key table: every configuration key's one definition (section, type,
 * range, default, documentation), and typed parsing of key values. */
#include "config/config.h"
#include "config/keys.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/err.h"

static const char *const backend_names[] = { "auto", "cpu", "cuda", NULL };
static const char *const load_format_names[] = { "files", "dummy", NULL };
static const char *const mode_names[] = { "auto", "chat", "raw", NULL };
static const char *const spec_names[] = { "off", "auto", "ngram", "draft", "mtp", NULL };
static const char *const precision_names[] = { "f32", "bf16", NULL };
static const char *const log_level_names[] = { "error", "warn", "info", "debug", NULL };

/* offsetof(struct atlas_config, f), refusing to compile when f is not a T. */
#define FIELD(f, T) \
	(offsetof(struct atlas_config, f) + \
	 0 * sizeof(char[__builtin_types_compatible_p( \
		 __typeof__(((struct atlas_config *)0)->f), T) ? 1 : -1]))
#define FSIZE(f) sizeof(((struct atlas_config *)0)->f)

#define STRING(sec, f, d, text) \
	{ .section = sec, .name = #f, .type = KEY_STRING, .offset = offsetof(struct atlas_config, f), \
	  .size = FSIZE(f), .def = d, .doc = text }
#define CHOICE(sec, f, list, d, text) \
	{ .section = sec, .name = #f, .type = KEY_CHOICE, .offset = offsetof(struct atlas_config, f), \
	  .size = FSIZE(f), .names = list, .def = d, .doc = text }
#define ENUM(sec, f, T, list, d, text) \
	{ .section = sec, .name = #f, .type = KEY_ENUM, .offset = FIELD(f, T), .size = FSIZE(f), \
	  .names = list, .def = d, .doc = text }
#define INT(sec, f, lo, hi, d, text) \
	{ .section = sec, .name = #f, .type = KEY_INT, .offset = FIELD(f, int), .size = FSIZE(f), \
	  .imin = lo, .imax = hi, .def = d, .doc = text }
#define SIZE(sec, f, lo, hi, d, text) \
	{ .section = sec, .name = #f, .type = KEY_SIZE, .offset = FIELD(f, uint64_t), \
	  .size = FSIZE(f), .imin = lo, .imax = hi, .def = d, .doc = text }
#define U64(sec, f, d, text) \
	{ .section = sec, .name = #f, .type = KEY_U64, .offset = FIELD(f, uint64_t), \
	  .size = FSIZE(f), .def = d, .doc = text }
#define FLOAT(sec, f, lo, open, hi, d, text) \
	{ .section = sec, .name = #f, .type = KEY_FLOAT, .offset = FIELD(f, float), \
	  .size = FSIZE(f), .fmin = lo, .fmin_open = open, .fmax = hi, .def = d, .doc = text }
#define DOUBLE(sec, f, lo, hi, d, text) \
	{ .section = sec, .name = #f, .type = KEY_DOUBLE, .offset = FIELD(f, double), \
	  .size = FSIZE(f), .fmin = lo, .fmax = hi, .def = d, .doc = text }
#define BOOL(sec, f, d, text) \
	{ .section = sec, .name = #f, .type = KEY_BOOL, .offset = FIELD(f, bool), .size = FSIZE(f), \
	  .def = d, .doc = text }

#define MIB ((int64_t)1 << 20)
#define GIB ((int64_t)1 << 30)

/* Defaults suit a small CPU machine (2 cores, a few GB of memory); a GPU
 * host raises max_batch, kv_memory and sessions in its own file. */
const struct atlas_key atlas_keys[] = {
	STRING("model", model, "",
	       "Hugging Face model directory: config.json, the *.safetensors weights and, for "
	       "text prompts, tokenizer.json. Empty: the default model, atlas-next, where atlas "
	       "is installed (PREFIX/share/atlas/models/atlas-next), else in the source tree "
	       "it was built from, or the directory chosen when atlas was built (meson option "
	       "default_model)."),
	CHOICE("model", load_format, load_format_names, "files",
	       "files reads the weights from the model directory. dummy makes random weights of "
	       "a known shape on the device instead, for benchmarks without weight files: model "
	       "then names the shape (qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b, qwen3-14b, "
	       "llama-3.2-1b, llama-3.2-3b, llama-3.1-8b, atlas-tiny)."),

	CHOICE("engine", backend, backend_names, "auto",
	       "Compute backend: cpu, cuda, or auto (cuda when a CUDA device can be used, cpu "
	       "otherwise)."),
	INT("engine", device, 0, 255, "0", "CUDA device index, for the cuda backend."),
	INT("engine", threads, 0, 4096, "0",
	    "Worker threads of the cpu backend; 0 uses every online core."),
	CHOICE("engine", cpu_precision, precision_names, "bf16",
	       "Arithmetic of the cpu backend. bf16 keeps bf16 weight matrices and the KV cache "
	       "as bf16 (half the memory and memory traffic) and, on CPUs with AMX or "
	       "AVX512-BF16, rounds activations (and, with AMX, attention's softmax weights) to "
	       "bf16 and multiplies on those units: several times faster, logits within about "
	       "0.2 of f32 on the test models, the same tokens where the top two are apart. f32 "
	       "widens bf16 and f16 weights to f32 and multiplies exactly in f32: the reference, "
	       "which the fidelity tests hold to transformers. Either way a token's result does "
	       "not depend on its batch."),
	/* 256 is ATLAS_MAX_SLOTS of engine/engine.h; config/ sits below the
	 * engine and must not include its headers, so the limit is repeated
	 * here and the engine rejects a larger value on its own as well. */
	INT("engine", max_batch, 1, 256, "8",
	    "Sequences the engine advances in one step, which is its number of slots. Sessions "
	    "beyond it wait for a free slot (state queued). At most 256."),
	INT("engine", chunk_size, 0, 1 << 20, "0",
	    "Prompt tokens prefilled in one engine step, over all sequences. A longer prompt is "
	    "split into chunks, so that sessions that are generating keep going between them; "
	    "each chunk holds them up for as long as it runs (about 50 ms for 2048 tokens of "
	    "Qwen3-8B on an H100). 0 picks by backend: 256 on the cpu, 2048 on a GPU, whose "
	    "tensor cores want long chunks (docs/perf.md, on an H100: a prompt of 8192 "
	    "prefills 1.7 times as fast on Qwen3-8B and 3.7 times on Qwen3-0.6B in chunks of "
	    "2048 as in chunks of 256, and 2 % and 15 % faster again in one chunk)."),
	INT("engine", context, 0, 1 << 24, "0",
	    "Tokens of one session's context: every prompt and answer of its history. 0 uses "
	    "the model's maximum. A turn that does not fit fails with a message."),
	INT("engine", kv_block_size, 1, 256, "16",
	    "Tokens per block of the paged KV cache, a power of two from 1 to 256."),
	SIZE("engine", kv_memory, 0, 1048576 * GIB, "0",
	     "Memory for the KV cache blocks, in bytes with an optional suffix K, M or G "
	     "(powers of 1024). 0 sizes it from the memory left after the model is loaded: "
	     "on cuda gpu_memory_fraction of the device, on cpu 1G. When it is full, idle "
	     "sessions' KV moves to the swap tier ([swap]) or, without one, is dropped (their "
	     "next turn recomputes it); then the newest running session is parked until "
	     "blocks free up."),
	FLOAT("engine", gpu_memory_fraction, 0.0, true, 1.0, "0.9",
	      "With kv_memory = 0 on cuda: the share of the device's memory atlas may use in "
	      "all. The weights and activations are loaded first; the KV pool gets what is "
	      "left of this share."),
	BOOL("engine", cuda_graphs, "true",
	     "Replay decode steps (and steps of decode rows and short verifies) from CUDA "
	     "graphs, one recorded per row count and context bucket, instead of launching every kernel from the host. false is for "
	     "benchmarks and debugging: the tokens are the same either way."),

	BOOL("engine", cuda_pdl, "true",
	     "On GPUs of compute capability 9.0 and later (H100, H200): let each kernel of a "
	     "step be placed on the GPU while the kernel before it finishes, and start reading "
	     "its weights, so that the hundreds of short kernels of a decode step do not each "
	     "leave the GPU idle between them (programmatic dependent launch). false is for "
	     "benchmarks and debugging: the tokens are the same either way."),

	SIZE("swap", kv_host_memory, 0, 1048576 * GIB, "0",
	     "Host memory for the KV swap tier (pinned on cuda), in bytes with an optional "
	     "suffix K, M or G. Idle and parked sessions' KV blocks move there instead of being "
	     "dropped, and come back when the session runs again. 0: no host tier."),
	SIZE("swap", kv_disk_memory, 0, 1048576 * GIB, "0",
	     "Disk space for the KV swap tier in kv_dir, in bytes with an optional suffix. "
	     "Blocks go there when the host tier is full. 0: no disk tier."),
	INT("swap", kv_device_blocks_per_seq, 0, 1 << 24, "0",
	    "KV blocks of one running session kept on the device when a host tier exists; its "
	    "older blocks move to the host tier and attention streams them back through the "
	    "staging buffer every step (exact, bounded by the host link's bandwidth). 0: "
	    "automatic, a session keeps every block it can and moves its oldest ones to the "
	    "host tier only when the device pool cannot hold its context."),
	SIZE("swap", kv_stage_memory, 0, 1048576 * GIB, "256M",
	     "Device memory of the two staging buffers through which attention reads the KV "
	     "blocks of running sessions that are on the host tier, one layer at a time (the "
	     "next layer's blocks stream into one while the device computes on the other); a "
	     "step with more such blocks than a buffer holds reads them in several rounds, "
	     "without that overlap. Used only with a host tier; at least one block of one "
	     "layer per buffer is always allocated."),
	STRING("swap", kv_dir, "",
	       "Directory of the disk tier's block files (written with io_uring, O_DIRECT where "
	       "the filesystem allows it). Needed when kv_disk_memory is not 0."),
	BOOL("swap", kv_persist, "false",
	     "Keep sessions across a restart: when atlasd stops (SIGTERM, SIGINT, umount) every "
	     "session's history, settings and KV go to kv_dir (atlas-kv.blocks and "
	     "atlas-sessions.json), and the next atlasd with the same kv_dir brings the session "
	     "directories back; a session's next turn reads its KV from disk instead of "
	     "recomputing it. KV written by another model, or a block whose checksum does not "
	     "match, is recomputed (a log line says so); sessions saved with another tokenizer "
	     "are not brought back (the file is kept as atlas-sessions.json.stale). A crash "
	     "keeps nothing since the last stop. Needs kv_dir and kv_disk_memory."),

	INT("sessions", sessions, 0, 4096, "4",
	    "Session directories s1 to sN that exist when the filesystem is mounted."),
	INT("sessions", max_sessions, 1, 4096, "64",
	    "Most sessions at once, those made with mkdir included. At least sessions."),
	ENUM("sessions", mode, enum atlas_mode, mode_names, "auto",
	     "Mode of a new session: chat wraps each prompt in the model's chat template, raw "
	     "passes the text as it is, auto is chat when the model has a chat template and raw "
	     "otherwise."),
	FLOAT("sessions", temperature, 0.0, false, 100.0, "0.7",
	      "Sampling temperature of a new session. 0 always picks the most likely token "
	      "(greedy)."),
	FLOAT("sessions", top_p, 0.0, true, 1.0, "0.9",
	      "Nucleus sampling of a new session: sample among the most likely tokens whose "
	      "probabilities add up to top_p. 1 turns it off."),
	INT("sessions", top_k, 0, 1 << 24, "40",
	    "Sample among the top_k most likely tokens only. 0 turns it off."),
	INT("sessions", max_tokens, 1, 1 << 24, "512",
	    "Most tokens a new session generates in one turn."),
	U64("sessions", seed, "0",
	    "Seed of a new session's sampler: the same seed, settings and prompt give the same "
	    "answer."),
	SIZE("sessions", history_max, 0, 1048576 * GIB, "4M",
	     "Bytes of a session's history (the text of its prompts and answers, and about 64 "
	     "bytes per turn) kept before its newest turn, in bytes with an optional suffix. "
	     "When a turn begins, the oldest turns are dropped whole until those before it fit, "
	     "and the history file then begins with a line that counts them; the newest turn "
	     "is always kept whole. The model's context is not shortened (reset does that)."),
	STRING("sessions", system, "",
	       "System prompt of a new chat session, empty for none. Write a line break as \\n."),

	ENUM("spec", spec, enum atlas_spec, spec_names, "auto",
	     "Speculative decoding of a new session (its ctl key spec): draft a few tokens "
	     "cheaply, then check them all with one forward pass of the model and keep those it "
	     "agrees with. off never drafts; ngram drafts what followed the newest earlier "
	     "occurrence of the context's last few tokens (prompt lookup, no model needed: fast "
	     "on text that repeats or edits its input); draft asks the smaller model of "
	     "draft_model; mtp asks the model's own multi-token-prediction head (models that "
	     "ship one, mtp_head); auto uses prompt lookup where the context repeats itself, "
	     "elsewhere the MTP head or else the draft model, when there is one. The output is "
	     "the same with it on or off, greedy or sampled with a seed."),
	INT("spec", spec_k, 1, ATLAS_SPEC_K_MAX, "4",
	    "Most draft tokens one verification checks (a new session's ctl key spec_k), at "
	    "most 8. The gate may use fewer."),
	INT("spec", spec_ngram_min, 1, ATLAS_SPEC_NGRAM_MAX, "2",
	    "Shortest run of the context's last tokens that prompt lookup matches (ngram)."),
	INT("spec", spec_ngram_max, 1, ATLAS_SPEC_NGRAM_MAX, "4",
	    "Longest run of the context's last tokens that prompt lookup matches; the longest "
	    "that occurred before wins."),
	BOOL("spec", spec_gate, "true",
	     "Per session, track how many drafts are accepted and draft only where verifying "
	     "them is expected to beat plain decoding, by the step times measured on this "
	     "device; prompt lookup keeps checking its drafts against the tokens that come, so "
	     "that a session that starts repeating itself gets speculation back. false drafts "
	     "at every step (measurements and tests)."),
	STRING("spec", draft_model, "",
	       "Directory of a smaller model with the model's tokenizer and vocabulary (a shape "
	       "name with load_format dummy), loaded on the same backend to draft tokens for "
	       "spec = draft or auto. Each session keeps its own KV in the draft model's pool. "
	       "Empty: no draft model. A draft model whose vocabulary differs from the model's "
	       "stops atlasd at startup."),
	SIZE("spec", draft_kv_memory, 0, 1048576 * GIB, "512M",
	     "Memory for the draft model's KV cache blocks, in bytes with an optional suffix. "
	     "When it is full, sessions not drafting at the moment give theirs back; a session "
	     "that finds no room does not draft in that step."),
	BOOL("spec", mtp_head, "true",
	     "Load the multi-token-prediction head of a model that ships one (config.json "
	     "mtp_num_hidden_layers), on the same backend, to draft tokens for spec = mtp or "
	     "auto. It reads the model's last hidden state of every position, so it follows "
	     "every step of a session that may use it. false: no head, less memory."),
	SIZE("spec", mtp_kv_memory, 0, 1048576 * GIB, "256M",
	     "Memory for the MTP head's KV cache blocks (its own layers' KV of every position "
	     "of a session), in bytes with an optional suffix. When it is full, sessions not "
	     "drafting at the moment give theirs back and do not draft with the head again "
	     "until their context is reset."),

	INT("ep", ep, 1, ATLAS_EP_MAX, "1",
	    "Expert parallelism: the number of ranks that share a mixture-of-experts model's "
	    "experts. 1: none. Above 1, atlasd is the head (rank 0) and waits at startup for "
	    "ranks 1 .. ep-1, each an `atlasd --worker RANK` process with the same "
	    "configuration, on this host or another, one per GPU; attention and the dense "
	    "layers run on every rank, each expert on one. Needs kv_host_memory, kv_disk_memory "
	    "and kv_persist off and no draft model (a worker keeps only the device KV of the "
	    "command stream it runs)."),
	STRING("ep", ep_address, "127.0.0.1:7460",
	       "host:port where the head listens for its workers and where workers connect "
	       "(a numeric IPv4 or IPv6 address or a host name). Anyone who can reach it can "
	       "join as a worker: keep it on loopback or a private network."),
	DOUBLE("ep", ep_timeout, 0.1, 3600, "10",
	       "Seconds a rank may stay silent in a collective or a command before it counts as "
	       "gone: the running turns then fail with an error that names it, ctl/ep shows it, "
	       "and new turns wait for it to rejoin. On cuda it bounds how long a step waits "
	       "for its NCCL collectives; past it the communicator is aborted."),
	DOUBLE("ep", ep_join_timeout, 1, 86400, "120",
	       "Seconds the head waits at startup for every worker to join before it gives up."),

	STRING("fs", mountpoint, "",
	       "Directory where atlasd mounts the filesystem. A mountpoint given on atlasd's "
	       "command line takes precedence."),
	BOOL("fs", allow_other, "false",
	     "Let users other than the one running atlasd use the mount (FUSE allow_other; "
	     "unless atlasd runs as root, /etc/fuse.conf must contain user_allow_other)."),
	BOOL("fs", default_permissions, "false",
	     "Let the kernel check file modes and owners on every access (FUSE "
	     "default_permissions), as wanted when session directories are bind-mounted into "
	     "containers."),
	DOUBLE("fs", attr_timeout, 0.0, 3600.0, "1.0",
	       "Seconds the kernel may cache the attributes and names of session directories."),
	SIZE("fs", prompt_max, 1024, 1024 * MIB, "16M",
	     "Bytes of one prompt written to a session's in, or of the lines one handle writes "
	     "to a ctl file, before it is closed; a write past it fails with EFBIG and the "
	     "prompt is not committed."),
	SIZE("fs", prompt_memory, 1024, 1048576 * GIB, "256M",
	     "Bytes that every open in and ctl handle of the mount may hold together (prompts "
	     "being written, ctl lines not yet applied), so that many writers cannot exhaust "
	     "the daemon's memory; a write past it fails with ENOSPC and that prompt is not "
	     "committed."),
	SIZE("fs", session_prompt_memory, 1024, 1048576 * GIB, "64M",
	     "Bytes that the open in and ctl handles of one session may hold together, within "
	     "prompt_memory, so that one session's writers cannot take the whole mount's "
	     "share; a write past it fails with ENOSPC and that prompt is not committed."),

	STRING("fs", session_owner, "",
	       "User who owns the sessions s1 to sN and the sessions kept across a restart "
	       "(kv_persist): a user name or a numeric uid. Empty: the user running atlasd. A "
	       "session made with mkdir belongs to the user who made it. Only a session's owner "
	       "and root may look inside it, open its files or remove it, whatever "
	       "default_permissions says; other users who reach the mount (allow_other) see its "
	       "name and get EACCES (EPERM for rmdir)."),
	STRING("fs", ctl_owner, "",
	       "User who owns the mount's root, README and ctl/: a user name or a numeric uid. "
	       "Empty: the user running atlasd. ctl/ is readable by everyone who reaches the "
	       "mount; its modes leave writing to this user and root (no ctl/ file takes "
	       "writes yet)."),

	CHOICE("log", log_level, log_level_names, "info",
	       "Least severe messages that are logged: error, warn, info or debug. At info, "
	       "one line per turn gives its session, prompt and generated tokens, time to "
	       "first token, tokens/s and finish."),
	STRING("log", log_file, "",
	       "Where atlasd logs once it has gone to the background (without -f): empty for "
	       "syslog (facility daemon, ident atlasd: the journal under systemd), else a file "
	       "that lines are appended to, with the wall-clock time. In the foreground atlasd "
	       "and atlas log to stderr."),
};
const size_t atlas_n_keys = ATLAS_ARRAY_LEN(atlas_keys);

const struct atlas_key *atlas_key_find(const char *name)
{
	for (size_t i = 0; i < atlas_n_keys; i++)
		if (!strcmp(atlas_keys[i].name, name))
			return &atlas_keys[i];
	return NULL;
}

static void *field(struct atlas_config *c, const struct atlas_key *k)
{
	return (char *)c + k->offset;
}

static const void *cfield(const struct atlas_config *c, const struct atlas_key *k)
{
	return (const char *)c + k->offset;
}

/* ---- text to values ---- */

/* Decimal digits with an optional sign: no spaces, no other bases. */
static int parse_i64(const char *text, int64_t *out)
{
	const char *d = text + (*text == '-' || *text == '+');
	if (!isdigit((unsigned char)*d))
		return -EINVAL;
	char *end;
	errno = 0;
	long long v = strtoll(text, &end, 10);
	if (*end)
		return -EINVAL;
	if (errno == ERANGE)
		return -ERANGE;
	*out = v;
	return 0;
}

static int parse_u64(const char *text, const char **rest, uint64_t *out)
{
	if (!isdigit((unsigned char)*text))
		return -EINVAL;
	char *end;
	errno = 0;
	unsigned long long v = strtoull(text, &end, 10);
	if (errno == ERANGE)
		return -ERANGE;
	*rest = end;
	*out = v;
	return 0;
}

int atlas_parse_size(const char *text, uint64_t *out)
{
	const char *rest;
	uint64_t v;
	int rc = parse_u64(text, &rest, &v);
	if (rc)
		return rc;
	int shift = 0;
	if (*rest) {
		const char *p = strchr("KMG", toupper((unsigned char)*rest));
		if (!p || rest[1])
			return -EINVAL;
		shift = 10 * (int)(p - "KMG" + 1);
	}
	if (shift && v > (UINT64_MAX >> shift))
		return -ERANGE;
	*out = v << shift;
	return 0;
}

static int parse_double(const char *text, double *out)
{
	if (!*text || isspace((unsigned char)*text))
		return -EINVAL;
	char *end;
	errno = 0;
	double v = strtod(text, &end);
	if (*end || !isfinite(v))
		return -EINVAL;
	*out = v;
	return 0;
}

static int parse_bool(const char *text, bool *out)
{
	static const char *const yes[] = { "true", "yes", "on", "1" };
	static const char *const no[] = { "false", "no", "off", "0" };
	for (size_t i = 0; i < ATLAS_ARRAY_LEN(yes); i++) {
		if (!strcasecmp(text, yes[i]) || !strcasecmp(text, no[i])) {
			*out = !strcasecmp(text, yes[i]);
			return 0;
		}
	}
	return -EINVAL;
}

static int name_index(const char *const *names, const char *text)
{
	for (int i = 0; names[i]; i++)
		if (!strcmp(names[i], text))
			return i;
	return -1;
}

static int count_names(const struct atlas_key *k)
{
	int n = 0;
	while (k->names[n])
		n++;
	return n;
}

static int bad_name(const struct atlas_key *k, const char *text, char *err, size_t errlen)
{
	char list[128] = "";
	for (int i = 0; k->names[i]; i++)
		snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
			 k->names[i]);
	return atlas_errf(err, errlen, -EINVAL, "key '%s': '%s' is not one of %s", k->name, text,
			  list);
}

static int hexval(char ch)
{
	if (isdigit((unsigned char)ch))
		return ch - '0';
	ch = (char)tolower((unsigned char)ch);
	return ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
}

/* Undo the escapes of INI text (\n \t \r \\ \; \xHH) into out[*n..cap).
 * *n grows by the bytes written; out stays NUL-terminated. */
static int unescape(const struct atlas_key *k, const char *s, char *out, size_t cap, size_t *n,
		    char *err, size_t errlen)
{
	for (; *s; s++) {
		char ch = *s;
		if (ch == '\\') {
			static const char from[] = "ntr\\;", to[] = "\n\t\r\\;";
			const char *p = s[1] ? strchr(from, s[1]) : NULL;
			if (p) {
				ch = to[p - from];
				s++;
			} else if (s[1] == 'x' && hexval(s[2]) >= 0 && hexval(s[3]) >= 0 &&
				   hexval(s[2]) * 16 + hexval(s[3]) > 0) {
				ch = (char)(hexval(s[2]) * 16 + hexval(s[3]));
				s += 3;
			} else {
				return atlas_errf(err, errlen, -EINVAL,
						  "key '%s': bad escape '\\%.1s' (use \\n \\t \\r \\\\ \\; "
						  "or \\xHH)", k->name, s + 1);
			}
		}
		if (*n + 1 >= cap)
			return atlas_errf(err, errlen, -E2BIG, "key '%s': value is longer than %zu bytes",
					  k->name, cap - 1);
		out[(*n)++] = ch;
		out[*n] = '\0';
	}
	return 0;
}

static int set_string(struct atlas_config *c, const struct atlas_key *k, const char *text,
		      bool append, char *err, size_t errlen)
{
	char buf[ATLAS_SYSTEM_MAX > ATLAS_PATH_MAX ? ATLAS_SYSTEM_MAX : ATLAS_PATH_MAX];
	char *dst = field(c, k);
	size_t n = 0;
	if (append) {
		n = strnlen(dst, k->size - 1);
		memcpy(buf, dst, n);
	}
	buf[n] = '\0';
	int rc = unescape(k, text, buf, k->size, &n, err, errlen);
	if (rc)
		return rc;
	if (k->type == KEY_CHOICE && name_index(k->names, buf) < 0)
		return bad_name(k, buf, err, errlen);
	/* The whole field is rewritten so that equal settings are equal bytes. */
	memset(dst, 0, k->size);
	memcpy(dst, buf, n);
	return 0;
}

/* ---- ranges, shared by setting a key and validating a whole config ---- */

/* text: the value as the user wrote it, NULL to print v. */
static int check_int(const struct atlas_key *k, int64_t v, const char *text, char *err,
		     size_t errlen)
{
	if (v >= k->imin && v <= k->imax)
		return 0;
	char num[32];
	snprintf(num, sizeof num, "%" PRId64, v);
	if (k->type == KEY_SIZE)
		return atlas_errf(err, errlen, -ERANGE, "key '%s': %s is out of range %" PRId64
				  "M..%" PRId64 "G", k->name, text ? text : num, k->imin / MIB,
				  k->imax / GIB);
	return atlas_errf(err, errlen, -ERANGE, "key '%s': %s is out of range %" PRId64 "..%"
			  PRId64, k->name, text ? text : num, k->imin, k->imax);
}

static int check_float(const struct atlas_key *k, double v, char *err, size_t errlen)
{
	bool low = k->fmin_open ? v <= k->fmin : v < k->fmin;
	if (!low && v <= k->fmax && isfinite(v))
		return 0;
	return atlas_errf(err, errlen, -ERANGE, "key '%s': %g is out of range %s%g, %g]", k->name,
			  v, k->fmin_open ? "(" : "[", k->fmin, k->fmax);
}

static int bad_value(const struct atlas_key *k, const char *text, const char *what, char *err,
		     size_t errlen)
{
	return atlas_errf(err, errlen, -EINVAL, "key '%s': '%s' is not %s", k->name, text, what);
}

int atlas_key_set(struct atlas_config *c, const struct atlas_key *k, const char *text,
		  bool append, char *err, size_t errlen)
{
	if (append && k->type != KEY_STRING)
		return atlas_errf(err, errlen, -EINVAL,
				  "key '%s': an indented line continues the value before it, and only "
				  "text keys take several lines", k->name);
	int64_t i = 0;
	uint64_t u = 0;
	double f = 0;
	bool b;
	int rc;
	switch (k->type) {
	case KEY_STRING:
	case KEY_CHOICE:
		return set_string(c, k, text, append, err, errlen);
	case KEY_ENUM:
		rc = name_index(k->names, text);
		if (rc < 0)
			return bad_name(k, text, err, errlen);
		*(enum atlas_mode *)field(c, k) = (enum atlas_mode)rc;
		return 0;
	case KEY_INT:
		rc = parse_i64(text, &i);
		if (rc == -EINVAL)
			return bad_value(k, text, "an integer", err, errlen);
		if (rc == -ERANGE)
			i = *text == '-' ? INT64_MIN : INT64_MAX;
		rc = check_int(k, i, text, err, errlen);
		if (rc)
			return rc;
		*(int *)field(c, k) = (int)i;
		return 0;
	case KEY_SIZE:
		rc = atlas_parse_size(text, &u);
		if (rc == -EINVAL)
			return bad_value(k, text, "a size (digits and an optional K, M or G)", err,
					 errlen);
		if (rc == -ERANGE || u > INT64_MAX)
			return atlas_errf(err, errlen, -ERANGE, "key '%s': size '%s' is too large",
					  k->name, text);
		rc = check_int(k, (int64_t)u, text, err, errlen);
		if (rc)
			return rc;
		*(uint64_t *)field(c, k) = u;
		return 0;
	case KEY_U64: {
		const char *rest;
		rc = parse_u64(text, &rest, &u);
		if (rc == -ERANGE)
			return atlas_errf(err, errlen, rc, "key '%s': %s is larger than %" PRIu64,
					  k->name, text, UINT64_MAX);
		if (rc || *rest)
			return bad_value(k, text, "an unsigned integer", err, errlen);
		*(uint64_t *)field(c, k) = u;
		return 0;
	}
	case KEY_FLOAT:
	case KEY_DOUBLE:
		if (parse_double(text, &f))
			return bad_value(k, text, "a number", err, errlen);
		rc = check_float(k, f, err, errlen);
		if (rc)
			return rc;
		if (k->type == KEY_FLOAT)
			*(float *)field(c, k) = (float)f;
		else
			*(double *)field(c, k) = f;
		return 0;
	case KEY_BOOL:
		if (parse_bool(text, &b))
			return bad_value(k, text, "a boolean (true or false)", err, errlen);
		*(bool *)field(c, k) = b;
		return 0;
	}
	return -EINVAL;
}

/* ---- values to text ---- */

/* The shortest decimal that reads back as the same value. */
static size_t format_real(char *buf, size_t len, double v, bool single)
{
	char tmp[32];
	for (int prec = 1; prec <= 17; prec++) {
		snprintf(tmp, sizeof tmp, "%.*g", prec, v);
		if (single ? strtof(tmp, NULL) == (float)v : strtod(tmp, NULL) == v)
			break;
	}
	return (size_t)snprintf(buf, len, "%s", tmp);
}

static size_t format_size(char *buf, size_t len, uint64_t v)
{
	static const char suffix[] = "GMK";
	for (int i = 0; i < 3; i++) {
		uint64_t unit = 1ull << (10 * (3 - i));
		if (v && v % unit == 0)
			return (size_t)snprintf(buf, len, "%" PRIu64 "%c", v / unit, suffix[i]);
	}
	return (size_t)snprintf(buf, len, "%" PRIu64, v);
}

size_t atlas_key_text(const struct atlas_config *c, const struct atlas_key *k, char *buf,
		      size_t len)
{
	const void *p = cfield(c, k);
	switch (k->type) {
	case KEY_STRING:
	case KEY_CHOICE:
		return (size_t)snprintf(buf, len, "%.*s", (int)strnlen(p, k->size), (const char *)p);
	case KEY_ENUM: {
		int v = (int)*(const enum atlas_mode *)p;
		return (size_t)snprintf(buf, len, "%s", v >= 0 && v < count_names(k) ? k->names[v]
											 : "?");
	}
	case KEY_INT:
		return (size_t)snprintf(buf, len, "%d", *(const int *)p);
	case KEY_SIZE:
		return format_size(buf, len, *(const uint64_t *)p);
	case KEY_U64:
		return (size_t)snprintf(buf, len, "%" PRIu64, *(const uint64_t *)p);
	case KEY_FLOAT:
		return format_real(buf, len, *(const float *)p, true);
	case KEY_DOUBLE:
		return format_real(buf, len, *(const double *)p, false);
	case KEY_BOOL:
		return (size_t)snprintf(buf, len, "%s", *(const bool *)p ? "true" : "false");
	}
	return 0;
}

/* ---- the public API ---- */

void atlas_config_defaults(struct atlas_config *c)
{
	memset(c, 0, sizeof *c);
	for (size_t i = 0; i < atlas_n_keys; i++) {
		int rc = atlas_key_set(c, &atlas_keys[i], atlas_keys[i].def, false, NULL, 0);
		/* A default that does not parse is a bug in the table above,
		 * which the unit tests catch; it must never ship. */
		if (rc)
			abort();
	}
}

int atlas_config_set(struct atlas_config *c, const char *key, const char *value, char *err,
		     size_t errlen)
{
	const struct atlas_key *k = atlas_key_find(key);
	if (!k)
		return atlas_errf(err, errlen, -ENOENT, "unknown key '%s'", key);
	return atlas_key_set(c, k, value, false, err, errlen);
}

/* One field's value against its row: what atlas_key_set would have refused. */
static int check_key(const struct atlas_config *c, const struct atlas_key *k, char *err,
		     size_t errlen)
{
	const void *p = cfield(c, k);
	switch (k->type) {
	case KEY_STRING:
	case KEY_CHOICE:
		if (strnlen(p, k->size) == k->size)
			return atlas_errf(err, errlen, -EINVAL, "key '%s': value is not terminated",
					  k->name);
		if (k->type == KEY_CHOICE && name_index(k->names, p) < 0)
			return bad_name(k, p, err, errlen);
		return 0;
	case KEY_ENUM: {
		int v = (int)*(const enum atlas_mode *)p;
		return v >= 0 && v < count_names(k) ? 0 : atlas_errf(err, errlen, -EINVAL,
				"key '%s': %d is not a valid value", k->name, v);
	}
	case KEY_INT:
		return check_int(k, *(const int *)p, NULL, err, errlen);
	case KEY_SIZE:
		if (*(const uint64_t *)p > INT64_MAX)
			return atlas_errf(err, errlen, -ERANGE, "key '%s': size is too large", k->name);
		return check_int(k, (int64_t)*(const uint64_t *)p, NULL, err, errlen);
	case KEY_FLOAT:
		return check_float(k, *(const float *)p, err, errlen);
	case KEY_DOUBLE:
		return check_float(k, *(const double *)p, err, errlen);
	case KEY_U64:
	case KEY_BOOL:
		return 0;
	}
	return 0;
}

int atlas_config_validate(const struct atlas_config *c, char *err, size_t errlen)
{
	for (size_t i = 0; i < atlas_n_keys; i++) {
		int rc = check_key(c, &atlas_keys[i], err, errlen);
		if (rc)
			return rc;
	}
	if (c->kv_block_size & (c->kv_block_size - 1))
		return atlas_errf(err, errlen, -EINVAL, "key 'kv_block_size': %d is not a power of two",
				  c->kv_block_size);
	if (c->sessions > c->max_sessions)
		return atlas_errf(err, errlen, -EINVAL,
				  "key 'sessions': %d is more than max_sessions (%d)", c->sessions,
				  c->max_sessions);
	if (c->kv_persist && (!c->kv_disk_memory || !c->kv_dir[0]))
		return atlas_errf(err, errlen, -EINVAL,
				  "key 'kv_persist': keeping sessions needs a disk tier (kv_dir and "
				  "kv_disk_memory)");
	if (c->spec_ngram_min > c->spec_ngram_max)
		return atlas_errf(err, errlen, -EINVAL,
				  "key 'spec_ngram_min': %d is more than spec_ngram_max (%d)",
				  c->spec_ngram_min, c->spec_ngram_max);
	if (c->spec == ATLAS_SPEC_DRAFT && !c->draft_model[0])
		return atlas_errf(err, errlen, -EINVAL,
				  "key 'spec': draft needs a draft model (key draft_model)");
	if (c->spec == ATLAS_SPEC_MTP && !c->mtp_head)
		return atlas_errf(err, errlen, -EINVAL,
				  "key 'spec': mtp needs the model's MTP head (key mtp_head)");
	if (c->ep > 1 && (c->kv_host_memory || c->kv_disk_memory || c->kv_persist ||
			  c->draft_model[0]))
		return atlas_errf(err, errlen, -EINVAL,
				  "key 'ep': expert parallelism needs kv_host_memory 0, "
				  "kv_disk_memory 0, kv_persist false and no draft_model");
	const char *const owners[][2] = { { "session_owner", c->session_owner },
					   { "ctl_owner", c->ctl_owner } };
	for (size_t i = 0; i < ATLAS_ARRAY_LEN(owners); i++) {
		char why[160];
		int rc = atlas_config_user(owners[i][1], NULL, NULL, why, sizeof why);
		if (rc)
			return atlas_errf(err, errlen, rc, "key '%s': %s", owners[i][0], why);
	}
	if (c->kv_disk_memory && !c->kv_dir[0])
		return atlas_errf(err, errlen, -EINVAL,
				  "key 'kv_disk_memory': the disk tier needs a directory in kv_dir");
	return 0;
}

const char *atlas_mode_name(enum atlas_mode m)
{
	return (unsigned)m < ATLAS_ARRAY_LEN(mode_names) - 1 ? mode_names[m] : "?";
}

const char *atlas_spec_name(enum atlas_spec m)
{
	return (unsigned)m < ATLAS_ARRAY_LEN(spec_names) - 1 ? spec_names[m] : "?";
}

int atlas_spec_parse(const char *text, enum atlas_spec *out)
{
	for (int i = 0; spec_names[i]; i++)
		if (!strcmp(text, spec_names[i])) {
			*out = (enum atlas_spec)i;
			return 0;
		}
	return -EINVAL;
}

const char *atlas_config_model_dir(const struct atlas_config *c)
{
	return c->model[0] ? c->model : atlas_config_default_model();
}
