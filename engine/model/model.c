/* Loading a model directory and running its forward pass (model.h). */
#include "engine/model/internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "engine/model/family.h"

/* The family's head loader, or why there is none. */
static int head_load(struct model *m, const char *dir, char *err, size_t errlen)
{
	const struct model_config *c = &m->cfg;
	if (!c->n_mtp_layers)
		return atlas_errf(err, errlen, -ENOTSUP,
				  "%s: the model has no multi-token-prediction head "
				  "(config.json mtp_num_hidden_layers)", dir);
	if (!c->family->head_load)
		return atlas_errf(err, errlen, -ENOTSUP,
				  "%s: %s: the %s family has no multi-token-prediction head", dir,
				  c->architecture, c->family->name);
	m->head = true;
	return c->family->head_load(m, err, errlen);
}

/* Load from dir, or make dummy weights of the shape dir names (dummy);
 * the model's MTP head instead of the model when head. */
static int load(const char *dir, bool dummy, bool head, struct kt_backend *be, int max_tokens,
		int max_out, struct model **out, char *err, size_t errlen)
{
	struct model *m;
	int rc;

	if (max_tokens <= 0 || max_out <= 0)
		return atlas_errf(err, errlen, -EINVAL, "%s: max_tokens %d and max_out %d must be "
				  "positive", dir, max_tokens, max_out);
	m = calloc(1, sizeof *m);
	if (!m)
		return atlas_errf(err, errlen, -ENOMEM, "%s: out of memory", dir);
	m->be = be;
	m->max_tokens = max_tokens;
	m->max_out = max_out;
	if (dummy)
		rc = model_shape_config(dir, &m->cfg, err, errlen);
	else if (!(rc = model_config_load(dir, &m->cfg, err, errlen)))
		rc = st_open_dir(dir, &m->st, err, errlen);
	if (!rc)
		rc = head ? head_load(m, dir, err, errlen) : m->cfg.family->load(m, err, errlen);
	if (rc) {
		model_free(m);
		return rc;
	}
	/* Every weight is the backend's copy now. */
	st_close(m->st);
	m->st = NULL;
	log_info("%s: %s%s, %d layers, %llu parameters (%s%s), %.1f MiB of weights on %s", dir,
		 m->cfg.architecture, head ? " MTP head" : "", m->cfg.n_layers,
		 (unsigned long long)m->info.parameters,
		 m->info.dtype, dummy ? ", dummy" : "", (double)m->info.device_bytes / (1 << 20),
		 be->info.backend);
	*out = m;
	return 0;
}

int model_load(const char *dir, struct kt_backend *be, int max_tokens, int max_out,
	       struct model **out, char *err, size_t errlen)
{
	return load(dir, false, false, be, max_tokens, max_out, out, err, errlen);
}

int model_load_dummy(const char *shape, struct kt_backend *be, int max_tokens, int max_out,
		     struct model **out, char *err, size_t errlen)
{
	return load(shape, true, false, be, max_tokens, max_out, out, err, errlen);
}

bool model_config_has_head(const struct model_config *c)
{
	return c->n_mtp_layers > 0 && c->family && c->family->head_load;
}

int model_load_head(const char *dir, bool dummy, struct kt_backend *be, int max_tokens,
		    int max_out, struct model **out, char *err, size_t errlen)
{
	return load(dir, dummy, true, be, max_tokens, max_out, out, err, errlen);
}

void model_free(struct model *m)
{
	if (!m)
		return;
	model_free_weights(m);
	if (m->cfg.family)
		m->cfg.family->free(m);
	st_close(m->st);
	free(m);
}

const struct model_config *model_get_config(const struct model *m)
{
	return &m->cfg;
}

void model_get_info(const struct model *m, struct model_info *out)
{
	*out = m->info;
}

int model_forward(struct model *m, const struct model_step *s)
{
	return m->head ? m->cfg.family->head_forward(m, s) : m->cfg.family->forward(m, s);
}
