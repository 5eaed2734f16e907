// See data_parallel.h. A step, with W ranks and A micro-batches:
//   for a in 0..A-1: begin_micro_batch; forward/backward (LOOM_HOOK_GRADS hooks start the
//                    bucket reduce-scatters); end_micro_batch
//   (zero 0: each bucket's all-gather of the reduced pieces starts at the next layer's hook)
//   reduced_grads (zero 0: the rest of the all-gathers, and waits; the norm) -> AdamW on the
//   slices -> gather_params (zero 1/2: the all-gathers start; the next forward's
//   LOOM_HOOK_FORWARD hooks wait for each before the first layer that reads it)
#include "parallel/data_parallel.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t start, len;   // flat elements [start, start + len)
    int64_t piece;        // ceil(len / W): each rank's piece
    int64_t own_len;      // real elements of this rank's piece (< piece only in a ragged bucket)
    int64_t shard_offset; // this rank's piece in the shard buffers
    int ready_layer;      // backward layer after which every gradient in it is final
    bool staged;          // len % W != 0: reduced and gathered through the staging buffer (ZeRO 0-2)
    bool reducing;        // its reduction has started and is not finished
    bool gathering;       // its all-gather into dp->gather_to has started and is not finished
    void *target;         // ZeRO 3: where its reduction lands (the shard, or the scratch to add)
    loom_comm_req *req;
} bucket;

struct loom_dp {
    loom_comm *comm, *host;   // the backend's buffers; host values
    loom_comm *replicas;      // HSDP: the same shard's ranks in the other replicas (NULL: none)
    loom_backend *be;
    int zero, W, R;
    bool reduces;             // gradients go through the shard: several ranks, replicas or ZeRO 3
    size_t es;                // bytes per element (be->dtype)
    bucket *buckets;
    int nbuckets;
    int64_t num_elements, shard_n;
    int64_t scratch_n, staging_n; // elements of the scratch and staging buffers (0: none)
    void *grads;              // the model's full gradient buffer (ZeRO 0-2)
    loom_dp_units units;      // ZeRO 3: the owner of each unit's gradient buffer
    void *shard, *scratch;    // (shard_n) reduced pieces; zero 2: one micro-batch's before accumulation
                              // (zero 3: one piece)
    void *staging;            // (W * piece of the ragged bucket)
    void *gather_to;          // the full buffer of the all-gathers in flight (grads, or params)
    double *norm_acc;         // (W) fp64 sums of squares of each rank's pieces, in backend memory
    bool communicate, first;  // this micro-batch reduces; it is the step's first reduction
    loom_status error;
    const loom_param_table *table;
    loom_param_slice *slices;
    int nslices;
};

#define AT(p, i) ((char *)(p) + (size_t)(i) * dp->es)

static void finish_gathers(loom_dp *dp, int layer);

// Backward layer after which every gradient in [start, end) is final: the earliest (lowest)
// layer among the tensors it touches (backward runs from the last layer to the first).
static int ready_layer(const loom_param_table *t, int64_t start, int64_t end) {
    int layer = 1 << 30;
    for (int i = loom_param_table_find(t, start); i >= 0 && i < t->count && t->params[i].offset < end; i++)
        if (t->params[i].layer < layer) layer = t->params[i].layer;
    return layer;
}

// The optimizer's slices: zero 0, the whole buffer; zero 1/2, this rank's pieces.
static void make_slices(loom_dp *dp) {
    dp->slices = loom_xcalloc((size_t)dp->nbuckets, sizeof *dp->slices);
    if (dp->zero == 0) {
        dp->slices[dp->nslices++] = (loom_param_slice){0, 0, dp->num_elements};
        return;
    }
    for (int b = 0; b < dp->nbuckets; b++) {
        const bucket *k = &dp->buckets[b];
        if (k->own_len > 0)
            dp->slices[dp->nslices++] = (loom_param_slice){k->start + (int64_t)dp->R * k->piece, k->shard_offset, k->own_len};
    }
}

// Where the bucket starting at flat element `start` ends: E elements on (ZeRO 0-2), or at the edge
// of its layer (ZeRO 3: a bucket is one unit).
static int64_t bucket_end(const loom_dp *dp, int64_t start, int64_t E) {
    const loom_param_table *t = dp->table;
    if (dp->zero < 3) return start + E < dp->num_elements ? start + E : dp->num_elements;
    int i = loom_param_table_find(t, start), layer = t->params[i].layer;
    while (i < t->count && t->params[i].layer == layer) i++;
    return i < t->count ? t->params[i].offset : dp->num_elements;
}

// Checks the arguments and lays out the buckets, the shard and the buffer sizes of data
// parallelism over W ranks (this rank R) without allocating: buckets of E elements (ZeRO 0-2; a
// multiple of W). Errors: as loom_dp_create's.
static loom_status lay_out(loom_dp **out, int W, int R, bool replicas, size_t es, const loom_param_table *table,
                           int zero, int64_t E) {
    *out = NULL;
    int64_t num_elements = table->num_elements, most = 0;
    if (zero < 0 || zero > 3) return loom_fail(LOOM_EINVAL, "use --zero 0, 1, 2 or 3", "unknown ZeRO stage %d", zero);
    if (num_elements < W)
        return loom_fail(LOOM_EINVAL, "use fewer ranks or a larger model",
                         "%d ranks exceed the model's %lld parameters", W, (long long)num_elements);
    loom_dp *dp = loom_xcalloc(1, sizeof *dp);
    *dp = (loom_dp){.zero = zero, .W = W, .R = R, .es = es, .num_elements = num_elements, .table = table,
                    .reduces = W > 1 || replicas || zero == 3};
    for (int64_t start = 0; start < num_elements; dp->nbuckets++) {
        dp->buckets = realloc(dp->buckets, (size_t)(dp->nbuckets + 1) * sizeof(bucket));
        LOOM_CHECK(dp->buckets);
        bucket *k = &dp->buckets[dp->nbuckets];
        *k = (bucket){.start = start, .len = bucket_end(dp, start, E) - start};
        k->piece = (k->len + W - 1) / W;
        k->staged = zero < 3 && k->len % W != 0;
        size_t off, own;
        loom_comm_shard((size_t)k->len, W, dp->R, &off, &own);
        k->own_len = (int64_t)own;
        k->shard_offset = dp->shard_n;
        dp->shard_n += k->piece;
        k->ready_layer = ready_layer(table, k->start, k->start + k->len);
        most = k->piece > most ? k->piece : most;
        start += k->len;
    }
    make_slices(dp);
    if (dp->reduces) {
        const bucket *last = &dp->buckets[dp->nbuckets - 1];
        dp->scratch_n = zero == 3 ? most : zero == 2 ? dp->shard_n : 0;
        dp->staging_n = last->staged ? last->piece * W : 0;
    }
    *out = dp;
    return LOOM_OK;
}

// The bucket length of `bucket_mb` MiB of es-byte elements over W ranks: a multiple of W, at
// least W. Errors: LOOM_EINVAL for a size <= 0.
static loom_status bucket_elements(double bucket_mb, size_t es, int W, int64_t *E) {
    if (!(bucket_mb > 0))
        return loom_fail(LOOM_EINVAL, "e.g. --bucket-mb 25", "--bucket-mb must be > 0, got %g", bucket_mb);
    *E = (int64_t)(bucket_mb * 1024 * 1024 / (double)es) / W * W;
    if (*E < W) *E = W;
    return LOOM_OK;
}

loom_status loom_dp_create(loom_dp **out, loom_comm *comm, loom_comm *host, loom_comm *replicas, loom_backend *be,
                           const loom_param_table *table, int zero, double bucket_mb) {
    *out = NULL;
    if (replicas && loom_comm_size(replicas) == 1) replicas = NULL;
    if (replicas && zero == 0)
        return loom_fail(LOOM_EINVAL, "use --zero 1, 2 or 3 with --dp-replicate",
                         "hybrid sharding over %d replicas shards within each, which ZeRO 0 does not",
                         loom_comm_size(replicas));
    loom_dp *dp;
    int64_t E = 0;
    size_t es = loom_dtype_size(be->dtype);
    LOOM_TRY(bucket_elements(bucket_mb, es, loom_comm_size(comm), &E));
    LOOM_TRY(lay_out(&dp, loom_comm_size(comm), loom_comm_rank(comm), replicas != NULL, es, table, zero, E));
    dp->comm = comm, dp->host = host, dp->replicas = replicas, dp->be = be;
    if (dp->reduces) {
        dp->shard = be->alloc(be, (size_t)dp->shard_n * dp->es);
        dp->scratch = dp->scratch_n ? be->alloc(be, (size_t)dp->scratch_n * dp->es) : NULL;
        dp->staging = dp->staging_n ? be->alloc(be, (size_t)dp->staging_n * dp->es) : NULL;
        dp->norm_acc = be->alloc(be, (size_t)dp->W * sizeof(double));
        if (!dp->shard || (dp->scratch_n && !dp->scratch) || (dp->staging_n && !dp->staging) || !dp->norm_acc) {
            long long n = (long long)dp->shard_n;
            loom_dp_free(dp);
            return loom_fail(LOOM_ENOMEM, "use a higher --zero stage or fewer parameters",
                             "cannot allocate the %lld-element gradient shard", n);
        }
    }
    *out = dp;
    return LOOM_OK;
}

loom_status loom_dp_plan(const loom_param_table *table, int W, bool replicas, loom_dtype dtype, int zero,
                         double bucket_mb, size_t *buffers, int64_t *state_elements) {
    loom_dp *dp;
    int64_t E = 0;
    LOOM_TRY(bucket_elements(bucket_mb, loom_dtype_size(dtype), W, &E));
    LOOM_TRY(lay_out(&dp, W, 0, replicas, loom_dtype_size(dtype), table, zero, E));
    *buffers = loom_dp_memory_bytes(dp);
    *state_elements = loom_dp_state_elements(dp);
    free(dp->buckets);
    free(dp->slices);
    free(dp);
    return LOOM_OK;
}

loom_status loom_dp_layout(const loom_param_table *table, int W, int R, int zero, int64_t bucket_len,
                           loom_param_slice **slices, int *nslices, int64_t *state_elements) {
    loom_dp *dp;
    LOOM_TRY(lay_out(&dp, W, R, false, sizeof(float), table, zero, bucket_len));
    *slices = dp->slices, *nslices = dp->nslices;
    *state_elements = loom_dp_state_elements(dp);
    free(dp->buckets);
    free(dp);
    return LOOM_OK;
}

void loom_dp_free(loom_dp *dp) {
    if (!dp) return;
    finish_gathers(dp, INT_MAX); // nothing in flight into buffers about to go
    dp->be->free(dp->be, dp->shard);
    dp->be->free(dp->be, dp->scratch);
    dp->be->free(dp->be, dp->staging);
    dp->be->free(dp->be, dp->norm_acc);
    free(dp->buckets);
    free(dp->slices);
    free(dp);
}

const loom_param_slice *loom_dp_slices(const loom_dp *dp, int *nslices) {
    *nslices = dp->nslices;
    return dp->slices;
}
int64_t loom_dp_state_elements(const loom_dp *dp) { return dp->zero == 0 ? dp->num_elements : dp->shard_n; }
int loom_dp_num_buckets(const loom_dp *dp) { return dp->nbuckets; }

size_t loom_dp_memory_bytes(const loom_dp *dp) {
    return dp->reduces ? (size_t)(dp->shard_n + dp->scratch_n + dp->staging_n) * dp->es + (size_t)dp->W * sizeof(double) : 0;
}
int64_t loom_dp_bucket_elements(const loom_dp *dp) { return dp->buckets[0].len; }

bool loom_dp_syncs(const loom_dp *dp, int a, int A) {
    return (dp->reduces && dp->zero >= 2) || a == A - 1;
}

void loom_dp_set_units(loom_dp *dp, loom_dp_units units) { dp->units = units; }

void loom_dp_bucket(const loom_dp *dp, int b, int64_t *start, int64_t *len, int64_t *piece, int64_t *shard_offset) {
    const bucket *k = &dp->buckets[b];
    *start = k->start, *len = k->len, *piece = k->piece, *shard_offset = k->shard_offset;
}

void loom_dp_begin_micro_batch(loom_dp *dp, void *grads, bool first, bool sync) {
    dp->grads = grads;
    dp->communicate = dp->reduces && sync;
    dp->first = first;
}

static void keep_error(loom_dp *dp, loom_status s) {
    if (s != LOOM_OK && dp->error == LOOM_OK) dp->error = s;
}

static loom_status take_error(loom_dp *dp) {
    loom_status s = dp->error;
    dp->error = LOOM_OK;
    return s;
}

// Completes bucket b's all-gather into dp->gather_to (the ragged bucket's out of the staging
// buffer).
static void finish_gather(loom_dp *dp, int b) {
    bucket *k = &dp->buckets[b];
    if (k->req) keep_error(dp, loom_comm_wait(k->req));
    k->req = NULL;
    k->gathering = false;
    if (k->staged) dp->be->copy(dp->be, AT(dp->gather_to, k->start), dp->staging, (size_t)k->len * dp->es);
}

// Starts bucket b's reduce-scatter (average over ranks) into the shard (zero 2: the scratch; zero
// 3: the shard on the step's first reduction, else the scratch; one rank: a copy).
static void start_reduce(loom_dp *dp, int b) {
    bucket *k = &dp->buckets[b];
    loom_backend *be = dp->be;
    const void *send = dp->zero == 3 ? dp->units.grads(dp->units.ctx, b) : AT(dp->grads, k->start);
    LOOM_CHECK(send && !k->gathering); // the parameters' gather was waited for by the forward
    if (k->staged) { // the ragged last bucket, padded with zeros
        be->copy(be, dp->staging, send, (size_t)k->len * dp->es);
        be->zero(be, AT(dp->staging, k->len), (size_t)(k->piece * dp->W - k->len) * dp->es);
        send = dp->staging;
    }
    void *recv = AT(dp->zero == 2 ? dp->scratch : dp->shard, k->shard_offset);
    if (dp->zero == 3) recv = k->target = dp->first ? recv : dp->scratch;
    k->reducing = true;
    if (dp->W == 1) be->copy(be, recv, send, (size_t)k->len * dp->es);
    else keep_error(dp, loom_reduce_scatter(dp->comm, send, recv, (size_t)k->piece, be->dtype, LOOM_AVG, &k->req));
}

// Completes bucket b's reduction: its piece averaged over the shard's ranks, then (hybrid
// sharding) over the replicas; zero 3 adds it into the shard (after the step's first reduction)
// and hands the unit's gradient buffer back.
static void finish_reduce(loom_dp *dp, int b) {
    bucket *k = &dp->buckets[b];
    loom_backend *be = dp->be;
    if (k->req) keep_error(dp, loom_comm_wait(k->req));
    k->req = NULL;
    k->reducing = false;
    void *mine = AT(dp->shard, k->shard_offset);
    void *piece = dp->zero == 3 ? k->target : dp->zero == 2 ? AT(dp->scratch, k->shard_offset) : mine;
    if (dp->replicas) keep_error(dp, loom_allreduce(dp->replicas, piece, (size_t)k->piece, be->dtype, LOOM_AVG, NULL));
    if (dp->zero < 3) return;
    if (piece != mine) {
        loom_tensor acc = loom_view_dims(mine, be->dtype, &k->piece, 1), add = loom_view_dims(piece, be->dtype, &k->piece, 1);
        be->residual_forward(be, acc, acc, add);
    }
    k->target = NULL;
    dp->units.reduced(dp->units.ctx, b);
}

static void finish_reductions(loom_dp *dp) {
    for (int b = 0; b < dp->nbuckets; b++)
        if (dp->buckets[b].reducing) finish_reduce(dp, b);
}

// ZeRO 0: completes bucket b's reduce-scatter and starts the all-gather of its reduced pieces
// from the shard into the full gradient buffer, which nothing writes until the next step (the
// bucket's gradients are final, and ZeRO 0 reduces once a step). Not for the ragged bucket: it
// goes through the staging buffer, in gather.
static void start_grads_gather(loom_dp *dp, int b) {
    bucket *k = &dp->buckets[b];
    finish_reduce(dp, b);
    dp->gather_to = dp->grads;
    keep_error(dp, loom_allgather(dp->comm, AT(dp->shard, k->shard_offset), AT(dp->grads, k->start), (size_t)k->piece,
                                  dp->be->dtype, &k->req));
    k->gathering = true;
}

void loom_dp_grads_ready(void *ctx, int layer) {
    loom_dp *dp = ctx;
    if (!dp->communicate) return;
    if (dp->zero == 3) finish_reductions(dp); // one unit's reduction in flight: one scratch piece, few buffers
    // zero 0: the reduce-scatters started at an earlier layer's hook (a layer's backward ago, so
    // mostly done) go on to their all-gathers, which then run under the rest of backward too. By
    // layer, not by which have finished: every rank starts its collectives in the same order.
    for (int b = 0; b < dp->nbuckets; b++) {
        const bucket *k = &dp->buckets[b];
        if (dp->zero == 0 && k->reducing && !k->staged && k->ready_layer > layer) start_grads_gather(dp, b);
    }
    for (int b = 0; b < dp->nbuckets; b++)
        if (dp->buckets[b].ready_layer == layer) start_reduce(dp, b);
    for (int b = 0; b < dp->nbuckets; b++) { // MPI moves data forward inside its calls
        bool done;
        if (dp->buckets[b].req) keep_error(dp, loom_comm_test(dp->buckets[b].req, &done));
    }
}

loom_status loom_dp_end_micro_batch(loom_dp *dp) {
    if (dp->communicate) {
        finish_reductions(dp);
        if (dp->zero == 2) { // shard (+)= this micro-batch's reduced pieces; clear the full buffer
            loom_backend *be = dp->be;
            loom_tensor acc = loom_view_dims(dp->shard, be->dtype, &dp->shard_n, 1);
            loom_tensor add = loom_view_dims(dp->scratch, be->dtype, &dp->shard_n, 1);
            if (dp->first) be->copy(be, dp->shard, dp->scratch, (size_t)dp->shard_n * dp->es);
            else be->residual_forward(be, acc, acc, add);
            be->zero(be, dp->grads, (size_t)dp->num_elements * dp->es);
        }
    }
    return take_error(dp);
}

// Sum of squares of the counted tensors' elements among flat elements [lo, hi), whose values
// are at p: one call per run of consecutive counted tensors. With acc (backend memory) each run's
// is added to *acc on the backend instead (sumsq_add, in the same order), and 0 returned.
static double counted_sumsq(const loom_dp *dp, const char *p, int64_t lo, int64_t hi, double *acc) {
    double total = 0;
    for (int64_t at = lo; at < hi;) {
        int i = loom_param_table_find(dp->table, at);
        bool counted = dp->table->params[i].counted;
        int64_t end = at;
        for (; i < dp->table->count && dp->table->params[i].counted == counted && end < hi; i++)
            end = dp->table->params[i].offset + dp->table->params[i].local_numel;
        end = end < hi ? end : hi;
        int64_t n = end - at;
        loom_tensor run = loom_view_dims((void *)(p + (size_t)(at - lo) * dp->es), dp->be->dtype, &n, 1);
        if (counted && acc) dp->be->sumsq_add(dp->be, acc, run);
        else if (counted) total += dp->be->sumsq(dp->be, run);
        at = end;
    }
    return total;
}

// Sum of squares of rank r's pieces, read from the full buffer (r's pieces at start + r*piece)
// or, for this rank, from the shard; pieces that continue each other (one rank: the whole
// buffer) are summed as one run. acc: as counted_sumsq's.
static double piece_sumsq(loom_dp *dp, int r, bool from_shard, double *acc) {
    double total = 0;
    int64_t lo = 0, hi = 0; // the run's flat elements, at p
    const char *p = NULL;
    for (int b = 0; b < dp->nbuckets; b++) {
        const bucket *k = &dp->buckets[b];
        size_t off, len;
        loom_comm_shard((size_t)k->len, dp->W, r, &off, &len);
        if (!len) continue;
        int64_t flat = k->start + (int64_t)off;
        const char *src = from_shard ? AT(dp->shard, k->shard_offset) : AT(dp->grads, flat);
        if (p && flat == hi && src == p + (size_t)(hi - lo) * dp->es) {
            hi += (int64_t)len;
            continue;
        }
        if (p) total += counted_sumsq(dp, p, lo, hi, acc);
        p = src, lo = flat, hi = flat + (int64_t)len;
    }
    if (p) total += counted_sumsq(dp, p, lo, hi, acc);
    return total;
}

// The sum of squares of ranks [r0, r1)'s pieces (piece_sumsq), each rank's added up in backend
// memory without a wait per run, read back at once and added in rank order: the bits of the
// host's fp64 sums of the same runs, at one wait instead of one a run.
static double ranks_sumsq(loom_dp *dp, int r0, int r1, bool from_shard) {
    loom_backend *be = dp->be;
    size_t bytes = (size_t)(r1 - r0) * sizeof(double);
    be->zero(be, dp->norm_acc, bytes);
    for (int r = r0; r < r1; r++) piece_sumsq(dp, r, from_shard, dp->norm_acc + (r - r0));
    double *each = loom_xmalloc(bytes), total = 0;
    be->download(be, each, dp->norm_acc, bytes);
    for (int r = r0; r < r1; r++) total += each[r - r0];
    free(each);
    return total;
}

// Starts the all-gather of every rank's piece of each bucket into full (in place: this rank's
// piece is already at full + start + R*piece, or in the shard when from_shard; the ragged bucket
// through the staging buffer, which nothing else uses until it is finished), but for the buckets
// with a gather in flight: every reduction has finished by now, so that is an all-gather of ZeRO
// 0's gradients started during backward (start_grads_gather).
static void start_gathers(loom_dp *dp, void *full, bool from_shard) {
    dp->gather_to = full;
    for (int b = 0; b < dp->nbuckets; b++) {
        bucket *k = &dp->buckets[b];
        if (k->gathering) continue;
        void *dst = k->staged ? dp->staging : AT(full, k->start), *mine = AT(dst, (int64_t)dp->R * k->piece);
        const void *src = from_shard ? AT(dp->shard, k->shard_offset) : AT(full, k->start + (int64_t)dp->R * k->piece);
        if (src != mine) dp->be->copy(dp->be, mine, src, (size_t)k->own_len * dp->es);
        keep_error(dp, loom_allgather(dp->comm, NULL, dst, (size_t)k->piece, dp->be->dtype, &k->req));
        k->gathering = true;
    }
}

// Completes the gathers of the buckets whose parameters `layer` may read: those holding a
// tensor of a layer <= `layer` (forward runs -1, 0, ..., L; all of them at INT_MAX).
static void finish_gathers(loom_dp *dp, int layer) {
    for (int b = 0; b < dp->nbuckets; b++)
        if (dp->buckets[b].gathering && dp->buckets[b].ready_layer <= layer) finish_gather(dp, b);
}

loom_status loom_dp_reduced_grads(loom_dp *dp, void **grads, double *norm_sumsq) {
    double sumsq = 0;
    if (!dp->reduces) { // nothing to reduce: the full buffer is the shard
        *grads = dp->grads;
        sumsq = piece_sumsq(dp, 0, false, NULL);
    } else if (dp->zero == 0) {
        start_gathers(dp, dp->grads, true);
        finish_gathers(dp, INT_MAX);
        LOOM_TRY(take_error(dp));
        *grads = dp->grads;
        sumsq = ranks_sumsq(dp, 0, dp->W, false);
    } else {
        *grads = dp->shard;
        double *each = loom_xmalloc((size_t)dp->W * sizeof(double)), mine = ranks_sumsq(dp, dp->R, dp->R + 1, true);
        loom_status s = loom_allgather(dp->host, &mine, each, 1, LOOM_F64, NULL);
        for (int r = 0; r < dp->W; r++) sumsq += each[r];
        free(each);
        LOOM_TRY(s);
    }
    *norm_sumsq = sumsq;
    return LOOM_OK;
}

void loom_dp_local_grads(loom_dp *dp, void **grads, double *sumsq) {
    LOOM_CHECK(!dp->reduces);
    *grads = dp->grads;
    piece_sumsq(dp, 0, false, sumsq); // the whole buffer as one run: loom_dp_reduced_grads's sums
}

loom_status loom_dp_gather_params(loom_dp *dp, void *params) {
    if (!dp->reduces || dp->zero == 0 || dp->zero == 3) return LOOM_OK; // zero 3: the owner gathers units on use
    start_gathers(dp, params, false);
    return take_error(dp);
}

void loom_dp_params_ready(void *ctx, int layer) { finish_gathers(ctx, layer); }

loom_status loom_dp_wait_params(loom_dp *dp) {
    finish_gathers(dp, INT_MAX);
    return take_error(dp);
}
