/* An expert-parallelism worker (engine.h atlas_ep_worker_run; DESIGN §10):
 * rank r of ep ranks, a process that runs the head's step commands.
 *
 *   open the backend; join the head (HELLO, WELCOME, the communicator)
 *   load the model: the shared layers and this rank's experts
 *   loop: STEP   repeat the head's KV copies, run the command (exec_run,
 *                the same executor as the head's), report a failure (FAIL)
 *         BYE    the epoch ended: join again, keeping the model loaded
 *
 * The worker's KV pool mirrors the head's: the head's scheduler owns the
 * block ids and every device write comes from the command stream. A
 * worker that cannot reach its head for ep_join_timeout ends: an error
 * before it ever joined, the normal end after.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "engine/engine.h"
#include "engine/ep/ep.h"
#include "engine/ep/net.h"
#include "engine/ep/proto.h"
#include "engine/internal.h"

/* Pause between attempts to reach the head. */
#define WORKER_RETRY_MS 200

struct worker {
	struct atlas_config cfg;
	int rank;
	int timeout_ms;
	int fd;                         /* control connection, -1 none */
	uint32_t epoch;                 /* the last joined, 0 before the first */
	struct kt_backend *be;
	uint64_t model_id;
	struct exec *x;
	struct step_cmd cmd;
	unsigned char *buf;             /* [EP_PAYLOAD_MAX] a message's payload */
};

static uint32_t get32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Connect, say HELLO, take the WELCOME and open the communicator. -EAGAIN:
 * the head is not there (yet); -EPERM: it refused this worker (err). */
static int join_once(struct worker *w, char *err, size_t errlen)
{
	struct ep_hello h = { .rank = (uint32_t)w->rank, .n_ranks = (uint32_t)w->cfg.ep,
			      .model = w->model_id, .config = ep_config_fingerprint(&w->cfg) };
	unsigned char b[EP_HELLO_BYTES > EP_WELCOME_BYTES ? EP_HELLO_BYTES : EP_WELCOME_BYTES];
	struct ep_header hd;
	int fd, rc;

	ep_host_name(h.host, sizeof h.host);
	snprintf(h.device, sizeof h.device, "%s", w->be->info.name);
	snprintf(h.backend, sizeof h.backend, "%s", w->be->info.backend);
	if (ep_connect(w->cfg.ep_address, w->timeout_ms, &fd, err, errlen))
		return -EAGAIN;
	ep_hello_encode(&h, b);
	if ((rc = ep_send_msg(fd, EP_HELLO, b, EP_HELLO_BYTES, w->timeout_ms)) ||
	    (rc = ep_recv_header(fd, &hd, -1, err, errlen))) {
		close(fd);
		return rc == -EPROTO ? -EPERM : -EAGAIN;
	}
	if (hd.type == EP_REFUSE) {
		char why[512] = { 0 };
		ep_recv_all(fd, why, ATLAS_MIN(hd.bytes, sizeof why - 1), w->timeout_ms);
		close(fd);
		return atlas_errf(err, errlen, -EPERM, "ep: the head at %s refused rank %d: %s",
				  w->cfg.ep_address, w->rank, why);
	}
	if (hd.type != EP_WELCOME || hd.bytes != EP_WELCOME_BYTES ||
	    ep_recv_all(fd, b, EP_WELCOME_BYTES, w->timeout_ms)) {
		close(fd);
		return -EAGAIN;
	}
	struct ep_welcome wel;
	ep_welcome_decode(b, &wel);
	struct kt_comm_spec spec = { .kind = (enum kt_comm_kind)wel.comm_kind, .rank = w->rank,
				     .n_ranks = w->cfg.ep, .timeout_ms = w->timeout_ms };
	memcpy(spec.id, wel.id, sizeof spec.id);
	for (int r = 0; r < KT_COMM_MAX_RANKS; r++)
		spec.fds[r] = -1;
	if (spec.kind == KT_COMM_SOCKET) {
		unsigned char p[8];
		int cfd;
		for (int i = 0; i < 4; i++) {
			p[i] = (unsigned char)((uint32_t)w->rank >> (8 * i));
			p[4 + i] = (unsigned char)(wel.epoch >> (8 * i));
		}
		if (ep_connect(w->cfg.ep_address, w->timeout_ms, &cfd, err, errlen)) {
			close(fd);
			return -EAGAIN;
		}
		if (ep_send_msg(cfd, EP_COMM, p, sizeof p, w->timeout_ms)) {
			close(cfd);
			close(fd);
			return -EAGAIN;
		}
		spec.fds[0] = cfd;
	}
	if ((rc = kt_comm_open(w->be, &spec, err, errlen))) {
		close(fd);
		return rc;
	}
	w->fd = fd;
	w->epoch = wel.epoch;
	log_info("ep: rank %d joined epoch %u of the head at %s", w->rank, wel.epoch,
		 w->cfg.ep_address);
	return 0;
}

/* join_once until it works, for at most ep_join_timeout. */
static int join(struct worker *w, char *err, size_t errlen)
{
	const uint64_t deadline = atlas_now_ns() + (uint64_t)(w->cfg.ep_join_timeout * 1e9);
	for (;;) {
		int rc = join_once(w, err, errlen);
		if (rc != -EAGAIN)
			return rc;
		if (atlas_now_ns() >= deadline)
			return atlas_errf(err, errlen, -ETIMEDOUT,
					  "ep: rank %d: no head at %s %s for %g s", w->rank,
					  w->cfg.ep_address, w->epoch ? "any more" : "answered",
					  w->cfg.ep_join_timeout);
		usleep(WORKER_RETRY_MS * 1000);
	}
}

/* exec_join_fn: the first join, before the model loads (its rank decides
 * which experts load). */
static int first_join(void *ctx, struct kt_backend *be, char *err, size_t errlen)
{
	struct worker *w = ctx;
	w->be = be;
	int rc = ep_model_identity(&w->cfg, be, &w->model_id, err, errlen);
	return rc ? rc : join(w, err, errlen);
}

/* Run one STEP payload of n bytes: its copies, then its command. */
static int run_step(struct worker *w, uint32_t n, char *err, size_t errlen)
{
	if (n < 4 || get32(w->buf) > (n - 4) / 12)
		return atlas_errf(err, errlen, -EPROTO, "ep: a damaged STEP message");
	const uint32_t copies = get32(w->buf);
	int rc = 0;
	for (uint32_t i = 0; i < copies && !rc; i++) {
		const unsigned char *c = w->buf + 4 + 12 * (size_t)i;
		const int kind = (int)get32(c), dst = (int)get32(c + 4), src = (int)get32(c + 8);
		const bool block = kind == KV_COPY_BLOCK;
		const int limit = block ? w->x->pool.kv.n_blocks : w->x->pool.state.n_slots;
		if ((kind != KV_COPY_BLOCK && kind != KV_COPY_STATE) || dst < 0 || src < 0 ||
		    dst >= limit || src >= limit)
			return atlas_errf(err, errlen, -EPROTO,
					  "ep: a KV copy %d -> %d outside the pool", src, dst);
		rc = block ? kv_block_copy(&w->x->pool.kv, dst, src)
			   : state_slot_copy(&w->x->pool.state, dst, src);
	}
	if (rc)
		return atlas_errf(err, errlen, rc, "ep: a KV copy failed: %s", strerror(-rc));
	const size_t off = 4 + 12 * (size_t)copies;
	if ((rc = step_decode(w->buf + off, n - off, &w->x->lim, &w->cmd)))
		return atlas_errf(err, errlen, rc, "ep: a damaged step command");
	struct step_result res;
	return exec_run(w->x, &w->cmd, &res, err, errlen);
}

/* Tell the head why this rank failed a step. */
static void report(struct worker *w, int rc, const char *why)
{
	char msg[1024];
	const size_t len = strlen(why) + 1 < sizeof msg - 4 ? strlen(why) + 1 : sizeof msg - 4;
	const int32_t code = rc;
	memcpy(msg, &code, 4);
	memcpy(msg + 4, why, len);
	msg[3 + len] = '\0';
	ep_send_msg(w->fd, EP_FAIL, msg, (uint32_t)(4 + len), w->timeout_ms);
}

/* Serve epochs until one cannot be joined. */
static int serve(struct worker *w, char *err, size_t errlen)
{
	for (;;) {
		struct ep_header hd;
		int rc = ep_recv_header(w->fd, &hd, -1, err, errlen);
		if (!rc && hd.type == EP_STEP) {
			if ((rc = ep_recv_all(w->fd, w->buf, hd.bytes, w->timeout_ms)))
				goto rejoin;
			if ((rc = run_step(w, hd.bytes, err, errlen))) {
				log_error("ep: rank %d: step failed: %s", w->rank, err);
				report(w, rc, err);
			}
			continue;
		}
		if (rc == -EPROTO) {
			log_error("ep: rank %d: %s", w->rank, err);
			return rc;
		}
		if (!rc && hd.type != EP_BYE)
			log_warn("ep: rank %d: unexpected message %u from the head", w->rank, hd.type);
rejoin:
		log_info("ep: rank %d: epoch %u ended (%s); joining again", w->rank, w->epoch,
			 rc ? strerror(-rc) : "the head said BYE");
		close(w->fd);
		w->fd = -1;
		/* End this epoch's communicator now, while the other ranks end
		 * theirs: one kept until the next epoch can hold up their
		 * teardown (NCCL's). */
		kt_comm_close(w->be);
		if ((rc = join(w, err, errlen)) ||
		    (rc = ep_send_msg(w->fd, EP_READY, NULL, 0, w->timeout_ms)))
			return rc;
	}
}

int atlas_ep_worker_run(const struct atlas_config *cfg, int rank, char *err, size_t errlen)
{
	int rc = atlas_config_validate(cfg, err, errlen);
	if (rc)
		return rc;
	if (cfg->ep < 2 || rank < 1 || rank >= cfg->ep)
		return atlas_errf(err, errlen, -EINVAL,
				  "ep: a worker's rank must be 1 .. ep-1 (ep = %d, rank %d)", cfg->ep,
				  rank);
	struct worker w = { .cfg = *cfg, .rank = rank, .fd = -1,
			    .timeout_ms = (int)(cfg->ep_timeout * 1000) };
	snprintf(w.cfg.model, sizeof w.cfg.model, "%s", atlas_config_model_dir(cfg));
	/* resolved as the head resolves it: the two compare it */
	w.cfg.chunk_size = atlas_chunk_size(cfg);
	struct step_limits lim;
	engine_step_limits(&w.cfg, &lim);
	w.buf = malloc(EP_PAYLOAD_MAX);
	if (!w.buf)
		return atlas_errf(err, errlen, -ENOMEM, "out of memory");
	rc = exec_open_joined(&w.cfg, EXEC_MODEL, engine_seq_slots(&w.cfg), &lim, first_join, &w,
			      &w.x, err, errlen);
	if (!rc && (rc = step_cmd_alloc(&w.cmd, &w.x->lim)))
		atlas_errf(err, errlen, rc, "out of memory");
	if (rc && w.fd >= 0)
		report(&w, rc, err);
	if (!rc)
		rc = ep_send_msg(w.fd, EP_READY, NULL, 0, w.timeout_ms);
	if (!rc) {
		log_info("ep: rank %d of %d serving %s on %s", rank, cfg->ep, w.cfg.model,
			 w.be->info.name);
		rc = serve(&w, err, errlen);
		/* The head went away for good after serving: the normal end. */
		if (rc == -ETIMEDOUT) {
			log_info("%s; ending", err);
			rc = 0;
		}
	}
	if (w.fd >= 0)
		close(w.fd);
	step_cmd_free(&w.cmd);
	exec_close(w.x);
	free(w.buf);
	return rc;
}
