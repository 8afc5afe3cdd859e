/*
 * kernel_trace.c: a CUPTI injection library that records every kernel a
 * process runs on the GPU (graph nodes included) and the host's CUDA
 * runtime calls, with their start and end times, at full speed: no replay,
 * no serialisation, so a decode step's batch forms as it does without it
 * (ncu replays each kernel and changes what the scheduler sees).
 *
 * Build (on the GPU machine, or here with nvcc's headers):
 *   cc -O2 -shared -fPIC -I/usr/local/cuda/include dev/prof/kernel_trace.c \
 *      -L/usr/local/cuda/lib64 -lcupti -o /tmp/kernel_trace.so
 * Use:
 *   CUDA_INJECTION64_PATH=/tmp/kernel_trace.so KERNEL_TRACE_OUT=trace.csv \
 *      build-gpu/tools/atlas bench ...
 *   python3 dev/prof/kernel_trace.py trace.csv      # the step breakdown
 *
 * The CSV has one line per record: kind (k = kernel, a = runtime API call,
 * m = memcpy, s = memset), start and end in ns (the GPU's clock, which
 * CUPTI maps to the host's), stream, grid and block sizes, graph id, and
 * the kernel's mangled name or the API function's name.
 *
 * Tracing kernels makes each graph launch and kernel slower (a graph of
 * 366 nodes took 0.4-1 ms to launch traced). KERNEL_TRACE_HOST_ONLY=1
 * records the runtime calls alone, whose times are then near the untraced
 * ones: how long a graph launch or the host's work between steps takes.
 *
 * The records are written when the process exits (atexit). The driver
 * calls InitializeInjection() once, before the first CUDA call returns.
 */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRACE_BUFFER_BYTES (8u << 20)

#define CUPTI_CHECK(call)                                                                       \
	do {                                                                                    \
		CUptiResult r_ = (call);                                                        \
		if (r_ != CUPTI_SUCCESS) {                                                      \
			const char *s_ = "?";                                                   \
			cuptiGetResultString(r_, &s_);                                          \
			fprintf(stderr, "kernel_trace: %s:%d: %s: %s\n", __FILE__, __LINE__,    \
				#call, s_);                                                     \
			return -1;                                                              \
		}                                                                               \
	} while (0)

/* The CSV; opened by InitializeInjection, written by the completion callback. */
static FILE *trace_out;

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
	*buffer = aligned_alloc(8, TRACE_BUFFER_BYTES);
	*size = *buffer ? TRACE_BUFFER_BYTES : 0;
	*max_records = 0;
}

static void write_record(const CUpti_Activity *rec)
{
	switch (rec->kind) {
	case CUPTI_ACTIVITY_KIND_KERNEL:
	case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
		const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
		fprintf(trace_out, "k,%llu,%llu,%u,%d,%d,%u,%s\n", (unsigned long long)k->start,
			(unsigned long long)k->end, k->streamId, k->gridX * k->gridY * k->gridZ,
			k->blockX * k->blockY * k->blockZ, k->graphId, k->name);
		break;
	}
	case CUPTI_ACTIVITY_KIND_RUNTIME: {
		const CUpti_ActivityAPI *a = (const CUpti_ActivityAPI *)rec;
		const char *name = "?";
		cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name);
		fprintf(trace_out, "a,%llu,%llu,0,0,0,0,%s\n", (unsigned long long)a->start,
			(unsigned long long)a->end, name);
		break;
	}
	case CUPTI_ACTIVITY_KIND_MEMCPY: {
		const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)rec;
		fprintf(trace_out, "m,%llu,%llu,%u,%llu,0,%u,copykind%u\n",
			(unsigned long long)m->start, (unsigned long long)m->end, m->streamId,
			(unsigned long long)m->bytes, m->graphId, m->copyKind);
		break;
	}
	case CUPTI_ACTIVITY_KIND_MEMSET: {
		const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)rec;
		fprintf(trace_out, "s,%llu,%llu,%u,%llu,0,%u,memset\n", (unsigned long long)m->start,
			(unsigned long long)m->end, m->streamId, (unsigned long long)m->bytes,
			m->graphId);
		break;
	}
	default:
		break;
	}
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
				      size_t valid)
{
	CUpti_Activity *rec = NULL;
	(void)ctx;
	(void)stream;
	(void)size;
	while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS)
		write_record(rec);
	size_t dropped = 0;
	if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS && dropped)
		fprintf(stderr, "kernel_trace: %zu records dropped\n", dropped);
	free(buffer);
}

static void flush_at_exit(void)
{
	cuptiActivityFlushAll(1);
	if (trace_out)
		fclose(trace_out);
	trace_out = NULL;
}

int InitializeInjection(void);

int InitializeInjection(void)
{
	const char *path = getenv("KERNEL_TRACE_OUT");
	const char *host = getenv("KERNEL_TRACE_HOST_ONLY");
	const int host_only = host && *host && strcmp(host, "0");
	trace_out = fopen(path ? path : "kernel_trace.csv", "w");
	if (!trace_out) {
		perror("kernel_trace: open");
		return 0;
	}
	fprintf(trace_out, "kind,start_ns,end_ns,stream,grid,block,graph,name\n");
	CUPTI_CHECK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
	CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME));
	if (!host_only) {
		CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
		CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY));
		CUPTI_CHECK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET));
	}
	atexit(flush_at_exit);
	return 1;
}
