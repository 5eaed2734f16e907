// Straightforward double-precision references for the backend ops, written independently of
// src/backend/cpu (naive loops; attention through the full masked (T,T) softmax and its
// textbook backward dS = P * (dP - rowsum(P * dP))). Inputs and outputs are fp32 arrays;
// "+=" outputs add to what is there, as the backend's do.
#pragma once
#include <stdint.h>

// out (B,T,C) = wte[tok] + wpe[t];  dwte (Vp,C) +=, dwpe (maxT,C) +=
void ref_encoder_forward(float *out, const int32_t *tok, const float *wte, const float *wpe, int B,
                         int T, int C);
void ref_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tok, int B,
                          int T, int C);
// out (N,C), mean (N), rstd (N);  dinp (N,C) +=, dw (C) +=, db (C) +=
void ref_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                           const float *b, int N, int C);
void ref_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                            const float *w, int N, int C);
// dst (n) += the column sums of x (N,n): a bias gradient
void ref_column_sums(float *dst, const float *x, int N, int n);
// out (N,OC) = inp (N,C) w^T + bias (bias may be NULL);  dinp =, dw +=, dbias += (may be NULL)
void ref_matmul_forward(float *out, const float *inp, const float *w, const float *bias, int N,
                        int C, int OC);
void ref_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                         const float *w, int N, int C, int OC);
// qkv (B,T,3C), out (B,T,C), lse (B,NH,T);  dqkv (B,T,3C) =
void ref_attention_forward(float *out, float *lse, const float *qkv, int B, int T, int C, int NH);
void ref_attention_backward(float *dqkv, const float *dout, const float *qkv, int B, int T, int C,
                            int NH);
// elementwise over n
void ref_gelu_forward(float *out, const float *inp, int64_t n);
void ref_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t n);
// losses (N); dlogits (N,Vp) = dloss * (softmax - onehot) on [0,V), 0 on [V,Vp) (NULL: skip)
void ref_crossentropy(float *losses, float *dlogits, const float *logits, const int32_t *targets,
                      int N, int V, int Vp, float dloss);
// one vocabulary shard's (max, sum of exp(z - max), target logit or 0) per row (N,3), over the
// columns j of logits (N,Vl) with vocab_start + j < V (-INFINITY, 0 when there are none)
void ref_crossentropy_partial(float *partial, const float *logits, const int32_t *targets, int N,
                              int Vl, int vocab_start, int V);
