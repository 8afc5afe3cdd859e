/* The drafters' table (drafter.h): every drafter is one entry. */
#include "engine/spec/drafter.h"

const struct drafter_ops *const spec_drafters[SPEC_DRAFTERS] = {
	[SPEC_DRAFTER_NGRAM] = &ngram_drafter_ops,
	[SPEC_DRAFTER_DRAFT] = &draft_model_ops,
	[SPEC_DRAFTER_MTP] = &mtp_drafter_ops,
};
