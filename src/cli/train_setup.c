// `loom train` set-up, checkpoints and teardown; see train.h.
#include "cli/common.h"
#include "cli/train.h"
#include "core/log.h"

#include <errno.h>
#include <omp.h>
#include <string.h>
#include <sys/stat.h>

// Data parallelism over the world (its GPU buffers through NCCL) and the optimizer over this
// rank's state.
static loom_status create_dp_and_optimizer(trainer *t) {
    const loom_gpt2 *m = t->model;
    if (t->be->stream && t->world_size > 1) LOOM_TRY(loom_comm_nccl(t->world, t->be->stream, &t->device_world));
    loom_comm *comm = t->device_world ? t->device_world : t->world;
    LOOM_TRY(loom_dp_create(&t->dp, comm, t->world, t->be, m->specs, LOOM_GPT2_NUM_TENSORS, m->num_elements,
                            t->o.zero, t->o.bucket_mb));
    int n;
    const loom_param_range *ranges = loom_dp_ranges(t->dp, &n);
    return loom_adamw_create(&t->opt, t->be, loom_dp_state_elements(t->dp), ranges, n);
}

// The layout a run is saved and resumed with.
static void set_layout(trainer *t) {
    t->st.world_size = t->world_size;
    t->st.zero = t->o.zero;
    t->st.state_files = t->o.zero == 0 ? 1 : t->world_size;
    t->st.bucket_elements = loom_dp_bucket_elements(t->dp);
}

// Resume: model, this rank's moments and progress from checkpoint `step` of --ckpt-dir.
static loom_status resume(trainer *t, int64_t step) {
    const train_options *o = &t->o;
    loom_gpt2_config cfg;
    float *params = NULL;
    int64_t n;
    LOOM_TRY(loom_ckpt_load_meta(o->ckpt_dir, step, &t->st));
    const loom_train_state *st = &t->st;
    if (st->micro_batch != o->batch || st->grad_accum != o->grad_accum || (o->seq && o->seq != st->seq_len))
        return loom_fail(LOOM_EINVAL, "resume with the checkpoint's --batch, --seq and --global-batch",
                         "checkpoint step %lld was trained with B=%d T=%d accumulation %d, not B=%d T=%d "
                         "accumulation %d", (long long)step, st->micro_batch, st->seq_len, st->grad_accum,
                         o->batch, o->seq ? o->seq : st->seq_len, o->grad_accum);
    if (st->world_size != t->world_size || st->zero != o->zero)
        return loom_fail(LOOM_EINVAL, "resume with the checkpoint's rank count and --zero",
                         "checkpoint step %lld was trained on %d ranks with ZeRO %d, not %d ranks with ZeRO %d",
                         (long long)step, st->world_size, st->zero, t->world_size, o->zero);
    LOOM_TRY(loom_ckpt_load_model(o->ckpt_dir, step, &cfg, &params, &n));
    loom_status s = loom_gpt2_create(&t->model, t->be, &cfg);
    if (s == LOOM_OK) loom_gpt2_set_params(t->model, params);
    free(params);
    if (s == LOOM_OK) s = create_dp_and_optimizer(t);
    if (s == LOOM_OK && loom_dp_bucket_elements(t->dp) != st->bucket_elements)
        s = loom_fail(LOOM_EINVAL, "resume with the checkpoint's --bucket-mb",
                      "checkpoint step %lld used buckets of %lld elements, this run %lld", (long long)step,
                      (long long)st->bucket_elements, (long long)loom_dp_bucket_elements(t->dp));
    if (s != LOOM_OK) return s;
    int64_t sn = loom_dp_state_elements(t->dp);
    size_t bytes = (size_t)sn * sizeof(float);
    float *m = loom_xmalloc(bytes), *v = loom_xmalloc(bytes), *master = t->opt->master ? loom_xmalloc(bytes) : NULL;
    bool has_master;
    s = loom_ckpt_load_state(o->ckpt_dir, st, o->zero == 0 ? 0 : t->rank, m, v, master, &has_master, sn);
    if (s == LOOM_OK) {
        t->be->upload(t->be, t->opt->m, m, bytes);
        t->be->upload(t->be, t->opt->v, v, bytes);
        if (has_master) t->be->upload(t->be, t->opt->master, master, bytes);
        else loom_adamw_init_master(t->opt, t->model->params, t->model->num_elements);
        t->opt->t = st->step;
    }
    free(m);
    free(v);
    free(master);
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
                               .grad_accum = o->grad_accum};
    LOOM_TRY(create_dp_and_optimizer(t));
    loom_adamw_init_master(t->opt, t->model->params, t->model->num_elements);
    set_layout(t);
    return LOOM_OK;
}

loom_status train_setup(trainer *t) {
    const train_options *o = &t->o;
    int threads = o->threads ? o->threads : omp_get_num_procs() / loom_comm_local_size(t->world);
    LOOM_TRY(cli_open_backend(o->device, o->precision, threads > 0 ? threads : 1, loom_comm_local_rank(t->world),
                              &t->be));
    if (o->ckpt_dir && mkdir(o->ckpt_dir, 0755) != 0 && errno != EEXIST)
        return loom_fail(LOOM_EIO, "check --ckpt-dir", "cannot create checkpoint folder %s: %s",
                         o->ckpt_dir, strerror(errno));
    int64_t step = -1;
    if (o->resume) LOOM_TRY(loom_ckpt_latest(o->ckpt_dir, &step));
    LOOM_TRY(step >= 0 ? resume(t, step) : start(t));
    int B = o->batch, T = t->st.seq_len, V = t->model->cfg.vocab_size;
    LOOM_TRY(loom_recompute_parse(o->recompute, &t->model->recompute));
    LOOM_TRY(loom_gpt2_alloc(t->model, B, T, true));
    t->model->grads_ready = loom_dp_grads_ready;
    t->model->grads_ready_ctx = t->dp;
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
    if (o->sample_every && t->rank == 0) LOOM_TRY(loom_tokenizer_load(&t->tok, NULL));
    if (o->metrics && t->rank == 0 && !(t->metrics = fopen(o->metrics, step >= 0 ? "a" : "w")))
        return loom_fail(LOOM_EIO, "check --metrics", "cannot open metrics file %s: %s", o->metrics,
                         strerror(errno));
    t->inputs = loom_xmalloc((size_t)B * T * sizeof(int32_t));
    t->targets = loom_xmalloc((size_t)B * T * sizeof(int32_t));
    return LOOM_OK;
}

void train_print_config(const trainer *t) {
    const train_options *o = &t->o;
    const loom_gpt2_config *c = &t->model->cfg;
    int B = o->batch, T = t->st.seq_len;
    char n[32], tok[32], bucket[32], pmem[32], amem[32], omem[32];
    size_t es = loom_dtype_size(t->be->dtype), pbytes = (size_t)t->model->num_elements * es;
    size_t obytes = (size_t)loom_dp_state_elements(t->dp) * sizeof(float) * (t->opt->master ? 3 : 2);
    cli_human_count(n, sizeof n, (double)loom_gpt2_num_params(c));
    cli_human_count(tok, sizeof tok, (double)loom_loader_num_tokens(t->train));
    cli_human_bytes(pmem, sizeof pmem, 2.0 * (double)pbytes);
    cli_human_bytes(amem, sizeof amem, (double)(loom_gpt2_memory_bytes(t->model) - 2 * pbytes));
    cli_human_bytes(omem, sizeof omem, (double)obytes);
    cli_human_bytes(bucket, sizeof bucket, (double)loom_dp_bucket_elements(t->dp) * es);
    cli_table_rule();
    cli_table_row("model", "%s: L=%d NH=%d C=%d maxT=%d V=%d (padded %d)",
                  o->init ? o->init : (o->resume && t->st.step ? "resumed" : o->model), c->num_layers,
                  c->num_heads, c->channels, c->max_seq_len, c->vocab_size, c->padded_vocab_size);
    cli_table_row("parameters", "%s", n);
    cli_table_row("micro-batch", "B=%d x T=%d = %d tokens", B, T, B * T);
    cli_table_row("global batch", "%d sequences = %d tokens (%d ranks x accumulation %d)", o->global_batch,
                  o->global_batch * T, t->world_size, o->grad_accum);
    cli_table_row("data parallel", "%d ranks (%s), ZeRO %d, %d buckets of %s", t->world_size,
                  loom_comm_backend(t->world), o->zero, loom_dp_num_buckets(t->dp), bucket);
    cli_table_row("steps", "%lld (from step %lld), %.3g tokens", (long long)o->steps,
                  (long long)t->st.step, (double)o->steps * o->global_batch * T);
    cli_table_row("schedule", "%s, lr %.3g -> %.3g, warmup %d", o->schedule, (double)o->lr.max_lr,
                  (double)o->lr.min_lr, o->warmup);
    cli_table_row("optimizer", "AdamW b1 %g b2 %g eps %g wd %g, clip %g%s", (double)o->adamw.beta1,
                  (double)o->adamw.beta2, (double)o->adamw.eps, (double)o->adamw.weight_decay,
                  (double)o->adamw.grad_clip, o->adamw.stochastic_rounding ? ", stochastic rounding" : "");
    cli_table_row("train data", "%s (%s tokens%s)", o->train_data, tok, o->shuffle ? ", shuffled" : "");
    if (o->val_data)
        cli_table_row("val data", "%s: %d batches, every %d steps", o->val_data, o->val_batches,
                      o->val_every);
    if (o->ckpt_dir && o->ckpt_every) cli_table_row("checkpoints", "%s every %d steps", o->ckpt_dir, o->ckpt_every);
    else if (o->ckpt_dir) cli_table_row("checkpoints", "%s at the end", o->ckpt_dir);
    cli_table_row("seed", "%llu", (unsigned long long)t->st.seed);
    cli_table_row("device", "%s, %s, %d threads per rank", t->be->name, loom_dtype_name(t->be->dtype),
                  omp_get_max_threads());
    cli_table_row("memory per rank", "%s params+grads, %s activations (recompute %s), %s AdamW", pmem, amem,
                  o->recompute, omem);
    cli_table_rule();
}

// Every rank must hold the same parameters (replicated, or gathered after ZeRO's update):
// their sums of squares, computed in a fixed order, must agree bit for bit.
static loom_status check_replicas(trainer *t) {
    int64_t n = t->model->num_elements;
    double mine = t->be->sumsq(t->be, loom_view_dims(t->model->params, t->be->dtype, &n, 1));
    double *all = loom_xmalloc((size_t)t->world_size * sizeof(double));
    loom_status s = loom_allgather(t->world, &mine, all, 1, LOOM_F64, NULL);
    for (int r = 1; s == LOOM_OK && r < t->world_size; r++)
        if (memcmp(&all[r], &all[0], sizeof(double)) != 0)
            s = loom_fail(LOOM_EINVAL, "a data-parallel bug: please report it",
                          "rank %d's parameters differ from rank 0's at step %lld", r, (long long)t->st.step);
    free(all);
    return s;
}

loom_status train_checkpoint(trainer *t, bool *report) {
    int64_t n = t->model->num_elements, sn = loom_dp_state_elements(t->dp);
    loom_status s = check_replicas(t);
    if (s != LOOM_OK) return s;
    if (t->rank == 0) {
        float *params = loom_xmalloc((size_t)n * sizeof(float));
        loom_gpt2_get_params(t->model, params);
        s = loom_ckpt_save_model(t->o.ckpt_dir, &t->st, &t->model->cfg, params, n);
        free(params);
    }
    if (s == LOOM_OK && t->rank < t->st.state_files) {
        size_t bytes = (size_t)sn * sizeof(float);
        float *m = loom_xmalloc(bytes), *v = loom_xmalloc(bytes), *master = t->opt->master ? loom_xmalloc(bytes) : NULL;
        t->be->download(t->be, m, t->opt->m, bytes);
        t->be->download(t->be, v, t->opt->v, bytes);
        if (master) t->be->download(t->be, master, t->opt->master, bytes);
        s = loom_ckpt_save_state(t->o.ckpt_dir, &t->st, t->rank, m, v, master, sn);
        free(m);
        free(v);
        free(master);
    }
    LOOM_TRY(loom_comm_agree(t->world, s, report));
    if (t->rank == 0) s = loom_ckpt_save_meta(t->o.ckpt_dir, &t->st, &t->model->cfg);
    LOOM_TRY(loom_comm_agree(t->world, s, report));
    loom_info("checkpoint %s/model_%08lld.bin\n", t->o.ckpt_dir, (long long)t->st.step);
    return LOOM_OK;
}

void train_teardown(trainer *t) {
    if (t->metrics) fclose(t->metrics);
    free(t->inputs);
    free(t->targets);
    loom_tokenizer_free(t->tok);
    loom_loader_close(t->train);
    loom_loader_close(t->val);
    loom_adamw_free(t->opt);
    loom_dp_free(t->dp);
    loom_comm_free(t->device_world);
    loom_gpt2_free(t->model);
    loom_backend_destroy(t->be);
}
