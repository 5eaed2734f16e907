// A checkpoint resumed over other data-parallel degrees than it was saved with (ranks, ZeRO
// stage, replicas, bucket size); see trainer_internal.h. The model file is whole already; the
// optimizer state is per shard rank, in the layout data_parallel.c gives each (its slices of the
// flat buffers). This rank reads the files of the checkpoint's shard ranks that hold its model
// shard (the same tp, pp, cp coordinates, replica 0), places each file's slices into the whole
// flat buffers, and takes its own slices from them: the state a run of the new layout would hold
// had it trained from the start (as torch.distributed.checkpoint reshards a state dict on load).
// While it loads, a rank holds its model shard's whole state in host memory (m, v and the master
// weights: 12 bytes a parameter of the shard, beside one old shard's), which the memory plan does
// not count.
#include "core/log.h"
#include "train/trainer_internal.h"

#include <stdlib.h>
#include <string.h>

bool loom_train_reshards(const loom_trainer *t) {
    const loom_train_state *st = &t->st;
    return st->world_size != t->mesh->world_size || st->zero != t->cfg.zero ||
           st->dp_replicate != t->mesh->size[LOOM_AXIS_DP_REPLICATE] ||
           st->bucket_elements != loom_dp_bucket_elements(t->dp);
}

// The slices of a shard's state buffer into the whole flat buffer (to_flat), or back.
static void place(float *flat, float *state, const loom_param_slice *slices, int n, bool to_flat) {
    for (int i = 0; i < n; i++) {
        size_t bytes = (size_t)slices[i].numel * sizeof(float);
        float *f = flat + slices[i].offset, *s = state + slices[i].state_offset;
        memcpy(to_flat ? f : s, to_flat ? s : f, bytes);
    }
}

// Shard rank r's file of the checkpoint into the whole flat buffers (m, v and, when master is not
// NULL, master: N elements each); *has_master and the FP8 scaling state (when fp8 is not NULL)
// as loom_ckpt_load_state gives them.
static loom_status read_shard(const loom_trainer *t, int r, int shards, float *m, float *v, float *master,
                              bool *has_master, float **fp8, int64_t *fp8_n) {
    const loom_train_state *st = &t->st;
    const int *coord = t->mesh->coord;
    int TP = st->tp, CP = st->cp, DS = st->world_size / (st->tp * st->pp * st->cp * st->dp_replicate);
    // mesh.h's rank of (pp, dp_replicate 0, dp_shard r / CP, cp r % CP, tp): a shard group's
    // ranks in world order, cp fastest
    int file = (((coord[LOOM_AXIS_PP] * st->dp_replicate) * DS + r / CP) * CP + r % CP) * TP + coord[LOOM_AXIS_TP];
    loom_param_slice *slices;
    int n;
    int64_t sn;
    LOOM_TRY(loom_dp_layout(&t->model->table, shards, r, st->zero, st->bucket_elements, &slices, &n, &sn));
    size_t bytes = (size_t)sn * sizeof(float);
    float *sm = loom_xmalloc(bytes), *sv = loom_xmalloc(bytes), *smaster = master ? loom_xmalloc(bytes) : NULL;
    loom_status s = loom_ckpt_load_state(t->cfg.resume, st, file, sm, sv, smaster, has_master, sn, fp8, fp8_n);
    if (s == LOOM_OK) {
        place(m, sm, slices, n, true);
        place(v, sv, slices, n, true);
        if (*has_master) place(master, smaster, slices, n, true);
    }
    free(sm);
    free(sv);
    free(smaster);
    free(slices);
    return s;
}

loom_status loom_train_load_resharded(const loom_trainer *t, float *m, float *v, float *master, bool *has_master,
                                      float **fp8, int64_t *fp8_n) {
    const loom_train_state *st = &t->st;
    int64_t N = t->model->table.num_elements;
    float *fm = loom_xcalloc((size_t)N, sizeof(float)), *fv = loom_xcalloc((size_t)N, sizeof(float));
    float *fmaster = master ? loom_xcalloc((size_t)N, sizeof(float)) : NULL;
    // ZeRO 0: the shard rank with this rank's cp coordinate holds the whole state; else each holds its pieces
    int shards = st->world_size / (st->tp * st->pp * st->dp_replicate), cp = t->mesh->coord[LOOM_AXIS_CP];
    loom_status s = LOOM_OK;
    bool all_master = true;
    for (int r = st->zero == 0 ? cp : 0; s == LOOM_OK && r < (st->zero == 0 ? cp + 1 : shards); r++) {
        bool has = false;
        bool first = st->zero == 0 || r == 0; // the FP8 scaling state: the same in every file of a model shard
        s = read_shard(t, r, shards, fm, fv, fmaster, &has, first ? fp8 : NULL, first ? fp8_n : NULL);
        all_master &= has;
    }
    *has_master = s == LOOM_OK && master && all_master;
    if (s == LOOM_OK) {
        int n;
        const loom_param_slice *slices = loom_dp_slices(t->dp, &n);
        size_t bytes = (size_t)loom_dp_state_elements(t->dp) * sizeof(float); // the pieces' padding zero
        memset(m, 0, bytes), memset(v, 0, bytes);
        if (*has_master) memset(master, 0, bytes);
        place(fm, m, slices, n, false);
        place(fv, v, slices, n, false);
        if (*has_master) place(fmaster, master, slices, n, false);
        loom_info("note: checkpoint step %lld was saved over %d rank%s with ZeRO %d (%d data-parallel); its optimizer "
                  "state is resharded onto %d rank%s with ZeRO %d (%d data-parallel), the global batch the same\n",
                  (long long)st->step, st->world_size, loom_plural(st->world_size), st->zero,
                  st->world_size / (st->tp * st->pp * st->cp), t->mesh->world_size, loom_plural(t->mesh->world_size),
                  t->cfg.zero, t->dp_size);
    }
    free(fm);
    free(fv);
    free(fmaster);
    return s;
}
