// DeepSpeed-Ulysses attention over the zigzag layout (context_parallel.h; Jacobs et al. 2023,
// "DeepSpeed Ulysses: System Optimizations for Enabling Training of Extreme Long Sequence
// Transformer Models"). On rank r of P, with C channels of NH heads (Ch = C / P channels, NH / P
// heads of each rank's share) and its rows (2,B,Tc) of every sequence:
//   to heads:    for each rank p, the columns of p's heads (of each of q, k, v) of all of r's
//                rows are packed into piece p (copy_2d), an all-to-all swaps the pieces, and the
//                P pieces received (rank s's two chunks, of r's heads) are placed at their chunks'
//                positions: whole sequences (B,T,3Ch) of r's heads, in order
//   attention:   the backend's causal attention on them (lse (B,NH/P,T) in the model's lse storage,
//                which has the same size)
//   to sequence: the reverse, for the output (B,T,Ch) -> (2,B,Tc,C)
// The backward turns q, k, v, out and dout to heads again (nothing head-split is kept between the
// passes), runs the backend's backward into a zeroed dqkv (B,T,3Ch) and turns it back.
#include "parallel/cp_internal.h"

// Copies rows of w bytes between a (pitch pa) and b (pitch pb): b <- a, or a <- b when `back`.
static void copy_rows(loom_cp *cp, void *a, size_t pa, void *b, size_t pb, size_t w, int64_t rows, bool back) {
    if (back) cp->be->copy_2d(cp->be, a, pa, b, pb, w, (size_t)rows);
    else cp->be->copy_2d(cp->be, b, pb, a, pa, w, (size_t)rows);
}

// Between this rank's rows of all heads, rows (2,B,Tc,K C) (K parts of C columns: 3 for q, k, v;
// 1 for out), and the all-to-all buffer's P pieces (2,B,Tc,K Ch), piece p holding p's heads.
static void by_heads(loom_cp *cp, void *rows, void *pieces, int64_t B, int K, bool back) {
    int64_t C = cp->C, Ch = C / cp->size, piece = B * cp->Tl * K * Ch;
    size_t es = cp->es;
    for (int p = 0; p < cp->size; p++)
        for (int j = 0; j < K; j++)
            copy_rows(cp, cp_at(cp, rows, j * C + p * Ch), (size_t)(K * C) * es, cp_at(cp, pieces, p * piece + j * Ch),
                      (size_t)(K * Ch) * es, (size_t)Ch * es, B * cp->Tl, back);
}

// Between whole sequences of this rank's heads, (B,T,K Ch), and the all-to-all buffer's P pieces
// (2,B,Tc,K Ch), piece s holding rank s's two chunks.
static void by_chunks(loom_cp *cp, void *whole, void *pieces, int64_t B, int K, bool back) {
    int64_t Ch = cp->C / cp->size, Tc = cp->Tc, row = Tc * K * Ch, piece = B * cp->Tl * K * Ch;
    size_t es = cp->es;
    for (int s = 0; s < cp->size; s++)
        for (int h = 0; h < 2; h++)
            copy_rows(cp, cp_at(cp, whole, cp_chunk(cp, s, h) * row), (size_t)(cp->T * K * Ch) * es,
                      cp_at(cp, pieces, s * piece + h * B * row), (size_t)row * es, (size_t)row * es, B, back);
}

static void alltoall(loom_cp *cp, int64_t B, int K) {
    size_t piece = (size_t)(B * cp->Tl * K * (cp->C / cp->size));
    cp_keep(cp, loom_alltoall(cp->comm, cp->send, cp->recv, piece, cp->be->dtype, NULL));
}

// whole (B,T,K Ch): whole sequences of this rank's heads, from rows (2,B,Tc,K C): its two chunks of all heads
static void to_heads(loom_cp *cp, void *whole, const void *rows, int64_t B, int K) {
    by_heads(cp, (void *)rows, cp->send, B, K, false);
    alltoall(cp, B, K);
    by_chunks(cp, whole, cp->recv, B, K, true);
}

// The reverse: rows (2,B,Tc,K C) from whole (B,T,K Ch)
static void to_sequence(loom_cp *cp, void *rows, const void *whole, int64_t B, int K) {
    by_chunks(cp, (void *)whole, cp->send, B, K, false);
    alltoall(cp, B, K);
    by_heads(cp, rows, cp->recv, B, K, true);
}

static int64_t batch_of(const loom_cp *cp, loom_tensor qkv) {
    LOOM_CHECK(qkv.ndim == 3 && qkv.shape[0] <= cp->B && qkv.shape[1] == 2 * cp->Tc && qkv.shape[2] == 3 * cp->C);
    return qkv.shape[0];
}

void cp_ulysses_forward(void *ctx, loom_tensor out, loom_tensor lse, loom_tensor qkv, int NH) {
    loom_cp *cp = ctx;
    loom_backend *be = cp->be;
    int64_t B = batch_of(cp, qkv), T = cp->T, Ch = cp->C / cp->size;
    int NHh = NH / cp->size;
    loom_tensor qkv_h = LOOM_VIEW(cp->qkv_h, be->dtype, B, T, 3 * Ch);
    to_heads(cp, cp->qkv_h, qkv.data, B, 3);
    be->attention_forward(be, LOOM_VIEW(cp->out_h, be->dtype, B, T, Ch), LOOM_VIEW(lse.data, LOOM_F32, B, NHh, T),
                          qkv_h, qkv_h, NHh, LOOM_ATTN_CAUSAL);
    to_sequence(cp, out.data, cp->out_h, B, 1);
}

void cp_ulysses_backward(void *ctx, loom_tensor dqkv, loom_tensor dout, loom_tensor qkv, loom_tensor out,
                         loom_tensor lse, int NH) {
    loom_cp *cp = ctx;
    loom_backend *be = cp->be;
    int64_t B = batch_of(cp, qkv), T = cp->T, Ch = cp->C / cp->size;
    int NHh = NH / cp->size;
    loom_tensor qkv_h = LOOM_VIEW(cp->qkv_h, be->dtype, B, T, 3 * Ch), dqkv_h = LOOM_VIEW(cp->dqkv_h, be->dtype, B, T, 3 * Ch);
    to_heads(cp, cp->qkv_h, qkv.data, B, 3);
    to_heads(cp, cp->out_h, out.data, B, 1);
    to_heads(cp, cp->dout_h, dout.data, B, 1);
    be->attention_backward(be, dqkv_h, dqkv_h, (loom_tensor){0}, LOOM_VIEW(cp->dout_h, be->dtype, B, T, Ch), qkv_h, qkv_h,
                           LOOM_VIEW(cp->out_h, be->dtype, B, T, Ch), LOOM_VIEW(lse.data, LOOM_F32, B, NHh, T), NHh,
                           LOOM_ATTN_CAUSAL);
    to_sequence(cp, dqkv.data, cp->dqkv_h, B, 3);
}
