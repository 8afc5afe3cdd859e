/* The family table: which code runs which architecture.
 *
 * A family is a folder under engine/model/ that fills one struct
 * model_family; the table in families.c maps the architecture names of
 * config.json to it. Nothing outside a family's folder asks which family a
 * model is: the loader and the engine call through the entry, and the
 * engine sizes its caches from the layer kinds the family wrote into
 * model_config.
 *
 * Adding a family: a folder with its config keys, weights and forward pass,
 * its meson sources, and one row per architecture in families.c.
 */
#ifndef ATLAS_ENGINE_MODEL_FAMILY_H
#define ATLAS_ENGINE_MODEL_FAMILY_H

#include <stddef.h>

#include "engine/model/model.h"

struct hf_json;

struct model_family {
	const char *name;               /* "dense" */

	/* Read the family's own keys of config.json f into c, whose common keys
	 * (sizes, rope, dtype, eps, special ids) are already read, and fill
	 * c->layers and the layer counts. variant is the table row's. */
	int (*parse_config)(const struct hf_json *f, int variant, struct model_config *c,
			    char *err, size_t errlen);
	/* Bind every weight of m (model_bind(), which makes dummy weights when
	 * the model has no files) and allocate the scratch of m->max_tokens
	 * rows and m->max_out logits rows. Called once; free undoes it. */
	int (*load)(struct model *m, char *err, size_t errlen);
	void (*free)(struct model *m);
	/* One step, as model_forward() describes it. Allocates nothing. */
	int (*forward)(struct model *m, const struct model_step *s);
	/* The multi-token-prediction head (model_load_head), NULL for a family
	 * without one: head_load sets m->cfg's layers to the head's, binds its
	 * weights and allocates its scratch (free undoes it); head_forward runs
	 * one step of the head. */
	int (*head_load)(struct model *m, char *err, size_t errlen);
	int (*head_forward)(struct model *m, const struct model_step *s);
};

/* One row of the table. */
struct model_arch {
	const char *architecture;       /* config.json architectures[0] */
	const char *model_type;         /* config.json model_type, used when architectures is absent */
	const struct model_family *family;
	int variant;                    /* handed to the family's parse_config */
};

/* The row for an architecture or a model_type (exactly one given), NULL if none. */
const struct model_arch *model_arch_find(const char *architecture, const char *model_type);
/* The supported architectures, comma separated, for messages. */
const char *model_arch_names(void);

#endif
