// Token + position embedding (GPT-2's wte and wpe), as llm.c's encoder_forward/backward, over
// one range of the vocabulary: wte holds rows [vocab_start, vocab_start + Vl) (backend.h).
// The backward scatters into wte rows chosen by the tokens; to stay deterministic without
// atomics it is split over column blocks, and each block walks the positions in order, so
// every dwte element is summed in position order whatever the thread count.
#include "backend/cpu/cpu_ops.h"

#include <string.h>

#define ENC_COLS 64 // columns per task of the dwte scatter

// Checks that tokens are >= 0 (their upper bound, Vp, is the whole vocabulary's, which a shard
// does not know) and returns B*T.
static int64_t check_tokens(loom_tensor tokens, int vocab_start) {
    const int32_t *tok = cpu_i32(tokens);
    LOOM_CHECK(tokens.ndim == 2 && vocab_start >= 0);
    int64_t n = loom_numel(&tokens);
    for (int64_t i = 0; i < n; i++) LOOM_CHECK(tok[i] >= 0);
    return n;
}

void cpu_encoder_forward(loom_backend *be, loom_tensor out, loom_tensor tokens, loom_tensor wte,
                         loom_tensor wpe, int vocab_start) {
    float *o = cpu_f32(out); // (B,T,C)
    const int32_t *tok = cpu_i32(tokens); // (B,T)
    const float *te = cpu_f32(wte), *pe = cpu_f32(wpe); // (Vl,C), (maxT,C)
    int64_t BT = check_tokens(tokens, vocab_start), T = tokens.shape[1], C = loom_cols(&wte);
    int64_t Vl = loom_rows(&wte);
    LOOM_CHECK(loom_numel(&out) == BT * C && loom_cols(&wpe) == C && T <= loom_rows(&wpe));
#pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < BT; bt++) {
        float *ob = o + bt * C;
        int64_t v = cpu_shard_index(tok[bt], vocab_start, Vl);
        if (v < 0) { // another shard's token
            memset(ob, 0, sizeof(float) * (size_t)C);
            continue;
        }
        const float *e = te + v * C, *p = pe + (bt % T) * C;
#pragma omp simd
        for (int64_t c = 0; c < C; c++) ob[c] = e[c] + p[c];
    }
}

void cpu_encoder_backward(loom_backend *be, loom_tensor dwte, loom_tensor dwpe, loom_tensor dout,
                          loom_tensor tokens, int vocab_start) {
    float *dte = cpu_f32(dwte), *dpe = cpu_f32(dwpe); // (Vl,C) +=, (maxT,C) +=
    const float *d = cpu_f32(dout); // (B,T,C)
    const int32_t *tok = cpu_i32(tokens); // (B,T)
    int64_t BT = check_tokens(tokens, vocab_start), B = tokens.shape[0], T = tokens.shape[1];
    int64_t C = loom_cols(&dwte), Vl = loom_rows(&dwte);
    LOOM_CHECK(loom_numel(&dout) == BT * C && loom_cols(&dwpe) == C && T <= loom_rows(&dwpe));
#pragma omp parallel
    {
#pragma omp for schedule(static) nowait
        for (int64_t c0 = 0; c0 < C; c0 += ENC_COLS) {
            int64_t c1 = cpu_min64(c0 + ENC_COLS, C);
            for (int64_t bt = 0; bt < BT; bt++) {
                int64_t v = cpu_shard_index(tok[bt], vocab_start, Vl);
                if (v < 0) continue;
                float *g = dte + v * C;
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
