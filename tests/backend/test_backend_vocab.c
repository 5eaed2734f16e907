// The vocabulary-parallel ops of the CPU backend (Megatron-LM's parallel embedding and
// cross-entropy, Shoeybi et al. 2019) on fresh random inputs: a problem split into R = 1, 2, 4
// vocabulary shards must give what the whole vocabulary gives. The encoder bit for bit: the
// shards' outputs sum to the whole output, their dwte rows are the whole dwte's and their dwpe
// is the whole dwpe (tokens of other shards give zero rows). The cross-entropy within float
// rounding: partials against the fp64 reference of ref.c, the combined losses against the fused
// softmax_crossentropy and the fp64 reference, each shard's dlogits against the fused op's on
// its columns. Vp = 256 with V = 200 (the last of 4 shards mostly padding), V = 180 (the last
// of 4 all padding), V = Vp, and V = 1000 of 1024. Outputs are poisoned with NaN first.
#include "backend_test.h"
#include "ref.h"

#include <float.h>

#define F32 LOOM_F32

static const int RS[] = {1, 2, 4}; // shard counts
#define NRS (int)(sizeof RS / sizeof RS[0])

// columns [c0, c0 + n) of x (rows, cols), as a new (rows, n) array
static float *t_cols(const float *x, int rows, int cols, int c0, int n) {
    float *y = loom_xmalloc((size_t)rows * n * sizeof(float) + 1);
    for (int i = 0; i < rows; i++)
        memcpy(y + (size_t)i * n, x + (size_t)i * cols + c0, sizeof(float) * n);
    return y;
}

static void test_encoder(t_shape s, int R) {
    int Vp = 256, Vl = Vp / R, maxT = s.T + 3, N = s.B * s.T, C = s.C;
    size_t nout = (size_t)N * C, nte = (size_t)Vp * C, npe = (size_t)maxT * C;
    int32_t *tok = t_tokens((size_t)N, Vp);
    float *wte = t_randn(nte, 1), *wpe = t_randn(npe, 1), *dout = t_randn(nout, 1);
    float *out = t_nans(nout), *dwte = t_randn(nte, 1), *dwpe = t_randn(npe, 1);
    float *sum = t_nans(nout), *part = t_nans(nout), *sdwte = t_dup(dwte, nte), *sdwpe = NULL;
    loom_tensor tv = LOOM_VIEW(tok, LOOM_I32, s.B, s.T), dv = LOOM_VIEW(dout, F32, s.B, s.T, C);
    t_be->encoder_forward(t_be, LOOM_VIEW(out, F32, s.B, s.T, C), tv, LOOM_VIEW(wte, F32, Vp, C),
                          LOOM_VIEW(wpe, F32, maxT, C), 0);
    float *dwpe0 = t_dup(dwpe, npe);
    t_be->encoder_backward(t_be, LOOM_VIEW(dwte, F32, Vp, C), LOOM_VIEW(dwpe, F32, maxT, C), dv, tv,
                           0);
    int zero_rows = 1;
    for (int r = 0; r < R; r++) {
        int v0 = r * Vl;
        for (size_t i = 0; i < nout; i++) part[i] = NAN;
        t_be->encoder_forward(t_be, LOOM_VIEW(part, F32, s.B, s.T, C), tv,
                              LOOM_VIEW(wte + (size_t)v0 * C, F32, Vl, C),
                              LOOM_VIEW(wpe, F32, maxT, C), v0);
        for (int i = 0; i < N; i++) {
            bool mine = tok[i] >= v0 && tok[i] < v0 + Vl;
            for (int c = 0; c < C; c++) {
                size_t k = (size_t)i * C + c;
                zero_rows &= mine || part[k] == 0.0f;
                sum[k] = r ? sum[k] + part[k] : part[k];
            }
        }
        // the shard's dwte is rows [v0, v0 + Vl) of sdwte (from the same start as the whole's)
        free(sdwpe);
        sdwpe = t_dup(dwpe0, npe);
        t_be->encoder_backward(t_be, LOOM_VIEW(sdwte + (size_t)v0 * C, F32, Vl, C),
                               LOOM_VIEW(sdwpe, F32, maxT, C), dv, tv, v0);
        T_ASSERT(memcmp(sdwpe, dwpe, npe * sizeof(float)) == 0,
                 "encoder: dwpe of shard %d of %d is not the whole vocabulary's (B=%d T=%d C=%d)",
                 r, R, s.B, s.T, C);
    }
    T_ASSERT(zero_rows, "encoder: another shard's token gave a non-zero row (R=%d B=%d T=%d C=%d)",
             R, s.B, s.T, C);
    T_ASSERT(memcmp(sum, out, nout * sizeof(float)) == 0,
             "encoder: %d shards' outputs do not sum to the whole output (B=%d T=%d C=%d)", R, s.B,
             s.T, C);
    T_ASSERT(memcmp(sdwte, dwte, nte * sizeof(float)) == 0,
             "encoder: %d shards' dwte is not the whole vocabulary's (B=%d T=%d C=%d)", R, s.B, s.T,
             C);
    free(tok), free(wte), free(wpe), free(dout), free(out), free(dwte), free(dwpe), free(dwpe0);
    free(sum), free(part), free(sdwte), free(sdwpe);
}

// a shard's partials (N,3) against the fp64 reference's: the max and the target's logit exactly
// (both are copies of a logit, or -INFINITY and 0), the sum of exponentials to T_TOL
static void check_partial(const float *got, const float *want, int N, int r, int R, int V) {
    int exact = 1;
    double e = 0;
    for (int i = 0; i < N; i++) {
        exact &= got[i * 3] == want[i * 3] && got[i * 3 + 2] == want[i * 3 + 2];
        double s = got[i * 3 + 1], ws = want[i * 3 + 1], d = ws ? fabs(s / ws - 1) : fabs(s);
        e = d > e || d != d ? d : e;
    }
    T_ASSERT(exact, "crossentropy_partial shard %d of %d (V=%d): max or target logit differs", r,
             R, V);
    T_ASSERT(e < T_TOL, "crossentropy_partial shard %d of %d (V=%d): sum rel err %.3g", r, R, V, e);
}

// losses against want, relative to the larger of max |want| and max |lse|: a loss is lse minus
// a logit, and its rounding error is lse's (large against a small loss of large logits)
static double loss_err(const float *got, const float *want, const float *lse, int N) {
    double scale = fmax(t_max_abs(want, (size_t)N), t_max_abs(lse, (size_t)N));
    return t_max_rel_err(got, want, (size_t)N) * t_max_abs(want, (size_t)N) / scale;
}

static void test_crossentropy(int N, int V, int Vp, float scale) {
    size_t nz = (size_t)N * Vp;
    float dloss = 1.0f / (float)N;
    float *z = t_randn(nz, scale);
    for (int i = 0; i < N; i++)
        for (int j = V; j < Vp; j++) z[(size_t)i * Vp + j] = NAN; // padding must be ignored
    int32_t *tgt = t_tokens((size_t)N, V);
    // the whole vocabulary: the fused op (losses, dlogits) and the fp64 reference (losses, lse)
    float *dz = t_dup(z, nz), *loss = t_nans((size_t)N), *rloss = t_nans((size_t)N);
    float *rlse = t_nans((size_t)N);
    t_be->softmax_crossentropy(t_be, LOOM_VIEW(loss, F32, N), LOOM_VIEW(dz, F32, N, Vp),
                               LOOM_VIEW(tgt, LOOM_I32, N), V, dloss, true);
    ref_crossentropy(rloss, NULL, z, tgt, N, V, Vp, dloss);
    for (int i = 0; i < N; i++) rlse[i] = (float)((double)rloss[i] + z[(size_t)i * Vp + tgt[i]]);
    double max_dz = t_max_abs(dz, nz);
    // exp(z - lse) is good to the rounding of lse, which neither the fused op nor the combined
    // lse beats (they may differ by an ulp): at scale 1.5, lse < 8 and its ulp is 4.8e-7; at
    // scale 40, lse ~ 160 and its ulp 1.5e-5
    double dtol = scale > 10 ? 2 * FLT_EPSILON * t_max_abs(rlse, (size_t)N) : 1e-6;
    for (int k = 0; k < NRS; k++) {
        int R = RS[k], Vl = Vp / R;
        float *partials = t_nans((size_t)R * N * 3), *rpart = t_nans((size_t)N * 3);
        float *losses = t_nans((size_t)N), *lse = t_nans((size_t)N), *shard[4];
        loom_tensor tv = LOOM_VIEW(tgt, LOOM_I32, N);
        for (int r = 0; r < R; r++) {
            shard[r] = t_cols(z, N, Vp, r * Vl, Vl);
            float *kept = t_dup(shard[r], (size_t)N * Vl);
            t_be->crossentropy_partial(t_be, LOOM_VIEW(partials + (size_t)r * N * 3, F32, N, 3),
                                       LOOM_VIEW(shard[r], F32, N, Vl), tv, r * Vl, V);
            T_ASSERT(memcmp(kept, shard[r], sizeof(float) * (size_t)N * Vl) == 0,
                     "crossentropy_partial changed the logits");
            ref_crossentropy_partial(rpart, shard[r], tgt, N, Vl, r * Vl, V);
            check_partial(partials + (size_t)r * N * 3, rpart, N, r, R, V);
            free(kept);
        }
        t_be->crossentropy_combine(t_be, LOOM_VIEW(losses, F32, N), LOOM_VIEW(lse, F32, N),
                                   LOOM_VIEW(partials, F32, R, N, 3));
        double e = loss_err(losses, loss, rlse, N), e64 = loss_err(losses, rloss, rlse, N);
        double el = t_max_rel_err(lse, rlse, (size_t)N);
        T_ASSERT(e < T_TOL, "crossentropy R=%d N=%d V=%d scale %g: losses rel err %.3g (fused)",
                 R, N, V, scale, e);
        T_ASSERT(e64 < T_TOL, "crossentropy R=%d N=%d V=%d scale %g: losses rel err %.3g (fp64)",
                 R, N, V, scale, e64);
        T_ASSERT(el < T_TOL, "crossentropy R=%d N=%d V=%d scale %g: lse rel err %.3g (fp64)", R,
                 N, V, scale, el);
        double ed = 0;
        for (int r = 0; r < R; r++) {
            t_be->crossentropy_backward(t_be, LOOM_VIEW(shard[r], F32, N, Vl),
                                        LOOM_VIEW(lse, F32, N), tv, r * Vl, V, dloss);
            for (int i = 0; i < N; i++)
                for (int j = 0; j < Vl; j++) {
                    size_t k = (size_t)i * Vp + r * Vl + j;
                    double d = (double)shard[r][(size_t)i * Vl + j] - dz[k];
                    ed = fabs(d) > ed || d != d ? fabs(d) : ed;
                }
            free(shard[r]);
        }
        ed /= max_dz;
        T_ASSERT(ed < dtol, "crossentropy R=%d N=%d V=%d scale %g: dlogits rel err %.3g (fused)",
                 R, N, V, scale, ed);
        free(partials), free(rpart), free(losses), free(lse);
    }
    free(z), free(tgt), free(dz), free(loss), free(rloss), free(rlse);
}

int main(void) {
    t_backend_init("backend_vocab");
    for (int i = 0; i < T_NSHAPES; i++)
        for (int k = 0; k < NRS; k++) test_encoder(t_shape_at(i), RS[k]);
    static const int rows[] = {1, 7, 64, 129, 300};
    static const int vocab[][2] = {{200, 256}, {180, 256}, {256, 256}, {1000, 1024}};
    for (int i = 0; i < (int)(sizeof rows / sizeof *rows); i++)
        for (int v = 0; v < (int)(sizeof vocab / sizeof *vocab); v++) {
            test_crossentropy(rows[i], vocab[v][0], vocab[v][1], 1.5f);
            test_crossentropy(rows[i], vocab[v][0], vocab[v][1], 40.0f);
        }
    loom_backend_destroy(t_be);
    return t_done("backend_vocab");
}
