// Collectives on device buffers through the staged group (loom_comm_staged) against the exact
// host references of comm_values.h: all-reduce and reduce-scatter in every dtype with SUM, AVG
// and MAX; all-gather (in and out of place), broadcast, all-to-all and send/recv in every dtype;
// counts that do and do not divide by the group size; several requests in flight together,
// their inputs written by the stream just before and overwritten just after; sub-groups, and a
// staged group outliving the group it was made from. Outputs start poisoned (0x7f bytes, far
// from any expected value). Then loom_comm_nccl on ranks that share a GPU must fail with
// LOOM_EINVAL and the 'share GPU' message on every rank (checked only where ranks share one).
// Run alone or under mpirun -np N; rank r uses GPU local_rank mod the host's GPUs, so ranks
// share cuda:0 on a one-GPU machine. Every rank exits 77 (ctest: skipped) when a rank has no
// CUDA device.
#include "comm_values.h"

#include "backend/backend.h"

#include <string.h>

static loom_backend *be;
static int R, W;

// n elements of dt on the device, and a host image to fill, upload and download
typedef struct {
    void *d;
    char *h;
    size_t n;
    loom_dtype dt;
} dbuf;

static size_t bytes_of(const dbuf *b) { return b->n * loom_dtype_size(b->dt); }

static dbuf d_alloc(size_t n, loom_dtype dt) {
    dbuf b = {be->alloc(be, n * loom_dtype_size(dt)), loom_xmalloc(n * loom_dtype_size(dt)), n, dt};
    LOOM_CHECK(b.d);
    return b;
}

static void d_free(dbuf *b) {
    be->free(be, b->d);
    free(b->h);
}

static void poison(dbuf *b) { memset(b->h, 0x7f, bytes_of(b)); }

// elements [at, at + count) of the host image = value(k, r, 0..count)
static void fill(dbuf *b, size_t at, size_t count, int k, int r) {
    for (size_t i = 0; i < count; i++) put(b->h, b->dt, at + i, value(k, r, i));
}

static void upload(dbuf *b) { be->upload(be, b->d, b->h, bytes_of(b)); }

// How many elements of b on the device differ from want.
static int wrong(dbuf *b, const double *want) {
    be->download(be, b->h, b->d, bytes_of(b));
    int bad = 0;
    for (size_t i = 0; i < b->n; i++) bad += get(b->h, b->dt, i) != want[i];
    return bad;
}

// want[p * n + i] = value(k, r0 + p * dr, i) for p < pieces
static double *values(double *want, int pieces, size_t n, int k, int r0, int dr) {
    for (int p = 0; p < pieces; p++)
        for (size_t i = 0; i < n; i++) want[(size_t)p * n + i] = value(k, r0 + p * dr, i);
    return want;
}

static void test_reductions(loom_comm *d, loom_dtype dt, loom_red_op op, size_t n, int k) {
    const char *what = op == LOOM_SUM ? "sum" : op == LOOM_AVG ? "avg" : "max", *dn = loom_dtype_name(dt);
    dbuf buf = d_alloc(n, dt), send = d_alloc(n * W, dt), piece = d_alloc(n, dt);
    double *want = loom_xmalloc(n * sizeof(double));
    fill(&buf, 0, n, k, R);
    upload(&buf);
    T_ASSERT(loom_allreduce(d, buf.d, n, dt, op, NULL) == LOOM_OK, "allreduce: %s", loom_error_message());
    for (size_t i = 0; i < n; i++) want[i] = reduced(k, W, i, dt, op);
    int bad = wrong(&buf, want);
    T_ASSERT(bad == 0, "staged allreduce %s %s n=%zu: %d wrong", dn, what, n, bad);
    fill(&send, 0, n * W, k + 1, R);
    upload(&send);
    poison(&piece);
    upload(&piece);
    T_ASSERT(loom_reduce_scatter(d, send.d, piece.d, n, dt, op, NULL) == LOOM_OK, "reduce_scatter: %s",
             loom_error_message());
    for (size_t i = 0; i < n; i++) want[i] = reduced(k + 1, W, (size_t)R * n + i, dt, op);
    bad = wrong(&piece, want);
    T_ASSERT(bad == 0, "staged reduce_scatter %s %s n=%zu: %d wrong", dn, what, n, bad);
    free(want);
    d_free(&buf);
    d_free(&send);
    d_free(&piece);
}

static void test_movement(loom_comm *d, loom_dtype dt, size_t n, int k) {
    const char *dn = loom_dtype_name(dt);
    dbuf mine = d_alloc(n, dt), all = d_alloc(n * W, dt), send = d_alloc(n * W, dt);
    double *want = loom_xmalloc(n * W * sizeof(double));
    // all-gather, out of place then in place (only this rank's piece is in place beforehand)
    fill(&mine, 0, n, k, R);
    upload(&mine);
    for (int inplace = 0; inplace < 2; inplace++) {
        poison(&all);
        if (inplace) fill(&all, (size_t)R * n, n, k, R);
        upload(&all);
        T_ASSERT(loom_allgather(d, inplace ? NULL : mine.d, all.d, n, dt, NULL) == LOOM_OK, "allgather: %s",
                 loom_error_message());
        int bad = wrong(&all, values(want, W, n, k, 0, 1));
        T_ASSERT(bad == 0, "staged allgather %s n=%zu in place %d: %d wrong", dn, n, inplace, bad);
    }
    // broadcast from the last rank
    poison(&mine);
    if (R == W - 1) fill(&mine, 0, n, k, R);
    upload(&mine);
    T_ASSERT(loom_broadcast(d, mine.d, n, dt, W - 1, NULL) == LOOM_OK, "broadcast: %s", loom_error_message());
    int bad = wrong(&mine, values(want, 1, n, k, W - 1, 0));
    T_ASSERT(bad == 0, "staged broadcast %s n=%zu: %d wrong", dn, n, bad);
    // all-to-all: piece p of rank r holds value(k + p, r, i)
    for (int p = 0; p < W; p++) fill(&send, (size_t)p * n, n, k + p, R);
    upload(&send);
    poison(&all);
    upload(&all);
    T_ASSERT(loom_alltoall(d, send.d, all.d, n, dt, NULL) == LOOM_OK, "alltoall: %s", loom_error_message());
    bad = wrong(&all, values(want, W, n, k + R, 0, 1));
    T_ASSERT(bad == 0, "staged alltoall %s n=%zu: %d wrong", dn, n, bad);
    // send/recv around a ring, the receive posted first
    if (W > 1) {
        loom_comm_req *rs, *rr;
        int from = (R + W - 1) % W;
        fill(&mine, 0, n, k, R);
        upload(&mine);
        dbuf got = d_alloc(n, dt);
        poison(&got);
        upload(&got);
        T_ASSERT(loom_recv(d, got.d, n, dt, from, 5, &rr) == LOOM_OK, "irecv: %s", loom_error_message());
        T_ASSERT(loom_send(d, mine.d, n, dt, (R + 1) % W, 5, &rs) == LOOM_OK, "isend: %s", loom_error_message());
        T_ASSERT(loom_comm_wait(rr) == LOOM_OK && loom_comm_wait(rs) == LOOM_OK, "ring wait");
        bad = wrong(&got, values(want, 1, n, k, from, 0));
        T_ASSERT(bad == 0, "staged ring send/recv %s n=%zu: %d wrong", dn, n, bad);
        d_free(&got);
    }
    free(want);
    d_free(&mine);
    d_free(&all);
    d_free(&send);
}

// K all-reduces, an in-place all-gather and a reduce-scatter in flight together. Each input
// is copied into place on the stream behind a long memset just before its call; the
// reduce-scatter's input is zeroed on the stream right after its call (it was staged by then);
// an all-reduce's buffer is as it was until its wait; requests completed in reverse order;
// results copied on the stream after the waits.
static void test_async(loom_comm *d) {
    enum { K = 4, N = 3001 };
    const loom_dtype dt = LOOM_F32;
    size_t pad_bytes = (size_t)64 << 20;
    void *pad = be->alloc(be, pad_bytes);
    LOOM_CHECK(pad);
    dbuf src = d_alloc(N, dt), bufs[K], all = d_alloc(N * W, dt), send = d_alloc(N * W, dt), piece = d_alloc(N, dt),
         out = d_alloc(N, dt);
    loom_comm_req *req[K + 2];
    for (int k = 0; k < K; k++) {
        bufs[k] = d_alloc(N, dt);
        fill(&src, 0, N, 50 + k, R);
        upload(&src);
        be->zero(be, pad, pad_bytes);
        be->copy(be, bufs[k].d, src.d, N * sizeof(float));
        T_ASSERT(loom_allreduce(d, bufs[k].d, N, dt, LOOM_SUM, &req[k]) == LOOM_OK, "iallreduce: %s",
                 loom_error_message());
    }
    poison(&all);
    fill(&all, (size_t)R * N, N, 60, R);
    upload(&all);
    T_ASSERT(loom_allgather(d, NULL, all.d, N, dt, &req[K]) == LOOM_OK, "iallgather: %s", loom_error_message());
    fill(&send, 0, (size_t)N * W, 61, R);
    upload(&send);
    poison(&piece);
    upload(&piece);
    T_ASSERT(loom_reduce_scatter(d, send.d, piece.d, N, dt, LOOM_AVG, &req[K + 1]) == LOOM_OK,
             "ireduce_scatter: %s", loom_error_message());
    be->zero(be, send.d, bytes_of(&send));
    double *want = loom_xmalloc((size_t)N * W * sizeof(double));
    int bad = wrong(&bufs[0], values(want, 1, N, 50, R, 0));
    T_ASSERT(bad == 0, "an all-reduce's buffer changed before its wait: %d elements", bad);
    bool done;
    T_ASSERT(loom_comm_test(req[0], &done) == LOOM_OK, "test: %s", loom_error_message());
    for (int k = K + 1; k >= 0; k--)
        T_ASSERT(loom_comm_wait(req[k]) == LOOM_OK, "wait %d: %s", k, loom_error_message());
    for (int k = 0; k < K; k++) {
        be->copy(be, out.d, bufs[k].d, N * sizeof(float));
        for (size_t i = 0; i < N; i++) want[i] = reduced(50 + k, W, i, dt, LOOM_SUM);
        bad += wrong(&out, want);
    }
    T_ASSERT(bad == 0, "async staged allreduce: %d wrong", bad);
    bad = wrong(&all, values(want, W, N, 60, 0, 1));
    T_ASSERT(bad == 0, "async staged allgather: %d wrong", bad);
    for (size_t i = 0; i < N; i++) want[i] = reduced(61, W, (size_t)R * N + i, dt, LOOM_AVG);
    bad = wrong(&piece, want);
    T_ASSERT(bad == 0, "async staged reduce_scatter (avg): %d wrong", bad);
    free(want);
    for (int k = 0; k < K; k++) d_free(&bufs[k]);
    d_free(&src);
    d_free(&all);
    d_free(&send);
    d_free(&piece);
    d_free(&out);
    be->free(be, pad);
}

// A staged group made from a split that is freed at once; its own splits by parity.
static void test_groups(loom_comm *c) {
    loom_comm *tmp, *d, *half;
    T_ASSERT(loom_comm_split(c, 0, R, &tmp) == LOOM_OK, "split");
    T_ASSERT(loom_comm_staged(tmp, be->stream, &d) == LOOM_OK, "staged: %s", loom_error_message());
    loom_comm_free(tmp);
    T_ASSERT(strcmp(loom_comm_backend(d), "staged") == 0 && loom_comm_rank(d) == R && loom_comm_size(d) == W,
             "staged group: %s, rank %d of %d", loom_comm_backend(d), loom_comm_rank(d), loom_comm_size(d));
    T_ASSERT(loom_comm_split(d, R % 2, R, &half) == LOOM_OK, "staged split: %s", loom_error_message());
    int hw = loom_comm_size(half);
    T_ASSERT(hw == (W + 1 - R % 2) / 2 && loom_comm_rank(half) == R / 2, "split sizes: %d of %d",
             loom_comm_rank(half), hw);
    dbuf v = d_alloc(1, LOOM_I32);
    put(v.h, LOOM_I32, 0, R);
    upload(&v);
    T_ASSERT(loom_allreduce(half, v.d, 1, LOOM_I32, LOOM_SUM, NULL) == LOOM_OK, "split allreduce: %s",
             loom_error_message());
    double want = 0;
    for (int r = R % 2; r < W; r += 2) want += r;
    T_ASSERT(wrong(&v, &want) == 0, "staged split allreduce %g, want %g", get(v.h, LOOM_I32, 0), want);
    d_free(&v);
    loom_comm_free(half);
    T_ASSERT(loom_barrier(d) == LOOM_OK, "staged barrier: %s", loom_error_message());
    loom_comm_free(d);
}

// Ranks sharing a GPU (more ranks on a host than it has GPUs): loom_comm_nccl refuses on every
// rank, naming the lowest pair; on one host that is rank 0 and rank `gpus`.
static void test_nccl_refusal(loom_comm *c, int gpus) {
    int32_t crowded = loom_comm_local_size(c) > gpus, single_host = loom_comm_local_size(c) == W;
    T_ASSERT(loom_allreduce(c, &crowded, 1, LOOM_I32, LOOM_SUM, NULL) == LOOM_OK, "allreduce");
    if (!crowded) {
        if (R == 0) printf("nccl refusal not checked: each rank has a GPU of its own\n");
        return;
    }
    loom_comm *n = c; // must come back NULL
    loom_status s = loom_comm_nccl(c, be->stream, &n);
    const char *msg = loom_error_message(), *hint = loom_error_hint();
    T_ASSERT(s == LOOM_EINVAL && n == NULL, "loom_comm_nccl on a shared GPU: status %d (%s)", s, msg);
    char pair[64];
    snprintf(pair, sizeof pair, "ranks 0 and %d share GPU ", gpus);
    T_ASSERT(strstr(msg, "share GPU ") && strstr(msg, "NCCL needs one GPU per rank") &&
                 (!single_host || strstr(msg, pair)) && strstr(hint, "--device-comm mpi"),
             "message '%s' (hint '%s'), want '%s...'", msg, hint, pair);
    if (s == LOOM_OK) loom_comm_free(n);
}

int main(int argc, char **argv) {
    loom_comm *c;
    if (loom_comm_world(&argc, &argv, &c) != LOOM_OK) {
        fprintf(stderr, "%s\n", loom_error_message());
        return 1;
    }
    R = loom_comm_rank(c), W = loom_comm_size(c);
    int gpus = loom_backend_device_count("cuda");
    char name[32] = "cuda";
    if (gpus > 0) snprintf(name, sizeof name, "cuda:%d", loom_comm_local_rank(c) % gpus);
    loom_status s = loom_backend_create(&be, name, LOOM_F32);
    int32_t missing[2] = {s == LOOM_EUNSUPPORTED, s != LOOM_OK && s != LOOM_EUNSUPPORTED}; // no GPU, other failure
    if (s != LOOM_OK && (s != LOOM_EUNSUPPORTED || R == 0)) fprintf(stderr, "rank %d: %s\n", R, loom_error_message());
    s = loom_allreduce(c, missing, 2, LOOM_I32, LOOM_SUM, NULL);
    if (s != LOOM_OK || missing[0] || missing[1]) {
        int rc = s != LOOM_OK || missing[1] ? 1 : 77;
        if (R == 0 && rc == 77) printf("skipped: %d of %d ranks have no CUDA device\n", (int)missing[0], W);
        loom_backend_destroy(be);
        loom_comm_finalize(c);
        return rc;
    }
    agree_seed(c);
    loom_comm *d;
    s = loom_comm_staged(c, be->stream, &d);
    T_ASSERT(s == LOOM_OK, "staged: %s", loom_error_message());
    const loom_dtype dts[] = {LOOM_F32, LOOM_F64, LOOM_I32, LOOM_BF16};
    const size_t counts[] = {1, 7, 1000, 4099, (size_t)W * 1024};
    int k = 0;
    for (size_t t = 0; s == LOOM_OK && t < 4; t++)
        for (size_t n = 0; n < 5; n++) {
            for (int op = LOOM_SUM; op <= LOOM_MAX; op++) test_reductions(d, dts[t], (loom_red_op)op, counts[n], k += 2);
            test_movement(d, dts[t], counts[n], k += W + 1);
        }
    if (s == LOOM_OK) test_async(d);
    loom_comm_free(d);
    test_groups(c);
    test_nccl_refusal(c, gpus);
    T_ASSERT(loom_barrier(c) == LOOM_OK, "barrier");
    printf("rank %d of %d (staged on %s): ", R, W, name);
    int rc = t_done("comm_device");
    loom_backend_destroy(be);
    loom_comm_finalize(c);
    return rc;
}
