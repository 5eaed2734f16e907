// The data-parallel engine on synthetic flat buffers, alone or under mpirun -np N: for ZeRO
// 0-3 and 1 or 3 micro-batches, gradients written layer by layer as a backward pass writes
// them (each bucket must start its reduction only once all its gradients are final; ZeRO 3
// reads each unit's from its owner's buffer and hands every buffer back), then the reduced
// gradients (the average over ranks) at every optimizer slice, the slices covering each element
// exactly once over the ranks of a replica (ZeRO 1-3), the global norm, and the parameters
// gathered back on every rank (ZeRO 0-2), each layer's by the time its forward hook has run.
// With an even number of ranks, the same as two replicas of hybrid sharding (ZeRO 1-3). Also the
// errors of impossible layouts.
#include "harness.h"

#include "backend/backend.h"
#include "comm/comm.h"
#include "core/rng.h"
#include "parallel/data_parallel.h"

#include <string.h>

enum { L = 3 };
static uint64_t g_seed;

// a layer-major table: an embedding-like tensor (layer -1), two per layer, a final-norm-like one (layer L)
static void make_table(loom_param_table *t) {
    *t = (loom_param_table){0};
    loom_param p = {.name = "d", .layer = -1, .ndim = 1, .shape = {29}, .weight_decay = true};
    loom_param_table_add(t, &p);
    for (int l = 0; l < L; l++) {
        p = (loom_param){.name = "a", .layer = l, .ndim = 1, .shape = {37}, .weight_decay = true};
        loom_param_table_add(t, &p);
        p = (loom_param){.name = "c", .layer = l, .ndim = 1, .shape = {50}, .weight_decay = true};
        loom_param_table_add(t, &p);
    }
    p = (loom_param){.name = "b", .layer = L, .ndim = 1, .shape = {17}};
    loom_param_table_add(t, &p);
    T_ASSERT(loom_param_table_shard(t, 0, 1) == LOOM_OK, "table");
}

static int layer_of(const loom_param_table *t, int64_t i) { return t->params[loom_param_table_find(t, i)].layer; }

static float grad(int r, int a, int64_t i) { return (float)loom_rng_normal(g_seed, (uint64_t)(100 * r + a), (uint64_t)i); }

// ZeRO 3's owner of the unit gradient buffers: a padded copy of the unit's part of the full buffer.
typedef struct {
    loom_dp *dp;
    const float *grads;
    void *bufs[L + 2];
    int W, handed, reduced;
} owner;

static void *owner_grads(void *ctx, int b) {
    owner *o = ctx;
    int64_t start, len, piece, off;
    loom_dp_bucket(o->dp, b, &start, &len, &piece, &off);
    T_ASSERT(!o->bufs[b], "unit %d asked for twice", b);
    o->bufs[b] = calloc((size_t)(piece * o->W), sizeof(float));
    memcpy(o->bufs[b], o->grads + start, (size_t)len * sizeof(float));
    o->handed++;
    return o->bufs[b];
}

static void owner_reduced(void *ctx, int b) {
    owner *o = ctx;
    free(o->bufs[b]);
    o->bufs[b] = NULL;
    o->reduced++;
}

// replicas: 1, or 2 (hybrid sharding: two replicas of W/2 ranks)
static void run_case(loom_comm *world, loom_backend *be, int zero, int A, int replicas) {
    int R = loom_comm_rank(world), W = loom_comm_size(world), S = W / replicas;
    loom_comm *c = world, *rep = NULL;
    if (replicas > 1) {
        T_ASSERT(loom_comm_split(world, R / S, R, &c) == LOOM_OK && loom_comm_split(world, R % S, R, &rep) == LOOM_OK,
                 "split");
    }
    loom_param_table table;
    make_table(&table);
    int64_t N = table.num_elements;
    loom_dp *dp;
    double bucket_mb = 40.0 * 4 / (1024 * 1024); // about 40 elements: several buckets
    T_ASSERT(loom_dp_create(&dp, c, c, rep, be, &table, zero, bucket_mb) == LOOM_OK, "create: %s", loom_error_message());
    owner units = {.dp = dp, .W = S};
    float *grads = be->alloc(be, (size_t)N * 4), *params = be->alloc(be, (size_t)N * 4);
    double *want = calloc((size_t)N, sizeof(double)), *scale = calloc((size_t)N, sizeof(double));
    for (int64_t i = 0; i < N; i++) { // the average, and the size of its terms (sums may cancel)
        for (int r = 0; r < W; r++)
            for (int a = 0; a < A; a++) want[i] += grad(r, a, i), scale[i] += fabs(grad(r, a, i));
        want[i] /= W, scale[i] /= W;
        params[i] = NAN;
    }
    units.grads = grads;
    if (zero == 3) {
        T_ASSERT(loom_dp_num_buckets(dp) == L + 2, "ZeRO 3: %d buckets, want one per layer (%d)", loom_dp_num_buckets(dp), L + 2);
        loom_dp_set_units(dp, (loom_dp_units){&units, owner_grads, owner_reduced});
    }
    for (int a = 0; a < A; a++) {
        loom_dp_begin_micro_batch(dp, grads, a == 0, loom_dp_syncs(dp, a, A));
        for (int layer = L; layer >= -1; layer--) { // backward order, gradients final per layer
            for (int64_t i = 0; i < N; i++)
                if (layer_of(&table, i) == layer) grads[i] += grad(R, a, i);
            loom_dp_grads_ready(dp, layer);
        }
        T_ASSERT(loom_dp_end_micro_batch(dp) == LOOM_OK, "end micro-batch");
        if (zero == 3) memset(grads, 0, (size_t)N * sizeof(float)); // the owner's buffers held this micro-batch's
    }
    if (zero == 3)
        T_ASSERT(units.handed == A * (L + 2) && units.reduced == units.handed, "ZeRO 3: %d buffers asked for, %d handed back",
                 units.handed, units.reduced);
    void *reduced;
    double norm;
    T_ASSERT(loom_dp_reduced_grads(dp, &reduced, &norm) == LOOM_OK, "reduced grads");
    norm = sqrt(norm);
    int n;
    const loom_param_slice *slices = loom_dp_slices(dp, &n);
    int32_t *cover = calloc((size_t)N, sizeof(int32_t));
    double worst = 0, sumsq = 0;
    for (int k = 0; k < n; k++)
        for (int64_t j = 0; j < slices[k].numel; j++) {
            int64_t i = slices[k].offset + j;
            double g = ((float *)reduced)[slices[k].state_offset + j], e = fabs(g - want[i]) / scale[i];
            if (e > worst) worst = e;
            cover[i]++;
            params[i] = 2.0f * (float)g + 1.0f; // an "optimizer update" of this rank's elements
        }
    for (int64_t i = 0; i < N; i++) sumsq += want[i] * want[i];
    int wrong_cover = 0;
    loom_allreduce(world, cover, (size_t)N, LOOM_I32, LOOM_SUM, NULL);
    for (int64_t i = 0; i < N; i++) wrong_cover += cover[i] != (zero == 0 ? W : replicas);
    T_ASSERT(worst < 1e-5, "ZeRO %d A=%d replicas %d: reduced gradients rel err %g", zero, A, replicas, worst);
    T_ASSERT(wrong_cover == 0, "ZeRO %d: %d elements not covered once per owner", zero, wrong_cover);
    T_ASSERT(fabs(norm - sqrt(sumsq)) < 1e-5 * sqrt(sumsq), "ZeRO %d A=%d replicas %d: norm %g vs %g", zero, A,
             replicas, norm, sqrt(sumsq));
    T_ASSERT(loom_dp_gather_params(dp, params) == LOOM_OK, "gather params");
    int bad = 0; // the next forward's hooks: after layer l's, the parameters of layers <= l are gathered
    for (int layer = -1; layer <= L && zero < 3; layer++) {
        loom_dp_params_ready(dp, layer);
        for (int64_t i = 0; i < N; i++)
            if (layer_of(&table, i) == layer)
                bad += !(fabs(params[i] - (2.0 * want[i] + 1.0)) < 1e-5 * (2 * fabs(want[i]) + 1));
    }
    T_ASSERT(loom_dp_wait_params(dp) == LOOM_OK, "wait params");
    T_ASSERT(bad == 0, "ZeRO %d A=%d: %d parameters wrong after their layer's forward hook", zero, A, bad);
    if (replicas > 1) {
        loom_comm_free(c);
        loom_comm_free(rep);
    }
    free(cover);
    free(want);
    free(scale);
    be->free(be, grads);
    be->free(be, params);
    loom_dp_free(dp);
    loom_param_table_free(&table);
}

static void test_errors(loom_comm *c, loom_backend *be) {
    loom_param_table table;
    make_table(&table);
    loom_dp *dp;
    T_ASSERT(loom_dp_create(&dp, c, c, NULL, be, &table, 4, 25) == LOOM_EINVAL && strstr(loom_error_message(), "ZeRO stage 4"),
             "zero 4: %s", loom_error_message());
    T_ASSERT(loom_dp_create(&dp, c, c, NULL, be, &table, 0, 0) == LOOM_EINVAL && strstr(loom_error_message(), "bucket"),
             "bucket 0: %s", loom_error_message());
    loom_param_table_free(&table);
    if (loom_comm_size(c) > 1) {
        loom_param p = {.name = "one", .ndim = 1, .shape = {1}};
        loom_param_table_add(&table, &p);
        T_ASSERT(loom_param_table_shard(&table, 0, 1) == LOOM_OK, "one-element table");
        T_ASSERT(loom_dp_create(&dp, c, c, NULL, be, &table, 0, 25) == LOOM_EINVAL &&
                     strstr(loom_error_message(), "exceed the model's 1 parameters"),
                 "more ranks than parameters: %s", loom_error_message());
        loom_param_table_free(&table);
    }
}

int main(int argc, char **argv) {
    loom_comm *c;
    loom_backend *be;
    if (loom_comm_world(&argc, &argv, &c) != LOOM_OK || loom_backend_create(&be, "cpu", LOOM_F32) != LOOM_OK) return 1;
    uint64_t seed = loom_comm_rank(c) == 0 ? t_seed() : 0;
    loom_broadcast(c, &seed, 1, LOOM_F64, 0, NULL);
    g_seed = seed;
    for (int zero = 0; zero <= 3; zero++)
        for (int replicas = 1; replicas <= (zero > 0 && loom_comm_size(c) % 2 == 0 ? 2 : 1); replicas++) {
            run_case(c, be, zero, 1, replicas);
            run_case(c, be, zero, 3, replicas);
        }
    test_errors(c, be);
    printf("rank %d of %d: ", loom_comm_rank(c), loom_comm_size(c));
    int rc = t_done("dp");
    loom_backend_destroy(be);
    loom_comm_finalize(c);
    return rc;
}
