// GPT-2 model objects: creation on a layout, parameters in and out, activation memory and its
// views; the passes are in gpt2_forward.c. See gpt2.h.
#include "model/gpt2_internal.h"

#include <string.h>

static size_t align_up(size_t n) { return (n + 63) & ~(size_t)63; }

#define TAKE(view, field, dtype, ...)                                          \
    do {                                                                       \
        (view)->field = LOOM_VIEW(base ? base + off : NULL, dtype, __VA_ARGS__); \
        off += align_up(loom_nbytes(&(view)->field));                          \
    } while (0)

static int64_t width(const loom_gpt2 *m, int k) { // output rows of block tensor k in this shard
    int first = m->layout.stage.chunk[0].first_block;
    return m->table.params[m->block_at[first] + k].local_shape[0];
}

// Rows of the residual stream this rank holds for N tokens.
static int64_t local_rows(const loom_gpt2 *m, int64_t N) { return N / m->row_shards; }

// Rows of the output layer's logits buffer for N rows: one of the equal chunks of at most
// logits_chunk rows that the head walks.
static int64_t logits_rows(const loom_gpt2 *m, int64_t N) { return gpt2_equal_chunk(N, m->logits_chunk); }

// Scratch shared by the slots, laid out from `base` (NULL: just count the bytes), its logits buffer
// `rows` rows (logits_rows of the largest N the memory holds) or N if fewer.
static size_t layout_shared(gpt2_views *v, char *base, const loom_gpt2 *m, int B, int T, int64_t rows) {
    int64_t C = m->cfg.channels, N = (int64_t)B * T, Nl = local_rows(m, N), chunk = N < rows ? N : rows;
    int64_t Vl = m->wte >= 0 ? m->table.params[m->wte].local_shape[0] : 0;
    loom_dtype dt = m->be->dtype;
    size_t off = 0;
    if (m->layout.stage.head) TAKE(v, logits, dt, chunk, Vl);
    TAKE(v, proj, dt, N, C);
    if (Nl != N) TAKE(v, proj_local, dt, Nl, C);
    else v->proj_local = v->proj;
    return off;
}

// One slot's activations for a chunk of the stage. Training keeps every block's (or,
// recomputed, one reused slot).
static size_t layout_slot(loom_gpt2_acts *a, char *base, const loom_gpt2 *m, int B, int T, bool training) {
    int64_t C = m->cfg.channels, NH = m->NH, N = (int64_t)B * T, Nl = local_rows(m, N);
    int64_t L = training ? m->chunk_blocks : 1;
    if (training && m->offload_activations && L > GPT2_OFFLOAD_RESIDENT) L = GPT2_OFFLOAD_RESIDENT; // gpt2_offload.c
    int64_t Lb = m->recompute == LOOM_RECOMPUTE_FULL ? 1 : L; // block internals
    int64_t Lg = m->recompute != LOOM_RECOMPUTE_NONE ? 1 : L; // GELU output
    // the LayerNorm outputs recomputed: one buffer, each block's view GPT2_NORM_SHIFT bytes after
    // the last one's (gpt2_forward.c's norm_out)
    bool norms = training && gpt2_norms_recomputed(m);
    int64_t Ln = norms ? 1 : Lb;
    size_t shift = norms ? (size_t)(L - 1) * GPT2_NORM_SHIFT : 0;
    loom_dtype dt = m->be->dtype;
    size_t off = 0;
    *a = (loom_gpt2_acts){0};
    TAKE(a, tokens, LOOM_I32, B, T);
    TAKE(a, targets, LOOM_I32, B, T);
    TAKE(a, encoded, dt, Nl, C);
    if (m->chunk_blocks > 0) {
        int64_t Cl = width(m, B_QKVW) / 3, C4 = width(m, B_FCW);
        TAKE(a, ln1, dt, Ln, N, C);
        off += shift;
        TAKE(a, ln1_mean, LOOM_F32, Lb, Nl);
        TAKE(a, ln1_rstd, LOOM_F32, Lb, Nl);
        TAKE(a, qkv, dt, Lb, B, T, 3 * Cl);
        TAKE(a, atty, dt, Lb, B, T, Cl);
        TAKE(a, att_lse, LOOM_F32, Lb, B, NH, T);
        TAKE(a, residual2, dt, Lb, Nl, C);
        TAKE(a, ln2, dt, Ln, N, C);
        off += shift;
        TAKE(a, ln2_mean, LOOM_F32, Lb, Nl);
        TAKE(a, ln2_rstd, LOOM_F32, Lb, Nl);
        TAKE(a, fch, dt, Lb, N, C4);
        TAKE(a, fch_gelu, dt, Lg, N, C4);
        TAKE(a, residual3, dt, L, Nl, C);
        if (training && m->split_backward) {
            TAKE(a, dfcproj, dt, L, N, C);
            TAKE(a, dattproj, dt, L, N, C);
            TAKE(a, dfch, dt, L, N, C4);
            TAKE(a, dqkv, dt, L, B, T, 3 * Cl);
        }
    }
    if (m->layout.stage.head) {
        TAKE(a, lnf, dt, N, C);
        TAKE(a, lnf_mean, LOOM_F32, Nl);
        TAKE(a, lnf_rstd, LOOM_F32, Nl);
        TAKE(a, losses, LOOM_F32, N);
        if (training && m->slots > 1) TAKE(a, dlnf, dt, Nl, C); // one slot: the gradient scratch holds it
    }
    return off;
}

static size_t layout_grads(gpt2_views *v, char *base, const loom_gpt2 *m, int B, int T) {
    int64_t C = m->cfg.channels, N = (int64_t)B * T, Nl = local_rows(m, N);
    int64_t Cl = m->chunk_blocks ? width(m, B_QKVW) / 3 : 0, C4 = m->chunk_blocks ? width(m, B_FCW) : 0;
    loom_dtype dt = m->be->dtype;
    size_t off = 0;
    TAKE(v, dfull, dt, N, C);
    TAKE(v, dbtc, dt, N, C);
    if (Nl != N) TAKE(v, dlocal, dt, Nl, C);
    else v->dlocal = v->dbtc;
    if (Cl) TAKE(v, dqkv, dt, B, T, 3 * Cl);
    if (C4) TAKE(v, dfch, dt, N, C4);
    v->dres = base ? gpt2_mine(m, v, v->dfull) : v->dfull;
    return off;
}
#undef TAKE

bool gpt2_norms_recomputed(const loom_gpt2 *m) {
    return m->recompute == LOOM_RECOMPUTE_SELECTIVE && !m->split_backward && !m->offload_activations;
}

loom_tensor gpt2_mine(const loom_gpt2 *m, const gpt2_views *v, loom_tensor full) {
    return loom_row_slice(&full, m->row_shard * v->Nl, (m->row_shard + 1) * v->Nl);
}

gpt2_views gpt2_views_of(const loom_gpt2 *m, int slot, int chunk) {
    const loom_stage *st = &m->layout.stage;
    LOOM_CHECK(m->acts_mem && slot >= 0 && slot < m->slots && m->slot_B[slot] > 0 && chunk >= 0 && chunk < st->num_chunks);
    int B = m->slot_B[slot], T = m->slot_T[slot];
    gpt2_views v = {.slot = slot, .B = B, .T = T, .N = (int64_t)B * T, .Nl = local_rows(m, (int64_t)B * T),
                    .first = st->chunk[chunk].first_block, .nblocks = st->chunk[chunk].num_blocks,
                    .embed = st->embed && chunk == 0, .head = st->head && chunk == st->num_chunks - 1};
    char *base = m->acts_mem; // the slots, then the scratch they share
    size_t per_slot = layout_slot(&v.a, NULL, m, m->max_B, m->max_T, m->training);
    layout_slot(&v.a, base + (size_t)slot * per_slot, m, B, T, m->training);
    layout_shared(&v, base + (size_t)m->slots * per_slot, m, B, T, logits_rows(m, (int64_t)m->max_B * m->max_T));
    if (m->training) {
        layout_grads(&v, m->grad_acts_mem, m, B, T);
        if (m->slots == 1 && m->layout.stage.head) v.a.dlnf = v.dlocal;
    }
    return v;
}

static int find(const loom_gpt2 *m, const char *name, int layer) {
    for (int i = 0; i < m->table.count; i++)
        if (m->table.params[i].layer == layer && strcmp(m->table.params[i].name, name) == 0) return i;
    return -1;
}

static void make_views(loom_tensor *views, void *flat, const loom_gpt2 *m) {
    size_t es = loom_dtype_size(m->be->dtype);
    for (int i = 0; i < m->table.count; i++) {
        const loom_param *p = &m->table.params[i];
        views[i] = loom_view_dims(flat ? (char *)flat + (size_t)p->offset * es : NULL, m->be->dtype, p->local_shape, p->ndim);
    }
}

loom_tensor gpt2_param(const loom_gpt2 *m, int l, int k) { return m->p[m->block_at[l] + k]; }
loom_tensor gpt2_grad(const loom_gpt2 *m, int l, int k) { return m->g[m->block_at[l] + k]; }
loom_tensor gpt2_applied(const loom_gpt2 *m, int l, int k) {
    int i = m->block_at[l] + k;
    return m->table.params[i].applies ? m->p[i] : (loom_tensor){0};
}

loom_status loom_gpt2_create(loom_gpt2 **out, loom_backend *be, const loom_gpt2_config *cfg) {
    loom_gpt2_layout whole = {loom_gpt2_whole(cfg), 0, 1, false, false};
    return loom_gpt2_create_layout(out, be, cfg, &whole);
}

loom_status loom_gpt2_create_layout(loom_gpt2 **out, loom_backend *be, const loom_gpt2_config *cfg,
                                    const loom_gpt2_layout *layout) {
    *out = NULL;
    LOOM_TRY(loom_gpt2_config_validate(cfg));
    loom_gpt2 *m = loom_xcalloc(1, sizeof *m);
    *m = (loom_gpt2){.cfg = *cfg, .be = be, .layout = *layout, .slots = 1,
                     .row_shards = layout->sequence_parallel ? layout->tp_size : 1,
                     .row_shard = layout->sequence_parallel ? layout->tp_rank : 0};
    loom_status s = loom_gpt2_param_table(cfg, &layout->stage, layout->tp_rank, layout->tp_size, &m->table);
    if (s != LOOM_OK) {
        free(m);
        return s;
    }
    m->num_elements = m->table.num_elements;
    m->wte = find(m, "wte", layout->stage.embed ? -1 : cfg->num_layers);
    m->wpe = find(m, "wpe", -1);
    m->lnfw = find(m, "lnfw", cfg->num_layers);
    m->lnfb = find(m, "lnfb", cfg->num_layers);
    m->block_at = loom_xmalloc((size_t)cfg->num_layers * sizeof(int));
    for (int l = 0; l < cfg->num_layers; l++) m->block_at[l] = find(m, "qkvw", l);
    m->grads_fresh = loom_xcalloc((size_t)cfg->num_layers + 2, sizeof(bool));
    for (int c = 0; c < layout->stage.num_chunks; c++)
        if (layout->stage.chunk[c].num_blocks > m->chunk_blocks) m->chunk_blocks = layout->stage.chunk[c].num_blocks;
    int64_t Vl = m->wte >= 0 ? m->table.params[m->wte].local_shape[0] : 0;
    m->vocab_start = m->wte >= 0 ? (int)(loom_param_global_index(&m->table.params[m->wte], layout->tp_rank, layout->tp_size, 0) / cfg->channels) : 0;
    m->NH = cfg->num_heads / layout->tp_size; // heads are whole per shard (checked by the table)
    // at most the backend's preferred chunk of logits, and at least 64 rows
    m->logits_chunk = Vl ? (int)(be->chunk_bytes / ((size_t)Vl * loom_dtype_size(be->dtype))) : 64;
    if (m->logits_chunk < 64) m->logits_chunk = 64;
    size_t bytes = (size_t)m->num_elements * loom_dtype_size(be->dtype);
    m->params = layout->external_params ? NULL : be->alloc(be, bytes);
    m->p = loom_xcalloc((size_t)m->table.count, sizeof(loom_tensor));
    m->g = loom_xcalloc((size_t)m->table.count, sizeof(loom_tensor));
    if (!m->params && !layout->external_params) {
        loom_gpt2_free(m);
        return loom_fail(LOOM_ENOMEM, "use a smaller model", "cannot allocate %zu bytes of parameters", bytes);
    }
    make_views(m->p, m->params, m);
    make_views(m->g, NULL, m);
    *out = m;
    return LOOM_OK;
}

void loom_gpt2_free(loom_gpt2 *m) {
    if (!m) return;
    m->be->free(m->be, m->params);
    m->be->free(m->be, m->grads);
    m->be->free(m->be, m->acts_mem);
    m->be->free(m->be, m->grad_acts_mem);
    gpt2_offload_free(m);
    loom_param_table_free(&m->table);
    free(m->p);
    free(m->g);
    free(m->block_at);
    free(m->grads_fresh);
    free(m->slot_B);
    free(m->slot_T);
    free(m);
}

// fp32 host values -> n elements of the backend's dtype at dev
static void upload_f32(loom_backend *be, void *dev, const float *host, size_t n) {
    void *tmp = loom_xmalloc(n * loom_dtype_size(be->dtype));
    loom_f32_to_dtype(tmp, be->dtype, host, n);
    be->upload(be, dev, tmp, n * loom_dtype_size(be->dtype));
    free(tmp);
}

void loom_gpt2_download(const loom_gpt2 *m, const void *flat, float *host) {
    size_t n = (size_t)m->num_elements;
    void *tmp = loom_xmalloc(n * loom_dtype_size(m->be->dtype));
    m->be->download(m->be, tmp, flat, n * loom_dtype_size(m->be->dtype));
    loom_dtype_to_f32(host, tmp, m->be->dtype, n);
    free(tmp);
}

void loom_gpt2_init(loom_gpt2 *m, uint64_t seed) {
    LOOM_CHECK(m->params);
    float *local = loom_xmalloc((size_t)m->num_elements * sizeof(float));
    loom_param_table_init(&m->table, seed, local);
    upload_f32(m->be, m->params, local, (size_t)m->num_elements);
    free(local);
}

void loom_gpt2_set_params(loom_gpt2 *m, const float *file) {
    LOOM_CHECK(m->params);
    float *local = loom_xmalloc((size_t)m->num_elements * sizeof(float));
    loom_param_table_copy(&m->table, m->table.tp_rank, local, (float *)file, false);
    upload_f32(m->be, m->params, local, (size_t)m->num_elements);
    free(local);
}

static void get_flat(loom_gpt2 *m, const void *flat, float *file) {
    LOOM_CHECK(flat);
    float *local = loom_xmalloc((size_t)m->num_elements * sizeof(float));
    loom_gpt2_download(m, flat, local);
    loom_param_table_copy(&m->table, m->table.tp_rank, local, file, true);
    free(local);
}

void loom_gpt2_get_params(loom_gpt2 *m, float *file) { get_flat(m, m->params, file); }

void loom_gpt2_get_grads(loom_gpt2 *m, float *file) {
    LOOM_CHECK(m->grads);
    get_flat(m, m->grads, file);
}

loom_status loom_gpt2_alloc(loom_gpt2 *m, int B, int T, bool training) {
    loom_backend *be = m->be;
    if (B < 1) return loom_fail(LOOM_EINVAL, "use --batch 1 or more", "batch size %d is below 1", B);
    if (T < 1) return loom_fail(LOOM_EINVAL, "use --seq 1 or more", "sequence length %d is below 1", T);
    int64_t whole = m->cp.parts ? (int64_t)T / m->cp.parts * m->cp.chunks : T; // context parallelism: T is a share
    if (whole > m->cfg.max_seq_len)
        return loom_fail(LOOM_EINVAL, "lower --seq to the model's maximum or below",
                         "sequence length %lld exceeds the model's maximum %d", (long long)whole, m->cfg.max_seq_len);
    if (T % m->row_shards != 0)
        return loom_fail(LOOM_EINVAL, "use a --seq divisible by --tp with --sp",
                         "sequence parallelism splits the rows over %d ranks, but the sequence length is %d",
                         m->row_shards, T);
    if (training && m->split_backward && m->recompute == LOOM_RECOMPUTE_FULL)
        return loom_fail(LOOM_EINVAL, "use --recompute none, gelu or selective with a zero-bubble schedule",
                         "a split backward keeps each block's activations until its weight gradient, which "
                         "--recompute full discards");
    if (training && m->split_backward && m->offload_activations)
        return loom_fail(LOOM_EINVAL, "drop --offload activations with a zero-bubble schedule",
                         "a split backward keeps each block's activations on the device until its weight gradient");
    LOOM_CHECK(m->slots >= 1);
    be->free(be, m->acts_mem);
    be->free(be, m->grad_acts_mem);
    m->acts_mem = m->grad_acts_mem = NULL;
    m->max_B = B;
    m->max_T = T;
    m->training = training;
    free(m->slot_B);
    free(m->slot_T);
    m->slot_B = loom_xcalloc((size_t)m->slots, sizeof(int));
    m->slot_T = loom_xcalloc((size_t)m->slots, sizeof(int));
    gpt2_views v;
    size_t abytes = layout_shared(&v, NULL, m, B, T, logits_rows(m, (int64_t)B * T)) +
                    (size_t)m->slots * layout_slot(&v.a, NULL, m, B, T, training);
    size_t gbytes = training ? layout_grads(&v, NULL, m, B, T) : 0;
    size_t pbytes = (size_t)m->num_elements * loom_dtype_size(be->dtype);
    m->acts_mem = be->alloc(be, abytes);
    bool own = !m->layout.external_params;
    if (training && own && !m->grads) {
        m->grads = be->alloc(be, pbytes);
        make_views(m->g, m->grads, m);
    }
    if (training) m->grad_acts_mem = be->alloc(be, gbytes);
    if (!m->acts_mem || (training && ((own && !m->grads) || !m->grad_acts_mem)))
        return loom_fail(LOOM_ENOMEM, "lower --batch or --seq",
                         "cannot allocate %zu bytes of activations for B=%d T=%d", abytes + gbytes, B, T);
    return gpt2_offload_alloc(m, &v.a);
}

size_t loom_gpt2_activation_bytes(const loom_gpt2 *m, int B, int T, bool training, size_t *offloaded) {
    gpt2_views v;
    size_t bytes = layout_shared(&v, NULL, m, B, T, logits_rows(m, (int64_t)B * T)) +
                   (size_t)m->slots * layout_slot(&v.a, NULL, m, B, T, training) +
                   (training ? layout_grads(&v, NULL, m, B, T) : 0);
    *offloaded = training && m->offload_activations ? gpt2_offload_plan(m, &v.a) : 0;
    return bytes;
}

size_t loom_gpt2_memory_bytes(const loom_gpt2 *m, size_t *offloaded) {
    if (offloaded) *offloaded = gpt2_offload_bytes(m);
    gpt2_views v;
    size_t pbytes = (size_t)m->num_elements * loom_dtype_size(m->be->dtype);
    size_t total = (m->params ? pbytes : 0) + (m->grads ? pbytes : 0);
    if (m->acts_mem)
        total += layout_shared(&v, NULL, m, m->max_B, m->max_T, logits_rows(m, (int64_t)m->max_B * m->max_T)) +
                 (size_t)m->slots * layout_slot(&v.a, NULL, m, m->max_B, m->max_T, m->training);
    if (m->grad_acts_mem) total += layout_grads(&v, NULL, m, m->max_B, m->max_T);
    return total;
}

static const char *const recompute_names[] = {"none", "gelu", "selective", "full"};

const char *loom_recompute_name(loom_recompute mode) { return recompute_names[mode]; }

loom_status loom_recompute_parse(const char *name, loom_recompute *mode) {
    for (int i = 0; i < (int)(sizeof recompute_names / sizeof *recompute_names); i++)
        if (strcmp(name, recompute_names[i]) == 0) {
            *mode = (loom_recompute)i;
            return LOOM_OK;
        }
    return loom_fail(LOOM_EINVAL, "modes are: none, gelu, selective, full", "unknown --recompute mode '%s'", name);
}

// The micro-batch of slot `slot`, moved to its token and target buffers by `move` (be->upload or
// be->copy).
static void put_batch(loom_gpt2 *m, int slot, const int32_t *inputs, const int32_t *targets, int B, int T,
                      void (*move)(loom_backend *be, void *dst, const void *src, size_t bytes)) {
    LOOM_CHECK(m->acts_mem && slot >= 0 && slot < m->slots && B >= 1 && T >= 1 && B <= m->max_B && T <= m->max_T);
    m->slot_B[slot] = B;
    m->slot_T[slot] = T;
    gpt2_views v = gpt2_views_of(m, slot, 0);
    size_t bytes = (size_t)B * T * sizeof(int32_t);
    if (inputs) move(m->be, v.a.tokens.data, inputs, bytes);
    if (targets) move(m->be, v.a.targets.data, targets, bytes);
}

void loom_gpt2_set_batch(loom_gpt2 *m, int slot, const int32_t *inputs, const int32_t *targets, int B, int T) {
    put_batch(m, slot, inputs, targets, B, T, m->be->upload);
}

void loom_gpt2_copy_batch(loom_gpt2 *m, int slot, const int32_t *inputs, const int32_t *targets, int B, int T) {
    put_batch(m, slot, inputs, targets, B, T, m->be->copy);
}

double loom_gpt2_loss(loom_gpt2 *m, const int32_t *inputs, const int32_t *targets, int B, int T) {
    double loss = 0;
    loom_gpt2_set_batch(m, 0, inputs, targets, B, T);
    loom_gpt2_stage_forward(m, 0, 0, (loom_tensor){0}, false, 0.0f, &loss);
    return loss;
}

// Forward and backward of the whole model on slot 0 (*loss: as loom_gpt2_stage_forward's, read
// back once the backward is queued, so that the device runs on while the host waits for it).
static void passes(loom_gpt2 *m, float grad_scale, double *loss) {
    LOOM_CHECK(m->training);
    loom_gpt2_stage_forward(m, 0, 0, (loom_tensor){0}, true, grad_scale, NULL);
    loom_gpt2_stage_backward(m, 0, 0, (loom_tensor){0}, LOOM_GRAD_ALL);
    if (loss) {
        gpt2_views v = gpt2_views_of(m, 0, 0);
        *loss = gpt2_mean_loss(m, &v);
    }
}

double loom_gpt2_forward_backward(loom_gpt2 *m, const int32_t *inputs, const int32_t *targets,
                                  int B, int T, float grad_scale) {
    double loss = 0;
    loom_gpt2_set_batch(m, 0, inputs, targets, B, T);
    passes(m, grad_scale, &loss);
    return loss;
}

loom_tensor loom_gpt2_forward_backward_losses(loom_gpt2 *m, float grad_scale) {
    passes(m, grad_scale, NULL);
    return gpt2_views_of(m, 0, 0).a.losses;
}

static void zero_grad(loom_gpt2 *m, int k) {
    if (k >= 0) m->be->zero(m->be, m->g[k].data, loom_nbytes(&m->g[k]));
}

void loom_gpt2_zero_grads(loom_gpt2 *m) {
    if (!m->grads) return;
    if (m->split_backward) {
        m->be->zero(m->be, m->grads, (size_t)m->num_elements * loom_dtype_size(m->be->dtype));
        return;
    }
    int L = m->cfg.num_layers;
    for (int l = 0; l < L; l++) m->grads_fresh[l] = m->block_at[l] >= 0;
    m->grads_fresh[L] = m->lnfw >= 0;
    m->grads_fresh[L + 1] = m->wte >= 0 && m->layout.stage.head;
    zero_grad(m, m->wpe); // the embedding's backward adds the rows of the positions seen
    if (!m->layout.stage.head) zero_grad(m, m->wte); // and of the tokens seen
}
