// The "self" backend: a group of one process. Reductions are identities (AVG divides by 1),
// gathers and all-to-all copy; there is no peer to send to.
#include "comm/comm_internal.h"

#include <string.h>

static void copy(void *dst, const void *src, size_t count, loom_dtype dt) {
    if (dst != src && count) memmove(dst, src, count * loom_dtype_size(dt));
}

static loom_status self_allreduce(loom_comm *c, void *buf, size_t n, loom_dtype dt, loom_red_op op, loom_comm_req *r) {
    return LOOM_OK;
}
static loom_status self_reduce_scatter(loom_comm *c, const void *send, void *recv, size_t n, loom_dtype dt,
                                       loom_red_op op, loom_comm_req *r) {
    copy(recv, send, n, dt);
    return LOOM_OK;
}
static loom_status self_allgather(loom_comm *c, const void *send, void *recv, size_t n, loom_dtype dt,
                                  loom_comm_req *r) {
    if (send) copy(recv, send, n, dt);
    return LOOM_OK;
}
static loom_status self_broadcast(loom_comm *c, void *buf, size_t n, loom_dtype dt, int root, loom_comm_req *r) {
    return LOOM_OK;
}
static loom_status self_alltoall(loom_comm *c, const void *send, void *recv, size_t n, loom_dtype dt,
                                 loom_comm_req *r) {
    copy(recv, send, n, dt);
    return LOOM_OK;
}
static loom_status self_sendrecv(loom_comm *c, void *buf, size_t n, loom_dtype dt, int peer, int tag,
                                 bool is_send, loom_comm_req *r) {
    return loom_fail(LOOM_EINVAL, NULL, "a group of one has no peer %d", peer);
}
static loom_status self_barrier(loom_comm *c) { return LOOM_OK; }
static loom_status self_test(loom_comm_req *r, bool *done) {
    *done = true;
    return LOOM_OK;
}
static loom_status self_wait(loom_comm_req *r) { return LOOM_OK; }
static loom_status self_split(loom_comm *c, int color, int key, loom_comm **out) {
    *out = comm_self_world();
    return LOOM_OK;
}
static void self_free(loom_comm *c) { free(c); }

static const comm_ops SELF_OPS = {
    "self", self_allreduce, self_reduce_scatter, self_allgather, self_broadcast, self_alltoall,
    self_sendrecv, self_barrier, self_test, self_wait, self_split, self_free,
};

loom_comm *comm_self_world(void) {
    loom_comm *c = loom_xcalloc(1, sizeof *c);
    *c = (loom_comm){.ops = &SELF_OPS, .rank = 0, .size = 1, .local_rank = 0, .local_size = 1};
    return c;
}
