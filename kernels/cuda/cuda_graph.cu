/* CUDA graphs: record a step's ops once per key, replay them after.
 *
 * The engine keys decode steps on (batch bucket, KV-length bucket); every
 * replay launches the same kernels on the same tensors with the same launch
 * shapes, so one graph launch replaces hundreds of kernel launches and their
 * host cost.
 *
 * Recording uses stream capture in thread-local mode: the ops of record()
 * are enqueued on cu->stream as usual and become graph nodes instead of
 * running. cuBLAS is capturable because its workspace was given at open.
 * When recording or instantiation fails (an op that cannot be captured, a
 * node that does not fit), the ops are run once more without a graph and the
 * key is remembered as uncapturable, so the step still runs and the failure
 * is logged once per key, not every step.
 *
 * The table holds CUDA_MAX_GRAPHS keys; when it is full the oldest entry
 * makes room (a bucket set that large means graphs no longer pay anyway).
 */
#include <errno.h>

extern "C" {
#include "common/log.h"
}
#include "kernels/cuda/check.h"
#include "kernels/cuda/cuda_impl.h"

/* An entry is in use when it holds a graph or marks its key uncapturable. */
static bool in_use(const struct cuda_graph_entry *g)
{
	return g->exec || g->broken;
}

static struct cuda_graph_entry *find(struct cuda_backend *cu, uint64_t key)
{
	for (int i = 0; i < cu->n_graphs; i++)
		if (in_use(&cu->graphs[i]) && cu->graphs[i].key == key)
			return &cu->graphs[i];
	return NULL;
}

static void drop(struct cuda_graph_entry *g)
{
	if (g->exec)
		CU_WARN(cudaGraphExecDestroy(g->exec));
	g->exec = NULL;
}

/* A free entry for key: an unused one, a new one, or the oldest when the
 * table is full. */
static struct cuda_graph_entry *slot_for(struct cuda_backend *cu, uint64_t key)
{
	struct cuda_graph_entry *g = NULL;

	for (int i = 0; i < cu->n_graphs && !g; i++)
		if (!in_use(&cu->graphs[i]))
			g = &cu->graphs[i];
	if (!g && cu->n_graphs < CUDA_MAX_GRAPHS)
		g = &cu->graphs[cu->n_graphs++];
	if (!g) {
		g = &cu->graphs[cu->next_evict];
		cu->next_evict = (cu->next_evict + 1) % CUDA_MAX_GRAPHS;
		drop(g);
	}
	g->key = key;
	g->exec = NULL;
	g->broken = false;
	return g;
}

/* Capture record(ctx) into g->exec; 0, the op's error, or -EIO when the
 * capture or the instantiation failed (the stream is out of capture mode
 * either way). */
static int capture(struct cuda_backend *cu, struct cuda_graph_entry *g, int (*record)(void *ctx),
		   void *ctx)
{
	cudaGraph_t graph = NULL;
	cudaError_t e;
	int rc;

	CU_CHECK(cudaStreamBeginCapture(cu->stream, cudaStreamCaptureModeThreadLocal));
	rc = record(ctx);
	/* a norm or rope_store still pending belongs to the step: launched inside it */
	if (!rc && (e = cu_enter(cu)) != cudaSuccess)
		rc = cuda_fail(e, "cu_enter", __FILE__, __LINE__);
	cu->norm_pending.set = false;
	cu->rope_pending.set = false;
	e = cudaStreamEndCapture(cu->stream, &graph);
	if (!rc && e != cudaSuccess)
		rc = cuda_fail(e, "cudaStreamEndCapture", __FILE__, __LINE__);
	if (!rc) {
		e = cudaGraphInstantiate(&g->exec, graph, 0);
		if (e != cudaSuccess) {
			g->exec = NULL;
			rc = cuda_fail(e, "cudaGraphInstantiate", __FILE__, __LINE__);
		}
	}
	if (graph)
		CU_WARN(cudaGraphDestroy(graph));
	(void)cudaGetLastError();
	return rc;
}

int cuda_graph(struct kt_backend *be, uint64_t key, int (*record)(void *ctx), void *ctx)
{
	struct cuda_backend *cu = cu_of(be);
	struct cuda_graph_entry *g;
	int rc;

	CU_CHECK(cu_enter(cu));
	g = find(cu, key);
	if (g && g->broken)
		return record(ctx);
	if (!g) {
		g = slot_for(cu, key);
		rc = capture(cu, g, record, ctx);
		if (rc == -EINVAL || rc == -ENOMEM) {
			/* The ops refused their arguments or memory ran out: that is
			 * the step's error, not the graph's (the entry stays free). */
			return rc;
		}
		if (rc) {
			log_warn("cuda: graph %#llx cannot be recorded; its steps run op by op",
				 (unsigned long long)key);
			g->broken = true;
			return record(ctx);
		}
		cu->base.graphs_recorded++;
	}
	CU_CHECK(cudaGraphLaunch(g->exec, cu->stream));
	return 0;
}

void cuda_graphs_free(struct cuda_backend *cu)
{
	for (int i = 0; i < cu->n_graphs; i++)
		drop(&cu->graphs[i]);
	cu->n_graphs = 0;
	cu->next_evict = 0;
}
