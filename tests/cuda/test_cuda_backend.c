// Every op of the CUDA backend but attention (test_cuda_attention.c) against the CPU backend
// (the fp32 reference) on fresh random inputs, in fp32 mode (within 1e-5, norm-relative) and bf16
// mode (within 1e-2, against the CPU run on the same bf16-rounded inputs). Shapes include ragged
// ones (T not a multiple of the tiles, N and OC not multiples of anything) and head sizes 8, 16,
// 32, 64 (with gpt2-xl's 25 heads) and 128, T up to 1024. Outputs that an op overwrites are
// poisoned with NaN first, so an element it fails to write fails the comparison; "+=" outputs
// start random. Exit 77 (ctest: skipped) when the machine has no CUDA device.
// LOOM_CUDA_TEST_QUICK=1 runs the small shapes only (for compute-sanitizer). LOOM_CUDA_DEBUG=1
// makes the backend say when an op takes a fallback path.
#include "cuda_test.h"

static const shape SHAPES[] = {
    {1, 1, 8, 1},   {2, 7, 48, 3},    {2, 33, 64, 2},     {1, 129, 256, 4},  {2, 65, 256, 2},
    {1, 300, 96, 12}, {1, 200, 1600, 25}, {2, 1000, 192, 3}, {1, 1024, 128, 1}, {1, 1024, 768, 12},
};
#define NSHAPES (int)(sizeof SHAPES / sizeof SHAPES[0])
#define NQUICK 5

static void test_memory(void) {
    size_t n = 1000;
    float *x = loom_xmalloc(n * 4), *y = loom_xmalloc(n * 4);
    float *d = gpu->alloc(gpu, n * 4), *e = gpu->alloc(gpu, n * 4);
    gpu->download(gpu, y, d, n * 4);
    bool zero = true;
    for (size_t i = 0; i < n; i++) zero = zero && y[i] == 0.0f;
    T_ASSERT(zero, "alloc is not zero-filled");
    t_fill_normal(x, n, 1);
    gpu->upload(gpu, d, x, n * 4);
    gpu->copy(gpu, e, d, n * 4);
    gpu->zero(gpu, d, n * 2);
    gpu->download(gpu, y, e, n * 4);
    T_ASSERT(memcmp(x, y, n * 4) == 0, "upload/copy/download changed the data");
    gpu->download(gpu, y, d, n * 4);
    T_ASSERT(y[0] == 0 && y[n / 2 - 1] == 0 && y[n / 2] == x[n / 2], "zero wrote the wrong range");
    gpu->copy_2d(gpu, d, 12, e, 40, 8, 20); // rows of 8 bytes: every 10th float pair into every 3rd
    gpu->download(gpu, y, d, n * 4);
    bool strided = true;
    for (int r = 0; r < 20; r++) strided = strided && y[3 * r] == x[10 * r] && y[3 * r + 1] == x[10 * r + 1];
    T_ASSERT(strided && y[2] == 0, "copy_2d moved the wrong bytes");
    float *ph = gpu->host_alloc(gpu, n * 4), *qh = gpu->host_alloc(gpu, n * 4); // copy to and from host_alloc memory
    memcpy(ph, x, n * 4);
    gpu->copy(gpu, d, ph, n * 4);
    gpu->copy(gpu, qh, d, n * 4);
    gpu->synchronize(gpu);
    T_ASSERT(memcmp(qh, x, n * 4) == 0, "copy through host_alloc memory changed the data");
    gpu->host_free(gpu, ph), gpu->host_free(gpu, qh);
    gpu->synchronize(gpu);
    gpu->free(gpu, d), gpu->free(gpu, e), free(x), free(y);
}

// wte (Vl,C) is rows [vocab_start, vocab_start + Vl) of a vocabulary of Vp = 128 tokens: the
// whole of it, or a shard (the other tokens give zero rows and no dwte). With `skew` three tokens
// in four are one token (as text's most frequent ones: a run of positions across many of the
// backward's chunks), and a second backward from the same dwte must give the same bits.
static void test_encoder(shape s, int vocab_start, int Vl, bool skew) {
    int Vp = 128, maxT = s.T + 3, n = s.B * s.T;
    bool shard = Vl < Vp;
    int32_t *tok = loom_xmalloc((size_t)n * 4);
    for (int i = 0; i < n; i++) tok[i] = skew && i % 4 ? vocab_start + 3 : t_randint(0, Vp - 1);
    int32_t *dtok = d_ints(tok, (size_t)n);
    loom_tensor ht = LOOM_VIEW(tok, I32, s.B, s.T), dt_ = LOOM_VIEW(dtok, I32, s.B, s.T);
    buf wte = b_randn((size_t)Vl * s.C, 1, dt), wpe = b_randn((size_t)maxT * s.C, 1, dt);
    buf out = b_nans((size_t)n * s.C, dt);
    cpu->encoder_forward(cpu, HV(out, s.B, s.T, s.C), ht, HV(wte, Vl, s.C), HV(wpe, maxT, s.C), vocab_start);
    gpu->encoder_forward(gpu, DV(out, s.B, s.T, s.C), dt_, DV(wte, Vl, s.C), DV(wpe, maxT, s.C), vocab_start);
    check(shard ? "encoder out (vocab shard)" : "encoder out", out, s);
    buf dout = b_randn((size_t)n * s.C, 1, dt);
    buf dwte = b_randn((size_t)Vl * s.C, 1, dt), dwpe = b_randn((size_t)maxT * s.C, 1, dt);
    buf again = b_from(dwte.h, dwte.n, dt);
    cpu->encoder_backward(cpu, HV(dwte, Vl, s.C), HV(dwpe, maxT, s.C), HV(dout, s.B, s.T, s.C), ht, vocab_start);
    gpu->encoder_backward(gpu, DV(dwte, Vl, s.C), DV(dwpe, maxT, s.C), DV(dout, s.B, s.T, s.C), dt_, vocab_start);
    check(skew ? "encoder dwte += (one frequent token)" : shard ? "encoder dwte += (vocab shard)" : "encoder dwte +=",
          dwte, s);
    check(shard ? "encoder dwpe += (vocab shard)" : "encoder dwpe +=", dwpe, s);
    if (skew) {
        gpu->encoder_backward(gpu, DV(again, Vl, s.C), DV(dwpe, maxT, s.C), DV(dout, s.B, s.T, s.C), dt_, vocab_start);
        float *first = loom_xmalloc(dwte.n * 4 + 4), *second = loom_xmalloc(dwte.n * 4 + 4);
        download_as(first, dwte.d, dwte.n, dt), download_as(second, again.d, dwte.n, dt);
        T_ASSERT(memcmp(first, second, dwte.n * 4) == 0, "encoder dwte differs between two runs B=%d T=%d C=%d", s.B,
                 s.T, s.C);
        free(first), free(second);
    }
    b_free(&again);
    free(tok), gpu->free(gpu, dtok);
    b_free(&wte), b_free(&wpe), b_free(&out), b_free(&dout), b_free(&dwte), b_free(&dwpe);
}

static void test_layernorm(shape s) {
    int N = s.B * s.T, C = s.C;
    float *h = loom_xmalloc((size_t)N * C * 4);
    t_fill_normal(h, (size_t)N * C, 2);
    for (int i = 0; i < N * C; i++) h[i] += 3.0f; // a non-zero mean
    buf x = b_from(h, (size_t)N * C, dt), w = b_randn((size_t)C, 1, dt), b = b_randn((size_t)C, 1, dt);
    buf out = b_nans((size_t)N * C, dt), mean = b_nans((size_t)N, F32), rstd = b_nans((size_t)N, F32);
    cpu->layernorm_forward(cpu, HV(out, N, C), HV(mean, N), HV(rstd, N), HV(x, N, C), HV(w, C), HV(b, C));
    gpu->layernorm_forward(gpu, DV(out, N, C), DV(mean, N), DV(rstd, N), DV(x, N, C), DV(w, C), DV(b, C));
    check("layernorm out", out, s);
    check("layernorm mean", mean, s);
    check("layernorm rstd", rstd, s);
    // backward from the CPU's statistics, twice on the GPU: the second run must repeat bit for bit;
    // with dinp's column sums (dsum) the first time only
    buf mu = b_from(mean.h, (size_t)N, F32), rs = b_from(rstd.h, (size_t)N, F32);
    buf dout = b_randn((size_t)N * C, 1, dt), dx = b_randn((size_t)N * C, 1, dt);
    buf dw = b_randn((size_t)C, 1, dt), db = b_randn((size_t)C, 1, dt), ds = b_randn((size_t)C, 1, dt);
    buf dx2 = b_from(dx.h, dx.n, dt), dw2 = b_from(dw.h, dw.n, dt), db2 = b_from(db.h, db.n, dt);
    cpu->layernorm_backward(cpu, HV(dx, N, C), HV(dw, C), HV(db, C), HV(ds, C), HV(dout, N, C), HV(x, N, C),
                            HV(w, C), HV(mu, N), HV(rs, N));
    loom_tensor none = {0};
    for (int rep = 0; rep < 2; rep++)
        gpu->layernorm_backward(gpu, rep ? DV(dx2, N, C) : DV(dx, N, C), rep ? DV(dw2, C) : DV(dw, C),
                                rep ? DV(db2, C) : DV(db, C), rep ? none : DV(ds, C), DV(dout, N, C), DV(x, N, C),
                                DV(w, C), DV(mu, N), DV(rs, N));
    check("layernorm dinp +=", dx, s);
    check("layernorm dw +=", dw, s);
    check("layernorm db +=", db, s);
    check("layernorm dsum +=", ds, s);
    size_t nx = (size_t)N * C;
    float *r1 = loom_xmalloc(nx * 8), *r2 = r1 + nx;
    download_as(r1, dw.d, (size_t)C, dt), download_as(r2, dw2.d, (size_t)C, dt);
    T_ASSERT(memcmp(r1, r2, (size_t)C * 4) == 0, "layernorm dw differs between two runs");
    download_as(r1, dx.d, nx, dt), download_as(r2, dx2.d, nx, dt);
    T_ASSERT(memcmp(r1, r2, nx * 4) == 0, "layernorm dinp differs with dsum");
    free(h), free(r1);
    // with the backends' grads_write, dw, db and dsum from NaN (written), dinp from random (added)
    buf dx3 = b_randn((size_t)N * C, 1, dt), dw3 = b_nans((size_t)C, dt), db3 = b_nans((size_t)C, dt);
    buf ds3 = b_nans((size_t)C, dt);
    cpu->grads_write = gpu->grads_write = true;
    cpu->layernorm_backward(cpu, HV(dx3, N, C), HV(dw3, C), HV(db3, C), HV(ds3, C), HV(dout, N, C), HV(x, N, C),
                            HV(w, C), HV(mu, N), HV(rs, N));
    gpu->layernorm_backward(gpu, DV(dx3, N, C), DV(dw3, C), DV(db3, C), DV(ds3, C), DV(dout, N, C), DV(x, N, C),
                            DV(w, C), DV(mu, N), DV(rs, N));
    cpu->grads_write = gpu->grads_write = false;
    check("layernorm dinp += (grads_write)", dx3, s);
    check("layernorm dw = (grads_write)", dw3, s);
    check("layernorm db = (grads_write)", db3, s);
    check("layernorm dsum = (grads_write)", ds3, s);
    buf *all[] = {&x, &w, &b, &out, &mean, &rstd, &mu, &rs, &dout, &dx, &dw, &db, &ds, &dx2, &dw2, &db2,
                  &dx3, &dw3, &db3, &ds3};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) b_free(all[i]);
}

// ragged: OC not a multiple of 8 and the bias one element past an aligned address
static void test_matmul(shape s, bool ragged) {
    int N = s.B * s.T, C = s.C, OC = 3 * C + (ragged ? 5 : 0), off = ragged ? 1 : 0;
    size_t es = loom_dtype_size(dt);
    buf x = b_randn((size_t)N * C, 1, dt), w = b_randn((size_t)OC * C, 0.2f, dt);
    buf bias = b_randn((size_t)OC + 1, 1, dt), out = b_nans((size_t)N * OC, dt);
    loom_tensor hb = LOOM_VIEW(bias.h + off, F32, OC), db = LOOM_VIEW((char *)bias.d + off * es, dt, OC);
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        loom_tensor none = {0};
        cpu->matmul_forward(cpu, HV(out, s.B, s.T, OC), HV(x, s.B, s.T, C), HV(w, OC, C), with_bias ? hb : none);
        gpu->matmul_forward(gpu, DV(out, s.B, s.T, OC), DV(x, s.B, s.T, C), DV(w, OC, C), with_bias ? db : none);
        check(with_bias ? "matmul out (bias)" : "matmul out", out, s);
    }
    buf dout = b_randn((size_t)N * OC, 1, dt), dinp = b_nans((size_t)N * C, dt);
    buf dw = b_randn((size_t)OC * C, 0.1f, dt), dbias = b_randn((size_t)OC, 1, dt);
    cpu->matmul_backward(cpu, HV(dinp, N, C), HV(dw, OC, C), HV(dbias, OC), HV(dout, N, OC), HV(x, N, C),
                         HV(w, OC, C));
    gpu->matmul_backward(gpu, DV(dinp, N, C), DV(dw, OC, C), DV(dbias, OC), DV(dout, N, OC), DV(x, N, C),
                         DV(w, OC, C));
    check("matmul dinp", dinp, s);
    check("matmul dw +=", dw, s);
    check("matmul dbias +=", dbias, s);
    // without dinp and dbias (the output layer's call), into a fresh dw: one bf16 rounding per
    // check (two += into one bf16 buffer would round twice where the CPU rounds never)
    loom_tensor none = {0};
    buf dw2 = b_randn((size_t)OC * C, 0.1f, dt);
    cpu->matmul_backward(cpu, none, HV(dw2, OC, C), none, HV(dout, N, OC), HV(x, N, C), HV(w, OC, C));
    gpu->matmul_backward(gpu, none, DV(dw2, OC, C), none, DV(dout, N, OC), DV(x, N, C), DV(w, OC, C));
    check("matmul dw += (no dinp, dbias)", dw2, s);
    // with the backends' grads_write, dw and dbias from NaN: every element written
    buf dw3 = b_nans((size_t)OC * C, dt), db3 = b_nans((size_t)OC, dt);
    cpu->grads_write = gpu->grads_write = true;
    cpu->matmul_backward(cpu, none, HV(dw3, OC, C), HV(db3, OC), HV(dout, N, OC), HV(x, N, C), HV(w, OC, C));
    gpu->matmul_backward(gpu, none, DV(dw3, OC, C), DV(db3, OC), DV(dout, N, OC), DV(x, N, C), DV(w, OC, C));
    cpu->grads_write = gpu->grads_write = false;
    check("matmul dw = (grads_write)", dw3, s);
    check("matmul dbias = (grads_write)", db3, s);
    buf *all[] = {&x, &w, &bias, &out, &dout, &dinp, &dw, &dbias, &dw2, &dw3, &db3};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) b_free(all[i]);
}

// With grads_defer, the ops' bias and LayerNorm gradient adds wait for grads_flush: eleven adds (the
// launch's table of 8 fills at the ninth), the last into the ninth's destinations while that one
// waits (it must go after it), give the same bits as the adds launched one by one, which the tests
// above check against the CPU.
static void test_grads_defer(shape s) {
    enum { K = 5, DW = 0, DB = K, DS = 2 * K, DBIAS = 3 * K, DX = 4 * K, DXM = 4 * K + 1, NG = 4 * K + 2 };
    int N = s.B * s.T, C = s.C, OC = 3 * C;
    buf x = b_randn((size_t)N * C, 1, dt), w = b_randn((size_t)C, 1, dt), wm = b_randn((size_t)OC * C, 0.2f, dt);
    buf mu = b_randn((size_t)N, 0.1f, F32), rs = b_randn((size_t)N, 0.1f, F32);
    buf dout = b_randn((size_t)N * C, 1, dt), doutm = b_randn((size_t)N * OC, 1, dt);
    buf g[2][NG]; // per run: dw, db, dsum of K LayerNorms, dbias of K products, the two ops' dinp
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < NG; i++) {
            size_t n = i < DBIAS ? (size_t)C : i < DX ? (size_t)OC : (size_t)N * C;
            g[r][i] = r ? b_from(g[0][i].h, n, dt) : b_randn(n, 1, dt);
        }
    buf dwb = b_randn((size_t)OC * C, 0.1f, dt); // the products' dW (cuBLASLt's, not waiting): not compared
    loom_tensor none = {0}, dwm = DV(dwb, OC, C);
    for (int r = 0; r < 2; r++) {
        buf *b = g[r];
        gpu->grads_defer = r == 1;
        for (int k = 0; k <= K; k++) { // the last: the K-th LayerNorm's destinations again
            int j = k < K ? k : K - 1;
            gpu->layernorm_backward(gpu, DV(b[DX], N, C), DV(b[DW + j], C), DV(b[DB + j], C),
                                    k < K ? DV(b[DS + j], C) : none, DV(dout, N, C), DV(x, N, C), DV(w, C),
                                    DV(mu, N), DV(rs, N));
            if (k < K)
                gpu->matmul_backward(gpu, DV(b[DXM], N, C), dwm, DV(b[DBIAS + j], OC), DV(doutm, N, OC), DV(x, N, C),
                                     DV(wm, OC, C));
            if (r == 1 && k == 0) { // the first product's dbias still waits: nothing has written it yet
                float *got = loom_xmalloc(b[DBIAS].n * 4);
                download_as(got, b[DBIAS].d, b[DBIAS].n, dt);
                T_ASSERT(memcmp(got, b[DBIAS].h, b[DBIAS].n * 4) == 0, "%s grads_defer: an add ran before grads_flush",
                         loom_dtype_name(dt));
                free(got);
            }
        }
        gpu->grads_defer = false;
        gpu->grads_flush(gpu);
    }
    for (int i = 0; i < NG; i++) {
        float *a = loom_xmalloc(g[0][i].n * 8), *c = a + g[0][i].n;
        download_as(a, g[0][i].d, g[0][i].n, dt), download_as(c, g[1][i].d, g[1][i].n, dt);
        T_ASSERT(memcmp(a, c, g[0][i].n * 4) == 0, "%s grads_defer: gradient %d differs from the adds one by one",
                 loom_dtype_name(dt), i);
        free(a);
    }
    buf *all[] = {&x, &w, &wm, &dwb, &mu, &rs, &dout, &doutm};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) b_free(all[i]);
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < NG; i++) b_free(&g[r][i]);
}

static void test_elementwise(shape s) {
    int n = s.B * s.T * 4 * s.C;
    buf x = b_randn((size_t)n, 3, dt), y = b_randn((size_t)n, 1, dt), out = b_nans((size_t)n, dt);
    cpu->gelu_forward(cpu, HV(out, n), HV(x, n));
    gpu->gelu_forward(gpu, DV(out, n), DV(x, n));
    check("gelu out", out, s);
    buf d = b_from(y.h, (size_t)n, dt); // gelu backward in place (dinp = dout)
    cpu->gelu_backward(cpu, HV(d, n), HV(x, n), HV(d, n));
    gpu->gelu_backward(gpu, DV(d, n), DV(x, n), DV(d, n));
    check("gelu dinp (in place)", d, s);
    cpu->residual_forward(cpu, HV(out, n), HV(x, n), HV(y, n));
    gpu->residual_forward(gpu, DV(out, n), DV(x, n), DV(y, n));
    check("residual out", out, s);
    cpu->residual_forward(cpu, HV(x, n), HV(x, n), HV(y, n));
    gpu->residual_forward(gpu, DV(x, n), DV(x, n), DV(y, n));
    check("residual (in place)", x, s);
    b_free(&x), b_free(&y), b_free(&out), b_free(&d);
}

// The fused ops against the CPU's plain ops in sequence: the MLP's matmul + GELU forward, the
// next layer's matmul backward with the GELU backward folded in, residual add + LayerNorm.
static void test_fused(shape s) {
    int N = s.B * s.T, C = s.C, OC = 4 * C;
    buf x = b_randn((size_t)N * C, 1, dt), w = b_randn((size_t)OC * C, 0.2f, dt), bias = b_randn((size_t)OC, 1, dt);
    buf pre = b_nans((size_t)N * OC, dt), out = b_nans((size_t)N * OC, dt);
    cpu->matmul_gelu_forward(cpu, HV(out, N, OC), HV(pre, N, OC), HV(x, N, C), HV(w, OC, C), HV(bias, OC));
    gpu->matmul_gelu_forward(gpu, DV(out, N, OC), DV(pre, N, OC), DV(x, N, C), DV(w, OC, C), DV(bias, OC));
    check("matmul+gelu pre", pre, s);
    check("matmul+gelu out", out, s);
    // the layer and the residual add after it (cuBLASLt's C), alone and as the MLP's last: res + out
    buf rsd = b_randn((size_t)N * OC, 4, dt), rout = b_nans((size_t)N * OC, dt);
    cpu->matmul_residual_forward(cpu, HV(rout, N, OC), HV(x, N, C), HV(w, OC, C), HV(bias, OC), HV(rsd, N, OC));
    gpu->matmul_residual_forward(gpu, DV(rout, N, OC), DV(x, N, C), DV(w, OC, C), DV(bias, OC), DV(rsd, N, OC));
    check("matmul+residual out", rout, s);
    // the layer after the GELU: inp = out (N,OC), w2 (C,OC); dinp (N,OC) folds in gelu'(pre)
    buf p2 = b_from(pre.h, pre.n, dt), in2 = b_from(out.h, out.n, dt), w2 = b_randn((size_t)C * OC, 0.2f, dt);
    buf dout = b_randn((size_t)N * C, 1, dt), dinp = b_nans((size_t)N * OC, dt);
    buf dw = b_randn((size_t)C * OC, 0.1f, dt), db = b_randn((size_t)C, 1, dt);
    cpu->matmul_gelu_backward(cpu, HV(dinp, N, OC), HV(dw, C, OC), HV(db, C), HV(dout, N, C), HV(in2, N, OC),
                              HV(w2, C, OC), HV(p2, N, OC));
    gpu->matmul_gelu_backward(gpu, DV(dinp, N, OC), DV(dw, C, OC), DV(db, C), DV(dout, N, C), DV(in2, N, OC),
                              DV(w2, C, OC), DV(p2, N, OC));
    check("matmul+gelu dinp", dinp, s);
    check("matmul+gelu dw +=", dw, s);
    check("matmul+gelu dbias +=", db, s);
    // the whole MLP's backward: x, w the fc layer, p2, in2 its GELU, w2 the fcproj layer; act
    // recomputed into a NaN buffer when not kept
    for (int kept = 0; kept < 2; kept++) {
        buf dx = b_nans((size_t)N * C, dt), dfch = b_nans((size_t)N * OC, dt), act = kept ? b_from(out.h, out.n, dt) : b_nans(out.n, dt);
        buf dfw = b_randn((size_t)OC * C, 0.1f, dt), dfb = b_randn((size_t)OC, 1, dt);
        cpu->mlp_backward(cpu, HV(dx, N, C), HV(dfch, N, OC), HV(dfw, OC, C), HV(dfb, OC), HV(dw, C, OC), HV(db, C),
                          HV(dout, N, C), HV(x, N, C), HV(w, OC, C), HV(p2, N, OC), HV(in2, N, OC), true, HV(w2, C, OC));
        gpu->mlp_backward(gpu, DV(dx, N, C), DV(dfch, N, OC), DV(dfw, OC, C), DV(dfb, OC), DV(dw, C, OC), DV(db, C),
                          DV(dout, N, C), DV(x, N, C), DV(w, OC, C), DV(p2, N, OC), DV(act, N, OC), kept, DV(w2, C, OC));
        check("mlp dfch", dfch, s);
        check("mlp dinp", dx, s);
        check("mlp dfcw +=", dfw, s);
        check("mlp dfcb +=", dfb, s);
        check("mlp dprojw +=", dw, s);
        check("mlp dprojb +=", db, s);
        b_free(&dx), b_free(&dfch), b_free(&act), b_free(&dfw), b_free(&dfb);
    }
    // the whole MLP's forward with the residual add after it: res2 + gelu(x w^T + bias) w2^T + pb
    buf res2 = b_randn((size_t)N * C, 4, dt), pb = b_randn((size_t)C, 1, dt), out2 = b_nans((size_t)N * C, dt);
    buf pre2 = b_nans(pre.n, dt), act2 = b_nans(out.n, dt);
    cpu->mlp_forward(cpu, HV(out2, N, C), HV(pre2, N, OC), HV(act2, N, OC), true, HV(x, N, C), HV(w, OC, C),
                     HV(bias, OC), HV(w2, C, OC), HV(pb, C), HV(res2, N, C));
    gpu->mlp_forward(gpu, DV(out2, N, C), DV(pre2, N, OC), DV(act2, N, OC), true, DV(x, N, C), DV(w, OC, C),
                     DV(bias, OC), DV(w2, C, OC), DV(pb, C), DV(res2, N, C));
    check("mlp forward out (+ residual)", out2, s);
    buf a = b_randn((size_t)N * C, 2, dt), b = b_randn((size_t)N * C, 1, dt), res = b_nans((size_t)N * C, dt);
    buf ln = b_nans((size_t)N * C, dt), mean = b_nans((size_t)N, F32), rstd = b_nans((size_t)N, F32);
    buf lw = b_randn((size_t)C, 1, dt), lb = b_randn((size_t)C, 1, dt);
    for (int in_place = 0; in_place < 2; in_place++) { // res = a + b, then res = res + b
        buf *r = in_place ? &a : &res;
        cpu->residual_layernorm_forward(cpu, HV(*r, N, C), HV(ln, N, C), HV(mean, N), HV(rstd, N), HV(a, N, C),
                                        HV(b, N, C), HV(lw, C), HV(lb, C));
        gpu->residual_layernorm_forward(gpu, DV(*r, N, C), DV(ln, N, C), DV(mean, N), DV(rstd, N), DV(a, N, C),
                                        DV(b, N, C), DV(lw, C), DV(lb, C));
        check(in_place ? "residual+layernorm res (in place)" : "residual+layernorm res", *r, s);
        check("residual+layernorm out", ln, s);
        // the GPU's mean is of the bf16-rounded sum, the CPU's of the fp32 one: an error of
        // the size of res's rounding, which is large against a mean that nearly cancels
        check_scaled("residual+layernorm mean", mean, t_max_abs(r->h, r->n), s);
        check("residual+layernorm rstd", rstd, s);
    }
    buf *all[] = {&x,  &w,  &bias, &pre, &out, &p2, &in2, &w2,   &dout, &dinp, &dw,   &db,  &a,  &b,   &res,
                  &ln, &mean, &rstd, &lw, &lb, &rout, &rsd, &res2, &pb,   &out2, &pre2, &act2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) b_free(all[i]);
}

// With large logits (|z| ~ 160) the CPU's lse = m + log(sum) is only good to an ulp of 160
// (1.5e-5 relative in exp(z - lse)), so in fp32 mode those dlogits are checked against the fp64
// reference of tests/backend/ref.c instead.
static void test_crossentropy(shape s, float scale) {
    int N = s.B * s.T, V = 37 * s.C + 11, Vp = (V + 127) / 128 * 128;
    buf z = b_randn((size_t)N * Vp, scale, dt), loss = b_nans((size_t)N, F32);
    float *z0 = loom_xmalloc((size_t)N * Vp * 4), *loss64 = loom_xmalloc((size_t)N * 4);
    memcpy(z0, z.h, (size_t)N * Vp * 4);
    int32_t *tgt = loom_xmalloc((size_t)N * 4);
    for (int i = 0; i < N; i++) tgt[i] = t_randint(0, V - 1);
    int32_t *dtgt = d_ints(tgt, (size_t)N);
    bool large = scale > 10;
    for (int backward = 0; backward < 2; backward++) {
        cpu->softmax_crossentropy(cpu, HV(loss, N), HV(z, N, Vp), LOOM_VIEW(tgt, I32, N), V, 1.0f / N, backward);
        gpu->softmax_crossentropy(gpu, DV(loss, N), DV(z, N, Vp), LOOM_VIEW(dtgt, I32, N), V, 1.0f / N, backward);
        check(large ? "crossentropy loss (large logits)" : "crossentropy loss", loss, s);
        if (backward && large && dt == F32) ref_crossentropy(loss64, z.h, z0, tgt, N, V, Vp, 1.0f / N);
        // forward only: the logits are left as they were; backward: dlogits, 0 on [V, Vp)
        check(backward ? (large ? "crossentropy dlogits (large logits)" : "crossentropy dlogits")
                       : "crossentropy logits kept", z, s);
    }
    free(tgt), free(z0), free(loss64), gpu->free(gpu, dtgt), b_free(&z), b_free(&loss);
}

// The vocabulary-parallel cross-entropy against the CPU on the same shards of a random (N, Vp)
// logits matrix, V = 37C + 11: 4 equal shards (16-byte vectors; the last partly padding), 3 of
// which two have odd widths (one element a thread), and 2 split at V (the second all padding).
// The combine starts from the CPU's partials and the backward from the CPU's lse, so that each
// op is checked alone.
static void test_crossentropy_parallel(shape s, float scale) {
    int N = s.B * s.T, V = 37 * s.C + 11, Vp = (V + 127) / 128 * 128;
    bool large = scale > 10;
    float *z = loom_xmalloc((size_t)N * Vp * 4);
    t_fill_normal(z, (size_t)N * Vp, scale);
    int32_t *tgt = loom_xmalloc((size_t)N * 4);
    for (int i = 0; i < N; i++) tgt[i] = t_randint(0, V - 1);
    int32_t *dtgt = d_ints(tgt, (size_t)N);
    loom_tensor ht = LOOM_VIEW(tgt, I32, N), dt_ = LOOM_VIEW(dtgt, I32, N);
    int w = (Vp / 3) | 1, splits[3][5] = {{0, Vp / 4, Vp / 2, 3 * Vp / 4, Vp}, {0, w, 2 * w, Vp}, {0, V, Vp}};
    for (int split = 0; split < 3; split++) {
        int R = 4 - split, *v0 = splits[split]; // shard r: columns [v0[r], v0[r + 1])
        buf part = b_nans((size_t)R * N * 3, F32), zs[4];
        for (int r = 0; r < R; r++) {
            int Vl = v0[r + 1] - v0[r];
            float *h = loom_xmalloc((size_t)N * Vl * 4 + 4);
            for (int i = 0; i < N; i++) memcpy(h + (size_t)i * Vl, z + (size_t)i * Vp + v0[r], (size_t)Vl * 4);
            zs[r] = b_from(h, (size_t)N * Vl, dt);
            free(h);
            cpu->crossentropy_partial(cpu, LOOM_VIEW(part.h + (size_t)r * N * 3, F32, N, 3), HV(zs[r], N, Vl), ht,
                                      v0[r], V);
            gpu->crossentropy_partial(gpu, LOOM_VIEW((float *)part.d + (size_t)r * N * 3, F32, N, 3),
                                      DV(zs[r], N, Vl), dt_, v0[r], V);
        }
        // a shard with no valid column has max -INFINITY on both (equal, not comparable by difference)
        float *got = loom_xmalloc(part.n * 4), *want = loom_xmalloc(part.n * 4);
        download_as(got, part.d, part.n, F32);
        memcpy(want, part.h, part.n * 4);
        for (size_t i = 0; i < part.n; i++)
            if (isinf(want[i]) && got[i] == want[i]) got[i] = want[i] = 0.0f;
        check_values(large ? "crossentropy_partial (large logits)" : "crossentropy_partial", got, want, part.n, 0, s);
        free(got), free(want);
        buf pc = b_from(part.h, part.n, F32), loss = b_nans((size_t)N, F32), lse = b_nans((size_t)N, F32);
        cpu->crossentropy_combine(cpu, HV(loss, N), HV(lse, N), HV(pc, R, N, 3));
        gpu->crossentropy_combine(gpu, DV(loss, N), DV(lse, N), DV(pc, R, N, 3));
        // a loss is lse minus a logit: its rounding error follows lse's size (large logits)
        check_scaled(large ? "crossentropy_combine loss (large logits)" : "crossentropy_combine loss", loss,
                     fmax(t_max_abs(loss.h, loss.n), t_max_abs(lse.h, lse.n)), s);
        check(large ? "crossentropy_combine lse (large logits)" : "crossentropy_combine lse", lse, s);
        // dlogits of every shard relative to the largest of all shards (a shard's own may be tiny)
        buf l = b_from(lse.h, (size_t)N, F32);
        double dmax = 0;
        for (int r = 0; r < R; r++) {
            int Vl = v0[r + 1] - v0[r];
            cpu->crossentropy_backward(cpu, HV(zs[r], N, Vl), HV(l, N), ht, v0[r], V, 1.0f / N);
            gpu->crossentropy_backward(gpu, DV(zs[r], N, Vl), DV(l, N), dt_, v0[r], V, 1.0f / N);
            dmax = fmax(dmax, t_max_abs(zs[r].h, zs[r].n));
        }
        for (int r = 0; r < R; r++) {
            check_scaled(large ? "crossentropy_backward dlogits (large)" : "crossentropy_backward dlogits", zs[r],
                         dmax, s);
            b_free(&zs[r]);
        }
        b_free(&part), b_free(&pc), b_free(&loss), b_free(&lse), b_free(&l);
    }
    free(z), free(tgt), gpu->free(gpu, dtgt);
}

// The device's values of b against the CPU's in b.h rounded to b's dtype, bit for bit.
static void check_bits(const char *what, buf b, shape s) {
    size_t es = loom_dtype_size(b.dt), differ = 0;
    unsigned char *got = loom_xmalloc(b.n * es + 4);
    gpu->download(gpu, got, b.d, b.n * es);
    for (size_t i = 0; i < b.n; i++) {
        uint16_t h = f2bf(b.h[i]);
        differ += memcmp(got + i * es, b.dt == LOOM_BF16 ? (const void *)&h : (const void *)&b.h[i], es) != 0;
    }
    T_ASSERT(differ == 0, "%s %s B=%d T=%d C=%d: %zu of %zu values differ from the CPU's bits",
             dt == LOOM_BF16 ? "bf16" : "fp32", what, s.B, s.T, s.C, differ, b.n);
    free(got);
}

// n ragged (one element a thread) or a multiple of 8 (16-byte vectors; every C here is). Every
// operation of the update is rounded alone on both sides, so the GPU gives the CPU's bits.
static void test_adamw(shape s, bool with_master, bool ragged) {
    size_t n = (ragged ? 10007 : 10008) + (size_t)s.T * s.C;
    loom_adamw_args a = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                         .weight_decay = 0.1f, .grad_scale = 0.7f, .t = 3};
    buf master = b_randn(n, 1, F32), grad = b_randn(n, 1, dt), m = b_randn(n, 0.1f, F32);
    float *vh = loom_xmalloc(n * 4);
    t_fill_normal(vh, n, 0.1f);
    for (size_t i = 0; i < n; i++) vh[i] *= vh[i]; // second moments are >= 0
    buf v = b_from(vh, n, F32), param = b_from(master.h, n, dt);
    loom_tensor none = {0};
    // the CPU updates fp32 parameters: the master copy when there is one, else param's values
    cpu->adamw_update(cpu, with_master ? HV(master, n) : HV(param, n), none, HV(grad, n), HV(m, n),
                      HV(v, n), a);
    if (with_master) memcpy(param.h, master.h, n * 4);
    gpu->adamw_update(gpu, DV(param, n), with_master ? DV(master, n) : none, DV(grad, n), DV(m, n),
                      DV(v, n), a);
    check(with_master ? "adamw param (with master)" : "adamw param", param, s);
    if (with_master) check("adamw master", master, s);
    check("adamw m", m, s);
    check("adamw v", v, s);
    check_bits(with_master ? "adamw param (with master)" : "adamw param", param, s);
    if (with_master) check_bits("adamw master", master, s);
    check_bits("adamw m", m, s);
    check_bits("adamw v", v, s);
    free(vh), b_free(&master), b_free(&grad), b_free(&m), b_free(&v), b_free(&param);
}

// Split master weights (bf16 mode): the parameters are the fp32 master weights' high halves and
// a buffer holds their low halves (core/bf16.h; every 97th value a tie, whose high half is the
// bf16 away from zero). The halves the GPU writes back, joined: the CPU's fp32 update of the same
// values bit for bit, and the whole master weights' update on the GPU, whose bf16 parameters are
// the high halves but where the result is a tie (rounded to even there).
static void test_adamw_split(shape s, bool ragged) {
    size_t n = (ragged ? 10007 : 10008) + (size_t)s.T * s.C;
    loom_adamw_args a = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                         .weight_decay = 0.1f, .grad_scale = 0.7f, .t = 3};
    buf master = b_randn(n, 1, F32), grad = b_randn(n, 1, dt), m = b_randn(n, 0.1f, F32), v = b_randn(n, 0.1f, F32);
    for (size_t i = 0; i < n; i++) v.h[i] *= v.h[i]; // second moments are >= 0
    upload_as(v.d, v.h, n, F32);
    uint32_t *bits = (uint32_t *)master.h;
    for (size_t i = 0; i < n; i += 97) bits[i] = (bits[i] & 0xffff0000u) | 0x8000u;
    upload_as(master.d, master.h, n, F32);
    // the whole master weights' update: its own copies of the inputs (b_from rounds param to even)
    buf wparam = b_from(master.h, n, LOOM_BF16), wm = b_from(m.h, n, F32), wv = b_from(v.h, n, F32);
    uint16_t *high = loom_xmalloc(n * 2 + 2), *low = loom_xmalloc(n * 2 + 2);
    for (size_t i = 0; i < n; i++) high[i] = loom_split_high(bits[i]), low[i] = loom_split_low(bits[i]);
    void *dhigh = gpu->alloc(gpu, n * 2), *dlow = gpu->alloc(gpu, n * 2);
    LOOM_CHECK(dhigh && dlow);
    gpu->upload(gpu, dhigh, high, n * 2);
    gpu->upload(gpu, dlow, low, n * 2);
    loom_tensor none = {0};
    gpu->adamw_update(gpu, DV(wparam, n), DV(master, n), DV(grad, n), DV(wm, n), DV(wv, n), a);
    cpu->adamw_update(cpu, HV(master, n), none, HV(grad, n), HV(m, n), HV(v, n), a);
    a.master_low = dlow;
    gpu->adamw_update(gpu, LOOM_VIEW(dhigh, LOOM_BF16, n), none, DV(grad, n), DV(m, n), DV(v, n), a);
    gpu->download(gpu, high, dhigh, n * 2);
    gpu->download(gpu, low, dlow, n * 2);
    uint32_t *whole = loom_xmalloc(n * 4 + 4);
    uint16_t *wp = loom_xmalloc(n * 2 + 2);
    gpu->download(gpu, whole, master.d, n * 4);
    gpu->download(gpu, wp, wparam.d, n * 2);
    float *got = loom_xmalloc(n * 4 + 4);
    size_t unequal = 0, params = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t b = loom_split_join(high[i], low[i]);
        memcpy(&got[i], &b, 4);
        unequal += b != whole[i];
        params += wp[i] != high[i] && (b & 0xffffu) != 0x8000u;
    }
    record("adamw split master", t_max_rel_err(got, master.h, n));
    T_ASSERT(memcmp(got, master.h, n * 4) == 0, "adamw split master B=%d T=%d C=%d: not the CPU's bits", s.B, s.T,
             s.C);
    T_ASSERT(unequal == 0, "adamw split master: %zu of %zu values differ from the whole master's update", unequal, n);
    T_ASSERT(params == 0, "adamw split master: %zu parameters off a tie differ from the whole master's", params);
    check_bits("adamw m (split master)", m, s);
    check_bits("adamw v (split master)", v, s);
    free(got), free(high), free(low), free(whole), free(wp), gpu->free(gpu, dhigh), gpu->free(gpu, dlow);
    b_free(&master), b_free(&grad), b_free(&m), b_free(&v), b_free(&wparam), b_free(&wm), b_free(&wv);
}

// Stochastic rounding of the bf16 parameters from the master weights (bf16 mode): with lr 0
// the master values stay, and each parameter must be one of its two bf16 neighbours, rounded up
// about as often as the fractions of the gaps say (within 6 standard deviations), the same for
// the same seed and different for another.
static void test_adamw_stochastic(size_t n) {
    loom_adamw_args a = {.lr = 0.0f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .grad_scale = 1.0f, .t = 1,
                         .stochastic_rounding = true, .sr_seed = 77, .index0 = 12345};
    float *vh = loom_xcalloc(n, 4); // second moments >= 0 (zero: the update is m / eps, times lr 0)
    buf master = b_randn(n, 1, F32), grad = b_randn(n, 1, dt), m = b_randn(n, 0.1f, F32), v = b_from(vh, n, F32);
    buf param = b_randn(n, 1, dt);
    free(vh);
    uint16_t *runs[3];
    for (int r = 0; r < 3; r++) {
        a.sr_seed = r == 2 ? 78 : 77;
        gpu->adamw_update(gpu, DV(param, n), DV(master, n), DV(grad, n), DV(m, n), DV(v, n), a);
        runs[r] = loom_xmalloc(n * 2);
        gpu->download(gpu, runs[r], param.d, n * 2);
    }
    double ups = 0, expect = 0, var = 0;
    bool neighbours = true;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &master.h[i], 4);
        uint16_t lo = (uint16_t)(u >> 16);
        double frac = (double)(u & 0xffffu) / 65536.0;
        neighbours = neighbours && (runs[0][i] == lo || runs[0][i] == (uint16_t)(lo + 1));
        ups += runs[0][i] != lo;
        expect += frac;
        var += frac * (1 - frac);
    }
    record("adamw stochastic rounding (sd)", fabs(ups - expect) / sqrt(var));
    T_ASSERT(neighbours, "stochastic rounding gave a value that is not a bf16 neighbour");
    T_ASSERT(fabs(ups - expect) < 6 * sqrt(var), "stochastic rounding: %.0f rounded up, %.1f expected", ups, expect);
    T_ASSERT(memcmp(runs[0], runs[1], n * 2) == 0, "stochastic rounding differs for the same seed");
    T_ASSERT(memcmp(runs[0], runs[2], n * 2) != 0, "stochastic rounding is the same for another seed");
    for (int r = 0; r < 3; r++) free(runs[r]);
    b_free(&master), b_free(&grad), b_free(&m), b_free(&v), b_free(&param);
}

// A step's scalars in device memory (what the step --cuda-graphs records runs): sumsq_add over
// three runs the same bits as the host's sum of sumsq's results; step_scalars' clipping factor
// loom_clip_scale's to the bit and its skip flag set by a loss or a norm that is not finite; and
// AdamW reading them (with master weights and stochastic rounding in bf16) the same bits as with
// the values passed, or, skipped, changing nothing.
static void test_step_scalars(shape s) {
    size_t n = 2 * 65536 + 5 + (size_t)s.T * s.C, edge[4] = {0, n / 5, n / 2 + 1, n};
    buf g = b_randn(n, 1, dt), losses = b_randn(37, 2, F32);
    loom_step_scalars *sc = gpu->alloc(gpu, sizeof *sc); // zero-filled: sumsq 0
    loom_step_scalars h;
    double host = 0;
    for (int r = 0; r < 3; r++) {
        int64_t len = (int64_t)(edge[r + 1] - edge[r]);
        loom_tensor run = loom_view_dims((char *)g.d + edge[r] * loom_dtype_size(dt), dt, &len, 1);
        host += gpu->sumsq(gpu, run);
        gpu->sumsq_add(gpu, &sc->sumsq, run);
    }
    gpu->download(gpu, &h, sc, sizeof h);
    T_ASSERT(memcmp(&h.sumsq, &host, sizeof host) == 0, "sumsq_add %.17g vs the host's sum %.17g", h.sumsq, host);
    double sums[] = {0, 0.25, 1.0, 0.5 * host, host, 1e300, INFINITY, NAN};
    float bad[] = {1.0f, NAN, INFINITY}; // losses[7]: finite, then not
    for (int max = 0; max < 2; max++)
        for (size_t k = 0; k < sizeof sums / sizeof sums[0]; k++)
            for (int b = 0; b < 3; b++) {
                losses.h[7] = bad[b];
                gpu->upload(gpu, losses.d, losses.h, 37 * 4);
                h = (loom_step_scalars){.sumsq = sums[k]};
                gpu->upload(gpu, sc, &h, sizeof h);
                gpu->step_scalars(gpu, sc, DV(losses, 37), max ? 1.0f : 0.0f);
                gpu->download(gpu, &h, sc, sizeof h);
                float want = loom_clip_scale(sqrt(sums[k]), max ? 1.0f : 0.0f);
                bool skip = b > 0 || !isfinite(sqrt(sums[k]));
                T_ASSERT(memcmp(&h.grad_scale, &want, 4) == 0 && (h.skip != 0) == skip,
                         "step_scalars sumsq %g max %d loss %g: factor %.9g vs %.9g, skip %d", sums[k], max, bad[b],
                         h.grad_scale, want, h.skip);
            }
    // AdamW: the values passed (param, master, m, v) against the scalars read (the copies)
    loom_adamw_args a = {.lr = 2e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                         .grad_scale = 0.37f, .t = 5, .stochastic_rounding = true, .sr_seed = 9, .index0 = 77};
    bool master = dt == LOOM_BF16;
    size_t es = loom_dtype_size(dt), bytes[4] = {n * es, n * 4, n * 4, n * 4};
    void *x[2][4]; // [values, scalars][param, master, m, v]
    buf init[4] = {b_randn(n, 1, dt), b_randn(n, 1, F32), b_randn(n, 0.1f, F32), b_randn(n, 0.1f, F32)};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) x[i][j] = gpu->alloc(gpu, bytes[j]), gpu->copy(gpu, x[i][j], init[j].d, bytes[j]);
    for (int i = 0; i < 4; i++) b_free(&init[i]);
    loom_tensor none = {0};
    int64_t len = (int64_t)n;
    for (int skip = 0; skip < 2; skip++) {
        for (int i = 0; i < 2; i++) {
            loom_adamw_args b = a;
            if (i) {
                h = (loom_step_scalars){.lr = a.lr, .bc1 = loom_adamw_bias(a.beta1, a.t),
                                        .bc2 = loom_adamw_bias(a.beta2, a.t), .t = a.t, .grad_scale = a.grad_scale,
                                        .skip = skip};
                gpu->upload(gpu, sc, &h, sizeof h);
                b.lr = 0, b.grad_scale = 0, b.t = 0, b.scalars = sc;
            }
            if (i || !skip)
                gpu->adamw_update(gpu, loom_view_dims(x[i][0], dt, &len, 1),
                                  master ? loom_view_dims(x[i][1], F32, &len, 1) : none, DV(g, n),
                                  loom_view_dims(x[i][2], F32, &len, 1), loom_view_dims(x[i][3], F32, &len, 1), b);
        }
        for (int j = 0; j < 4; j++) {
            void *p = loom_xmalloc(bytes[j]), *q = loom_xmalloc(bytes[j]);
            gpu->download(gpu, p, x[0][j], bytes[j]);
            gpu->download(gpu, q, x[1][j], bytes[j]);
            T_ASSERT(memcmp(p, q, bytes[j]) == 0, "adamw from the step's scalars%s: tensor %d differs from the values'",
                     skip ? " (skipped)" : "", j);
            free(p), free(q);
        }
        a.t++;
    }
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) gpu->free(gpu, x[i][j]);
    gpu->free(gpu, sc);
    b_free(&g), b_free(&losses);
}

static void test_sumsq(shape s) {
    size_t n = 3 * 65536 + 17 + (size_t)s.T * s.C;
    buf x = b_randn(n, 1, dt);
    double want = cpu->sumsq(cpu, HV(x, n)), got = gpu->sumsq(gpu, DV(x, n)), again = gpu->sumsq(gpu, DV(x, n));
    double e = fabs(got - want) / want;
    record("sumsq", e);
    T_ASSERT(e < 1e-9, "sumsq n=%zu: %.17g vs cpu %.17g", n, got, want);
    T_ASSERT(memcmp(&got, &again, sizeof got) == 0, "sumsq differs between two runs");
    b_free(&x);
}

static void run_mode(loom_dtype mode, bool quick) {
    LOOM_CHECK(loom_backend_create(&gpu, "cuda", mode) == LOOM_OK);
    dt = mode;
    tol = mode == LOOM_BF16 ? 1e-2 : 1e-5;
    test_memory();
    if (mode == LOOM_BF16) test_adamw_stochastic(200003), test_adamw_stochastic(200000); // ragged, vectors
    for (int i = 0; i < (quick ? NQUICK : NSHAPES); i++) {
        shape s = SHAPES[i];
        printf("%s B=%d T=%d C=%d NH=%d (hs %d)\n", loom_dtype_name(mode), s.B, s.T, s.C, s.NH, s.C / s.NH);
        fflush(stdout);
        test_encoder(s, 0, 128, false);
        test_encoder(s, 40, 56, false); // tokens [40, 96): a shard in the middle of the vocabulary
        test_encoder(s, 40, 56, true);
        test_layernorm(s);
        test_matmul(s, false);
        test_matmul(s, true);
        test_grads_defer(s);
        test_elementwise(s);
        test_fused(s);
        test_crossentropy(s, 2.0f);
        test_crossentropy(s, 40.0f);
        test_crossentropy_parallel(s, 2.0f);
        test_crossentropy_parallel(s, 40.0f);
        for (int ragged = 0; ragged < 2; ragged++) {
            test_adamw(s, false, ragged);
            if (mode == LOOM_BF16) test_adamw(s, true, ragged), test_adamw_split(s, ragged);
        }
        test_sumsq(s);
        test_step_scalars(s);
    }
    // the LayerNorm backward at each count of vectors a lane holds (2-7 bf16, 3-7 fp32) and past it
    for (int C = 264; C <= 2056; C += 256) test_layernorm((shape){2, 37, C, 1});
    // the products again with their algorithms chosen by timing (gemm_autotune), in a backend
    // whose cache is empty: the timed runs leave every output as the CPU's (dw and dbias are
    // added into, so a timed run that wrote them would show); quick, two shapes (each candidate runs
    // six times, which under racecheck takes minutes over every quick shape)
    loom_backend_destroy(gpu);
    LOOM_CHECK(loom_backend_create(&gpu, "cuda", mode) == LOOM_OK);
    gpu->gemm_autotune = true;
    for (int i = 0; i < (quick ? 2 : NSHAPES); i++) {
        test_matmul(SHAPES[i], false);
        test_matmul(SHAPES[i], true);
        test_fused(SHAPES[i]);
    }
    loom_backend_destroy(gpu);
    gpu = NULL;
}

int main(void) { return cuda_test_main("cuda_backend", run_mode); }
