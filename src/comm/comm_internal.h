// Private to src/comm: the backend table every group carries, and the request record.
#pragma once
#include "comm/comm.h"

typedef struct {
    const char *name;
    loom_status (*allreduce)(loom_comm *c, void *buf, size_t count, loom_dtype dt, loom_red_op op, loom_comm_req *req);
    loom_status (*reduce_scatter)(loom_comm *c, const void *send, void *recv, size_t count, loom_dtype dt,
                                  loom_red_op op, loom_comm_req *req);
    loom_status (*allgather)(loom_comm *c, const void *send, void *recv, size_t count, loom_dtype dt,
                             loom_comm_req *req);
    loom_status (*broadcast)(loom_comm *c, void *buf, size_t count, loom_dtype dt, int root, loom_comm_req *req);
    loom_status (*alltoall)(loom_comm *c, const void *send, void *recv, size_t count, loom_dtype dt,
                            loom_comm_req *req);
    loom_status (*sendrecv)(loom_comm *c, void *buf, size_t count, loom_dtype dt, int peer, int tag,
                            bool is_send, loom_comm_req *req);
    loom_status (*barrier)(loom_comm *c);
    loom_status (*test)(loom_comm_req *req, bool *done);
    loom_status (*wait)(loom_comm_req *req);
    loom_status (*split)(loom_comm *c, int color, int key, loom_comm **out);
    void (*free)(loom_comm *c);
} comm_ops;

struct loom_comm {
    const comm_ops *ops;
    int rank, size, local_rank, local_size;
    void *impl; // the backend's group (MPI_Comm*, ncclComm_t, ...)
};

// One outstanding operation. `scale_*`: LOOM_AVG's division, applied at completion by
// backends without a native average.
struct loom_comm_req {
    loom_comm *comm;
    void *impl;        // the backend's request
    void *scale_buf;   // NULL: nothing to scale
    size_t scale_count;
    loom_dtype scale_dt;
};

// A group of `ops` with the backend's group `impl`, its ranks (rank, size, local rank and size)
// those of `ranks` (the host group a device group is made over).
loom_comm *comm_new_over(const comm_ops *ops, const loom_comm *ranks, void *impl);
// Constructors of the world group per backend.
loom_comm *comm_self_world(void);
loom_status comm_mpi_world(int *argc, char ***argv, loom_comm **out);
void comm_mpi_finalize(void);
// Divides buf (count of dt) by `divisor` in place (host memory).
void comm_scale_host(void *buf, size_t count, loom_dtype dt, int divisor);
