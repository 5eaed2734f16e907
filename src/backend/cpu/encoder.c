// Token + position embedding (GPT-2's wte and wpe), as llm.c's encoder_forward/backward.
// The backward scatters into wte rows chosen by the tokens; to stay deterministic without
// atomics it is split over column blocks, and each block walks the positions in order, so
// every dwte element is summed in position order whatever the thread count.
#include "backend/cpu/cpu_ops.h"

#define ENC_COLS 64 // columns per task of the dwte scatter

static void check_tokens(const int32_t *tok, int64_t n, int64_t Vp) {
    for (int64_t i = 0; i < n; i++) LOOM_CHECK(tok[i] >= 0 && tok[i] < Vp);
}

void cpu_encoder_forward(loom_backend *be, loom_tensor out, loom_tensor tokens, loom_tensor wte,
                         loom_tensor wpe) {
    float *o = cpu_f32(out); // (B,T,C)
    const int32_t *tok = cpu_i32(tokens); // (B,T)
    const float *te = cpu_f32(wte), *pe = cpu_f32(wpe); // (Vp,C), (maxT,C)
    LOOM_CHECK(tokens.ndim == 2);
    int64_t B = tokens.shape[0], T = tokens.shape[1], C = loom_cols(&wte);
    LOOM_CHECK(loom_numel(&out) == B * T * C && loom_cols(&wpe) == C && T <= loom_rows(&wpe));
    check_tokens(tok, B * T, loom_rows(&wte));
#pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < B * T; bt++) {
        float *ob = o + bt * C;
        const float *e = te + (int64_t)tok[bt] * C, *p = pe + (bt % T) * C;
#pragma omp simd
        for (int64_t c = 0; c < C; c++) ob[c] = e[c] + p[c];
    }
}

void cpu_encoder_backward(loom_backend *be, loom_tensor dwte, loom_tensor dwpe, loom_tensor dout,
                          loom_tensor tokens) {
    float *dte = cpu_f32(dwte), *dpe = cpu_f32(dwpe); // (Vp,C) +=, (maxT,C) +=
    const float *d = cpu_f32(dout); // (B,T,C)
    const int32_t *tok = cpu_i32(tokens); // (B,T)
    LOOM_CHECK(tokens.ndim == 2);
    int64_t B = tokens.shape[0], T = tokens.shape[1], C = loom_cols(&dwte);
    LOOM_CHECK(loom_numel(&dout) == B * T * C && loom_cols(&dwpe) == C && T <= loom_rows(&dwpe));
    check_tokens(tok, B * T, loom_rows(&dwte));
#pragma omp parallel
    {
#pragma omp for schedule(static) nowait
        for (int64_t c0 = 0; c0 < C; c0 += ENC_COLS) {
            int64_t c1 = cpu_min64(c0 + ENC_COLS, C);
            for (int64_t bt = 0; bt < B * T; bt++) {
                float *g = dte + (int64_t)tok[bt] * C;
                const float *db = d + bt * C;
#pragma omp simd
                for (int64_t c = c0; c < c1; c++) g[c] += db[c];
            }
        }
#pragma omp for schedule(static)
        for (int64_t t = 0; t < T; t++) {
            float *g = dpe + t * C;
            for (int64_t b = 0; b < B; b++) {
                const float *db = d + (b * T + t) * C;
#pragma omp simd
                for (int64_t c = 0; c < C; c++) g[c] += db[c];
            }
        }
    }
}
