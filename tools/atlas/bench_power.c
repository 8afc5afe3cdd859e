/* atlas bench: the GPU's power, SM clock and power cap over a timed
 * stretch, through NVML. The library is the driver's own
 * (libnvidia-ml.so.1), loaded at run time: a cpu build, a machine without
 * the driver, or a GPU that does not report its power just report none (no
 * power line under a row, empty CSV columns).
 *
 * Why: a prefill of Qwen3-8B on an H100 or an H200 runs at the board's
 * power limit (docs/perf.md, 2026-12-02), where a kernel that finishes
 * sooner may only lower the clock under the others; a row's energy, clock
 * and power-capped share say whether a change saved work or moved it.
 *
 * How: a thread samples the board's power of the moment, the SM clock and
 * the clock's event reasons every BENCH_POWER_PERIOD_NS and keeps running
 * sums; a row's figures are the sums' differences over its timed part.
 * NVML's energy counter is not used: it moves in steps of about 100 ms,
 * so a prefill of 50 ms read 0 W or 1,171 W on an H100 (2026-12-02). The
 * power of the moment changes at about 50 Hz, so a row needs
 * BENCH_POWER_MIN_SAMPLES samples (50 ms) before it reports any; shorter
 * rows say nothing rather than something wrong. The device is found by
 * its PCI address, which the cuda backend reports. */
#include <dlfcn.h>
#include <errno.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "tools/atlas/bench.h"

/* 5 ms: ten samples of the 50 Hz power reading in 50 ms; each sample
 * costs a few microseconds of one host core. */
#define BENCH_POWER_PERIOD_NS 5000000L
/* 10 samples: 50 ms, two or three changes of the power reading. */
#define BENCH_POWER_MIN_SAMPLES 10

/* NVML's declarations, those used here (nvml.h): nvmlReturn_t is an enum,
 * 0 on success; nvmlDevice_t a pointer; a field value as
 * nvmlDeviceGetFieldValues fills it. */
union nvml_value {
	double d;
	unsigned int ui;
	unsigned long ul;
	unsigned long long ull;
	long long sll;
	int si;
	unsigned short us;
};

struct nvml_field_value {
	unsigned int field_id;
	unsigned int scope_id;
	long long timestamp;    /* us since 1970 */
	long long latency_us;
	int value_type;
	int nvml_return;
	union nvml_value value;
};

typedef int (*nvml_init_fn)(void);
typedef int (*nvml_by_bus_fn)(const char *bus_id, void **device);
typedef int (*nvml_fields_fn)(void *device, int count, struct nvml_field_value *values);
typedef int (*nvml_power_fn)(void *device, unsigned int *mw);
typedef int (*nvml_clock_fn)(void *device, int type, unsigned int *mhz);
typedef int (*nvml_reasons_fn)(void *device, unsigned long long *reasons);

#define NVML_FI_DEV_POWER_INSTANT 186
#define NVML_CLOCK_SM 1
/* The clock event reasons that are the board's power: the software power
 * cap and the hardware power brake. */
#define NVML_REASON_SW_POWER_CAP 0x4ull
#define NVML_REASON_HW_POWER_BRAKE 0x80ull

/* One sample into m: the power of the moment (the field; the driver's
 * average where the field is missing), the SM clock, the reasons. */
static int sample(const struct bench_power *p, struct bench_power_mark *m)
{
	struct nvml_field_value f = { .field_id = NVML_FI_DEV_POWER_INSTANT };
	unsigned int mw, mhz;
	unsigned long long reasons;

	if (p->instant && !((nvml_fields_fn)p->fields)(p->device, 1, &f) && !f.nvml_return)
		mw = f.value.ui;
	else if (((nvml_power_fn)p->power)(p->device, &mw))
		return -EIO;
	if (((nvml_clock_fn)p->clock)(p->device, NVML_CLOCK_SM, &mhz) ||
	    ((nvml_reasons_fn)p->reasons)(p->device, &reasons))
		return -EIO;
	m->samples++;
	m->watts += mw / 1e3;
	m->mhz += mhz;
	m->capped += (reasons & (NVML_REASON_SW_POWER_CAP | NVML_REASON_HW_POWER_BRAKE)) != 0;
	return 0;
}

/* Samples every BENCH_POWER_PERIOD_NS on a fixed schedule; one that comes
 * late (the thread was not running) moves the schedule on rather than
 * catching up, so that samples stay evenly spread over time and each
 * weighs the same in a row's mean. */
static void *sampler(void *arg)
{
	struct bench_power *p = arg;
	uint64_t next = atlas_now_ns();

	pthread_mutex_lock(&p->lock);
	while (!p->stop) {
		struct bench_power_mark m = p->sums;

		pthread_mutex_unlock(&p->lock);
		const int rc = sample(p, &m);
		pthread_mutex_lock(&p->lock);
		if (!rc)
			p->sums = m;
		pthread_mutex_unlock(&p->lock);
		const uint64_t now = atlas_now_ns();
		next = next + BENCH_POWER_PERIOD_NS > now ? next + BENCH_POWER_PERIOD_NS
							  : now + BENCH_POWER_PERIOD_NS;
		const struct timespec at = { .tv_sec = (time_t)(next / 1000000000ull),
					     .tv_nsec = (long)(next % 1000000000ull) };
		clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL);
		pthread_mutex_lock(&p->lock);
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

static void unload(struct bench_power *p)
{
	if (p->lib) {
		if (p->shutdown)
			((int (*)(void))p->shutdown)();
		dlclose(p->lib);
	}
	memset(p, 0, sizeof *p);
}

int bench_power_open(struct bench_power *p, const char *pci_bus_id)
{
	nvml_init_fn init;
	nvml_by_bus_fn by_bus;
	struct bench_power_mark m = { 0 };

	memset(p, 0, sizeof *p);
	if (!pci_bus_id || !*pci_bus_id)
		return -ENODEV;
	p->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!p->lib)
		return -ENOENT;
	init = (nvml_init_fn)dlsym(p->lib, "nvmlInit_v2");
	by_bus = (nvml_by_bus_fn)dlsym(p->lib, "nvmlDeviceGetHandleByPciBusId_v2");
	p->shutdown = dlsym(p->lib, "nvmlShutdown");
	p->fields = dlsym(p->lib, "nvmlDeviceGetFieldValues");
	p->power = dlsym(p->lib, "nvmlDeviceGetPowerUsage");
	p->clock = dlsym(p->lib, "nvmlDeviceGetClockInfo");
	/* the reasons' function has two names across drivers */
	p->reasons = dlsym(p->lib, "nvmlDeviceGetCurrentClocksEventReasons");
	if (!p->reasons)
		p->reasons = dlsym(p->lib, "nvmlDeviceGetCurrentClocksThrottleReasons");
	if (!init || !by_bus || !p->shutdown || !p->power || !p->clock || !p->reasons || init()) {
		p->shutdown = NULL;
		unload(p);
		return -ENOTSUP;
	}
	p->instant = p->fields != NULL;
	/* a first sample, so that a GPU without the readings is known now, and
	 * whether it has the power of the moment */
	if (by_bus(pci_bus_id, &p->device) || sample(p, &m)) {
		unload(p);
		return -ENOTSUP;
	}
	if (p->instant) {
		struct nvml_field_value f = { .field_id = NVML_FI_DEV_POWER_INSTANT };
		p->instant = !((nvml_fields_fn)p->fields)(p->device, 1, &f) && !f.nvml_return;
	}
	if (pthread_mutex_init(&p->lock, NULL)) {
		unload(p);
		return -ENOMEM;
	}
	if (pthread_create(&p->thread, NULL, sampler, p)) {
		pthread_mutex_destroy(&p->lock);
		unload(p);
		return -EAGAIN;
	}
	p->ready = true;
	return 0;
}

int bench_power_read(struct bench_power *p, struct bench_power_mark *m)
{
	if (!p->ready)
		return -ENODEV;
	pthread_mutex_lock(&p->lock);
	*m = p->sums;
	pthread_mutex_unlock(&p->lock);
	m->t = atlas_now_s();
	return 0;
}

void bench_power_add(struct bench_result *r, const struct bench_power_mark *a,
		     const struct bench_power_mark *b, uint64_t tokens)
{
	r->power_tokens += tokens;
	r->power_s += b->t - a->t;
	r->power_samples += b->samples - a->samples;
	r->watts_sum += b->watts - a->watts;
	r->mhz_sum += b->mhz - a->mhz;
	r->capped_samples += b->capped - a->capped;
}

bool bench_power_reported(const struct bench_result *r)
{
	return r->power_samples >= BENCH_POWER_MIN_SAMPLES && r->power_tokens && r->power_s > 0;
}

void bench_power_close(struct bench_power *p)
{
	if (p->ready) {
		pthread_mutex_lock(&p->lock);
		p->stop = true;
		pthread_mutex_unlock(&p->lock);
		pthread_join(p->thread, NULL);
		pthread_mutex_destroy(&p->lock);
	}
	unload(p);
}
