// GPT-2 (Radford et al. 2019): learned position embeddings, pre-LayerNorm blocks of causal
// multi-head attention and a GELU MLP, final LayerNorm, output layer tied to the token
// embedding. Forward and hand-written backward written once against the backend op
// interface (backend/backend.h), after llm.c's train_gpt2.c.
//
// A model object holds one pipeline stage (loom_stage: one or more chunks of blocks, plus the
// embedding on the first stage and the head on the last; a single process is one stage of one
// chunk holding everything) as one tensor-parallel shard (the parameter table's shard specs decide the local
// shapes; the layers run on whatever shards they are given). Parallelism enters only through
// the hooks and the tensor-parallel points of model/hooks.h.
//
// Memory: parameters and gradients are each one flat buffer in the parameter table's
// layer-major order; activations live in `slots` (micro-batches in flight, each sized for
// max_B x max_T tokens and re-viewed for the (B, T) of each call) plus scratch shared by the
// slots. The output layer runs over row chunks of the N = B*T tokens so the (N, Vp) logits are
// never all in memory: each chunk's loss and gradient are computed together (fused softmax +
// cross-entropy) and its gradient is pushed into wte and the final LayerNorm's input gradient
// at once.
//
// Shapes below: N = B*T tokens, Nl = N / row_shards the residual-stream rows this rank holds,
// Cl = C / tp the attention and MLP width of this shard (4Cl the MLP's), NHl its heads, Vl its
// vocabulary rows, nb the blocks of a chunk (the most of any of the stage's chunks).
#pragma once
#include "backend/backend.h"
#include "model/gpt2_params.h"
#include "model/hooks.h"

#include <stdbool.h>

// Activations of one slot; per-block tensors carry a leading block dim (1 when not training or
// when recomputed: the blocks then reuse one slot).
typedef struct {
    loom_tensor tokens, targets;             // (B,T) int32
    loom_tensor encoded;                     // (Nl,C) the first block's input
    loom_tensor ln1, ln1_mean, ln1_rstd;     // (nb,N,C) all rows, (nb,Nl) fp32, (nb,Nl) fp32; ln1 and
                                             // ln2 (1,N,C) under --recompute selective (gpt2_forward.c)
    loom_tensor qkv;                         // (nb,N,3Cl)
    loom_tensor atty;                        // (nb,N,Cl) attention output before projection
    loom_tensor att_lse;                     // (nb,B,NHl,T) fp32
    loom_tensor residual2;                   // (nb,Nl,C) residual + attention projection
    loom_tensor ln2, ln2_mean, ln2_rstd;     // (nb,N,C), (nb,Nl), (nb,Nl)
    loom_tensor fch, fch_gelu;               // (nb,N,4Cl)
    loom_tensor residual3;                   // (nb,Nl,C) block outputs
    loom_tensor lnf, lnf_mean, lnf_rstd;     // (N,C), (Nl), (Nl)
    loom_tensor dlnf;                        // (Nl,C) d loss / d lnf's input rows, from the head
    loom_tensor losses;                      // (N) fp32 per-token loss
    // split backward only: the gradients of the matmuls' outputs, kept from the input-gradient
    // pass to the weight-gradient pass
    loom_tensor dfcproj, dattproj;           // (nb,N,C) of the two projections
    loom_tensor dfch, dqkv;                  // (nb,N,4Cl), (nb,B,T,3Cl)
} loom_gpt2_acts;

// Activation recomputation (Chen et al. 2016, "Training Deep Nets with Sublinear Memory
// Cost"; Korthikanti et al. 2022 for the selective form): what backward recomputes instead of
// keeping from the forward pass. Gradients are bit-identical in every mode.
typedef enum {
    LOOM_RECOMPUTE_NONE, // keep every activation: (nb,...) for each block tensor
    LOOM_RECOMPUTE_GELU, // recompute gelu(fch) per block: saves nb*N*4Cl values
    // also the two LayerNorm outputs (ln1, ln2), from their inputs and statistics, as Megatron-LM's
    // --recompute-modules layernorm: saves (nb-1)*2*N*C values more for two LayerNorms a block in
    // backward, which a backend that kept its own copy of a linear layer's input for that layer's
    // backward (backend.h's input_kept: FP8's transposed copies) spares; as gelu with a split
    // backward or offloaded activations, which keep each block's
    LOOM_RECOMPUTE_SELECTIVE,
    LOOM_RECOMPUTE_FULL, // keep block outputs only, re-run each block's forward in backward
} loom_recompute;

// "none", "gelu", "selective" or "full". Errors: LOOM_EINVAL naming the unknown mode.
loom_status loom_recompute_parse(const char *name, loom_recompute *mode);
// The mode's name, as loom_recompute_parse takes it ("none", "gelu", "selective", "full").
const char *loom_recompute_name(loom_recompute mode);

// Where a model object sits in a parallel layout: its pipeline stage and its tensor-parallel
// shard (rank tp_rank of tp_size), whether the residual stream's rows are split over the same
// tp ranks (sequence parallelism), and whether its parameters and gradients are held outside
// it (external_params: ZeRO 3, parallel/fsdp.h, which points the views p and g at a layer's
// tensors from the layer's LOOM_HOOK_FORWARD / BACKWARD hooks on; the model then allocates
// neither flat buffer, and params and grads stay NULL).
typedef struct {
    loom_stage stage;
    int tp_rank, tp_size;
    bool sequence_parallel;
    bool external_params;
} loom_gpt2_layout;

typedef struct {
    loom_gpt2_config cfg;
    loom_backend *be;
    loom_gpt2_layout layout;
    loom_param_table table;  // this object's parameters
    int64_t num_elements;    // table.num_elements
    void *params;            // (num_elements) be->dtype, table order (NULL with external_params)
    void *grads;             // (num_elements) be->dtype, NULL unless allocated for training
    loom_tensor *p, *g;      // (table.count) views into the two
    int *block_at;           // (L) table index of block l's first tensor; -1 when not in this stage
    // (L + 2) whether the next backward writes (backend.h's grads_write) instead of adding: block l's
    // twelve gradients [l], the final LayerNorm's [L], the output layer's wte [L + 1]; set by
    // loom_gpt2_zero_grads, cleared by the backward that writes them
    bool *grads_fresh;
    int chunk_blocks;        // nb: the most blocks of any chunk
    int wte, wpe, lnfw, lnfb; // table indices (-1: not in this stage)
    int NH;                  // heads of this shard (NHl)
    int vocab_start;         // first vocabulary row of this shard's wte
    int row_shards, row_shard; // the residual stream's rows are split in row_shards; this rank holds row_shard
    int max_B, max_T;        // activation capacity per slot
    int slots;               // micro-batches in flight; set before loom_gpt2_alloc (default 1)
    loom_recompute recompute; // set before loom_gpt2_alloc (default: none)
    // Set before loom_gpt2_alloc: activation offloading. Training keeps the per-block tensors of
    // only GPT2_OFFLOAD_RESIDENT blocks per slot on the backend, and every block's in host memory
    // (be->host_alloc), copied there on the backend's side stream after the block's forward and
    // back ahead of its backward (the block above's backward prefetches it), as PyTorch's
    // save_on_cpu hooks and Megatron-LM's activation offloading do. With --recompute full only
    // the block outputs are saved, so only they travel. Gradients are bit-identical.
    bool offload_activations;
    struct gpt2_offload *offload; // the host copies and what each resident block holds (NULL: none)
    bool split_backward;     // set before loom_gpt2_alloc: keep what a separate weight-gradient pass needs
    bool training;           // activations kept for backward, gradients allocated
    void *acts_mem, *grad_acts_mem;
    int *slot_B, *slot_T;    // (slots) the micro-batch each slot holds
    int logits_chunk;        // rows of the output layer per chunk: its logits buffer's (set before loom_gpt2_alloc;
                             // default: the backend's chunk_bytes of logits, at least 64)
    loom_hooks hooks;        // model/hooks.h
    loom_tp_points tp;       // model/hooks.h; all NULL on one device
    loom_cp_points cp;       // model/hooks.h; parts 0 without context parallelism (set before loom_gpt2_alloc)
} loom_gpt2;

// Creates the whole model on one device with zeroed parameters on `be`. Errors: LOOM_EINVAL
// (invalid config), LOOM_ENOMEM (the parameter buffer does not fit).
loom_status loom_gpt2_create(loom_gpt2 **out, loom_backend *be, const loom_gpt2_config *cfg);
// The same for one stage and tensor-parallel shard. Errors: also those of loom_gpt2_param_table
// (heads or padded vocabulary not divisible by tp_size).
loom_status loom_gpt2_create_layout(loom_gpt2 **out, loom_backend *be, const loom_gpt2_config *cfg,
                                    const loom_gpt2_layout *layout);
void loom_gpt2_free(loom_gpt2 *m);
// GPT-2 initialisation from (seed, tensor, element) (see gpt2_params.h). This and the three
// below need the model's own parameters (not external_params).
void loom_gpt2_init(loom_gpt2 *m, uint64_t seed);
// Parameters from the whole model in the model file's order (host fp32, table.file_elements
// values), converted to the backend's dtype; this object takes its shards.
void loom_gpt2_set_params(loom_gpt2 *m, const float *file);
// This object's parameters (or gradients) into their places in a model-file-order host fp32
// buffer of table.file_elements values (the places of other shards are left as they are).
void loom_gpt2_get_params(loom_gpt2 *m, float *file);
void loom_gpt2_get_grads(loom_gpt2 *m, float *file);
// A flat buffer of this object (num_elements of be->dtype, e.g. m->params) as host fp32.
void loom_gpt2_download(const loom_gpt2 *m, const void *flat, float *host);

// Sizes `slots` activation slots for micro-batches of up to B x T tokens (T: the rows of each
// sequence this rank holds); training also allocates the gradients (zeroed). Errors: LOOM_EINVAL if
// T (with context parallelism, the whole sequence's T / parts x chunks) exceeds the model's max_seq_len,
// B, T < 1, the rows do not split evenly under sequence parallelism (T % tp_size), or a split
// backward is asked with full recomputation or offloaded activations; LOOM_ENOMEM.
loom_status loom_gpt2_alloc(loom_gpt2 *m, int B, int T, bool training);
// Bytes of activations (with the gradient scratch when training) loom_gpt2_alloc would allocate
// on the backend for the model's slots, recompute, split_backward and offload settings, without
// allocating; *offloaded: host bytes of offloaded activations.
size_t loom_gpt2_activation_bytes(const loom_gpt2 *m, int B, int T, bool training, size_t *offloaded);
// Bytes of parameters, gradients (the model's own) and activations currently allocated on the
// backend; *offloaded (may be NULL): bytes of offloaded activations in host memory.
size_t loom_gpt2_memory_bytes(const loom_gpt2 *m, size_t *offloaded);

// ---- the stage API a schedule drives ----
// Micro-batch of slot `slot`: inputs (first stage; else NULL) and targets (last stage; else
// NULL), host int32 (B,T), ids in [0,V); B <= max_B, T <= max_T.
void loom_gpt2_set_batch(loom_gpt2 *m, int slot, const int32_t *inputs, const int32_t *targets, int B, int T);
// Chunk `chunk`'s forward on slot `slot`: from the tokens (the embedding's chunk) or `input`
// (Nl,C), the previous chunk's output. Returns the chunk's output (Nl,C), a view into the slot
// valid until its next forward; on the head's chunk an empty tensor, and *loss = the mean loss
// over the N tokens (loss NULL: nothing read back, the per-token losses stay in the slot). With
// `backward` (training only) the head also runs the output layer's backward at once (llm.c's
// fused classifier): d(loss)/d(params) scaled by grad_scale is added to wte's gradient and the
// slot keeps d(grad_scale * loss)/d(lnf input) for the backward.
loom_tensor loom_gpt2_stage_forward(loom_gpt2 *m, int slot, int chunk, loom_tensor input, bool backward,
                                    float grad_scale, double *loss);

// What a backward pass computes: everything, or its two halves for zero-bubble schedules (Qi et
// al. 2024): the input gradients (with the LayerNorm and embedding gradients, which are cheap)
// and later the matmuls' weight and bias gradients (needs split_backward).
typedef enum { LOOM_GRAD_ALL, LOOM_GRAD_INPUT, LOOM_GRAD_WEIGHT } loom_grad_part;

// Chunk `chunk`'s backward on slot `slot` from `dout` (Nl,C) = d(loss)/d(output), the next
// chunk's input gradient (ignored on the head's chunk, which starts from its head; and by the
// weight part). Adds the gradients of `part` into m->grads, running the hooks (GRADS of a block
// once its gradients are all final: after ALL or WEIGHT), and returns d(loss)/d(input) (Nl,C),
// valid until the next backward (empty on the embedding's chunk and for the weight part).
loom_tensor loom_gpt2_stage_backward(loom_gpt2 *m, int slot, int chunk, loom_tensor dout, loom_grad_part part);

// ---- the whole model as one stage, one slot ----
// Mean cross-entropy loss (nats/token) of next-token prediction on one micro-batch.
//   inputs, targets: host int32 (B,T), ids in [0,V); B <= max_B, T <= max_T.
double loom_gpt2_loss(loom_gpt2 *m, const int32_t *inputs, const int32_t *targets, int B, int T);
// Forward and backward on one micro-batch: returns the mean loss and adds
// grad_scale * d(mean loss)/d(params) into m->grads (grad_scale = 1/accumulation steps).
// The loss is read back after the backward is queued (one wait, at the end). Needs
// loom_gpt2_alloc(..., training=true).
double loom_gpt2_forward_backward(loom_gpt2 *m, const int32_t *inputs, const int32_t *targets,
                                  int B, int T, float grad_scale);
// Starts the model's own gradients over (external ones are their owner's): the backward that
// follows finds them zero. Each tensor that some op of the next backward writes whole (every block
// tensor, the final LayerNorm's, and wte where this stage has the output layer) is marked to be
// written there (grads_fresh), not zeroed: no pass over the buffer, and no read of it by the
// products that would add (PyTorch's gradients set to None). The others are zeroed: wpe, and wte
// of a stage with the embedding alone. Read before that backward, the marked ones hold stale
// values. With split_backward (a weight pass apart) the whole buffer is zeroed, as before.
void loom_gpt2_zero_grads(loom_gpt2 *m);
// At a training step's start (after the backend's fp8_begin): has the backend make the FP8 copies
// of this object's block weights for the step in one launch (backend.h's fp8_weights), each named
// by its layer's site as the matmul ops name it. Nothing when the backend has no such op or the
// parameters are held outside this object (ZeRO 3: a layer's weights exist only around its use).
void loom_gpt2_fp8_weights(loom_gpt2 *m);
// The mean of n per-token losses (host fp32) as every loss above is computed: summed in order in
// fp64, divided by n.
double loom_gpt2_mean_loss(const float *losses, int64_t n);

// ---- a micro-batch of a step recorded as one graph (train/step_graph.c): no host round trip ----
// loom_gpt2_set_batch from host_alloc memory, copied in order with the ops without waiting
// (be->copy), so a recording holds the copies and each replay reads the memory's contents then.
void loom_gpt2_copy_batch(loom_gpt2 *m, int slot, const int32_t *inputs, const int32_t *targets, int B, int T);
// loom_gpt2_forward_backward of the micro-batch in slot 0 with nothing read back: returns its
// per-token losses (N) fp32 on the backend, valid until the next forward; their
// loom_gpt2_mean_loss is the loss.
loom_tensor loom_gpt2_forward_backward_losses(loom_gpt2 *m, float grad_scale);
// Logits (Vp floats, host) of the next token after the T tokens of one sequence (B = 1).
void loom_gpt2_next_logits(loom_gpt2 *m, const int32_t *tokens, int T, float *logits);
