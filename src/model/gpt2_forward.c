// GPT-2's forward and backward passes over one stage; see gpt2.h. The forward pass, block by
// block (shapes of this shard: Nl residual rows, N all rows, Cl the shard's width):
//
//   x = wte[tokens] + wpe[positions]                             (Nl,C)   reduce over tp
//   for each block l:
//     ln1       = gather(ln1(x))                                  (N,C)
//     qkv       = ln1 @ qkvw^T + qkvb                             (B,T,3Cl) column-parallel
//     atty      = causal_attention(qkv)                           (B,T,Cl)  this shard's heads; with
//                                                                           context parallelism its point
//     residual2 = x + reduce(atty @ attprojw^T + attprojb)        (Nl,C)    row-parallel
//     fch       = gather(ln2(residual2)) @ fcw^T + fcb            (N,4Cl)   column-parallel, GELU fused in
//     x         = residual2 + reduce(gelu(fch) @ fcprojw^T + fcprojb)  (Nl,C) (= residual3)
// (the residual adds fused into the row-parallel products where there is nothing to reduce, else
// residual2's into ln2)
//   logits = gather(lnf(x)) @ wte^T                               (N,Vl)    vocabulary-parallel
//   loss   = mean cross-entropy over the first V logits
//
// gather and reduce are the tensor-parallel points of model/hooks.h (the identity on one device);
// positions are 0..T-1, or under context parallelism each block of rows' own (model/hooks.h).
#include "model/gpt2_internal.h"

#include <string.h>

static loom_tensor no_tensor(void) { return (loom_tensor){0}; }

// Per-block slice of a stacked activation: its own, the one all blocks share, or with offloaded
// activations its resident copy (gpt2_offload.c).
static loom_tensor layer(const loom_tensor *t, int i) { return loom_index(t, i % t->shape[0]); }

// Block i's LayerNorm output (ln1 or ln2): its own, or under --recompute selective its view into
// the buffer the blocks share (gpt2_internal.h's GPT2_NORM_SHIFT)
static loom_tensor norm_out(const loom_gpt2 *m, const loom_tensor *t, int i) {
    loom_tensor v = layer(t, i);
    if (m->training && gpt2_norms_recomputed(m)) v.data = (char *)t->data + (size_t)i * GPT2_NORM_SHIFT;
    return v;
}

// Profiler ranges around the passes and blocks (NVTX on a GPU; nothing on the CPU).
static void range_push(loom_gpt2 *m, const char *what, int l) {
    if (!m->be->range_push) return;
    char name[32];
    if (l >= 0) snprintf(name, sizeof name, "%s %d", what, l);
    m->be->range_push(m->be, l >= 0 ? name : what);
}

static void range_pop(loom_gpt2 *m) {
    if (m->be->range_pop) m->be->range_pop(m->be);
}

static void tp_gather(loom_gpt2 *m, loom_tensor full, loom_tensor local) {
    if (m->tp.gather) m->tp.gather(m->tp.ctx, full, local);
}

static void tp_reduce(loom_gpt2 *m, loom_tensor local, loom_tensor full) {
    if (local.data != full.data && loom_rows(&local) == loom_rows(&full))
        m->be->copy(m->be, local.data, full.data, loom_nbytes(&full));
    if (m->tp.reduce) m->tp.reduce(m->tp.ctx, local, full);
}

// The blocks of a micro-batch's rows (model/hooks.h): one of whole sequences at position 0, or
// context parallelism's parts. Block k is rows [k B Tb, (k+1) B Tb) at positions from pos[k].
static int row_blocks(const loom_gpt2 *m, const gpt2_views *v, int64_t *Tb, int64_t *pos) {
    int parts = m->cp.parts ? m->cp.parts : 1;
    *Tb = v->T / parts;
    for (int k = 0; k < parts; k++) pos[k] = m->cp.parts ? m->cp.chunk[k] * *Tb : 0;
    return parts;
}

// wpe (maxT,C) from row `pos`: the position embeddings of a block
static loom_tensor wpe_from(loom_tensor wpe, int64_t pos) {
    return LOOM_VIEW((char *)wpe.data + (size_t)(pos * wpe.shape[1]) * loom_dtype_size(wpe.dtype), wpe.dtype,
                     wpe.shape[0] - pos, wpe.shape[1]);
}

// out (N,C) = wte[tokens] + wpe[positions] (this shard's vocabulary rows), block by block
static void embed_forward(loom_gpt2 *m, const gpt2_views *v, loom_tensor out) {
    int64_t Tb, pos[LOOM_CP_MAX_PARTS];
    int32_t *tok = v->a.tokens.data;
    for (int k = 0, parts = row_blocks(m, v, &Tb, pos); k < parts; k++)
        m->be->encoder_forward(m->be, loom_row_slice(&out, k * v->B * Tb, (k + 1) * v->B * Tb),
                               LOOM_VIEW(tok + k * v->B * Tb, LOOM_I32, v->B, Tb), m->p[m->wte],
                               wpe_from(m->p[m->wpe], pos[k]), m->vocab_start);
}

// dwte +=, dwpe += from dout (N,C), block by block
static void embed_backward(loom_gpt2 *m, const gpt2_views *v, loom_tensor dout) {
    int64_t Tb, pos[LOOM_CP_MAX_PARTS];
    int32_t *tok = v->a.tokens.data;
    for (int k = 0, parts = row_blocks(m, v, &Tb, pos); k < parts; k++)
        m->be->encoder_backward(m->be, m->g[m->wte], wpe_from(m->g[m->wpe], pos[k]),
                                loom_row_slice(&dout, k * v->B * Tb, (k + 1) * v->B * Tb),
                                LOOM_VIEW(tok + k * v->B * Tb, LOOM_I32, v->B, Tb), m->vocab_start);
}

// Causal attention of the chunk's sequences: the backend's, or context parallelism's point.
static void attention_forward(loom_gpt2 *m, loom_tensor out, loom_tensor lse, loom_tensor qkv) {
    if (m->cp.attention_forward) m->cp.attention_forward(m->cp.ctx, out, lse, qkv, m->NH);
    else m->be->attention_forward(m->be, out, lse, qkv, qkv, m->NH, LOOM_ATTN_CAUSAL);
}

// dqkv = its gradient; dbias (the qkv layer's bias gradient, or data NULL) += the column sums of
// dqkv where the backend's attention makes dqkv. Returns whether it did (not under context
// parallelism: then the qkv layer's matmul_backward sums them).
static bool attention_backward(loom_gpt2 *m, loom_tensor dqkv, loom_tensor dbias, loom_tensor dout, loom_tensor qkv,
                               loom_tensor out, loom_tensor lse) {
    if (m->cp.attention_backward) {
        m->cp.attention_backward(m->cp.ctx, dqkv, dout, qkv, out, lse, m->NH);
        return false;
    }
    m->be->attention_backward(m->be, dqkv, dqkv, dbias, dout, qkv, qkv, out, lse, m->NH, LOOM_ATTN_CAUSAL);
    return dbias.data != NULL;
}

// Block l's linear layer with weight k as the backend's FP8 scaling site names it (backend.h's
// fp8_site): the weight's parameter index, the same in the layer's forward and backward, so their
// casts share the layer's amax histories under delayed scaling.
static int site_of(const loom_gpt2 *m, int l, int k) { return m->block_at[l] + k; }

// Block l's weight k for a matmul op, naming its linear layer as the FP8 site. The block
// functions end with no site named (no_site), so a matmul op outside them takes no layer's.
static loom_tensor linear_weight(const loom_gpt2 *m, int l, int k) {
    m->be->fp8_site = site_of(m, l, k);
    return gpt2_param(m, l, k);
}

// Block l's MLP weights for mlp_forward and mlp_backward, naming its two layers' sites as linear_weight does
// (backend.h's fp8_site_fc: the fc layer's, fp8_site: the fcproj layer's).
static void mlp_weights(const loom_gpt2 *m, int l, loom_tensor *fcw, loom_tensor *projw) {
    *fcw = linear_weight(m, l, B_FCW);
    m->be->fp8_site_fc = m->be->fp8_site;
    *projw = linear_weight(m, l, B_FCPROJW);
}

// Names block l's linear layer k as the one whose input the next LayerNorm op writes (backend.h's
// fp8_site_ln: under FP8 delayed scaling the LayerNorm may write that input's FP8 copy too), and
// whether that layer's products are all that read the output in bf16 (fp8_ln_copy_only: the
// LayerNorm outputs recomputed where the backward reads them, no tensor-parallel gather).
static void layernorm_feeds(const loom_gpt2 *m, int l, int k) {
    m->be->fp8_site_ln = site_of(m, l, k);
    m->be->fp8_ln_copy_only = gpt2_norms_recomputed(m) && !m->tp.gather;
}

static void no_site(const loom_gpt2 *m) {
    m->be->fp8_site = m->be->fp8_site_fc = m->be->fp8_site_ln = -1;
    m->be->fp8_ln_copy_only = false;
}

void loom_gpt2_fp8_weights(loom_gpt2 *m) {
    loom_backend *be = m->be;
    if (!be->fp8_weights || !m->params) return;
    static const int K[] = {B_QKVW, B_ATTPROJW, B_FCW, B_FCPROJW}; // the linear layers' weights
    enum { NK = sizeof K / sizeof *K };
    loom_tensor *w = loom_xmalloc((size_t)m->cfg.num_layers * NK * sizeof *w);
    int *sites = loom_xmalloc((size_t)m->cfg.num_layers * NK * sizeof *sites), n = 0;
    for (int l = 0; l < m->cfg.num_layers; l++)
        for (int k = 0; m->block_at[l] >= 0 && k < NK; k++, n++) {
            w[n] = gpt2_param(m, l, K[k]);
            sites[n] = site_of(m, l, K[k]);
        }
    be->fp8_weights(be, w, sites, n);
    free(w);
    free(sites);
}

// Where the partial products of a layer whose reduced rows go to `local` are summed: local
// itself when it holds all rows, else the shared (N,C) scratch.
static loom_tensor partial(const gpt2_views *v, loom_tensor local) {
    return loom_rows(&local) == v->N ? local : v->proj;
}

// The input of block l: the chunk's input (or embedding) or the previous block's output.
static loom_tensor block_input(const gpt2_views *v, int l) {
    int i = l - v->first;
    return i == 0 ? v->a.encoded : layer(&v->a.residual3, i - 1);
}

// Whether the blocks keep gelu(fch) for the backward (else it recomputes it)
static bool act_kept(const loom_gpt2 *m) {
    return m->recompute != LOOM_RECOMPUTE_GELU && m->recompute != LOOM_RECOMPUTE_SELECTIVE;
}

// Block l on its input x (Nl,C): writes its activations and residual3 (its output).
static void block_forward(loom_gpt2 *m, const gpt2_views *v, int l, loom_tensor x) {
    loom_backend *be = m->be;
    const loom_gpt2_acts *a = &v->a;
    int i = l - v->first;
    loom_tensor ln1 = norm_out(m, &a->ln1, i), qkv = layer(&a->qkv, i), atty = layer(&a->atty, i);
    loom_tensor residual2 = layer(&a->residual2, i), ln2 = norm_out(m, &a->ln2, i);
    loom_tensor fch = layer(&a->fch, i), fch_gelu = layer(&a->fch_gelu, i), out = v->proj_local, fcw, projw;
    layernorm_feeds(m, l, B_QKVW);
    be->layernorm_forward(be, gpt2_mine(m, v, ln1), layer(&a->ln1_mean, i), layer(&a->ln1_rstd, i), x,
                          gpt2_param(m, l, B_LN1W), gpt2_param(m, l, B_LN1B));
    tp_gather(m, ln1, gpt2_mine(m, v, ln1));
    be->matmul_forward(be, qkv, ln1, linear_weight(m, l, B_QKVW), gpt2_param(m, l, B_QKVB));
    attention_forward(m, atty, layer(&a->att_lse, i), qkv);
    // With no reduce point (one device's products hold whole sums) the residual adds ride on the
    // row-parallel products; else they follow the reductions.
    bool whole = !m->tp.reduce;
    loom_tensor residual3 = layer(&a->residual3, i), ln2_mean = layer(&a->ln2_mean, i),
                ln2_rstd = layer(&a->ln2_rstd, i), ln2w = gpt2_param(m, l, B_LN2W), ln2b = gpt2_param(m, l, B_LN2B);
    loom_tensor attprojw = linear_weight(m, l, B_ATTPROJW), attprojb = gpt2_applied(m, l, B_ATTPROJB);
    if (whole) {
        be->matmul_residual_forward(be, residual2, atty, attprojw, attprojb, x);
        layernorm_feeds(m, l, B_FCW);
        be->layernorm_forward(be, ln2, ln2_mean, ln2_rstd, residual2, ln2w, ln2b);
    } else {
        be->matmul_forward(be, partial(v, out), atty, attprojw, attprojb);
        tp_reduce(m, out, partial(v, out));
        layernorm_feeds(m, l, B_FCW);
        be->residual_layernorm_forward(be, residual2, gpt2_mine(m, v, ln2), ln2_mean, ln2_rstd, x, out, ln2w, ln2b);
        tp_gather(m, ln2, gpt2_mine(m, v, ln2));
    }
    mlp_weights(m, l, &fcw, &projw); // gelu(fch) need not be kept when the backward recomputes it
    bool kept = act_kept(m);
    loom_tensor fcb = gpt2_param(m, l, B_FCB), projb = gpt2_applied(m, l, B_FCPROJB);
    if (whole) {
        be->mlp_forward(be, residual3, fch, fch_gelu, kept, ln2, fcw, fcb, projw, projb, residual2);
    } else {
        be->mlp_forward(be, partial(v, out), fch, fch_gelu, kept, ln2, fcw, fcb, projw, projb, no_tensor());
        tp_reduce(m, out, partial(v, out));
        be->residual_forward(be, residual3, residual2, out);
    }
    no_site(m);
}

// Where block l's backward puts the gradients of its matmuls' outputs: the shared scratch when
// the weight gradients are computed at once, else the slot, kept for the weight pass.
typedef struct {
    loom_tensor fcproj, fch, attproj, qkv; // (N,C), (N,4Cl), (N,C), (B,T,3Cl)
} block_douts;

static block_douts douts_of(const gpt2_views *v, int l, loom_grad_part part) {
    if (part == LOOM_GRAD_ALL) return (block_douts){v->dfull, v->dfch, v->dfull, v->dqkv};
    int i = l - v->first;
    const loom_gpt2_acts *a = &v->a;
    return (block_douts){layer(&a->dfcproj, i), layer(&a->dfch, i), layer(&a->dattproj, i), layer(&a->dqkv, i)};
}

// A projection's output gradient (N,C), for the weight pass when it is kept in the slot.
static void keep(loom_gpt2 *m, loom_tensor kept, loom_tensor d) {
    if (kept.data != d.data) m->be->copy(m->be, kept.data, d.data, loom_nbytes(&d));
}

// Block l's weight and bias gradients from its matmuls' output gradients d (the weight pass, or
// the end of a whole backward).
static void block_weights(loom_gpt2 *m, const gpt2_views *v, int l, block_douts d) {
    loom_backend *be = m->be;
    const loom_gpt2_acts *a = &v->a;
    int i = l - v->first;
    loom_tensor none = no_tensor();
    if (!act_kept(m)) be->gelu_forward(be, layer(&a->fch_gelu, i), layer(&a->fch, i));
    be->matmul_backward(be, none, gpt2_grad(m, l, B_FCPROJW), gpt2_grad(m, l, B_FCPROJB), d.fcproj,
                        layer(&a->fch_gelu, i), linear_weight(m, l, B_FCPROJW));
    be->matmul_backward(be, none, gpt2_grad(m, l, B_FCW), gpt2_grad(m, l, B_FCB), d.fch, layer(&a->ln2, i),
                        linear_weight(m, l, B_FCW));
    be->matmul_backward(be, none, gpt2_grad(m, l, B_ATTPROJW), gpt2_grad(m, l, B_ATTPROJB), d.attproj,
                        layer(&a->atty, i), linear_weight(m, l, B_ATTPROJW));
    be->matmul_backward(be, none, gpt2_grad(m, l, B_QKVW), gpt2_grad(m, l, B_QKVB), d.qkv, layer(&a->ln1, i),
                        linear_weight(m, l, B_QKVW));
    no_site(m);
}

// Block l's LayerNorm output *t (ln1 or ln2: the input of its linear layer k), for that layer's
// backward; where the norms are recomputed (gpt2_norms_recomputed) written again from its input x,
// weight kw and bias kb, unless the backend kept its own copy of it for that layer's products
// (backend.h's input_kept). With tensor parallelism it is always written again (and gathered):
// every rank takes part.
static loom_tensor norm_again(loom_gpt2 *m, const gpt2_views *v, int l, int k, const loom_tensor *t, loom_tensor x,
                              int kw, int kb) {
    loom_backend *be = m->be;
    int i = l - v->first;
    loom_tensor out = norm_out(m, t, i);
    if (!gpt2_norms_recomputed(m)) return out;
    if (!m->tp.gather && be->input_kept && be->input_kept(be, out, site_of(m, l, k))) return out;
    const loom_tensor *mean = t == &v->a.ln1 ? &v->a.ln1_mean : &v->a.ln2_mean;
    const loom_tensor *rstd = t == &v->a.ln1 ? &v->a.ln1_rstd : &v->a.ln2_rstd;
    be->fp8_site_ln = -1; // no FP8 copy: the products cast what they read
    be->layernorm_forward(be, gpt2_mine(m, v, out), layer(mean, i), layer(rstd, i), x, gpt2_param(m, l, kw),
                          gpt2_param(m, l, kb));
    tp_gather(m, out, gpt2_mine(m, v, out));
    return out;
}

// Block l's backward from v->dres = d(loss)/d(block output) to d(loss)/d(block input) in v->dres,
// with the LayerNorm gradients; the matmuls' weight gradients too when part is LOOM_GRAD_ALL
// (each at once, as their inputs' gradients), else their output gradients are kept for
// block_weights.
static void block_backward(loom_gpt2 *m, const gpt2_views *v, int l, loom_tensor x, loom_grad_part part) {
    loom_backend *be = m->be;
    const loom_gpt2_acts *a = &v->a;
    int i = l - v->first;
    bool all = part == LOOM_GRAD_ALL;
    block_douts d = douts_of(v, l, part);
    be->grads_write = m->grads_fresh[l]; // each op below writes or adds its own tensors (set only for ALL)
    be->grads_defer = true;              // its gradients finished together at the end (grads_flush)
    if (m->recompute == LOOM_RECOMPUTE_FULL) block_forward(m, v, l, x); // the block's activations again
    loom_tensor atty = layer(&a->atty, i), none = no_tensor(), fcw, projw;
    loom_tensor datty = LOOM_VIEW(v->dbtc.data, be->dtype, v->B, v->T, loom_cols(&atty)); // (B,T,Cl)
    tp_gather(m, v->dfull, v->dres);
    keep(m, d.fcproj, v->dfull);
    loom_tensor ln2 = norm_again(m, v, l, B_FCW, &a->ln2, layer(&a->residual2, i), B_LN2W, B_LN2B);
    mlp_weights(m, l, &fcw, &projw); // gelu(fch) recomputed in the op when not kept
    be->mlp_backward(be, v->dbtc, d.fch, all ? gpt2_grad(m, l, B_FCW) : none, all ? gpt2_grad(m, l, B_FCB) : none,
                     all ? gpt2_grad(m, l, B_FCPROJW) : none, all ? gpt2_grad(m, l, B_FCPROJB) : none, v->dfull,
                     ln2, fcw, layer(&a->fch, i), layer(&a->fch_gelu, i), act_kept(m), projw);
    tp_reduce(m, v->dlocal, v->dbtc);
    // dres becomes d(loss)/d(residual2), the attproj layer's output gradient: where it has all the
    // rows, the LayerNorm backward sums its columns into the attproj bias gradient as it writes it
    bool all_rows = v->dres.data == v->dfull.data && loom_rows(&v->dres) == loom_rows(&v->dfull);
    loom_tensor dprojb = all ? gpt2_grad(m, l, B_ATTPROJB) : none;
    be->layernorm_backward(be, v->dres, gpt2_grad(m, l, B_LN2W), gpt2_grad(m, l, B_LN2B), all_rows ? dprojb : none,
                           v->dlocal, layer(&a->residual2, i), gpt2_param(m, l, B_LN2W), layer(&a->ln2_mean, i),
                           layer(&a->ln2_rstd, i));
    tp_gather(m, v->dfull, v->dres);
    keep(m, d.attproj, v->dfull);
    be->matmul_backward(be, datty, all ? gpt2_grad(m, l, B_ATTPROJW) : none, all_rows ? none : dprojb, v->dfull,
                        atty, linear_weight(m, l, B_ATTPROJW));
    loom_tensor dqkvb = all ? gpt2_grad(m, l, B_QKVB) : none;
    if (attention_backward(m, d.qkv, dqkvb, datty, layer(&a->qkv, i), atty, layer(&a->att_lse, i)))
        dqkvb = none; // summed there
    loom_tensor ln1 = norm_again(m, v, l, B_QKVW, &a->ln1, x, B_LN1W, B_LN1B);
    be->matmul_backward(be, v->dbtc, all ? gpt2_grad(m, l, B_QKVW) : none, dqkvb, d.qkv, ln1,
                        linear_weight(m, l, B_QKVW));
    tp_reduce(m, v->dlocal, v->dbtc);
    be->layernorm_backward(be, v->dres, gpt2_grad(m, l, B_LN1W), gpt2_grad(m, l, B_LN1B), none, v->dlocal, x,
                           gpt2_param(m, l, B_LN1W), layer(&a->ln1_mean, i), layer(&a->ln1_rstd, i));
    be->grads_write = m->grads_fresh[l] = false;
    be->grads_defer = false;
    be->grads_flush(be);
    no_site(m);
}

// The embedding (the first chunk of the first stage; else the chunk's input is copied in), the
// chunk's blocks, and after the last chunk of the last stage the final LayerNorm with its rows
// gathered into a->lnf.
static void forward_body(loom_gpt2 *m, const gpt2_views *v, loom_tensor input) {
    loom_backend *be = m->be;
    range_push(m, "forward", -1);
    if (v->embed) {
        loom_hooks_run(&m->hooks, LOOM_HOOK_FORWARD, -1);
        loom_tensor x = v->a.encoded;
        embed_forward(m, v, partial(v, x));
        tp_reduce(m, x, partial(v, x));
    } else {
        LOOM_CHECK(loom_numel(&input) == loom_numel(&v->a.encoded));
        be->copy(be, v->a.encoded.data, input.data, loom_nbytes(&v->a.encoded));
    }
    for (int l = v->first; l < v->first + v->nblocks; l++) {
        loom_hooks_run(&m->hooks, LOOM_HOOK_FORWARD, l);
        range_push(m, "block", l);
        gpt2_offload_before_forward(m, v, l - v->first);
        block_forward(m, v, l, block_input(v, l));
        gpt2_offload_after_forward(m, v, l - v->first);
        range_pop(m);
    }
    if (v->head) {
        loom_hooks_run(&m->hooks, LOOM_HOOK_FORWARD, m->cfg.num_layers);
        loom_tensor lnf = gpt2_mine(m, v, v->a.lnf);
        be->layernorm_forward(be, lnf, v->a.lnf_mean, v->a.lnf_rstd, block_input(v, v->first + v->nblocks),
                              m->p[m->lnfw], m->p[m->lnfb]);
        tp_gather(m, v->a.lnf, lnf);
    }
    range_pop(m);
}

static void crossentropy(loom_gpt2 *m, loom_tensor losses, loom_tensor logits, loom_tensor targets, float dloss,
                         bool backward) {
    if (m->tp.crossentropy)
        m->tp.crossentropy(m->tp.ctx, losses, logits, targets, m->vocab_start, m->cfg.vocab_size, dloss, backward);
    else
        m->be->softmax_crossentropy(m->be, losses, logits, targets, m->cfg.vocab_size, dloss, backward);
}

// Output layer and loss over row chunks; with backward, also dlnf on all rows (into v->dbtc,
// then reduced into a->dlnf) and dwte +=; the per-token losses into a->losses. Its products stay
// in bf16 under precision fp8, as torchao's and Transformer Engine's recipes keep the output
// layer out of FP8.
static void head(loom_gpt2 *m, const gpt2_views *v, float dloss, bool backward) {
    loom_backend *be = m->be;
    bool fp8 = be->fp8;
    be->fp8 = false;
    const loom_gpt2_acts *a = &v->a;
    int64_t N = v->N, chunk = gpt2_equal_chunk(N, v->logits.shape[0]);
    for (int64_t r0 = 0; r0 < N; r0 += chunk) {
        int64_t r1 = r0 + chunk < N ? r0 + chunk : N, n = r1 - r0;
        loom_tensor lnf = loom_row_slice(&a->lnf, r0, r1);    // (n,C)
        loom_tensor logits = loom_row_slice(&v->logits, 0, n); // (n,Vl)
        loom_tensor losses = LOOM_VIEW((float *)a->losses.data + r0, LOOM_F32, n);
        loom_tensor targets = LOOM_VIEW((int32_t *)a->targets.data + r0, LOOM_I32, n);
        be->matmul_forward(be, logits, lnf, m->p[m->wte], no_tensor());
        crossentropy(m, losses, logits, targets, dloss, backward);
        if (backward) { // the first chunk writes dwte when it is fresh, the others add
            be->grads_write = m->grads_fresh[m->cfg.num_layers + 1];
            be->matmul_backward(be, loom_row_slice(&v->dbtc, r0, r1), m->g[m->wte], no_tensor(), logits, lnf,
                                m->p[m->wte]);
            be->grads_write = m->grads_fresh[m->cfg.num_layers + 1] = false;
        }
    }
    be->fp8 = fp8;
    if (backward) tp_reduce(m, a->dlnf, v->dbtc);
}

double loom_gpt2_mean_loss(const float *losses, int64_t n) {
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += losses[i];
    return sum / (double)n;
}

double gpt2_mean_loss(loom_gpt2 *m, const gpt2_views *v) {
    float *losses = loom_xmalloc((size_t)v->N * sizeof(float));
    m->be->download(m->be, losses, v->a.losses.data, (size_t)v->N * sizeof(float));
    double mean = loom_gpt2_mean_loss(losses, v->N);
    free(losses);
    return mean;
}

loom_tensor loom_gpt2_stage_forward(loom_gpt2 *m, int slot, int chunk, loom_tensor input, bool backward,
                                    float grad_scale, double *loss) {
    LOOM_CHECK(!backward || m->training);
    gpt2_views v = gpt2_views_of(m, slot, chunk);
    forward_body(m, &v, input);
    if (!v.head) return layer(&v.a.residual3, v.nblocks - 1);
    range_push(m, "head", -1);
    head(m, &v, grad_scale / (float)v.N, backward);
    range_pop(m);
    if (loss) *loss = gpt2_mean_loss(m, &v);
    return no_tensor();
}

// The weight part: each block's weight gradients from the output gradients its input part kept.
static void weights_backward(loom_gpt2 *m, const gpt2_views *v) {
    for (int l = v->first + v->nblocks - 1; l >= v->first; l--) {
        range_push(m, "block weights", l);
        block_weights(m, v, l, douts_of(v, l, LOOM_GRAD_WEIGHT));
        range_pop(m);
        loom_hooks_run(&m->hooks, LOOM_HOOK_GRADS, l);
    }
}

loom_tensor loom_gpt2_stage_backward(loom_gpt2 *m, int slot, int chunk, loom_tensor dout, loom_grad_part part) {
    LOOM_CHECK(m->training && (part == LOOM_GRAD_ALL || m->split_backward));
    loom_backend *be = m->be;
    int L = m->cfg.num_layers;
    gpt2_views v = gpt2_views_of(m, slot, chunk);
    if (part == LOOM_GRAD_WEIGHT) {
        weights_backward(m, &v);
        return no_tensor();
    }
    int last = v.first + v.nblocks;
    range_push(m, "backward", -1);
    if (v.head) {
        loom_hooks_run(&m->hooks, LOOM_HOOK_BACKWARD, L);
        gpt2_offload_before_backward(m, &v, v.nblocks); // the last block's output resident
        be->zero(be, v.dres.data, loom_nbytes(&v.dres));
        be->grads_write = m->grads_fresh[L];
        be->layernorm_backward(be, v.dres, m->g[m->lnfw], m->g[m->lnfb], no_tensor(), v.a.dlnf, block_input(&v, last),
                               m->p[m->lnfw], v.a.lnf_mean, v.a.lnf_rstd);
        be->grads_write = m->grads_fresh[L] = false;
        loom_hooks_run(&m->hooks, LOOM_HOOK_GRADS, L);
    } else {
        LOOM_CHECK(loom_numel(&dout) == loom_numel(&v.dres));
        be->copy(be, v.dres.data, dout.data, loom_nbytes(&v.dres));
    }
    for (int l = last - 1; l >= v.first; l--) {
        // here dres = d(loss)/d(block l output)
        loom_hooks_run(&m->hooks, LOOM_HOOK_BACKWARD, l);
        range_push(m, "block backward", l);
        gpt2_offload_before_backward(m, &v, l - v.first);
        block_backward(m, &v, l, block_input(&v, l), part);
        range_pop(m);
        if (part == LOOM_GRAD_ALL) loom_hooks_run(&m->hooks, LOOM_HOOK_GRADS, l);
    }
    loom_tensor din = v.dres;
    if (v.embed) {
        loom_hooks_run(&m->hooks, LOOM_HOOK_BACKWARD, -1);
        tp_gather(m, v.dfull, v.dres);
        embed_backward(m, &v, v.dfull);
        loom_hooks_run(&m->hooks, LOOM_HOOK_GRADS, -1);
        din = no_tensor();
    }
    range_pop(m);
    return din;
}

void loom_gpt2_next_logits(loom_gpt2 *m, const int32_t *tokens, int T, float *logits) {
    // sequence parallelism needs whole row shards: pad the end (causal attention keeps the
    // padding from changing the earlier positions)
    int Tp = (T + m->row_shards - 1) / m->row_shards * m->row_shards;
    int32_t *padded = loom_xcalloc((size_t)Tp, sizeof(int32_t));
    memcpy(padded, tokens, (size_t)T * sizeof(int32_t));
    loom_gpt2_set_batch(m, 0, padded, NULL, 1, Tp);
    free(padded);
    LOOM_CHECK(m->layout.stage.num_chunks == 1 && m->layout.stage.embed && m->layout.stage.head && !m->cp.parts);
    gpt2_views v = gpt2_views_of(m, 0, 0);
    forward_body(m, &v, no_tensor());
    loom_tensor last = loom_row_slice(&v.a.lnf, T - 1, T);
    loom_tensor out = loom_row_slice(&v.logits, 0, 1);
    bool fp8 = m->be->fp8; // the output layer in bf16, as head()
    m->be->fp8 = false;
    m->be->matmul_forward(m->be, out, last, m->p[m->wte], no_tensor());
    m->be->fp8 = fp8;
    if (m->tp.gather_vocab) {
        m->tp.gather_vocab(m->tp.ctx, logits, out);
        return;
    }
    float *raw = loom_xmalloc((size_t)loom_nbytes(&out));
    m->be->download(m->be, raw, out.data, loom_nbytes(&out));
    loom_dtype_to_f32(logits, raw, m->be->dtype, (size_t)loom_numel(&out));
    free(raw);
}
