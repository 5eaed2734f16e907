// Shared by the CUDA backend tests: the CPU backend (the fp32 reference) and the CUDA backend of
// the mode under test, host/device buffer pairs (bf16 rounding on the host), and comparisons that
// keep the worst error per op and mode for the summary. Each test program includes it once.
#pragma once
#include "harness.h"

#include "backend/backend.h"
#include "backend/ref.h"

#include <stdbool.h>
#include <string.h>

#define F32 LOOM_F32
#define I32 LOOM_I32

typedef struct {
    int B, T, C, NH;
} shape;

static loom_backend *cpu, *gpu; // gpu: the CUDA backend of the mode under test
static loom_dtype dt;           // its dtype (parameters, activations, gradients)
static double tol;

// ---- bf16 on the host (round to nearest even) ----
static inline uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float bf2f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// ---- a host array (what the CPU backend reads and writes) and its device copy ----
typedef struct {
    float *h;
    void *d;
    size_t n;
    loom_dtype dt;
} buf;
#define HV(b, ...) LOOM_VIEW((b).h, F32, __VA_ARGS__)
#define DV(b, ...) LOOM_VIEW((b).d, (b).dt, __VA_ARGS__)

static inline void upload_as(void *d, const float *x, size_t n, loom_dtype d_dt) {
    if (d_dt == LOOM_BF16) {
        uint16_t *h = loom_xmalloc(n * 2 + 2);
        for (size_t i = 0; i < n; i++) h[i] = f2bf(x[i]);
        gpu->upload(gpu, d, h, n * 2);
        free(h);
    } else {
        gpu->upload(gpu, d, x, n * 4);
    }
}

static inline void download_as(float *x, const void *d, size_t n, loom_dtype d_dt) {
    if (d_dt == LOOM_BF16) {
        uint16_t *h = loom_xmalloc(n * 2 + 2);
        gpu->download(gpu, h, d, n * 2);
        for (size_t i = 0; i < n; i++) x[i] = bf2f(h[i]);
        free(h);
    } else {
        gpu->download(gpu, x, d, n * 4);
    }
}

// x rounded to d's precision, on the host and on the device
static inline buf b_from(const float *x, size_t n, loom_dtype d) {
    buf b = {loom_xmalloc(n * 4 + 4), gpu->alloc(gpu, n * loom_dtype_size(d)), n, d};
    LOOM_CHECK(b.d);
    for (size_t i = 0; i < n; i++) b.h[i] = d == LOOM_BF16 ? bf2f(f2bf(x[i])) : x[i];
    upload_as(b.d, b.h, n, d);
    return b;
}
static inline buf b_randn(size_t n, float scale, loom_dtype d) {
    float *x = loom_xmalloc(n * 4 + 4);
    t_fill_normal(x, n, scale);
    buf b = b_from(x, n, d);
    free(x);
    return b;
}
static inline buf b_nans(size_t n, loom_dtype d) {
    float *x = loom_xmalloc(n * 4 + 4);
    for (size_t i = 0; i < n; i++) x[i] = NAN;
    buf b = b_from(x, n, d);
    free(x);
    return b;
}
static inline void b_free(buf *b) {
    free(b->h);
    gpu->free(gpu, b->d);
}
static inline int32_t *d_ints(const int32_t *x, size_t n) {
    int32_t *d = gpu->alloc(gpu, n * 4);
    LOOM_CHECK(d);
    gpu->upload(gpu, d, x, n * 4);
    return d;
}

// ---- comparison, and the worst error per op and mode for the summary ----
#define MAX_OPS 96
static struct {
    const char *name;
    double worst[2];
} errs[MAX_OPS];
static int nerrs;

static inline void record(const char *what, double e) {
    int i = 0;
    while (i < nerrs && strcmp(errs[i].name, what) != 0) i++;
    if (i == nerrs) {
        LOOM_CHECK(nerrs < MAX_OPS);
        errs[nerrs++].name = what;
    }
    double *w = &errs[i].worst[dt == LOOM_BF16];
    if (e > *w || e != e) *w = e;
}

// got (n) against want, relative to max |want|, or to `scale` when it is positive (for a
// result whose rounding error follows another tensor's size)
static inline void check_values(const char *what, const float *got, const float *want, size_t n, double scale,
                         shape s) {
    double e = t_max_rel_err(got, want, n) * (scale > 0 ? t_max_abs(want, n) / scale : 1);
    record(what, e);
    T_ASSERT(e < tol, "%s %s B=%d T=%d C=%d NH=%d: rel err %.3g", dt == LOOM_BF16 ? "bf16" : "fp32",
             what, s.B, s.T, s.C, s.NH, e);
}

// the device result of b against the CPU result in b.h, as check_values
static inline void check_scaled(const char *what, buf b, double scale, shape s) {
    float *got = loom_xmalloc(b.n * 4 + 4);
    download_as(got, b.d, b.n, b.dt);
    check_values(what, got, b.h, b.n, scale, s);
    free(got);
}

static inline void check(const char *what, buf b, shape s) { check_scaled(what, b, 0, s); }


// A test program's main: exit 77 (ctest: skipped) without a CUDA device, else run_mode(mode,
// quick) in fp32 and then bf16 (quick: LOOM_CUDA_TEST_QUICK=1, the small shapes only) and print the
// worst error of each op in each mode.
static inline int cuda_test_main(const char *name, void (*run_mode)(loom_dtype mode, bool quick)) {
    loom_backend *probe = NULL;
    if (loom_backend_create(&probe, "cuda", LOOM_F32) == LOOM_EUNSUPPORTED) {
        printf("skipped: no CUDA device\n  (%s)\n", loom_error_message());
        return 77;
    }
    loom_backend_destroy(probe);
    t_seed();
    LOOM_CHECK(loom_backend_cpu_create(&cpu, LOOM_F32) == LOOM_OK);
    const char *q = getenv("LOOM_CUDA_TEST_QUICK");
    bool quick = q && strcmp(q, "0") != 0;
    run_mode(LOOM_F32, quick);
    run_mode(LOOM_BF16, quick);
    printf("%-38s %12s %12s\n", "worst norm-relative error", "fp32", "bf16");
    for (int i = 0; i < nerrs; i++) printf("%-38s %12.3g %12.3g\n", errs[i].name, errs[i].worst[0], errs[i].worst[1]);
    loom_backend_destroy(cpu);
    return t_done(name);
}
