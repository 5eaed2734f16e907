// See data_parallel.h. A step, with W ranks and A micro-batches:
//   for a in 0..A-1: begin_micro_batch; forward/backward (grads_ready hooks start the
//                    bucket reduce-scatters); end_micro_batch
//   reduced_grads (zero 0: all-gather pieces; the norm) -> AdamW on the ranges -> gather_params
#include "parallel/data_parallel.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t start, len;   // flat elements [start, start + len)
    int64_t piece;        // ceil(len / W): each rank's piece
    int64_t own_len;      // real elements of this rank's piece (< piece only in a ragged bucket)
    int64_t shard_offset; // this rank's piece in the shard buffers
    int ready_stage;      // backward stage after which every gradient in it is final
    bool staged;          // len % W != 0: reduced and gathered through the staging buffer
    loom_comm_req *req;
} bucket;

struct loom_dp {
    loom_comm *comm, *host;   // the backend's buffers; host values
    loom_backend *be;
    int zero, W, R;
    size_t es;                // bytes per element (be->dtype)
    bucket *buckets;
    int nbuckets;
    int64_t num_elements, shard_n;
    void *grads;              // the model's full gradient buffer
    void *shard, *scratch;    // (shard_n) reduced pieces; zero 2: one micro-batch's before accumulation
    void *staging;            // (W * piece of the ragged bucket)
    bool communicate, first;  // this micro-batch reduces; it is the step's first reduction
    loom_status error;
    loom_param_range *ranges;
    int nranges;
};

#define AT(p, i) ((char *)(p) + (size_t)(i) * dp->es)

// Backward stage after which every gradient in [start, end) is final: the earliest (lowest)
// stage among the tensors and layers it touches.
static int ready_stage(const loom_param_spec *specs, int nspecs, int64_t start, int64_t end) {
    int stage = 1 << 30;
    for (int t = 0; t < nspecs; t++) {
        const loom_param_spec *s = &specs[t];
        int64_t lo = start > s->offset ? start : s->offset, hi = end < s->offset + s->numel ? end : s->offset + s->numel;
        if (lo >= hi) continue;
        int st = s->per_layer ? (int)((lo - s->offset) / (s->numel / s->shape[0])) : s->grad_stage;
        if (st < stage) stage = st;
    }
    return stage;
}

static void add_range(loom_dp *dp, int64_t param_offset, int64_t state_offset, int64_t numel, bool wd) {
    dp->ranges = realloc(dp->ranges, (size_t)(dp->nranges + 1) * sizeof *dp->ranges);
    LOOM_CHECK(dp->ranges);
    dp->ranges[dp->nranges++] = (loom_param_range){param_offset, state_offset, numel, wd};
}

// Optimizer ranges: zero 0, the tensors; zero 1/2, this rank's pieces cut at tensor edges.
static void make_ranges(loom_dp *dp, const loom_param_spec *specs, int nspecs) {
    for (int t = 0; dp->zero == 0 && t < nspecs; t++)
        add_range(dp, specs[t].offset, specs[t].offset, specs[t].numel, specs[t].weight_decay);
    for (int b = 0; dp->zero > 0 && b < dp->nbuckets; b++) {
        const bucket *k = &dp->buckets[b];
        int64_t own = k->start + (int64_t)dp->R * k->piece;
        for (int t = 0; t < nspecs; t++) {
            int64_t lo = own > specs[t].offset ? own : specs[t].offset;
            int64_t hi = own + k->own_len < specs[t].offset + specs[t].numel ? own + k->own_len
                                                                            : specs[t].offset + specs[t].numel;
            if (lo < hi) add_range(dp, lo, k->shard_offset + (lo - own), hi - lo, specs[t].weight_decay);
        }
    }
}

loom_status loom_dp_create(loom_dp **out, loom_comm *comm, loom_comm *host, loom_backend *be,
                           const loom_param_spec *specs, int nspecs, int64_t num_elements, int zero,
                           double bucket_mb) {
    *out = NULL;
    int W = loom_comm_size(comm);
    if (zero < 0 || zero > 2) return loom_fail(LOOM_EINVAL, "use --zero 0, 1 or 2", "unknown ZeRO stage %d", zero);
    if (!(bucket_mb > 0))
        return loom_fail(LOOM_EINVAL, "e.g. --bucket-mb 25", "--bucket-mb must be > 0, got %g", bucket_mb);
    if (num_elements < W)
        return loom_fail(LOOM_EINVAL, "use fewer ranks or a larger model",
                         "%d ranks exceed the model's %lld parameters", W, (long long)num_elements);
    loom_dp *dp = loom_xcalloc(1, sizeof *dp);
    *dp = (loom_dp){.comm = comm, .host = host, .be = be, .zero = zero, .W = W, .R = loom_comm_rank(comm),
                    .es = loom_dtype_size(be->dtype), .num_elements = num_elements};
    int64_t E = (int64_t)(bucket_mb * 1024 * 1024 / (double)dp->es) / W * W;
    if (E < W) E = W;
    dp->nbuckets = (int)((num_elements + E - 1) / E);
    dp->buckets = loom_xcalloc((size_t)dp->nbuckets, sizeof(bucket));
    for (int b = 0; b < dp->nbuckets; b++) {
        bucket *k = &dp->buckets[b];
        k->start = (int64_t)b * E;
        k->len = num_elements - k->start < E ? num_elements - k->start : E;
        k->piece = (k->len + W - 1) / W;
        k->staged = k->len % W != 0;
        size_t off, own;
        loom_comm_shard((size_t)k->len, W, dp->R, &off, &own);
        k->own_len = (int64_t)own;
        k->shard_offset = dp->shard_n;
        dp->shard_n += k->piece;
        k->ready_stage = ready_stage(specs, nspecs, k->start, k->start + k->len);
    }
    make_ranges(dp, specs, nspecs);
    if (W > 1) {
        const bucket *last = &dp->buckets[dp->nbuckets - 1];
        dp->shard = be->alloc(be, (size_t)dp->shard_n * dp->es);
        dp->scratch = zero == 2 ? be->alloc(be, (size_t)dp->shard_n * dp->es) : NULL;
        dp->staging = last->staged ? be->alloc(be, (size_t)(last->piece * W) * dp->es) : NULL;
        if (!dp->shard || (zero == 2 && !dp->scratch) || (last->staged && !dp->staging)) {
            long long n = (long long)dp->shard_n;
            loom_dp_free(dp);
            return loom_fail(LOOM_ENOMEM, "use a higher --zero stage or fewer parameters",
                             "cannot allocate the %lld-element gradient shard", n);
        }
    }
    *out = dp;
    return LOOM_OK;
}

void loom_dp_free(loom_dp *dp) {
    if (!dp) return;
    dp->be->free(dp->be, dp->shard);
    dp->be->free(dp->be, dp->scratch);
    dp->be->free(dp->be, dp->staging);
    free(dp->buckets);
    free(dp->ranges);
    free(dp);
}

const loom_param_range *loom_dp_ranges(const loom_dp *dp, int *nranges) {
    *nranges = dp->nranges;
    return dp->ranges;
}
int64_t loom_dp_state_elements(const loom_dp *dp) { return dp->zero == 0 ? dp->num_elements : dp->shard_n; }
int loom_dp_num_buckets(const loom_dp *dp) { return dp->nbuckets; }
int64_t loom_dp_bucket_elements(const loom_dp *dp) { return dp->buckets[0].len; }

void loom_dp_begin_micro_batch(loom_dp *dp, void *grads, int a, int A) {
    dp->grads = grads;
    dp->communicate = dp->W > 1 && (dp->zero == 2 || a == A - 1);
    dp->first = a == 0;
}

static void keep_error(loom_dp *dp, loom_status s) {
    if (s != LOOM_OK && dp->error == LOOM_OK) dp->error = s;
}

// Starts bucket k's reduce-scatter (average over ranks) into the shard (zero 2: the scratch).
static void start_reduce(loom_dp *dp, bucket *k) {
    const void *send = AT(dp->grads, k->start);
    if (k->staged) { // the ragged last bucket, padded with zeros
        dp->be->copy(dp->be, dp->staging, send, (size_t)k->len * dp->es);
        dp->be->zero(dp->be, AT(dp->staging, k->len), (size_t)(k->piece * dp->W - k->len) * dp->es);
        send = dp->staging;
    }
    void *recv = AT(dp->zero == 2 ? dp->scratch : dp->shard, k->shard_offset);
    keep_error(dp, loom_reduce_scatter(dp->comm, send, recv, (size_t)k->piece, dp->be->dtype, LOOM_AVG, &k->req));
}

void loom_dp_grads_ready(void *ctx, int stage) {
    loom_dp *dp = ctx;
    if (!dp->communicate) return;
    for (int b = 0; b < dp->nbuckets; b++)
        if (dp->buckets[b].ready_stage == stage) start_reduce(dp, &dp->buckets[b]);
    for (int b = 0; b < dp->nbuckets; b++) { // MPI moves data forward inside its calls
        bool done;
        if (dp->buckets[b].req) keep_error(dp, loom_comm_test(dp->buckets[b].req, &done));
    }
}

static void wait_all(loom_dp *dp) {
    for (int b = 0; b < dp->nbuckets; b++)
        if (dp->buckets[b].req) {
            keep_error(dp, loom_comm_wait(dp->buckets[b].req));
            dp->buckets[b].req = NULL;
        }
}

loom_status loom_dp_end_micro_batch(loom_dp *dp) {
    if (dp->communicate) {
        wait_all(dp);
        if (dp->zero == 2) { // shard (+)= this micro-batch's reduced pieces; clear the full buffer
            loom_backend *be = dp->be;
            loom_tensor acc = loom_view_dims(dp->shard, be->dtype, &dp->shard_n, 1);
            loom_tensor add = loom_view_dims(dp->scratch, be->dtype, &dp->shard_n, 1);
            if (dp->first) be->copy(be, dp->shard, dp->scratch, (size_t)dp->shard_n * dp->es);
            else be->residual_forward(be, acc, acc, add);
            be->zero(be, dp->grads, (size_t)dp->num_elements * dp->es);
        }
    }
    loom_status s = dp->error;
    dp->error = LOOM_OK;
    return s;
}

// Sum of squares of rank r's pieces, read from the full buffer (r's pieces at start + r*piece)
// or, for this rank, from the shard.
static double piece_sumsq(loom_dp *dp, int r, bool from_shard) {
    double total = 0;
    for (int b = 0; b < dp->nbuckets; b++) {
        const bucket *k = &dp->buckets[b];
        size_t off, len;
        loom_comm_shard((size_t)k->len, dp->W, r, &off, &len);
        int64_t n = (int64_t)len;
        void *p = from_shard ? AT(dp->shard, k->shard_offset) : AT(dp->grads, k->start + (int64_t)off);
        if (n) total += dp->be->sumsq(dp->be, loom_view_dims(p, dp->be->dtype, &n, 1));
    }
    return total;
}

// Gathers every rank's piece of each bucket into full (in place: this rank's piece is already
// at full + start + R*piece, or in the shard when from_shard).
static loom_status gather(loom_dp *dp, void *full, bool from_shard) {
    for (int b = 0; b < dp->nbuckets; b++) {
        bucket *k = &dp->buckets[b];
        void *dst = k->staged ? dp->staging : AT(full, k->start), *mine = AT(dst, (int64_t)dp->R * k->piece);
        const void *src = from_shard ? AT(dp->shard, k->shard_offset) : AT(full, k->start + (int64_t)dp->R * k->piece);
        if (src != mine) dp->be->copy(dp->be, mine, src, (size_t)k->own_len * dp->es);
        keep_error(dp, loom_allgather(dp->comm, NULL, dst, (size_t)k->piece, dp->be->dtype, &k->req));
        if (k->staged) { // one staging buffer: finish before the next use
            keep_error(dp, loom_comm_wait(k->req));
            k->req = NULL;
            dp->be->copy(dp->be, AT(full, k->start), dp->staging, (size_t)k->len * dp->es);
        }
    }
    wait_all(dp);
    loom_status s = dp->error;
    dp->error = LOOM_OK;
    return s;
}

loom_status loom_dp_reduced_grads(loom_dp *dp, void **grads, double *norm) {
    double sumsq = 0;
    if (dp->W == 1) { // nothing to reduce: the full buffer is the shard
        *grads = dp->grads;
        sumsq = piece_sumsq(dp, 0, false);
    } else if (dp->zero == 0) {
        LOOM_TRY(gather(dp, dp->grads, true));
        *grads = dp->grads;
        for (int r = 0; r < dp->W; r++) sumsq += piece_sumsq(dp, r, false);
    } else {
        *grads = dp->shard;
        double *each = loom_xmalloc((size_t)dp->W * sizeof(double)), mine = piece_sumsq(dp, dp->R, true);
        loom_status s = loom_allgather(dp->host, &mine, each, 1, LOOM_F64, NULL);
        for (int r = 0; r < dp->W; r++) sumsq += each[r];
        free(each);
        LOOM_TRY(s);
    }
    *norm = sqrt(sumsq);
    return LOOM_OK;
}

loom_status loom_dp_gather_params(loom_dp *dp, void *params) {
    if (dp->W == 1 || dp->zero == 0) return LOOM_OK;
    return gather(dp, params, false);
}
