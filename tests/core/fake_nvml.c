// A stand-in for NVML (libnvidia-ml.so.1) with the entry points core/power.c reads, for
// test_power: one GPU at bus id 0000:3B:00.0 whose energy counter rises by fake_nvml.step_mj at
// each read. The test opens this library too and sets fake_nvml (dlopen gives it the same copy).
#include <string.h>

struct fake_nvml_state {
    int init_result, energy_result; // what nvmlInit_v2 and the energy query return (0: success)
    unsigned long long energy_mj, step_mj, reasons;
    unsigned sm_mhz, limit_mw;
    int inits, shutdowns;
};
struct fake_nvml_state fake_nvml = {0, 0, 5000000ULL, 16900ULL, 0x5ULL, 1740, 700000, 0, 0};

static int device; // the one GPU's handle is its address

int nvmlInit_v2(void) {
    fake_nvml.inits++;
    return fake_nvml.init_result;
}
int nvmlShutdown(void) {
    fake_nvml.shutdowns++;
    return 0;
}
const char *nvmlErrorString(int r) {
    return r == 3 ? "Not Supported" : r == 6 ? "Not Found" : r == 9 ? "Driver Not Loaded" : "Unknown Error";
}
int nvmlDeviceGetHandleByPciBusId_v2(const char *bus, void **dev) {
    if (strcmp(bus, "0000:3B:00.0") != 0) return 6;
    *dev = &device;
    return 0;
}
int nvmlDeviceGetEnforcedPowerLimit(void *dev, unsigned *mw) {
    *mw = fake_nvml.limit_mw;
    return dev == &device ? 0 : 6;
}
int nvmlDeviceGetTotalEnergyConsumption(void *dev, unsigned long long *mj) {
    if (dev != &device) return 6;
    if (fake_nvml.energy_result) return fake_nvml.energy_result;
    fake_nvml.energy_mj += fake_nvml.step_mj;
    *mj = fake_nvml.energy_mj;
    return 0;
}
int nvmlDeviceGetClockInfo(void *dev, int type, unsigned *mhz) {
    *mhz = type == 1 ? fake_nvml.sm_mhz : 0;
    return dev == &device ? 0 : 6;
}
int nvmlDeviceGetCurrentClocksEventReasons(void *dev, unsigned long long *r) {
    *r = fake_nvml.reasons;
    return dev == &device ? 0 : 6;
}
