// A trainer's checkpoints; see trainer.h and ckpt/checkpoint.h.
#include "core/heartbeat.h"
#include "core/log.h"
#include "train/trainer_internal.h"

#include <math.h>
#include <string.h>

// value must be the same, bit for bit, on every rank of group c.
static loom_status same_over(loom_trainer *t, loom_comm *c, double value, const char *what) {
    int n = loom_comm_size(c);
    double *all = loom_xmalloc((size_t)n * sizeof(double));
    loom_status s = loom_allgather(c, &value, all, 1, LOOM_F64, NULL);
    for (int r = 1; s == LOOM_OK && r < n; r++)
        if (memcmp(&all[r], &all[0], sizeof(double)) != 0)
            s = loom_fail(LOOM_EINVAL, "a parallelism bug: please report it",
                          "%s of rank %d of its group differ from its rank 0's at step %lld", what, r,
                          (long long)t->st.step);
    free(all);
    return s;
}

// Sum of squares of tensor p of this rank's parameters (host fp32, table order), in order.
static double tensor_sumsq(const loom_param *p, const float *flat) {
    double total = 0;
    for (int64_t k = 0; k < p->local_numel; k++) total += (double)flat[p->offset + k] * flat[p->offset + k];
    return total;
}

// The same over the table's tensors: the replicated ones only or all, in table order.
static double sumsq(const loom_param_table *table, const float *flat, bool replicated_only) {
    double total = 0;
    for (int i = 0; i < table->count; i++)
        if (!replicated_only || table->params[i].shard.kind == LOOM_SHARD_REPLICATED)
            total += tensor_sumsq(&table->params[i], flat);
    return total;
}

// Every data-parallel replica and context-parallel rank holds the same parameters (replicated, or gathered after ZeRO's
// update), every tp rank the same replicated tensors, and the two ends of a pipeline the same
// tied embedding: their sums of squares, computed in a fixed order, must agree bit for bit.
static loom_status check_replicas(loom_trainer *t, const float *flat) {
    const loom_gpt2 *m = t->model;
    LOOM_TRY(same_over(t, t->mesh->host[LOOM_GROUP_DP_CP], sumsq(&m->table, flat, false), "parameters"));
    LOOM_TRY(same_over(t, t->mesh->host[LOOM_GROUP_TP], sumsq(&m->table, flat, true), "replicated tensors"));
    if (m->layout.stage.embed == m->layout.stage.head) return LOOM_OK;
    return same_over(t, t->mesh->host[LOOM_GROUP_EMBED], tensor_sumsq(&m->table.params[m->wte], flat), "tied embeddings");
}

// The parameter table of model-parallel rank r (tp x pp, tp fastest) of this trainer's mesh.
static loom_status table_of(const loom_trainer *t, int r, loom_param_table *table) {
    loom_stage stage = loom_train_stage_of(t, &t->model->cfg, r / t->cfg.tp);
    return loom_gpt2_param_table(&t->model->cfg, &stage, r % t->cfg.tp, t->cfg.tp, table);
}

// Replica 0's model-parallel ranks gather their parameters (flat: host fp32, table order), each
// padded to the largest; rank 0 places each in the whole model file by that rank's table and
// writes it.
static loom_status save_model(loom_trainer *t, const char *dir, const float *flat) {
    if (t->dp_rank != 0) return LOOM_OK;
    const loom_gpt2 *m = t->model;
    loom_comm *mp = t->mesh->host[LOOM_GROUP_MP];
    int P = loom_comm_size(mp);
    loom_param_table *tables = loom_xcalloc((size_t)P, sizeof *tables);
    int64_t most = 0;
    loom_status s = LOOM_OK;
    for (int r = 0; r < P && s == LOOM_OK; r++) {
        s = table_of(t, r, &tables[r]);
        if (s == LOOM_OK && tables[r].num_elements > most) most = tables[r].num_elements;
    }
    float *local = loom_xcalloc((size_t)most, sizeof(float)), *all = loom_xmalloc((size_t)most * (size_t)P * sizeof(float));
    memcpy(local, flat, (size_t)m->num_elements * sizeof(float));
    if (s == LOOM_OK) s = loom_allgather(mp, local, all, (size_t)most, LOOM_F32, NULL);
    if (s == LOOM_OK && t->mesh->rank == 0) {
        float *file = loom_xcalloc((size_t)m->table.file_elements, sizeof(float));
        for (int r = 0; r < P; r++) loom_param_table_copy(&tables[r], r % t->cfg.tp, all + (size_t)r * (size_t)most, file, true);
        s = loom_ckpt_save_model(dir, &t->st, &m->cfg, file, m->table.file_elements);
        free(file);
    }
    for (int r = 0; r < P; r++) loom_param_table_free(&tables[r]);
    free(tables);
    free(local);
    free(all);
    return s;
}

// This rank's optimizer state (ZeRO 0: replica 0's ranks hold the state of their shard), and
// its FP8 delayed scaling's histories (the same on every data-parallel rank of its shard).
static loom_status save_state(loom_trainer *t, const char *dir) {
    if (t->cfg.zero == 0 && t->dp_rank != 0) return LOOM_OK;
    int64_t sn = loom_dp_state_elements(t->dp);
    size_t bytes = (size_t)sn * sizeof(float);
    float *m = loom_xmalloc(bytes), *v = loom_xmalloc(bytes), *master = t->opt->master ? loom_xmalloc(bytes) : NULL;
    loom_backend *be = t->opt->state_be, *fp8_be = t->be;
    be->download(be, m, t->opt->m, bytes);
    be->download(be, v, t->opt->v, bytes);
    if (master) loom_adamw_master_get(t->opt, loom_train_params(t, NULL), master);
    size_t fn = fp8_be->fp8_history ? fp8_be->fp8_save(fp8_be, NULL) : 0;
    float *fp8 = fn ? loom_xmalloc(fn * sizeof(float)) : NULL;
    if (fn) fp8_be->fp8_save(fp8_be, fp8);
    loom_status s = loom_ckpt_save_state(dir, &t->st, t->mesh->rank, m, v, master, sn, fp8, (int64_t)fn);
    free(m);
    free(v);
    free(master);
    free(fp8);
    return s;
}

// Parameters that are NaN or infinite are never saved. Errors: LOOM_EINVAL naming the step.
static loom_status check_finite(const loom_trainer *t, const float *flat) {
    double total = sumsq(&t->model->table, flat, false);
    if (isfinite(total)) return LOOM_OK;
    return loom_fail(LOOM_EINVAL, "lower --lr or raise --warmup; resume from the last checkpoint",
                     "the parameters at step %lld are not finite (sum of squares %g): no checkpoint written",
                     (long long)t->st.step, total);
}

loom_status loom_trainer_save(loom_trainer *t, const char *dir, bool *report) {
    const loom_gpt2 *m = t->model;
    loom_heartbeat_phase("save", t->st.step); // loom launch's watchdog: where each rank is
    float *flat = loom_xmalloc((size_t)m->num_elements * sizeof(float)); // ZeRO 3: gathered unit by unit
    loom_status s = t->fsdp ? loom_fsdp_gather_params(t->fsdp, flat) : loom_dp_wait_params(t->dp);
    if (!t->fsdp) loom_gpt2_download(m, m->params, flat);
    if (s == LOOM_OK) s = check_finite(t, flat);
    s = loom_comm_agree(t->world, s, report); // on every rank, before the save's first collective
    if (s == LOOM_OK) s = check_replicas(t, flat);
    if (s == LOOM_OK) s = save_model(t, dir, flat);
    free(flat);
    if (s == LOOM_OK) s = save_state(t, dir);
    if (s == LOOM_OK) s = loom_comm_launcher_check(); // mpirun gone: the job was stopped, commit nothing
    LOOM_TRY(loom_comm_agree(t->world, s, report));
    t->st.lr_total_steps = t->cfg.lr.total;
    if (t->mesh->rank == 0) s = loom_ckpt_save_meta(dir, &t->st, &t->model->cfg, &t->model->table);
    LOOM_TRY(loom_comm_agree(t->world, s, report));
    loom_info("checkpoint %s/model_%08lld.bin\n", dir, (long long)t->st.step);
    return LOOM_OK;
}
