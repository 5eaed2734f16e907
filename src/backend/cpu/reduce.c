// Reductions whose result does not depend on the thread count: the sum of squares (fp64
// partial sums over fixed chunks, added in chunk order), and the column sums of the
// parameter-gradient reductions with the ordered combination of their per-chunk sums (cpu_ops.h).
#include "backend/cpu/cpu_ops.h"

#include <stdlib.h>

#define SUMSQ_CHUNK (1 << 15) // elements per fp64 partial sum

void cpu_add_partials(float *dst, const float *partials, int64_t nparts, int64_t stride, int64_t n, bool add) {
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float s = 0.0f;
        for (int64_t p = 0; p < nparts; p++) s += partials[p * stride + i];
        dst[i] = add ? dst[i] + s : s;
    }
}

void cpu_column_sums(float *dst, const float *x, int64_t N, int64_t n, int64_t ld, bool add) {
    int64_t nchunk = cpu_row_chunks(N);
    float *part = loom_xcalloc((size_t)(nchunk > 0 ? nchunk : 1) * (size_t)n, sizeof(float));
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < nchunk; k++) {
        float *p = part + k * n;
        for (int64_t r = k * CPU_ROW_CHUNK; r < cpu_min64(N, (k + 1) * CPU_ROW_CHUNK); r++) {
            const float *xr = x + r * ld;
#pragma omp simd
            for (int64_t c = 0; c < n; c++) p[c] += xr[c];
        }
    }
    cpu_add_partials(dst, part, nchunk, n, n, add);
    free(part);
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
