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

loom_status loom_adamw_create(loom_adamw **out, loom_backend *be, const loom_param_table *table,
                              const loom_param_slice *slices, int nslices, int64_t n, bool sharded_params,
                              loom_adamw_offload offload) {
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
    bool master = be->dtype != LOOM_F32 || offload;
    if (master) o->master = st->alloc(st, (size_t)n * sizeof(float));
    if (offload) {
        o->host_grads = malloc((size_t)n * sizeof(float));
        o->staging = be->host_alloc(be, (size_t)n * loom_dtype_size(be->dtype));
    }
    make_ranges(o, table, slices, nslices, sharded_params);
    *out = o;
    if (!o->m || !o->v || (master && !o->master) || (offload && (!o->host_grads || !o->staging))) {
        loom_adamw_free(o);
        *out = NULL;
        return loom_fail(LOOM_ENOMEM, "use a smaller model or a higher --zero stage",
                         "cannot allocate %lld bytes of AdamW state%s", (long long)((master ? 12 : 8) * n),
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

void loom_adamw_init_master(loom_adamw *o, const void *params, int64_t num_elements) {
    if (!o->master) return;
    loom_backend *be = o->be;
    size_t es = loom_dtype_size(be->dtype);
    void *raw = loom_xmalloc((size_t)num_elements * es);
    float *p = loom_xmalloc((size_t)num_elements * sizeof(float)), *master = loom_xcalloc((size_t)o->n, sizeof(float));
    if (o->offload == LOOM_ADAMW_OFFLOAD_PARAMS) memcpy(raw, params, (size_t)num_elements * es);
    else be->download(be, raw, params, (size_t)num_elements * es);
    loom_dtype_to_f32(p, raw, be->dtype, (size_t)num_elements);
    for (int r = 0; r < o->nranges; r++)
        memcpy(master + o->ranges[r].state_offset, p + o->ranges[r].param_offset,
               (size_t)o->ranges[r].numel * sizeof(float));
    o->state_be->upload(o->state_be, o->master, master, (size_t)o->n * sizeof(float));
    free(raw);
    free(p);
    free(master);
}

float loom_clip_scale(double norm, float max_norm) {
    if (max_norm <= 0.0f) return 1.0f;
    double s = max_norm / (norm + 1e-6);
    return s < 1.0 ? (float)s : 1.0f;
}

// The update of range g: params (of be) from master and grads, both indexed like the state, or,
// offloaded, master itself from host fp32 gradients.
static void update_range(loom_adamw *o, const loom_param_range *g, void *params, void *grads, loom_adamw_args args) {
    loom_backend *be = o->state_be;
    int64_t n = g->numel;
    size_t es = loom_dtype_size(o->be->dtype);
    loom_tensor m = loom_view_dims((float *)o->m + g->state_offset, LOOM_F32, &n, 1);
    loom_tensor v = loom_view_dims((float *)o->v + g->state_offset, LOOM_F32, &n, 1);
    if (o->host_grads) {
        be->adamw_update(be, loom_view_dims((float *)o->master + g->state_offset, LOOM_F32, &n, 1), (loom_tensor){0},
                         loom_view_dims(o->host_grads + g->state_offset, LOOM_F32, &n, 1), m, v, args);
        return;
    }
    be->adamw_update(be, loom_view_dims((char *)params + (size_t)g->param_offset * es, be->dtype, &n, 1),
                     o->master ? loom_view_dims((float *)o->master + g->state_offset, LOOM_F32, &n, 1) : (loom_tensor){0},
                     loom_view_dims((char *)grads + (size_t)g->state_offset * es, be->dtype, &n, 1), m, v, args);
}

void loom_adamw_step(loom_adamw *o, void *params, void *grads, float lr,
                     const loom_adamw_config *cfg, float grad_scale) {
    loom_backend *be = o->be;
    size_t es = loom_dtype_size(be->dtype);
    if (be->range_push) be->range_push(be, "optimizer");
    o->t++;
    if (o->host_grads) { // offloaded: the gradients to the host as fp32
        be->download(be, o->staging, grads, (size_t)o->n * es);
        loom_dtype_to_f32(o->host_grads, o->staging, be->dtype, (size_t)o->n);
    }
    for (int r = 0; r < o->nranges; r++) {
        const loom_param_range *g = &o->ranges[r];
        loom_adamw_args args = {.lr = lr,
                                .beta1 = cfg->beta1,
                                .beta2 = cfg->beta2,
                                .eps = cfg->eps,
                                .weight_decay = g->weight_decay ? cfg->weight_decay : 0.0f,
                                .grad_scale = grad_scale,
                                .t = o->t,
                                .stochastic_rounding = cfg->stochastic_rounding,
                                .sr_seed = cfg->seed,
                                .index0 = g->index0};
        update_range(o, g, params, grads, args);
    }
    if (o->offload == LOOM_ADAMW_OFFLOAD_PARAMS) { // the parameters are the state's layout, in host memory
        loom_f32_to_dtype(params, be->dtype, o->master, (size_t)o->n);
    } else if (o->offload == LOOM_ADAMW_OFFLOAD_STATE) { // the updated master weights back as the parameters
        loom_f32_to_dtype(o->staging, be->dtype, o->master, (size_t)o->n);
        for (int r = 0; r < o->nranges; r++) {
            const loom_param_range *g = &o->ranges[r];
            be->upload(be, (char *)params + (size_t)g->param_offset * es, (char *)o->staging + (size_t)g->state_offset * es,
                       (size_t)g->numel * es);
        }
    }
    if (be->range_pop) be->range_pop(be);
}
