// Every forward op of the CPU backend against the fp64 references of ref.c, on fresh random
// inputs at several shapes (ragged T, head sizes 8..64, V not a multiple of 128). Outputs are
// poisoned with NaN first, so an element the op fails to write fails the comparison.
#include "backend_test.h"
#include "ref.h"

#define F32 LOOM_F32

// got against want: the largest error over the larger of want's largest magnitude and `scale`, the
// magnitude of what the values are computed from where that is larger (a difference of such
// values, as a loss or a score, can be near 0 at the small shapes, with one value in the norm)
static void check_scaled(const char *what, const float *got, const float *want, size_t n, t_shape s, double scale) {
    double e = t_max_abs_err(got, want, n), big = fmax(scale, t_max_abs(want, n));
    T_ASSERT(e / big < T_TOL, "%s B=%d T=%d C=%d NH=%d: error %.3g against values of %.3g", what, s.B, s.T, s.C,
             s.NH, e, big);
}

static void check(const char *what, const float *got, const float *want, size_t n, t_shape s) {
    check_scaled(what, got, want, n, s, 0);
}

static void test_encoder(t_shape s) {
    int Vp = 128, maxT = s.T + 5, n = s.B * s.T * s.C;
    int32_t *tok = t_tokens((size_t)(s.B * s.T), Vp);
    float *wte = t_randn((size_t)(Vp * s.C), 1), *wpe = t_randn((size_t)(maxT * s.C), 1);
    float *out = t_nans((size_t)n), *ref = t_nans((size_t)n);
    t_be->encoder_forward(t_be, LOOM_VIEW(out, F32, s.B, s.T, s.C),
                          LOOM_VIEW(tok, LOOM_I32, s.B, s.T), LOOM_VIEW(wte, F32, Vp, s.C),
                          LOOM_VIEW(wpe, F32, maxT, s.C), 0);
    ref_encoder_forward(ref, tok, wte, wpe, s.B, s.T, s.C);
    check("encoder", out, ref, (size_t)n, s);
    free(tok), free(wte), free(wpe), free(out), free(ref);
}

static void test_layernorm(t_shape s) {
    int N = s.B * s.T, C = s.C;
    float *x = t_randn((size_t)(N * C), 2), *w = t_randn((size_t)C, 1), *b = t_randn((size_t)C, 1);
    for (int i = 0; i < N * C; i++) x[i] += 3.0f; // a non-zero mean
    float *out = t_nans((size_t)(N * C)), *mean = t_nans((size_t)N), *rstd = t_nans((size_t)N);
    float *rout = t_nans((size_t)(N * C)), *rmean = t_nans((size_t)N), *rrstd = t_nans((size_t)N);
    t_be->layernorm_forward(t_be, LOOM_VIEW(out, F32, N, C), LOOM_VIEW(mean, F32, N),
                            LOOM_VIEW(rstd, F32, N), LOOM_VIEW(x, F32, N, C), LOOM_VIEW(w, F32, C),
                            LOOM_VIEW(b, F32, C));
    ref_layernorm_forward(rout, rmean, rrstd, x, w, b, N, C);
    check("layernorm out", out, rout, (size_t)(N * C), s);
    check("layernorm mean", mean, rmean, (size_t)N, s);
    check("layernorm rstd", rstd, rrstd, (size_t)N, s);
    free(x), free(w), free(b), free(out), free(mean), free(rstd), free(rout), free(rmean),
        free(rrstd);
}

static void test_matmul(t_shape s, bool with_bias) {
    int N = s.B * s.T, C = s.C, OC = 3 * s.C + 5;
    float *x = t_randn((size_t)(N * C), 1), *w = t_randn((size_t)(OC * C), 0.2f);
    float *bias = t_randn((size_t)OC, 1);
    float *out = t_nans((size_t)(N * OC)), *ref = t_nans((size_t)(N * OC));
    float *bp = with_bias ? bias : NULL;
    t_be->matmul_forward(t_be, LOOM_VIEW(out, F32, s.B, s.T, OC), LOOM_VIEW(x, F32, s.B, s.T, C),
                         LOOM_VIEW(w, F32, OC, C), LOOM_VIEW(bp, F32, OC));
    ref_matmul_forward(ref, x, w, bp, N, C, OC);
    check(with_bias ? "matmul+bias" : "matmul", out, ref, (size_t)(N * OC), s);
    free(x), free(w), free(bias), free(out), free(ref);
}

static void test_attention(t_shape s) {
    int n = s.B * s.T * s.C, nl = s.B * s.NH * s.T;
    float *qkv = t_randn((size_t)(3 * n), 1.5f);
    float *out = t_nans((size_t)n), *lse = t_nans((size_t)nl);
    float *rout = t_nans((size_t)n), *rlse = t_nans((size_t)nl);
    t_be->attention_forward(t_be, LOOM_VIEW(out, F32, s.B, s.T, s.C),
                            LOOM_VIEW(lse, F32, s.B, s.NH, s.T),
                            LOOM_VIEW(qkv, F32, s.B, s.T, 3 * s.C), LOOM_VIEW(qkv, F32, s.B, s.T, 3 * s.C),
                            s.NH, LOOM_ATTN_CAUSAL);
    ref_attention_forward(rout, rlse, qkv, s.B, s.T, s.C, s.NH);
    check("attention out", out, rout, (size_t)n, s);
    // an lse is a score's order, 1.5^2 here: at T=1 it is the one score (LOOM_TEST_SEED=60211944113)
    check_scaled("attention lse", lse, rlse, (size_t)nl, s, 1.5 * 1.5);
    free(qkv), free(out), free(lse), free(rout), free(rlse);
}

static void test_elementwise(t_shape s) {
    int n = s.B * s.T * 4 * s.C;
    float *x = t_randn((size_t)n, 3), *y = t_randn((size_t)n, 1);
    float *out = t_nans((size_t)n), *ref = t_nans((size_t)n);
    t_be->gelu_forward(t_be, LOOM_VIEW(out, F32, s.B * s.T, 4 * s.C),
                       LOOM_VIEW(x, F32, s.B * s.T, 4 * s.C));
    ref_gelu_forward(ref, x, n);
    check("gelu", out, ref, (size_t)n, s);
    for (int i = 0; i < n; i++) ref[i] = (float)((double)x[i] + y[i]);
    t_be->residual_forward(t_be, LOOM_VIEW(out, F32, n), LOOM_VIEW(x, F32, n),
                           LOOM_VIEW(y, F32, n));
    check("residual", out, ref, (size_t)n, s);
    t_be->residual_forward(t_be, LOOM_VIEW(x, F32, n), LOOM_VIEW(x, F32, n), LOOM_VIEW(y, F32, n));
    check("residual in place", x, ref, (size_t)n, s);
    free(x), free(y), free(out), free(ref);
}

// forward only: losses match and the logits are left as they were
static void test_crossentropy(t_shape s, float scale) {
    int N = s.B * s.T, V = 37 * s.C + 11, Vp = t_padded(V);
    float *z = t_randn((size_t)N * Vp, scale), *z0 = t_dup(z, (size_t)N * Vp);
    int32_t *tgt = t_tokens((size_t)N, V);
    float *loss = t_nans((size_t)N), *ref = t_nans((size_t)N);
    t_be->softmax_crossentropy(t_be, LOOM_VIEW(loss, F32, s.B, s.T),
                               LOOM_VIEW(z, F32, s.B, s.T, Vp), LOOM_VIEW(tgt, LOOM_I32, s.B, s.T),
                               V, 1.0f, false);
    ref_crossentropy(ref, NULL, z0, tgt, N, V, Vp, 1.0f);
    // a loss is logsumexp - z[target], values of the logits' order: near 0 for a target near its
    // row's max (LOOM_TEST_SEED=16990689535 at B=1 T=1: 0.0046 of such a loss alone)
    check_scaled(scale > 10 ? "crossentropy (large logits)" : "crossentropy", loss, ref, (size_t)N, s, scale);
    T_ASSERT(memcmp(z, z0, sizeof(float) * (size_t)N * Vp) == 0, "forward-only changed the logits");
    free(z), free(z0), free(tgt), free(loss), free(ref);
}

int main(void) {
    t_backend_init("backend_forward");
    for (int i = 0; i < T_NSHAPES; i++) {
        t_shape s = t_shape_at(i);
        test_encoder(s);
        test_layernorm(s);
        test_matmul(s, false);
        test_matmul(s, true);
        test_attention(s);
        test_elementwise(s);
        test_crossentropy(s, 2.0f);
        test_crossentropy(s, 40.0f);
    }
    loom_backend_destroy(t_be);
    return t_done("backend_forward");
}
