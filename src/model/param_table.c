// The parameter table; see param_table.h. A split tensor's shard geometry: the split
// dimension d (0 for column and vocabulary shards, 1 for row shards) has D elements in
// `chunks` blocks; rank r holds `piece` = D / (chunks x tp) of each block, starting at
// block start + r x piece. Viewing the whole tensor as (outer, D, inner), the shard is
// outer x chunks runs of piece x inner contiguous elements.
#include "model/param_table.h"

#include "core/rng.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t outer, D, inner, piece, chunks;
} geometry;

static geometry geometry_of(const loom_param *p, int tp_size) {
    if (p->shard.kind == LOOM_SHARD_REPLICATED) return (geometry){1, p->numel, 1, p->numel, 1};
    int d = p->shard.kind == LOOM_SHARD_ROW ? 1 : 0;
    geometry g = {1, p->shape[d], 1, 0, p->shard.chunks};
    for (int i = 0; i < d; i++) g.outer *= p->shape[i];
    for (int i = d + 1; i < p->ndim; i++) g.inner *= p->shape[i];
    g.piece = g.D / (g.chunks * tp_size);
    return g;
}

void loom_param_table_add(loom_param_table *t, const loom_param *p) {
    t->params = realloc(t->params, (size_t)(t->count + 1) * sizeof *t->params);
    LOOM_CHECK(t->params);
    loom_param *q = &t->params[t->count++];
    *q = *p;
    q->numel = 1;
    for (int d = 0; d < q->ndim; d++) q->numel *= q->shape[d];
    if (q->shard.chunks < 1) q->shard.chunks = 1;
    if (q->zero_rows_from <= 0) q->zero_rows_from = INT64_MAX;
}

loom_status loom_param_table_shard(loom_param_table *t, int tp_rank, int tp_size) {
    t->tp_rank = tp_rank;
    t->tp_size = tp_size;
    t->num_elements = 0;
    t->file_elements = 0;
    int64_t whole = 0;
    for (int i = 0; i < t->count; i++) {
        loom_param *p = &t->params[i];
        bool replicated = p->shard.kind == LOOM_SHARD_REPLICATED;
        int d = p->shard.kind == LOOM_SHARD_ROW ? 1 : 0;
        if (!replicated && (d >= p->ndim || p->shape[d] % ((int64_t)p->shard.chunks * tp_size) != 0))
            return loom_fail(LOOM_EINVAL, "use a --tp that divides the model's heads, channels and padded vocabulary",
                             "tensor %s of layer %d (%lld x %lld) does not split over %d tensor-parallel ranks",
                             p->name, p->layer, (long long)p->shape[0], (long long)(p->ndim > 1 ? p->shape[1] : 1),
                             tp_size);
        p->local_shape[0] = p->shape[0];
        p->local_shape[1] = p->ndim > 1 ? p->shape[1] : 1;
        if (!replicated) p->local_shape[d] /= tp_size;
        p->local_numel = replicated ? p->numel : p->numel / tp_size;
        p->offset = t->num_elements;
        t->num_elements += p->local_numel;
        p->whole_offset = whole;
        whole += p->numel;
        if (p->file_offset + p->numel > t->file_elements) t->file_elements = p->file_offset + p->numel;
        p->applies = !(replicated && p->shard.add_once) || tp_rank == 0;
        p->counted = !replicated || tp_rank == 0;
    }
    return LOOM_OK;
}

void loom_param_table_free(loom_param_table *t) {
    free(t->params);
    *t = (loom_param_table){0};
}

int loom_param_table_find(const loom_param_table *t, int64_t flat) {
    int lo = 0, hi = t->count - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const loom_param *p = &t->params[mid];
        if (flat < p->offset) hi = mid - 1;
        else if (flat >= p->offset + p->local_numel) lo = mid + 1;
        else return mid;
    }
    return -1;
}

int64_t loom_param_global_index(const loom_param *p, int tp_rank, int tp_size, int64_t local) {
    geometry g = geometry_of(p, tp_size);
    if (p->shard.kind == LOOM_SHARD_REPLICATED) return local;
    int64_t Dl = g.D / tp_size, o = local / (Dl * g.inner), rem = local % (Dl * g.inner);
    int64_t j = rem / g.inner, e = rem % g.inner, c = j / g.piece, w = j % g.piece;
    return (o * g.D + c * (g.D / g.chunks) + tp_rank * g.piece + w) * g.inner + e;
}

void loom_param_table_copy(const loom_param_table *t, int tp_rank, float *local, float *file, bool to_file) {
    for (int i = 0; i < t->count; i++) {
        const loom_param *p = &t->params[i];
        geometry g = geometry_of(p, t->tp_size);
        int64_t run = g.piece * g.inner, Dl = g.D / (p->shard.kind == LOOM_SHARD_REPLICATED ? 1 : t->tp_size);
        for (int64_t o = 0; o < g.outer; o++)
            for (int64_t c = 0; c < g.chunks; c++) {
                int64_t shift = p->shard.kind == LOOM_SHARD_REPLICATED ? 0 : tp_rank * g.piece;
                float *w = file + p->file_offset + (o * g.D + c * (g.D / g.chunks) + shift) * g.inner;
                float *l = local + p->offset + (o * Dl + c * g.piece) * g.inner;
                if (to_file) memcpy(w, l, (size_t)run * sizeof(float));
                else memcpy(l, w, (size_t)run * sizeof(float));
            }
    }
}

void loom_param_table_init(const loom_param_table *t, uint64_t seed, float *local) {
    for (int i = 0; i < t->count; i++) {
        const loom_param *p = &t->params[i];
        int64_t row_len = p->ndim > 1 ? p->shape[1] : 1;
#pragma omp parallel for schedule(static)
        for (int64_t k = 0; k < p->local_numel; k++) {
            int64_t gi = loom_param_global_index(p, t->tp_rank, t->tp_size, k);
            float v = p->init == LOOM_INIT_ONE ? 1.0f : 0.0f;
            if (p->init == LOOM_INIT_NORMAL && gi / row_len < p->zero_rows_from)
                v = p->std * (float)loom_rng_normal(seed, p->rng_stream, (uint64_t)(p->rng_offset + gi));
            local[p->offset + k] = v;
        }
    }
}
