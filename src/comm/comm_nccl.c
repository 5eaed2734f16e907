// The NCCL backend (CUDA builds): collectives on device buffers. Each group has its own NCCL
// communicator, made from a unique id that rank 0 broadcasts over the host group (MPI), and
// its own CUDA stream. A collective first makes that stream wait for the compute stream's
// work so far (an event), runs there, and records a completion event; waiting on the request
// makes the compute stream wait for that event (no host block), so communication overlaps
// with whatever the compute stream does meanwhile. NCCL needs one GPU per rank: ranks that
// share one are refused before NCCL is called (comm_staged.c serves them).
#include "comm/comm_cuda.h"

#include <nccl.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    ncclComm_t nccl;
    cudaStream_t stream, compute;
    loom_comm *host; // the bootstrap group (barrier and splits)
} nccl_group;

static nccl_group *group_of(const loom_comm *c) { return c->impl; }

static loom_status check_nccl(ncclResult_t rc, const char *what) {
    if (rc == ncclSuccess) return LOOM_OK;
    return loom_fail(LOOM_EIO, "set NCCL_DEBUG=WARN for NCCL's own account", "%s failed: %s", what,
                     ncclGetErrorString(rc));
}

static ncclDataType_t nccl_type(loom_dtype dt) {
    switch (dt) {
    case LOOM_F32: return ncclFloat32;
    case LOOM_F64: return ncclFloat64;
    case LOOM_I32: return ncclInt32;
    case LOOM_BF16: return ncclBfloat16;
    }
    return ncclFloat32;
}

static ncclRedOp_t nccl_op(loom_red_op op) { return op == LOOM_AVG ? ncclAvg : op == LOOM_MAX ? ncclMax : ncclSum; }

// The comm stream waits for the compute stream's work so far.
static loom_status begin(nccl_group *g) {
    cudaEvent_t ev;
    LOOM_TRY(comm_check_cuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate"));
    loom_status s = comm_check_cuda(cudaEventRecord(ev, g->compute), "cudaEventRecord");
    if (s == LOOM_OK) s = comm_check_cuda(cudaStreamWaitEvent(g->stream, ev, 0), "cudaStreamWaitEvent");
    cudaEventDestroy(ev);
    return s;
}

// Records the operation's completion in the request.
static loom_status finish(nccl_group *g, loom_comm_req *r, loom_status launched) {
    LOOM_TRY(launched);
    cudaEvent_t *ev = loom_xmalloc(sizeof *ev);
    r->impl = ev;
    LOOM_TRY(comm_check_cuda(cudaEventCreateWithFlags(ev, cudaEventDisableTiming), "cudaEventCreate"));
    return comm_check_cuda(cudaEventRecord(*ev, g->stream), "cudaEventRecord");
}

static loom_status n_allreduce(loom_comm *c, void *buf, size_t n, loom_dtype dt, loom_red_op op, loom_comm_req *r) {
    nccl_group *g = group_of(c);
    LOOM_TRY(begin(g));
    return finish(g, r, check_nccl(ncclAllReduce(buf, buf, n, nccl_type(dt), nccl_op(op), g->nccl, g->stream),
                                   "ncclAllReduce"));
}

static loom_status n_reduce_scatter(loom_comm *c, const void *send, void *recv, size_t n, loom_dtype dt,
                                    loom_red_op op, loom_comm_req *r) {
    nccl_group *g = group_of(c);
    LOOM_TRY(begin(g));
    return finish(g, r, check_nccl(ncclReduceScatter(send, recv, n, nccl_type(dt), nccl_op(op), g->nccl, g->stream),
                                   "ncclReduceScatter"));
}

static loom_status n_allgather(loom_comm *c, const void *send, void *recv, size_t n, loom_dtype dt, loom_comm_req *r) {
    nccl_group *g = group_of(c);
    if (!send) send = (const char *)recv + (size_t)c->rank * n * loom_dtype_size(dt); // NCCL's in-place form
    LOOM_TRY(begin(g));
    return finish(g, r, check_nccl(ncclAllGather(send, recv, n, nccl_type(dt), g->nccl, g->stream), "ncclAllGather"));
}

static loom_status n_broadcast(loom_comm *c, void *buf, size_t n, loom_dtype dt, int root, loom_comm_req *r) {
    nccl_group *g = group_of(c);
    LOOM_TRY(begin(g));
    return finish(g, r, check_nccl(ncclBroadcast(buf, buf, n, nccl_type(dt), root, g->nccl, g->stream), "ncclBroadcast"));
}

static loom_status n_alltoall(loom_comm *c, const void *send, void *recv, size_t n, loom_dtype dt, loom_comm_req *r) {
    nccl_group *g = group_of(c);
    size_t bytes = n * loom_dtype_size(dt);
    LOOM_TRY(begin(g));
    ncclResult_t rc = ncclGroupStart();
    for (int p = 0; p < c->size && rc == ncclSuccess; p++) {
        rc = ncclSend((const char *)send + (size_t)p * bytes, n, nccl_type(dt), p, g->nccl, g->stream);
        if (rc == ncclSuccess) rc = ncclRecv((char *)recv + (size_t)p * bytes, n, nccl_type(dt), p, g->nccl, g->stream);
    }
    ncclResult_t end = ncclGroupEnd();
    return finish(g, r, check_nccl(rc != ncclSuccess ? rc : end, "all-to-all (ncclSend/ncclRecv)"));
}

static loom_status n_sendrecv(loom_comm *c, void *buf, size_t n, loom_dtype dt, int peer, int tag, bool is_send,
                              loom_comm_req *r) {
    nccl_group *g = group_of(c);
    LOOM_TRY(begin(g));
    ncclResult_t rc = is_send ? ncclSend(buf, n, nccl_type(dt), peer, g->nccl, g->stream)
                              : ncclRecv(buf, n, nccl_type(dt), peer, g->nccl, g->stream);
    return finish(g, r, check_nccl(rc, is_send ? "ncclSend" : "ncclRecv"));
}

static loom_status n_barrier(loom_comm *c) {
    nccl_group *g = group_of(c);
    LOOM_TRY(comm_check_cuda(cudaStreamSynchronize(g->stream), "cudaStreamSynchronize"));
    return loom_barrier(g->host);
}

static loom_status n_test(loom_comm_req *r, bool *done) {
    cudaError_t rc = cudaEventQuery(*(cudaEvent_t *)r->impl);
    *done = rc == cudaSuccess;
    return rc == cudaErrorNotReady ? LOOM_OK : comm_check_cuda(rc, "cudaEventQuery");
}

static loom_status n_wait(loom_comm_req *r) {
    cudaEvent_t *ev = r->impl;
    loom_status s = comm_check_cuda(cudaStreamWaitEvent(group_of(r->comm)->compute, *ev, 0), "cudaStreamWaitEvent");
    cudaEventDestroy(*ev);
    free(ev);
    return s;
}

static loom_status wrap(loom_comm *host, ncclComm_t nccl, cudaStream_t compute, loom_comm **out);

static loom_status n_split(loom_comm *c, int color, int key, loom_comm **out) {
    nccl_group *g = group_of(c);
    loom_comm *host;
    ncclComm_t sub;
    LOOM_TRY(loom_comm_split(g->host, color, key, &host));
    loom_status s = check_nccl(ncclCommSplit(g->nccl, color, key, &sub, NULL), "ncclCommSplit");
    if (s != LOOM_OK) {
        loom_comm_free(host);
        return s;
    }
    return wrap(host, sub, g->compute, out);
}

static void n_free(loom_comm *c) {
    nccl_group *g = group_of(c);
    cudaStreamSynchronize(g->stream);
    ncclCommDestroy(g->nccl);
    cudaStreamDestroy(g->stream);
    loom_comm_free(g->host);
    free(g);
    free(c);
}

static const comm_ops NCCL_OPS = {
    "nccl", n_allreduce, n_reduce_scatter, n_allgather, n_broadcast, n_alltoall,
    n_sendrecv, n_barrier, n_test, n_wait, n_split, n_free,
};

static loom_status wrap(loom_comm *host, ncclComm_t nccl, cudaStream_t compute, loom_comm **out) {
    nccl_group *g = loom_xcalloc(1, sizeof *g);
    *g = (nccl_group){.nccl = nccl, .compute = compute, .host = host};
    loom_status s = comm_check_cuda(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking), "cudaStreamCreate");
    if (s != LOOM_OK) {
        ncclCommDestroy(nccl);
        loom_comm_free(host);
        free(g);
        return s;
    }
    *out = comm_new_over(&NCCL_OPS, host, g);
    return LOOM_OK;
}

// One rank's GPU as the ranks compare them: its host (a hash of the whole name, and the name
// cut to fit, for messages) and its PCI bus id. 64 bytes, gathered as 16 int32.
typedef struct {
    uint64_t host_hash;
    char bus[16];  // "0000:1B:00.0"; empty when the rank could not tell
    char host[40];
} gpu_place;

static uint64_t fnv1a(const char *s) {
    uint64_t h = 14695981039346656037ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

// Every rank learns where every rank's current GPU is; all return the same verdict: LOOM_EINVAL
// naming the lowest pair of ranks on one GPU, or the failure of the lowest rank that could not
// tell which GPU it has (its own error there, LOOM_EIO elsewhere).
static loom_status check_one_rank_per_gpu(loom_comm *h) {
    gpu_place me = {0};
    char name[256] = "";
    gethostname(name, sizeof name - 1);
    me.host_hash = fnv1a(name);
    memcpy(me.host, name, strnlen(name, sizeof me.host - 1));
    int dev = 0;
    loom_status mine = comm_check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
    if (mine == LOOM_OK)
        mine = comm_check_cuda(cudaDeviceGetPCIBusId(me.bus, sizeof me.bus, dev), "cudaDeviceGetPCIBusId");
    if (mine != LOOM_OK) me.bus[0] = '\0';
    gpu_place *all = loom_xmalloc((size_t)h->size * sizeof *all);
    loom_status s = loom_allgather(h, &me, all, sizeof me / sizeof(int32_t), LOOM_I32, NULL);
    for (int i = 0; s == LOOM_OK && i < h->size; i++) {
        all[i].bus[sizeof all[i].bus - 1] = all[i].host[sizeof all[i].host - 1] = '\0';
        if (!all[i].bus[0] && i == h->rank) s = mine;
        else if (!all[i].bus[0])
            s = loom_fail(LOOM_EIO, "see that rank's output", "rank %d cannot tell which GPU it uses", i);
        for (int j = i + 1; s == LOOM_OK && j < h->size; j++)
            if (all[i].host_hash == all[j].host_hash && strcmp(all[i].bus, all[j].bus) == 0)
                s = loom_fail(LOOM_EINVAL,
                              "launch at most one rank per GPU, or add --device-comm mpi to stage collectives "
                              "through host memory",
                              "ranks %d and %d share GPU %s on host %s, and NCCL needs one GPU per rank", i, j,
                              all[i].bus, all[i].host);
    }
    free(all);
    return s;
}

loom_status loom_comm_nccl(loom_comm *host_group, void *compute_stream, loom_comm **out) {
    *out = NULL;
    LOOM_TRY(check_one_rank_per_gpu(host_group));
    ncclUniqueId id;
    if (host_group->rank == 0) LOOM_TRY(check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId"));
    LOOM_TRY(loom_broadcast(host_group, &id, sizeof id / sizeof(int32_t), LOOM_I32, 0, NULL));
    ncclComm_t nccl;
    LOOM_TRY(check_nccl(ncclCommInitRank(&nccl, host_group->size, id, host_group->rank), "ncclCommInitRank"));
    loom_comm *host; // a group of its own, so the NCCL group can outlive the caller's
    loom_status s = loom_comm_split(host_group, 0, host_group->rank, &host);
    if (s != LOOM_OK) {
        ncclCommDestroy(nccl);
        return s;
    }
    return wrap(host, nccl, (cudaStream_t)compute_stream, out);
}
