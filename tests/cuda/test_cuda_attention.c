// Attention on the GPU against the CPU backend (the fp32 reference), fp32 within 1e-5 and bf16
// within 1e-2 (norm-relative; the CPU runs on the same bf16-rounded inputs; 2e-2 for the bf16
// gradients accumulated over chunk pairs, test_blocks):
//   whole sequences: out and lse, and dqkv = and += (from random values) from the CPU's out and lse,
//       with the qkv bias gradient (dbias +=) where dqkv is written;
//   blocks (context parallelism's op): a random sequence cut into ragged chunks at random places,
//       each chunk taken from the device's qkv by copy_2d into a qkv-shaped buffer, or q-only and
//       kv-only ones; every (query chunk, key chunk) pair runs on the GPU at its global offsets
//       and the partials of each query chunk are merged on the GPU (attention_merge): the merged
//       out and lse must equal the CPU's whole-sequence attention; pairs wholly in the causal
//       future give exactly 0 and -inf, and add exactly nothing in backward; every pair's
//       backward from the CPU's whole out and lse, dq and dk/dv accumulated on the GPU per chunk
//       over the pairs, must equal the CPU's whole-sequence dqkv;
//   merge: GPU against CPU on random partials, with rows of -inf lse on one side and on both;
//   a written pair of unequal lengths (Tq != Tk) with the qkv bias gradient: dq, dkv, dbias.
// Shapes take the simple kernels (fp32, head sizes 16, 8, 64 with 25 heads) and the Hopper
// ones (bf16 at head size 64 and 128), T up to 2048; each whole-sequence backward runs twice
// more, which must give the same bits. Exit 77 (ctest: skipped) without a CUDA device;
// LOOM_CUDA_TEST_QUICK=1 runs the small cases only.
#include "cuda_test.h"

#define MAXCHUNKS 8

typedef struct {
    shape s;
    int nchunks;
} att_case;

static const att_case CASES[] = {
    {{2, 7, 48, 3}, 3},     {{2, 65, 256, 2}, 3},     {{1, 129, 256, 4}, 2},
    {{1, 384, 128, 2}, 2}, // hs 64, 3 tiles an item: the streamed stages (and dkv's vectors) refilled
    {{1, 384, 256, 2}, 2}, // hs 128, the same (6 query tiles of 64 an item)
    {{1, 300, 96, 12}, 4},
    {{2, 1000, 192, 3}, 5}, {{1, 1024, 768, 12}, 4}, {{1, 200, 1600, 25}, 3},
    {{2, 390, 256, 2}, 3}, // hs 128 over several key and query tiles (T=65 above is one)
    {{2, 2048, 1024, 16}, 2}, // more work items than multiprocessors
    {{2, 2048, 2048, 16}, 2}, // the same at hs 128
};
#define NCASES (int)(sizeof CASES / sizeof CASES[0])
#define NQUICK 5

static size_t es(void) { return loom_dtype_size(dt); }

// lse values: the same positions of -inf, the rest within the tolerance
static void check_lse(const char *what, const float *got, const float *want, size_t n, shape s) {
    float *g = loom_xmalloc(n * 4 + 4), *w = loom_xmalloc(n * 4 + 4);
    bool same = true;
    for (size_t i = 0; i < n; i++) {
        bool gi = got[i] == -INFINITY, wi = want[i] == -INFINITY;
        same = same && gi == wi;
        g[i] = gi ? 0.0f : got[i], w[i] = wi ? 0.0f : want[i];
    }
    T_ASSERT(same, "%s: -inf rows differ", what);
    check_values(what, g, w, n, 0, s);
    free(g), free(w);
}

static void test_whole(shape s) {
    size_t n = (size_t)s.B * s.T * s.C, nl = (size_t)s.B * s.NH * s.T;
    buf qkv = b_randn(3 * n, 1.5f, dt), out = b_nans(n, dt), lse = b_nans(nl, F32);
    loom_tensor hq = HV(qkv, s.B, s.T, 3 * s.C), dq = DV(qkv, s.B, s.T, 3 * s.C);
    cpu->attention_forward(cpu, HV(out, s.B, s.T, s.C), HV(lse, s.B, s.NH, s.T), hq, hq, s.NH, LOOM_ATTN_CAUSAL);
    gpu->attention_forward(gpu, DV(out, s.B, s.T, s.C), DV(lse, s.B, s.NH, s.T), dq, dq, s.NH, LOOM_ATTN_CAUSAL);
    check("attention out", out, s);
    check("attention lse", lse, s);
    // backward from the CPU's forward results (out rounded to the mode's dtype): written over
    // random values, then added to them (accumulate)
    buf o = b_from(out.h, n, dt), l = b_from(lse.h, nl, F32);
    // written with the qkv bias gradient (dbias += the column sums of dqkv), then added to
    size_t nb = 3 * (size_t)s.C;
    buf dout = b_randn(n, 1, dt), dqkv = b_randn(3 * n, 1, dt), dbias = b_randn(nb, 1, dt);
    loom_tensor hd = HV(dqkv, s.B, s.T, 3 * s.C), dd = DV(dqkv, s.B, s.T, 3 * s.C), none = {0};
    float *b0 = loom_xmalloc(nb * 4);
    memcpy(b0, dbias.h, nb * 4);
    for (int add = 0; add <= 1; add++) {
        loom_attn_span span = {0, 0, true, add};
        cpu->attention_backward(cpu, hd, hd, add ? none : HV(dbias, nb), HV(dout, s.B, s.T, s.C), hq, hq,
                                HV(o, s.B, s.T, s.C), HV(l, s.B, s.NH, s.T), s.NH, span);
        gpu->attention_backward(gpu, dd, dd, add ? none : DV(dbias, nb), DV(dout, s.B, s.T, s.C), dq, dq,
                                DV(o, s.B, s.T, s.C), DV(l, s.B, s.NH, s.T), s.NH, span);
        check(add ? "attention dqkv +=" : "attention dqkv", dqkv, s);
        if (!add) check("attention dbias", dbias, s);
    }
    // deterministic: two more backward passes (dbias from its same start) give the same bits
    float *first = loom_xmalloc((3 * n + nb) * 4), *again = loom_xmalloc((3 * n + nb) * 4);
    for (int r = 0; r < 2; r++) {
        float *got = r ? again : first;
        upload_as(dbias.d, b0, nb, dt);
        gpu->attention_backward(gpu, dd, dd, DV(dbias, nb), DV(dout, s.B, s.T, s.C), dq, dq, DV(o, s.B, s.T, s.C),
                                DV(l, s.B, s.NH, s.T), s.NH, LOOM_ATTN_CAUSAL);
        download_as(got, dqkv.d, 3 * n, dt);
        download_as(got + 3 * n, dbias.d, nb, dt);
    }
    T_ASSERT(memcmp(first, again, (3 * n + nb) * 4) == 0, "%s attention backward: two runs differ",
             loom_dtype_name(dt));
    free(first), free(again), free(b0);
    buf *all[] = {&qkv, &out, &lse, &o, &l, &dout, &dqkv, &dbias};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) b_free(all[i]);
}

// dst (B,n,w) on the GPU = columns [c0, c0 + w) of rows [t0, t0 + n) of src (B,T,ld), of the mode's dtype
static void *take(const void *src, int B, int T, int ld, int t0, int n, int c0, int w) {
    void *dst = gpu->alloc(gpu, (size_t)B * n * w * es());
    LOOM_CHECK(dst);
    for (int b = 0; b < B; b++)
        gpu->copy_2d(gpu, (char *)dst + (size_t)b * n * w * es(), (size_t)w * es(),
                     (const char *)src + (((size_t)b * T + t0) * ld + c0) * es(), (size_t)ld * es(), (size_t)w * es(),
                     (size_t)n);
    return dst;
}

// rows (B*NH) of lse (B,NH,T) fp32: the n columns from t0, on the GPU
static float *take_lse(const float *lse, int rows, int T, int t0, int n) {
    float *dst = gpu->alloc(gpu, (size_t)rows * n * 4);
    LOOM_CHECK(dst);
    gpu->copy_2d(gpu, dst, (size_t)n * 4, lse + t0, (size_t)T * 4, (size_t)n * 4, (size_t)rows);
    return dst;
}

// host (B,T,ld) columns [c0, c0 + w) of rows [t0, t0 + n) = columns [sc0, sc0 + w) of the device's (B,n,sw)
static void place(float *host, int B, int T, int ld, int t0, int n, int c0, int w, const void *dev, int sw, int sc0,
                  loom_dtype d) {
    size_t m = (size_t)B * n * sw;
    float *x = loom_xmalloc(m * 4);
    download_as(x, dev, m, d);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < n; t++)
            memcpy(host + ((size_t)b * T + t0 + t) * ld + c0, x + ((size_t)b * n + t) * sw + sc0, (size_t)w * 4);
    free(x);
}

static bool dev_all(const void *dev, size_t n, loom_dtype d, float v) {
    float *x = loom_xmalloc(n * 4 + 4);
    download_as(x, dev, n, d);
    bool same = true;
    for (size_t i = 0; i < n; i++) same = same && x[i] == v;
    free(x);
    return same;
}

static void test_blocks(att_case k, bool narrow) {
    shape s = k.s;
    int B = s.B, T = s.T, C = s.C, NH = s.NH, at[MAXCHUNKS + 1], wq = narrow ? C : 3 * C, wk = narrow ? 2 * C : 3 * C;
    size_t n = (size_t)B * T * C, nl = (size_t)B * NH * T;
    at[0] = 0, at[k.nchunks] = T; // ragged chunks at random places
    for (int i = 1; i < k.nchunks; i++) at[i] = at[i - 1] + 1 + t_randint(0, T - at[i - 1] - (k.nchunks - i) - 1);
    buf qkv = b_randn(3 * n, 1.5f, dt), dout = b_randn(n, 1, dt);
    float *rout = loom_xmalloc(n * 4), *rlse = loom_xmalloc(nl * 4), *got = loom_xmalloc(3 * n * 4);
    loom_tensor hq = HV(qkv, B, T, 3 * C);
    cpu->attention_forward(cpu, LOOM_VIEW(rout, F32, B, T, C), LOOM_VIEW(rlse, F32, B, NH, T), hq, hq, NH,
                           LOOM_ATTN_CAUSAL);
    void *q[MAXCHUNKS], *kv[MAXCHUNKS];
    for (int a = 0; a < k.nchunks; a++) {
        q[a] = take(qkv.d, B, T, 3 * C, at[a], at[a + 1] - at[a], 0, wq);
        kv[a] = take(qkv.d, B, T, 3 * C, at[a], at[a + 1] - at[a], 3 * C - wk, wk);
    }
    for (int a = 0; a < k.nchunks; a++) { // forward: chunk a's queries against every chunk, merged
        int ta = at[a], na = at[a + 1] - ta;
        void *mo = gpu->alloc(gpu, (size_t)B * na * C * es()), *po = gpu->alloc(gpu, (size_t)B * na * C * es());
        float *ml = gpu->alloc(gpu, (size_t)B * NH * na * 4), *pl = gpu->alloc(gpu, (size_t)B * NH * na * 4);
        loom_tensor mov = LOOM_VIEW(mo, dt, B, na, C), pov = LOOM_VIEW(po, dt, B, na, C);
        loom_tensor mlv = LOOM_VIEW(ml, F32, B, NH, na), plv = LOOM_VIEW(pl, F32, B, NH, na);
        for (int c = 0; c < k.nchunks; c++) {
            int tc = at[c], nc = at[c + 1] - tc;
            gpu->attention_forward(gpu, c ? pov : mov, c ? plv : mlv, LOOM_VIEW(q[a], dt, B, na, wq),
                                   LOOM_VIEW(kv[c], dt, B, nc, wk), NH, (loom_attn_span){ta, tc, true, false});
            if (c > a)
                T_ASSERT(dev_all(po, (size_t)B * na * C, dt, 0.0f) && dev_all(pl, (size_t)B * NH * na, F32, -INFINITY),
                         "%s chunk %d against future chunk %d: not 0 and -inf", loom_dtype_name(dt), a, c);
            if (c) gpu->attention_merge(gpu, mov, mlv, pov, plv, NH);
        }
        place(got, B, T, C, ta, na, 0, C, mo, C, 0, dt);
        place(got + n, B * NH, T, 1, ta, na, 0, 1, ml, 1, 0, F32); // (B*NH) rows of lse as (rows, T, 1)
        gpu->free(gpu, mo), gpu->free(gpu, po), gpu->free(gpu, ml), gpu->free(gpu, pl);
    }
    check_values("blocks merged out", got, rout, n, 0, s);
    check_lse("blocks merged lse", got + n, rlse, nl, s);
    // backward of every pair from the CPU's whole out (rounded) and lse
    buf o = b_from(rout, n, dt), l = b_from(rlse, nl, F32), want = b_randn(3 * n, 0, dt); // want: zeros
    loom_tensor hw = HV(want, B, T, 3 * C);
    cpu->attention_backward(cpu, hw, hw, (loom_tensor){0}, HV(dout, B, T, C), hq, hq, HV(o, B, T, C), HV(l, B, NH, T), NH,
                            LOOM_ATTN_CAUSAL);
    void *dq[MAXCHUNKS], *dkv[MAXCHUNKS];
    for (int a = 0; a < k.nchunks; a++) {
        int na = at[a + 1] - at[a];
        dq[a] = gpu->alloc(gpu, (size_t)B * na * wq * es()), dkv[a] = gpu->alloc(gpu, (size_t)B * na * wk * es());
    }
    for (int a = 0; a < k.nchunks; a++) {
        int ta = at[a], na = at[a + 1] - ta;
        void *oa = take(o.d, B, T, C, ta, na, 0, C), *dya = take(dout.d, B, T, C, ta, na, 0, C);
        float *la = take_lse(l.d, B * NH, T, ta, na);
        for (int c = 0; c < k.nchunks; c++) {
            int tc = at[c], nc = at[c + 1] - tc;
            gpu->attention_backward(gpu, LOOM_VIEW(dq[a], dt, B, na, wq), LOOM_VIEW(dkv[c], dt, B, nc, wk), (loom_tensor){0},
                                    LOOM_VIEW(dya, dt, B, na, C), LOOM_VIEW(q[a], dt, B, na, wq),
                                    LOOM_VIEW(kv[c], dt, B, nc, wk), LOOM_VIEW(oa, dt, B, na, C),
                                    LOOM_VIEW(la, F32, B, NH, na), NH, (loom_attn_span){ta, tc, true, true});
        }
        if (a == 0 && k.nchunks > 1) { // a pair in the future, written over nonzero values: zeros
            int n1 = at[2] - at[1];
            size_t bq = (size_t)B * na * wq * es(), bkv = (size_t)B * n1 * wk * es();
            void *zq = gpu->alloc(gpu, bq), *zkv = gpu->alloc(gpu, bkv);
            char *fill = loom_xcalloc(bq > bkv ? bq : bkv, 1);
            for (int64_t r = 0; r < (int64_t)B * na; r++) // the q columns of dq: about 0.75 in fp32 and bf16
                memset(fill + (size_t)r * wq * es(), 0x3f, (size_t)C * es());
            gpu->upload(gpu, zq, fill, bq);
            memset(fill, 0, bq > bkv ? bq : bkv);
            for (int64_t r = 0; r < (int64_t)B * n1; r++) // the k, v columns of dkv
                memset(fill + ((size_t)r * wk + (size_t)(wk - 2 * C)) * es(), 0x3f, 2 * (size_t)C * es());
            gpu->upload(gpu, zkv, fill, bkv);
            free(fill);
            gpu->attention_backward(gpu, LOOM_VIEW(zq, dt, B, na, wq), LOOM_VIEW(zkv, dt, B, n1, wk), (loom_tensor){0},
                                    LOOM_VIEW(dya, dt, B, na, C), LOOM_VIEW(q[0], dt, B, na, wq),
                                    LOOM_VIEW(kv[1], dt, B, n1, wk), LOOM_VIEW(oa, dt, B, na, C),
                                    LOOM_VIEW(la, F32, B, NH, na), NH, (loom_attn_span){0, at[1], true, false});
            T_ASSERT(dev_all(zq, (size_t)B * na * wq, dt, 0.0f) && dev_all(zkv, (size_t)B * n1 * wk, dt, 0.0f),
                     "%s chunk 0 against future chunk 1: gradients not 0", loom_dtype_name(dt));
            gpu->free(gpu, zq), gpu->free(gpu, zkv);
        }
        gpu->free(gpu, oa), gpu->free(gpu, dya), gpu->free(gpu, la);
    }
    for (int a = 0; a < k.nchunks; a++) {
        int ta = at[a], na = at[a + 1] - ta;
        place(got, B, T, 3 * C, ta, na, 0, C, dq[a], wq, 0, dt);
        place(got, B, T, 3 * C, ta, na, C, 2 * C, dkv[a], wk, wk - 2 * C, dt);
        gpu->free(gpu, dq[a]), gpu->free(gpu, dkv[a]), gpu->free(gpu, q[a]), gpu->free(gpu, kv[a]);
    }
    // Each pair's backward adds its partial into dq and dkv in the mode's dtype: in bf16 up to
    // nchunks roundings where the whole-sequence check has one, and the partials can cancel
    // (LOOM_TEST_SEED=289522854984: 0.0102 at T=1024 with 4 chunks, the same on the kernels of
    // 4df7398 and after): 2e-2. A missing or doubled pair moves it by a whole partial.
    double whole = tol;
    if (dt == LOOM_BF16) tol = 2e-2;
    check_values("blocks accumulated dqkv", got, want.h, 3 * n, 0, s);
    tol = whole;
    free(rout), free(rlse), free(got);
    buf *all[] = {&qkv, &dout, &o, &l, &want};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) b_free(all[i]);
}

// One written pair of Tq queries and Tk keys (Tq != Tk) with the bias gradient: q (B,Tq,C) at
// position q_pos against kv (B,Tk,2C) at 0, partly under the causal mask; out and lse are the
// pair's own (the CPU's forward). dq, dkv and dbias (3C, += from random values) against the CPU.
static void test_pair_dbias(shape s, int Tq, int Tk, int q_pos) {
    int B = s.B, C = s.C, NH = s.NH;
    size_t nq = (size_t)B * Tq * C, nk = (size_t)B * Tk * 2 * C, nl = (size_t)B * NH * Tq, nb = 3 * (size_t)C;
    loom_attn_span span = {q_pos, 0, true, false};
    buf q = b_randn(nq, 1.5f, dt), kv = b_randn(nk, 1.5f, dt), out = b_nans(nq, dt), lse = b_nans(nl, F32);
    cpu->attention_forward(cpu, HV(out, B, Tq, C), HV(lse, B, NH, Tq), HV(q, B, Tq, C), HV(kv, B, Tk, 2 * C), NH, span);
    buf o = b_from(out.h, nq, dt), l = b_from(lse.h, nl, F32), dout = b_randn(nq, 1, dt);
    buf dq = b_randn(nq, 1, dt), dkv = b_randn(nk, 1, dt), dbias = b_randn(nb, 1, dt);
    cpu->attention_backward(cpu, HV(dq, B, Tq, C), HV(dkv, B, Tk, 2 * C), HV(dbias, nb), HV(dout, B, Tq, C),
                            HV(q, B, Tq, C), HV(kv, B, Tk, 2 * C), HV(o, B, Tq, C), HV(l, B, NH, Tq), NH, span);
    gpu->attention_backward(gpu, DV(dq, B, Tq, C), DV(dkv, B, Tk, 2 * C), DV(dbias, nb), DV(dout, B, Tq, C),
                            DV(q, B, Tq, C), DV(kv, B, Tk, 2 * C), DV(o, B, Tq, C), DV(l, B, NH, Tq), NH, span);
    check("pair dq (Tq != Tk)", dq, s);
    check("pair dkv (Tq != Tk)", dkv, s);
    check("pair dbias (Tq != Tk)", dbias, s);
    buf *all[] = {&q, &kv, &out, &lse, &o, &l, &dout, &dq, &dkv, &dbias};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) b_free(all[i]);
}

static void test_merge(shape s) {
    size_t n = (size_t)s.B * s.T * s.C, nl = (size_t)s.B * s.NH * s.T;
    float *l1 = loom_xmalloc(nl * 4), *l2 = loom_xmalloc(nl * 4), *got = loom_xmalloc(nl * 4);
    t_fill_normal(l1, nl, 3), t_fill_normal(l2, nl, 3);
    for (size_t i = 0; i < nl; i += 3) l1[i] = -INFINITY; // every 3rd row unseen by the first part,
    for (size_t i = 0; i < nl; i += 2) l2[i] = -INFINITY; // every 2nd by the second, every 6th by both
    buf o1 = b_randn(n, 1, dt), o2 = b_randn(n, 1, dt), a = b_from(l1, nl, F32), b = b_from(l2, nl, F32);
    cpu->attention_merge(cpu, HV(o1, s.B, s.T, s.C), HV(a, s.B, s.NH, s.T), HV(o2, s.B, s.T, s.C),
                         HV(b, s.B, s.NH, s.T), s.NH);
    gpu->attention_merge(gpu, DV(o1, s.B, s.T, s.C), DV(a, s.B, s.NH, s.T), DV(o2, s.B, s.T, s.C),
                         DV(b, s.B, s.NH, s.T), s.NH);
    check("attention_merge out", o1, s);
    download_as(got, a.d, nl, F32);
    check_lse("attention_merge lse", got, a.h, nl, s);
    free(l1), free(l2), free(got);
    b_free(&o1), b_free(&o2), b_free(&a), b_free(&b);
}

static void run_mode(loom_dtype mode, bool quick) {
    LOOM_CHECK(loom_backend_create(&gpu, "cuda", mode) == LOOM_OK);
    dt = mode;
    tol = mode == LOOM_BF16 ? 1e-2 : 1e-5;
    for (int i = 0; i < (quick ? NQUICK : NCASES); i++) {
        att_case k = CASES[i];
        printf("%s B=%d T=%d C=%d NH=%d (hs %d), %d chunks\n", loom_dtype_name(mode), k.s.B, k.s.T, k.s.C, k.s.NH,
               k.s.C / k.s.NH, k.nchunks);
        fflush(stdout);
        test_whole(k.s);
        test_blocks(k, false);
        test_blocks(k, true);
        test_merge(k.s);
    }
    // written pairs of unequal lengths with the bias gradient: the simple kernels (hs 16 in fp32)
    // and the Hopper ones (bf16, hs 64 and 128), more queries than keys and fewer
    for (int hs = 16; hs <= 128; hs *= 2) {
        if (hs == 32) continue;
        shape s = {2, 0, 2 * hs, 2};
        test_pair_dbias(s, 200, 333, 100);
        test_pair_dbias(s, 333, 200, 50);
    }
    loom_backend_destroy(gpu);
    gpu = NULL;
}

int main(void) { return cuda_test_main("cuda_attention", run_mode); }
