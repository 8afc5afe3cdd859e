/* The family table (family.h): every architecture atlas runs, and the family
 * folder that runs it. */
#include "engine/model/family.h"

#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "engine/model/dense/dense.h"
#include "engine/model/hybrid/hybrid.h"
#include "engine/model/script/script.h"

static const struct model_arch archs[] = {
	{ "Qwen3ForCausalLM", "qwen3", &dense_family, DENSE_QWEN3 },
	{ "LlamaForCausalLM", "llama", &dense_family, DENSE_LLAMA },
	{ "Qwen3MoeForCausalLM", "qwen3_moe", &dense_family, DENSE_QWEN3_MOE },
	{ "Qwen3NextForCausalLM", "qwen3_next", &hybrid_family, HYBRID_QWEN3_NEXT },
	{ "Qwen3_5ForCausalLM", "qwen3_5_text", &hybrid_family, HYBRID_QWEN35 },
	{ "Qwen3_5MoeForCausalLM", "qwen3_5_moe_text", &hybrid_family, HYBRID_QWEN35_MOE },
	/* answers scripted by rules, for tests without weights (script.h) */
	{ "AtlasScriptForCausalLM", "atlas_script", &script_family, 0 },
};

const struct model_arch *model_arch_find(const char *architecture, const char *model_type)
{
	for (size_t i = 0; i < ATLAS_ARRAY_LEN(archs); i++)
		if ((architecture && !strcmp(architecture, archs[i].architecture)) ||
		    (model_type && !strcmp(model_type, archs[i].model_type)))
			return &archs[i];
	return NULL;
}

const char *model_arch_names(void)
{
	static char list[512];

	if (!list[0]) {
		size_t n = 0;
		for (size_t i = 0; i < ATLAS_ARRAY_LEN(archs) && n < sizeof list; i++)
			n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "",
					      archs[i].architecture);
	}
	return list;
}
