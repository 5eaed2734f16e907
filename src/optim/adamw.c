#include "optim/adamw.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

// The slices cut at the table's tensor edges; neighbours that continue each other joined.
static void make_ranges(loom_adamw *o, const loom_param_table *table, const loom_param_slice *slices, int nslices,
                        bool sharded_params) {
    for (int k = 0; k < nslices; k++) {
        const loom_param_slice *sl = &slices[k];
        for (int64_t at = sl->offset; at < sl->offset + sl->numel;) {
            int i = loom_param_table_find(table, at);
            LOOM_CHECK(i >= 0);
            const loom_param *p = &table->params[i];
            int64_t end = p->offset + p->local_numel < sl->offset + sl->numel ? p->offset + p->local_numel
                                                                              : sl->offset + sl->numel;
            int64_t shard0 = p->shard.kind == LOOM_SHARD_REPLICATED ? 0 : (int64_t)table->tp_rank * p->local_numel;
            int64_t state = sl->state_offset + (at - sl->offset);
            loom_param_range r = {sharded_params ? state : at, state, end - at, p->weight_decay,
                                  p->whole_offset + shard0 + (at - p->offset)};
            loom_param_range *last = o->nranges ? &o->ranges[o->nranges - 1] : NULL;
            if (last && last->weight_decay == r.weight_decay && last->param_offset + last->numel == r.param_offset &&
                last->state_offset + last->numel == r.state_offset && last->index0 + last->numel == r.index0) {
                last->numel += r.numel;
            } else {
                o->ranges = realloc(o->ranges, (size_t)(o->nranges + 1) * sizeof *o->ranges);
                LOOM_CHECK(o->ranges);
                o->ranges[o->nranges++] = r;
            }
            at = end;
        }
    }
}

// Elements of one piece of an offloaded step or of the master weights' initialisation: the host
// buffers in transit are this size, not the state's.
enum { OFFLOAD_PIECE = 1 << 22 };

bool loom_adamw_splits(loom_dtype dt, loom_adamw_offload offload, bool stochastic_rounding) {
    return dt == LOOM_BF16 && offload == LOOM_ADAMW_ON_DEVICE && !stochastic_rounding;
}

// Bytes of master weight a parameter: split 2, whole 4 (lower-precision parameters, or the state
// on the host), none 0.
static size_t master_bytes(loom_dtype dt, loom_adamw_offload offload, bool stochastic_rounding) {
    return loom_adamw_splits(dt, offload, stochastic_rounding) ? 2 : dt != LOOM_F32 || offload ? 4 : 0;
}

size_t loom_adamw_state_bytes(int64_t n, loom_dtype dt, loom_adamw_offload offload, bool stochastic_rounding) {
    return (size_t)n * (2 * sizeof(float) + master_bytes(dt, offload, stochastic_rounding));
}

loom_status loom_adamw_create(loom_adamw **out, loom_backend *be, const loom_param_table *table,
                              const loom_param_slice *slices, int nslices, int64_t n, bool sharded_params,
                              loom_adamw_offload offload, bool stochastic_rounding) {
    LOOM_CHECK(offload != LOOM_ADAMW_OFFLOAD_PARAMS || sharded_params);
    loom_adamw *o = loom_xcalloc(1, sizeof *o);
    o->be = o->state_be = be;
    o->n = n;
    o->offload = offload;
    loom_status s = offload ? loom_backend_create(&o->state_be, "cpu", LOOM_F32) : LOOM_OK;
    if (s != LOOM_OK) {
        free(o);
        return s;
    }
    loom_backend *st = o->state_be;
    o->m = st->alloc(st, (size_t)n * sizeof(float));
    o->v = st->alloc(st, (size_t)n * sizeof(float));
    size_t master = master_bytes(be->dtype, offload, stochastic_rounding);
    o->split_master = loom_adamw_splits(be->dtype, offload, stochastic_rounding);
    if (master) o->master = st->alloc(st, (size_t)n * master);
    if (offload) {
        int64_t piece = n < OFFLOAD_PIECE ? n : OFFLOAD_PIECE;
        o->host_grads = malloc((size_t)piece * sizeof(float));
        o->staging = be->host_alloc(be, (size_t)piece * loom_dtype_size(be->dtype));
    }
    make_ranges(o, table, slices, nslices, sharded_params);
    *out = o;
    if (!o->m || !o->v || (master && !o->master) || (offload && (!o->host_grads || !o->staging))) {
        loom_adamw_free(o);
        *out = NULL;
        return loom_fail(LOOM_ENOMEM, "use a smaller model or a higher --zero stage",
                         "cannot allocate %lld bytes of AdamW state%s",
                         (long long)loom_adamw_state_bytes(n, be->dtype, offload, stochastic_rounding),
                         offload ? " in host memory" : "");
    }
    return LOOM_OK;
}

void loom_adamw_free(loom_adamw *o) {
    if (!o) return;
    o->state_be->free(o->state_be, o->m);
    o->state_be->free(o->state_be, o->v);
    o->state_be->free(o->state_be, o->master);
    if (o->state_be != o->be) loom_backend_destroy(o->state_be);
    free(o->host_grads);
    o->be->host_free(o->be, o->staging);
    free(o->ranges);
    free(o);
}

// Split master weights equal to their parameters: low halves 0.
static void zero_lows(loom_adamw *o) {
    for (int r = 0; r < o->nranges; r++) {
        const loom_param_range *g = &o->ranges[r];
        o->be->zero(o->be, (uint16_t *)o->master + g->state_offset, (size_t)g->numel * sizeof(uint16_t));
    }
}

void loom_adamw_init_master(loom_adamw *o, const void *params, int64_t num_elements) {
    if (!o->master) return;
    if (o->split_master) {
        zero_lows(o);
        return;
    }
    loom_backend *be = o->be;
    size_t es = loom_dtype_size(be->dtype);
    void *raw = loom_xmalloc((size_t)OFFLOAD_PIECE * es);
    float *master = loom_xmalloc((size_t)OFFLOAD_PIECE * sizeof(float));
    for (int r = 0; r < o->nranges; r++) { // piece by piece, so no whole-model copy is made on the host
        const loom_param_range *g = &o->ranges[r];
        LOOM_CHECK(g->param_offset + g->numel <= num_elements);
        for (int64_t at = 0; at < g->numel; at += OFFLOAD_PIECE) {
            int64_t n = g->numel - at < OFFLOAD_PIECE ? g->numel - at : OFFLOAD_PIECE;
            const char *src = (const char *)params + (size_t)(g->param_offset + at) * es;
            if (o->offload == LOOM_ADAMW_OFFLOAD_PARAMS) memcpy(raw, src, (size_t)n * es);
            else be->download(be, raw, src, (size_t)n * es);
            loom_dtype_to_f32(master, raw, be->dtype, (size_t)n);
            o->state_be->upload(o->state_be, (float *)o->master + g->state_offset + at, master, (size_t)n * sizeof(float));
        }
    }
    free(raw);
    free(master);
}

// Split master weights of range g, piece by piece as fp32 through host buffers: joined with the
// parameters into out (get), or their low halves cut from in against the parameters (set).
static void split_pieces(const loom_adamw *o, const loom_param_range *g, const void *params, float *out,
                         const float *in) {
    loom_backend *be = o->be;
    int64_t piece = g->numel < OFFLOAD_PIECE ? g->numel : OFFLOAD_PIECE;
    uint16_t *high = loom_xmalloc((size_t)piece * sizeof(uint16_t));
    uint16_t *low = loom_xmalloc((size_t)piece * sizeof(uint16_t));
    for (int64_t at = 0; at < g->numel; at += OFFLOAD_PIECE) {
        int64_t n = g->numel - at < OFFLOAD_PIECE ? g->numel - at : OFFLOAD_PIECE, s = g->state_offset + at;
        uint16_t *dlow = (uint16_t *)o->master + s;
        be->download(be, high, (const uint16_t *)params + g->param_offset + at, (size_t)n * sizeof(uint16_t));
        if (out) {
            be->download(be, low, dlow, (size_t)n * sizeof(uint16_t));
            for (int64_t i = 0; i < n; i++) {
                uint32_t bits = loom_split_join(high[i], low[i]);
                memcpy(&out[s + i], &bits, sizeof bits);
            }
        } else {
            for (int64_t i = 0; i < n; i++) {
                uint32_t bits;
                memcpy(&bits, &in[s + i], sizeof bits);
                low[i] = loom_split_low_near(high[i], bits);
            }
            be->upload(be, dlow, low, (size_t)n * sizeof(uint16_t));
        }
    }
    free(high);
    free(low);
}

void loom_adamw_master_get(const loom_adamw *o, const void *params, float *out) {
    if (!o->split_master) {
        if (o->master) o->state_be->download(o->state_be, out, o->master, (size_t)o->n * sizeof(float));
        return;
    }
    memset(out, 0, (size_t)o->n * sizeof(float));
    for (int r = 0; r < o->nranges; r++) split_pieces(o, &o->ranges[r], params, out, NULL);
}

void loom_adamw_master_set(loom_adamw *o, const void *params, const float *in) {
    if (!o->split_master) {
        if (o->master) o->state_be->upload(o->state_be, o->master, in, (size_t)o->n * sizeof(float));
        return;
    }
    for (int r = 0; r < o->nranges; r++) split_pieces(o, &o->ranges[r], params, NULL, in);
}

// The update of range g on the backend: params from master (whole or split, or params alone)
// and grads, both indexed like the state.
static void update_range(loom_adamw *o, const loom_param_range *g, void *params, void *grads, loom_adamw_args args) {
    loom_backend *be = o->be;
    int64_t n = g->numel;
    size_t es = loom_dtype_size(be->dtype);
    bool whole = o->master && !o->split_master;
    if (o->split_master) args.master_low = (uint16_t *)o->master + g->state_offset;
    be->adamw_update(be, loom_view_dims((char *)params + (size_t)g->param_offset * es, be->dtype, &n, 1),
                     whole ? loom_view_dims((float *)o->master + g->state_offset, LOOM_F32, &n, 1) : (loom_tensor){0},
                     loom_view_dims((char *)grads + (size_t)g->state_offset * es, be->dtype, &n, 1),
                     loom_view_dims((float *)o->m + g->state_offset, LOOM_F32, &n, 1),
                     loom_view_dims((float *)o->v + g->state_offset, LOOM_F32, &n, 1), args);
}

// Offloaded: range g in pieces of OFFLOAD_PIECE elements: the piece's gradients to the host as
// fp32, the update of its host state (master weights, moments), its parameters written back
// rounded to be->dtype: copied to the device, or in place in host memory.
static void update_offloaded(loom_adamw *o, const loom_param_range *g, void *params, void *grads,
                             loom_adamw_args args) {
    loom_backend *be = o->be, *st = o->state_be;
    size_t es = loom_dtype_size(be->dtype);
    for (int64_t at = 0; at < g->numel; at += OFFLOAD_PIECE) {
        int64_t n = g->numel - at < OFFLOAD_PIECE ? g->numel - at : OFFLOAD_PIECE, s = g->state_offset + at;
        char *dst = (char *)params + (size_t)(g->param_offset + at) * es;
        float *master = (float *)o->master + s;
        be->download(be, o->staging, (char *)grads + (size_t)s * es, (size_t)n * es);
        loom_dtype_to_f32(o->host_grads, o->staging, be->dtype, (size_t)n);
        args.index0 = g->index0 + at;
        st->adamw_update(st, loom_view_dims(master, LOOM_F32, &n, 1), (loom_tensor){0},
                         loom_view_dims(o->host_grads, LOOM_F32, &n, 1),
                         loom_view_dims((float *)o->m + s, LOOM_F32, &n, 1),
                         loom_view_dims((float *)o->v + s, LOOM_F32, &n, 1), args);
        if (o->offload == LOOM_ADAMW_OFFLOAD_PARAMS) {
            loom_f32_to_dtype(dst, be->dtype, master, (size_t)n);
        } else {
            loom_f32_to_dtype(o->staging, be->dtype, master, (size_t)n);
            be->upload(be, dst, o->staging, (size_t)n * es);
        }
    }
}

// The update of every range with step's per-step values (lr, grad_scale and t, or its scalars)
// and cfg's others.
static void update(loom_adamw *o, void *params, void *grads, const loom_adamw_config *cfg, loom_adamw_args step) {
    loom_backend *be = o->be;
    if (be->range_push) be->range_push(be, "optimizer");
    for (int r = 0; r < o->nranges; r++) {
        const loom_param_range *g = &o->ranges[r];
        loom_adamw_args args = step;
        args.beta1 = cfg->beta1, args.beta2 = cfg->beta2, args.eps = cfg->eps;
        args.weight_decay = g->weight_decay ? cfg->weight_decay : 0.0f;
        args.stochastic_rounding = cfg->stochastic_rounding, args.sr_seed = cfg->seed;
        args.index0 = g->index0;
        if (o->offload) update_offloaded(o, g, params, grads, args);
        else update_range(o, g, params, grads, args);
    }
    if (be->range_pop) be->range_pop(be);
}

void loom_adamw_step(loom_adamw *o, void *params, void *grads, float lr,
                     const loom_adamw_config *cfg, float grad_scale) {
    o->t++;
    update(o, params, grads, cfg, (loom_adamw_args){.lr = lr, .grad_scale = grad_scale, .t = o->t});
}

void loom_adamw_scalars(const loom_adamw *o, const loom_adamw_config *cfg, float lr, loom_step_scalars *sc) {
    int64_t t = o->t + 1;
    *sc = (loom_step_scalars){.lr = lr, .bc1 = loom_adamw_bias(cfg->beta1, t), .bc2 = loom_adamw_bias(cfg->beta2, t),
                              .t = t};
}

void loom_adamw_step_scalars(loom_adamw *o, void *params, void *grads, const loom_adamw_config *cfg,
                             const loom_step_scalars *sc) {
    LOOM_CHECK(!o->offload);
    update(o, params, grads, cfg, (loom_adamw_args){.scalars = sc});
}
