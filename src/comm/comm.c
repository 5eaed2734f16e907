// Public entry points of src/comm: argument checks, blocking vs asynchronous calls, the choice
// of the world's backend, agreement on failures, and even sharding.
#include "comm/comm_internal.h"

#include "core/bf16.h"
#include "core/heartbeat.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// A launcher's variables in the environment (mpirun, srun).
static bool has_launcher(void) {
    const char *slurm = getenv("SLURM_NTASKS");
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK") ||
           (slurm && atoi(slurm) > 1);
}

static bool launched_by_mpi(void) {
    const char *forced = getenv("LOOM_COMM");
    if (forced) return strcmp(forced, "mpi") == 0;
    return has_launcher();
}

static pid_t launcher_pid = 0; // the parent that launched this rank (0: none)

loom_status loom_comm_world(int *argc, char ***argv, loom_comm **world) {
    *world = NULL;
    if (!launched_by_mpi()) {
        *world = comm_self_world();
    } else {
        if (has_launcher()) launcher_pid = getppid();
        LOOM_TRY(comm_mpi_world(argc, argv, world));
    }
    loom_heartbeat_open((*world)->rank); // loom launch's watchdog, when it set LOOM_HEARTBEAT_DIR
    return LOOM_OK;
}

loom_status loom_comm_launcher_check(void) {
    if (launcher_pid == 0 || getppid() == launcher_pid) return LOOM_OK;
    return loom_fail(LOOM_EIO, "the job was stopped; resume it from the last checkpoint",
                     "the launcher of this rank (pid %d: mpirun or srun) has exited", (int)launcher_pid);
}

#ifndef LOOM_HAVE_CUDA
loom_status loom_comm_nccl(loom_comm *host_group, void *compute_stream, loom_comm **out) {
    *out = NULL;
    return loom_fail(LOOM_EUNSUPPORTED, "build loom where nvcc and NCCL are installed",
                     "device-memory collectives (NCCL) are not in this build");
}

loom_status loom_comm_staged(loom_comm *host_group, void *stream, loom_comm **out) {
    *out = NULL;
    return loom_fail(LOOM_EUNSUPPORTED, "build loom where nvcc is installed",
                     "device-memory collectives staged through host memory are not in this build");
}
#endif

void loom_comm_finalize(loom_comm *world) {
    if (!world) return;
    bool mpi = strcmp(world->ops->name, "mpi") == 0;
    loom_comm_free(world);
    if (mpi) comm_mpi_finalize();
}

int loom_comm_rank(const loom_comm *c) { return c->rank; }
int loom_comm_size(const loom_comm *c) { return c->size; }
int loom_comm_local_rank(const loom_comm *c) { return c->local_rank; }
int loom_comm_local_size(const loom_comm *c) { return c->local_size; }
const char *loom_comm_backend(const loom_comm *c) { return c->ops->name; }

loom_status loom_comm_split(loom_comm *c, int color, int key, loom_comm **out) {
    return c->ops->split(c, color, key, out);
}

void loom_comm_free(loom_comm *c) {
    if (c) c->ops->free(c);
}

// Runs one operation (its name counted by the heartbeat): a request record for it, then either
// handed to the caller or waited on.
#define RUN(c, reqp, name, call)                                             \
    do {                                                                     \
        loom_heartbeat_collective(name);                                     \
        loom_comm_req *r_ = loom_xcalloc(1, sizeof *r_);                     \
        r_->comm = (c);                                                      \
        loom_status s_ = (call);                                             \
        if (s_ != LOOM_OK) {                                                 \
            free(r_);                                                        \
            if (reqp) *(loom_comm_req **)(reqp) = NULL;                      \
            return s_;                                                       \
        }                                                                    \
        if (reqp) {                                                          \
            *(loom_comm_req **)(reqp) = r_;                                  \
            return LOOM_OK;                                                  \
        }                                                                    \
        return loom_comm_wait(r_);                                           \
    } while (0)

loom_status loom_allreduce(loom_comm *c, void *buf, size_t count, loom_dtype dt, loom_red_op op,
                           loom_comm_req **req) {
    RUN(c, req, "allreduce", c->ops->allreduce(c, buf, count, dt, op, r_));
}

loom_status loom_reduce_scatter(loom_comm *c, const void *send, void *recv, size_t count,
                                loom_dtype dt, loom_red_op op, loom_comm_req **req) {
    RUN(c, req, "reduce_scatter", c->ops->reduce_scatter(c, send, recv, count, dt, op, r_));
}

loom_status loom_allgather(loom_comm *c, const void *send, void *recv, size_t count, loom_dtype dt,
                           loom_comm_req **req) {
    RUN(c, req, "allgather", c->ops->allgather(c, send, recv, count, dt, r_));
}

loom_status loom_broadcast(loom_comm *c, void *buf, size_t count, loom_dtype dt, int root,
                           loom_comm_req **req) {
    if (root < 0 || root >= c->size)
        return loom_fail(LOOM_EINVAL, NULL, "broadcast root %d is outside the group of %d", root, c->size);
    RUN(c, req, "broadcast", c->ops->broadcast(c, buf, count, dt, root, r_));
}

loom_status loom_alltoall(loom_comm *c, const void *send, void *recv, size_t count, loom_dtype dt,
                          loom_comm_req **req) {
    RUN(c, req, "alltoall", c->ops->alltoall(c, send, recv, count, dt, r_));
}

static loom_status check_peer(const loom_comm *c, int peer) {
    if (peer >= 0 && peer < c->size && peer != c->rank) return LOOM_OK;
    return loom_fail(LOOM_EINVAL, NULL, "peer %d is not another rank of the group of %d", peer, c->size);
}

loom_status loom_send(loom_comm *c, const void *buf, size_t count, loom_dtype dt, int peer, int tag,
                      loom_comm_req **req) {
    LOOM_TRY(check_peer(c, peer));
    RUN(c, req, "send", c->ops->sendrecv(c, (void *)buf, count, dt, peer, tag, true, r_));
}

loom_status loom_recv(loom_comm *c, void *buf, size_t count, loom_dtype dt, int peer, int tag,
                      loom_comm_req **req) {
    LOOM_TRY(check_peer(c, peer));
    RUN(c, req, "recv", c->ops->sendrecv(c, buf, count, dt, peer, tag, false, r_));
}

loom_status loom_barrier(loom_comm *c) {
    loom_heartbeat_collective("barrier");
    return c->ops->barrier(c);
}

loom_status loom_comm_wait(loom_comm_req *req) {
    loom_status s = req->comm->ops->wait(req);
    if (s == LOOM_OK && req->scale_buf)
        comm_scale_host(req->scale_buf, req->scale_count, req->scale_dt, req->comm->size);
    free(req);
    return s;
}

loom_status loom_comm_test(loom_comm_req *req, bool *done) { return req->comm->ops->test(req, done); }

loom_status loom_comm_agree(loom_comm *c, loom_status local, bool *report) {
    int32_t first = local == LOOM_OK ? c->size : c->rank; // lowest failing rank, by a min
    int32_t *all = loom_xmalloc((size_t)c->size * sizeof(int32_t));
    loom_status s = loom_allgather(c, &first, all, 1, LOOM_I32, NULL);
    for (int r = 0; s == LOOM_OK && r < c->size; r++)
        if (all[r] < first) first = all[r];
    free(all);
    LOOM_TRY(s);
    if (first == c->size) return LOOM_OK; // *report stays: who reports a later failure the same everywhere
    *report = first == c->rank;
    if (local != LOOM_OK) return local;
    return loom_fail(LOOM_EIO, NULL, "rank %d failed", (int)first);
}

void loom_comm_shard(size_t n, int size, int rank, size_t *offset, size_t *len) {
    size_t per = (n + (size_t)size - 1) / (size_t)size, start = per * (size_t)rank;
    *offset = start;
    *len = start >= n ? 0 : (n - start < per ? n - start : per);
}

loom_comm *comm_new_over(const comm_ops *ops, const loom_comm *ranks, void *impl) {
    loom_comm *c = loom_xcalloc(1, sizeof *c);
    *c = (loom_comm){.ops = ops, .rank = ranks->rank, .size = ranks->size, .local_rank = ranks->local_rank,
                     .local_size = ranks->local_size, .impl = impl};
    return c;
}

void comm_scale_host(void *buf, size_t count, loom_dtype dt, int divisor) {
    switch (dt) {
    case LOOM_F32:
        for (size_t i = 0; i < count; i++) ((float *)buf)[i] /= (float)divisor;
        break;
    case LOOM_F64:
        for (size_t i = 0; i < count; i++) ((double *)buf)[i] /= (double)divisor;
        break;
    case LOOM_BF16:
        for (size_t i = 0; i < count; i++) {
            uint16_t *b = (uint16_t *)buf + i;
            *b = loom_f32_to_bf16(loom_bf16_to_f32(*b) / (float)divisor);
        }
        break;
    case LOOM_I32:
        for (size_t i = 0; i < count; i++) ((int32_t *)buf)[i] /= divisor;
        break;
    }
}
