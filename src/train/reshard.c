// A checkpoint resumed in another layout than it was saved in (ranks, tp, pp and its stage
// placement, cp, sp, ZeRO stage, replicas, bucket size); see trainer_internal.h. The model file
// is whole already; the optimizer state is per shard rank, in the layout data_parallel.c gives
// each (its slices of its model shard's flat buffers). This rank rebuilds the state of the model
// file's order from the files of the checkpoint's ranks (replica 0, cp rank 0 under ZeRO 0): each
// file's slices into its model shard's flat buffers by the old layout (loom_dp_layout), each
// shard into the file's order by its parameter table (loom_param_table_copy, as a save gathers
// the model file), then takes its own shard and slices: the state a run of the new layout would
// hold had it trained from the start (as torch.distributed.checkpoint reshards a state dict on
// load). With the same tp and pp it reads only its own model shard's files; otherwise every
// rank's. While it loads, a rank holds the state of the whole model in host memory (m, v and the
// master weights: 12 bytes a parameter), which the memory plan does not count.
#include "core/log.h"
#include "train/trainer_internal.h"

#include <stdlib.h>
#include <string.h>

// The checkpoint's model shards are this run's: the same tp, pp and stage placement.
static bool same_model_shards(const loom_trainer *t) {
    const loom_train_state *st = &t->st;
    int V = t->schedule ? t->schedule->V : 1, v_shape = t->schedule && t->schedule->v_shape;
    return st->tp == t->cfg.tp && st->pp == t->cfg.pp && st->virtual_stages == V && st->v_shape == v_shape;
}

bool loom_train_reshards(const loom_trainer *t) {
    const loom_train_state *st = &t->st;
    const loom_train_config *c = &t->cfg;
    return !same_model_shards(t) || st->world_size != t->mesh->world_size || st->zero != c->zero ||
           st->cp != c->cp || st->sp != (int)c->sp || st->dp_replicate != t->mesh->size[LOOM_AXIS_DP_REPLICATE] ||
           st->bucket_elements != loom_dp_bucket_elements(t->dp);
}

// The state's three buffers: m, v and the master weights (NULL when not kept).
typedef struct {
    float *b[3];
} state3;

static state3 state_alloc(int64_t n, bool master) {
    return (state3){{loom_xcalloc((size_t)n, sizeof(float)), loom_xcalloc((size_t)n, sizeof(float)),
                     master ? loom_xcalloc((size_t)n, sizeof(float)) : NULL}};
}

static void state_free(state3 *s) {
    for (int i = 0; i < 3; i++) free(s->b[i]);
}

// The slices of a shard's state buffers into its model shard's flat buffers (to_flat), or back.
static void place(state3 *flat, state3 *state, const loom_param_slice *slices, int n, bool to_flat) {
    for (int k = 0; k < 3; k++)
        for (int i = 0; flat->b[k] && state->b[k] && i < n; i++) {
            size_t bytes = (size_t)slices[i].numel * sizeof(float);
            float *f = flat->b[k] + slices[i].offset, *s = state->b[k] + slices[i].state_offset;
            memcpy(to_flat ? f : s, to_flat ? s : f, bytes);
        }
}

// Old model shard (pp_rank, tp_rank) of the checkpoint into the file-order buffers `file`:
// its shard ranks' files (all of them, or the one of ZeRO 0) into its flat buffers, then those
// into the file's order. *has_master: every file read had master weights; the FP8 scaling state
// of its first file into *fp8 when fp8 is not NULL.
static loom_status read_model_shard(const loom_trainer *t, int pp_rank, int tp_rank, state3 *file, bool *has_master,
                                    float **fp8, int64_t *fp8_n) {
    const loom_train_state *st = &t->st;
    const loom_gpt2_config *cfg = &t->model->cfg;
    int TP = st->tp, CP = st->cp, DR = st->dp_replicate, DS = st->world_size / (st->tp * st->pp * CP * DR);
    int shards = DS * CP;
    loom_param_table table;
    loom_stage stage = loom_train_stage_at(cfg, st->pp, st->virtual_stages, st->v_shape, pp_rank);
    LOOM_TRY(loom_gpt2_param_table(cfg, &stage, tp_rank, TP, &table));
    state3 flat = state_alloc(table.num_elements, file->b[2] != NULL);
    loom_status s = LOOM_OK;
    for (int r = 0; s == LOOM_OK && r < (st->zero == 0 ? 1 : shards); r++) {
        // mesh.h's rank of (pp, dp_replicate 0, dp_shard r / CP, cp r % CP, tp): a shard group's
        // ranks in world order, cp fastest
        int rank = (((pp_rank * DR) * DS + r / CP) * CP + r % CP) * TP + tp_rank;
        loom_param_slice *slices = NULL;
        int n = 0;
        int64_t sn = 0;
        s = loom_dp_layout(&table, shards, r, st->zero, st->bucket_elements, &slices, &n, &sn);
        state3 shard = state_alloc(s == LOOM_OK ? sn : 0, file->b[2] != NULL);
        bool has = false;
        if (s == LOOM_OK)
            s = loom_ckpt_load_state(t->cfg.resume, st, rank, shard.b[0], shard.b[1], shard.b[2], &has, sn,
                                     r == 0 ? fp8 : NULL, r == 0 ? fp8_n : NULL);
        *has_master &= has;
        if (s == LOOM_OK) place(&flat, &shard, slices, n, true);
        state_free(&shard);
        free(slices);
    }
    for (int k = 0; s == LOOM_OK && k < 3; k++)
        if (file->b[k]) loom_param_table_copy(&table, tp_rank, flat.b[k], file->b[k], true);
    state_free(&flat);
    loom_param_table_free(&table);
    return s;
}

loom_status loom_train_load_resharded(const loom_trainer *t, float *m, float *v, float *master, bool *has_master,
                                      float **fp8, int64_t *fp8_n) {
    const loom_train_state *st = &t->st;
    const loom_gpt2 *model = t->model;
    int pp = t->mesh->coord[LOOM_AXIS_PP], tp = t->mesh->coord[LOOM_AXIS_TP];
    bool same_shards = same_model_shards(t);
    state3 file = state_alloc(model->table.file_elements, master != NULL);
    loom_status s = LOOM_OK;
    *has_master = master != NULL;
    for (int p = 0; s == LOOM_OK && p < st->pp; p++)
        for (int r = 0; s == LOOM_OK && r < st->tp; r++) {
            if (same_shards && (p != pp || r != tp)) continue; // the same model shard: its own files hold it
            bool first = same_shards || (p == 0 && r == 0);
            s = read_model_shard(t, p, r, &file, has_master, first ? fp8 : NULL, first ? fp8_n : NULL);
        }
    if (s == LOOM_OK && *fp8_n && !same_shards)
        s = loom_fail(LOOM_EINVAL,
                      "resume with the checkpoint's --pp and --virtual-stages, or start the FP8 run afresh",
                      "checkpoint step %lld holds FP8 delayed scaling's amax histories of its pipeline stages, which "
                      "another pipeline layout cannot take over", (long long)st->step);
    if (s == LOOM_OK) {
        int n;
        const loom_param_slice *slices = loom_dp_slices(t->dp, &n);
        state3 flat = state_alloc(model->table.num_elements, *has_master);
        state3 state = {{m, v, *has_master ? master : NULL}};
        size_t bytes = (size_t)loom_dp_state_elements(t->dp) * sizeof(float); // the pieces' padding zero
        for (int k = 0; k < 3; k++)
            if (state.b[k]) {
                memset(state.b[k], 0, bytes);
                loom_param_table_copy(&model->table, tp, flat.b[k], file.b[k], false);
            }
        place(&flat, &state, slices, n, false);
        state_free(&flat);
        loom_info("note: checkpoint step %lld was saved over %d rank%s (tp %d pp %d cp %d, ZeRO %d, %d data-parallel); "
                  "its optimizer state is resharded onto %d rank%s (tp %d pp %d cp %d, ZeRO %d, %d data-parallel), "
                  "the global batch the same\n", (long long)st->step, st->world_size, loom_plural(st->world_size),
                  st->tp, st->pp, st->cp, st->zero, st->world_size / (st->tp * st->pp * st->cp), t->mesh->world_size,
                  loom_plural(t->mesh->world_size), t->cfg.tp, t->cfg.pp, t->cfg.cp, t->cfg.zero, t->dp_size);
    }
    state_free(&file);
    return s;
}
