// Per-op benchmark of the CPU backend at one GPT-2 124M layer (B=4, T=1024, C=768, NH=12,
// V=50257), printed next to the machine's cblas_sgemm rate: time per call (median of REPS after
// a warm-up), GFLOP/s where the op is FLOP-bound (matmuls: 2 per multiply-add; attention:
// causal half only, the backward counted as the 5 products it runs, recomputing S) and GB/s
// of compulsory traffic for the memory-bound ones. Ends with the layer's forward + backward
// total as a fraction of the sgemm rate (the training step's target is 40%).
// Usage: bench_backend [reps]   (threads: OMP_NUM_THREADS)
#include "backend/backend.h"
#include "core/timer.h"

#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

enum { B = 4, T = 1024, C = 768, NH = 12, V = 50257, Vp = 50304, N = B * T };
#define NPARAMS 124475904LL // GPT-2 124M with Vp (AdamW and sumsq run over all of them)
#define F32 LOOM_F32

static loom_backend *be;
static float *x, *y, *z, *w, *dw, *bias, *dbias, *qkv, *dqkv, *att, *datt, *lse, *mean, *rstd;
static float *logits, *losses, *m, *v, *big, *grad;
static int32_t *tokens, *targets;

static float *buf(int64_t n) {
    float *p = be->alloc(be, (size_t)n * sizeof(float));
    LOOM_CHECK(p != NULL);
    for (int64_t i = 0; i < n; i++)
        p[i] = 0.02f * (float)((i * 2654435761u) % 1000) / 1000.0f - 0.01f;
    return p;
}

static loom_tensor f(float *p, int64_t rows, int64_t cols) { return LOOM_VIEW(p, F32, rows, cols); }

// ---- the ops, one call each ----
static int oc_of[4] = {3 * C, C, 4 * C, C}, ic_of[4] = {C, C, C, 4 * C};
static int mm; // which of the four layer matmuls
static void sgemm_ref(void) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, 4 * C, C, 1.0f, x, C, w, C, 0.0f, y,
                4 * C);
}
static void encoder_fwd(void) {
    be->encoder_forward(be, f(x, N, C), LOOM_VIEW(tokens, LOOM_I32, B, T), f(w, Vp, C), f(z, T, C),
                        0);
}
static void encoder_bwd(void) {
    be->encoder_backward(be, f(dw, Vp, C), f(z, T, C), f(x, N, C),
                         LOOM_VIEW(tokens, LOOM_I32, B, T), 0);
}
static void layernorm_fwd(void) {
    be->layernorm_forward(be, f(y, N, C), LOOM_VIEW(mean, F32, N), LOOM_VIEW(rstd, F32, N),
                          f(x, N, C), LOOM_VIEW(w, F32, C), LOOM_VIEW(bias, F32, C));
}
static void layernorm_bwd(void) {
    be->layernorm_backward(be, f(z, N, C), LOOM_VIEW(dw, F32, C), LOOM_VIEW(dbias, F32, C), (loom_tensor){0},
                           f(y, N, C), f(x, N, C), LOOM_VIEW(w, F32, C), LOOM_VIEW(mean, F32, N),
                           LOOM_VIEW(rstd, F32, N));
}
static void matmul_fwd(void) {
    be->matmul_forward(be, f(y, N, oc_of[mm]), f(x, N, ic_of[mm]), f(w, oc_of[mm], ic_of[mm]),
                       LOOM_VIEW(bias, F32, oc_of[mm]));
}
static void matmul_bwd(void) {
    be->matmul_backward(be, f(z, N, ic_of[mm]), f(dw, oc_of[mm], ic_of[mm]),
                        LOOM_VIEW(dbias, F32, oc_of[mm]), f(y, N, oc_of[mm]), f(x, N, ic_of[mm]),
                        f(w, oc_of[mm], ic_of[mm]));
}
static void attention_fwd(void) {
    be->attention_forward(be, LOOM_VIEW(att, F32, B, T, C), LOOM_VIEW(lse, F32, B, NH, T),
                          LOOM_VIEW(qkv, F32, B, T, 3 * C), LOOM_VIEW(qkv, F32, B, T, 3 * C), NH, LOOM_ATTN_CAUSAL);
}
static void attention_bwd(void) {
    loom_tensor dqv = LOOM_VIEW(dqkv, F32, B, T, 3 * C), qv = LOOM_VIEW(qkv, F32, B, T, 3 * C);
    be->zero(be, dqkv, loom_nbytes(&dqv)); // the backward adds into it, as the model zeroes it
    be->attention_backward(be, dqv, dqv, (loom_tensor){0}, LOOM_VIEW(datt, F32, B, T, C), qv, qv, LOOM_VIEW(att, F32, B, T, C),
                           LOOM_VIEW(lse, F32, B, NH, T), NH, LOOM_ATTN_CAUSAL);
}
static void gelu_fwd(void) { be->gelu_forward(be, f(y, N, 4 * C), f(x, N, 4 * C)); }
static void gelu_bwd(void) {
    be->gelu_backward(be, f(z, N, 4 * C), f(x, N, 4 * C), f(y, N, 4 * C));
}
static void residual_fwd(void) { be->residual_forward(be, f(z, N, C), f(x, N, C), f(y, N, C)); }
static void crossentropy(bool backward) {
    be->softmax_crossentropy(be, LOOM_VIEW(losses, F32, N), f(logits, N, Vp),
                             LOOM_VIEW(targets, LOOM_I32, N), V, 1.0f / N, backward);
}
static void crossentropy_fwd(void) { crossentropy(false); }
static void crossentropy_bwd(void) { crossentropy(true); }
static void adamw(void) {
    loom_adamw_args a = {.lr = 1e-4f,
                         .beta1 = 0.9f,
                         .beta2 = 0.95f,
                         .eps = 1e-8f,
                         .weight_decay = 0.1f,
                         .grad_scale = 1.0f,
                         .t = 1};
    be->adamw_update(be, LOOM_VIEW(big, F32, NPARAMS), LOOM_VIEW(NULL, F32, NPARAMS),
                     LOOM_VIEW(grad, F32, NPARAMS), LOOM_VIEW(m, F32, NPARAMS),
                     LOOM_VIEW(v, F32, NPARAMS), a);
}
static volatile double sink;
static void sumsq(void) { sink = be->sumsq(be, LOOM_VIEW(big, F32, NPARAMS)); }

static int reps = 5;
static double layer_s, layer_flops; // one layer's forward + backward

static int cmp_double(const void *a, const void *b) {
    double d = *(const double *)a - *(const double *)b;
    return (d > 0) - (d < 0);
}

// times fn; prints ms, GFLOP/s (flops > 0) and GB/s (bytes > 0); counts it into the layer
// total `per_layer` times
static double run(const char *name, void (*fn)(void), double flops, double bytes, int per_layer) {
    double t[64];
    fn();
    for (int r = 0; r < reps; r++) {
        double t0 = loom_now();
        fn();
        t[r] = loom_now() - t0;
    }
    qsort(t, (size_t)reps, sizeof(double), cmp_double);
    double s = t[reps / 2];
    printf("%-28s %9.2f ms", name, 1e3 * s);
    if (flops > 0)
        printf("  %7.1f GFLOP/s", flops / s * 1e-9);
    else
        printf("  %15s", "");
    if (bytes > 0) printf("  %6.1f GB/s", bytes / s * 1e-9);
    printf("\n");
    layer_s += per_layer * s;
    layer_flops += per_layer * flops;
    return s;
}

int main(int argc, char **argv) {
    if (argc > 1) reps = atoi(argv[1]);
    if (reps < 1 || reps > 64) reps = 5;
    LOOM_CHECK(loom_backend_cpu_create(&be, LOOM_F32) == LOOM_OK);
    x = buf(N * 4 * C), y = buf(N * 4 * C), z = buf(N * 4 * C), w = buf((int64_t)Vp * C);
    dw = buf((int64_t)Vp * C), bias = buf(4 * C), dbias = buf(4 * C), qkv = buf(N * 3 * C);
    dqkv = buf(N * 3 * C), att = buf(N * C), datt = buf(N * C), lse = buf(B * NH * T);
    mean = buf(N), rstd = buf(N), logits = buf((int64_t)N * Vp), losses = buf(N);
    big = buf(NPARAMS), grad = buf(NPARAMS), m = buf(NPARAMS);
    v = be->alloc(be, NPARAMS * sizeof(float)); // zeros: the second moment is never negative
    tokens = (int32_t *)buf(N), targets = (int32_t *)buf(N);
    for (int i = 0; i < N; i++) tokens[i] = targets[i] = (i * 7919) % V;
    for (int64_t i = 0; i < N * 3 * C; i++) qkv[i] = 0.5f * x[i % (N * C)] * 100; // O(1) scores

    printf("cpu backend, %d threads, GPT-2 124M layer: B=%d T=%d C=%d NH=%d V=%d; median of %d\n",
           omp_get_max_threads(), B, T, C, NH, V, reps);
    double fs = 2.0 * N * C * 4 * C;
    double sgemm_rate = fs / run("sgemm (N,C)x(C,4C) [ref]", sgemm_ref, fs, 0, 0);
    double fb = 4.0 * N * C, fe = 4.0 * N * 4 * C; // bytes of one (N,C) / (N,4C) array
    run("encoder fwd", encoder_fwd, 0, 3 * fb, 0);
    run("encoder bwd", encoder_bwd, 0, 3 * fb, 0);
    run("layernorm fwd", layernorm_fwd, 0, 2 * fb, 2);
    run("layernorm bwd", layernorm_bwd, 0, 4 * fb, 2);
    const char *mm_name[4] = {"qkv", "attn proj", "fc", "fc proj"};
    char name[64];
    for (mm = 0; mm < 4; mm++) {
        double fl = 2.0 * N * ic_of[mm] * oc_of[mm];
        snprintf(name, sizeof name, "matmul %s fwd", mm_name[mm]);
        run(name, matmul_fwd, fl, 0, 1);
        snprintf(name, sizeof name, "matmul %s bwd", mm_name[mm]);
        run(name, matmul_bwd, 2 * fl, 0, 1);
    }
    double fa = 2.0 * B * NH * (double)T * T * (C / NH); // causal: 2 products of T^2/2 * hs MACs
    run("attention fwd", attention_fwd, fa, 0, 1);
    run("attention bwd", attention_bwd, 2.5 * fa, 0, 1);
    run("gelu fwd", gelu_fwd, 0, 2 * fe, 1);
    run("gelu bwd", gelu_bwd, 0, 3 * fe, 1);
    run("residual fwd", residual_fwd, 0, 3 * fb, 2);
    printf("%-28s %9.2f ms  %7.1f GFLOP/s  (%.0f%% of the sgemm rate)\n", "layer fwd+bwd",
           1e3 * layer_s, layer_flops / layer_s * 1e-9, 100.0 * layer_flops / layer_s / sgemm_rate);
    run("crossentropy fwd", crossentropy_fwd, 0, 4.0 * N * V, 0);
    run("crossentropy fwd+bwd", crossentropy_bwd, 0, 8.0 * N * V, 0);
    run("adamw (124M params)", adamw, 0, 28.0 * NPARAMS, 0);
    run("sumsq (124M params)", sumsq, 0, 4.0 * NPARAMS, 0);
    loom_backend_destroy(be); // the process exits: buffers are left to it
    return 0;
}
