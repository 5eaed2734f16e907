// Process groups and collectives (DESIGN.md, src/comm). A loom_comm is a group of ranks with
// one backend: "mpi" (OpenMPI, host memory: the CPU path), "nccl" (device memory, in CUDA
// builds), "staged" (device memory through host copies and MPI, in CUDA builds) or "self" (a
// group of one, no launcher needed). Every collective can run
// asynchronously: give a request pointer and wait on it later (loom_comm_wait), or give NULL to
// block. Buffers are `count` elements of `dt`; "per rank" counts are the size of one rank's
// piece, so a reduce-scatter's send buffer holds size * count elements.
//
// Reductions: LOOM_SUM, LOOM_AVG = sum / group size, and LOOM_MAX (the largest; NaN
// propagation is the library's). Collectives with the same arguments
// in the same order on every rank give the same bits on every run (the MPI backend's algorithm
// depends only on the sizes), which the parity tests rely on.
//
// Errors: LOOM_EINVAL for arguments the backend cannot take (a count above INT_MAX for MPI,
// a peer outside the group), LOOM_EUNSUPPORTED for a dtype or op the backend lacks, LOOM_EIO
// for a failure reported by the library, each naming the operation.
#pragma once
#include "core/status.h"
#include "core/tensor.h"

#include <stdbool.h>
#include <stddef.h>

typedef enum { LOOM_SUM, LOOM_AVG, LOOM_MAX } loom_red_op;

typedef struct loom_comm loom_comm;
typedef struct loom_comm_req loom_comm_req;

// The world group of this process: MPI when the process was started by a launcher (mpirun,
// srun: OMPI_COMM_WORLD_SIZE, PMIX_RANK, PMI_RANK or SLURM_NTASKS > 1 in the environment, or
// LOOM_COMM=mpi), else "self". Errors: LOOM_EUNSUPPORTED when launched by MPI in a build
// without it.
loom_status loom_comm_world(int *argc, char ***argv, loom_comm **world);
// Whether the launcher that started this process (mpirun, srun: its parent when
// loom_comm_world found one in the environment) is still there. A rank whose launcher was
// killed is an orphan: the job was stopped, and the rank should stop before it commits
// anything. Errors: LOOM_EIO naming the launcher's pid when it is gone (never without a launcher).
loom_status loom_comm_launcher_check(void);
// Ends MPI if loom_comm_world started it; frees the world group.
void loom_comm_finalize(loom_comm *world);

int loom_comm_rank(const loom_comm *c);
int loom_comm_size(const loom_comm *c);
int loom_comm_local_rank(const loom_comm *c);  // rank among the ranks of this host
int loom_comm_local_size(const loom_comm *c);  // ranks on this host
const char *loom_comm_backend(const loom_comm *c); // "mpi", "nccl", "staged" or "self"

// A group for device buffers over the same ranks as host_group (CUDA builds; NCCL, its
// unique id broadcast over host_group). Its collectives run on a stream of their own, after
// the work already queued on compute_stream (a cudaStream_t); waiting on a request makes
// compute_stream wait for it without blocking the host. NCCL needs one GPU per rank: when two
// ranks' current GPUs are the same (host name and PCI bus id), every rank returns LOOM_EINVAL
// naming the lowest such pair, without calling NCCL (loom_comm_staged serves that layout).
// Errors: LOOM_EUNSUPPORTED in builds without CUDA, LOOM_EINVAL for ranks sharing a GPU,
// LOOM_EIO when CUDA or NCCL fails (the message is theirs).
loom_status loom_comm_nccl(loom_comm *host_group, void *compute_stream, loom_comm **out);

// A group for device buffers over the same ranks as host_group (an "mpi" or "self" group;
// CUDA builds) whose collectives go through host memory by host_group's backend: for ranks
// that share a GPU, which NCCL refuses; a test path, not a fast one. Ordering: each operation
// blocks the host until the work queued on `stream` (a cudaStream_t) so far is done and its
// device inputs are copied to host memory of its own (so several may be in flight at once,
// and its inputs may be overwritten once it returns); completing the request copies the
// results into the device buffers on `stream` and waits for that copy, so work queued on
// `stream` afterwards sees them (before that, the buffers it writes are left as they were).
// Errors: LOOM_EUNSUPPORTED in builds without CUDA, LOOM_EINVAL for a host_group that is not
// in host memory, LOOM_EIO when CUDA fails (the message is CUDA's) or host_group's backend does.
loom_status loom_comm_staged(loom_comm *host_group, void *stream, loom_comm **out);

// Sub-groups: ranks with the same color form a group, ordered by key (MPI_Comm_split).
loom_status loom_comm_split(loom_comm *c, int color, int key, loom_comm **out);
void loom_comm_free(loom_comm *c);

// In place: buf (count) on every rank becomes the reduction over ranks.
loom_status loom_allreduce(loom_comm *c, void *buf, size_t count, loom_dtype dt, loom_red_op op,
                           loom_comm_req **req);
// send (size * count): rank r receives into recv (count) the reduction of piece r.
loom_status loom_reduce_scatter(loom_comm *c, const void *send, void *recv, size_t count,
                                loom_dtype dt, loom_red_op op, loom_comm_req **req);
// recv (size * count) gets piece r = rank r's send (count). send == NULL: in place, rank r's
// piece already sits at recv + r * count.
loom_status loom_allgather(loom_comm *c, const void *send, void *recv, size_t count, loom_dtype dt,
                           loom_comm_req **req);
loom_status loom_broadcast(loom_comm *c, void *buf, size_t count, loom_dtype dt, int root,
                           loom_comm_req **req);
// send (size * count): piece p goes to rank p; recv (size * count): piece p came from rank p.
loom_status loom_alltoall(loom_comm *c, const void *send, void *recv, size_t count, loom_dtype dt,
                          loom_comm_req **req);
loom_status loom_send(loom_comm *c, const void *buf, size_t count, loom_dtype dt, int peer, int tag,
                      loom_comm_req **req);
loom_status loom_recv(loom_comm *c, void *buf, size_t count, loom_dtype dt, int peer, int tag,
                      loom_comm_req **req);
loom_status loom_barrier(loom_comm *c);

// Completes the request (applying LOOM_AVG's division) and frees it.
loom_status loom_comm_wait(loom_comm_req *req);
// *done = whether the request has completed; it still must be waited on. Also drives the
// progress of the backend's outstanding operations (MPI progresses inside its calls).
loom_status loom_comm_test(loom_comm_req *req, bool *done);

// Agreement after a step that can fail on some ranks only: every rank passes its status and
// gets LOOM_OK when all succeeded. Otherwise it returns the failing status (its own, or
// LOOM_EIO for ranks that succeeded) and *report is true on exactly one rank, the lowest that
// failed, which should print its error; the others exit quietly, so a failure prints one line
// and no rank hangs. On success *report is left as it was (the rank that reports failures that
// are the same on every rank).
loom_status loom_comm_agree(loom_comm *c, loom_status local, bool *report);

// The shard of n elements that rank r of `size` owns under even sharding with padding:
// every rank owns ceil(n / size) slots; *offset is its first, *len the real elements (the
// last ranks may own fewer, or none).
void loom_comm_shard(size_t n, int size, int rank, size_t *offset, size_t *len);
