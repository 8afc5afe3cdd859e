/* Internal to the fake engine of tests/fs: its turns and its settings. */
#ifndef ATLAS_TESTS_FS_FAKE_ENGINE_H
#define ATLAS_TESTS_FS_FAKE_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"

struct turn {
	uint64_t number;           /* the scripted fields come from fake_script() */
	char *prompt;              /* as submitted; owned */
	size_t prompt_len;
	char *text;                /* the whole scripted output; owned */
	size_t text_len;
	size_t out_len;            /* bytes of text released so far */
	uint64_t n_chars;          /* characters released */
	unsigned delay_ms;
	bool fail, hang;
	bool done;
	int error;
	char finish[16];
	uint64_t next_ns, t_submit_ns, t_first_ns, t_last_ns;
};

/* Fill t's prompt and script from the prompt text (see fake_engine.c). */
int fake_script(struct turn *t, const char *text, size_t len, char *err, size_t errlen);
int fake_params_validate(const struct atlas_params *p, char *err, size_t errlen);

#endif
