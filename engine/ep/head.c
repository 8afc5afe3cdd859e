/* The head of expert parallelism's group (ep.h): taking workers, epochs,
 * sending step commands, and noticing a rank that is gone. */
#include "engine/ep/ep.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "engine/ep/net.h"
#include "engine/ep/proto.h"
#include "engine/persist/identity.h"

/* How often the acceptor looks at its stop flag. */
#define ACCEPT_POLL_MS 100

enum rank_state {
	RANK_ABSENT,    /* never joined, or joining again after an epoch ended */
	RANK_READY,     /* said HELLO, waits for the next epoch */
	RANK_UP,        /* in the running epoch */
	RANK_GONE,      /* lost in the last epoch: died, closed or silent */
};

static const char *const state_names[] = { "absent", "ready", "up", "gone" };

struct ep_rank {
	enum rank_state state;
	int fd;                         /* control connection, -1 none */
	int comm_fd;                    /* its socket communicator's connection until
					 * comm_open takes it, -1 none */
	struct ep_hello hello;          /* what it said it is */
	char why[160];                  /* RANK_GONE: what happened */
};

struct ep_head {
	int n_ranks;
	int timeout_ms, join_timeout_ms;
	struct atlas_config cfg;        /* a copy */
	uint64_t config_fp;
	uint64_t model_id;              /* set by ep_head_join */
	struct kt_backend *be;          /* the head's, from ep_head_join */
	int listen_fd, port;
	pthread_t acceptor;
	bool acceptor_running, stop;
	pthread_mutex_t lock;           /* ranks, epoch, up, why */
	pthread_cond_t changed;         /* a rank's state or comm_fd changed */
	struct ep_rank ranks[ATLAS_EP_MAX];
	uint32_t epoch;                 /* the running (or last) epoch, 1, 2, ... */
	bool up;
	char why[256];                  /* !up: why the group is down */
	struct kv_journal journal;      /* the pool's copies since the last command */
	unsigned char *buf;             /* [cap] a STEP message */
	size_t cap;
	uint64_t steps, bytes_sent, epochs_lost;
};

static void put32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static void close_fd(int *fd)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
}

/* What is wrong with a worker's HELLO, or "" (under lock). */
static void check_hello(const struct ep_head *h, const struct ep_hello *w, char *why, size_t len)
{
	why[0] = '\0';
	if (w->n_ranks != (uint32_t)h->n_ranks)
		snprintf(why, len, "the worker is configured for ep = %u, the head for %d",
			 w->n_ranks, h->n_ranks);
	else if (w->rank < 1 || w->rank >= (uint32_t)h->n_ranks)
		snprintf(why, len, "rank %u is not one of 1 .. %d", w->rank, h->n_ranks - 1);
	else if (h->model_id && w->model != h->model_id)
		snprintf(why, len, "the worker's model (identity %016" PRIx64 ", %s) is not the "
			 "head's (%016" PRIx64 ", %s)", w->model, w->backend, h->model_id,
			 h->be ? h->be->info.backend : "?");
	else if (w->config != h->config_fp)
		snprintf(why, len, "the worker's configuration differs from the head's in one of "
			 "load_format, backend, context, kv_block_size, max_batch, chunk_size, "
			 "spec_k, ep");
	else if (h->ranks[w->rank].state == RANK_READY || h->ranks[w->rank].state == RANK_UP)
		snprintf(why, len, "rank %u has joined already (from %s)", w->rank,
			 h->ranks[w->rank].hello.host);
}

/* A new connection: a worker's HELLO, or the communicator connection of a
 * worker just welcomed. Takes fd. */
static void take_connection(struct ep_head *h, int fd)
{
	char err[ATLAS_ERRLEN], why[256];
	unsigned char b[EP_HELLO_BYTES];
	struct ep_header hd;
	int rc = ep_recv_header(fd, &hd, h->timeout_ms, err, sizeof err);

	if (rc) {
		log_warn("ep: a connection to %s said no HELLO: %s", h->cfg.ep_address,
			 rc == -EPROTO ? err : strerror(-rc));
		if (rc == -EPROTO)
			ep_send_msg(fd, EP_REFUSE, err, (uint32_t)strlen(err), h->timeout_ms);
		close(fd);
		return;
	}
	if (hd.type == EP_COMM && hd.bytes == 8) {
		unsigned char p[8];
		if (ep_recv_all(fd, p, 8, h->timeout_ms)) {
			close(fd);
			return;
		}
		const uint32_t rank = (uint32_t)(p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24);
		const uint32_t epoch = (uint32_t)(p[4] | p[5] << 8 | p[6] << 16 | (uint32_t)p[7] << 24);
		pthread_mutex_lock(&h->lock);
		if (rank >= 1 && rank < (uint32_t)h->n_ranks && epoch == h->epoch &&
		    h->ranks[rank].state == RANK_READY && h->ranks[rank].comm_fd < 0) {
			h->ranks[rank].comm_fd = fd;
			fd = -1;
			pthread_cond_broadcast(&h->changed);
		}
		pthread_mutex_unlock(&h->lock);
		if (fd >= 0)
			close(fd);
		return;
	}
	if (hd.type != EP_HELLO || hd.bytes != EP_HELLO_BYTES ||
	    ep_recv_all(fd, b, sizeof b, h->timeout_ms)) {
		close(fd);
		return;
	}
	struct ep_hello w;
	ep_hello_decode(b, &w);
	pthread_mutex_lock(&h->lock);
	check_hello(h, &w, why, sizeof why);
	if (!why[0]) {
		struct ep_rank *r = &h->ranks[w.rank];
		close_fd(&r->fd);
		close_fd(&r->comm_fd);
		r->fd = fd;
		r->hello = w;
		r->state = RANK_READY;
		log_info("ep: rank %u joined from %s (%s, %s)", w.rank, w.host, w.backend,
			 w.device);
		pthread_cond_broadcast(&h->changed);
	}
	pthread_mutex_unlock(&h->lock);
	if (why[0]) {
		log_warn("ep: refused a worker from %s as rank %u: %s", w.host, w.rank, why);
		ep_send_msg(fd, EP_REFUSE, why, (uint32_t)strlen(why), h->timeout_ms);
		close(fd);
	}
}

static void *acceptor_main(void *arg)
{
	struct ep_head *h = arg;
	for (;;) {
		pthread_mutex_lock(&h->lock);
		const bool stop = h->stop;
		pthread_mutex_unlock(&h->lock);
		if (stop)
			return NULL;
		int fd, rc = ep_accept(h->listen_fd, ACCEPT_POLL_MS, &fd);
		if (!rc)
			take_connection(h, fd);
		else if (rc != -EAGAIN && rc != -EINTR)
			usleep(ACCEPT_POLL_MS * 1000);
	}
}

int ep_head_open(const struct atlas_config *c, struct ep_head **out, char *err, size_t errlen)
{
	struct ep_head *h = calloc(1, sizeof *h);
	if (!h)
		return atlas_errf(err, errlen, -ENOMEM, "out of memory");
	h->n_ranks = c->ep;
	h->cfg = *c;
	h->timeout_ms = (int)(c->ep_timeout * 1000);
	h->join_timeout_ms = (int)(c->ep_join_timeout * 1000);
	h->config_fp = ep_config_fingerprint(c);
	h->listen_fd = -1;
	snprintf(h->why, sizeof h->why, "waiting for ranks 1 .. %d to join", c->ep - 1);
	for (int r = 0; r < ATLAS_EP_MAX; r++)
		h->ranks[r].fd = h->ranks[r].comm_fd = -1;
	h->journal.cap = 8 * (c->max_batch + 1) + 64;
	h->journal.ops = calloc((size_t)h->journal.cap, sizeof *h->journal.ops);
	pthread_mutex_init(&h->lock, NULL);
	pthread_cond_init(&h->changed, NULL);
	int rc = h->journal.ops ? 0 : atlas_errf(err, errlen, -ENOMEM, "out of memory");
	if (!rc)
		rc = ep_listen(c->ep_address, &h->listen_fd, &h->port, err, errlen);
	if (!rc && (rc = -pthread_create(&h->acceptor, NULL, acceptor_main, h)))
		atlas_errf(err, errlen, rc, "ep: cannot start the acceptor thread");
	if (rc) {
		ep_head_close(h);
		return rc;
	}
	h->acceptor_running = true;
	log_info("ep: head of %d ranks, listening at %s", h->n_ranks, c->ep_address);
	*out = h;
	return 0;
}

/* Every worker READY (under lock). */
static bool all_ready(const struct ep_head *h)
{
	for (int r = 1; r < h->n_ranks; r++)
		if (h->ranks[r].state != RANK_READY)
			return false;
	return true;
}

/* The ranks not READY, for messages (under lock). */
static void missing(const struct ep_head *h, char *buf, size_t len)
{
	size_t n = 0;
	buf[0] = '\0';
	for (int r = 1; r < h->n_ranks && n < len; r++)
		if (h->ranks[r].state != RANK_READY)
			n += (size_t)snprintf(buf + n, len - n, "%s%d", n ? ", " : "", r);
}

/* Wait for rank r's READY: its model is loaded and its communicator open
 * (a FAIL says why not). */
static int recv_ready(struct ep_head *h, int r, int timeout_ms, char *err, size_t errlen)
{
	struct ep_header hd;
	char msg[1025] = { 0 };
	int rc = ep_recv_header(h->ranks[r].fd, &hd, timeout_ms, err, errlen);
	if (rc)
		return atlas_errf(err, errlen, rc, "ep: rank %d did not say it is ready: %s", r,
				  strerror(-rc));
	if (hd.type == EP_READY && hd.bytes == 0)
		return 0;
	if (hd.type == EP_FAIL && hd.bytes >= 4 && hd.bytes <= 1024 &&
	    !ep_recv_all(h->ranks[r].fd, msg, hd.bytes, timeout_ms))
		return atlas_errf(err, errlen, -EHOSTDOWN, "ep: rank %d failed: %.400s", r, msg + 4);
	return atlas_errf(err, errlen, -EPROTO, "ep: rank %d sent message %u, not READY", r,
			  hd.type);
}

/* Start the next epoch with every worker READY (under lock, which it
 * drops while it waits for the communicator connections). wait_ready:
 * the workers have their models already and say READY once their
 * communicators are open (at the first epoch they load first, and
 * ep_head_attach waits for it). */
static int start_epoch(struct ep_head *h, bool wait_ready, char *err, size_t errlen)
{
	struct kt_comm_spec spec = { .rank = 0, .n_ranks = h->n_ranks,
				     .timeout_ms = h->timeout_ms };
	const bool nccl = !strcmp(h->be->info.backend, "cuda");
	unsigned char b[EP_WELCOME_BYTES];
	int rc = 0;

	spec.kind = nccl ? KT_COMM_NCCL : KT_COMM_SOCKET;
	for (int r = 0; r < KT_COMM_MAX_RANKS; r++)
		spec.fds[r] = -1;
	if (nccl && (rc = kt_comm_id(h->be, spec.id)))
		return atlas_errf(err, errlen, rc, "ep: cannot make the NCCL unique id: %s",
				  strerror(-rc));
	h->epoch++;
	struct ep_welcome w = { .epoch = h->epoch, .comm_kind = (uint32_t)spec.kind };
	memcpy(w.id, spec.id, sizeof w.id);
	ep_welcome_encode(&w, b);
	for (int r = 1; r < h->n_ranks && !rc; r++)
		if ((rc = ep_send_msg(h->ranks[r].fd, EP_WELCOME, b, sizeof b, h->timeout_ms)))
			atlas_errf(err, errlen, rc, "ep: rank %d: welcome: %s", r, strerror(-rc));
	const uint64_t deadline = atlas_now_ns() + (uint64_t)h->timeout_ms * 1000000u;
	for (int r = 1; r < h->n_ranks && !rc && !nccl; r++) {
		while (h->ranks[r].comm_fd < 0 && !rc) {
			struct timespec t;
			const uint64_t now = atlas_now_ns();
			if (now >= deadline) {
				rc = atlas_errf(err, errlen, -ETIMEDOUT,
						"ep: rank %d did not open its communicator connection",
						r);
				break;
			}
			clock_gettime(CLOCK_REALTIME, &t);
			t.tv_nsec += 10000000;
			if (t.tv_nsec >= 1000000000) {
				t.tv_sec++;
				t.tv_nsec -= 1000000000;
			}
			pthread_cond_timedwait(&h->changed, &h->lock, &t);
		}
		spec.fds[r] = h->ranks[r].comm_fd;
	}
	if (!rc) {
		for (int r = 1; r < h->n_ranks; r++)
			h->ranks[r].comm_fd = -1; /* the communicator owns them now */
		pthread_mutex_unlock(&h->lock);
		rc = kt_comm_open(h->be, &spec, err, errlen);
		pthread_mutex_lock(&h->lock);
	}
	if (rc)
		return rc;
	for (int r = 1; r < h->n_ranks && wait_ready && !rc; r++)
		rc = recv_ready(h, r, h->timeout_ms, err, errlen);
	if (rc)
		return rc;
	for (int r = 1; r < h->n_ranks; r++)
		h->ranks[r].state = RANK_UP;
	h->up = true;
	h->why[0] = '\0';
	h->journal.n = 0;
	log_info("ep: epoch %u: %d ranks up", h->epoch, h->n_ranks);
	return 0;
}

int ep_head_join(void *head, struct kt_backend *be, char *err, size_t errlen)
{
	struct ep_head *h = head;
	char list[128];
	int rc = ep_model_identity(&h->cfg, be, &h->model_id, err, errlen);
	if (rc)
		return rc;
	const uint64_t deadline = atlas_now_ns() + (uint64_t)h->join_timeout_ms * 1000000u;
	pthread_mutex_lock(&h->lock);
	h->be = be;
	/* Workers that said HELLO before the model's identity was known are
	 * checked again now. */
	for (int r = 1; r < h->n_ranks; r++)
		if (h->ranks[r].state == RANK_READY && h->ranks[r].hello.model != h->model_id) {
			char why[256];
			snprintf(why, sizeof why, "the worker's model (identity %016" PRIx64 ") is "
				 "not the head's (%016" PRIx64 ")", h->ranks[r].hello.model,
				 h->model_id);
			log_warn("ep: refused rank %d: %s", r, why);
			ep_send_msg(h->ranks[r].fd, EP_REFUSE, why, (uint32_t)strlen(why),
				    h->timeout_ms);
			close_fd(&h->ranks[r].fd);
			h->ranks[r].state = RANK_ABSENT;
		}
	while (!all_ready(h) && atlas_now_ns() < deadline) {
		struct timespec t;
		clock_gettime(CLOCK_REALTIME, &t);
		t.tv_sec += 1;
		pthread_cond_timedwait(&h->changed, &h->lock, &t);
	}
	if (!all_ready(h)) {
		missing(h, list, sizeof list);
		pthread_mutex_unlock(&h->lock);
		return atlas_errf(err, errlen, -ETIMEDOUT,
				  "ep: ranks %s did not join %s within %g s (start them with "
				  "`atlasd --worker RANK` and the same configuration)", list,
				  h->cfg.ep_address, h->cfg.ep_join_timeout);
	}
	rc = start_epoch(h, false, err, errlen);
	pthread_mutex_unlock(&h->lock);
	return rc;
}

int ep_head_attach(struct ep_head *h, struct seq_pool *pool, const struct step_limits *l,
		   char *err, size_t errlen)
{
	const struct step_cmd most = { .n_seqs = l->max_seqs, .n_rows = l->max_rows,
				       .n_out = l->max_out, .n_table = l->max_table };
	h->cap = 4 + 12 * (size_t)h->journal.cap + step_wire_size(&most);
	h->buf = malloc(h->cap);
	if (!h->buf)
		return atlas_errf(err, errlen, -ENOMEM, "ep: out of memory");
	pool->kv.journal = &h->journal;
	pool->state.journal = &h->journal;
	/* The first epoch's workers load their models meanwhile. */
	pthread_mutex_lock(&h->lock);
	int rc = 0;
	for (int r = 1; r < h->n_ranks && !rc; r++)
		rc = recv_ready(h, r, h->join_timeout_ms, err, errlen);
	pthread_mutex_unlock(&h->lock);
	return rc;
}

/* End the epoch (under lock): rank `gone` (or none, -1) is lost with why;
 * every other worker is told BYE and joins again. */
static void end_epoch(struct ep_head *h, int gone, const char *why)
{
	if (!h->up)
		return;
	h->up = false;
	h->epochs_lost++;
	for (int r = 1; r < h->n_ranks; r++) {
		struct ep_rank *k = &h->ranks[r];
		if (r != gone && k->fd >= 0)
			ep_send_msg(k->fd, EP_BYE, NULL, 0, ATLAS_MIN(h->timeout_ms, 1000));
		close_fd(&k->fd);
		close_fd(&k->comm_fd);
		k->state = r == gone ? RANK_GONE : RANK_ABSENT;
		if (r == gone)
			snprintf(k->why, sizeof k->why, "%s", why);
	}
	/* The workers end theirs on BYE; a communicator kept here could hold
	 * up their teardown (NCCL's). The next epoch opens a new one. */
	kt_comm_close(h->be);
	if (gone > 0)
		snprintf(h->why, sizeof h->why, "rank %d (%s) is gone: %s; waiting for it to rejoin",
			 gone, h->ranks[gone].hello.host, why);
	else
		snprintf(h->why, sizeof h->why, "a rank is gone: %s; waiting for every rank to "
			 "rejoin", why);
	log_error("ep: epoch %u ended: %s", h->epoch, h->why);
}

int ep_head_step(struct ep_head *h, const struct step_cmd *c, char *err, size_t errlen)
{
	pthread_mutex_lock(&h->lock);
	if (!h->up) {
		int rc = atlas_errf(err, errlen, -EHOSTDOWN, "ep: %s", h->why);
		pthread_mutex_unlock(&h->lock);
		return rc;
	}
	const size_t copies = (size_t)h->journal.n * 12;
	unsigned char *p = h->buf;
	put32(p, (uint32_t)h->journal.n);
	for (int i = 0; i < h->journal.n; i++) {
		put32(p + 4 + 12 * (size_t)i, (uint32_t)h->journal.ops[i].kind);
		put32(p + 8 + 12 * (size_t)i, (uint32_t)h->journal.ops[i].dst);
		put32(p + 12 + 12 * (size_t)i, (uint32_t)h->journal.ops[i].src);
	}
	long len = step_encode(c, p + 4 + copies, h->cap - 4 - copies);
	h->journal.n = 0;
	int rc = len < 0 ? (int)len : 0;
	for (int r = 1; r < h->n_ranks && !rc; r++)
		if ((rc = ep_send_msg(h->ranks[r].fd, EP_STEP, h->buf, (uint32_t)(4 + copies + len),
				      h->timeout_ms))) {
			char why[160];
			snprintf(why, sizeof why, "sending a step: %s", strerror(-rc));
			end_epoch(h, r, why);
			atlas_errf(err, errlen, -EHOSTDOWN, "ep: %s", h->why);
			rc = -EHOSTDOWN;
		}
	if (!rc) {
		h->steps++;
		h->bytes_sent += (uint64_t)(h->n_ranks - 1) * (uint64_t)(4 + copies + len);
	}
	pthread_mutex_unlock(&h->lock);
	return rc;
}

/* Which worker a failed collective lost: one whose control connection has
 * closed or said FAIL, else the communicator's broken rank. */
static int find_gone(struct ep_head *h, char *why, size_t len)
{
	for (int r = 1; r < h->n_ranks; r++) {
		struct pollfd p = { .fd = h->ranks[r].fd, .events = POLLIN };
		if (h->ranks[r].fd < 0 || poll(&p, 1, 0) <= 0)
			continue;
		char err[ATLAS_ERRLEN];
		struct ep_header hd;
		if (ep_recv_header(h->ranks[r].fd, &hd, 100, err, sizeof err) || hd.type != EP_FAIL ||
		    hd.bytes < 4 || hd.bytes > 1024) {
			snprintf(why, len, "its connection closed (the process ended?)");
			return r;
		}
		char msg[1025] = { 0 };
		if (ep_recv_all(h->ranks[r].fd, msg, hd.bytes, 100))
			snprintf(why, len, "it failed");
		else
			snprintf(why, len, "it failed: %.120s", msg + 4);
		return r;
	}
	const int b = h->be->comm.broken_rank;
	if (b > 0 && b < h->n_ranks) {
		snprintf(why, len, "%s in a collective",
			 h->be->comm.broken == ETIMEDOUT ? "silent past ep_timeout"
							  : strerror(h->be->comm.broken));
		return b;
	}
	return -1;
}

void ep_head_lost(struct ep_head *h, int rc, const char *why)
{
	char w[160];
	pthread_mutex_lock(&h->lock);
	if (h->up) {
		const int gone = find_gone(h, w, sizeof w);
		if (gone < 0)
			snprintf(w, sizeof w, "%s (%s)", why, strerror(-rc));
		end_epoch(h, gone, w);
	}
	pthread_mutex_unlock(&h->lock);
}

bool ep_head_up(struct ep_head *h, char *why, size_t len)
{
	pthread_mutex_lock(&h->lock);
	const bool up = h->up;
	if (!up && why)
		snprintf(why, len, "%s", h->why);
	pthread_mutex_unlock(&h->lock);
	return up;
}

int ep_head_resume(struct ep_head *h, char *err, size_t errlen)
{
	int rc = 0;
	pthread_mutex_lock(&h->lock);
	if (!h->up)
		rc = all_ready(h) ? start_epoch(h, true, err, errlen) : -EAGAIN;
	if (rc && rc != -EAGAIN) {
		log_error("ep: the next epoch did not start: %s", err);
		for (int r = 1; r < h->n_ranks; r++) {
			close_fd(&h->ranks[r].fd);
			close_fd(&h->ranks[r].comm_fd);
			h->ranks[r].state = RANK_ABSENT;
		}
	}
	pthread_mutex_unlock(&h->lock);
	return rc;
}

void ep_head_stats(struct ep_head *h, int n_experts, struct atlas_ep_stats *o)
{
	const int n = h->n_ranks, base = n_experts / n, extra = n_experts % n;
	char hosts[ATLAS_EP_MAX][64];

	pthread_mutex_lock(&h->lock);
	o->ranks = n;
	o->experts_per_rank = base + (extra > 0);
	o->up = h->up;
	o->epoch = h->epoch;
	snprintf(o->why, sizeof o->why, "%s", h->up ? "" : h->why);
	snprintf(o->address, sizeof o->address, "%s", h->cfg.ep_address);
	o->commands_total = h->steps;
	o->command_bytes_total = h->bytes_sent;
	o->epochs_lost_total = h->epochs_lost;
	o->hosts = 0;
	for (int r = 0; r < n && r < ATLAS_EP_RANKS; r++) {
		struct atlas_ep_rank *k = &o->rank[r];
		const struct ep_rank *q = &h->ranks[r];
		k->expert_first = r * base + ATLAS_MIN(r, extra);
		k->expert_last = k->expert_first + base + (r < extra) - 1;
		if (r == 0) {
			snprintf(k->state, sizeof k->state, "head");
			ep_host_name(k->host, sizeof k->host);
			snprintf(k->device, sizeof k->device, "%s", h->be ? h->be->info.name : "");
		} else {
			snprintf(k->state, sizeof k->state, "%s", state_names[q->state]);
			snprintf(k->host, sizeof k->host, "%s", q->hello.host);
			snprintf(k->device, sizeof k->device, "%s", q->hello.device);
		}
		snprintf(k->why, sizeof k->why, "%s", r && q->state == RANK_GONE ? q->why : "");
		bool seen = false;
		for (int i = 0; i < o->hosts && !seen; i++)
			seen = k->host[0] && !strcmp(hosts[i], k->host);
		if (!seen && k->host[0])
			snprintf(hosts[o->hosts++], sizeof hosts[0], "%s", k->host);
	}
	pthread_mutex_unlock(&h->lock);
}

void ep_head_close(struct ep_head *h)
{
	if (!h)
		return;
	/* No worker joins again once it has heard BYE. */
	pthread_mutex_lock(&h->lock);
	h->stop = true;
	pthread_mutex_unlock(&h->lock);
	if (h->acceptor_running)
		pthread_join(h->acceptor, NULL);
	close_fd(&h->listen_fd);
	for (int r = 1; r < h->n_ranks; r++) {
		if (h->ranks[r].fd >= 0)
			ep_send_msg(h->ranks[r].fd, EP_BYE, NULL, 0, ATLAS_MIN(h->timeout_ms, 1000));
		close_fd(&h->ranks[r].fd);
		close_fd(&h->ranks[r].comm_fd);
	}
	pthread_mutex_destroy(&h->lock);
	pthread_cond_destroy(&h->changed);
	free(h->journal.ops);
	free(h->buf);
	free(h);
}

int ep_model_identity(const struct atlas_config *c, const struct kt_backend *be, uint64_t *id,
		      char *err, size_t errlen)
{
	if (!strcmp(c->load_format, "dummy")) {
		const uint64_t backend = XXH3_64bits(be->info.backend, strlen(be->info.backend));
		*id = XXH3_64bits_withSeed(c->model, strlen(c->model), backend);
		return 0;
	}
	struct persist_identity pi;
	int rc = persist_identity(c->model, be->info.backend, 0, &pi, err, errlen);
	if (!rc)
		*id = pi.model;
	return rc;
}
