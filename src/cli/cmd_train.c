// `loom train`: set up (backend, model, optimizer, data, checkpoint), print the run's
// configuration, then the loop: validate / sample / step / log / checkpoint.
#include "ckpt/checkpoint.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/train_options.h"
#include "core/fault.h"
#include "core/log.h"
#include "core/timer.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "model/generate.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <string.h>
#include <sys/stat.h>

typedef struct {
    train_options o;
    loom_backend *be;
    loom_gpt2 *model;
    loom_adamw *opt;
    loom_loader *train, *val;
    loom_tokenizer *tok;       // only when sampling
    FILE *metrics;
    loom_train_state st;       // step, data position, seed, batch layout
    int32_t *inputs, *targets; // (B,T) host
} trainer;

// ---- set-up ----

static loom_status create_optimizer(trainer *t) {
    loom_param_range ranges[LOOM_GPT2_NUM_TENSORS];
    for (int i = 0; i < LOOM_GPT2_NUM_TENSORS; i++) {
        const loom_param_spec *s = &t->model->specs[i];
        ranges[i] = (loom_param_range){s->offset, s->numel, s->weight_decay};
    }
    return loom_adamw_create(&t->opt, t->be, t->model->num_elements, ranges, LOOM_GPT2_NUM_TENSORS);
}

// Resume: model, moments and progress from the newest checkpoint of --ckpt-dir.
static loom_status resume(trainer *t, int64_t step) {
    const train_options *o = &t->o;
    loom_gpt2_config cfg;
    float *params, *m, *v;
    int64_t n;
    LOOM_TRY(loom_ckpt_load(o->ckpt_dir, step, &t->st, &cfg, &params, &m, &v, &n));
    loom_status s = LOOM_OK;
    if (t->st.micro_batch != o->batch || t->st.grad_accum != o->grad_accum ||
        (o->seq && o->seq != t->st.seq_len))
        s = loom_fail(LOOM_EINVAL, "resume with the checkpoint's --batch, --seq and --global-batch",
                      "checkpoint step %lld was trained with B=%d T=%d accumulation %d, not B=%d T=%d "
                      "accumulation %d", (long long)step, t->st.micro_batch, t->st.seq_len,
                      t->st.grad_accum, o->batch, o->seq ? o->seq : t->st.seq_len, o->grad_accum);
    if (s == LOOM_OK) s = loom_gpt2_create(&t->model, t->be, &cfg);
    if (s == LOOM_OK) s = create_optimizer(t);
    if (s == LOOM_OK) {
        loom_gpt2_set_params(t->model, params);
        t->be->upload(t->be, t->opt->m, m, (size_t)n * sizeof(float));
        t->be->upload(t->be, t->opt->v, v, (size_t)n * sizeof(float));
        t->opt->t = t->st.step;
    }
    free(params);
    free(m);
    free(v);
    return s;
}

// Fresh run: an llm.c model file or a named config with GPT-2 initialisation from --seed.
static loom_status start(trainer *t) {
    const train_options *o = &t->o;
    if (o->init) {
        LOOM_TRY(cli_load_model(t->be, o->init, &t->model));
    } else {
        loom_gpt2_config cfg;
        LOOM_TRY(cli_model_config(o->model, o->layers, o->heads, o->channels, o->max_seq, &cfg));
        LOOM_TRY(loom_gpt2_create(&t->model, t->be, &cfg));
        loom_gpt2_init(t->model, (uint64_t)o->seed);
    }
    t->st = (loom_train_state){.seed = (uint64_t)o->seed, .micro_batch = o->batch,
                               .seq_len = o->seq ? o->seq : t->model->cfg.max_seq_len,
                               .grad_accum = o->grad_accum, .world_size = 1};
    return create_optimizer(t);
}

static loom_status setup(trainer *t) {
    const train_options *o = &t->o;
    LOOM_TRY(cli_open_backend(o->device, o->threads, &t->be));
    if (o->ckpt_dir && mkdir(o->ckpt_dir, 0755) != 0 && errno != EEXIST)
        return loom_fail(LOOM_EIO, "check --ckpt-dir", "cannot create checkpoint folder %s: %s",
                         o->ckpt_dir, strerror(errno));
    int64_t step = -1;
    if (o->resume) LOOM_TRY(loom_ckpt_latest(o->ckpt_dir, &step));
    LOOM_TRY(step >= 0 ? resume(t, step) : start(t));
    int B = o->batch, T = t->st.seq_len, V = t->model->cfg.vocab_size;
    LOOM_TRY(loom_gpt2_alloc(t->model, B, T, true));
    LOOM_TRY(loom_loader_open(&t->train, o->train_data, B, T, V, o->shuffle, t->st.seed));
    if (o->val_data) {
        LOOM_TRY(loom_loader_open(&t->val, o->val_data, B, T, V, false, t->st.seed));
        uint64_t have = loom_loader_num_batches(t->val);
        if ((uint64_t)t->o.val_batches > have) {
            loom_info("note: validation uses all %llu micro-batches of %s (--val-batches %d)\n",
                      (unsigned long long)have, o->val_data, t->o.val_batches);
            t->o.val_batches = (int)have;
        }
    }
    if (o->sample_every) LOOM_TRY(loom_tokenizer_load(&t->tok, NULL));
    if (o->metrics && !(t->metrics = fopen(o->metrics, step >= 0 ? "a" : "w")))
        return loom_fail(LOOM_EIO, "check --metrics", "cannot open metrics file %s: %s", o->metrics,
                         strerror(errno));
    t->inputs = loom_xmalloc((size_t)B * T * sizeof(int32_t));
    t->targets = loom_xmalloc((size_t)B * T * sizeof(int32_t));
    return LOOM_OK;
}

static void print_config(const trainer *t) {
    const train_options *o = &t->o;
    const loom_gpt2_config *c = &t->model->cfg;
    int B = o->batch, T = t->st.seq_len;
    char n[32], tok[32], mem[32], opt_mem[32];
    cli_human_count(n, sizeof n, (double)loom_gpt2_num_params(c));
    cli_human_count(tok, sizeof tok, (double)loom_loader_num_tokens(t->train));
    cli_human_bytes(mem, sizeof mem, (double)loom_gpt2_memory_bytes(t->model));
    cli_human_bytes(opt_mem, sizeof opt_mem, 8.0 * (double)t->model->num_elements);
    cli_table_rule();
    cli_table_row("model", "%s: L=%d NH=%d C=%d maxT=%d V=%d (padded %d)",
                  o->init ? o->init : (o->resume && t->st.step ? "resumed" : o->model), c->num_layers,
                  c->num_heads, c->channels, c->max_seq_len, c->vocab_size, c->padded_vocab_size);
    cli_table_row("parameters", "%s", n);
    cli_table_row("micro-batch", "B=%d x T=%d = %d tokens", B, T, B * T);
    cli_table_row("global batch", "%d sequences = %d tokens (accumulation %d)", o->global_batch,
                  o->global_batch * T, o->grad_accum);
    cli_table_row("steps", "%lld (from step %lld), %.3g tokens", (long long)o->steps,
                  (long long)t->st.step, (double)o->steps * o->global_batch * T);
    cli_table_row("schedule", "%s, lr %.3g -> %.3g, warmup %d", o->schedule, (double)o->lr.max_lr,
                  (double)o->lr.min_lr, o->warmup);
    cli_table_row("optimizer", "AdamW b1 %g b2 %g eps %g wd %g, clip %g", (double)o->adamw.beta1,
                  (double)o->adamw.beta2, (double)o->adamw.eps, (double)o->adamw.weight_decay,
                  (double)o->adamw.grad_clip);
    cli_table_row("train data", "%s (%s tokens%s)", o->train_data, tok, o->shuffle ? ", shuffled" : "");
    if (o->val_data)
        cli_table_row("val data", "%s: %d batches, every %d steps", o->val_data, o->val_batches,
                      o->val_every);
    if (o->ckpt_dir) cli_table_row("checkpoints", "%s every %d steps", o->ckpt_dir, o->ckpt_every);
    cli_table_row("seed", "%llu", (unsigned long long)t->st.seed);
    cli_table_row("device", "%s, %d threads", t->be->name, omp_get_max_threads());
    cli_table_row("memory", "%s model + activations, %s AdamW moments", mem, opt_mem);
    cli_table_rule();
}

// ---- the loop ----

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

static double val_loss(trainer *t) {
    double sum = 0;
    for (int i = 0; i < t->o.val_batches; i++) {
        loom_loader_get(t->val, (uint64_t)i, t->inputs, t->targets);
        sum += loom_gpt2_loss(t->model, t->inputs, t->targets, t->o.batch, t->st.seq_len);
    }
    return sum / t->o.val_batches;
}

static void validate(trainer *t, int64_t step) {
    if (!t->val) return;
    double loss = val_loss(t);
    loom_info("val loss %.4f (step %lld)\n", loss, (long long)step);
    log_metrics(t, (const char *[]){"step", "val_loss"}, (double[]){(double)step, loss}, 2);
}


static void sample(trainer *t, int64_t step) {
    int n = t->o.sample_tokens;
    int32_t *tokens = loom_xmalloc((size_t)(n + 1) * sizeof(int32_t));
    tokens[0] = LOOM_EOT;
    loom_sampling s = {.temperature = 1.0f, .top_k = 40, .seed = t->st.seed + (uint64_t)step};
    loom_info("sample (step %lld): ", (long long)step);
    loom_generate(t->model, tokens, 1, n, &s, cli_print_token, t->tok);
    loom_info("\n");
    free(tokens);
}

// One optimizer step over the global batch: grad_accum micro-batches, clip, AdamW.
static double train_step(trainer *t, double *norm, float *lr) {
    const train_options *o = &t->o;
    int A = o->grad_accum;
    loom_gpt2_zero_grads(t->model);
    double loss = 0;
    for (int a = 0; a < A; a++) {
        loom_loader_get(t->train, (uint64_t)t->st.data_position++, t->inputs, t->targets);
        loss += loom_gpt2_forward_backward(t->model, t->inputs, t->targets, o->batch,
                                           t->st.seq_len, 1.0f / (float)A);
    }
    *norm = loom_grad_norm(t->be, t->model->grads, t->model->num_elements);
    *lr = loom_lr_at(&o->lr, t->st.step);
    loom_adamw_step(t->opt, t->model->params, t->model->grads, *lr, &o->adamw,
                    loom_clip_scale(*norm, o->adamw.grad_clip));
    return loss / A;
}

static loom_status checkpoint(trainer *t) {
    int64_t n = t->model->num_elements;
    float *params = loom_xmalloc((size_t)n * sizeof(float));
    float *m = loom_xmalloc((size_t)n * sizeof(float)), *v = loom_xmalloc((size_t)n * sizeof(float));
    loom_gpt2_get_params(t->model, params);
    t->be->download(t->be, m, t->opt->m, (size_t)n * sizeof(float));
    t->be->download(t->be, v, t->opt->v, (size_t)n * sizeof(float));
    loom_status s = loom_ckpt_save(t->o.ckpt_dir, &t->st, &t->model->cfg, params, m, v, n);
    if (s == LOOM_OK)
        loom_info("checkpoint %s/model_%08lld.bin\n", t->o.ckpt_dir, (long long)t->st.step);
    free(params);
    free(m);
    free(v);
    return s;
}

static loom_status train_loop(trainer *t) {
    const train_options *o = &t->o;
    double tokens_per_step = (double)o->global_batch * t->st.seq_len, t_start = loom_now();
    int64_t first = t->st.step;
    for (; t->st.step < o->steps; ) {
        int64_t step = t->st.step;
        if (o->val_every && step % o->val_every == 0) validate(t, step);
        if (o->sample_every && step > 0 && step % o->sample_every == 0) sample(t, step);
        double t0 = loom_now(), norm;
        float lr;
        double loss = train_step(t, &norm, &lr);
        double dt = loom_now() - t0, eta_s = (loom_now() - t_start) / (double)(step + 1 - first) *
                                             (double)(o->steps - step - 1);
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
            LOOM_TRY(checkpoint(t));
    }
    validate(t, t->st.step);
    if (o->sample_every) sample(t, t->st.step);
    return o->ckpt_dir ? checkpoint(t) : LOOM_OK;
}

static void teardown(trainer *t) {
    if (t->metrics) fclose(t->metrics);
    free(t->inputs);
    free(t->targets);
    loom_tokenizer_free(t->tok);
    loom_loader_close(t->train);
    loom_loader_close(t->val);
    loom_adamw_free(t->opt);
    loom_gpt2_free(t->model);
    loom_backend_destroy(t->be);
}

int loom_cmd_train(int argc, char **argv) {
    trainer t = {0};
    bool help;
    loom_status s = train_options_parse(&t.o, argc, argv, &help);
    if (s == LOOM_OK && help) return 0;
    if (s == LOOM_OK) s = setup(&t);
    if (s == LOOM_OK) {
        print_config(&t);
        s = train_loop(&t);
    }
    if (s != LOOM_OK) loom_print_error();
    teardown(&t);
    return s == LOOM_OK ? 0 : 1;
}
