/* atlas bench: the copy bandwidth of the device and the report, a table or
 * CSV with, for decode, the bytes read per token and the share of the
 * bandwidth bound reached.
 *
 * The bound of a decode step of B sequences at context L: the step reads
 * every weight once (an untied input embedding only by row) and each
 * sequence's K and V, so bytes/token = (W + B * L * kv) / B and the bound is
 * bandwidth / (bytes/token) tokens per second. L is the context in the middle
 * of the measured tokens. A mixture-of-experts model's W counts of each
 * layer's E experts those the B tokens touch: k of them at B = 1 (exact),
 * E (1 - (1 - k/E)^B) at B (the expectation when routing is uniform, as the
 * dummy weights' is near enough). The bandwidth is that of a device-to-device copy,
 * bytes read plus bytes written: the rate at which kernels can stream data.
 *
 * A decode row whose sessions' older KV is on the host tier (streamed
 * through staging every step, DESIGN §8) also gets the bytes streamed per
 * token and the share of the measured host-to-device bandwidth they reach.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/err.h"
#include "kernels/backend.h"
#include "tools/atlas/bench.h"

/* The copy: big enough to leave every cache behind, small enough to fit
 * next to nothing else (the engine is not open yet). */
#define COPY_BYTES_CUDA ((int64_t)1 << 30)
#define COPY_BYTES_CPU ((int64_t)256 << 20)
#define COPY_REPS 10

/* Weight bytes one decode step of B sequences reads (see the top). */
static double step_weights(const struct bench_bound *b, int B)
{
	if (!b->experts)
		return (double)b->step_weight_bytes;
	const double share = 1.0 - pow(1.0 - (double)b->experts_per_token / b->experts, B);
	return (double)(b->step_weight_bytes - b->expert_bytes) + share * (double)b->expert_bytes;
}

static int timed_copies(struct kt_backend *be, int64_t bytes, double *bw)
{
	struct kt_tensor a = { 0 }, b = { 0 };
	int rc = kt_alloc(be, KT_I32, bytes / 4, 1, &a);
	if (!rc)
		rc = kt_alloc(be, KT_I32, bytes / 4, 1, &b);
	/* One copy first, so that first-touch costs are not timed. */
	if (!rc && !(rc = kt_copy(be, &b, &a)) && !(rc = kt_synchronize(be))) {
		double t0 = atlas_now_s();
		for (int i = 0; i < COPY_REPS && !rc; i++)
			rc = kt_copy(be, i % 2 ? &a : &b, i % 2 ? &b : &a);
		if (!rc && !(rc = kt_synchronize(be)))
			*bw = 2.0 * (double)bytes * COPY_REPS / (atlas_now_s() - t0);
	}
	if (a.data)
		kt_free(be, &a);
	if (b.data)
		kt_free(be, &b);
	return rc;
}

#define HOST_COPY_BYTES ((size_t)256 << 20)

int bench_host_bandwidth(const struct atlas_config *c, double *bytes_per_s, char *err,
			 size_t errlen)
{
	struct kt_config kc = { .backend = c->backend, .threads = c->threads, .device = c->device,
				.max_tokens = 1, .max_seqs = 1, .max_context = 1, .max_heads = 1,
				.max_head_dim = 2 };
	struct kt_backend *be;
	struct kt_tensor d = { 0 };
	void *host = NULL;
	uint64_t ticket = 0;
	int rc = kt_backend_open(&kc, &be, err, errlen);
	if (rc)
		return rc;
	if (!(rc = kt_host_alloc(be, HOST_COPY_BYTES, &host)) &&
	    !(rc = kt_alloc(be, KT_I32, (int64_t)(HOST_COPY_BYTES / 4), 1, &d))) {
		memset(host, 1, HOST_COPY_BYTES);
		double t0 = 0;
		for (int i = 0; i <= COPY_REPS && !rc; i++) {
			if (i == 1) /* the first copy is not timed */
				t0 = atlas_now_s();
			while (!rc && (rc = kt_copy_async(be, host, &d, 0, HOST_COPY_BYTES, false,
							  &ticket)) == -EAGAIN)
				rc = 0;
			while (!rc && !(rc = kt_copy_done(be, ticket)))
				;
			rc = rc < 0 ? rc : 0;
		}
		if (!rc)
			*bytes_per_s = (double)HOST_COPY_BYTES * COPY_REPS / (atlas_now_s() - t0);
	}
	if (d.data)
		kt_free(be, &d);
	if (host)
		kt_host_free(be, host);
	kt_backend_close(be);
	if (rc)
		return atlas_errf(err, errlen, rc, "host bandwidth: %s", strerror(-rc));
	return 0;
}

int bench_copy_bandwidth(const struct atlas_config *c, double *bytes_per_s,
			 struct kt_device_info *info, char *err, size_t errlen)
{
	struct kt_config kc = { .backend = c->backend, .threads = c->threads, .device = c->device,
				.max_tokens = 1, .max_seqs = 1, .max_context = 1, .max_heads = 1,
				.max_head_dim = 2 };
	struct kt_backend *be;
	int rc = kt_backend_open(&kc, &be, err, errlen);
	if (rc)
		return rc;
	*info = be->info;
	rc = timed_copies(be, strcmp(info->backend, "cuda") ? COPY_BYTES_CPU : COPY_BYTES_CUDA,
			  bytes_per_s);
	kt_backend_close(be);
	if (rc)
		return atlas_errf(err, errlen, rc, "copy bandwidth: %s", strerror(-rc));
	return 0;
}

void bench_print_header(struct atlas_engine *e, const struct bench_bound *bound, FILE *table,
			FILE *csv)
{
	struct atlas_engine_stats *st = malloc(sizeof *st);
	if (csv)
		fprintf(csv, "test,batch,context,tokens,seconds,tokens_per_s,bytes_per_token,"
			"bound_tokens_per_s,percent_of_bound,watts,joules_per_token,"
			"percent_power_capped,sm_clock_mhz\n");
	if (table && st && !atlas_engine_stats(e, st)) {
		fprintf(table, "model      %s (%s, %d layers, %.2fB parameters %s)\n", st->model,
			st->architecture, st->layers, (double)st->parameters / 1e9, st->dtype);
		fprintf(table, "backend    %s on %s\n", st->backend, st->device);
		fprintf(table, "memory     weights %.2f GiB (a decode step reads %.2f GiB), KV pool "
			"%.2f GiB, %llu bytes per token\n", (double)st->weights_bytes / (1 << 30),
			step_weights(bound, 1) / (1 << 30), (double)st->kv_bytes / (1 << 30),
			(unsigned long long)st->kv_bytes_per_token);
		fprintf(table, "bandwidth  %.0f GB/s (device copy, read + write)", bound->bandwidth / 1e9);
		if (bound->host_bandwidth > 0)
			fprintf(table, ", host to device %.1f GB/s", bound->host_bandwidth / 1e9);
		fprintf(table, "\n");
		/* The copy is timed on buffers larger than any cache; a model whose
		 * step fits the cpu's last-level cache is read from there, faster. */
		const long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
		if (!strcmp(st->backend, "cpu") && llc > 0 && step_weights(bound, 1) < (double)llc)
			fprintf(table, "note       a decode step reads %.1f MB, less than the %.0f MB L3 "
				"cache: the weights stay in cache,\n           faster than the memory "
				"the copy measures, so %%bound may pass 100%%\n",
				step_weights(bound, 1) / 1e6, (double)llc / 1e6);
		fprintf(table, "\n");
		fprintf(table, "%-8s %6s %8s %8s %9s %11s %12s %11s %7s\n", "test", "batch",
			"context", "tokens", "seconds", "tokens/s", "bytes/token", "bound/s", "%bound");
	}
	free(st);
}

void bench_print_result(const struct bench_result *r, const struct bench_bound *bound,
			int gen_tokens, FILE *table, FILE *csv)
{
	if (r->skipped) {
		if (csv)
			fprintf(csv, "%s,%d,%d,,,,,,,,,,\n", r->test, r->batch, r->context);
		if (table)
			fprintf(table, "%-8s %6d %8d   skipped: %s\n", r->test, r->batch, r->context,
				r->why);
		return;
	}
	double rate = r->seconds > 0 ? (double)r->tokens / r->seconds : 0;
	/* The GPU's samples over the timed part (the prefills, a decode
	 * row's generation): the mean power, the energy a token at that
	 * power, the mean SM clock and the share of samples power-capped. */
	const bool power = bench_power_reported(r);
	const double watts = power ? r->watts_sum / (double)r->power_samples : 0;
	const double mhz = power ? r->mhz_sum / (double)r->power_samples : 0;
	const double joules = watts * r->power_s;
	const double capped = power ? 100.0 * (double)r->capped_samples /
					      (double)r->power_samples : 0;
	double per_token = 0, limit = 0;
	if (!strcmp(r->test, "decode") && bound->bandwidth > 0) {
		double mid = r->context + gen_tokens / 2.0;
		per_token = (step_weights(bound, r->batch) +
			     r->batch * mid * (double)bound->kv_bytes_per_token) / r->batch;
		limit = bound->bandwidth / per_token;
	}
	if (csv) {
		fprintf(csv, "%s,%d,%d,%llu,%.6f,%.3f,", r->test, r->batch, r->context,
			(unsigned long long)r->tokens, r->seconds, rate);
		if (limit > 0)
			fprintf(csv, "%.0f,%.3f,%.2f,", per_token, limit, 100.0 * rate / limit);
		else
			fprintf(csv, ",,,");
		if (power)
			fprintf(csv, "%.1f,%.6f,%.1f,%.0f\n", watts,
				joules / (double)r->power_tokens, capped, mhz);
		else
			fprintf(csv, ",,,\n");
		fflush(csv);
	}
	if (table) {
		fprintf(table, "%-8s %6d %8d %8llu %9.3f %11.1f", r->test, r->batch, r->context,
			(unsigned long long)r->tokens, r->seconds, rate);
		if (limit > 0)
			fprintf(table, " %11.1fM %11.1f %6.1f%%\n", per_token / 1e6, limit,
				100.0 * rate / limit);
		else
			fprintf(table, " %12s %11s %7s\n", "-", "-", "-");
		if (r->staged_bytes && r->tokens && r->seconds > 0) {
			const double per = (double)r->staged_bytes / (double)r->tokens;
			const double rate_b = (double)r->staged_bytes / r->seconds;
			fprintf(table, "%-8s host tier: %.1f MB streamed per token, %.2f GB/s", "",
				per / 1e6, rate_b / 1e9);
			if (bound->host_bandwidth > 0)
				fprintf(table, " = %.1f%% of host to device", 100.0 * rate_b /
					bound->host_bandwidth);
			fprintf(table, "\n");
		}
		if (power)
			fprintf(table, "%-8s power: %.0f W, %.4f J a token, SM clock %.0f MHz, "
				"held back for power in %.0f%% of %llu samples\n", "", watts,
				joules / (double)r->power_tokens, mhz, capped,
				(unsigned long long)r->power_samples);
		if (r->ep_ranks > 1 && r->steps && r->seconds > 0)
			fprintf(table, "%-8s ep %d: %.1f collectives per step, %.2f MB, %.3f ms of a "
				"%.3f ms step in them (%.1f%%)\n", "", r->ep_ranks,
				(double)r->collectives / (double)r->steps,
				(double)r->collective_bytes / (double)r->steps / 1e6,
				1e3 * r->collective_seconds / (double)r->steps,
				1e3 * r->seconds / (double)r->steps,
				100.0 * r->collective_seconds / r->seconds);
		fflush(table);
	}
}
