// The training step and evaluation; see trainer.h.
#include "core/timer.h"
#include "train/trainer_internal.h"

#include <math.h>

// ---- context parallelism: a micro-batch's tokens are this rank's chunks of its sequences ----
static void cp_batch(void *ctx, uint64_t index, int32_t *inputs, int32_t *targets) {
    loom_trainer *t = ctx;
    t->cp_data(t->cp_data_ctx, index, inputs, targets);
    loom_cp_take_chunks(t->cp, inputs);
    loom_cp_take_chunks(t->cp, targets);
}

// The batch function a step reads: *batch, or with context parallelism cp_batch over it.
static void wrap_batch(loom_trainer *t, loom_batch_fn *batch, void **ctx) {
    if (!t->cp) return;
    t->cp_data = *batch, t->cp_data_ctx = *ctx;
    *batch = cp_batch, *ctx = t;
}

// ---- the model as the pipeline executor drives it ----
static void pipe_load(void *ctx, int slot, int mb, int stage) {
    loom_trainer *t = ctx;
    const loom_pp_schedule *s = t->schedule;
    t->batch(t->batch_ctx, t->batch_first + (uint64_t)mb, t->inputs, t->targets);
    loom_gpt2_set_batch(t->model, slot, stage == 0 ? t->inputs : NULL, stage == s->S - 1 ? t->targets : NULL,
                        t->cfg.batch, loom_train_seq_rows(t));
}

static loom_tensor pipe_forward(void *ctx, int slot, int chunk, loom_tensor input, bool backward, double *loss) {
    loom_trainer *t = ctx;
    return loom_gpt2_stage_forward(t->model, slot, chunk, input, backward, 1.0f / (float)t->grad_accum, loss);
}

static loom_tensor pipe_backward(void *ctx, int slot, int chunk, loom_tensor dout, loom_pp_op op) {
    loom_trainer *t = ctx;
    loom_grad_part part = op == LOOM_PP_I ? LOOM_GRAD_INPUT : op == LOOM_PP_W ? LOOM_GRAD_WEIGHT : LOOM_GRAD_ALL;
    return loom_gpt2_stage_backward(t->model, slot, chunk, dout, part);
}

loom_pp_model loom_train_pipeline_model(loom_trainer *t) {
    return (loom_pp_model){t, pipe_load, pipe_forward, pipe_backward};
}

// After a pipeline's micro-batches: the tied embedding's gradient summed over its two copies
// (the first and the last stage, when they are different ranks), then every layer's gradient
// hooks run as for one synchronised micro-batch: the sequence-parallel sums and the
// data-parallel reductions.
static loom_status pipeline_sync(loom_trainer *t) {
    loom_gpt2 *m = t->model;
    if (m->layout.stage.embed != m->layout.stage.head)
        LOOM_TRY(loom_allreduce(t->mesh->dev[LOOM_GROUP_EMBED], m->g[m->wte].data, (size_t)loom_numel(&m->g[m->wte]),
                                t->be->dtype, LOOM_SUM, NULL));
    if (t->tp) loom_tp_begin_micro_batch(t->tp, true);
    loom_dp_begin_micro_batch(t->dp, m->grads, true, true);
    for (int l = m->cfg.num_layers; l >= -1; l--) loom_hooks_run(&m->hooks, LOOM_HOOK_GRADS, l);
    if (t->tp) LOOM_TRY(loom_tp_error(t->tp));
    return loom_dp_end_micro_batch(t->dp);
}

loom_status loom_train_fp8_begin(loom_trainer *t) {
    if (!t->be->fp8) return LOOM_OK;
    LOOM_TRY(loom_dp_wait_params(t->dp)); // the weights' casts below read every weight at once
    t->be->fp8_begin(t->be);
    loom_gpt2_fp8_weights(t->model);
    return LOOM_OK;
}

loom_status loom_train_fp8_end(loom_trainer *t) {
    loom_backend *be = t->be;
    if (!be->fp8) return LOOM_OK;
    size_t n;
    float *amax = be->fp8_amax(be, &n);
    if (amax && t->dp_size > 1) // (one rank: no copy through the host, and a graph may hold the roll)
        LOOM_TRY(loom_allreduce(t->mesh->dev[LOOM_GROUP_DP], amax, n, LOOM_F32, LOOM_MAX, NULL));
    be->fp8_roll(be);
    return LOOM_OK;
}

loom_status loom_train_backward(loom_trainer *t, loom_batch_fn batch, void *ctx, loom_step_result *out) {
    const loom_train_config *c = &t->cfg;
    loom_gpt2 *m = t->model;
    int A = t->grad_accum, B = c->batch, T = loom_train_seq_rows(t);
    wrap_batch(t, &batch, &ctx);
    uint64_t first = loom_train_first_micro_batch(t);
    loom_gpt2_zero_grads(m);
    LOOM_TRY(loom_train_fp8_begin(t));
    double sum = 0;
    if (t->pipe) { // the schedule's actions over the A micro-batches, then one reduction
        t->batch = batch, t->batch_ctx = ctx, t->batch_first = first;
        if (t->tp) loom_tp_begin_micro_batch(t->tp, false);
        loom_dp_begin_micro_batch(t->dp, m->grads, true, false);
        LOOM_TRY(loom_pp_run(t->pipe, t->timed, &sum));
        if (t->tp) LOOM_TRY(loom_tp_error(t->tp));
        if (t->cp) LOOM_TRY(loom_cp_error(t->cp));
        if (t->fsdp) LOOM_TRY(loom_fsdp_error(t->fsdp));
        LOOM_TRY(pipeline_sync(t));
        LOOM_TRY(loom_allreduce(t->mesh->host[LOOM_GROUP_PP], &sum, 1, LOOM_F64, LOOM_SUM, NULL)); // the last stage's
    } else
        for (int a = 0; a < A; a++) {
            batch(ctx, first + (uint64_t)a, t->inputs, t->targets);
            if (t->tp) loom_tp_begin_micro_batch(t->tp, loom_dp_syncs(t->dp, a, A));
            loom_dp_begin_micro_batch(t->dp, m->grads, a == 0, loom_dp_syncs(t->dp, a, A));
            sum += loom_gpt2_forward_backward(m, t->inputs, t->targets, B, T, 1.0f / (float)A);
            if (t->tp) LOOM_TRY(loom_tp_error(t->tp));
            if (t->cp) LOOM_TRY(loom_cp_error(t->cp));
            if (t->fsdp) LOOM_TRY(loom_fsdp_error(t->fsdp));
            LOOM_TRY(loom_dp_end_micro_batch(t->dp));
        }
    LOOM_TRY(loom_train_fp8_end(t));
    out->loss = sum / A; // each cp rank's is the mean over its chunks: the average is the sequences'
    double w0 = loom_now(); // the losses were read back: this rank's micro-batches are done
    LOOM_TRY(loom_allreduce(t->mesh->host[LOOM_GROUP_DP_CP], &out->loss, 1, LOOM_F64, LOOM_AVG, NULL));
    t->time_wait = loom_now() - w0;
    double sumsq;
    LOOM_TRY(loom_dp_reduced_grads(t->dp, &t->reduced, &sumsq));
    LOOM_TRY(loom_allreduce(t->mesh->host[LOOM_GROUP_MP], &sumsq, 1, LOOM_F64, LOOM_SUM, NULL)); // each parameter once
    if (t->timed) t->be->synchronize(t->be); // the update's time apart
    out->norm = sqrt(sumsq);
    out->lr = loom_lr_at(&c->lr, t->st.step);
    return LOOM_OK;
}

uint64_t loom_train_first_micro_batch(const loom_trainer *t) {
    uint64_t per_step = (uint64_t)(t->cfg.global_batch / t->cfg.batch);
    return (uint64_t)t->st.step * per_step + (uint64_t)t->dp_rank * (uint64_t)t->grad_accum;
}

// Past step t->st.step: the next step and its data.
static void advance(loom_trainer *t) {
    t->st.step++;
    t->st.data_position = t->st.step * (int64_t)(t->cfg.global_batch / t->cfg.batch);
}

loom_status loom_train_update(loom_trainer *t, const loom_step_result *r) {
    const loom_train_config *c = &t->cfg;
    loom_gpt2 *m = t->model;
    double t0 = loom_now();
    loom_adamw_step(t->opt, loom_train_params(t, NULL), t->reduced, r->lr, &c->adamw,
                    loom_clip_scale(r->norm, c->adamw.grad_clip));
    LOOM_TRY(loom_dp_gather_params(t->dp, m->params));
    if (t->fsdp) loom_fsdp_reshard(t->fsdp); // the gathered units are the old parameters
    if (t->timed) t->be->synchronize(t->be);
    t->time_opt = loom_now() - t0;
    loom_train_updated(t, r);
    return LOOM_OK;
}

void loom_train_updated(loom_trainer *t, const loom_step_result *r) {
    t->st.train_loss = r->loss;
    advance(t);
}

void loom_train_skip(loom_trainer *t) {
    if (t->fsdp) loom_fsdp_reshard(t->fsdp); // hands the gradient buffers back
    t->opt->t++; // the bias correction counts the step, as llm.c's skipped updates do
    advance(t);
}

loom_status loom_train_step_ops(loom_trainer *t, loom_batch_fn batch, void *ctx, loom_step_result *out) {
    LOOM_TRY(loom_train_backward(t, batch, ctx, out));
    out->skipped = !isfinite(out->loss) || !isfinite(out->norm);
    if (!out->skipped) return loom_train_update(t, out);
    loom_train_skip(t);
    return LOOM_OK;
}

loom_status loom_train_step(loom_trainer *t, loom_batch_fn batch, void *ctx, loom_step_result *out) {
    if (t->graph) return loom_step_graph_step(t, batch, ctx, out); // --cuda-graphs: step_graph.c
    return loom_train_step_ops(t, batch, ctx, out);
}

loom_status loom_train_eval(loom_trainer *t, loom_batch_fn batch, void *ctx, int n, double *loss) {
    double sum = 0;
    wrap_batch(t, &batch, &ctx);
    t->batch = batch, t->batch_ctx = ctx, t->batch_first = 0;
    int rounds = (n + t->dp_size - 1) / t->dp_size;
    for (int j = 0; j < rounds; j++) {
        int i = t->dp_rank + j * t->dp_size;
        if (i >= n && !t->fsdp) break;
        // ZeRO 3's gathers are collective: a rank out of batches runs batch 0 again, unused
        int b = i < n ? i : 0;
        double l = 0;
        if (t->pipe) LOOM_TRY(loom_pp_forward(t->pipe, b, &l));
        else {
            batch(ctx, (uint64_t)b, t->inputs, t->targets);
            l = loom_gpt2_loss(t->model, t->inputs, t->targets, t->cfg.batch, loom_train_seq_rows(t));
        }
        sum += i < n ? l : 0;
        if (t->tp) LOOM_TRY(loom_tp_error(t->tp));
        if (t->cp) LOOM_TRY(loom_cp_error(t->cp));
        if (t->fsdp) LOOM_TRY(loom_fsdp_error(t->fsdp));
    }
    LOOM_TRY(loom_allreduce(t->mesh->host[LOOM_GROUP_DP_CP], &sum, 1, LOOM_F64, LOOM_SUM, NULL));
    if (t->pipe) LOOM_TRY(loom_allreduce(t->mesh->host[LOOM_GROUP_PP], &sum, 1, LOOM_F64, LOOM_SUM, NULL));
    *loss = sum / n / t->mesh->size[LOOM_AXIS_CP]; // each cp rank's loss covers its chunks
    return LOOM_OK;
}
