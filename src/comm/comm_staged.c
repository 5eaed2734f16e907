// The staged backend (CUDA builds): collectives on device buffers carried out by the host
// group's backend (MPI) through host copies, for ranks that share a GPU, where NCCL refuses to
// run. A test path, not a fast one. Each operation waits for the work queued on the group's
// stream, copies its device inputs into a host block of its own, and starts the host
// collective on that block; waiting on the request finishes the host collective, copies the
// results back into the device buffers on the stream, synchronizes, and frees the block. So
// several operations can be in flight at once, each with its own block.
#include "comm/comm_cuda.h"

#include <string.h>

typedef struct {
    loom_comm *host;     // a group of its own over the caller's ranks (MPI, or self)
    cudaStream_t stream; // the stream the device buffers are ordered on
} staged_group;

// One operation in flight: the host collective, its host block, and where its results go.
typedef struct {
    loom_comm_req *inner;
    char *block;
    void *out;        // device buffer the results go to at completion (NULL: none)
    size_t out_at, out_bytes; // the results: out_bytes at block + out_at
} staged_req;

static staged_group *group_of(const loom_comm *c) { return c->impl; }

// Frees an operation's record and host block; returns s.
static loom_status drop(staged_req *q, loom_status s) {
    free(q->block);
    free(q);
    return s;
}

// Allocates the operation's host block of `bytes`, and once the stream's work so far is done,
// copies in_bytes of in (device) to block + in_at. The results will go from block + out_at to
// out (device), out_bytes of them.
static loom_status stage(loom_comm *c, size_t bytes, const void *in, size_t in_at, size_t in_bytes, void *out,
                         size_t out_at, size_t out_bytes, staged_req **q) {
    staged_group *g = group_of(c);
    staged_req *p = loom_xmalloc(sizeof *p);
    *p = (staged_req){.block = loom_xmalloc(bytes), .out = out, .out_at = out_at, .out_bytes = out_bytes};
    loom_status s = LOOM_OK;
    if (in_bytes)
        s = comm_check_cuda(cudaMemcpyAsync(p->block + in_at, in, in_bytes, cudaMemcpyDeviceToHost, g->stream),
                            "cudaMemcpyAsync (device to host)");
    if (s == LOOM_OK) s = comm_check_cuda(cudaStreamSynchronize(g->stream), "cudaStreamSynchronize");
    if (s != LOOM_OK) return drop(p, s);
    *q = p;
    return LOOM_OK;
}

// Hands q to the request once the host collective has started (status `started`); frees it if
// that failed.
static loom_status launched(loom_comm_req *r, staged_req *q, loom_status started) {
    if (started != LOOM_OK) return drop(q, started);
    r->impl = q;
    return LOOM_OK;
}

static loom_status s_allreduce(loom_comm *c, void *buf, size_t n, loom_dtype dt, loom_red_op op, loom_comm_req *r) {
    size_t bytes = n * loom_dtype_size(dt);
    staged_req *q;
    LOOM_TRY(stage(c, bytes, buf, 0, bytes, buf, 0, bytes, &q));
    return launched(r, q, loom_allreduce(group_of(c)->host, q->block, n, dt, op, &q->inner));
}

// block: the send buffer (size * n), then the received piece (n)
static loom_status s_reduce_scatter(loom_comm *c, const void *send, void *recv, size_t n, loom_dtype dt,
                                    loom_red_op op, loom_comm_req *r) {
    size_t piece = n * loom_dtype_size(dt), all = piece * (size_t)c->size;
    staged_req *q;
    LOOM_TRY(stage(c, all + piece, send, 0, all, recv, all, piece, &q));
    return launched(r, q, loom_reduce_scatter(group_of(c)->host, q->block, q->block + all, n, dt, op, &q->inner));
}

// block: the gathered buffer (size * n), this rank's piece staged in its place; then in place
static loom_status s_allgather(loom_comm *c, const void *send, void *recv, size_t n, loom_dtype dt,
                               loom_comm_req *r) {
    size_t piece = n * loom_dtype_size(dt), all = piece * (size_t)c->size, mine = piece * (size_t)c->rank;
    if (!send) send = (const char *)recv + mine;
    staged_req *q;
    LOOM_TRY(stage(c, all, send, mine, piece, recv, 0, all, &q));
    return launched(r, q, loom_allgather(group_of(c)->host, NULL, q->block, n, dt, &q->inner));
}

static loom_status s_broadcast(loom_comm *c, void *buf, size_t n, loom_dtype dt, int root, loom_comm_req *r) {
    size_t bytes = n * loom_dtype_size(dt);
    staged_req *q;
    LOOM_TRY(stage(c, bytes, buf, 0, c->rank == root ? bytes : 0, buf, 0, bytes, &q));
    return launched(r, q, loom_broadcast(group_of(c)->host, q->block, n, dt, root, &q->inner));
}

// block: the send buffer (size * n), then the receive buffer (size * n)
static loom_status s_alltoall(loom_comm *c, const void *send, void *recv, size_t n, loom_dtype dt,
                              loom_comm_req *r) {
    size_t all = n * loom_dtype_size(dt) * (size_t)c->size;
    staged_req *q;
    LOOM_TRY(stage(c, 2 * all, send, 0, all, recv, all, all, &q));
    return launched(r, q, loom_alltoall(group_of(c)->host, q->block, q->block + all, n, dt, &q->inner));
}

static loom_status s_sendrecv(loom_comm *c, void *buf, size_t n, loom_dtype dt, int peer, int tag, bool is_send,
                              loom_comm_req *r) {
    size_t bytes = n * loom_dtype_size(dt);
    loom_comm *h = group_of(c)->host;
    staged_req *q;
    LOOM_TRY(stage(c, bytes, buf, 0, is_send ? bytes : 0, is_send ? NULL : buf, 0, is_send ? 0 : bytes, &q));
    return launched(r, q, is_send ? loom_send(h, q->block, n, dt, peer, tag, &q->inner)
                                  : loom_recv(h, q->block, n, dt, peer, tag, &q->inner));
}

static loom_status s_barrier(loom_comm *c) {
    staged_group *g = group_of(c);
    LOOM_TRY(comm_check_cuda(cudaStreamSynchronize(g->stream), "cudaStreamSynchronize"));
    return loom_barrier(g->host);
}

static loom_status s_test(loom_comm_req *r, bool *done) {
    staged_req *q = r->impl;
    return loom_comm_test(q->inner, done);
}

static loom_status s_wait(loom_comm_req *r) {
    staged_req *q = r->impl;
    cudaStream_t stream = group_of(r->comm)->stream;
    loom_status s = loom_comm_wait(q->inner); // applies LOOM_AVG's division to the host block
    if (s == LOOM_OK && q->out_bytes)
        s = comm_check_cuda(cudaMemcpyAsync(q->out, q->block + q->out_at, q->out_bytes, cudaMemcpyHostToDevice,
                                            stream), "cudaMemcpyAsync (host to device)");
    if (s == LOOM_OK) s = comm_check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    return drop(q, s);
}

static loom_comm *wrap(loom_comm *host, cudaStream_t stream);

static loom_status s_split(loom_comm *c, int color, int key, loom_comm **out) {
    loom_comm *host;
    LOOM_TRY(loom_comm_split(group_of(c)->host, color, key, &host));
    *out = wrap(host, group_of(c)->stream);
    return LOOM_OK;
}

static void s_free(loom_comm *c) {
    staged_group *g = group_of(c);
    loom_comm_free(g->host);
    free(g);
    free(c);
}

static const comm_ops STAGED_OPS = {
    "staged", s_allreduce, s_reduce_scatter, s_allgather, s_broadcast, s_alltoall,
    s_sendrecv, s_barrier, s_test, s_wait, s_split, s_free,
};

static loom_comm *wrap(loom_comm *host, cudaStream_t stream) {
    staged_group *g = loom_xcalloc(1, sizeof *g);
    *g = (staged_group){.host = host, .stream = stream};
    return comm_new_over(&STAGED_OPS, host, g);
}

loom_status loom_comm_staged(loom_comm *host_group, void *stream, loom_comm **out) {
    *out = NULL;
    const char *kind = loom_comm_backend(host_group);
    if (strcmp(kind, "mpi") != 0 && strcmp(kind, "self") != 0)
        return loom_fail(LOOM_EINVAL, "pass the world group or a split of it",
                         "collectives staged through host memory need a host group, not a '%s' group", kind);
    loom_comm *host; // a group of its own, so the staged group can outlive the caller's
    LOOM_TRY(loom_comm_split(host_group, 0, host_group->rank, &host));
    *out = wrap(host, (cudaStream_t)stream);
    return LOOM_OK;
}
