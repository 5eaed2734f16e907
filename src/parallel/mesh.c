// The device mesh; see mesh.h. A group over the axes in a set S holds the ranks whose
// coordinates agree off S: its color is the rank with the S coordinates zeroed. Groups whose
// axes differ only by axes of degree 1 hold the same ranks and share one communicator.
#include "parallel/mesh.h"

#include "core/log.h"

#include <stdio.h>
#include <string.h>

static const unsigned GROUP_AXES[LOOM_GROUPS] = {
    [LOOM_GROUP_PP] = 1u << LOOM_AXIS_PP,
    [LOOM_GROUP_DP] = 1u << LOOM_AXIS_DP_REPLICATE | 1u << LOOM_AXIS_DP_SHARD,
    [LOOM_GROUP_CP] = 1u << LOOM_AXIS_CP,
    [LOOM_GROUP_TP] = 1u << LOOM_AXIS_TP,
    [LOOM_GROUP_DP_CP] = 1u << LOOM_AXIS_DP_REPLICATE | 1u << LOOM_AXIS_DP_SHARD | 1u << LOOM_AXIS_CP,
    [LOOM_GROUP_MP] = 1u << LOOM_AXIS_TP | 1u << LOOM_AXIS_PP,
    [LOOM_GROUP_EMBED] = 1u << LOOM_AXIS_PP, // its two ends only: the pp group itself when pp <= 2
    [LOOM_GROUP_SHARD] = 1u << LOOM_AXIS_DP_SHARD | 1u << LOOM_AXIS_CP,
    [LOOM_GROUP_REPLICATE] = 1u << LOOM_AXIS_DP_REPLICATE,
};

// The embedding group differs from the pp group when ranks lie between the two ends.
static bool embed_apart(const loom_mesh *m, int g) { return g == LOOM_GROUP_EMBED && m->size[LOOM_AXIS_PP] > 2; }

// The axes of group g that have more than one rank: groups with equal masks are equal.
static unsigned live_axes(const loom_mesh *m, loom_mesh_group g) {
    unsigned mask = 0;
    for (int a = 0; a < LOOM_AXES; a++)
        if ((GROUP_AXES[g] >> a & 1u) && m->size[a] > 1) mask |= 1u << a;
    return mask;
}

// The earlier group with the same ranks as g, or g.
static int first_equal(const loom_mesh *m, loom_mesh_group g) {
    if (embed_apart(m, g)) return g;
    for (int h = 0; h < (int)g; h++)
        if (live_axes(m, h) == live_axes(m, g)) return h;
    return g;
}

static int rank_of(const loom_mesh *m, const int *coord) {
    int r = 0;
    for (int a = 0; a < LOOM_AXES; a++) r = r * m->size[a] + coord[a];
    return r;
}

loom_status loom_mesh_create(loom_mesh **out, loom_comm *world, int tp, int pp, int cp, int dp_replicate) {
    *out = NULL;
    int W = loom_comm_size(world);
    if (tp < 1 || pp < 1 || cp < 1 || dp_replicate < 1)
        return loom_fail(LOOM_EINVAL, "parallel degrees are 1 or more", "bad mesh: --tp %d --pp %d --cp %d --dp-replicate %d",
                         tp, pp, cp, dp_replicate);
    if (W % (tp * pp * cp) != 0)
        return loom_fail(LOOM_EINVAL, "launch a multiple of tp x pp x cp ranks",
                         "%d rank%s do%s not divide into --tp %d x --pp %d x --cp %d = %d", W, loom_plural(W),
                         W == 1 ? "es" : "", tp, pp, cp, tp * pp * cp);
    int dp = W / (tp * pp * cp);
    if (dp % dp_replicate != 0)
        return loom_fail(LOOM_EINVAL, "use a --dp-replicate that divides the data-parallel ranks",
                         "--dp-replicate %d does not divide the %d data-parallel ranks (%d ranks / tp x pp x cp = %d)",
                         dp_replicate, dp, W, tp * pp * cp);
    loom_mesh *m = loom_xcalloc(1, sizeof *m);
    m->world = world;
    m->rank = loom_comm_rank(world);
    m->world_size = W;
    const int size[LOOM_AXES] = {pp, dp_replicate, dp / dp_replicate, cp, tp};
    memcpy(m->size, size, sizeof size);
    for (int a = LOOM_AXES - 1, r = m->rank; a >= 0; a--) {
        m->coord[a] = r % m->size[a];
        r /= m->size[a];
    }
    for (int g = 0; g < LOOM_GROUPS; g++) {
        int same = first_equal(m, g);
        if (same != g) {
            m->host[g] = m->host[same];
            continue;
        }
        int coord[LOOM_AXES];
        for (int a = 0; a < LOOM_AXES; a++) coord[a] = GROUP_AXES[g] >> a & 1u ? 0 : m->coord[a];
        int pp_i = m->coord[LOOM_AXIS_PP], color = rank_of(m, coord);
        if (embed_apart(m, g) && pp_i > 0 && pp_i < pp - 1) color = W + m->rank; // alone
        loom_status s = loom_comm_split(world, color, m->rank, &m->host[g]);
        if (s != LOOM_OK) {
            loom_mesh_free(m);
            return s;
        }
    }
    for (int g = 0; g < LOOM_GROUPS; g++) m->dev[g] = m->host[g];
    *out = m;
    return LOOM_OK;
}

loom_status loom_mesh_attach_device(loom_mesh *m, void *stream, const char *device_comm) {
    bool nccl = strcmp(device_comm, "nccl") == 0;
    if (!nccl && strcmp(device_comm, "mpi") != 0)
        return loom_fail(LOOM_EINVAL, "use --device-comm nccl or mpi", "unknown --device-comm '%s'", device_comm);
    for (int g = 0; g < LOOM_GROUPS; g++) m->dev[g] = NULL;
    for (int g = 0; g < LOOM_GROUPS; g++) {
        int same = first_equal(m, g);
        if (same != g) {
            m->dev[g] = m->dev[same];
            continue;
        }
        loom_status s = nccl && loom_comm_size(m->host[g]) > 1 ? loom_comm_nccl(m->host[g], stream, &m->dev[g])
                                                                 : loom_comm_staged(m->host[g], stream, &m->dev[g]);
        if (s != LOOM_OK) return s;
    }
    return LOOM_OK;
}

void loom_mesh_free(loom_mesh *m) {
    if (!m) return;
    for (int g = 0; g < LOOM_GROUPS; g++) {
        if (first_equal(m, g) != g) continue;
        if (m->dev[g] != m->host[g]) loom_comm_free(m->dev[g]);
        loom_comm_free(m->host[g]);
    }
    free(m);
}

int loom_mesh_size(const loom_mesh *m, loom_mesh_group g) { return loom_comm_size(m->host[g]); }

int loom_mesh_replica0(const loom_mesh *m) {
    int coord[LOOM_AXES];
    memcpy(coord, m->coord, sizeof coord);
    coord[LOOM_AXIS_DP_REPLICATE] = coord[LOOM_AXIS_DP_SHARD] = 0;
    return rank_of(m, coord);
}
int loom_mesh_rank(const loom_mesh *m, loom_mesh_group g) { return loom_comm_rank(m->host[g]); }

void loom_mesh_describe(const loom_mesh *m, char *out, size_t cap) {
    char replicas[48] = "";
    if (m->size[LOOM_AXIS_DP_REPLICATE] > 1)
        snprintf(replicas, sizeof replicas, " (%d replicas of %d shards)", m->size[LOOM_AXIS_DP_REPLICATE],
                 m->size[LOOM_AXIS_DP_SHARD]);
    snprintf(out, cap, "pp %d x dp %d%s x cp %d x tp %d = %d rank%s", m->size[LOOM_AXIS_PP],
             m->size[LOOM_AXIS_DP_REPLICATE] * m->size[LOOM_AXIS_DP_SHARD], replicas, m->size[LOOM_AXIS_CP],
             m->size[LOOM_AXIS_TP], m->world_size, loom_plural(m->world_size));
}
