/* Fuzz target: a safetensors file (its header length, JSON header and
 * data) through st_open_dir, as a model directory holding only
 * model.safetensors. Every tensor it accepts must lie inside the file:
 * its first and last bytes are read. */
#include <stdio.h>

#include "engine/model/internal.h"
#include "fuzz.h"

/* Where the reads of tensor bytes go, so that they happen. */
static volatile unsigned sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char dir[600], err[512];
	struct st_set *set;
	if (fuzz_write("model.safetensors", data, size) != 0)
		return 0;
	if (st_open_dir(fuzz_path("", dir, sizeof dir), &set, err, sizeof err) != 0)
		return 0;
	for (int i = 0; i < set->n_tensors; i++) {
		const struct st_tensor *t = &set->tensors[i];
		if (t->nbytes) {
			sink += ((const uint8_t *)t->data)[0];
			sink += ((const uint8_t *)t->data)[t->nbytes - 1];
		}
		if (st_find(set, t->name) != t)
			__builtin_trap();
	}
	st_close(set);
	return 0;
}
