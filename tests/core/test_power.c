// core/power.c against a stand-in NVML (fake_nvml.c, loaded through LOOM_NVML_LIBRARY): the
// units (mJ to J, mW to W), the power-limit reasons, and a clear error for each way NVML can be
// missing. The stand-in's values are drawn fresh each run.
#include "harness.h"

#include "core/power.h"

#include <dlfcn.h>
#include <string.h>
#include <time.h>

struct fake_nvml_state {
    int init_result, energy_result;
    unsigned long long energy_mj, step_mj, reasons;
    unsigned sm_mhz, limit_mw;
    int inits, shutdowns;
};

static bool says(const char *what) { return strstr(loom_error_message(), what) != NULL; }

int main(void) {
    t_seed();
    void *lib = dlopen(FAKE_NVML, RTLD_NOW);
    T_ASSERT(lib != NULL, "cannot open %s: %s", FAKE_NVML, dlerror());
    if (!lib) return t_done("power");
    struct fake_nvml_state *f = dlsym(lib, "fake_nvml");
    setenv("LOOM_NVML_LIBRARY", FAKE_NVML, 1);

    // readings: the counter's difference in joules, the clock, the limit in watts
    f->energy_mj = t_next() % 1000000000ULL, f->step_mj = 1000 + t_next() % 100000;
    f->sm_mhz = 1000 + (unsigned)(t_next() % 1000), f->limit_mw = 300000 + (unsigned)(t_next() % 400000);
    loom_power *p = NULL;
    T_ASSERT(loom_power_open(&p, "0000:3B:00.0") == LOOM_OK, "open: %s", loom_error_message());
    if (!p) return t_done("power");
    T_ASSERT(fabs(loom_power_limit_w(p) - f->limit_mw / 1000.0) < 1e-9, "limit %g W, set %u mW", loom_power_limit_w(p),
             f->limit_mw);
    loom_power_sample a, b;
    T_ASSERT(loom_power_read(p, &a) == LOOM_OK && loom_power_read(p, &b) == LOOM_OK, "read");
    T_ASSERT(fabs((b.energy_j - a.energy_j) - f->step_mj / 1000.0) < 1e-6, "%g J between reads, step %llu mJ",
             b.energy_j - a.energy_j, f->step_mj);
    T_ASSERT(fabs(b.energy_j - f->energy_mj / 1000.0) < 1e-6, "counter %g J, %llu mJ", b.energy_j, f->energy_mj);
    T_ASSERT(b.sm_mhz == f->sm_mhz, "clock %g MHz, set %u", b.sm_mhz, f->sm_mhz);
    // the reasons: SW power cap (0x4) or HW power brake (0x80) hold the clock down; idle (0x1),
    // thermal (0x20, 0x40) and the rest do not count as the power limit
    const struct { unsigned long long bits; bool capped; } why[] = {
        {0x1, false}, {0x4, true}, {0x5, true}, {0x80, true}, {0x60, false}, {0x8, false}, {0, false}};
    for (size_t i = 0; i < sizeof why / sizeof why[0]; i++) {
        f->reasons = why[i].bits;
        T_ASSERT(loom_power_read(p, &a) == LOOM_OK && a.power_capped == why[i].capped, "reasons 0x%llx: capped %d",
                 why[i].bits, a.power_capped);
    }
    // the meter: a thread reading every 1 ms while this one sleeps. The stand-in's counter moves
    // at every read, so every read after the first is a move, and the span's energy is the moves
    // after the first one; every read at the SW power cap (0x4)
    f->reasons = 0x4;
    loom_power_use use;
    T_ASSERT(loom_power_meter_start(p, 0.001) == LOOM_OK, "meter: %s", loom_error_message());
    T_ASSERT(loom_power_meter_start(p, 0.001) == LOOM_EUNSUPPORTED && says("running"), "a second meter: %s",
             loom_error_message());
    nanosleep(&(struct timespec){0, 60000000}, NULL);
    loom_power_meter_stop(p, &use);
    T_ASSERT(use.reads >= 5 && use.moves == use.reads - 1 && use.capped == use.reads - 1 && !use.lost[0],
             "meter: %d reads, %d moves, %d capped, lost '%s'", use.reads, use.moves, use.capped, use.lost);
    T_ASSERT(fabs(use.joules - (use.moves - 1) * (f->step_mj / 1000.0)) < 1e-6, "meter: %g J over %d moves of %llu mJ",
             use.joules, use.moves, f->step_mj);
    T_ASSERT(use.span_s > 0.0 && use.span_s < 1.0 && use.sm_mhz == f->sm_mhz, "meter: span %g s, clock %g MHz (set %u)",
             use.span_s, use.sm_mhz, f->sm_mhz);
    // a read that fails ends the meter's reads and says why; the counter's figures stay unused
    f->energy_result = 3;
    T_ASSERT(loom_power_meter_start(p, 0.001) == LOOM_OK, "meter: %s", loom_error_message());
    nanosleep(&(struct timespec){0, 10000000}, NULL);
    loom_power_meter_stop(p, &use);
    T_ASSERT(use.reads == 0 && strstr(use.lost, "Not Supported"), "meter, failing: %d reads, lost '%s'", use.reads,
             use.lost);
    f->energy_result = 0;

    // a counter that stops answering mid-run is an error, not a zero
    f->energy_result = 3;
    T_ASSERT(loom_power_read(p, &a) == LOOM_EUNSUPPORTED && says("Not Supported"), "read: %s", loom_error_message());
    // a meter still running (here, its thread ended by the failing read) is stopped by close
    T_ASSERT(loom_power_meter_start(p, 0.001) == LOOM_OK, "meter: %s", loom_error_message());
    int shut = f->shutdowns;
    loom_power_close(p);
    T_ASSERT(f->shutdowns == shut + 1, "close shuts NVML down once: %d -> %d", shut, f->shutdowns);

    // no energy counter at open
    T_ASSERT(loom_power_open(&p, "0000:3B:00.0") == LOOM_EUNSUPPORTED && p == NULL && says("energy"), "%s",
             loom_error_message());
    f->energy_result = 0;
    // no GPU at that bus id: the id in the message, NVML shut down again
    shut = f->shutdowns;
    T_ASSERT(loom_power_open(&p, "0000:99:00.0") == LOOM_EUNSUPPORTED && p == NULL && says("'0000:99:00.0'") &&
                 says("Not Found"),
             "%s", loom_error_message());
    T_ASSERT(f->shutdowns == shut + 1, "shut down after a failed open: %d -> %d", shut, f->shutdowns);
    // init fails: no shutdown without an init
    f->init_result = 9;
    shut = f->shutdowns;
    T_ASSERT(loom_power_open(&p, "0000:3B:00.0") == LOOM_EUNSUPPORTED && says("Driver Not Loaded"), "%s",
             loom_error_message());
    T_ASSERT(f->shutdowns == shut, "no shutdown after a failed init");
    f->init_result = 0;
    // no library at all
    setenv("LOOM_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1", 1);
    T_ASSERT(loom_power_open(&p, "0000:3B:00.0") == LOOM_EUNSUPPORTED && says("no NVML library") &&
                 says("/nonexistent/libnvidia-ml.so.1"),
             "%s", loom_error_message());
    dlclose(lib);
    return t_done("power");
}
