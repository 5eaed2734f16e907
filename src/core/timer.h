// Wall-clock time in seconds (CLOCK_MONOTONIC), for step timing and benchmarks.
#pragma once
#include <time.h>

static inline double loom_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
