// `loom train`: the loop — validate / sample / step / log / checkpoint — on every rank of the
// data-parallel world (set-up in train_setup.c). Launch with `mpirun -np N loom train ...` for
// N ranks; each rank reads its own slice of every global batch.
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/train.h"
#include "core/fault.h"
#include "core/log.h"
#include "core/timer.h"
#include "model/generate.h"

#include <cjson/cJSON.h>
#include <math.h>

static void log_metrics(trainer *t, const char *const *keys, const double *vals, int n) {
    if (!t->metrics) return;
    cJSON *j = cJSON_CreateObject();
    for (int i = 0; i < n; i++) cJSON_AddNumberToObject(j, keys[i], vals[i]);
    char *line = cJSON_PrintUnformatted(j);
    fprintf(t->metrics, "%s\n", line);
    fflush(t->metrics);
    free(line);
    cJSON_Delete(j);
}

// Mean loss over the first --val-batches micro-batches; rank r takes batches r, r+W, ...
static loom_status val_loss(trainer *t, double *loss) {
    double sum = 0;
    for (int i = t->rank; i < t->o.val_batches; i += t->world_size) {
        loom_loader_get(t->val, (uint64_t)i, t->inputs, t->targets);
        sum += loom_gpt2_loss(t->model, t->inputs, t->targets, t->o.batch, t->st.seq_len);
    }
    LOOM_TRY(loom_allreduce(t->world, &sum, 1, LOOM_F64, LOOM_SUM, NULL));
    *loss = sum / t->o.val_batches;
    return LOOM_OK;
}

static loom_status validate(trainer *t, int64_t step) {
    if (!t->val) return LOOM_OK;
    double loss;
    LOOM_TRY(val_loss(t, &loss));
    loom_info("val loss %.4f (step %lld)\n", loss, (long long)step);
    log_metrics(t, (const char *[]){"step", "val_loss"}, (double[]){(double)step, loss}, 2);
    return LOOM_OK;
}

static void sample(trainer *t, int64_t step) {
    if (t->rank != 0) return;
    int n = t->o.sample_tokens;
    int32_t *tokens = loom_xmalloc((size_t)(n + 1) * sizeof(int32_t));
    tokens[0] = LOOM_EOT;
    loom_sampling s = {.temperature = 1.0f, .top_k = 40, .seed = t->st.seed + (uint64_t)step};
    loom_info("sample (step %lld): ", (long long)step);
    loom_generate(t->model, tokens, 1, n, &s, cli_print_token, t->tok);
    loom_info("\n");
    free(tokens);
}

// One optimizer step over the global batch: this rank's A micro-batches (the gradient
// reduction overlapping backward), the reduced gradients and their global norm, AdamW on this
// rank's state, the parameters gathered back.
static loom_status train_step(trainer *t, double *loss, double *norm, float *lr) {
    const train_options *o = &t->o;
    int A = o->grad_accum;
    uint64_t per_step = (uint64_t)(o->global_batch / o->batch);
    uint64_t first = (uint64_t)t->st.step * per_step + (uint64_t)t->rank * (uint64_t)A;
    loom_gpt2_zero_grads(t->model);
    double sum = 0;
    for (int a = 0; a < A; a++) {
        loom_loader_get(t->train, first + (uint64_t)a, t->inputs, t->targets);
        loom_dp_begin_micro_batch(t->dp, t->model->grads, a, A);
        sum += loom_gpt2_forward_backward(t->model, t->inputs, t->targets, o->batch, t->st.seq_len,
                                          1.0f / (float)A);
        LOOM_TRY(loom_dp_end_micro_batch(t->dp));
    }
    *loss = sum / A;
    LOOM_TRY(loom_allreduce(t->world, loss, 1, LOOM_F64, LOOM_AVG, NULL));
    void *grads;
    LOOM_TRY(loom_dp_reduced_grads(t->dp, &grads, norm));
    *lr = loom_lr_at(&o->lr, t->st.step);
    loom_adamw_step(t->opt, t->model->params, grads, *lr, &o->adamw, loom_clip_scale(*norm, o->adamw.grad_clip));
    LOOM_TRY(loom_dp_gather_params(t->dp, t->model->params));
    t->st.data_position = (t->st.step + 1) * (int64_t)per_step;
    return LOOM_OK;
}

// Failures inside the loop are the same on every rank (the loss is global, collectives fail
// everywhere) except checkpoint saves, which agree on who reports.
static loom_status train_loop(trainer *t, bool *report) {
    const train_options *o = &t->o;
    double tokens_per_step = (double)o->global_batch * t->st.seq_len, t_start = loom_now();
    int64_t first = t->st.step;
    *report = t->rank == 0;
    while (t->st.step < o->steps) {
        int64_t step = t->st.step;
        if (o->val_every && step % o->val_every == 0) LOOM_TRY(validate(t, step));
        if (o->sample_every && step > 0 && step % o->sample_every == 0) sample(t, step);
        double t0 = loom_now(), loss, norm;
        float lr;
        LOOM_TRY(train_step(t, &loss, &norm, &lr));
        double dt = loom_now() - t0;
        double eta_s = (loom_now() - t_start) / (double)(step + 1 - first) * (double)(o->steps - step - 1);
        t->st.step++;
        t->st.train_loss = loss;
        if (!isfinite(loss))
            return loom_fail(LOOM_EINVAL, "lower --lr or raise --warmup", "loss is %g at step %lld",
                             loss, (long long)t->st.step);
        char eta[32];
        cli_human_duration(eta, sizeof eta, eta_s);
        loom_info("step %5lld/%lld | loss %.4f | lr %.2e | norm %.4f | %.1f ms | %.0f tok/s | eta %s\n",
                  (long long)t->st.step, (long long)o->steps, loss, (double)lr, norm, dt * 1e3,
                  tokens_per_step / dt, eta);
        log_metrics(t, (const char *[]){"step", "loss", "lr", "grad_norm", "step_time_s", "tokens_per_s"},
                    (double[]){(double)t->st.step, loss, lr, norm, dt, tokens_per_step / dt}, 6);
        loom_fault_point("step");
        if (o->ckpt_dir && o->ckpt_every && t->st.step % o->ckpt_every == 0 && t->st.step < o->steps)
            LOOM_TRY(train_checkpoint(t, report));
    }
    LOOM_TRY(validate(t, t->st.step));
    if (o->sample_every) sample(t, t->st.step);
    char peak[32];
    cli_human_bytes(peak, sizeof peak, (double)t->be->peak_bytes);
    loom_info("peak memory %s on rank 0's %s (allocations of the backend)\n", peak, t->be->name);
    return o->ckpt_dir ? train_checkpoint(t, report) : LOOM_OK;
}

int loom_cmd_train(int argc, char **argv) {
    trainer t = {0};
    loom_status s = loom_comm_world(&argc, &argv, &t.world);
    if (s != LOOM_OK) {
        loom_print_error();
        return 1;
    }
    t.rank = loom_comm_rank(t.world);
    t.world_size = loom_comm_size(t.world);
    loom_log_set_rank(t.rank, t.world_size);
    bool help = false, report = true;
    s = train_options_parse(&t.o, argc, argv, t.world_size, &help);
    if (s == LOOM_OK && !help) s = train_setup(&t);
    s = loom_comm_agree(t.world, s, &report); // one line from the lowest failing rank
    if (s == LOOM_OK && !help) {
        train_print_config(&t);
        s = train_loop(&t, &report);
    }
    if (s != LOOM_OK && report) loom_print_error();
    train_teardown(&t);
    loom_comm_finalize(t.world);
    return s == LOOM_OK ? 0 : 1;
}
