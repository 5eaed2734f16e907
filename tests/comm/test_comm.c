// Collectives of src/comm against reference results computed on every rank: all-reduce,
// reduce-scatter, all-gather (in and out of place), broadcast, all-to-all, send/recv, barrier,
// for counts that do and do not divide by the group size, every dtype, SUM, AVG and MAX; sub-groups
// by split; requests waited out of order; failure agreement; even sharding. Values are small
// integers (exact in every dtype, so sums are exact) plus one fp32 case of random reals.
// Run alone (the "self" backend) or under mpirun -np N.
#include "comm_values.h"

#include <string.h>

static void test_reductions(loom_comm *c, loom_dtype dt, loom_red_op op, size_t n, int k) {
    int R = loom_comm_rank(c), W = loom_comm_size(c);
    size_t es = loom_dtype_size(dt);
    char *buf = malloc(n * W * es + 1), *piece = malloc(n * es + 1);
    const char *what = op == LOOM_SUM ? "sum" : op == LOOM_AVG ? "avg" : "max";
    // all-reduce of n elements
    for (size_t i = 0; i < n; i++) put(buf, dt, i, value(k, R, i));
    T_ASSERT(loom_allreduce(c, buf, n, dt, op, NULL) == LOOM_OK, "allreduce: %s", loom_error_message());
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad += get(buf, dt, i) != reduced(k, W, i, dt, op);
    T_ASSERT(bad == 0, "allreduce %s %s n=%zu: %d wrong", loom_dtype_name(dt), what, n, bad);
    // reduce-scatter of W pieces of n
    for (size_t i = 0; i < n * W; i++) put(buf, dt, i, value(k + 1, R, i));
    memset(piece, 0xff, n * es);
    T_ASSERT(loom_reduce_scatter(c, buf, piece, n, dt, op, NULL) == LOOM_OK, "reduce_scatter");
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += get(piece, dt, i) != reduced(k + 1, W, (size_t)R * n + i, dt, op);
    T_ASSERT(bad == 0, "reduce_scatter %s %s n=%zu: %d wrong", loom_dtype_name(dt), what, n, bad);
    free(buf);
    free(piece);
}

static void test_movement(loom_comm *c, size_t n, int k) {
    int R = loom_comm_rank(c), W = loom_comm_size(c);
    float *mine = malloc(n * sizeof(float) + 4), *all = malloc(n * W * sizeof(float) + 4);
    int bad = 0;
    for (size_t i = 0; i < n; i++) mine[i] = (float)value(k, R, i);
    // all-gather, out of place then in place
    for (int inplace = 0; inplace < 2; inplace++) {
        for (size_t i = 0; i < n * W; i++) all[i] = NAN;
        if (inplace) memcpy(all + (size_t)R * n, mine, n * sizeof(float));
        T_ASSERT(loom_allgather(c, inplace ? NULL : mine, all, n, LOOM_F32, NULL) == LOOM_OK, "allgather");
        for (int r = 0; r < W; r++)
            for (size_t i = 0; i < n; i++) bad += all[(size_t)r * n + i] != (float)value(k, r, i);
    }
    T_ASSERT(bad == 0, "allgather n=%zu: %d wrong", n, bad);
    // broadcast from the last rank
    for (size_t i = 0; i < n; i++) mine[i] = R == W - 1 ? (float)value(k, W - 1, i) : NAN;
    T_ASSERT(loom_broadcast(c, mine, n, LOOM_F32, W - 1, NULL) == LOOM_OK, "broadcast");
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += mine[i] != (float)value(k, W - 1, i);
    T_ASSERT(bad == 0, "broadcast n=%zu: %d wrong", n, bad);
    // all-to-all: piece p of rank r holds value(k + p, r, i)
    float *send = malloc(n * W * sizeof(float) + 4);
    for (int p = 0; p < W; p++)
        for (size_t i = 0; i < n; i++) send[(size_t)p * n + i] = (float)value(k + p, R, i);
    T_ASSERT(loom_alltoall(c, send, all, n, LOOM_F32, NULL) == LOOM_OK, "alltoall");
    bad = 0;
    for (int p = 0; p < W; p++)
        for (size_t i = 0; i < n; i++) bad += all[(size_t)p * n + i] != (float)value(k + R, p, i);
    T_ASSERT(bad == 0, "alltoall n=%zu: %d wrong", n, bad);
    // send/recv around a ring
    if (W > 1) {
        loom_comm_req *rs, *rr;
        for (size_t i = 0; i < n; i++) mine[i] = (float)value(k, R, i);
        T_ASSERT(loom_recv(c, all, n, LOOM_F32, (R + W - 1) % W, 5, &rr) == LOOM_OK, "irecv");
        T_ASSERT(loom_send(c, mine, n, LOOM_F32, (R + 1) % W, 5, &rs) == LOOM_OK, "isend");
        T_ASSERT(loom_comm_wait(rr) == LOOM_OK && loom_comm_wait(rs) == LOOM_OK, "ring wait");
        bad = 0;
        for (size_t i = 0; i < n; i++) bad += all[i] != (float)value(k, (R + W - 1) % W, i);
        T_ASSERT(bad == 0, "ring send/recv n=%zu: %d wrong", n, bad);
    }
    free(send);
    free(mine);
    free(all);
}

// several operations in flight, completed in reverse order
static void test_async(loom_comm *c) {
    int R = loom_comm_rank(c), W = loom_comm_size(c);
    enum { K = 4, N = 3001 };
    float *bufs = malloc(sizeof(float) * K * N);
    loom_comm_req *req[K];
    for (int k = 0; k < K; k++) {
        for (int i = 0; i < N; i++) bufs[k * N + i] = (float)value(50 + k, R, (size_t)i);
        T_ASSERT(loom_allreduce(c, bufs + k * N, N, LOOM_F32, LOOM_SUM, &req[k]) == LOOM_OK, "iallreduce");
    }
    bool done;
    T_ASSERT(loom_comm_test(req[0], &done) == LOOM_OK, "test");
    int bad = 0;
    for (int k = K - 1; k >= 0; k--) {
        T_ASSERT(loom_comm_wait(req[k]) == LOOM_OK, "wait");
        for (int i = 0; i < N; i++) bad += bufs[k * N + i] != (float)reduced(50 + k, W, (size_t)i, LOOM_F32, LOOM_SUM);
    }
    T_ASSERT(bad == 0, "async allreduce: %d wrong", bad);
    free(bufs);
}

// random reals: fp32 sums within rounding of the fp64 sum, relative to the terms' size
static void test_reals(loom_comm *c) {
    int R = loom_comm_rank(c), W = loom_comm_size(c);
    enum { N = 10007 };
    float *x = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) x[i] = (float)loom_rng_normal(g_seed, 7000 + (uint64_t)R, (uint64_t)i);
    T_ASSERT(loom_allreduce(c, x, N, LOOM_F32, LOOM_AVG, NULL) == LOOM_OK, "allreduce reals");
    double worst = 0;
    for (int i = 0; i < N; i++) {
        double want = 0, scale = 0; // error relative to the terms' size (sums may cancel)
        for (int r = 0; r < W; r++) {
            double term = (float)loom_rng_normal(g_seed, 7000 + (uint64_t)r, (uint64_t)i);
            want += term, scale += fabs(term);
        }
        want /= W, scale /= W;
        double e = fabs(x[i] - want) / (scale + 1e-30);
        if (e > worst) worst = e;
    }
    T_ASSERT(worst < 1e-6, "fp32 average of reals: rel err %g", worst);
    free(x);
}

static void test_split_and_agree(loom_comm *c) {
    int R = loom_comm_rank(c), W = loom_comm_size(c);
    loom_comm *half;
    T_ASSERT(loom_comm_split(c, R % 2, R, &half) == LOOM_OK, "split");
    int hw = loom_comm_size(half);
    T_ASSERT(hw == (W + 1 - R % 2) / 2 && loom_comm_rank(half) == R / 2, "split sizes: %d of %d", loom_comm_rank(half), hw);
    int32_t v = R;
    T_ASSERT(loom_allreduce(half, &v, 1, LOOM_I32, LOOM_SUM, NULL) == LOOM_OK, "split allreduce");
    int32_t want = 0;
    for (int r = R % 2; r < W; r += 2) want += r;
    T_ASSERT(v == want, "split allreduce %d vs %d", v, want);
    loom_comm_free(half);
    bool report = R == 0;
    T_ASSERT(loom_comm_agree(c, LOOM_OK, &report) == LOOM_OK && report == (R == 0), "agree all ok: report kept");
    loom_status local = R == W - 1 ? loom_fail(LOOM_EINVAL, NULL, "planted failure") : LOOM_OK;
    loom_status s = loom_comm_agree(c, local, &report);
    T_ASSERT(s != LOOM_OK && report == (R == W - 1), "agree: status %d, report %d on rank %d", s, report, R);
}

static void test_shard(void) {
    for (size_t n = 0; n < 40; n++)
        for (int W = 1; W <= 5; W++) {
            size_t covered = 0, prev_end = 0;
            for (int r = 0; r < W; r++) {
                size_t off, len;
                loom_comm_shard(n, W, r, &off, &len);
                T_ASSERT(len == 0 || off == prev_end, "shard n=%zu W=%d r=%d contiguous", n, W, r);
                covered += len;
                if (len) prev_end = off + len;
            }
            T_ASSERT(covered == n, "shards of n=%zu over %d cover %zu", n, W, covered);
        }
}

int main(int argc, char **argv) {
    loom_comm *c;
    if (loom_comm_world(&argc, &argv, &c) != LOOM_OK) {
        fprintf(stderr, "%s\n", loom_error_message());
        return 1;
    }
    int R = loom_comm_rank(c), W = loom_comm_size(c);
    agree_seed(c);
    const loom_dtype dts[] = {LOOM_F32, LOOM_F64, LOOM_I32, LOOM_BF16};
    const size_t counts[] = {1, 7, 1000, 4099, (size_t)W * 1024};
    int k = 0;
    for (size_t d = 0; d < 4; d++)
        for (size_t n = 0; n < 5; n++)
            for (int op = LOOM_SUM; op <= LOOM_MAX; op++) test_reductions(c, dts[d], (loom_red_op)op, counts[n], k += 2);
    for (size_t n = 0; n < 5; n++) test_movement(c, counts[n], k += W + 1);
    test_async(c);
    test_reals(c);
    test_split_and_agree(c);
    test_shard();
    T_ASSERT(loom_barrier(c) == LOOM_OK, "barrier");
    printf("rank %d of %d (%s): ", R, W, loom_comm_backend(c));
    int rc = t_done("comm");
    loom_comm_finalize(c);
    return rc;
}
