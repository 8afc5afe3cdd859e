/* Expert parallelism (DESIGN §10): the head's side of the group of ranks.
 *
 * atlasd with ep = N > 1 is rank 0, the head. It listens at ep_address;
 * ranks 1 .. N-1 are worker processes (engine.h atlas_ep_worker_run) that
 * connect, say who they are (HELLO: rank, protocol version, the model's
 * identity, the configuration's fingerprint) and are refused with a reason
 * when anything differs. Once every rank is there the head starts an
 * epoch: it welcomes each worker, every rank opens the backend's
 * communicator (sockets on the cpu, NCCL on cuda), and from then on the
 * head sends each step command, with the KV copies made since the last
 * one, to every worker before running it itself; every rank runs it
 * through the same executor, so the collectives of the MoE layers happen
 * in the same order everywhere.
 *
 * A rank that dies, closes or stays silent past ep_timeout ends the epoch:
 * the step fails (the engine fails the running turns and drops every
 * session's KV, which the workers no longer hold), the other workers are
 * sent BYE and join again, and the head starts the next epoch when every
 * rank is back (a restarted worker included). ctl/ep says which rank is
 * gone and why.
 *
 * Threads: an acceptor thread takes connections and handshakes; everything
 * else runs on the engine thread. ep_head_format may be called from any
 * thread.
 */
#ifndef ATLAS_ENGINE_EP_H
#define ATLAS_ENGINE_EP_H

#include <stdbool.h>
#include <stddef.h>

#include "config/config.h"
#include "engine/engine.h"
#include "engine/seq/seq.h"
#include "engine/step/step.h"
#include "kernels/backend.h"

struct ep_head;

/* Listen at c->ep_address and start taking workers. */
int ep_head_open(const struct atlas_config *c, struct ep_head **out, char *err, size_t errlen);
/* exec_join_fn (ctx: the head): wait up to ep_join_timeout for every
 * worker, then start the first epoch on backend be. */
int ep_head_join(void *head, struct kt_backend *be, char *err, size_t errlen);
/* Once the head's model is loaded: record pool's KV copies for the
 * workers from now on, size the message buffer for commands up to l, and
 * wait (ep_join_timeout) until every worker has loaded its model. */
int ep_head_attach(struct ep_head *h, struct seq_pool *pool, const struct step_limits *l,
		   char *err, size_t errlen);
/* Send command c (and the copies recorded since the last one) to every
 * worker. -EHOSTDOWN when the group is down (err says why). */
int ep_head_step(struct ep_head *h, const struct step_cmd *c, char *err, size_t errlen);
/* A step failed with rc: end the epoch, naming the rank that is gone
 * where it can be told. */
void ep_head_lost(struct ep_head *h, int rc, const char *why);
/* Whether the epoch is running; if not, why (for errors and ctl/ep). */
bool ep_head_up(struct ep_head *h, char *why, size_t len);
/* Start the next epoch if every worker is back: 0 when up, -EAGAIN while
 * one is missing, another errno when starting failed. */
int ep_head_resume(struct ep_head *h, char *err, size_t errlen);
/* ctl/ep: the ranks, their hosts, devices, experts (of n_experts) and
 * state, the commands sent; the collectives' figures are the backend's. */
void ep_head_stats(struct ep_head *h, int n_experts, struct atlas_ep_stats *o);
/* Send BYE to every worker and stop listening. */
void ep_head_close(struct ep_head *h);

/* The model's identity as ranks compare it: persist_identity's model
 * fingerprint on the backend be runs, or the shape's name for dummy
 * weights. */
int ep_model_identity(const struct atlas_config *c, const struct kt_backend *be, uint64_t *id,
		      char *err, size_t errlen);

#endif
