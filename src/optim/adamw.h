// AdamW over a flat parameter buffer (Loshchilov & Hutter, ICLR'19; the update of
// torch.optim.AdamW, see loom_adamw_args in backend/backend.h), with weight decay applied per
// tensor (GPT-2 convention: matrices and embeddings decay, biases and LayerNorm do not, as the
// parameter table says) and gradient clipping by the global L2 norm (as
// torch.nn.utils.clip_grad_norm_).
#pragma once
#include "backend/backend.h"
#include "model/param_table.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    float grad_clip; // max global gradient norm (0: no clipping)
    bool stochastic_rounding; // bf16 parameters from the master weights: stochastic rounding
    uint64_t seed;            // of its random bits (with the step and the element index)
} loom_adamw_config;

// A contiguous range of one tensor: parameters [param_offset, +numel) of the flat parameter
// buffer, updated from gradients and moments [state_offset, +numel) of the optimizer's own
// buffers, with the tensor's weight-decay setting; index0 names element 0 for stochastic
// rounding: its index in the whole model's flat order (the unsharded parameter table's; for a
// tensor split over tp ranks, the tensor's offset there + tp_rank x its shard's size + the
// element's index in the shard).
typedef struct {
    int64_t param_offset, state_offset, numel;
    bool weight_decay;
    int64_t index0;
} loom_param_range;

// Where the optimizer's state lives (ZeRO-Offload, Ren et al., USENIX ATC'21; ZeRO-Infinity,
// Rajbhandari et al., SC'21, for the parameters).
typedef enum {
    LOOM_ADAMW_ON_DEVICE,     // state, parameters and gradients on the backend
    LOOM_ADAMW_OFFLOAD_STATE, // moments and fp32 master weights in host memory, stepped by the host
    LOOM_ADAMW_OFFLOAD_PARAMS // that, and the parameters the steps update are host memory too
                              // (be->host_alloc: ZeRO 3's offloaded shard)
} loom_adamw_offload;

typedef struct {
    loom_backend *be;     // where the parameters and gradients live
    loom_backend *state_be; // where the state lives: be, or the host (offloaded)
    int64_t n;            // elements of optimizer state (the whole model, or a shard)
    void *m, *v;          // (n) fp32 first and second moments
    void *master;         // (n) fp32 master weights when be->dtype is lower precision or the state is
                          // offloaded, else NULL; split_master: (n) uint16, their low halves
    bool split_master;    // bf16 parameters and state on the device, rounded to nearest: each master
                          // weight held as its parameter (the high half) and 16 more bits
                          // (core/bf16.h's loom_split_*), 2 bytes a parameter less
    loom_param_range *ranges;
    int nranges;
    int64_t t;            // optimizer steps taken (bias correction uses t+1 next)
    loom_adamw_offload offload;
    float *host_grads;    // offloaded: one piece of the gradients as host fp32
    void *staging;        // offloaded: one piece of be->dtype, the gradients and parameters in
                          // transit (be->host_alloc)
} loom_adamw;

// The optimizer of the slices of table's flat buffers this rank updates (the whole buffer:
// one slice {0, 0, num_elements}; under ZeRO, this rank's pieces), their state in n elements,
// its ranges cut at the table's tensor edges and joined where neighbours continue each other
// (parameters, state and index0) with the same weight decay, so one update is few launches.
// sharded_params: the parameter buffer the steps update is laid out as the state (ZeRO 3's
// shard: param_offset = state_offset), else it is the table's flat buffer.
// With bf16 parameters and the state on the device the master weights are split (split_master:
// loom_adamw_splits), unless stochastic_rounding: its parameters are not the master weights'
// nearest bf16, so those are kept whole.
// Offloaded (LOOM_ADAMW_OFFLOAD_*), the state (moments and fp32 master weights) lives in host
// memory and each step runs on the host's cores (the CPU backend), piece by piece (4M elements):
// the piece's gradients are copied to the host as fp32, its master weights updated there, and
// its parameters written back rounded to be->dtype (to nearest: no stochastic rounding): copied
// to the device, or, with LOOM_ADAMW_OFFLOAD_PARAMS (sharded_params only), written in place in
// host memory. Host memory: the state (12 bytes per element) and one piece in transit.
// Errors: LOOM_ENOMEM when the state does not fit.
loom_status loom_adamw_create(loom_adamw **out, loom_backend *be, const loom_param_table *table,
                              const loom_param_slice *slices, int nslices, int64_t n, bool sharded_params,
                              loom_adamw_offload offload, bool stochastic_rounding);
void loom_adamw_free(loom_adamw *o);
// Whether an optimizer of parameters of dtype dt holds its master weights split, and the bytes
// of its state for n elements: moments (8 a parameter) and master weights (4, split 2, none 0).
bool loom_adamw_splits(loom_dtype dt, loom_adamw_offload offload, bool stochastic_rounding);
size_t loom_adamw_state_bytes(int64_t n, loom_dtype dt, loom_adamw_offload offload, bool stochastic_rounding);
// Mixed precision: sets the master weights of every range from the (lower-precision) parameters
// (num_elements of be->dtype: the buffer the steps update, host memory with
// LOOM_ADAMW_OFFLOAD_PARAMS). No-op when there are no master weights.
void loom_adamw_init_master(loom_adamw *o, const void *params, int64_t num_elements);
// The master weights as fp32 in host memory, out (o->n; 0 outside the ranges), a checkpoint's:
// split ones joined with the parameters (params: the buffer the steps update); and from in,
// with split ones cut against the parameters as they are (loom_split_low_near), so that every
// rank's copy of a parameter stays the model file's. Nothing when there are no master weights.
void loom_adamw_master_get(const loom_adamw *o, const void *params, float *out);
void loom_adamw_master_set(loom_adamw *o, const void *params, const float *in);

// (The clipping factor is loom_clip_scale, backend/backend.h: the host's and the device's.)

// One update of every range: params -= AdamW(grads * grad_scale) at learning rate lr; grads
// (n elements of be->dtype) are indexed like the state. With master weights the update is
// made on them in fp32 and the parameters are their rounding. Counts the step (o->t).
void loom_adamw_step(loom_adamw *o, void *params, void *grads, float lr,
                     const loom_adamw_config *cfg, float grad_scale);

// ---- the same update with its per-step values in backend memory (a recorded step) ----
// The host's part of sc for the next update (step o->t + 1) at learning rate lr: lr, t and the
// bias corrections of cfg's betas; the device's part zero.
void loom_adamw_scalars(const loom_adamw *o, const loom_adamw_config *cfg, float lr, loom_step_scalars *sc);
// loom_adamw_step with lr, t, grad_scale and the bias corrections read from sc (backend memory,
// loom_step_scalars) when the ops run, and nothing changed where sc->skip is set then: the bits
// of loom_adamw_step(..., sc->lr, cfg, sc->grad_scale) at o->t = sc->t - 1. Does not count the
// step: the caller adds it to o->t once the ops ran (an update or a skip, both counted). Not with
// offloaded state (o->offload), whose steps run on the host.
void loom_adamw_step_scalars(loom_adamw *o, void *params, void *grads, const loom_adamw_config *cfg,
                             const loom_step_scalars *sc);
