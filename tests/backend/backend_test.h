// Helpers shared by the backend tests: the CPU backend under test, fresh random buffers,
// NaN poisoning of outputs, and the test shapes (ragged T, several head sizes).
#pragma once
#include "harness.h"

#include "backend/backend.h"

#include <string.h>

#define T_TOL 1e-5 // norm-relative error allowed for fp32 against the fp64 references

static loom_backend *t_be;

typedef struct {
    int B, T, C, NH;
} t_shape;

// head sizes 8, 16, 24, 12, 64, 12, 8; T ragged against the 128-row attention blocks
#define T_NSHAPES 8
static inline t_shape t_shape_at(int i) {
    static const t_shape s[T_NSHAPES] = {{1, 1, 8, 1},    {2, 7, 48, 3},    {3, 64, 96, 4},
                                         {1, 129, 48, 4}, {2, 129, 128, 2}, {1, 300, 96, 8},
                                         {2, 33, 8, 1},   {1, 257, 32, 2}};
    return s[i];
}

static inline void t_backend_init(const char *name) {
    t_seed();
    LOOM_CHECK(loom_backend_cpu_create(&t_be, LOOM_F32) == LOOM_OK);
    printf("%s: cpu backend\n", name);
}

static inline float *t_randn(size_t n, float scale) {
    float *x = loom_xmalloc(n ? n * sizeof(float) : 1);
    t_fill_normal(x, n, scale);
    return x;
}

static inline float *t_nans(size_t n) {
    float *x = loom_xmalloc(n ? n * sizeof(float) : 1);
    for (size_t i = 0; i < n; i++) x[i] = NAN;
    return x;
}

static inline float *t_dup(const float *x, size_t n) {
    float *y = loom_xmalloc(n ? n * sizeof(float) : 1);
    memcpy(y, x, n * sizeof(float));
    return y;
}

static inline int32_t *t_tokens(size_t n, int hi) { // uniform in [0, hi)
    int32_t *t = loom_xmalloc(n ? n * sizeof(int32_t) : 1);
    for (size_t i = 0; i < n; i++) t[i] = t_randint(0, hi - 1);
    return t;
}

static inline double t_dot(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

// Vp: V rounded up to a multiple of 128
static inline int t_padded(int V) { return (V + 127) / 128 * 128; }
