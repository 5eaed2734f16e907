// LayerNorm over the last dim (Ba et al. 2016), eps 1e-5 as GPT-2. The backward is llm.c's
// layernorm_backward (train_gpt2.c): with n = (x - mean) * rstd and g = w * dout,
//   dinp += (g - mean(g) - n * mean(g * n)) * rstd;  dw += n * dout;  db += dout;
// dsum += the column sums of dinp afterwards, by the matmul's own column sums (the same bits as
// the bias gradient it would sum from the same values).
// Rows are independent; the dw/db sums over rows go through per-chunk partials (cpu_ops.h)
// so they repeat bit for bit under any thread count.
#include "backend/cpu/cpu_ops.h"

#include <math.h>
#include <stdlib.h>

#define LN_EPS 1e-5f

void cpu_layernorm_forward(loom_backend *be, loom_tensor out, loom_tensor mean, loom_tensor rstd,
                           loom_tensor inp, loom_tensor w, loom_tensor b) {
    const float *x = cpu_f32(inp), *wp = cpu_f32(w), *bp = cpu_f32(b); // (N,C), (C), (C)
    float *o = cpu_f32(out), *mu = cpu_f32(mean), *rs = cpu_f32(rstd); // (N,C), (N), (N)
    int64_t N = loom_rows(&inp), C = loom_cols(&inp);
    LOOM_CHECK(loom_rows(&out) == N && loom_cols(&out) == C && loom_numel(&w) == C &&
               loom_numel(&b) == C && loom_numel(&mean) == N && loom_numel(&rstd) == N);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * C;
        float *orow = o + n * C;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < C; i++) s += xr[i];
        float m = s / (float)C, v = 0.0f;
#pragma omp simd reduction(+ : v)
        for (int64_t i = 0; i < C; i++) v += (xr[i] - m) * (xr[i] - m);
        float r = 1.0f / sqrtf(v / (float)C + LN_EPS);
#pragma omp simd
        for (int64_t i = 0; i < C; i++) orow[i] = (xr[i] - m) * r * wp[i] + bp[i];
        mu[n] = m;
        rs[n] = r;
    }
}

// dinp row n +=, and the row's dw/db contributions added into pdw/pdb (C each)
static void layernorm_backward_row(float *restrict dx, float *restrict pdw, float *restrict pdb,
                                   const float *restrict dy, const float *restrict x,
                                   const float *restrict wp, float m, float r, int64_t C) {
    float gsum = 0.0f, gnsum = 0.0f;
#pragma omp simd reduction(+ : gsum, gnsum)
    for (int64_t i = 0; i < C; i++) {
        float g = wp[i] * dy[i];
        gsum += g;
        gnsum += g * (x[i] - m) * r;
    }
    float gmean = gsum / (float)C, gnmean = gnsum / (float)C;
#pragma omp simd
    for (int64_t i = 0; i < C; i++) {
        float nrm = (x[i] - m) * r;
        pdb[i] += dy[i];
        pdw[i] += nrm * dy[i];
        dx[i] += (wp[i] * dy[i] - gmean - nrm * gnmean) * r;
    }
}

void cpu_layernorm_backward(loom_backend *be, loom_tensor dinp, loom_tensor dw, loom_tensor db, loom_tensor dsum,
                            loom_tensor dout, loom_tensor inp, loom_tensor w, loom_tensor mean,
                            loom_tensor rstd) {
    float *dx = cpu_f32(dinp), *dwp = cpu_f32(dw), *dbp = cpu_f32(db); // (N,C) +=, (C) += (or =), (C) += (or =)
    const float *dy = cpu_f32(dout), *x = cpu_f32(inp), *wp = cpu_f32(w); // (N,C), (N,C), (C)
    const float *mu = cpu_f32(mean), *rs = cpu_f32(rstd); // (N), (N)
    int64_t N = loom_rows(&inp), C = loom_cols(&inp);
    LOOM_CHECK(loom_rows(&dinp) == N && loom_cols(&dinp) == C && loom_rows(&dout) == N &&
               loom_cols(&dout) == C && loom_numel(&w) == C && loom_numel(&dw) == C &&
               loom_numel(&db) == C && loom_numel(&mean) == N && loom_numel(&rstd) == N);
    LOOM_CHECK(!dsum.data || loom_numel(&dsum) == C);
    int64_t nchunk = cpu_row_chunks(N);
    float *part = loom_xcalloc((size_t)(nchunk > 0 ? nchunk : 1) * 2 * (size_t)C, sizeof(float));
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < nchunk; k++) {
        float *pdw = part + k * 2 * C, *pdb = pdw + C; // this chunk's (dw, db) partial sums
        for (int64_t n = k * CPU_ROW_CHUNK; n < cpu_min64(N, (k + 1) * CPU_ROW_CHUNK); n++)
            layernorm_backward_row(dx + n * C, pdw, pdb, dy + n * C, x + n * C, wp, mu[n], rs[n],
                                   C);
    }
    bool add = !be->grads_write;
    cpu_add_partials(dwp, part, nchunk, 2 * C, C, add);
    cpu_add_partials(dbp, part + C, nchunk, 2 * C, C, add);
    free(part);
    if (dsum.data) cpu_column_sums(cpu_f32(dsum), dx, N, C, C, add); // matmul_backward's bias sum
}
