// Reductions whose result does not depend on the thread count: the sum of squares (fp64
// partial sums over fixed chunks, added in chunk order) and the ordered combination of
// per-chunk column sums used by the parameter-gradient reductions (see cpu_ops.h).
#include "backend/cpu/cpu_ops.h"

#include <stdlib.h>

#define SUMSQ_CHUNK (1 << 15) // elements per fp64 partial sum

void cpu_add_partials(float *dst, const float *partials, int64_t nparts, int64_t stride,
                      int64_t n) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float s = 0.0f;
        for (int64_t p = 0; p < nparts; p++) s += partials[p * stride + i];
        dst[i] += s;
    }
}

double cpu_sumsq(loom_backend *be, loom_tensor x) {
    const float *xp = cpu_f32(x);
    int64_t n = loom_numel(&x), nchunk = (n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
    double *part = loom_xmalloc((size_t)(nchunk > 0 ? nchunk : 1) * sizeof(double));
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < nchunk; k++) {
        const float *c = xp + k * SUMSQ_CHUNK;
        int64_t len = cpu_min64(SUMSQ_CHUNK, n - k * SUMSQ_CHUNK);
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < len; i++) s += (double)c[i] * (double)c[i];
        part[k] = s;
    }
    double total = 0.0;
    for (int64_t k = 0; k < nchunk; k++) total += part[k];
    free(part);
    return total;
}

void cpu_sumsq_add(loom_backend *be, double *acc, loom_tensor x) { *acc += cpu_sumsq(be, x); }
