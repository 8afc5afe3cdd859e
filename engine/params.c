/* Session settings: a new session's defaults, and what the engine's model
 * allows (their text form is in api_text.c). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "engine/internal.h"

void params_defaults(const struct atlas_engine *e, struct atlas_params *p)
{
	const struct atlas_config *c = &e->cfg;
	memset(p, 0, sizeof *p);
	p->temperature = c->temperature;
	p->top_p = c->top_p;
	p->top_k = c->top_k;
	p->max_tokens = c->max_tokens;
	p->seed = c->seed;
	p->mode = c->mode;
	if (p->mode == ATLAS_MODE_AUTO)
		p->mode = e->tok && tok_chat_style(e->tok) != TOK_CHAT_NONE ? ATLAS_MODE_CHAT
									      : ATLAS_MODE_RAW;
	snprintf(p->system, sizeof p->system, "%s", c->system);
	p->spec = c->spec;
	p->spec_k = c->spec_k;
}

int params_validate(const struct atlas_engine *e, const struct atlas_params *p, char *err,
		    size_t errlen)
{
	if (!(p->temperature >= 0 && p->temperature <= 100))
		return atlas_errf(err, errlen, -EINVAL, "temperature: %g is not in [0, 100]",
				  p->temperature);
	if (!(p->top_p > 0 && p->top_p <= 1))
		return atlas_errf(err, errlen, -EINVAL, "top_p: %g is not in (0, 1]", p->top_p);
	if (p->top_k < 0)
		return atlas_errf(err, errlen, -EINVAL, "top_k: %d is negative", p->top_k);
	if (p->max_tokens < 1)
		return atlas_errf(err, errlen, -EINVAL, "max_tokens: %d is not >= 1", p->max_tokens);
	if (p->mode != ATLAS_MODE_CHAT && p->mode != ATLAS_MODE_RAW)
		return atlas_errf(err, errlen, -EINVAL, "mode: must be chat or raw");
	if (p->mode == ATLAS_MODE_CHAT && (!e->tok || tok_chat_style(e->tok) == TOK_CHAT_NONE))
		return atlas_errf(err, errlen, -EINVAL,
				  "mode chat: the model has no chat template (use raw)");
	if ((unsigned)p->spec > ATLAS_SPEC_MTP)
		return atlas_errf(err, errlen, -EINVAL,
				  "spec: must be off, auto, ngram, draft or mtp");
	if (p->spec == ATLAS_SPEC_DRAFT && !e->spec.drafter[SPEC_DRAFTER_DRAFT])
		return atlas_errf(err, errlen, -EINVAL,
				  "spec: draft needs a draft model, and atlasd has none (its "
				  "draft_model key)");
	if (p->spec == ATLAS_SPEC_MTP && !e->spec.drafter[SPEC_DRAFTER_MTP])
		return atlas_errf(err, errlen, -EINVAL,
				  "spec: mtp needs the model's multi-token-prediction head, and "
				  "%s", e->mc->n_mtp_layers ? "atlasd did not load it (its mtp_head key)"
							    : "the model has none");
	if (p->spec_k < 1 || p->spec_k > ATLAS_SPEC_K_MAX)
		return atlas_errf(err, errlen, -EINVAL, "spec_k: %d is not in [1, %d]", p->spec_k,
				  ATLAS_SPEC_K_MAX);
	if (p->n_stop < 0 || p->n_stop > ATLAS_STOP_MAX)
		return atlas_errf(err, errlen, -EINVAL, "stop: at most %d strings", ATLAS_STOP_MAX);
	return 0;
}
