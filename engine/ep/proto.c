/* Encoding the messages of expert parallelism (proto.h). */
#include "engine/ep/proto.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#include "common/err.h"
#include "config/config.h"
#include "engine/ep/net.h"

static void put32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static void put64(unsigned char *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get32(const unsigned char *p)
{
	uint32_t v = 0;
	for (int i = 3; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static uint64_t get64(const unsigned char *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

/* A fixed-size text field: copied, and always terminated when read. */
static void put_text(unsigned char *p, const char *s, size_t n)
{
	const size_t len = strnlen(s, n - 1);
	memset(p, 0, n);
	memcpy(p, s, len);
}

static void get_text(const unsigned char *p, char *s, size_t n)
{
	memcpy(s, p, n);
	s[n - 1] = '\0';
}

int ep_send_msg(int fd, enum ep_msg type, const void *payload, uint32_t bytes, int timeout_ms)
{
	unsigned char h[EP_HEADER_BYTES] = { 0 };
	put32(h, EP_MAGIC);
	h[4] = EP_VERSION & 0xff;
	h[5] = EP_VERSION >> 8;
	h[6] = (unsigned char)type;
	h[7] = (unsigned char)((unsigned)type >> 8);
	put32(h + 8, bytes);
	int rc = ep_send_all(fd, h, sizeof h, timeout_ms);
	return rc || !bytes ? rc : ep_send_all(fd, payload, bytes, timeout_ms);
}

int ep_recv_header(int fd, struct ep_header *h, int timeout_ms, char *err, size_t errlen)
{
	unsigned char b[EP_HEADER_BYTES];
	int rc = ep_recv_all(fd, b, sizeof b, timeout_ms);
	if (rc)
		return rc;
	h->magic = get32(b);
	h->version = (uint16_t)(b[4] | b[5] << 8);
	h->type = (uint16_t)(b[6] | b[7] << 8);
	h->bytes = get32(b + 8);
	if (h->magic != EP_MAGIC)
		return atlas_errf(err, errlen, -EPROTO, "ep: the peer is not an atlas rank");
	if (h->version != EP_VERSION)
		return atlas_errf(err, errlen, -EPROTO,
				  "ep: the peer speaks protocol version %u, this atlasd %u: run "
				  "the same atlas on every rank", h->version, EP_VERSION);
	if (h->bytes > EP_PAYLOAD_MAX)
		return atlas_errf(err, errlen, -EPROTO, "ep: a message of %u bytes is too long",
				  h->bytes);
	return 0;
}

void ep_hello_encode(const struct ep_hello *h, unsigned char *b)
{
	put32(b, h->rank);
	put32(b + 4, h->n_ranks);
	put64(b + 8, h->model);
	put64(b + 16, h->config);
	put_text(b + 24, h->host, sizeof h->host);
	put_text(b + 88, h->device, sizeof h->device);
	put_text(b + 216, h->backend, sizeof h->backend);
}

void ep_hello_decode(const unsigned char *b, struct ep_hello *h)
{
	h->rank = get32(b);
	h->n_ranks = get32(b + 4);
	h->model = get64(b + 8);
	h->config = get64(b + 16);
	get_text(b + 24, h->host, sizeof h->host);
	get_text(b + 88, h->device, sizeof h->device);
	get_text(b + 216, h->backend, sizeof h->backend);
}

void ep_welcome_encode(const struct ep_welcome *w, unsigned char *b)
{
	put32(b, w->epoch);
	put32(b + 4, w->comm_kind);
	memcpy(b + 8, w->id, KT_COMM_ID_BYTES);
}

void ep_welcome_decode(const unsigned char *b, struct ep_welcome *w)
{
	w->epoch = get32(b);
	w->comm_kind = get32(b + 4);
	memcpy(w->id, b + 8, KT_COMM_ID_BYTES);
}

uint64_t ep_config_fingerprint(const struct atlas_config *c)
{
	char text[256];
	const int n = snprintf(text, sizeof text, "%s %s %s %d %d %d %d %d %d", c->load_format,
			       c->backend, c->cpu_precision, c->context, c->kv_block_size,
			       c->max_batch, c->chunk_size, c->spec_k, c->ep);
	return XXH3_64bits(text, (size_t)ATLAS_MIN(n, (int)sizeof text - 1));
}
