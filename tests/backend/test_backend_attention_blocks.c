// Attention over blocks of a sequence (context parallelism's op): a random sequence is cut into
// chunks (ragged, at random places); every (query chunk, key chunk) pair runs at its global
// offsets, the partial results of each query chunk are merged by their log-sum-exp
// (attention_merge), and the merged output and lse must equal whole-sequence causal attention
// (the fp64 reference) within 1e-5; the backward of every pair from the merged output and lse,
// its dq and dk/dv accumulated per chunk, must equal the whole-sequence gradient within 1e-5.
// Pairs wholly in the causal future (key chunk after the query chunk) must give exactly zero
// outputs and -inf lse, and add exactly nothing in backward. The queries are taken from qkv-shaped
// (3C) and q-only (C) buffers, the keys and values from qkv-shaped and kv-only (2C) ones.
#include "backend_test.h"
#include "ref.h"

#define F32 LOOM_F32
#define MAXCHUNKS 8

typedef struct {
    int B, T, C, NH, nchunks;
} blk_case;

// dst (B,n,w) = columns [c0, c0 + w) of rows [t0, t0 + n) of src (B,T,ld)
static void take_rows(float *dst, const float *src, int B, int T, int ld, int t0, int n, int c0, int w) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < n; t++)
            memcpy(dst + ((size_t)b * n + t) * w, src + ((size_t)b * T + t0 + t) * ld + c0, sizeof(float) * w);
}

// dst (B,T,3C) columns [c0, c0 + w) of rows [t0, t0 + n) += columns [sc0, sc0 + w) of src (B,n,sw)
static void add_rows(float *dst, const float *src, int B, int T, int C, int t0, int n, int c0, int w, int sw, int sc0) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < n; t++)
            for (int c = 0; c < w; c++)
                dst[((size_t)b * T + t0 + t) * 3 * C + c0 + c] += src[((size_t)b * n + t) * sw + sc0 + c];
}

static void check(const char *what, const float *got, const float *want, size_t n, blk_case k) {
    double e = t_max_rel_err(got, want, n);
    T_ASSERT(e < T_TOL, "%s B=%d T=%d C=%d NH=%d chunks=%d: rel err %.3g", what, k.B, k.T, k.C, k.NH, k.nchunks, e);
}

// Cuts [0, T) into k.nchunks non-empty chunks at random places: chunk i is [at[i], at[i+1]).
static void cut(int *at, blk_case k) {
    at[0] = 0;
    at[k.nchunks] = k.T;
    for (int i = 1; i < k.nchunks; i++) at[i] = at[i - 1] + 1 + t_randint(0, k.T - at[i - 1] - (k.nchunks - i) - 1);
}

static bool all_zero(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (x[i] != 0.0f) return false;
    return true;
}

// columns [c0, c1) of every row of x (rows, w) are 0
static bool cols_zero(const float *x, size_t rows, int w, int c0, int c1) {
    for (size_t r = 0; r < rows; r++)
        for (int c = c0; c < c1; c++)
            if (x[r * w + c] != 0.0f) return false;
    return true;
}

static void test_blocks(blk_case k, bool narrow) {
    int B = k.B, T = k.T, C = k.C, NH = k.NH, at[MAXCHUNKS + 1];
    int wq = narrow ? C : 3 * C, wk = narrow ? 2 * C : 3 * C; // q-only / kv-only buffers, or qkv-shaped
    size_t n = (size_t)B * T * C, nl = (size_t)B * NH * T;
    cut(at, k);
    float *qkv = t_randn(3 * n, 1.5f), *dout = t_randn(n, 1.0f);
    float *rout = t_nans(n), *rlse = t_nans(nl), *rdqkv = t_nans(3 * n), *dqkv = loom_xcalloc(3 * n, sizeof(float));
    float *out = t_nans(n), *lse = t_nans(nl); // the merged results, (B,T,C) and (B,NH,T)
    ref_attention_forward(rout, rlse, qkv, B, T, C, NH);
    ref_attention_backward(rdqkv, dout, qkv, B, T, C, NH);
    size_t most = 3 * n; // scratch big enough for any chunk
    float *q = t_nans(most), *kv = t_nans(most), *o = t_nans(most), *l = t_nans(most), *mo = t_nans(most);
    float *ml = t_nans(most), *dy = t_nans(most), *dq = t_nans(most), *dkv = t_nans(most);
    for (int a = 0; a < k.nchunks; a++) { // forward: query chunk a against every key chunk, merged
        int ta = at[a], na = at[a + 1] - ta;
        take_rows(q, qkv, B, T, 3 * C, ta, na, 0, wq);
        loom_tensor qv = LOOM_VIEW(q, F32, B, na, wq), mov = LOOM_VIEW(mo, F32, B, na, C);
        loom_tensor mlv = LOOM_VIEW(ml, F32, B, NH, na);
        for (int c = 0; c < k.nchunks; c++) {
            int tc = at[c], nc = at[c + 1] - tc;
            take_rows(kv, qkv, B, T, 3 * C, tc, nc, 3 * C - wk, wk);
            loom_tensor ov = LOOM_VIEW(c ? o : mo, F32, B, na, C), lv = LOOM_VIEW(c ? l : ml, F32, B, NH, na);
            t_be->attention_forward(t_be, ov, lv, qv, LOOM_VIEW(kv, F32, B, nc, wk), NH, (loom_attn_span){ta, tc, true, false});
            if (c > a) {
                T_ASSERT(all_zero(ov.data, (size_t)B * na * C), "chunk %d against future chunk %d: output not 0", a, c);
                bool inf = true;
                for (size_t i = 0; i < (size_t)B * NH * na; i++) inf = inf && ((float *)lv.data)[i] == -INFINITY;
                T_ASSERT(inf, "chunk %d against future chunk %d: lse not -inf", a, c);
            }
            if (c) t_be->attention_merge(t_be, mov, mlv, ov, lv, NH);
        }
        for (int b = 0; b < B; b++) { // into the whole-sequence places
            memcpy(out + ((size_t)b * T + ta) * C, mo + (size_t)b * na * C, sizeof(float) * na * C);
            for (int h = 0; h < NH; h++)
                memcpy(lse + ((size_t)b * NH + h) * T + ta, ml + ((size_t)b * NH + h) * na, sizeof(float) * na);
        }
    }
    check("merged out", out, rout, n, k);
    check("merged lse", lse, rlse, nl, k);
    for (int a = 0; a < k.nchunks; a++) { // backward: every pair from the merged out and lse
        int ta = at[a], na = at[a + 1] - ta;
        take_rows(q, qkv, B, T, 3 * C, ta, na, 0, wq);
        take_rows(mo, out, B, T, C, ta, na, 0, C);
        take_rows(dy, dout, B, T, C, ta, na, 0, C);
        for (int b = 0; b < B; b++)
            for (int h = 0; h < NH; h++)
                memcpy(ml + ((size_t)b * NH + h) * na, lse + ((size_t)b * NH + h) * T + ta, sizeof(float) * na);
        for (int c = 0; c < k.nchunks; c++) {
            int tc = at[c], nc = at[c + 1] - tc;
            take_rows(kv, qkv, B, T, 3 * C, tc, nc, 3 * C - wk, wk);
            memset(dq, 0, sizeof(float) * (size_t)B * na * wq);
            memset(dkv, 0, sizeof(float) * (size_t)B * nc * wk);
            t_be->attention_backward(t_be, LOOM_VIEW(dq, F32, B, na, wq), LOOM_VIEW(dkv, F32, B, nc, wk), (loom_tensor){0},
                                     LOOM_VIEW(dy, F32, B, na, C), LOOM_VIEW(q, F32, B, na, wq),
                                     LOOM_VIEW(kv, F32, B, nc, wk), LOOM_VIEW(mo, F32, B, na, C),
                                     LOOM_VIEW(ml, F32, B, NH, na), NH, (loom_attn_span){ta, tc, true, true});
            if (c > a)
                T_ASSERT(all_zero(dq, (size_t)B * na * wq) && all_zero(dkv, (size_t)B * nc * wk),
                         "chunk %d against future chunk %d: gradients not 0", a, c);
            T_ASSERT(cols_zero(dq, (size_t)B * na, wq, C, wq) && cols_zero(dkv, (size_t)B * nc, wk, 0, wk - 2 * C),
                     "the backward wrote outside dq's q columns or dkv's k, v columns");
            add_rows(dqkv, dq, B, T, C, ta, na, 0, C, wq, 0);               // dq: its first C columns
            add_rows(dqkv, dkv, B, T, C, tc, nc, C, 2 * C, wk, wk - 2 * C); // dk, dv: its last 2C
        }
    }
    check("accumulated dqkv", dqkv, rdqkv, 3 * n, k);
    float *all[] = {qkv, dout, rout, rlse, rdqkv, dqkv, out, lse, q, kv, o, l, mo, ml, dy, dq, dkv};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
}

// Without the causal mask every key is visible: the same as causal with the keys far in the past.
static void test_not_causal(void) {
    int B = 2, Tq = 37, Tk = 50, C = 48, NH = 3;
    float *q = t_randn((size_t)B * Tq * C, 1.5f), *kv = t_randn((size_t)B * Tk * 2 * C, 1.5f);
    float *o1 = t_nans((size_t)B * Tq * C), *o2 = t_nans((size_t)B * Tq * C);
    float *l1 = t_nans((size_t)B * NH * Tq), *l2 = t_nans((size_t)B * NH * Tq);
    loom_tensor qv = LOOM_VIEW(q, F32, B, Tq, C), kvv = LOOM_VIEW(kv, F32, B, Tk, 2 * C);
    t_be->attention_forward(t_be, LOOM_VIEW(o1, F32, B, Tq, C), LOOM_VIEW(l1, F32, B, NH, Tq), qv, kvv, NH,
                            (loom_attn_span){0, 500, false, false});
    t_be->attention_forward(t_be, LOOM_VIEW(o2, F32, B, Tq, C), LOOM_VIEW(l2, F32, B, NH, Tq), qv, kvv, NH,
                            (loom_attn_span){Tk, 0, true, false});
    T_ASSERT(memcmp(o1, o2, sizeof(float) * (size_t)B * Tq * C) == 0 && memcmp(l1, l2, sizeof(float) * (size_t)B * NH * Tq) == 0,
             "not causal differs from causal with every key in the past");
    free(q), free(kv), free(o1), free(o2), free(l1), free(l2);
}

int main(void) {
    t_backend_init("backend_attention_blocks");
    // ragged chunks against the 128-row blocks; head sizes 16, 24, 64, 12, 8
    const blk_case cases[] = {{2, 7, 48, 3, 3}, {1, 300, 96, 8, 4}, {2, 129, 128, 2, 2}, {3, 64, 96, 4, 8},
                              {1, 257, 32, 2, 5}, {2, 33, 8, 1, 4}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        test_blocks(cases[i], false);
        test_blocks(cases[i], true);
    }
    test_not_causal();
    return t_done("backend_attention_blocks");
}
