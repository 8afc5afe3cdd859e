/* atlas bench: shared between the runs (bench.c), the report and the
 * bandwidth measurement (bench_report.c) and the rows of speculative
 * decoding (bench_spec.c). */
#ifndef ATLAS_TOOLS_BENCH_H
#define ATLAS_TOOLS_BENCH_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "config/config.h"
#include "engine/engine.h"
#include "kernels/backend.h"
#include "tools/atlas/cli.h"

/* One line of the report. */
struct bench_result {
	const char *test;       /* "prefill" or "decode" */
	int batch;              /* sessions at once */
	int context;            /* prefill: prompt tokens; decode: context when decoding starts */
	uint64_t tokens;        /* prompt tokens prefilled, or tokens generated */
	double seconds;
	bool skipped;           /* not run: why */
	const char *why;
	uint64_t staged_bytes;  /* decode: KV bytes streamed from the host tier while measured */
	/* decode with ep > 1: the generating steps' collectives (this rank's
	 * view: the head's device time inside them, waiting for peers too). */
	int ep_ranks;
	uint64_t steps, collectives, collective_bytes;
	double collective_seconds;
	/* The GPU's samples over the timed part (bench_power.c): seconds
	 * covered (0: not measured), samples, the sums of their watts and SM
	 * MHz, how many had the clock held back for power, and the tokens
	 * made in those seconds (every timed prefill's prompt; every token of
	 * a decode row's turn, the first ones too). */
	double power_s, watts_sum, mhz_sum;
	uint64_t power_samples, capped_samples, power_tokens;
};

/* NVML, as bench_power_open found it: the library, the device, the
 * functions read (void *: bench_power.c casts them to NVML's types), and
 * the sampling thread with its running sums (under lock). ready: the
 * thread runs; instant: the board gives its power of the moment. */
struct bench_power {
	void *lib, *device;
	void *shutdown, *fields, *power, *clock, *reasons;
	bool ready, instant, stop;
	pthread_t thread;
	pthread_mutex_t lock;
	struct bench_power_mark {
		double t;               /* atlas_now_s() of the reading */
		uint64_t samples;       /* taken since open */
		double watts, mhz;      /* their sums */
		uint64_t capped;        /* of them, with the clock held back for power */
	} sums;
};

/* What a decode step reads, for the bound: weights once per step and each
 * sequence's KV (engine stats), at the measured copy bandwidth. */
struct bench_bound {
	double bandwidth;               /* bytes/s, device copy (read + write), 0 = unknown */
	uint64_t step_weight_bytes;
	uint64_t kv_bytes_per_token;
	uint64_t expert_bytes;          /* of step_weight_bytes, MoE experts */
	int experts, experts_per_token;
	double host_bandwidth;          /* bytes/s host to device (pinned), 0 = not measured */
};

/* Device copy bandwidth of the backend c names, in bytes/s counting bytes
 * read and written (2 x size per copy), as STREAM's copy does; *info: that
 * backend's (whether it is cuda, the GPU's PCI address). */
int bench_copy_bandwidth(const struct atlas_config *c, double *bytes_per_s,
			 struct kt_device_info *info, char *err, size_t errlen);

/* NVML for the GPU at pci_bus_id, sampled from now on: 0, or where there
 * is none to read -ENODEV (no address: not a GPU), -ENOENT (no driver
 * library), -ENOTSUP (no such device or readings), -ENOMEM or -EAGAIN (no
 * thread); p is then not ready and the rows report no power. */
int bench_power_open(struct bench_power *p, const char *pci_bus_id);
/* The running sums now into *m: 0, or -ENODEV (not ready). */
int bench_power_read(struct bench_power *p, struct bench_power_mark *m);
/* Add the stretch from mark a to mark b, in which tokens were made, to r's
 * power figures. */
void bench_power_add(struct bench_result *r, const struct bench_power_mark *a,
		     const struct bench_power_mark *b, uint64_t tokens);
/* Whether r's stretches hold samples enough to report. */
bool bench_power_reported(const struct bench_result *r);
void bench_power_close(struct bench_power *p);

/* Host-to-device bandwidth of copies from host_alloc memory (pinned on
 * cuda), the link the swap tier's host tier streams over. */
int bench_host_bandwidth(const struct atlas_config *c, double *bytes_per_s, char *err,
			 size_t errlen);

/* The report goes to table and/or csv (either may be NULL). */
void bench_print_header(struct atlas_engine *e, const struct bench_bound *bound, FILE *table,
			FILE *csv);
void bench_print_result(const struct bench_result *r, const struct bench_bound *bound,
			int gen_tokens, FILE *table, FILE *csv);

/* Rows of a decode step and of verify steps of k = ks[i] drafts, batch
 * sequences at position context, run on an executor of cfg's model alone
 * (no engine may be open). */
int bench_verify(const char *cmd, const struct atlas_config *cfg, int batch, int context,
		 const int *ks, int n_ks, bool header, FILE *table, FILE *csv);
/* The row of the prompt in file path, answered with speculation off and
 * then with spec mode. */
int bench_spec_prompt(const char *cmd, struct atlas_engine *e, struct cli_waiter *w,
		      const char *path, int max_tokens, enum atlas_spec mode, bool header,
		      FILE *table, FILE *csv);

#endif
