// Causal multi-head attention, FlashAttention-style on the CPU (FlashAttention-2, Dao 2023):
// the (T,T) score matrix is never stored. Each (batch, head) pair is one task; its query rows
// are taken in blocks of ATTN_BLOCK, and a block [i0,i1) sees only keys [0,i1) (causal: about
// half the work of the full product). Per block, with a per-thread (rows, i1) scratch:
//   forward:  S = Q K^T / sqrt(hs), masked; P = softmax(S) row by row; lse = logsumexp(S);
//             O = P V
//   backward: P = exp(S - lse) recomputed; dP = dO V^T; D = rowsum(dO * O);
//             dS = P * (dP - D); dQ = dS K / sqrt(hs); dK += dS^T Q / sqrt(hs); dV += P^T dO
// All products are cblas_sgemm calls on the strided head columns of qkv (ld 3C) and out/dout
// (ld C); called inside the OpenMP region, OpenBLAS's OpenMP build runs them single-threaded.
#include "backend/cpu/cpu_math.h"
#include "backend/cpu/cpu_ops.h"

#include <cblas.h>
#include <stdlib.h>

#define ATTN_BLOCK 128 // query rows per block

typedef struct { // one (b, h) pair of the batch
    const float *q, *k, *v; // (T,hs) each, row stride ld = 3C
    int64_t T, hs, ld;
    float scale; // 1/sqrt(hs)
} attn_head;

typedef struct { // the shapes of one attention call
    int64_t B, T, C, NH, hs;
} attn_dims;

static attn_dims attn_check(loom_tensor qkv, loom_tensor out, loom_tensor lse, int NH) {
    LOOM_CHECK(qkv.ndim == 3 && qkv.shape[0] > 0 && qkv.shape[1] > 0);
    LOOM_CHECK(NH > 0 && qkv.shape[2] > 0 && qkv.shape[2] % (3 * NH) == 0);
    attn_dims d = {qkv.shape[0], qkv.shape[1], qkv.shape[2] / 3, NH, qkv.shape[2] / (3 * NH)};
    LOOM_CHECK(loom_rows(&out) == d.B * d.T && loom_cols(&out) == d.C);
    LOOM_CHECK(loom_numel(&lse) == d.B * d.NH * d.T);
    return d;
}

static attn_head attn_head_at(const float *qkv, attn_dims d, int64_t b, int64_t h) {
    const float *q = qkv + b * d.T * 3 * d.C + h * d.hs;
    return (attn_head){q, q + d.C, q + 2 * d.C, d.T, d.hs, 3 * d.C, 1.0f / sqrtf((float)d.hs)};
}

// S (i1-i0, i1) = scale * Q[i0:i1) K[0:i1)^T, row stride i1 (the mask is left to the caller)
static void attn_scores(float *S, const attn_head *a, int64_t i0, int64_t i1) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(i1 - i0), (int)i1, (int)a->hs,
                a->scale, a->q + i0 * a->ld, (int)a->ld, a->k, (int)a->ld, 0.0f, S, (int)i1);
}

// One head's forward: o (T,hs) row stride C, lse (T)
static void attn_head_forward(float *S, float *o, float *lse, const attn_head *a, int64_t C) {
    for (int64_t i0 = 0; i0 < a->T; i0 += ATTN_BLOCK) {
        int64_t i1 = cpu_min64(i0 + ATTN_BLOCK, a->T);
        attn_scores(S, a, i0, i1);
        for (int64_t i = i0; i < i1; i++) { // query i sees keys [0, i]
            float *s = S + (i - i0) * i1, m = -INFINITY, sum = 0.0f;
#pragma omp simd reduction(max : m)
            for (int64_t j = 0; j <= i; j++) m = s[j] > m ? s[j] : m;
#pragma omp simd reduction(+ : sum)
            for (int64_t j = 0; j <= i; j++) {
                s[j] = cpu_expf(s[j] - m);
                sum += s[j];
            }
            float inv = 1.0f / sum;
#pragma omp simd
            for (int64_t j = 0; j <= i; j++) s[j] *= inv;
            for (int64_t j = i + 1; j < i1; j++) s[j] = 0.0f;
            lse[i] = m + logf(sum);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(i1 - i0), (int)a->hs, (int)i1,
                    1.0f, S, (int)i1, a->v, (int)a->ld, 0.0f, o + i0 * C, (int)C);
    }
}

void cpu_attention_forward(loom_backend *be, loom_tensor out, loom_tensor lse, loom_tensor qkv,
                           int NH) {
    attn_dims d = attn_check(qkv, out, lse, NH);
    const float *x = cpu_f32(qkv); // (B,T,3C)
    float *o = cpu_f32(out), *l = cpu_f32(lse); // (B,T,C), (B,NH,T)
#pragma omp parallel
    {
        float *S = loom_xmalloc((size_t)(cpu_min64(ATTN_BLOCK, d.T) * d.T) * sizeof(float));
#pragma omp for schedule(static)
        for (int64_t bh = 0; bh < d.B * d.NH; bh++) {
            int64_t b = bh / d.NH, h = bh % d.NH;
            attn_head a = attn_head_at(x, d, b, h);
            attn_head_forward(S, o + b * d.T * d.C + h * d.hs, l + bh * d.T, &a, d.C);
        }
        free(S);
    }
}

// One head's backward: dq, dk, dv (T,hs) row stride 3C, all overwritten; dout, o (T,hs) row
// stride C. Blocks run last to first: the last block sees every key, so its dK/dV products
// overwrite (beta 0) and the earlier blocks' add to them.
static void attn_head_backward(float *P, float *dP, float *dq, const float *dout, const float *o,
                               const float *lse, const attn_head *a, int64_t C) {
    float *dk = dq + (a->k - a->q), *dv = dq + (a->v - a->q);
    float beta = 0.0f;
    int64_t nblk = (a->T + ATTN_BLOCK - 1) / ATTN_BLOCK;
    for (int64_t blk = nblk - 1; blk >= 0; blk--) {
        int64_t i0 = blk * ATTN_BLOCK, i1 = cpu_min64(i0 + ATTN_BLOCK, a->T);
        int nq = (int)(i1 - i0), n = (int)i1, hs = (int)a->hs, ld = (int)a->ld;
        attn_scores(P, a, i0, i1);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, n, hs, 1.0f, dout + i0 * C, (int)C,
                    a->v, ld, 0.0f, dP, n);
        for (int64_t i = i0; i < i1; i++) {
            float *p = P + (i - i0) * i1, *dp = dP + (i - i0) * i1, D = 0.0f, l = lse[i];
            const float *doi = dout + i * C, *oi = o + i * C;
#pragma omp simd reduction(+ : D)
            for (int64_t c = 0; c < a->hs; c++) D += doi[c] * oi[c];
#pragma omp simd
            for (int64_t j = 0; j <= i; j++) {
                p[j] = cpu_expf(p[j] - l);
                dp[j] = p[j] * (dp[j] - D);
            }
            for (int64_t j = i + 1; j < i1; j++) p[j] = dp[j] = 0.0f;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, hs, n, a->scale, dP, n, a->k, ld,
                    0.0f, dq + i0 * a->ld, ld);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hs, nq, a->scale, dP, n,
                    a->q + i0 * a->ld, ld, beta, dk, ld);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hs, nq, 1.0f, P, n, dout + i0 * C,
                    (int)C, beta, dv, ld);
        beta = 1.0f;
    }
}

void cpu_attention_backward(loom_backend *be, loom_tensor dqkv, loom_tensor dout, loom_tensor qkv,
                            loom_tensor out, loom_tensor lse, int NH) {
    attn_dims d = attn_check(qkv, out, lse, NH);
    const float *x = cpu_f32(qkv), *dy = cpu_f32(dout), *o = cpu_f32(out); // (B,T,3C), (B,T,C) x2
    const float *l = cpu_f32(lse); // (B,NH,T)
    float *dx = cpu_f32(dqkv); // (B,T,3C) =
    LOOM_CHECK(loom_numel(&dqkv) == loom_numel(&qkv) && loom_numel(&dout) == loom_numel(&out));
#pragma omp parallel
    {
        size_t scratch = (size_t)(cpu_min64(ATTN_BLOCK, d.T) * d.T);
        float *P = loom_xmalloc(2 * scratch * sizeof(float)), *dP = P + scratch;
#pragma omp for schedule(static)
        for (int64_t bh = 0; bh < d.B * d.NH; bh++) {
            int64_t b = bh / d.NH, h = bh % d.NH, off = b * d.T * d.C + h * d.hs;
            attn_head a = attn_head_at(x, d, b, h);
            attn_head_backward(P, dP, dx + (a.q - x), dy + off, o + off, l + bh * d.T, &a, d.C);
        }
        free(P);
    }
}
