// A GPU's power, energy and SM clock through NVML, the NVIDIA Management Library that the driver
// installs (libnvidia-ml.so.1; LOOM_NVML_LIBRARY names another file). It is opened at run time, so
// loom builds and runs where it is absent (the CPU, a container without the driver's libraries).
// Why it matters: an H100 or H200 at full load runs at or near its power limit (700 W), and the
// driver lowers the SM clock to stay there, so a step's time follows its energy as much as its
// kernels' speed (bench/NOTES.md, fourteenth and fifteenth sessions). `loom bench` reports both.
// Source: NVML API reference (nvmlDeviceGetTotalEnergyConsumption, nvmlDeviceGetClockInfo,
// nvmlDeviceGetCurrentClocksEventReasons, nvmlDeviceGetEnforcedPowerLimit).
#pragma once
#include "core/status.h"

#include <stdbool.h>

typedef struct loom_power loom_power;

typedef struct {
    double energy_j;   // the GPU's energy counter: joules since the driver loaded (differences count)
    double sm_mhz;     // the SM clock now (MHz)
    bool power_capped; // the clock is held down by the power limit now (NVML's reasons SW power cap
                       // or HW power brake)
} loom_power_sample;

// Opens NVML for the GPU at PCI bus id `pci_bus_id` ("0000:3B:00.0", as cudaDeviceGetPCIBusId
// writes it) and reads it once. Errors (LOOM_EUNSUPPORTED, one line saying which): no NVML
// library, NVML's init failed, no GPU at that bus id, no energy counter (before Volta).
loom_status loom_power_open(loom_power **out, const char *pci_bus_id);
loom_status loom_power_read(loom_power *p, loom_power_sample *s); // LOOM_EUNSUPPORTED where a read fails
double loom_power_limit_w(const loom_power *p); // the enforced power limit (W); 0 where NVML has none
void loom_power_close(loom_power *p);           // NULL is fine (stops a meter still running)

// What a meter saw (loom_power_meter_stop). The energy counter moves in steps (every ~100 ms on an
// H100 or H200), so the mean power is taken between the first and the last read at which it had
// moved: watts = joules / span_s; a mean wants span_s >= 1 s.
typedef struct {
    double joules, span_s; // the energy counter's rise between its first and last moves, and the seconds between
    double sm_mhz;         // mean SM clock over the reads (MHz)
    int reads, capped;     // reads taken; those at which the power limit held the clock down
    int moves;             // reads at which the energy counter had moved since the one before
    char lost[200];        // why a read failed (no figure then), or ""
} loom_power_use;

// A thread that reads the GPU every interval_s seconds (e.g. 0.005) from start until stop, so that
// what is timed meanwhile has no read between its parts (a read takes ~1 ms of the host). One meter
// at a time per loom_power. Errors of start: LOOM_EUNSUPPORTED where the thread cannot start, or
// with a meter already running. A read that fails stops the reads and says why in use->lost.
loom_status loom_power_meter_start(loom_power *p, double interval_s);
void loom_power_meter_stop(loom_power *p, loom_power_use *use);
