/* Recurrent state slots (seq.h): one f32 row per sequence in each linear-
 * attention layer's tensor, handed out from a free stack. */
#include "engine/seq/seq.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

int state_pool_init(struct state_pool *p, struct kt_backend *be, int n_layers, int64_t floats,
		    int n_slots, char *err, size_t errlen)
{
	memset(p, 0, sizeof *p);
	p->be = be;
	if (n_layers == 0)
		return 0;
	p->n_layers = n_layers;
	p->floats = floats;
	p->n_slots = n_slots;
	p->layers = calloc((size_t)n_layers, sizeof *p->layers);
	p->free_ids = malloc((size_t)n_slots * sizeof *p->free_ids);
	if (!p->layers || !p->free_ids) {
		state_pool_free(p);
		return atlas_errf(err, errlen, -ENOMEM, "state: out of host memory");
	}
	for (int l = 0; l < n_layers; l++) {
		int rc = kt_alloc(be, KT_F32, n_slots, floats, &p->layers[l]);
		if (rc) {
			state_pool_free(p);
			return atlas_errf(err, errlen, rc,
					  "state: cannot allocate %d slots of %lld floats for %d "
					  "layers on the %s backend", n_slots, (long long)floats,
					  n_layers, be->info.backend);
		}
	}
	/* Low slots on top of the stack: a fresh pool hands out 0, 1, 2, ... */
	for (int i = 0; i < n_slots; i++)
		p->free_ids[i] = n_slots - 1 - i;
	p->n_free = n_slots;
	return 0;
}

void state_pool_free(struct state_pool *p)
{
	for (int l = 0; p->layers && l < p->n_layers; l++)
		if (p->layers[l].data)
			kt_free(p->be, &p->layers[l]);
	free(p->layers);
	free(p->free_ids);
	memset(p, 0, sizeof *p);
}

int state_slot_alloc(struct state_pool *p)
{
	return p->n_free ? p->free_ids[--p->n_free] : -ENOSPC;
}

void state_slot_free(struct state_pool *p, int slot)
{
	p->free_ids[p->n_free++] = slot;
}

int state_slot_copy(struct state_pool *p, int dst, int src)
{
	int rc = kv_journal_add(p->journal, KV_COPY_STATE, dst, src);
	if (rc)
		return rc;
	for (int l = 0; l < p->n_layers; l++) {
		const struct kt_tensor d = kt_rows(p->layers[l], dst, 1);
		const struct kt_tensor s = kt_rows(p->layers[l], src, 1);
		rc = kt_copy(p->be, &d, &s);
		if (rc)
			return rc;
	}
	return 0;
}

int state_slot_save(struct state_pool *p, int slot, float *host)
{
	const size_t bytes = (size_t)p->floats * sizeof(float);
	if (slot < 0 || slot >= p->n_slots)
		return -EINVAL;
	for (int l = 0; l < p->n_layers; l++) {
		int rc = kt_download(p->be, host + (size_t)l * (size_t)p->floats, &p->layers[l],
				     (size_t)slot * bytes, bytes);
		if (rc)
			return rc;
	}
	return 0;
}

int state_slot_load(struct state_pool *p, int slot, const float *host)
{
	const size_t bytes = (size_t)p->floats * sizeof(float);
	if (slot < 0 || slot >= p->n_slots)
		return -EINVAL;
	for (int l = 0; l < p->n_layers; l++) {
		int rc = kt_upload(p->be, &p->layers[l], (size_t)slot * bytes,
				   host + (size_t)l * (size_t)p->floats, bytes);
		if (rc)
			return rc;
	}
	return 0;
}
