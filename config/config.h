/* Typed configuration of atlas (DESIGN §5).
 *
 * Every key has exactly one definition: its row in the table of config.c,
 * which names its section, type, range, default and documentation. The
 * shipped config/atlas.conf is generated from that table (`atlas config
 * --defaults`) and a test keeps the two equal. Key names are unique across
 * sections, so a flag `-o key=value` needs no section.
 *
 * Order of precedence: table defaults < INI file < flags.
 */
#ifndef ATLAS_CONFIG_CONFIG_H
#define ATLAS_CONFIG_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define ATLAS_PATH_MAX 4096
#define ATLAS_SYSTEM_MAX 8192   /* bytes of a system prompt */
#define ATLAS_STOP_MAX 8        /* stop strings per session */
#define ATLAS_STOP_LEN 64       /* bytes of one stop string */
/* kv_memory = 0 on the cpu backend: the pool of a small machine. */
#define ATLAS_KV_MEMORY_CPU_AUTO ((uint64_t)1 << 30)
/* chunk_size = 0: prompt tokens of one step by backend. A cpu gains little
 * from longer chunks, and a chunk holds up the generating sessions while it
 * runs; a GPU's tensor cores want 2048 rows or more (docs/perf.md: on an
 * H100 a prompt of 8192 prefills 1.7 times as fast on Qwen3-8B and 3.7
 * times on Qwen3-0.6B in chunks of 2048 as in chunks of 256, 2026-12-02). */
#define ATLAS_CHUNK_SIZE_CPU_AUTO 256
#define ATLAS_CHUNK_SIZE_GPU_AUTO 2048

enum atlas_mode { ATLAS_MODE_AUTO, ATLAS_MODE_CHAT, ATLAS_MODE_RAW };

/* Speculative decoding of a session: no drafts, the best drafter the engine
 * has, prompt lookup over the session's own context, or the draft model. */
enum atlas_spec { ATLAS_SPEC_OFF, ATLAS_SPEC_AUTO, ATLAS_SPEC_NGRAM, ATLAS_SPEC_DRAFT,
		  ATLAS_SPEC_MTP };
/* Most draft tokens one verify takes (spec_k), and the n-gram lengths of
 * prompt lookup. */
#define ATLAS_SPEC_K_MAX 8
#define ATLAS_SPEC_NGRAM_MAX 16

/* Ranks of expert parallelism at most (the communicators' limit), and the
 * length of the head's address. */
#define ATLAS_EP_MAX 16
#define ATLAS_EP_ADDRESS_MAX 256

struct atlas_config {
	/* [model] */
	char model[ATLAS_PATH_MAX];     /* Hugging Face model directory, or a shape name (dummy) */
	char load_format[16];           /* files | dummy */

	/* [engine] */
	char backend[16];               /* auto | cpu | cuda */
	int device;                     /* cuda device index */
	int threads;                    /* cpu worker threads, 0 = all online cores */
	char cpu_precision[8];          /* f32 | bf16: the cpu backend's weights and products */
	int max_batch;                  /* sequences in one engine step (= engine slots) */
	int chunk_size;                 /* prefill tokens in one step, over all sequences, 0 = by backend */
	int context;                    /* tokens of one session's context, 0 = the model's maximum */
	int kv_block_size;              /* tokens per KV block */
	uint64_t kv_memory;             /* bytes for the KV block pool, 0 = auto */
	float gpu_memory_fraction;      /* cuda, kv_memory 0: share of the device memory to use */
	bool cuda_graphs;               /* replay decode steps from CUDA graphs */
	bool cuda_pdl;                  /* overlap each kernel's start with the end of the one before */

	/* [swap] */
	uint64_t kv_host_memory;        /* bytes of the host tier, 0 = none */
	uint64_t kv_disk_memory;        /* bytes of the disk tier in kv_dir, 0 = none */
	char kv_dir[ATLAS_PATH_MAX];    /* directory of the disk tier's files */
	bool kv_persist;                /* sessions and their KV survive a restart in kv_dir */
	int kv_device_blocks_per_seq;   /* device blocks a running sequence keeps, 0 = automatic */
	uint64_t kv_stage_memory;       /* bytes of the staging buffer of host-tier attention */

	/* [sessions] */
	int sessions;                   /* session directories s1..sN made at mount */
	int max_sessions;               /* most sessions, counting those made with mkdir */
	enum atlas_mode mode;           /* default mode of a new session */
	float temperature;              /* sampling defaults of a new session */
	float top_p;
	int top_k;
	int max_tokens;
	uint64_t seed;
	uint64_t history_max;           /* bytes of a session's history before its newest turn */
	char system[ATLAS_SYSTEM_MAX];  /* default system prompt, "" for none */

	/* [spec] */
	enum atlas_spec spec;           /* speculative decoding of a new session */
	int spec_k;                     /* most draft tokens of one verify */
	int spec_ngram_min, spec_ngram_max;     /* n-gram lengths prompt lookup tries */
	bool spec_gate;                 /* turn speculation off where it does not pay */
	char draft_model[ATLAS_PATH_MAX];       /* the draft model's directory (or shape), "" none */
	uint64_t draft_kv_memory;       /* bytes of the draft model's KV blocks */
	bool mtp_head;                  /* load the model's MTP head, when it ships one */
	uint64_t mtp_kv_memory;         /* bytes of the MTP head's KV blocks */

	/* [ep] */
	int ep;                         /* ranks of expert parallelism; 1 = none */
	char ep_address[ATLAS_EP_ADDRESS_MAX]; /* host:port where the head listens */
	double ep_timeout;              /* seconds a silent rank is waited for */
	double ep_join_timeout;         /* seconds the head waits for its workers at start */

	/* [fs] */
	char mountpoint[ATLAS_PATH_MAX];
	bool allow_other;
	bool default_permissions;
	double attr_timeout;            /* seconds the kernel caches session attributes */
	uint64_t prompt_max;            /* bytes of one prompt (or ctl batch) of one handle */
	uint64_t prompt_memory;         /* bytes all open in and ctl handles may hold together */
	uint64_t session_prompt_memory; /* bytes one session's open in and ctl handles may hold */
	char session_owner[64];         /* user (name or uid) of s1..sN, "" = atlasd's user */
	char ctl_owner[64];             /* user (name or uid) of the root, README and ctl/ */

	/* [log] */
	char log_level[16];             /* error | warn | info | debug */
	char log_file[ATLAS_PATH_MAX];  /* atlasd detached: "" syslog, else lines appended here */
};

/* Fill every field with its table default. */
void atlas_config_defaults(struct atlas_config *c);

/* Read an INI file over c. Unknown sections or keys and bad values fail with
 * a message naming the file, line and key; c is then unspecified. */
int atlas_config_load(struct atlas_config *c, const char *path, char *err, size_t errlen);

/* Set one key from text ("max_batch", "16"), as a flag or INI line does. */
int atlas_config_set(struct atlas_config *c, const char *key, const char *value, char *err,
		     size_t errlen);

/* Check relations between keys after all sources are applied. */
int atlas_config_validate(const struct atlas_config *c, char *err, size_t errlen);

/* The effective configuration as INI text (what ctl/config shows). With
 * `documented`, every key is preceded by its documentation as comments: the
 * shipped config/atlas.conf. Returns the length written (snprintf semantics). */
size_t atlas_config_format(const struct atlas_config *c, bool documented, char *buf, size_t len);

/* The manual page atlas.conf(5) in roff: every key of the table with its
 * default, documentation and valid values. Returns the length written
 * (snprintf semantics). */
size_t atlas_config_man(const char *version, char *buf, size_t len);

/* The model directory to load: c->model, or when that is empty
 * atlas_config_default_model(). */
const char *atlas_config_model_dir(const struct atlas_config *c);
/* paths.c: the meson option default_model when it was given; else the
 * installed model (PREFIX/share/atlas/models/atlas-next, PREFIX found from
 * the running binary's path) when it exists; else the source tree's. */
const char *atlas_config_default_model(void);
/* paths.c: the installed atlas.conf (PREFIX/etc/atlas/atlas.conf) into buf;
 * -ENOENT when the binary is not installed or the file is missing. */
int atlas_config_installed_file(char *buf, size_t len);

/* The user a key such as session_owner names: a user name or a numeric
 * uid; "" is the user running this process. *uid and *gid (the user's
 * primary group; the process's group for "" or a uid without a passwd
 * entry) may be NULL. 0, or -ENOENT for an unknown name. */
int atlas_config_user(const char *text, uid_t *uid, gid_t *gid, char *err, size_t errlen);

/* Parse "512", "64K", "2M", "1G" (powers of 1024). */
int atlas_parse_size(const char *text, uint64_t *out);
const char *atlas_mode_name(enum atlas_mode m);
const char *atlas_spec_name(enum atlas_spec m);
/* The spec mode named text; -EINVAL for an unknown name. */
int atlas_spec_parse(const char *text, enum atlas_spec *out);

#endif
