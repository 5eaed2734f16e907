// Private to src/model/gpt2*.c: the views of one call's activations and the helpers the passes
// share.
#pragma once
#include "model/gpt2.h"

// Everything one forward or backward call works on: the slot's activations, the scratch all
// slots share, and (training) the gradient scratch.
typedef struct {
    int slot;
    int64_t B, T, N, Nl;     // tokens (N = B*T) and the residual-stream rows this rank holds
    int first, nblocks;      // the chunk's blocks
    bool embed, head;        // whether the chunk starts with the embedding, ends with the head
    loom_gpt2_acts a;        // the slot
    loom_tensor logits;      // (chunk,Vl) one chunk of output rows
    loom_tensor proj;        // (N,C) partial products of the row-parallel layers and the embedding
    loom_tensor proj_local;  // (Nl,C) their reduced rows (proj itself when the rows are not split)
    loom_tensor dfull, dres; // (N,C) the residual stream's gradient on all rows; (Nl,C) this rank's rows of it
    loom_tensor dbtc, dlocal; // (N,C) scratch (dlnf, dln2, datty, dln1 on all rows); (Nl,C) its reduced rows (dbtc itself when not split)
    loom_tensor dqkv, dfch;  // (B,T,3Cl), (N,4Cl)
} gpt2_views;

// The views of slot `slot` for its micro-batch on chunk `chunk` (gradient views only when
// training).
gpt2_views gpt2_views_of(const loom_gpt2 *m, int slot, int chunk);
// Tensor k (B_*) of block l, its gradient, and the view a forward adds it through (empty when
// this shard does not add it: the bias of a row-parallel layer on tp ranks other than 0).
loom_tensor gpt2_param(const loom_gpt2 *m, int l, int k);
loom_tensor gpt2_grad(const loom_gpt2 *m, int l, int k);
loom_tensor gpt2_applied(const loom_gpt2 *m, int l, int k);
// This rank's rows (Nl) of an all-rows tensor (N,...).
loom_tensor gpt2_mine(const loom_gpt2 *m, const gpt2_views *v, loom_tensor full);

// The rows of each of the equal chunks that N rows split into, at most `most` rows a chunk (the
// last may have fewer): how the head walks the output layer's rows, and so what its logits buffer holds.
static inline int64_t gpt2_equal_chunk(int64_t N, int64_t most) {
    int64_t nchunks = (N + most - 1) / most;
    return (N + nchunks - 1) / nchunks;
}

// The mean loss over the views' N tokens, read back from the slot's losses (after the head).
double gpt2_mean_loss(loom_gpt2 *m, const gpt2_views *v);

// Whether the backward writes the blocks' LayerNorm outputs again (--recompute selective, unless
// a split backward or offloaded activations keep each block's: then as gelu). They then share one
// buffer (gpt2.h's ln1, ln2), block i's view GPT2_NORM_SHIFT bytes times i into it: the views
// overlap, but each has an address of its own, by which a backend knows the copy it kept of it
// (backend.h's input_kept). The shift is a multiple of 16 (vector loads), of the dtype sizes, and
// of 256 (cuBLASLt's alignment).
bool gpt2_norms_recomputed(const loom_gpt2 *m);
enum { GPT2_NORM_SHIFT = 256 };

// ---- activation offloading (gpt2_offload.c; gpt2.h's offload_activations) ----
typedef struct gpt2_offload gpt2_offload;
// Blocks per slot whose saved activations stay on the backend (the leading dim of the slot's
// per-block tensors when offloading).
enum { GPT2_OFFLOAD_RESIDENT = 3 };
// The host copies of every slot, sized from one slot's views at max_B x max_T (nothing unless
// training with offload_activations and more blocks per chunk than stay resident). Errors:
// LOOM_ENOMEM.
loom_status gpt2_offload_alloc(loom_gpt2 *m, const loom_gpt2_acts *max_slot);
void gpt2_offload_free(loom_gpt2 *m);
// The host bytes gpt2_offload_alloc would take for slots laid out as max_slot (offloading on).
size_t gpt2_offload_plan(const loom_gpt2 *m, const loom_gpt2_acts *max_slot);
size_t gpt2_offload_bytes(const loom_gpt2 *m); // host memory held
// Around block i (of the chunk, 0-based) of the views' slot: before its forward writes its
// resident copy, after that forward, and before its backward (blocks i and i-1 resident).
void gpt2_offload_before_forward(loom_gpt2 *m, const gpt2_views *v, int i);
void gpt2_offload_after_forward(loom_gpt2 *m, const gpt2_views *v, int i);
void gpt2_offload_before_backward(loom_gpt2 *m, const gpt2_views *v, int i);
