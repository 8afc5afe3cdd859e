/* atlas bench: the GPU's energy and the time its clock was held back for
 * power, over a timed stretch, through NVML. The library is the driver's
 * own (libnvidia-ml.so.1), loaded at run time: a cpu build, a machine
 * without the driver, or a driver without the counters (before Volta) just
 * report none (no power line under a row, empty CSV columns).
 *
 * Why: a prefill of Qwen3-8B on an H200 runs at the board's power limit
 * (docs/perf.md, 2026-12-02), where a kernel that finishes sooner may only
 * lower the clock under the others; a row's energy and its power-capped
 * share say whether a change saved work or moved it.
 *
 * The counters: the energy since the driver loaded (mJ), and the time the
 * clock was below the one asked for because of the power policy (ns). The
 * device is found by its PCI address, which the cuda backend reports. */
#include <dlfcn.h>
#include <errno.h>
#include <string.h>

#include "common/clock.h"
#include "tools/atlas/bench.h"

/* NVML's declarations, those used here (nvml.h: nvmlReturn_t is an enum,
 * 0 on success; nvmlDevice_t a pointer; NVML_PERF_POLICY_POWER 0). */
struct nvml_violation {
	unsigned long long reference_time; /* us */
	unsigned long long violation_time; /* ns */
};

typedef int (*nvml_init_fn)(void);
typedef int (*nvml_by_bus_fn)(const char *bus_id, void **device);
typedef int (*nvml_energy_fn)(void *device, unsigned long long *mj);
typedef int (*nvml_violation_fn)(void *device, int policy, struct nvml_violation *v);

#define NVML_PERF_POLICY_POWER 0

int bench_power_open(struct bench_power *p, const char *pci_bus_id)
{
	nvml_init_fn init;
	nvml_by_bus_fn by_bus;
	struct bench_power_mark m;

	memset(p, 0, sizeof *p);
	if (!pci_bus_id || !*pci_bus_id)
		return -ENODEV;
	p->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!p->lib)
		return -ENOENT;
	init = (nvml_init_fn)dlsym(p->lib, "nvmlInit_v2");
	by_bus = (nvml_by_bus_fn)dlsym(p->lib, "nvmlDeviceGetHandleByPciBusId_v2");
	p->shutdown = dlsym(p->lib, "nvmlShutdown");
	p->energy = dlsym(p->lib, "nvmlDeviceGetTotalEnergyConsumption");
	p->violation = dlsym(p->lib, "nvmlDeviceGetViolationStatus");
	if (!init || !by_bus || !p->shutdown || !p->energy || !p->violation || init()) {
		dlclose(p->lib);
		p->lib = NULL;
		return -ENOTSUP;
	}
	p->ready = !by_bus(pci_bus_id, &p->device);
	/* a first reading, so that a GPU without the counters is known now */
	if (p->ready && bench_power_read(p, &m))
		p->ready = false;
	if (!p->ready) {
		bench_power_close(p);
		return -ENOTSUP;
	}
	return 0;
}

int bench_power_read(const struct bench_power *p, struct bench_power_mark *m)
{
	unsigned long long mj;
	struct nvml_violation v;

	if (!p->ready)
		return -ENODEV;
	if (((nvml_energy_fn)p->energy)(p->device, &mj) ||
	    ((nvml_violation_fn)p->violation)(p->device, NVML_PERF_POLICY_POWER, &v))
		return -EIO;
	m->t = atlas_now_s();
	m->joules = (double)mj / 1e3;
	m->capped_s = (double)v.violation_time / 1e9;
	return 0;
}

void bench_power_add(struct bench_result *r, const struct bench_power_mark *a,
		     const struct bench_power_mark *b, uint64_t tokens)
{
	r->power_tokens += tokens;
	r->power_s += b->t - a->t;
	r->joules += b->joules - a->joules;
	r->capped_s += b->capped_s - a->capped_s;
}

void bench_power_close(struct bench_power *p)
{
	if (p->lib) {
		((int (*)(void))p->shutdown)();
		dlclose(p->lib);
	}
	memset(p, 0, sizeof *p);
}
