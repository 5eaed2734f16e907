// Private to src/parallel/context_parallel.c, cp_ring.c and cp_ulysses.c: the context-parallel
// object and what the two styles share.
#pragma once
#include "parallel/context_parallel.h"

struct loom_cp {
    loom_comm *comm; // the cp group, for the backend's buffers
    loom_backend *be;
    loom_cp_style style;
    int rank, size;      // in the cp group
    int B, T, Tl, Tc;    // micro-batch, sequence, this rank's rows per sequence (2 Tc), chunk
    int C, NH;           // channels and heads of this rank's attention (its tp shard)
    size_t es;           // bytes of an element of be->dtype
    // ring: keys/values (2,B,Tc,2C) travelling (two, one being received while the other is
    // used) and their gradients (three: sent, received, this rank's); a partial output and lse
    void *kv[2], *dkv[3], *part_out;
    float *part_lse;
    // ulysses: all-to-all buffers (B Tl 3C each) and the head-split q/k/v, out, dout, dqkv
    void *send, *recv, *qkv_h, *out_h, *dout_h, *dqkv_h;
    int32_t *tokens; // host (B,T): a micro-batch's tokens before loom_cp_take_chunks
    size_t bytes;    // of the backend's memory above
    loom_status error;
};

// The chunk of every sequence that block h (0, 1) of rank `rank` holds.
static inline int cp_chunk(const loom_cp *cp, int rank, int h) { return h ? 2 * cp->size - 1 - rank : rank; }
// (char *) p + n elements of be->dtype
static inline void *cp_at(const loom_cp *cp, const void *p, int64_t n) { return (char *)p + (size_t)n * cp->es; }
// Keeps the first failure for loom_cp_error.
void cp_keep(loom_cp *cp, loom_status s);

// The model's points, per style (contracts in model/hooks.h).
void cp_ring_forward(void *ctx, loom_tensor out, loom_tensor lse, loom_tensor qkv, int NH);
void cp_ring_backward(void *ctx, loom_tensor dqkv, loom_tensor dout, loom_tensor qkv, loom_tensor out, loom_tensor lse,
                      int NH);
void cp_ulysses_forward(void *ctx, loom_tensor out, loom_tensor lse, loom_tensor qkv, int NH);
void cp_ulysses_backward(void *ctx, loom_tensor dqkv, loom_tensor dout, loom_tensor qkv, loom_tensor out,
                         loom_tensor lse, int NH);
