/* The messages between expert parallelism's head and its workers (DESIGN
 * §10), over one TCP connection per worker; the communicator's collectives
 * use connections of their own.
 *
 * Every message is a 16-byte header and a payload, little-endian:
 *
 *   u32 magic "atep", u16 version, u16 type, u32 payload bytes, u32 0
 *
 *   HELLO    worker -> head   u32 rank, u32 n_ranks, u64 model identity,
 *                             u64 configuration fingerprint, char host[64],
 *                             char device[128], char backend[16]
 *   WELCOME  head -> worker   u32 epoch, u32 comm kind, u8 comm id[128]
 *   REFUSE   head -> worker   text: why (a mismatch, a rank taken)
 *   STEP     head -> worker   u32 n_copies, n_copies x (i32 kind, dst, src),
 *                             then a step command's byte form (step wire.c)
 *   READY    worker -> head   (empty) its model is loaded and its communicator
 *                             open: it runs steps from now on
 *   FAIL     worker -> head   i32 errno, text: a step (or loading) failed
 *   BYE      head -> worker   the epoch ends (atlasd stops, or a rank was
 *                             lost): the worker joins again
 *
 * A worker opens its communicator connection (KT_COMM_SOCKET) after the
 * WELCOME: a header of type COMM and the payload u32 rank, u32 epoch.
 * The version changes whenever any of this does; a peer of another version
 * is refused with a message that names both.
 */
#ifndef ATLAS_ENGINE_EP_PROTO_H
#define ATLAS_ENGINE_EP_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"

#define EP_MAGIC 0x70657461u    /* "atep" */
#define EP_VERSION 1
#define EP_HEADER_BYTES 16
/* The largest payload either side accepts (a step command of the largest
 * limits fits well within it). */
#define EP_PAYLOAD_MAX (64u << 20)

enum ep_msg { EP_HELLO = 1, EP_WELCOME, EP_REFUSE, EP_STEP, EP_FAIL, EP_BYE, EP_COMM, EP_READY };

struct ep_header {
	uint32_t magic;
	uint16_t version, type;
	uint32_t bytes;
};

struct ep_hello {
	uint32_t rank, n_ranks;
	uint64_t model;                 /* persist_identity's model fingerprint */
	uint64_t config;                /* ep_config_fingerprint() */
	char host[64];
	char device[128];
	char backend[16];
};

struct ep_welcome {
	uint32_t epoch;
	uint32_t comm_kind;             /* enum kt_comm_kind */
	unsigned char id[KT_COMM_ID_BYTES];
};

#define EP_HELLO_BYTES (4 + 4 + 8 + 8 + 64 + 128 + 16)
#define EP_WELCOME_BYTES (4 + 4 + KT_COMM_ID_BYTES)

/* Send a header of type and bytes, then the payload. */
int ep_send_msg(int fd, enum ep_msg type, const void *payload, uint32_t bytes, int timeout_ms);
/* Receive a header: -EPROTO for a bad magic, another version or a payload
 * past EP_PAYLOAD_MAX (err says which). */
int ep_recv_header(int fd, struct ep_header *h, int timeout_ms, char *err, size_t errlen);

void ep_hello_encode(const struct ep_hello *h, unsigned char *buf);
void ep_hello_decode(const unsigned char *buf, struct ep_hello *h);
void ep_welcome_encode(const struct ep_welcome *w, unsigned char *buf);
void ep_welcome_decode(const unsigned char *buf, struct ep_welcome *w);

struct atlas_config;
/* A hash of the configuration keys every rank must agree on (the model
 * itself is checked by its identity): the load format, the backend and its
 * cpu_precision (the ranks' arithmetic), context, KV block size, batch and
 * chunk sizes, spec_k and ep. */
uint64_t ep_config_fingerprint(const struct atlas_config *c);

#endif
