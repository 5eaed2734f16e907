// Private to the CPU backend: the ops that cpu_backend.c puts in the loom_backend table (their
// contracts are in backend/backend.h) and the helpers they share.
#pragma once
#include "backend/backend.h"

// fp32 / int32 data of a view, checking its dtype.
static inline float *cpu_f32(loom_tensor t) {
    LOOM_CHECK(t.dtype == LOOM_F32);
    return (float *)t.data;
}
static inline int32_t *cpu_i32(loom_tensor t) {
    LOOM_CHECK(t.dtype == LOOM_I32);
    return (int32_t *)t.data;
}
static inline int64_t cpu_min64(int64_t a, int64_t b) { return a < b ? a : b; }
// The index of vocabulary entry v (a token or a target) in a vocabulary shard of n entries
// from vocab_start (the vocabulary-parallel ops), or -1 when it lies outside the shard.
static inline int64_t cpu_shard_index(int64_t v, int vocab_start, int64_t n) {
    int64_t j = v - vocab_start;
    return j >= 0 && j < n ? j : -1;
}

// Deterministic column reductions (reduce.c): a reduction over the rows of an (N, n) array is
// done as partial sums over fixed chunks of CPU_ROW_CHUNK rows (one chunk per task, any
// thread), then cpu_add_partials adds the chunks' sums in chunk order. Neither step depends on
// the thread count, so the result repeats bit for bit under any OMP_NUM_THREADS.
#define CPU_ROW_CHUNK 128
static inline int64_t cpu_row_chunks(int64_t rows) {
    return (rows + CPU_ROW_CHUNK - 1) / CPU_ROW_CHUNK;
}
// dst[i] += (add) or = (not add) the sum over p in [0, nparts) in order of partials[p * stride + i],
// for i in [0, n)
void cpu_add_partials(float *dst, const float *partials, int64_t nparts, int64_t stride, int64_t n, bool add);
// dst (n) += (add) or = the column sums of x (N rows of n columns, row stride ld), chunked as above
// (the bias gradients: a column's sum does not depend on the other columns summed with it)
void cpu_column_sums(float *dst, const float *x, int64_t N, int64_t n, int64_t ld, bool add);

void cpu_encoder_forward(loom_backend *be, loom_tensor out, loom_tensor tokens, loom_tensor wte,
                         loom_tensor wpe, int vocab_start);
void cpu_encoder_backward(loom_backend *be, loom_tensor dwte, loom_tensor dwpe, loom_tensor dout,
                          loom_tensor tokens, int vocab_start);
void cpu_layernorm_forward(loom_backend *be, loom_tensor out, loom_tensor mean, loom_tensor rstd,
                           loom_tensor inp, loom_tensor w, loom_tensor b);
void cpu_layernorm_backward(loom_backend *be, loom_tensor dinp, loom_tensor dw, loom_tensor db, loom_tensor dsum,
                            loom_tensor dout, loom_tensor inp, loom_tensor w, loom_tensor mean,
                            loom_tensor rstd);
void cpu_matmul_forward(loom_backend *be, loom_tensor out, loom_tensor inp, loom_tensor w,
                        loom_tensor bias);
void cpu_matmul_backward(loom_backend *be, loom_tensor dinp, loom_tensor dw, loom_tensor dbias,
                         loom_tensor dout, loom_tensor inp, loom_tensor w);
void cpu_attention_forward(loom_backend *be, loom_tensor out, loom_tensor lse, loom_tensor q, loom_tensor kv,
                           int NH, loom_attn_span span);
void cpu_attention_backward(loom_backend *be, loom_tensor dq, loom_tensor dkv, loom_tensor dbias, loom_tensor dout,
                            loom_tensor q, loom_tensor kv, loom_tensor out, loom_tensor lse, int NH,
                            loom_attn_span span);
void cpu_attention_merge(loom_backend *be, loom_tensor out, loom_tensor lse, loom_tensor out_part,
                         loom_tensor lse_part, int NH);
void cpu_gelu_forward(loom_backend *be, loom_tensor out, loom_tensor inp);
void cpu_gelu_backward(loom_backend *be, loom_tensor dinp, loom_tensor inp, loom_tensor dout);
void cpu_residual_forward(loom_backend *be, loom_tensor out, loom_tensor a, loom_tensor b);
void cpu_matmul_gelu_forward(loom_backend *be, loom_tensor out, loom_tensor pre, loom_tensor inp,
                             loom_tensor w, loom_tensor bias);
void cpu_matmul_gelu_backward(loom_backend *be, loom_tensor dinp, loom_tensor dw, loom_tensor dbias,
                              loom_tensor dout, loom_tensor inp, loom_tensor w, loom_tensor pre);
void cpu_residual_layernorm_forward(loom_backend *be, loom_tensor res, loom_tensor out,
                                    loom_tensor mean, loom_tensor rstd, loom_tensor a, loom_tensor b,
                                    loom_tensor w, loom_tensor bias);
void cpu_softmax_crossentropy(loom_backend *be, loom_tensor losses, loom_tensor logits,
                              loom_tensor targets, int V, float dloss, bool backward);
void cpu_crossentropy_partial(loom_backend *be, loom_tensor partial, loom_tensor logits,
                              loom_tensor targets, int vocab_start, int V);
void cpu_crossentropy_combine(loom_backend *be, loom_tensor losses, loom_tensor lse,
                              loom_tensor partials);
void cpu_crossentropy_backward(loom_backend *be, loom_tensor logits, loom_tensor lse,
                               loom_tensor targets, int vocab_start, int V, float dloss);
void cpu_adamw_update(loom_backend *be, loom_tensor param, loom_tensor master, loom_tensor grad,
                      loom_tensor m, loom_tensor v, loom_adamw_args args);
void cpu_step_scalars(loom_backend *be, loom_step_scalars *sc, loom_tensor losses, float max_norm);
double cpu_sumsq(loom_backend *be, loom_tensor x);
void cpu_sumsq_add(loom_backend *be, double *acc, loom_tensor x);
