// The device mesh under mpirun -np 8: for several (tp, pp, cp, dp_replicate) layouts, every rank's
// coordinates follow rank = (((pp dr + ...) ...) tp-fastest order; every group has the product
// of its axes' degrees as size; its members (all-gathered coordinates) agree off the group's
// axes, are all distinct, and are ordered by world rank; groups equal after dropping degree-1
// axes share one communicator; replica 0's rank holds the same shard; impossible layouts give
// one clear error on every rank; the embedding group holds the two ends of a pp group.
#include "harness.h"

#include "parallel/mesh.h"

#include <string.h>

static const unsigned AXES_OF[LOOM_GROUPS] = {
    [LOOM_GROUP_PP] = 1u << LOOM_AXIS_PP,
    [LOOM_GROUP_DP] = 1u << LOOM_AXIS_DP_REPLICATE | 1u << LOOM_AXIS_DP_SHARD,
    [LOOM_GROUP_CP] = 1u << LOOM_AXIS_CP,
    [LOOM_GROUP_TP] = 1u << LOOM_AXIS_TP,
    [LOOM_GROUP_DP_CP] = 1u << LOOM_AXIS_DP_REPLICATE | 1u << LOOM_AXIS_DP_SHARD | 1u << LOOM_AXIS_CP,
    [LOOM_GROUP_MP] = 1u << LOOM_AXIS_TP | 1u << LOOM_AXIS_PP,
    [LOOM_GROUP_EMBED] = 1u << LOOM_AXIS_PP,
    [LOOM_GROUP_SHARD] = 1u << LOOM_AXIS_DP_SHARD | 1u << LOOM_AXIS_CP,
    [LOOM_GROUP_REPLICATE] = 1u << LOOM_AXIS_DP_REPLICATE,
};

static void check_layout(loom_comm *world, int tp, int pp, int cp, int dr) {
    loom_mesh *m;
    T_ASSERT(loom_mesh_create(&m, world, tp, pp, cp, dr) == LOOM_OK, "mesh tp %d pp %d cp %d dp_replicate %d: %s", tp,
             pp, cp, dr, loom_error_message());
    int W = loom_comm_size(world), R = loom_comm_rank(world), r = 0, ds = W / (tp * pp * cp * dr);
    for (int a = 0; a < LOOM_AXES; a++) r = r * m->size[a] + m->coord[a];
    T_ASSERT(r == R && m->size[LOOM_AXIS_DP_SHARD] == ds && m->size[LOOM_AXIS_DP_REPLICATE] == dr &&
             m->size[LOOM_AXIS_TP] == tp, "coordinates of rank %d", R);
    for (int g = 0; g < LOOM_GROUPS; g++) {
        int want = 1;
        for (int a = 0; a < LOOM_AXES; a++)
            if (AXES_OF[g] >> a & 1u) want *= m->size[a];
        int pp_i = m->coord[LOOM_AXIS_PP];
        if (g == LOOM_GROUP_EMBED) want = pp == 1 ? 1 : pp_i == 0 || pp_i == pp - 1 ? 2 : 1; // the two ends
        int n = loom_mesh_size(m, g);
        T_ASSERT(n == want, "group %d: %d ranks, want %d", g, n, want);
        int32_t mine[LOOM_AXES + 1], *all = malloc((size_t)n * sizeof mine);
        memcpy(mine, m->coord, sizeof m->coord);
        mine[LOOM_AXES] = R;
        T_ASSERT(loom_allgather(m->host[g], mine, all, LOOM_AXES + 1, LOOM_I32, NULL) == LOOM_OK, "gather");
        int bad = 0;
        for (int i = 0; i < n; i++) {
            const int32_t *c = all + i * (LOOM_AXES + 1);
            for (int a = 0; a < LOOM_AXES; a++) bad += !(AXES_OF[g] >> a & 1u) && c[a] != m->coord[a];
            if (g == LOOM_GROUP_EMBED && n == 2) bad += c[LOOM_AXIS_PP] != (i == 0 ? 0 : pp - 1);
            if (i > 0) bad += c[LOOM_AXES] <= c[-1]; // ordered by world rank (c[-1]: the previous member's)
            bad += (i == loom_mesh_rank(m, g)) != (c[LOOM_AXES] == R);
        }
        T_ASSERT(bad == 0, "group %d of rank %d: %d wrong members", g, R, bad);
        free(all);
    }
    T_ASSERT((m->size[LOOM_AXIS_CP] > 1) == (m->host[LOOM_GROUP_DP_CP] != m->host[LOOM_GROUP_DP]),
             "dp_cp shares dp's communicator exactly when cp is 1");
    T_ASSERT((dr > 1) == (m->host[LOOM_GROUP_SHARD] != m->host[LOOM_GROUP_DP_CP]),
             "shard shares dp_cp's communicator exactly when dp_replicate is 1");
    int dp_i = m->coord[LOOM_AXIS_DP_REPLICATE] * ds + m->coord[LOOM_AXIS_DP_SHARD];
    int r0 = loom_mesh_replica0(m), want0 = R - dp_i * cp * tp;
    T_ASSERT(r0 == want0, "replica 0 of rank %d is %d, want %d", R, r0, want0);
    char text[96], expect[96];
    loom_mesh_describe(m, text, sizeof text);
    char replicas[48] = "";
    if (dr > 1) snprintf(replicas, sizeof replicas, " (%d replicas of %d shards)", dr, ds);
    snprintf(expect, sizeof expect, "pp %d x dp %d%s x cp %d x tp %d = %d ranks", pp, W / (tp * pp * cp), replicas, cp,
             tp, W);
    T_ASSERT(strcmp(text, expect) == 0, "describe: '%s'", text);
    loom_mesh_free(m);
}

int main(int argc, char **argv) {
    loom_comm *world;
    if (loom_comm_world(&argc, &argv, &world) != LOOM_OK) return 1;
    // tp, pp, cp, dp_replicate
    const int layouts[][4] = {{1, 1, 1, 1}, {2, 1, 1, 1}, {4, 1, 1, 1}, {8, 1, 1, 1}, {2, 2, 1, 1}, {2, 1, 2, 1},
                              {2, 2, 2, 1}, {1, 2, 2, 1}, {1, 4, 1, 1}, {2, 4, 1, 1}, {1, 8, 1, 1}, {1, 1, 1, 2},
                              {1, 1, 1, 4}, {2, 1, 1, 2}, {1, 2, 1, 2}, {1, 1, 2, 2}, {1, 1, 1, 8}};
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
        const int *l = layouts[i];
        if (loom_comm_size(world) % (l[0] * l[1] * l[2] * l[3]) == 0) check_layout(world, l[0], l[1], l[2], l[3]);
    }
    loom_mesh *m;
    T_ASSERT(loom_mesh_create(&m, world, 3, 1, 1, 1) == LOOM_EINVAL && strstr(loom_error_message(), "do not divide into --tp 3"),
             "3 does not divide: %s", loom_error_message());
    T_ASSERT(loom_mesh_create(&m, world, 0, 1, 1, 1) == LOOM_EINVAL && strstr(loom_error_message(), "--tp 0"),
             "degree 0: %s", loom_error_message());
    T_ASSERT(loom_mesh_create(&m, world, 2, 1, 1, 3) == LOOM_EINVAL &&
                 strstr(loom_error_message(), "--dp-replicate 3 does not divide"),
             "replicas that do not divide: %s", loom_error_message());
    printf("rank %d of %d: ", loom_comm_rank(world), loom_comm_size(world));
    int rc = t_done("mesh");
    loom_comm_finalize(world);
    return rc;
}
