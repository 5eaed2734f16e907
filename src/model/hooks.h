// Where parallelism enters a model (DESIGN principle 1): the model's code is written once for
// one device and calls these at fixed points; src/parallel registers what they do.
//
// Hooks, by layer (-1 the embeddings, 0..L-1 the blocks, L the final norm and output layer):
//   LOOM_HOOK_FORWARD    before a layer's forward
//   LOOM_HOOK_BACKWARD   before a layer's backward
//   LOOM_HOOK_GRADS      when a layer's parameter gradients are final for this micro-batch
//                        (backward runs L, L-1, ..., 0, -1), so their reduction can start
//                        while backward goes on (data-parallel buckets, sequence-parallel sums)
// run in the order they were added.
//
// Tensor-parallel points (Megatron-LM's conjugate f and g operators, Shoeybi et al. 2019, and
// the all-gather / reduce-scatter of sequence parallelism, Korthikanti et al. 2022). The model
// keeps the residual stream on its rows (Nl = N / row_shards of the N = B x T tokens, each rank
// a contiguous block of rows) and runs the tensor-parallel layers on all N rows:
//   gather(full (N,C), local (Nl,C)):  before a column-parallel layer (f's forward) and after
//       a row-parallel layer in backward (g's backward); local is this rank's rows of full (a
//       view into it): the identity when they are all the rows (no sequence parallelism), else
//       an all-gather of the rows;
//   reduce(local (Nl,C), full (N,C)):  after a row-parallel layer's partial product (g's
//       forward) and before a column-parallel layer's input gradient leaves it (f's backward):
//       an all-reduce in place on local when it has all the rows (the model copied full there
//       first when they are different buffers), else a reduce-scatter of the rows;
//   crossentropy: the loss over logits whose vocabulary is split (Megatron's vocabulary-parallel
//       cross-entropy), with the contract of loom_backend.softmax_crossentropy on the local
//       columns [vocab_start, vocab_start + Vl) of the padded vocabulary;
//   gather_vocab: a row of local logits (1,Vl) into all Vp logits on the host (sampling).
// With no points set (one device) every point is the identity and the fused op computes the loss;
// without a reduce point the model adds the residuals inside the row-parallel layers' products
// (the backend's matmul_residual_forward and mlp_forward's res), which with one it adds after it.
//
// Context-parallel points (ring attention, Liu et al. 2023; DeepSpeed-Ulysses, Jacobs et al.
// 2023): the sequences of a micro-batch are split into `chunks` equal chunks and this rank holds
// `parts` of them. Its T rows per sequence are then `parts` blocks of (B, T/parts) rows (all B
// sequences' first chunk, then their second, ...), block k holding positions
// [chunk[k] T/parts, (chunk[k] + 1) T/parts) of each sequence: the model embeds each block at
// its positions, and attention, the one layer that needs the other chunks, goes through
//   attention_forward(out (B,T,Cl), lse, qkv (B,T,3Cl), NHl): the attention of the local queries
//       over the whole sequences; lse is (B,NHl,T) fp32 storage the point may use as it likes
//   attention_backward(dqkv (B,T,3Cl) =, dout, qkv, out, lse, NHl): from what the forward left
// Unset (parts 0): whole sequences, and the backend's causal attention.
#pragma once
#include "core/tensor.h"

#include <stdbool.h>

typedef enum { LOOM_HOOK_FORWARD, LOOM_HOOK_BACKWARD, LOOM_HOOK_GRADS, LOOM_HOOK_KINDS } loom_hook_kind;
enum { LOOM_MAX_HOOKS = 4 }; // per kind

typedef void (*loom_hook_fn)(void *ctx, int layer);

typedef struct {
    struct {
        loom_hook_fn fn;
        void *ctx;
    } at[LOOM_HOOK_KINDS][LOOM_MAX_HOOKS];
    int n[LOOM_HOOK_KINDS];
} loom_hooks;

// Adds fn(ctx, layer) to the hooks of `kind` (after those already there).
void loom_hooks_add(loom_hooks *h, loom_hook_kind kind, loom_hook_fn fn, void *ctx);
void loom_hooks_run(const loom_hooks *h, loom_hook_kind kind, int layer);

typedef struct {
    void *ctx;
    void (*gather)(void *ctx, loom_tensor full, loom_tensor local);
    void (*reduce)(void *ctx, loom_tensor local, loom_tensor full);
    // losses (N) fp32; logits (N,Vl) overwritten with dlogits when backward; targets (N) int32
    void (*crossentropy)(void *ctx, loom_tensor losses, loom_tensor logits, loom_tensor targets,
                         int vocab_start, int V, float dloss, bool backward);
    // logits (1,Vl) -> host (Vp) fp32
    void (*gather_vocab)(void *ctx, float *host, loom_tensor logits);
} loom_tp_points;

enum { LOOM_CP_MAX_PARTS = 2 };
typedef struct {
    void *ctx;
    int parts, chunks;
    int chunk[LOOM_CP_MAX_PARTS];
    void (*attention_forward)(void *ctx, loom_tensor out, loom_tensor lse, loom_tensor qkv, int NH);
    void (*attention_backward)(void *ctx, loom_tensor dqkv, loom_tensor dout, loom_tensor qkv, loom_tensor out,
                               loom_tensor lse, int NH);
} loom_cp_points;
