// Multi-head attention of a query block against a key/value block, FlashAttention-style on the
// CPU (FlashAttention-2, Dao 2023): the (Tq,Tk) score matrix is never stored. Each (batch, head)
// pair is one task; its query rows are taken in blocks of ATTN_BLOCK, and a block [i0,i1) reads
// only the keys its last row sees, [0, n) with n = vis(i1 - 1) (causal over global positions:
// about half the work of the full product on the diagonal, none on a block wholly in the
// future). vis(i) = clamp(i + delta + 1, 0, Tk), delta from loom_attn_delta. Per block, with a
// per-thread (rows, n) scratch:
//   forward:  S = Q K^T / sqrt(hs), masked; P = softmax(S) row by row; lse = logsumexp(S);
//             O = P V (rows that see no key: O = 0, lse = -inf)
//   backward: P = exp(S - lse) recomputed; dP = dO V^T; D = rowsum(dO * O);
//             dS = P * (dP - D); dQ += dS K / sqrt(hs); dK += dS^T Q / sqrt(hs); dV += P^T dO
//   merge:    the online softmax's rescaling of two partial results by their lse
// All products are cblas_sgemm calls on the strided head columns of q (ld Wq), kv (ld Wk) and
// out/dout (ld C); called inside the OpenMP region, OpenBLAS's OpenMP build runs them
// single-threaded.
#include "backend/cpu/cpu_math.h"
#include "backend/cpu/cpu_ops.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#define ATTN_BLOCK 128 // query rows per block

typedef struct { // the shapes of one attention call
    int64_t B, Tq, Tk, C, NH, hs, ldq, ldk, delta;
} attn_dims;

typedef struct { // one (b, h) pair of the batch
    const float *q, *k, *v; // (Tq,hs) row stride ldq; (Tk,hs) each, row stride ldk
    float *dq, *dk, *dv;    // the same places in dq and dkv (backward)
    const attn_dims *d;
    float scale; // 1/sqrt(hs)
} attn_head;

static attn_dims attn_check(loom_tensor out, loom_tensor lse, loom_tensor q, loom_tensor kv, int NH,
                            loom_attn_span span) {
    LOOM_CHECK(q.ndim == 3 && kv.ndim == 3 && q.shape[0] == kv.shape[0] && q.shape[0] > 0);
    int64_t B = q.shape[0], Tq = q.shape[1], Tk = kv.shape[1], C = loom_cols(&out);
    LOOM_CHECK(Tq > 0 && Tk > 0 && NH > 0 && C > 0 && C % NH == 0 && loom_rows(&out) == B * Tq);
    LOOM_CHECK((q.shape[2] == C || q.shape[2] == 3 * C) && (kv.shape[2] == 2 * C || kv.shape[2] == 3 * C));
    LOOM_CHECK(loom_numel(&lse) == B * NH * Tq);
    return (attn_dims){B, Tq, Tk, C, NH, C / NH, q.shape[2], kv.shape[2], loom_attn_delta(span, Tq, Tk)};
}

// The keys query row i sees: [0, vis)
static int64_t attn_visible(const attn_dims *d, int64_t i) {
    int64_t n = i + d->delta + 1;
    return n < 0 ? 0 : n > d->Tk ? d->Tk : n;
}

static attn_head attn_head_at(const float *q, const float *kv, float *dq, float *dkv, const attn_dims *d,
                              int64_t bh) {
    int64_t b = bh / d->NH, h = bh % d->NH;
    int64_t qo = b * d->Tq * d->ldq + h * d->hs, ko = b * d->Tk * d->ldk + d->ldk - 2 * d->C + h * d->hs;
    attn_head a = {q + qo, kv + ko, kv + ko + d->C, NULL, NULL, NULL, d, 1.0f / sqrtf((float)d->hs)};
    if (dq) a.dq = dq + qo, a.dk = dkv + ko, a.dv = dkv + ko + d->C;
    return a;
}

// S (i1-i0, n) = scale * Q[i0:i1) K[0:n)^T, row stride n (the mask is left to the caller)
static void attn_scores(float *S, const attn_head *a, int64_t i0, int64_t i1, int64_t n) {
    const attn_dims *d = a->d;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(i1 - i0), (int)n, (int)d->hs, a->scale,
                a->q + i0 * d->ldq, (int)d->ldq, a->k, (int)d->ldk, 0.0f, S, (int)n);
}

// One head's forward: o (Tq,hs) row stride C, lse (Tq)
static void attn_head_forward(float *S, float *o, float *lse, const attn_head *a) {
    const attn_dims *d = a->d;
    for (int64_t i0 = 0; i0 < d->Tq; i0 += ATTN_BLOCK) {
        int64_t i1 = cpu_min64(i0 + ATTN_BLOCK, d->Tq), n = attn_visible(d, i1 - 1);
        if (n == 0) { // a block in the future of every key
            for (int64_t i = i0; i < i1; i++) {
                for (int64_t c = 0; c < d->hs; c++) o[i * d->C + c] = 0.0f;
                lse[i] = -INFINITY;
            }
            continue;
        }
        attn_scores(S, a, i0, i1, n);
        for (int64_t i = i0; i < i1; i++) { // query i sees keys [0, ni)
            int64_t ni = attn_visible(d, i);
            float *s = S + (i - i0) * n, m = -INFINITY, sum = 0.0f;
#pragma omp simd reduction(max : m)
            for (int64_t j = 0; j < ni; j++) m = s[j] > m ? s[j] : m;
#pragma omp simd reduction(+ : sum)
            for (int64_t j = 0; j < ni; j++) {
                s[j] = cpu_expf(s[j] - m);
                sum += s[j];
            }
            float inv = ni ? 1.0f / sum : 0.0f;
#pragma omp simd
            for (int64_t j = 0; j < ni; j++) s[j] *= inv;
            for (int64_t j = ni; j < n; j++) s[j] = 0.0f;
            lse[i] = ni ? m + logf(sum) : -INFINITY;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(i1 - i0), (int)d->hs, (int)n, 1.0f, S,
                    (int)n, a->v, (int)d->ldk, 0.0f, o + i0 * d->C, (int)d->C);
    }
}

void cpu_attention_forward(loom_backend *be, loom_tensor out, loom_tensor lse, loom_tensor q, loom_tensor kv,
                           int NH, loom_attn_span span) {
    attn_dims d = attn_check(out, lse, q, kv, NH, span);
    const float *xq = cpu_f32(q), *xkv = cpu_f32(kv);
    float *o = cpu_f32(out), *l = cpu_f32(lse); // (B,Tq,C), (B,NH,Tq)
#pragma omp parallel
    {
        float *S = loom_xmalloc((size_t)(cpu_min64(ATTN_BLOCK, d.Tq) * d.Tk) * sizeof(float));
#pragma omp for schedule(static)
        for (int64_t bh = 0; bh < d.B * d.NH; bh++) {
            attn_head a = attn_head_at(xq, xkv, NULL, NULL, &d, bh);
            attn_head_forward(S, o + bh / d.NH * d.Tq * d.C + bh % d.NH * d.hs, l + bh * d.Tq, &a);
        }
        free(S);
    }
}

// One head's backward, accumulating into a->dq, a->dk, a->dv; dout, o (Tq,hs) row stride C.
static void attn_head_backward(float *P, float *dP, const float *dout, const float *o, const float *lse,
                               const attn_head *a) {
    const attn_dims *d = a->d;
    int hs = (int)d->hs, ldq = (int)d->ldq, ldk = (int)d->ldk, C = (int)d->C;
    for (int64_t i0 = 0; i0 < d->Tq; i0 += ATTN_BLOCK) {
        int64_t i1 = cpu_min64(i0 + ATTN_BLOCK, d->Tq), n64 = attn_visible(d, i1 - 1);
        if (n64 == 0) continue;
        int nq = (int)(i1 - i0), n = (int)n64;
        attn_scores(P, a, i0, i1, n64);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, n, hs, 1.0f, dout + i0 * C, C, a->v, ldk, 0.0f,
                    dP, n);
        for (int64_t i = i0; i < i1; i++) {
            float *p = P + (i - i0) * n, *dp = dP + (i - i0) * n, D = 0.0f, l = lse[i];
            int64_t ni = l == -INFINITY ? 0 : attn_visible(d, i);
            const float *doi = dout + i * C, *oi = o + i * C;
#pragma omp simd reduction(+ : D)
            for (int64_t c = 0; c < hs; c++) D += doi[c] * oi[c];
#pragma omp simd
            for (int64_t j = 0; j < ni; j++) {
                p[j] = cpu_expf(p[j] - l);
                dp[j] = p[j] * (dp[j] - D);
            }
            for (int64_t j = ni; j < n; j++) p[j] = dp[j] = 0.0f;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, hs, n, a->scale, dP, n, a->k, ldk, 1.0f,
                    a->dq + i0 * ldq, ldq);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hs, nq, a->scale, dP, n, a->q + i0 * ldq, ldq, 1.0f,
                    a->dk, ldk);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hs, nq, 1.0f, P, n, dout + i0 * C, C, 1.0f, a->dv,
                    ldk);
    }
}

void cpu_attention_backward(loom_backend *be, loom_tensor dq, loom_tensor dkv, loom_tensor dbias, loom_tensor dout,
                            loom_tensor q, loom_tensor kv, loom_tensor out, loom_tensor lse, int NH,
                            loom_attn_span span) {
    attn_dims d = attn_check(out, lse, q, kv, NH, span);
    LOOM_CHECK(loom_numel(&dq) == loom_numel(&q) && loom_numel(&dkv) == loom_numel(&kv));
    LOOM_CHECK(loom_numel(&dout) == loom_numel(&out));
    LOOM_CHECK(!dbias.data || (!span.accumulate && loom_numel(&dbias) == 3 * d.C));
    const float *xq = cpu_f32(q), *xkv = cpu_f32(kv), *dy = cpu_f32(dout), *o = cpu_f32(out), *l = cpu_f32(lse);
    float *dxq = cpu_f32(dq), *dxkv = cpu_f32(dkv);
    if (!span.accumulate) { // written: the q columns of dq, the k, v columns of dkv start from 0
        for (int64_t r = 0; r < d.B * d.Tq; r++) memset(dxq + r * d.ldq, 0, (size_t)d.C * sizeof(float));
        for (int64_t r = 0; r < d.B * d.Tk; r++) memset(dxkv + r * d.ldk + d.ldk - 2 * d.C, 0, 2 * (size_t)d.C * sizeof(float));
    }
#pragma omp parallel
    {
        size_t scratch = (size_t)(cpu_min64(ATTN_BLOCK, d.Tq) * d.Tk);
        float *P = loom_xmalloc(2 * scratch * sizeof(float)), *dP = P + scratch;
#pragma omp for schedule(static)
        for (int64_t bh = 0; bh < d.B * d.NH; bh++) {
            int64_t off = bh / d.NH * d.Tq * d.C + bh % d.NH * d.hs;
            attn_head a = attn_head_at(xq, xkv, dxq, dxkv, &d, bh);
            attn_head_backward(P, dP, dy + off, o + off, l + bh * d.Tq, &a);
        }
        free(P);
    }
    if (dbias.data) { // the q columns, then the k and v columns: the sums matmul_backward makes of a dqkv
        float *db = cpu_f32(dbias);
        cpu_column_sums(db, dxq, d.B * d.Tq, d.C, d.ldq, !be->grads_write);
        cpu_column_sums(db + d.C, dxkv + d.ldk - 2 * d.C, d.B * d.Tk, 2 * d.C, d.ldk, !be->grads_write);
    }
}

void cpu_attention_merge(loom_backend *be, loom_tensor out, loom_tensor lse, loom_tensor out_part,
                         loom_tensor lse_part, int NH) {
    LOOM_CHECK(out.ndim == 3 && NH > 0 && out.shape[2] % NH == 0);
    int64_t B = out.shape[0], T = out.shape[1], C = out.shape[2], N = B * T;
    LOOM_CHECK(loom_numel(&out_part) == N * C && loom_numel(&lse) == N * NH && loom_numel(&lse_part) == N * NH);
    int64_t hs = C / NH;
    float *o = cpu_f32(out), *l = cpu_f32(lse);
    const float *op = cpu_f32(out_part), *lp = cpu_f32(lse_part);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < N * NH; r++) { // (b, h, t) in lse order
        int64_t bh = r / T, t = r % T, b = bh / NH, h = bh % NH;
        float a = l[r], p = lp[r], m = a > p ? a : p;
        if (m == -INFINITY) continue; // neither side sees a key
        float wa = expf(a - m), wp = expf(p - m), L = m + logf(wa + wp), inv = 1.0f / (wa + wp);
        float *x = o + (b * T + t) * C + h * hs;
        const float *y = op + (b * T + t) * C + h * hs;
#pragma omp simd
        for (int64_t c = 0; c < hs; c++) x[c] = (wa * x[c] + wp * y[c]) * inv;
        l[r] = L;
    }
}
