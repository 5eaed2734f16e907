// `loom train`: parses the flags, builds the trainer (src/train) on every rank of the mesh,
// prints the configuration, then loops — validate / sample / step / log / checkpoint. Launch
// with `mpirun -np N loom train ...` for N ranks: --tp of them split each layer, the rest are
// data-parallel replicas that read their own slice of every global batch.
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/eta.h"
#include "cli/metrics.h"
#include "cli/plot.h"
#include "cli/tensorboard.h"
#include "cli/train_options.h"
#include "ckpt/folder.h"
#include "core/fault.h"
#include "core/heartbeat.h"
#include "core/log.h"
#include "core/timer.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "model/generate.h"

#include <errno.h>
#include <omp.h>
#include <string.h>

typedef struct {
    double busy, total; // pipeline: seconds in compute and in steps, summed over the steps after the first
    int peak;           // the most micro-batches in flight
} pipeline_time;

typedef struct {
    train_options o;
    loom_comm *world;
    loom_trainer *t;
    pipeline_time pipe;
    loom_loader *train, *val;
    loom_tokenizer *tok; // rank 0, when sampling
    cli_metrics *metrics; // rank 0, --metrics
    cli_tensorboard *tb;  // rank 0, --tensorboard
    cli_eta eta;
    loom_ckpt_lock *lock; // rank 0: the checkpoint folder's
    int64_t skipped;      // steps skipped as not finite (--skip-nonfinite)
} run;

static void loader_batch(void *ctx, uint64_t index, int32_t *inputs, int32_t *targets) {
    loom_loader_get(ctx, index, inputs, targets);
}

// keys[0] is "step": a --metrics record and TensorBoard scalars. Errors: a write failure (rank 0).
static loom_status log_metrics(run *r, const char *const *keys, const double *vals, int n) {
    if (r->metrics) LOOM_TRY(cli_metrics_numbers(r->metrics, keys, vals, n));
    return r->tb ? cli_tensorboard_scalars(r->tb, (int64_t)vals[0], keys + 1, vals + 1, n - 1) : LOOM_OK;
}

// Rank 0, before the trainer: the checkpoint folder made and locked (its write access checked
// before step 1), and on --resume the leftovers of an interrupted save removed, or a note that
// there is nothing to resume.
static loom_status open_ckpt_dir(run *r) {
    const train_options *o = &r->o;
    if (!o->ckpt_dir || loom_comm_rank(r->world) != 0) return LOOM_OK;
    LOOM_TRY(loom_ckpt_lock_take(o->ckpt_dir, &r->lock));
    if (!o->resume) return LOOM_OK;
    int removed;
    int64_t latest;
    LOOM_TRY(loom_ckpt_clean(o->ckpt_dir, &removed));
    if (removed)
        loom_info("removed %d leftover file%s of an interrupted save from %s\n", removed, loom_plural(removed),
                  o->ckpt_dir);
    LOOM_TRY(loom_ckpt_latest(o->ckpt_dir, &latest));
    if (latest < 0) loom_info("note: --resume: no checkpoint in %s yet, so the run starts from step 0\n", o->ckpt_dir);
    return LOOM_OK;
}

// A resumed run whose --steps differ from the checkpoint's: the cosine schedule's horizon moves
// with --steps (the learning rate follows the new schedule from the resumed step on), said here.
static void note_horizon(const run *r) {
    const loom_trainer *t = r->t;
    int64_t was = t->st.lr_total_steps, now = r->o.steps;
    if (t->st.step == 0 || was == 0 || was == now) return;
    loom_lr_schedule old = t->cfg.lr;
    old.total = was;
    loom_info("note: --steps %lld differs from the checkpoint's %lld: the learning-rate schedule now ends at step "
              "%lld, so the rate at step %lld is %.3g, not %.3g (resume with --steps %lld to keep it)\n",
              (long long)now, (long long)was, (long long)now, (long long)t->st.step + 1,
              (double)loom_lr_at(&t->cfg.lr, t->st.step), (double)loom_lr_at(&old, t->st.step), (long long)was);
}

// A resumed run with --gemm-autotune: its algorithms are timed anew (backend.h), so --resume's
// bit-exact continuation does not hold, said here.
static void note_autotune(const run *r) {
    if (r->t->st.step > 0 && r->t->cfg.gemm_autotune)
        loom_info("note: --gemm-autotune times the matmul algorithms anew, so this resumed run may differ in "
                  "rounding from one that did not stop\n");
}

// Data, checkpoint folder, tokenizer and metrics: this rank's part of the set-up after the
// trainer. Errors: whatever failed here (the caller agrees across ranks).
static loom_status open_io(run *r) {
    const train_options *o = &r->o;
    int B = o->run.batch, T = r->t->st.seq_len, V = r->t->model->cfg.vocab_size, rank = loom_comm_rank(r->world);
    LOOM_TRY(loom_loader_open(&r->train, o->train_data, B, T, V, o->shuffle, r->t->st.seed));
    if (o->val_data) {
        LOOM_TRY(loom_loader_open(&r->val, o->val_data, B, T, V, false, r->t->st.seed));
        uint64_t have = loom_loader_num_batches(r->val);
        if ((uint64_t)o->val_batches > have) {
            loom_info("note: validation uses all %llu micro-batches of %s (--val-batches %d)\n",
                      (unsigned long long)have, o->val_data, o->val_batches);
            r->o.val_batches = (int)have;
        }
    }
    if (o->sample_every && rank == 0) LOOM_TRY(loom_tokenizer_load(&r->tok, NULL));
    if (rank != 0) return LOOM_OK;
    if (o->plot) LOOM_TRY(cli_plot_check(o->plot));
    if (o->metrics) LOOM_TRY(cli_metrics_open(&r->metrics, o->metrics, r->t->st.step));
    if (o->metrics) LOOM_TRY(cli_metrics_config(r->metrics, o, r->t));
    return o->tensorboard ? cli_tensorboard_open(&r->tb, o->tensorboard, r->t->st.step) : LOOM_OK;
}

static void print_config(const run *r) {
    const train_options *o = &r->o;
    const loom_trainer *t = r->t;
    const loom_gpt2_config *c = &t->model->cfg;
    int B = o->run.batch, T = t->st.seq_len, G = t->cfg.global_batch;
    char n[32], tok[32], bucket[32], pmem[32], amem[32], omem[32], hmem[32], mesh[96];
    loom_train_memory mem;
    loom_trainer_memory(t, &mem);
    cli_human_count(n, sizeof n, (double)loom_gpt2_num_params(c));
    cli_human_count(tok, sizeof tok, (double)loom_loader_num_tokens(r->train));
    cli_human_bytes(pmem, sizeof pmem, (double)mem.params_grads);
    cli_human_bytes(amem, sizeof amem, (double)mem.activations);
    cli_human_bytes(omem, sizeof omem, (double)mem.optimizer);
    cli_human_bytes(hmem, sizeof hmem, (double)mem.offloaded);
    cli_human_bytes(bucket, sizeof bucket, (double)loom_dp_bucket_elements(t->dp) * loom_dtype_size(t->be->dtype));
    loom_mesh_describe(t->mesh, mesh, sizeof mesh);
    cli_table_rule();
    cli_table_row("model", "%s: L=%d NH=%d C=%d maxT=%d V=%d (padded %d)",
                  o->run.init ? o->run.init : (t->st.step ? "resumed" : o->model), c->num_layers, c->num_heads,
                  c->channels, c->max_seq_len, c->vocab_size, c->padded_vocab_size);
    cli_table_row("parameters", "%s", n);
    cli_table_row("micro-batch", "B=%d x T=%d = %lld tokens", B, T, (long long)B * T);
    cli_table_row("global batch", "%d sequence%s = %lld tokens (%d dp rank%s x accumulation %d)", G, loom_plural(G),
                  (long long)G * T, t->dp_size, loom_plural(t->dp_size), t->grad_accum);
    cli_table_row("mesh", "%s", mesh);
    if (o->run.tp > 1)
        cli_table_row("tensor parallel", "tp %d: %d heads per rank, vocabulary-parallel loss%s", o->run.tp, t->model->NH,
                      o->run.sp ? ", sequence parallel" : "");
    if (t->schedule) {
        double bubble = 0;
        loom_pp_theoretical_bubble(t->schedule, &bubble); // the schedule was simulated when made
        cli_table_row("pipeline", "pp %d, %s, %d stages of %d blocks, %d micro-batches, bubble %.1f%% in theory",
                      o->run.pp, loom_pp_kind_name(t->schedule->kind), t->schedule->S, c->num_layers / t->schedule->S,
                      t->schedule->M, 100 * bubble);
    }
    if (o->run.zero == 3)
        cli_table_row("data parallel", "dp %d (%s), ZeRO 3 (FSDP): %d unit%s sharded over %d rank%s%s", t->dp_size,
                      loom_comm_backend(t->mesh->dev[LOOM_GROUP_DP_CP]), loom_dp_num_buckets(t->dp),
                      loom_plural(loom_dp_num_buckets(t->dp)), loom_mesh_size(t->mesh, LOOM_GROUP_SHARD),
                      loom_plural(loom_mesh_size(t->mesh, LOOM_GROUP_SHARD)),
                      o->run.dp_replicate > 1 ? ", replicated (HSDP)" : "");
    else
        cli_table_row("data parallel", "dp %d (%s), ZeRO %d, %d bucket%s of %s%s", t->dp_size,
                      loom_comm_backend(t->mesh->dev[LOOM_GROUP_DP_CP]), o->run.zero, loom_dp_num_buckets(t->dp),
                      loom_plural(loom_dp_num_buckets(t->dp)), bucket,
                      o->run.dp_replicate > 1 ? ", hybrid: sharded within replicas" : "");
    cli_table_row("steps", "%lld (from step %lld), %.3g tokens", (long long)o->steps, (long long)t->st.step,
                  (double)o->steps * G * T);
    cli_table_row("schedule", "%s, lr %.3g -> %.3g, warmup %d", o->schedule, (double)o->run.lr.max_lr,
                  (double)o->run.lr.min_lr, o->warmup);
    const loom_adamw_config *a = &o->run.adamw;
    cli_table_row("optimizer", "AdamW b1 %g b2 %g eps %g wd %g, clip %g%s", (double)a->beta1, (double)a->beta2,
                  (double)a->eps, (double)a->weight_decay, (double)a->grad_clip,
                  a->stochastic_rounding ? ", stochastic rounding" : "");
    cli_table_row("train data", "%s (%s tokens%s)", o->train_data, tok, o->shuffle ? ", shuffled" : "");
    if (o->val_data)
        cli_table_row("val data", "%s: %d batch%s, every %d step%s", o->val_data, o->val_batches,
                      o->val_batches == 1 ? "" : "es", o->val_every, loom_plural(o->val_every));
    if (o->ckpt_dir && o->ckpt_every)
        cli_table_row("checkpoints", "%s every %d step%s", o->ckpt_dir, o->ckpt_every, loom_plural(o->ckpt_every));
    else if (o->ckpt_dir) cli_table_row("checkpoints", "%s at the end", o->ckpt_dir);
    cli_table_row("seed", "%llu", (unsigned long long)t->st.seed);
    cli_table_row("device", "%s, %s, %d thread%s per rank", t->be->name, loom_backend_precision(t->be),
                  omp_get_max_threads(), loom_plural(omp_get_max_threads()));
    cli_table_row("memory per rank", "%s params+grads, %s activations (recompute %s), %s AdamW on the %s", pmem, amem,
                  loom_recompute_name(o->run.recompute), omem, t->be->name);
    if (mem.offloaded)
        cli_table_row("offloaded", "%s in host memory (%s)", hmem, o->offload);
    cli_table_rule();
}

// --plot redrawn from the metrics file (rank 0), once a step is in it.
static loom_status redraw(run *r, int64_t step) {
    return r->o.plot && step > 0 && loom_comm_rank(r->world) == 0 ? cli_plot_metrics(r->o.metrics, r->o.plot) : LOOM_OK;
}

// The validation loss, logged, and the plot redrawn; write failures agreed across ranks.
static loom_status validate(run *r, int64_t step, bool *report) {
    if (!r->val) return LOOM_OK;
    loom_heartbeat_phase("validate", step);
    double loss, t0 = loom_now();
    LOOM_TRY(loom_train_eval(r->t, loader_batch, r->val, r->o.val_batches, &loss));
    cli_eta_validation(&r->eta, loom_now() - t0);
    loom_info("val loss %.4f (step %lld)\n", loss, (long long)step);
    loom_status s = log_metrics(r, (const char *[]){"step", "val_loss"}, (double[]){(double)step, loss}, 2);
    return loom_comm_agree(r->world, s == LOOM_OK ? redraw(r, step) : s, report);
}

// A token of a sample: printed by rank 0; every rank stops at the end of a document.
static int sample_token(int32_t token, void *ctx) {
    return ctx ? cli_print_token(token, ctx) : token == LOOM_EOT;
}

// The ranks of data-parallel replica 0 generate together (tensor parallelism); rank 0 prints.
static loom_status sample(run *r, int64_t step) {
    loom_trainer *t = r->t;
    if (t->dp_rank != 0) return LOOM_OK;
    loom_heartbeat_phase("sample", step);
    int n = r->o.sample_tokens;
    int32_t *tokens = loom_xmalloc((size_t)(n + 1) * sizeof(int32_t));
    tokens[0] = LOOM_EOT;
    loom_sampling s = {.temperature = 1.0f, .top_k = 40, .seed = t->st.seed + (uint64_t)step};
    loom_info("sample (step %lld): ", (long long)step);
    loom_generate(t->model, tokens, 1, n, &s, sample_token, r->tok);
    loom_info("\n");
    free(tokens);
    return t->tp ? loom_tp_error(t->tp) : LOOM_OK;
}

static void print_peak(const run *r) {
    loom_backend *be = r->t->be;
    int W = loom_comm_size(r->world);
    double mine = (double)be->peak_bytes, *all = loom_xmalloc((size_t)W * sizeof(double));
    char text[32];
    if (loom_allgather(r->world, &mine, all, 1, LOOM_F64, NULL) == LOOM_OK) {
        cli_human_bytes(text, sizeof text, all[0]);
        if (W == 1) loom_info("peak memory %s on rank 0's %s (allocations of the backend)\n", text, be->name);
        int lo = 0, hi = 0;
        for (int i = 1; i < W; i++) lo = all[i] < all[lo] ? i : lo, hi = all[i] > all[hi] ? i : hi;
        if (W > 1 && all[lo] == all[hi]) {
            loom_info("peak memory %s on each of %d ranks (allocations of the %s backend)\n", text, W, be->name);
        } else if (W > 1) {
            char low[32];
            cli_human_bytes(text, sizeof text, all[hi]);
            cli_human_bytes(low, sizeof low, all[lo]);
            loom_info("peak memory per rank (allocations of the %s backend): %s (rank %d) to %s (rank %d)\n", be->name,
                      low, lo, text, hi);
        }
    }
    free(all);
}

// Each pipeline rank's measured busy and bubble fractions (replica 0, tp rank 0), printed by
// rank 0 next to the schedule's theory.
static void print_pipeline(const run *r) {
    const loom_trainer *t = r->t;
    if (!t->schedule) return;
    int W = loom_comm_size(r->world), rank = loom_comm_rank(r->world);
    loom_train_memory mem;
    loom_trainer_memory(t, &mem);
    double mine[4] = {r->pipe.busy, r->pipe.total, r->pipe.peak, (double)mem.activations}, *all = loom_xmalloc((size_t)W * sizeof mine);
    double theory = 0;
    loom_pp_theoretical_bubble(t->schedule, &theory);
    if (loom_allgather(r->world, mine, all, 4, LOOM_F64, NULL) == LOOM_OK && rank == 0 && r->pipe.total == 0)
        loom_info("pipeline %s: theory bubble %.1f%% at F = I = W (run 2 steps or more to measure it)\n",
                  loom_pp_kind_name(t->schedule->kind), 100 * theory);
    else if (rank == 0) {
        loom_info("pipeline %s (theory: bubble %.1f%% at F = I = W), measured over steps 2..%lld:\n",
                  loom_pp_kind_name(t->schedule->kind), 100 * theory, (long long)t->st.step);
        double busy = 0, total = 0;
        for (int p = 0; p < t->cfg.pp; p++) {
            const double *v = all + 4 * (size_t)(p * (W / t->cfg.pp)); // pp rank p's first world rank
            char amem[32];
            cli_human_bytes(amem, sizeof amem, v[3]);
            loom_info("  pp rank %d: busy %.1f%%, bubble %.1f%%, peak %d (micro-batch, stage) in flight (promised %d), "
                      "activations %s\n", p, 100 * v[0] / v[1], 100 * (1 - v[0] / v[1]), (int)v[2],
                      t->schedule->promised[p], amem);
            busy += v[0], total += v[1];
        }
        loom_info("  all ranks: bubble %.1f%%\n", 100 * (1 - busy / total));
    }
    free(all);
}

// One optimizer step, s->skipped when its loss or gradient norm is not finite: then nothing of it
// is applied, and the run stops with an error naming the step, or with --skip-nonfinite goes on
// past it. The same on every rank (the loss and the norm are global).
static loom_status step_once(run *r, loom_step_result *s) {
    loom_trainer *t = r->t;
    LOOM_TRY(loom_train_step(t, loader_batch, r->train, s));
    if (!s->skipped) return LOOM_OK;
    if (!r->o.skip_nonfinite) // t->st is past the step: st.step is its 1-based number
        return loom_fail(LOOM_EINVAL, "lower --lr or raise --warmup, or add --skip-nonfinite to skip such steps",
                         "step %lld: loss %g, gradient norm %g: not finite, so the run stops (the step is not "
                         "applied, no checkpoint of it is written)", (long long)t->st.step, s->loss, s->norm);
    r->skipped++;
    return LOOM_OK;
}

// Failures inside the loop are the same on every rank (the loss is global, collectives fail
// everywhere) except checkpoint saves and the metrics file, which agree on who reports.
static loom_status train_loop(run *r, bool *report) {
    const train_options *o = &r->o;
    loom_trainer *t = r->t;
    double tokens_per_step = (double)t->cfg.global_batch * t->st.seq_len;
    // model FLOPs of a step over the peak of all the run's devices (a GPU's dense bf16 unless given)
    double peak = o->peak_tflops > 0 ? o->peak_tflops : t->be->stream ? CLI_GPU_PEAK_TFLOPS : 0;
    double step_flops = loom_gpt2_flops_per_token(&t->model->cfg, t->st.seq_len) * tokens_per_step;
    double all_peak = peak * 1e12 * loom_comm_size(r->world);
    int64_t first = t->st.step;
    *report = loom_comm_rank(r->world) == 0;
    while (t->st.step < o->steps) {
        int64_t step = t->st.step;
        if (o->val_every && step % o->val_every == 0) LOOM_TRY(validate(r, step, report));
        if (o->sample_every && step > 0 && step % o->sample_every == 0) LOOM_TRY(sample(r, step));
        double t0 = loom_now();
        loom_step_result s;
        loom_heartbeat_phase("step", step + 1); // loom launch's watchdog: where each rank is
        LOOM_TRY(step_once(r, &s));
        loom_heartbeat_phase("stepped", t->st.step);
        double dt = loom_now() - t0;
        if (t->pipe && t->st.step > first + 1) { // the first step warms up
            const loom_pp_stats *ps = loom_pp_last_stats(t->pipe);
            r->pipe.busy += ps->busy_seconds, r->pipe.total += ps->step_seconds;
            r->pipe.peak = ps->peak_in_flight > r->pipe.peak ? ps->peak_in_flight : r->pipe.peak;
        }
        cli_eta_step(&r->eta, dt);
        double eta_s = cli_eta_seconds(&r->eta, o->steps - t->st.step,
                                       cli_eta_validations_left(t->st.step, o->steps, o->val_every, r->val != NULL));
        char eta[32];
        cli_human_duration(eta, sizeof eta, eta_s);
        loom_status io;
        if (s.skipped) {
            loom_info("step %5lld/%lld | loss %g | norm %g | skipped: not finite (%lld so far) | eta %s\n",
                      (long long)t->st.step, (long long)o->steps, s.loss, s.norm, (long long)r->skipped, eta);
            io = log_metrics(r, (const char *[]){"step", "loss", "grad_norm", "skipped"},
                             (double[]){(double)t->st.step, s.loss, s.norm, 1}, 4);
        } else {
            loom_info("step %5lld/%lld | loss %.4f | lr %.2e | norm %.4f | %.1f ms | %.0f tok/s | eta %s\n",
                      (long long)t->st.step, (long long)o->steps, s.loss, (double)s.lr, s.norm, dt * 1e3,
                      tokens_per_step / dt, eta);
            io = log_metrics(r, (const char *[]){"step", "loss", "lr", "grad_norm", "step_time_s", "tokens_per_s", "mfu"},
                             (double[]){(double)t->st.step, s.loss, s.lr, s.norm, dt, tokens_per_step / dt,
                                        step_flops / dt / all_peak}, peak > 0 ? 7 : 6);
        }
        if (io == LOOM_OK) io = loom_comm_launcher_check(); // orphaned by a killed mpirun: stop
        LOOM_TRY(loom_comm_agree(r->world, io, report));
        loom_fault_point("step");
        if (o->ckpt_dir && o->ckpt_every && t->st.step % o->ckpt_every == 0 && t->st.step < o->steps)
            LOOM_TRY(loom_trainer_save(t, o->ckpt_dir, report));
    }
    LOOM_TRY(validate(r, t->st.step, report));
    if (!r->val) LOOM_TRY(loom_comm_agree(r->world, redraw(r, t->st.step), report));
    if (o->sample_every) LOOM_TRY(sample(r, t->st.step));
    if (r->skipped)
        loom_info("skipped %lld of %lld steps: loss or gradient norm not finite (--skip-nonfinite)\n",
                  (long long)r->skipped, (long long)(t->st.step - first));
    print_peak(r);
    print_pipeline(r);
    // a resume with nothing left to train: the checkpoint it resumed from holds this state (and a
    // rewrite in another layout, file by file, could be cut between two layouts)
    if (!o->ckpt_dir || (o->resume && t->st.step == first)) return LOOM_OK;
    return loom_trainer_save(t, o->ckpt_dir, report);
}

int loom_cmd_train(int argc, char **argv) {
    run r = {0};
    loom_status s = loom_comm_world(&argc, &argv, &r.world);
    if (s != LOOM_OK) {
        loom_print_error();
        return 1;
    }
    int rank = loom_comm_rank(r.world), W = loom_comm_size(r.world);
    loom_log_set_rank(rank, W);
    bool help = false, report = rank == 0;
    s = train_options_parse(&r.o, argc, argv, W, &help);
    if (s == LOOM_OK && !help) s = loom_comm_agree(r.world, open_ckpt_dir(&r), &report);
    if (s == LOOM_OK && !help) s = loom_trainer_create(&r.t, r.world, &r.o.run, &report);
    if (s == LOOM_OK && !help) r.t->timed = r.t->pipe != NULL; // each stage's busy time, synchronised
    if (s == LOOM_OK && !help) s = loom_comm_agree(r.world, open_io(&r), &report);
    if (s == LOOM_OK && !help) {
        print_config(&r);
        note_horizon(&r);
        note_autotune(&r);
        s = train_loop(&r, &report);
    }
    if (s != LOOM_OK && report) loom_print_error();
    loom_status closed_metrics = cli_metrics_close(r.metrics), closed_tb = cli_tensorboard_close(r.tb);
    if (s == LOOM_OK && (closed_metrics != LOOM_OK || closed_tb != LOOM_OK)) { // rank 0's files
        loom_print_error();
        s = LOOM_EIO;
    }
    loom_tokenizer_free(r.tok);
    loom_loader_close(r.train);
    loom_loader_close(r.val);
    loom_trainer_free(r.t);
    loom_ckpt_lock_release(r.lock);
    loom_comm_finalize(r.world);
    return s == LOOM_OK ? 0 : 1;
}
