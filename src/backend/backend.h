// The op interface: everything the model and optimizer compute goes through a loom_backend.
// `cpu/` implements it in C with OpenMP and CBLAS (fp32, the reference); a CUDA backend
// implements the same table for GPUs. Model code is written once against this table.
//
// Conventions for every op:
// - Tensors are views (core/tensor.h) in this backend's memory, passed by value. Parameters,
//   activations and their gradients have dtype `be->dtype`; statistics (LayerNorm mean/rstd,
//   attention logsumexp, per-token losses), optimizer state and master weights are fp32;
//   token ids are int32.
// - Shapes use B (batch), T (sequence), C (channels), NH (heads), hs = C/NH (head size),
//   V (vocabulary), Vp (V padded to a multiple of 128), maxT (model maximum sequence), N (rows).
// - Parameter gradients accumulate (+=): the caller zeroes them once per optimizer step, so
//   gradient accumulation and tied weights need nothing special; or, with the backend's
//   grads_write set, the step's first contribution writes them (=) and the buffer needs no
//   zeroing (below). Activation gradients are
//   overwritten (=) except where an op says "+=" (LayerNorm's dinp, which carries the
//   residual stream's gradient through the block).
// - Shape mismatches are programmer errors and abort with LOOM_CHECK.
#pragma once
#include "core/bf16.h"
#include "core/status.h"
#include "core/tensor.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct loom_backend loom_backend;

// The per-step values of an update held in backend memory, so that a step recorded once (CUDA
// graphs) reads each replay's own instead of the values it was recorded with. The host writes
// its part for the coming step (loom_adamw_scalars; the device's part zero) and the step copies
// it in; the step's ops then fill in the device's part.
typedef struct {
    // the host's
    float lr;
    float bc1, bc2;   // the bias corrections loom_adamw_bias(beta1, t), loom_adamw_bias(beta2, t)
    int64_t t;        // 1-based step number (stochastic rounding's random bits)
    // the device's
    double sumsq;     // the gradient's sum of squares: sumsq_add adds into it
    float grad_scale; // step_scalars: the clipping factor loom_clip_scale(sqrt(sumsq), max_norm)
    int32_t skip;     // step_scalars: nonzero when a loss or the norm is not finite (no update)
} loom_step_scalars;

// The factor clipping by the global norm multiplies gradients by (torch.nn.utils.clip_grad_norm_):
// min(1, max_norm / (norm + 1e-6)) in fp64, rounded to fp32; 1 if max_norm <= 0 or the norm is
// NaN. The host's and the step_scalars op's, so both give the same bits.
static inline LOOM_HOST_DEVICE float loom_clip_scale(double norm, float max_norm) {
    if (max_norm <= 0.0f) return 1.0f;
    double s = max_norm / (norm + 1e-6);
    return s < 1.0 ? (float)s : 1.0f;
}

// AdamW's bias correction 1 - beta^t (t >= 1), computed in fp64 on the host and rounded to fp32:
// every backend's, and the host's for loom_step_scalars.
static inline float loom_adamw_bias(float beta, int64_t t) { return (float)(1.0 - pow(beta, (double)t)); }

// AdamW hyper-parameters for one update (Loshchilov & Hutter, "Decoupled Weight Decay
// Regularization", ICLR'19; the update of torch.optim.AdamW):
//   g = grad * grad_scale;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr * ( (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + weight_decay * p )
// with the bias corrections 1-b^t of loom_adamw_bias.
typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    float grad_scale; // e.g. the clipping factor min(1, max_norm / norm)
    int64_t t;        // 1-based step number, for bias correction
    // Stochastic rounding of bf16 parameters written from fp32 master weights (Gupta et al.,
    // "Deep Learning with Limited Numerical Precision", 2015): round up with probability equal
    // to the fraction of the gap, so the rounding is unbiased. The random bits are a hash of
    // (sr_seed, t, index0 + i), so they depend on the global element index, not the layout.
    // Ignored without master weights or in fp32.
    bool stochastic_rounding;
    uint64_t sr_seed;
    int64_t index0; // global index of element 0 of this range
    // NULL: the values above. Else (backend memory) lr, t, grad_scale and the bias corrections
    // are read from it when the update runs, and nothing is written where its skip is set: the
    // same bits as the values passed directly (a recorded step).
    const loom_step_scalars *scalars;
    // NULL, or (backend memory, n of the range) the low halves of split master weights, whose high
    // halves are the bf16 parameters (core/bf16.h's loom_split_*): the update runs on the fp32
    // values they make, and writes both halves back. For bf16 parameters without a master tensor
    // and without stochastic rounding.
    uint16_t *master_low;
} loom_adamw_args;

// Where the query and key blocks of an attention call sit in their sequences (see
// attention_forward): query row i at global position q_pos + i, key row j at k_pos + j; causal:
// query i sees key j when k_pos + j <= q_pos + i.
typedef struct {
    int64_t q_pos, k_pos;
    bool causal;
    bool accumulate; // backward: add into dq, dkv (the key blocks of one query block) instead of writing them
} loom_attn_span;
#define LOOM_ATTN_CAUSAL ((loom_attn_span){0, 0, true, false}) // whole sequences, causal

// The keys query row i (of Tq) sees are rows [0, clamp(i + delta + 1, 0, Tk)) of the key block,
// with this delta in [-Tq, Tk] (Tk: every key, as without the causal mask).
static inline int64_t loom_attn_delta(loom_attn_span span, int64_t Tq, int64_t Tk) {
    if (!span.causal) return Tk;
    int64_t d = span.q_pos - span.k_pos;
    return d < -Tq ? -Tq : d > Tk ? Tk : d;
}

struct loom_backend {
    const char *name;  // "cpu" or "cuda"
    loom_dtype dtype;  // dtype of parameters, activations and their gradients
    // FP8 products (precision "fp8"; the CUDA backend, bf16): while set, the matmul ops
    // (matmul_forward, matmul_backward and their GELU forms) compute each product whose dims are
    // multiples of 16 from FP8 copies of its operands, one scale per tensor from its current
    // amax (torchao's float8 "tensorwise" recipe; backend/cuda/fp8.cu): E4M3 for inputs and
    // weights, E5M2 for output gradients, outputs and gradients in bf16. The caller may clear it
    // around products it keeps in bf16 (the model's output layer).
    bool fp8;
    // FP8 delayed scaling (Transformer Engine's DelayedScaling recipe with its "max" algorithm
    // and margin 0): with fp8_history > 0 (steps), a cast whose slot has a history scales by
    //   s = FMAX / max(the slot's amaxes of the last fp8_history rolls)  (fp8_roll)
    // in the one pass that writes the FP8 copy and records the tensor's amax for the next roll,
    // where the current amax takes a pass of its own first. Values above FMAX / s saturate.
    // A slot is an operand of one linear layer: its input, its weight or its output gradient,
    // the layer named by fp8_site (below). Until a slot was seen before a roll, its casts scale
    // by their current amax as above (and record it). 0: every cast by its current amax.
    int fp8_history;
    // FP8 input-gradient products (dinp) with cuBLASLt's fast accumulation, as the forward's, where
    // they are otherwise promoted (torchao's Float8LinearConfig with gemm_config_grad_input's
    // use_fast_accum; Transformer Engine's split accumulator off for dgrad); the weight-gradient
    // products stay promoted. Under delayed scaling the MLP's fcproj product then writes the fc
    // layer's output-gradient copies itself (backend/cuda/gemm_fp8.cu).
    bool fp8_fast_dgrad;
    // The linear layer whose slots the matmul ops use until it is set again (with fp8_history):
    // an index >= 0 the caller keeps for that layer (the model: its weight's parameter index),
    // the same for its forward and its backward; -1 (the default): none, the current amaxes.
    // mlp_forward and mlp_backward take two: fp8_site names the fcproj layer, fp8_site_fc the fc layer.
    int fp8_site, fp8_site_fc;
    // The linear layer whose input the next LayerNorm op's output is (layernorm_forward,
    // residual_layernorm_forward), named as fp8_site names it; -1 (the default): none. Under
    // delayed scaling, once that layer's input slot has a history, the CUDA backend's LayerNorm
    // also writes its output's FP8 copy, which that layer's forward product then takes in place
    // of its cast: the same bytes and amax, one pass fewer (backend/cuda/fp8_kept.cu).
    int fp8_site_ln;
    // With fp8_site_ln: nothing but that layer's products reads the LayerNorm output before it is
    // written again (the model's --recompute selective without tensor parallelism: the backward
    // writes it again where it reads it). Where the CUDA backend's LayerNorm writes the FP8 copy,
    // it then leaves the bf16 output unwritten (2 bytes an element not stored); a product that
    // would read it after all (one that does not take the copy) stops with a line naming it.
    bool fp8_ln_copy_only;
    // Matmul algorithms by measurement (the CUDA backend; the CPU has one sgemm): the first product
    // of each shape times cuBLASLt's first 8 candidates on its own operands and keeps the fastest
    // for the rest of the run (backend/cuda/matmul.cu), instead of the heuristic's first. The choice
    // rests on timings, so two runs (a run and its resumption too) may pick differently and differ
    // in rounding; within a run it stays. Set before the first product.
    bool gemm_autotune;
    // Parameter gradients written, not added: while set, the ops write each parameter gradient
    // they produce (=) where they would add to it (+=): matmul_backward, matmul_gelu_backward and
    // mlp_backward their dw and dbias, layernorm_backward its dw, db and dsum, attention_backward
    // its dbias. So a step's first contribution to a gradient needs no zeroed buffer before it
    // (PyTorch's gradients set to None: the first backward assigns them): 2 bytes an element
    // not written by a zeroing pass and not read back by the product that adds. The results are
    // those of adding into zeros, up to the sign of a zero (on a GPU too: cuBLASLt's algorithm is
    // chosen per shape, whatever beta). encoder_backward always adds (it touches only the
    // rows of the tokens and positions seen); activation gradients (LayerNorm's dinp +=, the
    // attention's span.accumulate) are not affected. Default false.
    bool grads_write;
    // Parameter gradients finished at grads_flush: while set, an op may leave part of the
    // parameter gradients it produces unfinished until the next grads_flush (the CUDA backend's
    // bias and LayerNorm gradients: their partial sums' final adds wait there and run together in
    // one launch). Each op still finishes its activation gradients. Nothing may read or write a
    // parameter gradient produced since the last grads_flush (a collective, a copy, the optimizer)
    // before the next one; the model sets it over a block's backward and flushes at the block's
    // end. The results are the same bits. Default false.
    bool grads_defer;
    size_t bytes_in_use, peak_bytes; // memory allocated through alloc (and op temporaries), now and at most
    size_t host_bytes_in_use, host_peak_bytes; // host memory allocated through host_alloc, now and at most
    // Preferred size in bytes of a temporary that callers may split into chunks (the output
    // layer's logits, unless --logits-chunk sets its rows): large enough for most of the
    // device's matmul rate, small enough to bound memory (32 MiB on the CPU, 256 MiB on a GPU,
    // where gpt2's output layer at B=16 runs 0.37 ms faster in two chunks of 1 GiB).
    size_t chunk_bytes;
    // The stream every op of this backend runs on (a cudaStream_t on a GPU; NULL on the CPU), so
    // that other code (NCCL collectives, host staging) can order its work against the ops.
    void *stream;
    // The GPU's PCI bus id ("0000:3B:00.0"), by which NVML finds it (core/power.h: power, energy,
    // clock); NULL on the CPU.
    const char *pci_bus_id;

    // ---- memory (device memory for a GPU backend) ----
    void *(*alloc)(loom_backend *be, size_t bytes); // zero-filled; NULL when out of memory
    void (*free)(loom_backend *be, void *p);
    void (*upload)(loom_backend *be, void *dst, const void *host_src, size_t bytes);
    void (*download)(loom_backend *be, void *host_dst, const void *src, size_t bytes);
    void (*zero)(loom_backend *be, void *p, size_t bytes);
    // A copy within this backend's memory, or between it and host_alloc memory, in order with the
    // ops and without waiting for them (unlike upload and download, a graph can record it; the
    // host reads what it wrote after synchronize)
    void (*copy)(loom_backend *be, void *dst, const void *src, size_t bytes);
    // Strided copy within this backend's memory: `rows` rows of `width` bytes, row i from
    // src + i * src_pitch to dst + i * dst_pitch (bytes; the regions do not overlap)
    void (*copy_2d)(loom_backend *be, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                    size_t width, size_t rows);
    void (*synchronize)(loom_backend *be);
    // Finishes the parameter gradients that ops left waiting (grads_defer), in stream order; nothing
    // to do on the CPU, whose ops finish them at once.
    void (*grads_flush)(loom_backend *be);
    // Host memory for what is offloaded (optimizer state, parameter shards, activations):
    // page-locked on a GPU (cudaMallocHost), so copies run asynchronously at the bus's full rate;
    // ordinary memory on the CPU. Zero-filled; NULL when out of memory.
    void *(*host_alloc)(loom_backend *be, size_t bytes);
    void (*host_free)(loom_backend *be, void *p);
    // A copy between host_alloc memory and this backend's memory (to_host: src is the backend's)
    // on a side stream, after every op issued so far (it reads what they wrote and overwrites
    // nothing they still read), overlapping the ops issued after it. Returns a ticket:
    // copy_wait(be, ticket) makes the ops issued after the call wait for that copy and every
    // copy before it. On the CPU the copy is made at once and the ticket is 0.
    uint64_t (*copy_async)(loom_backend *be, void *dst, const void *src, size_t bytes, bool to_host);
    void (*copy_wait)(loom_backend *be, uint64_t ticket);
    // Bytes free and in all of the memory alloc draws from (the GPU's; the host's on the CPU).
    void (*memory_info)(loom_backend *be, size_t *free_bytes, size_t *total_bytes);
    // Profiler ranges (NVTX on CUDA, so an Nsight Systems trace shows forward, backward, each
    // block and the optimizer); nestable; NULL where there is no profiler.
    void (*range_push)(loom_backend *be, const char *name);
    void (*range_pop)(loom_backend *be);
    // CUDA graphs: graph_begin records the ops issued until graph_end instead of running them
    // (stream capture); graph_end returns the recorded graph, instantiated; graph_launch runs it
    // again, reading and writing the same buffers, and returns false (running nothing) when the
    // backend's per-op scratch buffer has moved since the recording (record again); graph_free
    // releases it. Between begin and end no upload, download, alloc, free or synchronize may be
    // called; copy may (a copy from or to host_alloc memory reads or writes it at each replay).
    // NULL where the backend has no graphs (the CPU).
    void (*graph_begin)(loom_backend *be);
    void *(*graph_end)(loom_backend *be);
    bool (*graph_launch)(loom_backend *be, void *graph);
    void (*graph_free)(loom_backend *be, void *graph);

    // ---- ops ----
    // Token + position embedding over one range of the vocabulary (Megatron-LM's
    // vocabulary-parallel embedding, Shoeybi et al. 2019): wte (Vl,C) holds rows
    // [vocab_start, vocab_start + Vl) of the whole (Vp,C) embedding (vocab_start 0, Vl = Vp: all).
    //   out[b,t,:] = wte[tok - vocab_start,:] + wpe[t,:]  if vocab_start <= tok < vocab_start + Vl
    //              = 0                                     otherwise (wpe not added)
    // with tok = tokens[b,t], so the sum of the outputs of all the vocabulary's shards is
    // wte[tok] + wpe[t], each element coming from one shard (exactly).
    //   out (B,T,C), tokens (B,T) int32 in [0,Vp), wte (Vl,C), wpe (maxT,C), T <= maxT
    void (*encoder_forward)(loom_backend *be, loom_tensor out, loom_tensor tokens, loom_tensor wte,
                            loom_tensor wpe, int vocab_start);
    // dwte (Vl,C) +=: dwte[tok - vocab_start] += dout[b,t] for the tokens in this shard's range;
    // dwpe (maxT,C) +=: dwpe[t] += dout[b,t] for every token (the whole gradient of the
    // replicated wpe); from dout (B,T,C) and tokens (B,T), wte's shard as in encoder_forward
    void (*encoder_backward)(loom_backend *be, loom_tensor dwte, loom_tensor dwpe, loom_tensor dout,
                             loom_tensor tokens, int vocab_start);

    // LayerNorm over the last dim (Ba et al. 2016), eps 1e-5 as GPT-2:
    //   out (N,C) = (inp - mean) * rstd * w + b;  mean (N) fp32, rstd (N) fp32 saved for backward
    void (*layernorm_forward)(loom_backend *be, loom_tensor out, loom_tensor mean, loom_tensor rstd,
                              loom_tensor inp, loom_tensor w, loom_tensor b);
    // dinp (N,C) +=, dw (C) +=, db (C) +=; dsum (C), when its data is not NULL: += the column
    // sums of dinp after the add, as stored (the bias gradient of a layer whose output is added
    // to this LayerNorm's input, such as a residual branch's projection: summed where the
    // gradient is made, as matmul_backward's dbias from the same values)
    void (*layernorm_backward)(loom_backend *be, loom_tensor dinp, loom_tensor dw, loom_tensor db, loom_tensor dsum,
                               loom_tensor dout, loom_tensor inp, loom_tensor w, loom_tensor mean,
                               loom_tensor rstd);

    // out (N,OC) = inp (N,C) @ w^T + bias;  w (OC,C) as torch.nn.Linear; bias (OC) or data NULL
    void (*matmul_forward)(loom_backend *be, loom_tensor out, loom_tensor inp, loom_tensor w,
                           loom_tensor bias);
    // dinp (N,C) = dout @ w (skipped when dinp.data is NULL); dw (OC,C) += dout^T @ inp;
    // dbias (OC) += column sums of dout (skipped when dbias.data is NULL; both skipped when
    // dw.data is NULL: the two halves of a zero-bubble backward)
    void (*matmul_backward)(loom_backend *be, loom_tensor dinp, loom_tensor dw, loom_tensor dbias,
                            loom_tensor dout, loom_tensor inp, loom_tensor w);

    // Multi-head attention (Vaswani et al. 2017) of a block of queries against a block of keys
    // and values, computed FlashAttention-style (Dao 2023): softmax(q k^T / sqrt(hs)) v without
    // keeping the (Tq,Tk) matrix. The blocks may be pieces of longer sequences (context
    // parallelism, Liu et al. 2023, "Ring Attention"): query row i sits at global position
    // span.q_pos + i and key row j at span.k_pos + j; with span.causal query i sees key j when
    // k_pos + j <= q_pos + i, else every key. Whole-sequence causal attention is q = kv = qkv
    // with LOOM_ATTN_CAUSAL.
    //   q (B,Tq,Wq): the queries are its first C columns (Wq = C, or 3C: a qkv tensor)
    //   kv (B,Tk,Wk): the keys, then the values, are its last 2C columns (Wk = 2C, or 3C: a qkv tensor)
    //   head h uses columns h*hs..(h+1)*hs of each of q, k, v
    //   out (B,Tq,C): per head, the softmax-weighted values of the visible keys; 0 for a row
    //       that sees none (a block wholly in the causal future is all zeros)
    //   lse (B,NH,Tq) fp32: the natural-log logsumexp of the row's scaled visible scores,
    //       -INFINITY for a row that sees none; partial results of the key blocks of a query
    //       block merge by it (attention_merge), and the backward pass reads the merged one
    void (*attention_forward)(loom_backend *be, loom_tensor out, loom_tensor lse, loom_tensor q,
                              loom_tensor kv, int NH, loom_attn_span span);
    // The gradients of one (query block, key block) pair: dq (shaped as q) in its first C columns,
    // dkv (shaped as kv) in its last 2C columns, written, or added to with span.accumulate (the
    // key blocks of a query block, context parallelism), from dout (B,Tq,C) and out (B,Tq,C),
    // lse (B,NH,Tq) of the whole attention of these queries (over all key blocks, merged), so
    // that P = exp(S - lse) is this block's share of each row's softmax; rows whose lse is
    // -INFINITY add nothing. dq and dkv may be one tensor (the q and the k, v columns of a dqkv
    // (B,T,3C)). Writing (whole-sequence attention) skips a read and a second rounding per value.
    // dbias (3C), when its data is not NULL and the gradients are written (not span.accumulate):
    // += the column sums of what is written, over its B*Tq rows of dq's C columns, then its B*Tk
    // rows of dkv's 2C: the bias gradient of the qkv layer whose output q and kv are, summed by
    // the backend where the gradients are made (as matmul_backward's dbias from the same dqkv).
    void (*attention_backward)(loom_backend *be, loom_tensor dq, loom_tensor dkv, loom_tensor dbias,
                               loom_tensor dout, loom_tensor q, loom_tensor kv, loom_tensor out, loom_tensor lse,
                               int NH, loom_attn_span span);
    // Merges the partial result (out_part, lse_part) of other keys into the running one (out,
    // lse) of the same queries, as the online softmax does (Milakov & Gimelshein 2018):
    //   L = log(e^lse + e^lse_part);  out = e^(lse - L) out + e^(lse_part - L) out_part;  lse = L
    // (a side whose lse is -INFINITY weighs 0; a row with both -INFINITY stays 0, -INFINITY).
    //   out, out_part (B,T,C); lse, lse_part (B,NH,T) fp32
    void (*attention_merge)(loom_backend *be, loom_tensor out, loom_tensor lse, loom_tensor out_part,
                            loom_tensor lse_part, int NH);

    // GELU, tanh approximation (Hendrycks & Gimpel 2016), elementwise, any shape:
    //   out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    void (*gelu_forward)(loom_backend *be, loom_tensor out, loom_tensor inp);
    // dinp = gelu'(inp) * dout; dinp may alias dout
    void (*gelu_backward)(loom_backend *be, loom_tensor dinp, loom_tensor inp, loom_tensor dout);

    // out = a + b, elementwise, same shapes; out may alias a or b
    void (*residual_forward)(loom_backend *be, loom_tensor out, loom_tensor a, loom_tensor b);

    // ---- fused forms: one pass where the plain ops above take two; the same results as the
    // plain ops in sequence, up to where intermediate values are rounded ----
    // A linear layer and the residual add after it: out (N,OC) = res (N,OC) + inp (N,C) @ w^T + bias,
    // with out and res separate buffers (the CUDA backend: cuBLASLt's C at beta 1, rounded once)
    void (*matmul_residual_forward)(loom_backend *be, loom_tensor out, loom_tensor inp, loom_tensor w,
                                    loom_tensor bias, loom_tensor res);
    // The MLP's first layer and its GELU: pre (N,OC) = inp (N,C) @ w^T + bias; out (N,OC) = gelu(pre)
    void (*matmul_gelu_forward)(loom_backend *be, loom_tensor out, loom_tensor pre, loom_tensor inp,
                                loom_tensor w, loom_tensor bias);
    // matmul_backward of the layer after a GELU, with the GELU's backward folded in:
    //   dinp (N,C) = (dout @ w) * gelu'(pre), pre (N,C) the GELU's input; dw +=, dbias += as matmul_backward
    void (*matmul_gelu_backward)(loom_backend *be, loom_tensor dinp, loom_tensor dw, loom_tensor dbias,
                                 loom_tensor dout, loom_tensor inp, loom_tensor w, loom_tensor pre);
    // The MLP  pre (N,OC) = inp (N,C) @ fcw^T + fcb,  act (N,OC) = gelu(pre),  out (N,C) = act @ projw^T + projb
    // (+ res (N,C) when res.data: the residual add after it, out and res separate buffers):
    // matmul_gelu_forward of the fc layer, then matmul_forward (matmul_residual_forward) of the
    // fcproj layer (loom_mlp_forward_ops). With act_kept false the backward recomputes act where it reads it
    // (mlp_backward's act_kept), so act need not be written here: a backend may hand the GELU's
    // output to the fcproj product in another form (FP8 with delayed scaling: the fc product
    // writes it in E4M3, backend/cuda/fp8.cu). fcw (OC,C), projw (C,OC); a bias's data may be NULL.
    // Under FP8 delayed scaling the fc layer takes the slots of site fp8_site_fc, the fcproj
    // layer fp8_site's.
    void (*mlp_forward)(loom_backend *be, loom_tensor out, loom_tensor pre, loom_tensor act, bool act_kept,
                        loom_tensor inp, loom_tensor fcw, loom_tensor fcb, loom_tensor projw, loom_tensor projb,
                        loom_tensor res);
    // The backward of the MLP  pre = inp @ fcw^T + fcb,  act = gelu(pre),  out = act @ projw^T + projb
    // from dout (N,C) = d(loss)/d(out): matmul_gelu_backward of the fcproj layer, then
    // matmul_backward of the fc layer (loom_mlp_backward_ops), so that a backend may put the
    // GELU's backward where it costs least (FP8: into the fc layer's output-gradient cast):
    //   dfch (N,OC) = (dout @ projw) * gelu'(pre);  dinp (N,C) = dfch @ fcw
    //   dprojw (C,OC) += dout^T act;  dprojb (C) += column sums of dout
    //   dfcw (OC,C) += dfch^T inp;  dfcb (OC) += column sums of dfch
    // The weight gradients are all computed or, with dfcw.data and dprojw.data NULL (the first
    // half of a zero-bubble backward), none: then dfch is written for the weight pass; with them
    // dfch is scratch, left unspecified. A bias gradient's data may be NULL (skipped).
    // act (N,OC): gelu(pre) when act_kept, else a buffer the op may fill with it (recomputation).
    // inp (N,C), fcw (OC,C), pre (N,OC), projw (C,OC) as the forward's.
    void (*mlp_backward)(loom_backend *be, loom_tensor dinp, loom_tensor dfch, loom_tensor dfcw, loom_tensor dfcb,
                         loom_tensor dprojw, loom_tensor dprojb, loom_tensor dout, loom_tensor inp, loom_tensor fcw,
                         loom_tensor pre, loom_tensor act, bool act_kept, loom_tensor projw);
    // The residual add and the LayerNorm after it: res (N,C) = a + b (res may alias a or b), then
    // out, mean, rstd = layernorm_forward(res, w, bias)
    void (*residual_layernorm_forward)(loom_backend *be, loom_tensor res, loom_tensor out,
                                       loom_tensor mean, loom_tensor rstd, loom_tensor a,
                                       loom_tensor b, loom_tensor w, loom_tensor bias);

    // Fused softmax + cross-entropy over the first V of Vp columns (the padded columns get
    // probability 0), never storing the probabilities:
    //   losses (N) fp32: losses[i] = logsumexp(logits[i, 0:V)) - logits[i, targets[i]]
    //   logits (N,Vp); targets (N) int32 in [0,V)
    // If backward: logits is overwritten with dlogits = dloss * (softmax - onehot(target)) on
    // [0,V) and 0 on [V,Vp), where dloss is d(total loss)/d(losses[i]) (e.g. 1/(B*T)).
    void (*softmax_crossentropy)(loom_backend *be, loom_tensor losses, loom_tensor logits,
                                 loom_tensor targets, int V, float dloss, bool backward);

    // Vocabulary-parallel cross-entropy (Megatron-LM's parallel cross-entropy, Shoeybi et al.
    // 2019): each of R shards holds the logits of columns [vocab_start, vocab_start + Vl) of the
    // padded vocabulary (its output layer's rows of wte); columns >= V are padding and never
    // count. Partial statistics of the shards are combined (after an all-gather, say) into the
    // logsumexp, then each shard computes its own columns' gradient; with one shard of all Vp
    // columns, the three ops give softmax_crossentropy's results to float rounding.
    // Per row i, over this shard's columns j with vocab_start + j < V (the valid ones):
    //   partial[i,0] = m = max logits[i,j]                  (-INFINITY when none is valid)
    //   partial[i,1] = sum of exp(logits[i,j] - m)          (0 when none is valid)
    //   partial[i,2] = logits[i, targets[i] - vocab_start]  if the target is in this shard, else 0
    //   partial (N,3) fp32; logits (N,Vl) be->dtype; targets (N) int32 in [0,V)
    void (*crossentropy_partial)(loom_backend *be, loom_tensor partial, loom_tensor logits,
                                 loom_tensor targets, int vocab_start, int V);
    // Combines the R shards' partials as the online softmax does (Milakov & Gimelshein 2018),
    // summing over r = 0..R-1 in order (deterministic):
    //   M = max_r m_r;  S = sum_r s_r exp(m_r - M) (shards with s_r = 0 add nothing)
    //   lse[i] = M + log S;  losses[i] = lse[i] - sum_r partials[r,i,2]
    //   partials (R,N,3) fp32; losses (N) fp32, lse (N) fp32
    void (*crossentropy_combine)(loom_backend *be, loom_tensor losses, loom_tensor lse,
                                 loom_tensor partials);
    // logits (N,Vl) is overwritten with dlogits = dloss * (exp(logits - lse) - onehot(target))
    // on the valid columns (onehot at column targets[i] - vocab_start) and 0 on the padding,
    // from lse (N) fp32 of crossentropy_combine; dloss as in softmax_crossentropy
    void (*crossentropy_backward)(loom_backend *be, loom_tensor logits, loom_tensor lse,
                                  loom_tensor targets, int vocab_start, int V, float dloss);

    // AdamW on one contiguous range of n elements (see loom_adamw_args).
    //   param (n) be->dtype, updated in place; grad (n) be->dtype; m, v (n) fp32;
    //   master (n) fp32 master weights when param is lower precision, else data NULL; then param
    //   = master rounded to nearest, or stochastically (args.stochastic_rounding). With
    //   args.master_low the master weights are param's bf16 values and those low halves instead.
    void (*adamw_update)(loom_backend *be, loom_tensor param, loom_tensor master, loom_tensor grad,
                         loom_tensor m, loom_tensor v, loom_adamw_args args);

    // Sum of squares of x (any shape), accumulated in fp64 in a fixed order that does not
    // depend on the thread count (so runs repeat bit for bit).
    double (*sumsq)(loom_backend *be, loom_tensor x);
    // *acc (fp64, this backend's memory) += sumsq(x), in order with the ops and without waiting:
    // calls from acc = 0 give the bits of the host's fp64 sum of sumsq's results in that order.
    void (*sumsq_add)(loom_backend *be, double *acc, loom_tensor x);
    // The device's part of a step's scalars (backend memory), after sumsq_add left the
    // gradient's sum of squares in sc->sumsq: with norm = sqrt(sc->sumsq) (fp64),
    //   sc->skip = some losses[i] or the norm is not finite (NaN or infinite)
    //   sc->grad_scale = loom_clip_scale(norm, max_norm)
    // losses (n) fp32: the step's per-token losses (a mean of them is finite exactly when all are).
    void (*step_scalars)(loom_backend *be, loom_step_scalars *sc, loom_tensor losses, float max_norm);

    // ---- FP8 delayed scaling (fp8_history above), and a step's FP8 weights (NULL on the CPU) ----
    // A step begins: every slot's amax zeroed (what casts outside training raised counts for
    // nothing). In order with the ops (a graph can record it).
    void (*fp8_begin)(loom_backend *be);
    // After fp8_begin: the FP8 copies of weights w[0..n) (bf16 (OC,C) each; sites[i] the linear
    // layer whose weight w[i] is, as fp8_site names it), its rows and its transpose, made in one
    // launch and kept until the next fp8_roll: under delayed scaling when every weight's slot has
    // a history (else nothing: the matmul ops cast as before), its amax recorded in its slot as a
    // cast's is; without (the tensorwise recipe) always, each scaled by its current amax (an amax
    // pass over all of them first, a second launch), as its casts would be.
    // A matmul op of site sites[i] whose weight is w[i] then takes the copies in place of its
    // casts: the same bytes, one read of each weight a step instead of one a cast (Transformer
    // Engine keeps a step's FP8 weights likewise). The caller does not change a weight between
    // this and the roll. Memory: 2 bytes a weight element, held from the first call on. In order
    // with the ops (a graph can record it).
    void (*fp8_weights)(loom_backend *be, const loom_tensor *w, const int *sites, int n);
    // Whether the backward of linear layer `site` (its matmul_backward, or mlp_backward for an fc
    // layer, with both its input's and its weight's gradients) takes its input x from a copy this
    // backend made of x in the layer's forward and kept (FP8's transposed copy; backend/cuda/
    // fp8_kept.cu), never from x: true, and x need not hold its values any more (the model's
    // --recompute selective then does not write its LayerNorm outputs again). A backward that would
    // have to read x after all stops the program, naming the layer, rather than read it. NULL or
    // false: the backward reads x.
    bool (*input_kept)(loom_backend *be, loom_tensor x, int site);
    // The amax of every slot over the casts since the last roll (or fp8_begin): (n) fp32 in this
    // backend's memory, n 3 x (the highest fp8_site used + 1) rounded up, NULL with n 0 before
    // the first slot's cast. The caller may reduce it before fp8_roll (a max over data-parallel
    // ranks, which then share their scales); it moves only when a higher site is first used.
    float *(*fp8_amax)(loom_backend *be, size_t *n);
    // Each slot's amax into its history (a non-finite one as 0, the history's oldest dropped),
    // the amax zeroed, and the scale of each slot's casts from its history; a slot seen since
    // the last roll scales from its history from now on. In order with the ops (a graph can
    // record it).
    void (*fp8_roll)(loom_backend *be);
    // The slots' state for a checkpoint, as fp32 values (their count returned; written to out
    // when not NULL, after waiting for the ops; 0: no slot yet): the history length, the slots,
    // the rings' position, which slots have a history, and the rings.
    size_t (*fp8_save)(loom_backend *be, float *out);
    // The state fp8_save wrote (n values), restored into a backend with the same fp8_history and
    // no slot yet: the next casts scale as the saved run's would have. Errors: LOOM_EFORMAT
    // naming the value when it does not describe slots of this fp8_history (another history
    // length, a count that does not add up, a flag not 0 or 1, an amax negative or not finite).
    loom_status (*fp8_load)(loom_backend *be, const float *state, size_t n);

    void (*destroy)(loom_backend *be);
};

// Creates the backend for `device` ("cpu"; "cuda" or "cuda:N" for GPU N, in builds with CUDA)
// computing in `dtype`.
// Errors: LOOM_EINVAL for an unknown device name, LOOM_EUNSUPPORTED for a device this build or
// machine lacks or a dtype the device does not implement (the CPU computes in fp32 only).
loom_status loom_backend_create(loom_backend **out, const char *device, loom_dtype dtype);
void loom_backend_destroy(loom_backend *be);
// The backend a run asks for by name:
//   device "auto" (a GPU when there is one, else the CPU), "cpu", "cuda" or "cuda:N" — "cuda"
//   takes GPU local_rank mod (GPUs of the host), local_rank being the rank's index among the
//   ranks of its host (more ranks than GPUs share them: collectives must then be staged, as
//   NCCL refuses two ranks on one GPU);
//   precision "auto" (bf16 on a GPU, fp32 on the CPU), "fp32", "bf16" or "fp8" (bf16 with FP8
//   products: be->fp8 set).
// Errors: LOOM_EINVAL for an unknown precision, LOOM_EUNSUPPORTED for "fp8" on the CPU, those of
// loom_backend_create.
loom_status loom_backend_open(loom_backend **out, const char *device, const char *precision, int local_rank);
// The precision a run computes in, as --precision names it: "fp8" while be->fp8 is set, else
// be->dtype's name ("fp32", "bf16").
const char *loom_backend_precision(const loom_backend *be);
// GPUs of the kind `device` names ("cuda") that this process can see: 0 on the CPU, in builds
// without CUDA, or without a driver.
int loom_backend_device_count(const char *device);
// The host's available and total memory in bytes (MemAvailable and MemTotal of /proc/meminfo;
// sysconf's free and total pages where it cannot be read).
void loom_host_memory_info(size_t *available, size_t *total);

// matmul_residual_forward as the plain ops in sequence, matmul_forward then residual_forward (out
// = res + out): the CPU's.
void loom_matmul_residual_forward_ops(loom_backend *be, loom_tensor out, loom_tensor inp, loom_tensor w,
                                      loom_tensor bias, loom_tensor res);
// mlp_forward as the plain ops in sequence (act written whatever act_kept says): the CPU's, and the
// CUDA backend's outside FP8 delayed scaling.
void loom_mlp_forward_ops(loom_backend *be, loom_tensor out, loom_tensor pre, loom_tensor act, bool act_kept,
                          loom_tensor inp, loom_tensor fcw, loom_tensor fcb, loom_tensor projw, loom_tensor projb,
                          loom_tensor res);
// mlp_backward as the plain ops in sequence: gelu_forward (act, unless act_kept, when the
// weight gradients are computed), matmul_gelu_backward, matmul_backward (the CPU's, and the
// CUDA backend's outside FP8).
void loom_mlp_backward_ops(loom_backend *be, loom_tensor dinp, loom_tensor dfch, loom_tensor dfcw, loom_tensor dfcb,
                           loom_tensor dprojw, loom_tensor dprojb, loom_tensor dout, loom_tensor inp, loom_tensor fcw,
                           loom_tensor pre, loom_tensor act, bool act_kept, loom_tensor projw);

// Backend constructors (one per implementation).
loom_status loom_backend_cpu_create(loom_backend **out, loom_dtype dtype);
// CUDA (builds with LOOM_HAVE_CUDA; src/backend/cuda): fp32 or bf16 on CUDA device
// `device_index` (made current), or the current device when it is -1. LOOM_EUNSUPPORTED when
// the machine has no CUDA device, no device of that index, or none this build has kernels for.
loom_status loom_backend_cuda_create(loom_backend **out, loom_dtype dtype, int device_index);
int loom_backend_cuda_device_count(void);
