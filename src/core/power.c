// NVML opened with dlopen: the few entry points loom reads, declared as NVML's header declares
// them (nvmlReturn_t an int, 0 for success; nvmlDevice_t a pointer).
#include "core/power.h"

#include "core/timer.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

typedef void *nvml_device;
#define NVML_CLOCK_SM 1
#define NVML_REASON_SW_POWER_CAP 0x4ULL
#define NVML_REASON_HW_POWER_BRAKE 0x80ULL

struct loom_power {
    void *lib;
    nvml_device dev;
    double limit_w;
    int (*shutdown)(void);
    const char *(*error_string)(int);
    int (*energy)(nvml_device, unsigned long long *); // mJ
    int (*clock)(nvml_device, int, unsigned *);       // MHz
    int (*reasons)(nvml_device, unsigned long long *); // NULL where the library has neither name
    // the meter: its thread, the flag that ends it, its interval and what it saw
    pthread_t thread;
    bool metering;
    atomic_bool stop;
    double interval_s;
    loom_power_use use;
};

static const char *nvml_error(const loom_power *p, int r) {
    const char *s = p->error_string ? p->error_string(r) : NULL;
    return s ? s : "unknown NVML error";
}

static void power_free(loom_power *p) {
    if (p->shutdown) p->shutdown();
    dlclose(p->lib);
    free(p);
}

loom_status loom_power_open(loom_power **out, const char *pci_bus_id) {
    *out = NULL;
    const char *path = getenv("LOOM_NVML_LIBRARY");
    path = path && *path ? path : "libnvidia-ml.so.1";
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return loom_fail(LOOM_EUNSUPPORTED, "NVML comes with the NVIDIA driver; LOOM_NVML_LIBRARY names another file",
                         "no NVML library: %s", dlerror());
    loom_power *p = loom_xcalloc(1, sizeof *p);
    p->lib = lib;
    typedef int (*u64_query)(nvml_device, unsigned long long *); // the energy's and the reasons' form
    int (*init)(void) = (int (*)(void))dlsym(lib, "nvmlInit_v2");
    int (*by_bus)(const char *, nvml_device *) =
        (int (*)(const char *, nvml_device *))dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2");
    int (*limit)(nvml_device, unsigned *) =
        (int (*)(nvml_device, unsigned *))dlsym(lib, "nvmlDeviceGetEnforcedPowerLimit");
    p->error_string = (const char *(*)(int))dlsym(lib, "nvmlErrorString");
    p->energy = (u64_query)dlsym(lib, "nvmlDeviceGetTotalEnergyConsumption");
    p->clock = (int (*)(nvml_device, int, unsigned *))dlsym(lib, "nvmlDeviceGetClockInfo");
    p->reasons = (u64_query)dlsym(lib, "nvmlDeviceGetCurrentClocksEventReasons"); // the older name below
    if (!p->reasons) p->reasons = (u64_query)dlsym(lib, "nvmlDeviceGetCurrentClocksThrottleReasons");
    if (!init || !by_bus || !p->energy || !p->clock) {
        power_free(p);
        return loom_fail(LOOM_EUNSUPPORTED, "update the NVIDIA driver", "%s lacks NVML's energy or clock queries",
                         path);
    }
    int r = init();
    if (r != 0) {
        loom_status st = loom_fail(LOOM_EUNSUPPORTED, "is the NVIDIA driver loaded?", "NVML's init failed: %s",
                                   nvml_error(p, r));
        power_free(p);
        return st;
    }
    p->shutdown = (int (*)(void))dlsym(lib, "nvmlShutdown");
    if ((r = by_bus(pci_bus_id, &p->dev)) != 0) {
        loom_status s = loom_fail(LOOM_EUNSUPPORTED,
                                  "NVML sees the GPUs the driver knows, whatever CUDA_VISIBLE_DEVICES says",
                                  "NVML finds no GPU at PCI bus id '%s': %s", pci_bus_id, nvml_error(p, r));
        power_free(p);
        return s;
    }
    unsigned mw = 0;
    p->limit_w = limit && limit(p->dev, &mw) == 0 ? mw / 1000.0 : 0.0;
    loom_power_sample s;
    loom_status st = loom_power_read(p, &s);
    if (st != LOOM_OK) {
        power_free(p);
        return st;
    }
    *out = p;
    return LOOM_OK;
}

loom_status loom_power_read(loom_power *p, loom_power_sample *s) {
    unsigned long long mj = 0, why = 0;
    unsigned mhz = 0;
    int r = p->energy(p->dev, &mj);
    if (r == 0) r = p->clock(p->dev, NVML_CLOCK_SM, &mhz);
    if (r != 0)
        return loom_fail(LOOM_EUNSUPPORTED, "NVML's energy counter needs a Volta or later GPU",
                         "NVML cannot read the GPU's energy or SM clock: %s", nvml_error(p, r));
    if (p->reasons && p->reasons(p->dev, &why) != 0) why = 0;
    s->energy_j = (double)mj / 1000.0;
    s->sm_mhz = mhz;
    s->power_capped = (why & (NVML_REASON_SW_POWER_CAP | NVML_REASON_HW_POWER_BRAKE)) != 0;
    return LOOM_OK;
}

double loom_power_limit_w(const loom_power *p) { return p->limit_w; }

void loom_power_close(loom_power *p) {
    if (!p) return;
    if (p->metering) {
        loom_power_use ignored;
        loom_power_meter_stop(p, &ignored);
    }
    power_free(p);
}

// The meter's reads: the first gives the counter's starting value; after it, each read's clock
// counts, and a read at which the counter moved marks the span's end (its first move, the start).
static void *meter_run(void *arg) {
    loom_power *p = arg;
    loom_power_use *u = &p->use;
    double t0 = 0, e0 = 0, last_j = 0;
    struct timespec pause = {0, (long)(p->interval_s * 1e9)};
    while (!atomic_load(&p->stop)) {
        loom_power_sample s;
        if (loom_power_read(p, &s) != LOOM_OK) {
            snprintf(u->lost, sizeof u->lost, "%s", loom_error_message());
            break;
        }
        double now = loom_now();
        if (u->reads > 0) {
            u->sm_mhz += s.sm_mhz, u->capped += s.power_capped;
            if (s.energy_j != last_j) {
                if (u->moves++ == 0) t0 = now, e0 = s.energy_j;
                u->joules = s.energy_j - e0, u->span_s = now - t0;
            }
        }
        u->reads++;
        last_j = s.energy_j;
        nanosleep(&pause, NULL);
    }
    return NULL;
}

loom_status loom_power_meter_start(loom_power *p, double interval_s) {
    if (p->metering) return loom_fail(LOOM_EUNSUPPORTED, "stop the meter first", "the GPU's power meter is running");
    p->use = (loom_power_use){0};
    p->interval_s = interval_s;
    atomic_store(&p->stop, false);
    int r = pthread_create(&p->thread, NULL, meter_run, p);
    if (r != 0)
        return loom_fail(LOOM_EUNSUPPORTED, "time without the power figure",
                         "cannot start the power meter's thread (error %d)", r);
    p->metering = true;
    return LOOM_OK;
}

void loom_power_meter_stop(loom_power *p, loom_power_use *use) {
    if (p->metering) {
        atomic_store(&p->stop, true);
        pthread_join(p->thread, NULL);
        p->metering = false;
    }
    *use = p->use;
    if (use->reads > 1) use->sm_mhz /= use->reads - 1;
}
