// Test helpers shared by every test program: assertions that count failures, fresh random
// inputs (the seed comes from the clock unless LOOM_TEST_SEED is set, and is printed so a
// failure can be replayed), and closeness measures.
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static int t_failures = 0, t_checks = 0;

#define T_ASSERT(cond, ...)                                                   \
    do {                                                                      \
        t_checks++;                                                           \
        if (!(cond)) {                                                        \
            t_failures++;                                                     \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);   \
            fprintf(stderr, __VA_ARGS__);                                     \
            fprintf(stderr, "\n");                                            \
        }                                                                     \
    } while (0)

// Ends main: prints a summary and returns the exit code.
static inline int t_done(const char *name) {
    printf("%s: %d checks, %d failures\n", name, t_checks, t_failures);
    return t_failures ? 1 : 0;
}

// ---- fresh random inputs (xorshift64*, seeded per run) ----
static uint64_t t_rng_state;

static inline uint64_t t_seed(void) {
    const char *s = getenv("LOOM_TEST_SEED");
    uint64_t seed = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);
    if (seed == 0) seed = 1;
    t_rng_state = seed;
    printf("seed %llu (replay with LOOM_TEST_SEED=%llu)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    return seed;
}

static inline uint64_t t_next(void) {
    t_rng_state ^= t_rng_state >> 12;
    t_rng_state ^= t_rng_state << 25;
    t_rng_state ^= t_rng_state >> 27;
    return t_rng_state * 2685821657736338717ull;
}

static inline float t_uniform(float lo, float hi) { // [lo, hi)
    return lo + (hi - lo) * (float)((t_next() >> 40) * 0x1p-24);
}

static inline float t_normal(void) {
    double u1 = ((t_next() >> 11) + 1) * 0x1p-53, u2 = (t_next() >> 11) * 0x1p-53;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static inline int t_randint(int lo, int hi) { // [lo, hi]
    return lo + (int)(t_next() % (uint64_t)(hi - lo + 1));
}

static inline void t_fill_normal(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = scale * t_normal();
}

// ---- closeness ----
// max |b|, at least a tiny positive number
static inline double t_max_abs(const float *b, size_t n) {
    double mb = 1e-30;
    for (size_t i = 0; i < n; i++)
        if (fabs((double)b[i]) > mb) mb = fabs((double)b[i]);
    return mb;
}

// max |a-b| (infinite where one is NaN)
static inline double t_max_abs_err(const float *a, const float *b, size_t n) {
    double md = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > md || d != d) md = (d != d) ? INFINITY : d;
    }
    return md;
}

// max |a-b| / max(max |b|, tiny): a norm-relative error that is stable for small elements
static inline double t_max_rel_err(const float *a, const float *b, size_t n) {
    return t_max_abs_err(a, b, n) / t_max_abs(b, n);
}
