// Tensor and sequence parallelism's communication; see tensor_parallel.h.
#include "parallel/tensor_parallel.h"

#include <stdlib.h>
#include <string.h>

struct loom_tp {
    loom_comm *dev, *host;
    loom_backend *be;
    bool sequence_parallel, sync;
    int size, max_rows;
    void *part, *parts, *lse; // (max_rows,3), (size,max_rows,3), (max_rows) fp32 scratch
    const loom_param_table *table;
    const loom_tensor *grads; // the model's gradient views
    loom_comm_req **reqs; // (table->count) the sums of one layer in flight
    loom_status error;
};

static void keep(loom_tp *tp, loom_status s) {
    if (s != LOOM_OK && tp->error == LOOM_OK) tp->error = s;
}

loom_status loom_tp_create(loom_tp **out, loom_comm *dev, loom_comm *host, loom_backend *be,
                           bool sequence_parallel, int max_rows) {
    loom_tp *tp = loom_xcalloc(1, sizeof *tp);
    *tp = (loom_tp){.dev = dev, .host = host, .be = be, .sequence_parallel = sequence_parallel,
                    .size = loom_comm_size(host), .max_rows = max_rows};
    size_t row = 3 * sizeof(float);
    tp->part = be->alloc(be, (size_t)max_rows * row);
    tp->parts = be->alloc(be, (size_t)tp->size * max_rows * row);
    tp->lse = be->alloc(be, (size_t)max_rows * sizeof(float));
    *out = tp;
    if (tp->part && tp->parts && tp->lse) return LOOM_OK;
    loom_tp_free(tp);
    *out = NULL;
    return loom_fail(LOOM_ENOMEM, "lower --batch or --seq", "cannot allocate the vocabulary-parallel loss scratch");
}

void loom_tp_free(loom_tp *tp) {
    if (!tp) return;
    tp->be->free(tp->be, tp->part);
    tp->be->free(tp->be, tp->parts);
    tp->be->free(tp->be, tp->lse);
    free(tp->reqs);
    free(tp);
}

// full (N,...) from this rank's rows local (Nl,...), which lie in full at rank x Nl.
static void gather(void *ctx, loom_tensor full, loom_tensor local) {
    loom_tp *tp = ctx;
    size_t n = (size_t)loom_numel(&local);
    if ((int64_t)n == loom_numel(&full)) return; // the rows are not split
    LOOM_CHECK(loom_numel(&full) == (int64_t)n * tp->size &&
               (char *)local.data == (char *)full.data + n * loom_dtype_size(full.dtype) * loom_comm_rank(tp->host));
    keep(tp, loom_allgather(tp->dev, NULL, full.data, n, full.dtype, NULL));
}

// local = the sum over ranks of full (all rows), or of this rank's rows of it.
static void reduce(void *ctx, loom_tensor local, loom_tensor full) {
    loom_tp *tp = ctx;
    size_t n = (size_t)loom_numel(&local);
    if (loom_rows(&local) == loom_rows(&full)) keep(tp, loom_allreduce(tp->dev, local.data, n, local.dtype, LOOM_SUM, NULL));
    else keep(tp, loom_reduce_scatter(tp->dev, full.data, local.data, n, local.dtype, LOOM_SUM, NULL));
}

static void crossentropy(void *ctx, loom_tensor losses, loom_tensor logits, loom_tensor targets, int vocab_start,
                         int V, float dloss, bool backward) {
    loom_tp *tp = ctx;
    loom_backend *be = tp->be;
    int64_t n = loom_rows(&logits);
    LOOM_CHECK(n <= tp->max_rows);
    loom_tensor part = LOOM_VIEW(tp->part, LOOM_F32, n, 3), parts = LOOM_VIEW(tp->parts, LOOM_F32, tp->size, n, 3);
    loom_tensor lse = LOOM_VIEW(tp->lse, LOOM_F32, n);
    be->crossentropy_partial(be, part, logits, targets, vocab_start, V);
    keep(tp, loom_allgather(tp->dev, tp->part, tp->parts, (size_t)n * 3, LOOM_F32, NULL));
    be->crossentropy_combine(be, losses, lse, parts);
    if (backward) be->crossentropy_backward(be, logits, lse, targets, vocab_start, V, dloss);
}

static void gather_vocab(void *ctx, float *host, loom_tensor logits) {
    loom_tp *tp = ctx;
    size_t n = (size_t)loom_numel(&logits);
    void *raw = loom_xmalloc(loom_nbytes(&logits));
    float *mine = loom_xmalloc(n * sizeof(float));
    tp->be->download(tp->be, raw, logits.data, loom_nbytes(&logits));
    loom_dtype_to_f32(mine, raw, logits.dtype, n);
    keep(tp, loom_allgather(tp->host, mine, host, n, LOOM_F32, NULL));
    free(raw);
    free(mine);
}

// LOOM_HOOK_GRADS: sums layer's sequence-parallel gradients over the tp group.
static void sum_sequence_grads(void *ctx, int layer) {
    loom_tp *tp = ctx;
    if (!tp->sync) return;
    loom_comm_req **reqs = tp->reqs;
    int nreq = 0;
    for (int i = 0; i < tp->table->count; i++) {
        const loom_param *p = &tp->table->params[i];
        if (p->layer != layer || !p->shard.sequence_parallel) continue;
        loom_status s = loom_allreduce(tp->dev, tp->grads[i].data, (size_t)p->local_numel,
                                       tp->be->dtype, LOOM_SUM, &reqs[nreq]);
        keep(tp, s);
        if (s == LOOM_OK) nreq++;
    }
    for (int r = 0; r < nreq; r++) keep(tp, loom_comm_wait(reqs[r]));
}

void loom_tp_attach(loom_tp *tp, loom_tp_points *points, loom_hooks *hooks, const loom_param_table *table,
                    const loom_tensor *grads) {
    *points = (loom_tp_points){.ctx = tp, .gather = gather, .reduce = reduce, .crossentropy = crossentropy,
                               .gather_vocab = gather_vocab};
    tp->table = table;
    tp->grads = grads;
    tp->reqs = loom_xcalloc((size_t)table->count, sizeof *tp->reqs);
    if (tp->sequence_parallel) loom_hooks_add(hooks, LOOM_HOOK_GRADS, sum_sequence_grads, tp);
}

void loom_tp_begin_micro_batch(loom_tp *tp, bool sync) { tp->sync = sync; }

loom_status loom_tp_error(loom_tp *tp) {
    loom_status s = tp->error;
    tp->error = LOOM_OK;
    return s;
}
