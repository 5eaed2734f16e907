// GPT-2 (Radford et al. 2019): learned position embeddings, pre-LayerNorm blocks of causal
// multi-head attention and a GELU MLP, final LayerNorm, output layer tied to the token
// embedding. Forward and hand-written backward written once against the backend op
// interface (backend/backend.h), after llm.c's train_gpt2.c.
//
// Memory: parameters and gradients are each one flat buffer ordered as the parameter table
// (gpt2_params.h); activations are one flat buffer sized for at most max_B x max_T tokens,
// re-viewed for the (B, T) of each call. The output layer runs over row chunks of (B*T) so the
// (B*T, Vp) logits are never all in memory: each chunk's loss and gradient are computed
// together (fused softmax + cross-entropy) and its gradient is pushed into wte and the final
// LayerNorm's input gradient at once.
#pragma once
#include "backend/backend.h"
#include "model/gpt2_params.h"

#include <stdbool.h>

// Forward activations; per-layer tensors carry a leading layer dim (1 when not training: the
// layers then reuse one slot, as inference needs no activations for backward).
typedef struct {
    loom_tensor tokens, targets;             // (B,T) int32
    loom_tensor encoded;                     // (B,T,C)
    loom_tensor ln1, ln1_mean, ln1_rstd;     // (L,B,T,C), (L,B,T) fp32, (L,B,T) fp32
    loom_tensor qkv;                         // (L,B,T,3C)
    loom_tensor atty;                        // (L,B,T,C) attention output before projection
    loom_tensor att_lse;                     // (L,B,NH,T) fp32
    loom_tensor residual2;                   // (L,B,T,C) residual + attention projection
    loom_tensor ln2, ln2_mean, ln2_rstd;     // (L,B,T,C), (L,B,T), (L,B,T)
    loom_tensor fch, fch_gelu;               // (L,B,T,4C)
    loom_tensor residual3;                   // (L,B,T,C) block output
    loom_tensor proj;                        // (B,T,C) attproj / fcproj output before the add
    loom_tensor lnf, lnf_mean, lnf_rstd;     // (B,T,C), (B,T), (B,T)
    loom_tensor logits;                      // (chunk,Vp) one chunk of output rows
    loom_tensor losses;                      // (B*T) fp32 per-token loss
} loom_gpt2_acts;

// Activation gradients used during backward (reused by every layer).
typedef struct {
    loom_tensor dresidual; // (B,T,C) gradient of the residual stream
    loom_tensor dbtc;      // (B,T,C) scratch: dlnf, dln2, datty, dln1
    loom_tensor dqkv;      // (B,T,3C)
    loom_tensor dfch;      // (B,T,4C)
} loom_gpt2_grad_acts;

// Activation recomputation (Chen et al. 2016, "Training Deep Nets with Sublinear Memory
// Cost"; Korthikanti et al. 2022 for the selective form): what backward recomputes instead of
// keeping from the forward pass. Gradients are bit-identical in every mode.
typedef enum {
    LOOM_RECOMPUTE_NONE, // keep every activation: (L,B,T,...) for each block tensor
    LOOM_RECOMPUTE_GELU, // recompute gelu(fch) per layer: saves L*B*T*4C values
    LOOM_RECOMPUTE_FULL, // keep block outputs only, re-run each block's forward in backward
} loom_recompute;

// "none", "gelu" or "full". Errors: LOOM_EINVAL naming the unknown mode.
loom_status loom_recompute_parse(const char *name, loom_recompute *mode);

typedef struct {
    loom_gpt2_config cfg;
    loom_backend *be;
    loom_param_spec specs[LOOM_GPT2_NUM_TENSORS];
    int64_t num_elements;  // parameters in the flat buffer, vocabulary padding included
    void *params;          // (num_elements) be->dtype
    void *grads;           // (num_elements) be->dtype, NULL unless allocated for training
    loom_tensor p[LOOM_GPT2_NUM_TENSORS], g[LOOM_GPT2_NUM_TENSORS]; // views into the two
    int max_B, max_T;      // activation capacity
    loom_recompute recompute; // set before loom_gpt2_alloc (default: none)
    bool training;         // activations kept for backward, gradients allocated
    void *acts_mem, *grad_acts_mem;
    int logits_chunk;      // rows of the output layer per chunk
    // Optional: called during backward each time a stage's gradients are final (stages as in
    // loom_param_spec.grad_stage: L after the final LayerNorm, l after block l, -1 after the
    // embeddings), so data parallelism can start reducing them while backward goes on.
    void (*grads_ready)(void *ctx, int stage);
    void *grads_ready_ctx;
} loom_gpt2;

// Creates a model with zeroed parameters on `be`. Errors: LOOM_EINVAL (invalid config),
// LOOM_ENOMEM (the parameter buffer does not fit).
loom_status loom_gpt2_create(loom_gpt2 **out, loom_backend *be, const loom_gpt2_config *cfg);
void loom_gpt2_free(loom_gpt2 *m);
// GPT-2 initialisation from (seed, tensor, element) (see gpt2_params.h).
void loom_gpt2_init(loom_gpt2 *m, uint64_t seed);
// Copies all parameters from/to host fp32 arrays of num_elements values (table order),
// converting to and from the backend's dtype.
void loom_gpt2_set_params(loom_gpt2 *m, const float *host);
void loom_gpt2_get_params(loom_gpt2 *m, float *host);
void loom_gpt2_get_grads(loom_gpt2 *m, float *host);

// Sizes the activations for micro-batches of up to B x T tokens; training also allocates the
// gradients (zeroed). Errors: LOOM_EINVAL if T exceeds the model's max_seq_len or B, T < 1;
// LOOM_ENOMEM.
loom_status loom_gpt2_alloc(loom_gpt2 *m, int B, int T, bool training);
// Bytes of parameters, gradients and activations currently allocated.
size_t loom_gpt2_memory_bytes(const loom_gpt2 *m);

// Mean cross-entropy loss (nats/token) of next-token prediction on one micro-batch.
//   inputs, targets: host int32 (B,T), ids in [0,V); B <= max_B, T <= max_T.
double loom_gpt2_loss(loom_gpt2 *m, const int32_t *inputs, const int32_t *targets, int B, int T);
// Forward and backward on one micro-batch: returns the mean loss and adds
// grad_scale * d(mean loss)/d(params) into m->grads (grad_scale = 1/accumulation steps).
// Needs loom_gpt2_alloc(..., training=true).
double loom_gpt2_forward_backward(loom_gpt2 *m, const int32_t *inputs, const int32_t *targets,
                                  int B, int T, float grad_scale);
void loom_gpt2_zero_grads(loom_gpt2 *m);
// Logits (Vp floats, host) of the next token after the T tokens of one sequence (B = 1).
void loom_gpt2_next_logits(loom_gpt2 *m, const int32_t *tokens, int T, float *logits);
