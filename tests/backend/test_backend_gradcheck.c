// Finite-difference checks of every backward op: for L = <forward(x), R> with random R
// (accumulated in fp64), the central difference L(x + e v) - L(x - e v) along random
// directions v must match <grad, (x + e v) - (x - e v)> from the op's backward (the
// perturbation as actually stored in fp32). This ties each backward to its own forward,
// independently of the references in ref.c.
#include "backend_test.h"

#define F32 LOOM_F32
#define GC_EPS 1e-2f
#define GC_TOL 2e-3
#define GC_DIRS 3

typedef double (*gc_loss)(void *ctx);

static void gradcheck(const char *what, gc_loss loss, void *ctx, float *x, const float *grad,
                      size_t n) {
    float *x0 = t_dup(x, n), *v = t_randn(n, 1);
    double gnorm = sqrt(t_dot(grad, grad, n));
    for (int d = 0; d < GC_DIRS; d++) {
        t_fill_normal(v, n, 1);
        double an = 0;
        for (size_t i = 0; i < n; i++) x[i] = x0[i] + GC_EPS * v[i];
        double lp = loss(ctx);
        for (size_t i = 0; i < n; i++) an += (double)grad[i] * x[i];
        for (size_t i = 0; i < n; i++) x[i] = x0[i] - GC_EPS * v[i];
        double lm = loss(ctx);
        for (size_t i = 0; i < n; i++) an -= (double)grad[i] * x[i];
        double fd = lp - lm, err = fabs(fd - an) / (fabs(an) + GC_EPS * gnorm);
        T_ASSERT(err < GC_TOL, "%s direction %d: finite difference %.8g, gradient %.8g (err %.3g)",
                 what, d, fd, an, err);
    }
    memcpy(x, x0, n * sizeof(float));
    free(x0), free(v);
}

// ---- matmul: L = <inp w^T + bias, R> ----
typedef struct {
    loom_tensor out, inp, w, bias;
    const float *R;
} mm_ctx;

static double mm_loss(void *p) {
    mm_ctx *c = p;
    t_be->matmul_forward(t_be, c->out, c->inp, c->w, c->bias);
    return t_dot(c->out.data, c->R, (size_t)loom_numel(&c->out));
}

static void test_matmul(int N, int C, int OC) {
    float *x = t_randn((size_t)(N * C), 1), *w = t_randn((size_t)(OC * C), 0.3f),
          *b = t_randn((size_t)OC, 1);
    float *out = t_nans((size_t)(N * OC)), *R = t_randn((size_t)(N * OC), 1);
    float *dx = t_nans((size_t)(N * C)), *dw = t_randn((size_t)(OC * C), 0),
          *db = t_randn((size_t)OC, 0);
    mm_ctx c = {LOOM_VIEW(out, F32, N, OC), LOOM_VIEW(x, F32, N, C), LOOM_VIEW(w, F32, OC, C),
                LOOM_VIEW(b, F32, OC), R};
    t_be->matmul_backward(t_be, LOOM_VIEW(dx, F32, N, C), LOOM_VIEW(dw, F32, OC, C),
                          LOOM_VIEW(db, F32, OC), LOOM_VIEW(R, F32, N, OC), c.inp, c.w);
    gradcheck("matmul inp", mm_loss, &c, x, dx, (size_t)(N * C));
    gradcheck("matmul w", mm_loss, &c, w, dw, (size_t)(OC * C));
    gradcheck("matmul bias", mm_loss, &c, b, db, (size_t)OC);
    free(x), free(w), free(b), free(out), free(R), free(dx), free(dw), free(db);
}

// ---- layernorm: L = <layernorm(inp; w, b), R> ----
typedef struct {
    loom_tensor out, mean, rstd, inp, w, b;
    const float *R;
} ln_ctx;

static double ln_loss(void *p) {
    ln_ctx *c = p;
    t_be->layernorm_forward(t_be, c->out, c->mean, c->rstd, c->inp, c->w, c->b);
    return t_dot(c->out.data, c->R, (size_t)loom_numel(&c->out));
}

static void test_layernorm(int N, int C) {
    float *x = t_randn((size_t)(N * C), 1), *w = t_randn((size_t)C, 1), *b = t_randn((size_t)C, 1);
    float *out = t_nans((size_t)(N * C)), *mean = t_nans((size_t)N), *rstd = t_nans((size_t)N);
    float *R = t_randn((size_t)(N * C), 1);
    float *dx = t_randn((size_t)(N * C), 0), *dw = t_randn((size_t)C, 0),
          *db = t_randn((size_t)C, 0);
    ln_ctx c = {LOOM_VIEW(out, F32, N, C),
                LOOM_VIEW(mean, F32, N),
                LOOM_VIEW(rstd, F32, N),
                LOOM_VIEW(x, F32, N, C),
                LOOM_VIEW(w, F32, C),
                LOOM_VIEW(b, F32, C),
                R};
    ln_loss(&c);
    t_be->layernorm_backward(t_be, LOOM_VIEW(dx, F32, N, C), LOOM_VIEW(dw, F32, C),
                             LOOM_VIEW(db, F32, C), (loom_tensor){0}, LOOM_VIEW(R, F32, N, C), c.inp, c.w, c.mean,
                             c.rstd);
    gradcheck("layernorm inp", ln_loss, &c, x, dx, (size_t)(N * C));
    gradcheck("layernorm w", ln_loss, &c, w, dw, (size_t)C);
    gradcheck("layernorm b", ln_loss, &c, b, db, (size_t)C);
    free(x), free(w), free(b), free(out), free(mean), free(rstd), free(R), free(dx), free(dw),
        free(db);
}

// ---- attention: L = <attention(qkv), R> ----
typedef struct {
    loom_tensor out, lse, qkv;
    int NH;
    const float *R;
} at_ctx;

static double at_loss(void *p) {
    at_ctx *c = p;
    t_be->attention_forward(t_be, c->out, c->lse, c->qkv, c->qkv, c->NH, LOOM_ATTN_CAUSAL);
    return t_dot(c->out.data, c->R, (size_t)loom_numel(&c->out));
}

static void test_attention(t_shape s) {
    int n = s.B * s.T * s.C;
    float *qkv = t_randn((size_t)(3 * n), 1), *out = t_nans((size_t)n), *R = t_randn((size_t)n, 1);
    float *lse = t_nans((size_t)(s.B * s.NH * s.T)), *dqkv = loom_xcalloc((size_t)(3 * n), sizeof(float));
    at_ctx c = {LOOM_VIEW(out, F32, s.B, s.T, s.C), LOOM_VIEW(lse, F32, s.B, s.NH, s.T),
                LOOM_VIEW(qkv, F32, s.B, s.T, 3 * s.C), s.NH, R};
    at_loss(&c);
    loom_tensor dqkv_v = LOOM_VIEW(dqkv, F32, s.B, s.T, 3 * s.C); // += into zeros
    t_be->attention_backward(t_be, dqkv_v, dqkv_v, (loom_tensor){0}, LOOM_VIEW(R, F32, s.B, s.T, s.C), c.qkv, c.qkv, c.out, c.lse,
                             s.NH, LOOM_ATTN_CAUSAL);
    gradcheck("attention qkv", at_loss, &c, qkv, dqkv, (size_t)(3 * n));
    free(qkv), free(out), free(R), free(lse), free(dqkv);
}

// ---- gelu: L = <gelu(x), R> ----
typedef struct {
    loom_tensor out, inp;
    const float *R;
} ge_ctx;

static double ge_loss(void *p) {
    ge_ctx *c = p;
    t_be->gelu_forward(t_be, c->out, c->inp);
    return t_dot(c->out.data, c->R, (size_t)loom_numel(&c->out));
}

static void test_gelu(int n) {
    float *x = t_randn((size_t)n, 2), *out = t_nans((size_t)n), *R = t_randn((size_t)n, 1);
    float *dx = t_nans((size_t)n);
    ge_ctx c = {LOOM_VIEW(out, F32, n), LOOM_VIEW(x, F32, n), R};
    t_be->gelu_backward(t_be, LOOM_VIEW(dx, F32, n), c.inp, LOOM_VIEW(R, F32, n));
    gradcheck("gelu inp", ge_loss, &c, x, dx, (size_t)n);
    free(x), free(out), free(R), free(dx);
}

// ---- encoder: L = <wte[tok] + wpe, R> ----
typedef struct {
    loom_tensor out, tokens, wte, wpe;
    const float *R;
} en_ctx;

static double en_loss(void *p) {
    en_ctx *c = p;
    t_be->encoder_forward(t_be, c->out, c->tokens, c->wte, c->wpe, 0);
    return t_dot(c->out.data, c->R, (size_t)loom_numel(&c->out));
}

static void test_encoder(int B, int T, int C) {
    int Vp = 128, maxT = T + 2;
    int32_t *tok = t_tokens((size_t)(B * T), 20);
    float *wte = t_randn((size_t)(Vp * C), 1), *wpe = t_randn((size_t)(maxT * C), 1);
    float *out = t_nans((size_t)(B * T * C)), *R = t_randn((size_t)(B * T * C), 1);
    float *dwte = t_randn((size_t)(Vp * C), 0), *dwpe = t_randn((size_t)(maxT * C), 0);
    en_ctx c = {LOOM_VIEW(out, F32, B, T, C), LOOM_VIEW(tok, LOOM_I32, B, T),
                LOOM_VIEW(wte, F32, Vp, C), LOOM_VIEW(wpe, F32, maxT, C), R};
    t_be->encoder_backward(t_be, LOOM_VIEW(dwte, F32, Vp, C), LOOM_VIEW(dwpe, F32, maxT, C),
                           LOOM_VIEW(R, F32, B, T, C), c.tokens, 0);
    gradcheck("encoder wte", en_loss, &c, wte, dwte, (size_t)(Vp * C));
    gradcheck("encoder wpe", en_loss, &c, wpe, dwpe, (size_t)(maxT * C));
    free(tok), free(wte), free(wpe), free(out), free(R), free(dwte), free(dwpe);
}

// ---- crossentropy: L = dloss * sum of losses ----
typedef struct {
    loom_tensor losses, logits, targets;
    int V;
    float dloss;
} ce_ctx;

static double ce_loss(void *p) {
    ce_ctx *c = p;
    t_be->softmax_crossentropy(t_be, c->losses, c->logits, c->targets, c->V, c->dloss, false);
    double s = 0;
    for (int64_t i = 0; i < loom_numel(&c->losses); i++)
        s += c->dloss * ((float *)c->losses.data)[i];
    return s;
}

static void test_crossentropy(int N, int V) {
    int Vp = t_padded(V);
    float *z = t_randn((size_t)N * Vp, 2), *loss = t_nans((size_t)N);
    int32_t *tgt = t_tokens((size_t)N, V);
    ce_ctx c = {LOOM_VIEW(loss, F32, N), LOOM_VIEW(z, F32, N, Vp), LOOM_VIEW(tgt, LOOM_I32, N), V,
                0.7f};
    float *dz = t_dup(z, (size_t)N * Vp);
    t_be->softmax_crossentropy(t_be, c.losses, LOOM_VIEW(dz, F32, N, Vp), c.targets, V, c.dloss,
                               true);
    gradcheck("crossentropy logits", ce_loss, &c, z, dz, (size_t)N * Vp);
    free(z), free(loss), free(tgt), free(dz);
}

int main(void) {
    t_backend_init("backend_gradcheck");
    test_matmul(13, 24, 40);
    test_layernorm(37, 48);
    test_attention((t_shape){2, 7, 48, 3});
    test_attention((t_shape){1, 150, 24, 2});
    test_gelu(1000);
    test_encoder(2, 9, 16);
    test_crossentropy(11, 300);
    loom_backend_destroy(t_be);
    return t_done("backend_gradcheck");
}
