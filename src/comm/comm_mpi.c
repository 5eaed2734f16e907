// The MPI backend (OpenMPI from Debian; any MPI-3 library): host buffers, non-blocking
// collectives (MPI_Iallreduce, MPI_Ireduce_scatter_block, ...). MPI has no average and no
// bf16: LOOM_AVG is a sum divided at completion, bf16 is a 2-byte type with its own sum and max ops.
#include "comm/comm_internal.h"

#include "core/bf16.h"

#include <limits.h>
#include <mpi.h>

static MPI_Datatype g_bf16 = MPI_DATATYPE_NULL;
static MPI_Op g_bf16_sum = MPI_OP_NULL, g_bf16_max = MPI_OP_NULL;

static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *dt) {
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) b[i] = loom_f32_to_bf16(loom_bf16_to_f32(a[i]) + loom_bf16_to_f32(b[i]));
}

static void bf16_max(void *in, void *inout, int *len, MPI_Datatype *dt) {
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++)
        if (loom_bf16_to_f32(a[i]) > loom_bf16_to_f32(b[i])) b[i] = a[i];
}

static MPI_Comm comm_of(const loom_comm *c) { return *(MPI_Comm *)c->impl; }

static MPI_Datatype mpi_type(loom_dtype dt) {
    switch (dt) {
    case LOOM_F32: return MPI_FLOAT;
    case LOOM_F64: return MPI_DOUBLE;
    case LOOM_I32: return MPI_INT32_T;
    case LOOM_BF16: return g_bf16;
    }
    return MPI_DATATYPE_NULL;
}

static MPI_Op mpi_op(loom_dtype dt, loom_red_op op) {
    if (op == LOOM_MAX) return dt == LOOM_BF16 ? g_bf16_max : MPI_MAX;
    return dt == LOOM_BF16 ? g_bf16_sum : MPI_SUM; // LOOM_AVG: a sum divided at completion
}

static loom_status check(int rc, const char *what) {
    if (rc == MPI_SUCCESS) return LOOM_OK;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return loom_fail(LOOM_EIO, "check the launcher and the other ranks' output", "%s failed: %s", what, msg);
}

static loom_status check_count(size_t count, const char *what) {
    if (count <= INT_MAX) return LOOM_OK;
    return loom_fail(LOOM_EINVAL, "split the buffer", "%s of %zu elements exceeds MPI's int count", what, count);
}

// Prepares r for a non-blocking call: its MPI_Request, and the AVG division if any.
static MPI_Request *request(loom_comm_req *r, void *avg_buf, size_t count, loom_dtype dt, loom_red_op op) {
    r->impl = loom_xmalloc(sizeof(MPI_Request));
    if (op == LOOM_AVG) r->scale_buf = avg_buf, r->scale_count = count, r->scale_dt = dt;
    return r->impl;
}

static loom_status mpi_allreduce(loom_comm *c, void *buf, size_t n, loom_dtype dt, loom_red_op op, loom_comm_req *r) {
    LOOM_TRY(check_count(n, "all-reduce"));
    return check(MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, mpi_type(dt), mpi_op(dt, op), comm_of(c),
                                request(r, buf, n, dt, op)), "MPI_Iallreduce");
}

static loom_status mpi_reduce_scatter(loom_comm *c, const void *send, void *recv, size_t n, loom_dtype dt,
                                      loom_red_op op, loom_comm_req *r) {
    LOOM_TRY(check_count(n * (size_t)c->size, "reduce-scatter"));
    return check(MPI_Ireduce_scatter_block(send, recv, (int)n, mpi_type(dt), mpi_op(dt, op), comm_of(c),
                                           request(r, recv, n, dt, op)), "MPI_Ireduce_scatter_block");
}

static loom_status mpi_allgather(loom_comm *c, const void *send, void *recv, size_t n, loom_dtype dt,
                                 loom_comm_req *r) {
    LOOM_TRY(check_count(n * (size_t)c->size, "all-gather"));
    return check(MPI_Iallgather(send ? send : MPI_IN_PLACE, (int)n, mpi_type(dt), recv, (int)n, mpi_type(dt),
                                comm_of(c), request(r, NULL, 0, dt, LOOM_SUM)), "MPI_Iallgather");
}

static loom_status mpi_broadcast(loom_comm *c, void *buf, size_t n, loom_dtype dt, int root, loom_comm_req *r) {
    LOOM_TRY(check_count(n, "broadcast"));
    return check(MPI_Ibcast(buf, (int)n, mpi_type(dt), root, comm_of(c), request(r, NULL, 0, dt, LOOM_SUM)),
                 "MPI_Ibcast");
}

static loom_status mpi_alltoall(loom_comm *c, const void *send, void *recv, size_t n, loom_dtype dt,
                                loom_comm_req *r) {
    LOOM_TRY(check_count(n * (size_t)c->size, "all-to-all"));
    return check(MPI_Ialltoall(send, (int)n, mpi_type(dt), recv, (int)n, mpi_type(dt), comm_of(c),
                               request(r, NULL, 0, dt, LOOM_SUM)), "MPI_Ialltoall");
}

static loom_status mpi_sendrecv(loom_comm *c, void *buf, size_t n, loom_dtype dt, int peer, int tag,
                                bool is_send, loom_comm_req *r) {
    LOOM_TRY(check_count(n, is_send ? "send" : "recv"));
    MPI_Request *q = request(r, NULL, 0, dt, LOOM_SUM);
    if (is_send) return check(MPI_Isend(buf, (int)n, mpi_type(dt), peer, tag, comm_of(c), q), "MPI_Isend");
    return check(MPI_Irecv(buf, (int)n, mpi_type(dt), peer, tag, comm_of(c), q), "MPI_Irecv");
}

static loom_status mpi_barrier(loom_comm *c) { return check(MPI_Barrier(comm_of(c)), "MPI_Barrier"); }

static loom_status mpi_test(loom_comm_req *r, bool *done) {
    int flag = 0;
    loom_status s = check(MPI_Test(r->impl, &flag, MPI_STATUS_IGNORE), "MPI_Test");
    *done = flag != 0;
    return s;
}

static loom_status mpi_wait(loom_comm_req *r) {
    loom_status s = check(MPI_Wait(r->impl, MPI_STATUS_IGNORE), "MPI_Wait");
    free(r->impl);
    return s;
}

static loom_comm *wrap(MPI_Comm mc);

static loom_status mpi_split(loom_comm *c, int color, int key, loom_comm **out) {
    MPI_Comm mc;
    LOOM_TRY(check(MPI_Comm_split(comm_of(c), color, key, &mc), "MPI_Comm_split"));
    *out = wrap(mc);
    return LOOM_OK;
}

static void mpi_free(loom_comm *c) {
    MPI_Comm mc = comm_of(c);
    if (mc != MPI_COMM_WORLD) MPI_Comm_free(&mc);
    free(c->impl);
    free(c);
}

static const comm_ops MPI_OPS = {
    "mpi", mpi_allreduce, mpi_reduce_scatter, mpi_allgather, mpi_broadcast, mpi_alltoall,
    mpi_sendrecv, mpi_barrier, mpi_test, mpi_wait, mpi_split, mpi_free,
};

static loom_comm *wrap(MPI_Comm mc) {
    loom_comm *c = loom_xcalloc(1, sizeof *c);
    c->ops = &MPI_OPS;
    c->impl = loom_xmalloc(sizeof(MPI_Comm));
    *(MPI_Comm *)c->impl = mc;
    MPI_Comm_rank(mc, &c->rank);
    MPI_Comm_size(mc, &c->size);
    MPI_Comm node; // ranks sharing this host give the local rank
    MPI_Comm_split_type(mc, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &c->local_rank);
    MPI_Comm_size(node, &c->local_size);
    MPI_Comm_free(&node);
    return c;
}

loom_status comm_mpi_world(int *argc, char ***argv, loom_comm **out) {
    int provided;
    LOOM_TRY(check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread"));
    MPI_Type_contiguous(2, MPI_BYTE, &g_bf16);
    MPI_Type_commit(&g_bf16);
    MPI_Op_create(bf16_sum, 1, &g_bf16_sum);
    MPI_Op_create(bf16_max, 1, &g_bf16_max);
    *out = wrap(MPI_COMM_WORLD);
    return LOOM_OK;
}

void comm_mpi_finalize(void) {
    MPI_Op_free(&g_bf16_sum);
    MPI_Op_free(&g_bf16_max);
    MPI_Type_free(&g_bf16);
    MPI_Finalize();
}
