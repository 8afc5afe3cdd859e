/* The byte form of a step command (step.h): what a recorder keeps and what
 * expert-parallel workers will receive. Little-endian whatever the host,
 * fixed-size fields, a magic and a version first:
 *
 *   u32 magic, u16 version, u16 0, u64 number,
 *   u32 n_seqs, n_rows, n_out, n_table,
 *   n_seqs x (i32 slot, row, n_rows, pos0, table, n_blocks, state_slot),
 *   n_rows x i32 id,
 *   n_out x (i32 row, u8 sample, u8 keep, u16 0, f32 temperature, f32 top_p,
 *            i32 top_k, f32 u),
 *   n_table x i32 block
 *
 * Decoding checks sizes only; step_cmd_check() checks meaning.
 */
#include "engine/step/step.h"

#include <errno.h>
#include <string.h>

#define HEADER_BYTES 32
#define SEQ_BYTES 28
#define OUT_BYTES 24

/* Where the next field is written (p) or read (q). */
struct cursor {
	unsigned char *p;
	const unsigned char *q;
};

static void put32(struct cursor *c, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		*c->p++ = (unsigned char)(v >> (8 * i));
}

static void put16(struct cursor *c, uint16_t v)
{
	*c->p++ = (unsigned char)v;
	*c->p++ = (unsigned char)(v >> 8);
}

static void putf(struct cursor *c, float f)
{
	uint32_t v;
	memcpy(&v, &f, sizeof v);
	put32(c, v);
}

static uint32_t get32(struct cursor *c)
{
	uint32_t v = 0;
	for (int i = 0; i < 4; i++)
		v |= (uint32_t)c->q[i] << (8 * i);
	c->q += 4;
	return v;
}

static uint16_t get16(struct cursor *c)
{
	uint16_t v = (uint16_t)(c->q[0] | c->q[1] << 8);
	c->q += 2;
	return v;
}

static float getf(struct cursor *c)
{
	uint32_t v = get32(c);
	float f;
	memcpy(&f, &v, sizeof f);
	return f;
}

size_t step_wire_size(const struct step_cmd *c)
{
	return HEADER_BYTES + (size_t)c->n_seqs * SEQ_BYTES + (size_t)c->n_rows * 4 +
	       (size_t)c->n_out * OUT_BYTES + (size_t)c->n_table * 4;
}

long step_encode(const struct step_cmd *c, void *buf, size_t cap)
{
	const size_t n = step_wire_size(c);
	struct cursor w = { .p = buf };

	if (n > cap)
		return -E2BIG;
	put32(&w, STEP_WIRE_MAGIC);
	put16(&w, STEP_WIRE_VERSION);
	put16(&w, 0);
	put32(&w, (uint32_t)c->number);
	put32(&w, (uint32_t)(c->number >> 32));
	put32(&w, (uint32_t)c->n_seqs);
	put32(&w, (uint32_t)c->n_rows);
	put32(&w, (uint32_t)c->n_out);
	put32(&w, (uint32_t)c->n_table);
	for (int i = 0; i < c->n_seqs; i++) {
		const struct step_seq *q = &c->seqs[i];
		const int32_t f[] = { q->slot, q->row, q->n_rows, q->pos0, q->table, q->n_blocks,
				      q->state_slot };
		for (size_t k = 0; k < sizeof f / sizeof f[0]; k++)
			put32(&w, (uint32_t)f[k]);
	}
	for (int i = 0; i < c->n_rows; i++)
		put32(&w, (uint32_t)c->ids[i]);
	for (int i = 0; i < c->n_out; i++) {
		const struct step_out *o = &c->out[i];
		put32(&w, (uint32_t)o->row);
		*w.p++ = o->sample;
		*w.p++ = o->keep;
		put16(&w, 0);
		putf(&w, o->params.temperature);
		putf(&w, o->params.top_p);
		put32(&w, (uint32_t)o->params.top_k);
		putf(&w, o->params.u);
	}
	for (int i = 0; i < c->n_table; i++)
		put32(&w, (uint32_t)c->tables[i]);
	return (long)n;
}

int step_decode(const void *buf, size_t len, const struct step_limits *l, struct step_cmd *c)
{
	struct cursor r = { .q = buf };

	if (len < HEADER_BYTES)
		return -EINVAL;
	if (get32(&r) != STEP_WIRE_MAGIC || get16(&r) != STEP_WIRE_VERSION)
		return -EPROTO;
	get16(&r);
	uint64_t number = get32(&r);
	number |= (uint64_t)get32(&r) << 32;
	const uint32_t n_seqs = get32(&r), n_rows = get32(&r), n_out = get32(&r);
	const uint32_t n_table = get32(&r);
	if (n_seqs > (uint32_t)l->max_seqs || n_rows > (uint32_t)l->max_rows ||
	    n_out > (uint32_t)l->max_out || n_table > (uint32_t)l->max_table)
		return -E2BIG;
	c->number = number;
	c->n_seqs = (int)n_seqs;
	c->n_rows = (int)n_rows;
	c->n_out = (int)n_out;
	c->n_table = (int)n_table;
	if (len != step_wire_size(c))
		return -EINVAL;
	for (int i = 0; i < c->n_seqs; i++) {
		struct step_seq *q = &c->seqs[i];
		int32_t *f[] = { &q->slot, &q->row, &q->n_rows, &q->pos0, &q->table, &q->n_blocks,
				 &q->state_slot };
		for (size_t k = 0; k < sizeof f / sizeof f[0]; k++)
			*f[k] = (int32_t)get32(&r);
	}
	for (int i = 0; i < c->n_rows; i++)
		c->ids[i] = (int32_t)get32(&r);
	for (int i = 0; i < c->n_out; i++) {
		struct step_out *o = &c->out[i];
		o->row = (int32_t)get32(&r);
		o->sample = *r.q++;
		o->keep = *r.q++;
		get16(&r);
		o->params.temperature = getf(&r);
		o->params.top_p = getf(&r);
		o->params.top_k = (int32_t)get32(&r);
		o->params.u = getf(&r);
	}
	for (int i = 0; i < c->n_table; i++)
		c->tables[i] = (int32_t)get32(&r);
	return 0;
}
