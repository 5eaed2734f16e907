// The training step and evaluation; see trainer.h.
#include "core/timer.h"
#include "train/trainer.h"

#include <math.h>

loom_status loom_train_backward(loom_trainer *t, loom_batch_fn batch, void *ctx, loom_step_result *out) {
    const loom_train_config *c = &t->cfg;
    loom_gpt2 *m = t->model;
    int A = t->grad_accum, B = c->batch, T = t->st.seq_len;
    uint64_t first = (uint64_t)t->st.step * (uint64_t)(c->global_batch / B) + (uint64_t)t->dp_rank * (uint64_t)A;
    double t0 = loom_now();
    loom_gpt2_zero_grads(m);
    double sum = 0;
    for (int a = 0; a < A; a++) {
        batch(ctx, first + (uint64_t)a, t->inputs, t->targets);
        if (t->tp) loom_tp_begin_micro_batch(t->tp, loom_dp_syncs(t->dp, a, A));
        loom_dp_begin_micro_batch(t->dp, m->grads, a, A);
        sum += loom_gpt2_forward_backward(m, t->inputs, t->targets, B, T, 1.0f / (float)A);
        if (t->tp) LOOM_TRY(loom_tp_error(t->tp));
        LOOM_TRY(loom_dp_end_micro_batch(t->dp));
    }
    out->loss = sum / A;
    LOOM_TRY(loom_allreduce(t->mesh->host[LOOM_GROUP_DP], &out->loss, 1, LOOM_F64, LOOM_AVG, NULL));
    if (t->timed) t->be->synchronize(t->be);
    t->time_fwd_bwd = loom_now() - t0;
    double sumsq;
    LOOM_TRY(loom_dp_reduced_grads(t->dp, &t->reduced, &sumsq));
    LOOM_TRY(loom_allreduce(t->mesh->host[LOOM_GROUP_MP], &sumsq, 1, LOOM_F64, LOOM_SUM, NULL)); // each parameter once
    out->norm = sqrt(sumsq);
    out->lr = loom_lr_at(&c->lr, t->st.step);
    return LOOM_OK;
}

loom_status loom_train_update(loom_trainer *t, const loom_step_result *r) {
    const loom_train_config *c = &t->cfg;
    loom_gpt2 *m = t->model;
    double t0 = loom_now();
    loom_adamw_step(t->opt, m->params, t->reduced, r->lr, &c->adamw, loom_clip_scale(r->norm, c->adamw.grad_clip));
    LOOM_TRY(loom_dp_gather_params(t->dp, m->params));
    if (t->timed) t->be->synchronize(t->be);
    t->time_opt = loom_now() - t0;
    t->st.step++;
    t->st.data_position = t->st.step * (int64_t)(c->global_batch / c->batch);
    t->st.train_loss = r->loss;
    return LOOM_OK;
}

loom_status loom_train_step(loom_trainer *t, loom_batch_fn batch, void *ctx, loom_step_result *out) {
    LOOM_TRY(loom_train_backward(t, batch, ctx, out));
    return loom_train_update(t, out);
}

loom_status loom_train_eval(loom_trainer *t, loom_batch_fn batch, void *ctx, int n, double *loss) {
    double sum = 0;
    for (int i = t->dp_rank; i < n; i += t->dp_size) {
        batch(ctx, (uint64_t)i, t->inputs, t->targets);
        sum += loom_gpt2_loss(t->model, t->inputs, t->targets, t->cfg.batch, t->st.seq_len);
        if (t->tp) LOOM_TRY(loom_tp_error(t->tp));
    }
    LOOM_TRY(loom_allreduce(t->mesh->host[LOOM_GROUP_DP], &sum, 1, LOOM_F64, LOOM_SUM, NULL));
    *loss = sum / n;
    return LOOM_OK;
}
