/* Fuzz target: lines written to a session's ctl file, through the parser
 * they reach (atlas_params_parse, split as fs/ctl.c splits them), then
 * atlas_params_format of the result, which must parse back to the same
 * settings. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "fuzz.h"

static void parse_text(char *text, struct atlas_params *p)
{
	bool stop_seen = false;
	char err[512];
	for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
		line += strspn(line, " \t");
		char *value = line + strcspn(line, " \t");
		if (*value)
			*value++ = 0;
		atlas_params_parse(p, line, value, &stop_seen, err, sizeof err);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *text = malloc(size + 1);
	memcpy(text, data, size);
	text[size] = 0;
	struct atlas_params p = { .temperature = 0.7f, .top_p = 1, .max_tokens = 16,
				  .mode = ATLAS_MODE_CHAT, .spec_k = 4 };
	parse_text(text, &p);
	free(text);

	size_t n = atlas_params_format(&p, NULL, 0);
	char *lines = malloc(n + 1);
	if (atlas_params_format(&p, lines, n + 1) != n)
		__builtin_trap();
	struct atlas_params back = p;
	back.n_stop = 0;
	back.system[0] = 0;
	char *copy = strdup(lines);
	parse_text(copy, &back);
	free(copy);
	size_t m = atlas_params_format(&back, NULL, 0);
	char *again = malloc(m + 1);
	atlas_params_format(&back, again, m + 1);
	if (m != n || memcmp(again, lines, n) != 0)
		__builtin_trap();
	free(again);
	free(lines);
	return 0;
}
