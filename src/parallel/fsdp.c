// See fsdp.h. A unit's life in one micro-batch without a pipeline (L blocks, units e, 0..L-1, h):
//   FORWARD(-1): gather e (pinned, with its gradient buffer), prefetch 0
//   FORWARD(l):  wait for l, prefetch l+1 (freeing l-1)        ... FORWARD(L): h (pinned)
//   BACKWARD(l): wait for l (gathering it again), prefetch l-1, attach l's gradient buffer
//   GRADS(l):    (data_parallel.c) l's gradients reduce-scattered while l-1's backward runs, then
//                its buffer is handed back
#include "parallel/fsdp.h"

#include <stdlib.h>
#include <string.h>

enum { MAX_BLOCKS_GATHERED = 2 };

typedef struct {
    int64_t start, len, piece, shard_offset; // flat elements, each rank's piece, this rank's in the shard
    int first, count;                        // its table entries
    bool pinned;                             // the embeddings or the final norm
    void *params, *grads;                    // gathered parameters, gradients (piece x W), or NULL
    loom_comm_req *req;                      // the gather in flight
    uint64_t used;                           // when it was last asked for
} unit;

typedef struct {
    void *p;
    size_t bytes;
} buffer;

struct loom_fsdp {
    loom_comm *comm;
    loom_backend *be;
    const loom_param_table *table;
    loom_tensor *p, *g;
    int W, R, L;
    size_t es;
    unit *units;
    int nunits;
    int *unit_of;          // (L + 2) unit of layer l at [l + 1], -1 when not in this model
    void *shard;           // (shard_n) on the backend, or host memory with offload_params
    int64_t shard_n;
    bool offload_params;
    buffer *pool;          // freed unit buffers, kept for reuse
    int npool, nbuffers;
    size_t bytes, peak;    // unit buffers allocated
    uint64_t clock;
    loom_status error;
};

#define AT(p, i) ((char *)(p) + (size_t)(i) * f->es)

static void keep_error(loom_fsdp *f, loom_status s) {
    if (s != LOOM_OK && f->error == LOOM_OK) f->error = s;
}

// A buffer of `bytes` from the pool, or a new one (zero-filled). NULL when out of memory.
static void *take(loom_fsdp *f, size_t bytes) {
    for (int i = 0; i < f->npool; i++)
        if (f->pool[i].bytes == bytes) {
            void *p = f->pool[i].p;
            f->pool[i] = f->pool[--f->npool];
            return p;
        }
    void *p = f->be->alloc(f->be, bytes);
    if (!p) return NULL;
    f->bytes += bytes;
    f->peak = f->bytes > f->peak ? f->bytes : f->peak;
    f->pool = realloc(f->pool, (size_t)++f->nbuffers * sizeof *f->pool); // room to give every buffer back
    LOOM_CHECK(f->pool);
    return p;
}

static void give(loom_fsdp *f, void *p, size_t bytes) { f->pool[f->npool++] = (buffer){p, bytes}; }

static size_t unit_bytes(const loom_fsdp *f, const unit *u) { return (size_t)(u->piece * f->W) * f->es; }

// Points the views of u's tensors into buf (NULL: detached).
static void point(loom_fsdp *f, const unit *u, loom_tensor *views, void *buf) {
    for (int i = u->first; i < u->first + u->count; i++)
        views[i].data = buf ? AT(buf, f->table->params[i].offset - u->start) : NULL;
}

// A buffer for unit u. Running out of memory in the middle of a step (a pipeline holding more
// units' gradients than the start reserved) ends the run: one line, non-zero exit (mpirun then
// stops every rank).
static void *take_or_exit(loom_fsdp *f, const unit *u) {
    void *p = take(f, unit_bytes(f, u));
    if (!p) {
        fprintf(stderr, "loom: error: out of memory for a %zu-byte ZeRO-3 unit buffer with %zu bytes of unit buffers "
                        "in use (hint: use more ranks, fewer micro-batches in flight or a smaller model)\n",
                unit_bytes(f, u), f->bytes);
        exit(1);
    }
    return p;
}

static void release_params(loom_fsdp *f, unit *u) {
    if (!u->params) return;
    if (u->req) keep_error(f, loom_comm_wait(u->req));
    u->req = NULL;
    give(f, u->params, unit_bytes(f, u));
    u->params = NULL;
    point(f, u, f->p, NULL);
}

// Starts gathering unit k's parameters (if not resident), first freeing the least recently used
// block unit while MAX_BLOCKS_GATHERED are resident.
static void gather(loom_fsdp *f, int k) {
    unit *u = &f->units[k];
    u->used = ++f->clock;
    if (u->params) return;
    for (;;) {
        int resident = 0, lru = -1;
        for (int i = 0; i < f->nunits; i++) {
            const unit *v = &f->units[i];
            if (!v->params || v->pinned) continue;
            resident++;
            if (lru < 0 || v->used < f->units[lru].used) lru = i;
        }
        if (u->pinned || resident < MAX_BLOCKS_GATHERED) break;
        release_params(f, &f->units[lru]);
    }
    u->params = take_or_exit(f, u);
    void *mine = AT(u->params, (int64_t)f->R * u->piece), *piece = AT(f->shard, u->shard_offset);
    if (f->offload_params) f->be->copy_wait(f->be, f->be->copy_async(f->be, mine, piece, (size_t)u->piece * f->es, false));
    else f->be->copy(f->be, mine, piece, (size_t)u->piece * f->es);
    if (f->W > 1) keep_error(f, loom_allgather(f->comm, NULL, u->params, (size_t)u->piece, f->be->dtype, &u->req));
    point(f, u, f->p, u->params);
}

// Unit k gathered and complete; with grads, its gradient buffer attached (zeroed when new).
static void ensure(loom_fsdp *f, int k, bool grads) {
    unit *u = &f->units[k];
    gather(f, k);
    if (u->req) keep_error(f, loom_comm_wait(u->req));
    u->req = NULL;
    if (grads && f->g && !u->grads) {
        u->grads = take_or_exit(f, u);
        f->be->zero(f->be, u->grads, unit_bytes(f, u));
        point(f, u, f->g, u->grads);
    }
}

static int unit_of(const loom_fsdp *f, int layer) {
    return layer >= -1 && layer <= f->L ? f->unit_of[layer + 1] : -1;
}

// LOOM_HOOK_FORWARD / BACKWARD: the layer's unit, and the next one in that direction started.
static void on_layer(loom_fsdp *f, int layer, int step, bool backward) {
    int k = unit_of(f, layer);
    if (k < 0) return;
    ensure(f, k, backward || f->units[k].pinned);
    int next = k + step;
    if (next >= 0 && next < f->nunits) {
        gather(f, next);
        f->units[k].used = f->clock; // the current unit is not the least recently used
        bool done;
        if (f->units[next].req) keep_error(f, loom_comm_test(f->units[next].req, &done)); // MPI moves data inside calls
    }
}
static void on_forward(void *ctx, int layer) { on_layer(ctx, layer, 1, false); }
static void on_backward(void *ctx, int layer) { on_layer(ctx, layer, -1, true); }

// loom_dp_units
static void *unit_grads(void *ctx, int b) { return ((loom_fsdp *)ctx)->units[b].grads; }
static void unit_reduced(void *ctx, int b) {
    loom_fsdp *f = ctx;
    unit *u = &f->units[b];
    give(f, u->grads, unit_bytes(f, u));
    u->grads = NULL;
    point(f, u, f->g, NULL);
}

// Buffers of a unit's size reserved at creation: what a step without a pipeline holds at most
// (a pinned unit's parameters and gradients; two blocks' of each, for the first block's size).
static int reserved(bool pinned) { return pinned ? 2 : 2 * MAX_BLOCKS_GATHERED; }

// Puts n buffers of unit u's size in the pool (parameters and gradients in flight at once).
static bool reserve(loom_fsdp *f, const unit *u, int n) {
    void *got[2 * MAX_BLOCKS_GATHERED];
    int i = 0;
    while (i < n && (got[i] = take(f, unit_bytes(f, u))) != NULL) i++;
    for (int j = 0; j < i; j++) give(f, got[j], unit_bytes(f, u));
    return i == n;
}

loom_status loom_fsdp_create(loom_fsdp **out, loom_dp *dp, loom_comm *comm, loom_backend *be,
                             const loom_param_table *table, int num_layers, loom_tensor *params, loom_tensor *grads,
                             loom_hooks *hooks, bool offload_params) {
    loom_fsdp *f = loom_xcalloc(1, sizeof *f);
    *f = (loom_fsdp){.comm = comm, .be = be, .table = table, .p = params, .g = grads, .W = loom_comm_size(comm),
                     .R = loom_comm_rank(comm), .L = num_layers, .es = loom_dtype_size(be->dtype),
                     .offload_params = offload_params};
    f->nunits = loom_dp_num_buckets(dp);
    f->units = loom_xcalloc((size_t)f->nunits, sizeof *f->units);
    f->unit_of = loom_xmalloc((size_t)(num_layers + 2) * sizeof(int));
    for (int l = 0; l < num_layers + 2; l++) f->unit_of[l] = -1;
    for (int k = 0; k < f->nunits; k++) {
        unit *u = &f->units[k];
        loom_dp_bucket(dp, k, &u->start, &u->len, &u->piece, &u->shard_offset);
        u->first = loom_param_table_find(table, u->start);
        while (u->first + u->count < table->count && table->params[u->first + u->count].offset < u->start + u->len)
            u->count++;
        int layer = table->params[u->first].layer;
        u->pinned = layer < 0 || layer >= num_layers;
        f->unit_of[layer + 1] = k;
        f->shard_n = u->shard_offset + u->piece;
        point(f, u, params, NULL);
        if (grads) point(f, u, grads, NULL);
    }
    size_t shard_bytes = (size_t)f->shard_n * f->es;
    f->shard = offload_params ? be->host_alloc(be, shard_bytes) : be->alloc(be, shard_bytes);
    bool ok = f->shard != NULL;
    for (int k = 0, blocks = 0; k < f->nunits && ok; k++)
        if (f->units[k].pinned || blocks++ == 0) ok = reserve(f, &f->units[k], reserved(f->units[k].pinned));
    if (!ok) {
        size_t bytes = shard_bytes + f->bytes;
        loom_fsdp_free(f);
        *out = NULL;
        return loom_fail(LOOM_ENOMEM, "use more ranks or a smaller model",
                         "cannot allocate %zu bytes of ZeRO-3 shard and unit buffers", bytes);
    }
    loom_dp_set_units(dp, (loom_dp_units){f, unit_grads, unit_reduced});
    loom_hooks_add(hooks, LOOM_HOOK_FORWARD, on_forward, f);
    loom_hooks_add(hooks, LOOM_HOOK_BACKWARD, on_backward, f);
    *out = f;
    return LOOM_OK;
}

size_t loom_fsdp_plan_units(const loom_param_table *table, int num_layers, int W, loom_dtype dtype) {
    size_t bytes = 0;
    for (int i = 0, blocks = 0; i < table->count;) {
        int layer = table->params[i].layer;
        int64_t start = table->params[i].offset;
        while (i < table->count && table->params[i].layer == layer) i++;
        int64_t len = (i < table->count ? table->params[i].offset : table->num_elements) - start;
        bool pinned = layer < 0 || layer >= num_layers;
        if (pinned || blocks++ == 0)
            bytes += (size_t)reserved(pinned) * (size_t)((len + W - 1) / W * W) * loom_dtype_size(dtype);
    }
    return bytes;
}

void loom_fsdp_free(loom_fsdp *f) {
    if (!f) return;
    loom_fsdp_reshard(f);
    for (int i = 0; i < f->npool; i++) f->be->free(f->be, f->pool[i].p);
    if (f->offload_params) f->be->host_free(f->be, f->shard);
    else f->be->free(f->be, f->shard);
    free(f->pool);
    free(f->units);
    free(f->unit_of);
    free(f);
}

void *loom_fsdp_shard(const loom_fsdp *f) { return f->shard; }
int64_t loom_fsdp_shard_elements(const loom_fsdp *f) { return f->shard_n; }

void loom_fsdp_set_params(loom_fsdp *f, const float *flat) {
    float *mine = loom_xcalloc((size_t)f->shard_n, sizeof(float));
    for (int k = 0; k < f->nunits; k++) {
        const unit *u = &f->units[k];
        size_t off, len;
        loom_comm_shard((size_t)u->len, f->W, f->R, &off, &len);
        memcpy(mine + u->shard_offset, flat + u->start + off, len * sizeof(float));
    }
    if (f->offload_params) {
        loom_f32_to_dtype(f->shard, f->be->dtype, mine, (size_t)f->shard_n);
    } else {
        void *raw = loom_xmalloc((size_t)f->shard_n * f->es);
        loom_f32_to_dtype(raw, f->be->dtype, mine, (size_t)f->shard_n);
        f->be->upload(f->be, f->shard, raw, (size_t)f->shard_n * f->es);
        free(raw);
    }
    free(mine);
}

loom_status loom_fsdp_gather_params(loom_fsdp *f, float *flat) {
    loom_fsdp_reshard(f);
    for (int k = 0; k < f->nunits && f->error == LOOM_OK; k++) {
        unit *u = &f->units[k];
        ensure(f, k, false);
        void *raw = loom_xmalloc((size_t)u->len * f->es);
        f->be->download(f->be, raw, u->params, (size_t)u->len * f->es);
        loom_dtype_to_f32(flat + u->start, raw, f->be->dtype, (size_t)u->len);
        free(raw);
        release_params(f, u);
    }
    return loom_fsdp_error(f);
}

void loom_fsdp_reshard(loom_fsdp *f) {
    for (int k = 0; k < f->nunits; k++) {
        unit *u = &f->units[k];
        release_params(f, u);
        if (u->grads) unit_reduced(f, k);
    }
}

loom_status loom_fsdp_error(loom_fsdp *f) {
    loom_status s = f->error;
    f->error = LOOM_OK;
    return s;
}

void loom_fsdp_memory(const loom_fsdp *f, size_t *now, size_t *peak) {
    *now = f->bytes;
    *peak = f->peak;
}
