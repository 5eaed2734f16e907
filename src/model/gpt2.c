// GPT-2 forward and backward; see gpt2.h. The forward pass, block by block:
//
//   x = wte[tokens] + wpe[0:T]                                   (B,T,C)
//   for each layer l:
//     qkv       = ln1(x) @ qkvw^T + qkvb                          (B,T,3C)
//     atty      = causal_attention(qkv)                           (B,T,C)
//     residual2 = x + atty @ attprojw^T + attprojb                (B,T,C)  (add fused with ln2)
//     fch       = ln2(residual2) @ fcw^T + fcb                    (B,T,4C) (GELU fused in)
//     x         = residual2 + gelu(fch) @ fcprojw^T + fcprojb     (B,T,C)  (= residual3)
//   logits = lnf(x) @ wte^T                                       (B,T,Vp)
//   loss   = mean cross-entropy over the first V logits
#include "model/gpt2.h"

#include <string.h>

static loom_tensor no_tensor(void) { return (loom_tensor){0}; }

// Per-layer slice of a stacked activation (slot 0 when the layers share one slot).
static loom_tensor layer(const loom_tensor *t, int l) {
    return loom_index(t, t->shape[0] == 1 ? 0 : l);
}

static size_t align_up(size_t n) { return (n + 63) & ~(size_t)63; }

// Lays the activation views out for (B, T) from `base` (NULL: just count the bytes).
static size_t layout_acts(loom_gpt2_acts *a, char *base, const loom_gpt2 *m, int B, int T,
                          bool training) {
    int64_t C = m->cfg.channels, NH = m->cfg.num_heads, Vp = m->cfg.padded_vocab_size;
    int64_t L = training ? m->cfg.num_layers : 1, N = (int64_t)B * T;
    // what backward recomputes needs one slot, reused by every layer
    int64_t Lb = m->recompute == LOOM_RECOMPUTE_FULL ? 1 : L; // block internals
    int64_t Lg = m->recompute != LOOM_RECOMPUTE_NONE ? 1 : L; // GELU output
    int64_t chunk = N < m->logits_chunk ? N : m->logits_chunk;
    loom_dtype dt = m->be->dtype;
    size_t off = 0;
#define TAKE(field, dtype, ...)                                                   \
    do {                                                                          \
        a->field = LOOM_VIEW(base ? base + off : NULL, dtype, __VA_ARGS__);       \
        off += align_up(loom_nbytes(&a->field));                                  \
    } while (0)
    TAKE(tokens, LOOM_I32, B, T);
    TAKE(targets, LOOM_I32, B, T);
    TAKE(encoded, dt, B, T, C);
    TAKE(ln1, dt, Lb, B, T, C);
    TAKE(ln1_mean, LOOM_F32, Lb, B, T);
    TAKE(ln1_rstd, LOOM_F32, Lb, B, T);
    TAKE(qkv, dt, Lb, B, T, 3 * C);
    TAKE(atty, dt, Lb, B, T, C);
    TAKE(att_lse, LOOM_F32, Lb, B, NH, T);
    TAKE(residual2, dt, Lb, B, T, C);
    TAKE(ln2, dt, Lb, B, T, C);
    TAKE(ln2_mean, LOOM_F32, Lb, B, T);
    TAKE(ln2_rstd, LOOM_F32, Lb, B, T);
    TAKE(fch, dt, Lb, B, T, 4 * C);
    TAKE(fch_gelu, dt, Lg, B, T, 4 * C);
    TAKE(residual3, dt, L, B, T, C);
    TAKE(proj, dt, B, T, C);
    TAKE(lnf, dt, B, T, C);
    TAKE(lnf_mean, LOOM_F32, B, T);
    TAKE(lnf_rstd, LOOM_F32, B, T);
    TAKE(logits, dt, chunk, Vp);
    TAKE(losses, LOOM_F32, N);
#undef TAKE
    return off;
}

static size_t layout_grad_acts(loom_gpt2_grad_acts *g, char *base, const loom_gpt2 *m, int B,
                               int T) {
    int64_t C = m->cfg.channels;
    loom_dtype dt = m->be->dtype;
    size_t off = 0;
    loom_tensor *views[] = {&g->dresidual, &g->dbtc, &g->dqkv, &g->dfch};
    const int64_t widths[] = {C, C, 3 * C, 4 * C};
    for (int i = 0; i < 4; i++) {
        *views[i] = LOOM_VIEW(base ? base + off : NULL, dt, B, T, widths[i]);
        off += align_up(loom_nbytes(views[i]));
    }
    return off;
}

static void make_views(loom_tensor *views, void *flat, const loom_gpt2 *m) {
    size_t es = loom_dtype_size(m->be->dtype);
    for (int t = 0; t < LOOM_GPT2_NUM_TENSORS; t++) {
        const loom_param_spec *s = &m->specs[t];
        views[t] = loom_view_dims(flat ? (char *)flat + (size_t)s->offset * es : NULL, m->be->dtype,
                                  s->shape, s->ndim);
    }
}

loom_status loom_gpt2_create(loom_gpt2 **out, loom_backend *be, const loom_gpt2_config *cfg) {
    *out = NULL;
    LOOM_TRY(loom_gpt2_config_validate(cfg));
    loom_gpt2 *m = loom_xcalloc(1, sizeof *m);
    m->cfg = *cfg;
    m->be = be;
    m->num_elements = loom_gpt2_param_table(cfg, m->specs);
    // at most the backend's preferred chunk of logits, and at least 64 rows
    m->logits_chunk = (int)(be->chunk_bytes / ((size_t)cfg->padded_vocab_size * loom_dtype_size(be->dtype)));
    if (m->logits_chunk < 64) m->logits_chunk = 64;
    size_t bytes = (size_t)m->num_elements * loom_dtype_size(be->dtype);
    m->params = be->alloc(be, bytes);
    if (!m->params) {
        free(m);
        return loom_fail(LOOM_ENOMEM, "use a smaller model", "cannot allocate %zu bytes of parameters",
                         bytes);
    }
    make_views(m->p, m->params, m);
    *out = m;
    return LOOM_OK;
}

void loom_gpt2_free(loom_gpt2 *m) {
    if (!m) return;
    m->be->free(m->be, m->params);
    m->be->free(m->be, m->grads);
    m->be->free(m->be, m->acts_mem);
    m->be->free(m->be, m->grad_acts_mem);
    free(m);
}

void loom_gpt2_init(loom_gpt2 *m, uint64_t seed) {
    float *host = loom_xmalloc((size_t)m->num_elements * sizeof(float));
    for (int t = 0; t < LOOM_GPT2_NUM_TENSORS; t++) {
        const loom_param_spec *s = &m->specs[t];
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < s->numel; i++)
            host[s->offset + i] = loom_gpt2_init_value(&m->cfg, s, t, i, seed);
    }
    loom_gpt2_set_params(m, host);
    free(host);
}

// fp32 host values <-> n elements of the backend's dtype at dev
static void upload_f32(loom_backend *be, void *dev, const float *host, size_t n) {
    void *tmp = loom_xmalloc(n * loom_dtype_size(be->dtype));
    loom_f32_to_dtype(tmp, be->dtype, host, n);
    be->upload(be, dev, tmp, n * loom_dtype_size(be->dtype));
    free(tmp);
}

static void download_f32(loom_backend *be, float *host, const void *dev, size_t n) {
    void *tmp = loom_xmalloc(n * loom_dtype_size(be->dtype));
    be->download(be, tmp, dev, n * loom_dtype_size(be->dtype));
    loom_dtype_to_f32(host, tmp, be->dtype, n);
    free(tmp);
}

void loom_gpt2_set_params(loom_gpt2 *m, const float *host) {
    upload_f32(m->be, m->params, host, (size_t)m->num_elements);
}

void loom_gpt2_get_params(loom_gpt2 *m, float *host) {
    download_f32(m->be, host, m->params, (size_t)m->num_elements);
}

void loom_gpt2_get_grads(loom_gpt2 *m, float *host) {
    LOOM_CHECK(m->grads);
    download_f32(m->be, host, m->grads, (size_t)m->num_elements);
}

loom_status loom_gpt2_alloc(loom_gpt2 *m, int B, int T, bool training) {
    loom_backend *be = m->be;
    if (B < 1) return loom_fail(LOOM_EINVAL, "use --batch 1 or more", "batch size %d is below 1", B);
    if (T < 1) return loom_fail(LOOM_EINVAL, "use --seq 1 or more", "sequence length %d is below 1", T);
    if (T > m->cfg.max_seq_len)
        return loom_fail(LOOM_EINVAL, "lower --seq to the model's maximum or below",
                         "sequence length %d exceeds the model's maximum %d", T, m->cfg.max_seq_len);
    be->free(be, m->acts_mem);
    be->free(be, m->grad_acts_mem);
    m->acts_mem = m->grad_acts_mem = NULL;
    m->max_B = B;
    m->max_T = T;
    m->training = training;
    loom_gpt2_acts a;
    loom_gpt2_grad_acts ga;
    size_t abytes = layout_acts(&a, NULL, m, B, T, training);
    size_t gbytes = training ? layout_grad_acts(&ga, NULL, m, B, T) : 0;
    size_t pbytes = (size_t)m->num_elements * loom_dtype_size(be->dtype);
    m->acts_mem = be->alloc(be, abytes);
    if (training && !m->grads) {
        m->grads = be->alloc(be, pbytes);
        make_views(m->g, m->grads, m);
    }
    if (training) m->grad_acts_mem = be->alloc(be, gbytes);
    if (!m->acts_mem || (training && (!m->grads || !m->grad_acts_mem)))
        return loom_fail(LOOM_ENOMEM, "lower --batch or --seq",
                         "cannot allocate %zu bytes of activations for B=%d T=%d", abytes + gbytes,
                         B, T);
    return LOOM_OK;
}

size_t loom_gpt2_memory_bytes(const loom_gpt2 *m) {
    loom_gpt2_acts a;
    loom_gpt2_grad_acts ga;
    size_t pbytes = (size_t)m->num_elements * loom_dtype_size(m->be->dtype);
    size_t total = pbytes + (m->grads ? pbytes : 0);
    if (m->acts_mem) total += layout_acts(&a, NULL, m, m->max_B, m->max_T, m->training);
    if (m->grad_acts_mem) total += layout_grad_acts(&ga, NULL, m, m->max_B, m->max_T);
    return total;
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

// Block l on its input x (B,T,C): writes its activations and residual3[l] (its output).
static void block_forward(loom_gpt2 *m, const loom_gpt2_acts *a, int l, loom_tensor x) {
    loom_backend *be = m->be;
    const loom_tensor *p = m->p;
    loom_tensor ln1 = layer(&a->ln1, l), qkv = layer(&a->qkv, l), atty = layer(&a->atty, l);
    loom_tensor residual2 = layer(&a->residual2, l), ln2 = layer(&a->ln2, l);
    loom_tensor fch = layer(&a->fch, l), fch_gelu = layer(&a->fch_gelu, l);
    be->layernorm_forward(be, ln1, layer(&a->ln1_mean, l), layer(&a->ln1_rstd, l), x,
                          loom_index(&p[P_LN1W], l), loom_index(&p[P_LN1B], l));
    be->matmul_forward(be, qkv, ln1, loom_index(&p[P_QKVW], l), loom_index(&p[P_QKVB], l));
    be->attention_forward(be, atty, layer(&a->att_lse, l), qkv, m->cfg.num_heads);
    be->matmul_forward(be, a->proj, atty, loom_index(&p[P_ATTPROJW], l), loom_index(&p[P_ATTPROJB], l));
    be->residual_layernorm_forward(be, residual2, ln2, layer(&a->ln2_mean, l), layer(&a->ln2_rstd, l),
                                   x, a->proj, loom_index(&p[P_LN2W], l), loom_index(&p[P_LN2B], l));
    be->matmul_gelu_forward(be, fch_gelu, fch, ln2, loom_index(&p[P_FCW], l), loom_index(&p[P_FCB], l));
    be->matmul_forward(be, a->proj, fch_gelu, loom_index(&p[P_FCPROJW], l), loom_index(&p[P_FCPROJB], l));
    be->residual_forward(be, layer(&a->residual3, l), residual2, a->proj);
}

// The input of block l: the embeddings or the previous block's output.
static loom_tensor block_input(const loom_gpt2_acts *a, int l) {
    return l == 0 ? a->encoded : layer(&a->residual3, l - 1);
}

// Embedding and the L blocks; leaves the final LayerNorm's output in a->lnf.
static void forward_blocks(loom_gpt2 *m, const loom_gpt2_acts *a) {
    loom_backend *be = m->be;
    const loom_tensor *p = m->p;
    int L = m->cfg.num_layers;
    range_push(m, "forward", -1);
    be->encoder_forward(be, a->encoded, a->tokens, p[P_WTE], p[P_WPE], 0);
    for (int l = 0; l < L; l++) {
        range_push(m, "block", l);
        block_forward(m, a, l, block_input(a, l));
        range_pop(m);
    }
    be->layernorm_forward(be, a->lnf, a->lnf_mean, a->lnf_rstd, block_input(a, L), p[P_LNFW], p[P_LNFB]);
    range_pop(m);
}

// Output layer and loss over row chunks; with backward, also dlnf (into dlnf) and dwte +=.
// Returns the mean loss over the B*T tokens.
static double head(loom_gpt2 *m, const loom_gpt2_acts *a, float dloss, bool backward,
                   loom_tensor dlnf) {
    loom_backend *be = m->be;
    int64_t N = loom_rows(&a->lnf), max_chunk = a->logits.shape[0];
    int64_t nchunks = (N + max_chunk - 1) / max_chunk, chunk = (N + nchunks - 1) / nchunks; // equal chunks
    for (int64_t r0 = 0; r0 < N; r0 += chunk) {
        int64_t r1 = r0 + chunk < N ? r0 + chunk : N, n = r1 - r0;
        loom_tensor lnf = loom_row_slice(&a->lnf, r0, r1);    // (n,C)
        loom_tensor logits = loom_row_slice(&a->logits, 0, n); // (n,Vp)
        loom_tensor losses = LOOM_VIEW((float *)a->losses.data + r0, LOOM_F32, n);
        loom_tensor targets = LOOM_VIEW((int32_t *)a->targets.data + r0, LOOM_I32, n);
        be->matmul_forward(be, logits, lnf, m->p[P_WTE], no_tensor());
        be->softmax_crossentropy(be, losses, logits, targets, m->cfg.vocab_size, dloss, backward);
        if (backward)
            be->matmul_backward(be, loom_row_slice(&dlnf, r0, r1), m->g[P_WTE], no_tensor(), logits,
                                lnf, m->p[P_WTE]);
    }
    float *losses = loom_xmalloc((size_t)N * sizeof(float));
    be->download(be, losses, a->losses.data, (size_t)N * sizeof(float));
    double sum = 0;
    for (int64_t i = 0; i < N; i++) sum += losses[i];
    free(losses);
    return sum / (double)N;
}

static void grads_ready(loom_gpt2 *m, int stage) {
    if (m->grads_ready) m->grads_ready(m->grads_ready_ctx, stage);
}

// Backward from dlnf (in g->dbtc) through the blocks and the embedding into m->grads.
static void backward_blocks(loom_gpt2 *m, const loom_gpt2_acts *a, const loom_gpt2_grad_acts *g) {
    loom_backend *be = m->be;
    const loom_tensor *p = m->p, *dp = m->g;
    int L = m->cfg.num_layers, NH = m->cfg.num_heads;
    loom_tensor dres = g->dresidual;
    be->zero(be, dres.data, loom_nbytes(&dres));
    be->layernorm_backward(be, dres, dp[P_LNFW], dp[P_LNFB], g->dbtc, layer(&a->residual3, L - 1),
                           p[P_LNFW], a->lnf_mean, a->lnf_rstd);
    grads_ready(m, L);
    for (int l = L - 1; l >= 0; l--) {
        // here dres = d(loss)/d(block l output)
        range_push(m, "block backward", l);
        loom_tensor x = block_input(a, l);
        if (m->recompute == LOOM_RECOMPUTE_FULL) block_forward(m, a, l, x); // the block's activations again
        else if (m->recompute == LOOM_RECOMPUTE_GELU) be->gelu_forward(be, layer(&a->fch_gelu, l), layer(&a->fch, l));
        loom_tensor residual2 = layer(&a->residual2, l), atty = layer(&a->atty, l);
        be->matmul_gelu_backward(be, g->dfch, loom_index(&dp[P_FCPROJW], l), loom_index(&dp[P_FCPROJB], l),
                                 dres, layer(&a->fch_gelu, l), loom_index(&p[P_FCPROJW], l), layer(&a->fch, l));
        be->matmul_backward(be, g->dbtc, loom_index(&dp[P_FCW], l), loom_index(&dp[P_FCB], l), g->dfch,
                            layer(&a->ln2, l), loom_index(&p[P_FCW], l));
        be->layernorm_backward(be, dres, loom_index(&dp[P_LN2W], l), loom_index(&dp[P_LN2B], l), g->dbtc,
                               residual2, loom_index(&p[P_LN2W], l), layer(&a->ln2_mean, l),
                               layer(&a->ln2_rstd, l));
        // dres = d(loss)/d(residual2)
        be->matmul_backward(be, g->dbtc, loom_index(&dp[P_ATTPROJW], l),
                            loom_index(&dp[P_ATTPROJB], l), dres, atty, loom_index(&p[P_ATTPROJW], l));
        be->attention_backward(be, g->dqkv, g->dbtc, layer(&a->qkv, l), atty, layer(&a->att_lse, l), NH);
        be->matmul_backward(be, g->dbtc, loom_index(&dp[P_QKVW], l), loom_index(&dp[P_QKVB], l), g->dqkv,
                            layer(&a->ln1, l), loom_index(&p[P_QKVW], l));
        be->layernorm_backward(be, dres, loom_index(&dp[P_LN1W], l), loom_index(&dp[P_LN1B], l), g->dbtc,
                               x, loom_index(&p[P_LN1W], l), layer(&a->ln1_mean, l),
                               layer(&a->ln1_rstd, l));
        range_pop(m);
        grads_ready(m, l);
    }
    be->encoder_backward(be, dp[P_WTE], dp[P_WPE], dres, a->tokens, 0);
    grads_ready(m, -1);
}

loom_status loom_recompute_parse(const char *name, loom_recompute *mode) {
    const char *names[] = {"none", "gelu", "full"};
    for (int i = 0; i < 3; i++)
        if (strcmp(name, names[i]) == 0) {
            *mode = (loom_recompute)i;
            return LOOM_OK;
        }
    return loom_fail(LOOM_EINVAL, "modes are: none, gelu, full", "unknown --recompute mode '%s'", name);
}

static void check_batch(const loom_gpt2 *m, int B, int T) {
    LOOM_CHECK(m->acts_mem && B >= 1 && T >= 1 && B <= m->max_B && T <= m->max_T);
}

static loom_gpt2_acts upload_batch(loom_gpt2 *m, const int32_t *inputs, const int32_t *targets,
                                   int B, int T) {
    check_batch(m, B, T);
    loom_gpt2_acts a;
    layout_acts(&a, m->acts_mem, m, B, T, m->training);
    size_t bytes = (size_t)B * T * sizeof(int32_t);
    m->be->upload(m->be, a.tokens.data, inputs, bytes);
    if (targets) m->be->upload(m->be, a.targets.data, targets, bytes);
    return a;
}

double loom_gpt2_loss(loom_gpt2 *m, const int32_t *inputs, const int32_t *targets, int B, int T) {
    loom_gpt2_acts a = upload_batch(m, inputs, targets, B, T);
    forward_blocks(m, &a);
    return head(m, &a, 0.0f, false, no_tensor());
}

double loom_gpt2_forward_backward(loom_gpt2 *m, const int32_t *inputs, const int32_t *targets,
                                  int B, int T, float grad_scale) {
    LOOM_CHECK(m->training);
    loom_gpt2_acts a = upload_batch(m, inputs, targets, B, T);
    loom_gpt2_grad_acts g;
    layout_grad_acts(&g, m->grad_acts_mem, m, B, T);
    forward_blocks(m, &a);
    range_push(m, "head", -1);
    double loss = head(m, &a, grad_scale / (float)(B * T), true, g.dbtc);
    range_pop(m);
    range_push(m, "backward", -1);
    backward_blocks(m, &a, &g);
    range_pop(m);
    return loss;
}

void loom_gpt2_zero_grads(loom_gpt2 *m) {
    m->be->zero(m->be, m->grads, (size_t)m->num_elements * loom_dtype_size(m->be->dtype));
}

void loom_gpt2_next_logits(loom_gpt2 *m, const int32_t *tokens, int T, float *logits) {
    loom_gpt2_acts a = upload_batch(m, tokens, NULL, 1, T);
    forward_blocks(m, &a);
    loom_tensor last = loom_row_slice(&a.lnf, T - 1, T);
    loom_tensor out = loom_row_slice(&a.logits, 0, 1);
    m->be->matmul_forward(m->be, out, last, m->p[P_WTE], no_tensor());
    download_f32(m->be, logits, out.data, (size_t)m->cfg.padded_vocab_size);
}
