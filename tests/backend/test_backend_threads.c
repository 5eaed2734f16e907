// Thread-count independence: the parameter gradients (encoder, layernorm, matmul bias),
// attention's output and dqkv, and sumsq must repeat bit for bit under 1, 2 and 3 OpenMP
// threads. Shapes span several row chunks, column blocks and (batch, head) tasks. (The matmul
// products themselves come from multi-threaded OpenBLAS sgemm, whose rounding depends on how
// it splits the matrices among threads: repeatable at a fixed thread count only.)
#include "backend_test.h"

#include <omp.h>

#define F32 LOOM_F32
#define NTHREADS 3

typedef void (*th_run)(void *ctx); // recomputes the outputs of ctx from scratch

// runs `run` under 1..NTHREADS threads; each run's out (n floats) must equal the first's
static void check_threads(const char *what, th_run run, void *ctx, const float *out, size_t n) {
    float *first = NULL;
    for (int nt = 1; nt <= NTHREADS; nt++) {
        omp_set_num_threads(nt);
        run(ctx);
        if (!first)
            first = t_dup(out, n);
        else
            T_ASSERT(memcmp(first, out, n * sizeof(float)) == 0, "%s differs at %d threads", what,
                     nt);
    }
    omp_set_num_threads(NTHREADS);
    free(first);
}

enum { B = 3, T = 139, N = B * T, C = 200, OC = 96, Vp = 128, NH = 4, AC = 64 };

typedef struct {
    float *x, *w, *dy, *mean, *rstd, *dx, *dw, *db, *out, *lse, *qkv, *dqkv;
    int32_t *tok;
} th_bufs;

static void run_encoder(void *p) {
    th_bufs *b = p;
    memset(b->dw, 0, sizeof(float) * Vp * C), memset(b->db, 0, sizeof(float) * T * C);
    t_be->encoder_backward(t_be, LOOM_VIEW(b->dw, F32, Vp, C), LOOM_VIEW(b->db, F32, T, C),
                           LOOM_VIEW(b->dy, F32, B, T, C), LOOM_VIEW(b->tok, LOOM_I32, B, T), 0);
}

static void run_layernorm(void *p) {
    th_bufs *b = p;
    memset(b->dx, 0, sizeof(float) * N * C), memset(b->dw, 0, sizeof(float) * 2 * C);
    t_be->layernorm_backward(t_be, LOOM_VIEW(b->dx, F32, N, C), LOOM_VIEW(b->dw, F32, C),
                             LOOM_VIEW(b->dw + C, F32, C), (loom_tensor){0}, LOOM_VIEW(b->dy, F32, N, C),
                             LOOM_VIEW(b->x, F32, N, C), LOOM_VIEW(b->w, F32, C),
                             LOOM_VIEW(b->mean, F32, N), LOOM_VIEW(b->rstd, F32, N));
}

static void run_matmul(void *p) {
    th_bufs *b = p;
    memset(b->db, 0, sizeof(float) * OC);
    t_be->matmul_backward(t_be, LOOM_VIEW(NULL, F32, N, C), LOOM_VIEW(b->dw, F32, OC, C),
                          LOOM_VIEW(b->db, F32, OC), LOOM_VIEW(b->dy, F32, N, OC),
                          LOOM_VIEW(b->x, F32, N, C), LOOM_VIEW(b->w, F32, OC, C));
}

static void run_attention(void *p) {
    th_bufs *b = p;
    loom_tensor out = LOOM_VIEW(b->out, F32, B, T, AC), lse = LOOM_VIEW(b->lse, F32, B, NH, T);
    loom_tensor qkv = LOOM_VIEW(b->qkv, F32, B, T, 3 * AC);
    loom_tensor dqkv = LOOM_VIEW(b->dqkv, F32, B, T, 3 * AC);
    t_be->attention_forward(t_be, out, lse, qkv, qkv, NH, LOOM_ATTN_CAUSAL);
    memset(b->dqkv, 0, 3 * B * T * AC * sizeof(float)); // the backward adds into it
    t_be->attention_backward(t_be, dqkv, dqkv, (loom_tensor){0}, LOOM_VIEW(b->dy, F32, B, T, AC), qkv, qkv, out, lse, NH,
                             LOOM_ATTN_CAUSAL);
}

static void run_sumsq(void *p) {
    th_bufs *b = p;
    double s = t_be->sumsq(t_be, LOOM_VIEW(b->x, F32, N * C));
    memcpy(b->out, &s, sizeof s);
}

int main(void) {
    t_backend_init("backend_threads");
    th_bufs b = {.x = t_randn(N * C, 1),
                 .w = t_randn(N * C, 1),
                 .dy = t_randn(N * C, 1),
                 .mean = t_nans(N),
                 .rstd = t_nans(N),
                 .dx = t_nans(N * C),
                 .dw = t_nans(N * C),
                 .db = t_nans(N * C),
                 .out = t_nans(B * T * AC),
                 .lse = t_nans(B * NH * T),
                 .qkv = t_randn(3 * B * T * AC, 1),
                 .dqkv = t_nans(3 * B * T * AC),
                 .tok = t_tokens(N, 7)};
    t_be->layernorm_forward(t_be, LOOM_VIEW(b.dx, F32, N, C), LOOM_VIEW(b.mean, F32, N),
                            LOOM_VIEW(b.rstd, F32, N), LOOM_VIEW(b.x, F32, N, C),
                            LOOM_VIEW(b.w, F32, C), LOOM_VIEW(b.w + C, F32, C));
    check_threads("encoder dwte", run_encoder, &b, b.dw, Vp * C);
    check_threads("encoder dwpe", run_encoder, &b, b.db, T * C);
    check_threads("layernorm dw, db", run_layernorm, &b, b.dw, 2 * C);
    check_threads("layernorm dinp", run_layernorm, &b, b.dx, N * C);
    check_threads("matmul dbias", run_matmul, &b, b.db, OC);
    check_threads("attention dqkv", run_attention, &b, b.dqkv, 3 * B * T * AC);
    check_threads("attention out", run_attention, &b, b.out, B * T * AC);
    check_threads("sumsq", run_sumsq, &b, b.out, 2);
    free(b.x), free(b.w), free(b.dy), free(b.mean), free(b.rstd), free(b.dx), free(b.dw);
    free(b.db), free(b.out), free(b.lse), free(b.qkv), free(b.dqkv), free(b.tok);
    loom_backend_destroy(t_be);
    return t_done("backend_threads");
}
