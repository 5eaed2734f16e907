// The device mesh: the ranks of a run arranged on named axes (torchtitan's ParallelDims and
// DeviceMesh; Megatron-LM's parallel_state), one object that owns every process group a
// layout needs.
//
//   axes (slowest to fastest varying): pp, dp_replicate, dp_shard, cp, tp
//   rank = (((pp_i * DR + dr_i) * DS + ds_i) * CP + cp_i) * TP + tp_i
//
// tp varies fastest, so a tensor-parallel group is tp consecutive ranks, on one host when the
// launcher places ranks in order. The data-parallel degree dp = dp_replicate x dp_shard is what
// the world leaves after tp x pp x cp; hybrid sharding (HSDP) splits it into dp_replicate replicas
// of dp_shard ranks each (dp_replicate is 1 otherwise).
//
// Groups: each axis, plus the combinations the layouts need: dp (dp_replicate x dp_shard: the
// replicas of one model shard, which read different data), dp_cp (dp x cp: the ranks whose
// gradients of the same parameters are averaged), shard (dp_shard x cp: the ranks over which ZeRO
// shards gradients, optimizer state and, at stage 3, parameters; dp_cp when dp_replicate is 1),
// replicate (dp_replicate: the ranks holding the same shard in different replicas), mp (tp x pp: the ranks that together hold one
// replica of the model, over which the gradient norm is summed), and embed (Megatron-LM's
// embedding group: the first and the last rank of a pp group, which both hold the tied word
// embedding; a group of its own for the ranks between). Each group exists for host
// values (MPI or self) and, once loom_mesh_attach_device is called on a GPU, for device buffers
// (NCCL, or MPI staged through host memory when ranks share a GPU); on the CPU the device group
// is the host group.
#pragma once
#include "comm/comm.h"

typedef enum { LOOM_AXIS_PP, LOOM_AXIS_DP_REPLICATE, LOOM_AXIS_DP_SHARD, LOOM_AXIS_CP, LOOM_AXIS_TP, LOOM_AXES } loom_mesh_axis;
typedef enum {
    LOOM_GROUP_PP, LOOM_GROUP_DP, LOOM_GROUP_CP, LOOM_GROUP_TP, LOOM_GROUP_DP_CP, LOOM_GROUP_MP, LOOM_GROUP_EMBED,
    LOOM_GROUP_SHARD, LOOM_GROUP_REPLICATE, LOOM_GROUPS
} loom_mesh_group;

typedef struct {
    int size[LOOM_AXES];  // the degree of each axis
    int coord[LOOM_AXES]; // this rank's coordinate on each axis
    int rank, world_size;
    loom_comm *world;     // not owned
    loom_comm *host[LOOM_GROUPS];
    loom_comm *dev[LOOM_GROUPS]; // = host on the CPU
} loom_mesh;

// Arranges the ranks of `world` with degrees tp, pp, cp and dp_replicate (>= 1); dp is the rest,
// dp_shard = dp / dp_replicate. Collective over world. Errors (the same on every rank):
// LOOM_EINVAL naming the values when a degree is below 1, tp x pp x cp does not divide the world
// size or dp_replicate does not divide dp; those of loom_comm_split.
loom_status loom_mesh_create(loom_mesh **out, loom_comm *world, int tp, int pp, int cp, int dp_replicate);
// Device groups for buffers of a GPU backend whose ops run on `stream` (a cudaStream_t):
// `device_comm` "nccl" (NCCL) or "mpi" (MPI staged through host memory, for ranks sharing a
// GPU). Groups of one rank stage (they never move data). Errors: LOOM_EINVAL for another
// device_comm, those of loom_comm_nccl (ranks sharing a GPU) and loom_comm_staged.
loom_status loom_mesh_attach_device(loom_mesh *m, void *stream, const char *device_comm);
void loom_mesh_free(loom_mesh *m);

int loom_mesh_size(const loom_mesh *m, loom_mesh_group g); // ranks in this rank's group g
// The world rank that holds this rank's shard (tp, pp, cp coordinates) in data-parallel replica 0.
int loom_mesh_replica0(const loom_mesh *m);
int loom_mesh_rank(const loom_mesh *m, loom_mesh_group g); // this rank's index in it
// "pp 1 x dp 2 x cp 1 x tp 2 = 4 ranks"
void loom_mesh_describe(const loom_mesh *m, char *out, size_t cap);
