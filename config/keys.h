/* Internal to config/: the key table of config.c and the functions that the
 * INI loader (load.c) and the renderer (format.c) share with it. */
#ifndef ATLAS_CONFIG_KEYS_H
#define ATLAS_CONFIG_KEYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"

enum key_type {
	KEY_STRING,  /* char[size], INI text with escapes */
	KEY_CHOICE,  /* char[size] holding one of names */
	KEY_ENUM,    /* enum field; its value is the index of its name in names */
	KEY_INT,     /* int within imin..imax */
	KEY_SIZE,    /* uint64_t bytes within imin..imax, K/M/G suffixes */
	KEY_U64,     /* uint64_t, any value */
	KEY_FLOAT,   /* float within fmin..fmax */
	KEY_DOUBLE,  /* double within fmin..fmax */
	KEY_BOOL,    /* bool: true/false, yes/no, on/off, 1/0 */
};

struct atlas_key {
	const char *section;
	const char *name;             /* also the field's name in struct atlas_config */
	enum key_type type;
	size_t offset, size;          /* of the field in struct atlas_config */
	int64_t imin, imax;           /* KEY_INT, KEY_SIZE */
	double fmin, fmax;            /* KEY_FLOAT, KEY_DOUBLE */
	bool fmin_open;               /* fmin itself is out of range */
	const char *const *names;     /* KEY_CHOICE, KEY_ENUM: NULL-terminated */
	const char *def;              /* the default, as INI text */
	const char *doc;              /* documentation: plain sentences, wrapped by format.c */
};

extern const struct atlas_key atlas_keys[];
extern const size_t atlas_n_keys;

const struct atlas_key *atlas_key_find(const char *name);

/* Parse INI text into k's field of c. With `append` (a continuation line of
 * a KEY_STRING value) the text is added to what the field holds. Errors name
 * the key: "key 'max_batch': ...". */
int atlas_key_set(struct atlas_config *c, const struct atlas_key *k, const char *text,
		  bool append, char *err, size_t errlen);

/* The field's value as INI text in buf (strings unescaped: format.c escapes
 * them). Returns the length written (snprintf semantics). */
size_t atlas_key_text(const struct atlas_config *c, const struct atlas_key *k, char *buf,
		      size_t len);

#endif
