// `loom bench`: timed training steps (the library step of src/train, as `loom train` runs it)
// on random tokens for a named config, in one process or under mpirun on a mesh (--tp, data
// parallelism over the rest). Prints tokens/s, achieved FLOP rate (6N + 6LTC FLOPs per token)
// per rank against the backend's own measured matmul rate, the step split into forward /
// backward / optimizer, and rank 0's peak memory (the backend's allocations: device memory on
// a GPU).
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/flags.h"
#include "cli/train_options.h"
#include "core/log.h"
#include "core/power.h"
#include "core/rng.h"
#include "core/timer.h"
#include "train/trainer.h"

#include <float.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// FLOP/s of the backend's matmul on an (n,n) x (n,n) product, median of 5 after a warm-up.
static double matmul_rate(loom_backend *be, int64_t n) {
    size_t bytes = (size_t)(n * n) * loom_dtype_size(be->dtype);
    float *host = loom_xmalloc((size_t)(n * n) * sizeof(float));
    for (int64_t i = 0; i < n * n; i++) host[i] = (float)loom_rng_normal(1, 0, (uint64_t)i);
    void *a = be->alloc(be, bytes), *w = be->alloc(be, bytes), *c = be->alloc(be, bytes);
    be->upload(be, a, host, bytes);
    be->upload(be, w, host, bytes);
    loom_tensor A = LOOM_VIEW(a, be->dtype, n, n), W = LOOM_VIEW(w, be->dtype, n, n);
    loom_tensor Cm = LOOM_VIEW(c, be->dtype, n, n);
    double t[5];
    be->matmul_forward(be, Cm, A, W, (loom_tensor){0});
    for (int r = 0; r < 5; r++) {
        be->synchronize(be);
        double t0 = loom_now();
        be->matmul_forward(be, Cm, A, W, (loom_tensor){0});
        be->synchronize(be);
        t[r] = loom_now() - t0;
    }
    be->free(be, a);
    be->free(be, w);
    be->free(be, c);
    free(host);
    return 2.0 * (double)(n * n * n) / median(t, 5);
}

// The same random tokens for every micro-batch, made once.
typedef struct {
    int32_t *inputs, *targets;
    size_t n;
} random_tokens;

static void random_batch(void *ctx, uint64_t index, int32_t *inputs, int32_t *targets) {
    const random_tokens *r = ctx;
    memcpy(inputs, r->inputs, r->n * sizeof(int32_t));
    memcpy(targets, r->targets, r->n * sizeof(int32_t));
}

// Median seconds of the forward, the step's micro-batches (forward + backward), its update and
// this rank's wait for the others (trainer.h's time_wait); with pw (not NULL), the GPU's power
// over the timed steps into *use, read by a meter thread (use->reads is 0 where it did not start)
static void time_steps(loom_trainer *t, int warmup, int steps, double *fwd, double *fb, double *opt, double *wait,
                       loom_power *pw, loom_power_use *use) {
    loom_train_config *c = &t->cfg;
    double *tf = loom_xmalloc((size_t)steps * sizeof(double)), *tfb = loom_xmalloc((size_t)steps * sizeof(double));
    double *to = loom_xmalloc((size_t)steps * sizeof(double)), *tw = loom_xmalloc((size_t)steps * sizeof(double));
    random_tokens tokens = {loom_xmalloc((size_t)c->batch * c->seq * sizeof(int32_t)),
                            loom_xmalloc((size_t)c->batch * c->seq * sizeof(int32_t)), (size_t)c->batch * c->seq};
    for (size_t i = 0; i < tokens.n; i++) {
        tokens.inputs[i] = (int32_t)loom_rng_below(7, 1, i, (uint64_t)c->model.vocab_size);
        tokens.targets[i] = (int32_t)loom_rng_below(7, 2, i, (uint64_t)c->model.vocab_size);
    }
    t->timed = true;
    random_batch(&tokens, 0, t->inputs, t->targets);
    *use = (loom_power_use){0};
    // Steps back to back, each timed from the previous one's end, with nothing between them: the
    // device's collectives run on from one step into the next (ZeRO 1/2's parameter all-gather,
    // which the next step's forward waits for), and the power is read by another thread.
    double last = loom_now();
    for (int i = -warmup; i < steps; i++) {
        if (i == 0 && pw && loom_power_meter_start(pw, 0.005) != LOOM_OK)
            snprintf(use->lost, sizeof use->lost, "%s", loom_error_message());
        loom_step_result r;
        LOOM_CHECK(loom_train_step(t, random_batch, &tokens, &r) == LOOM_OK);
        double now = loom_now();
        if (i >= 0) tfb[i] = now - last - t->time_opt, to[i] = t->time_opt, tw[i] = t->time_wait;
        last = now;
    }
    if (pw && !use->lost[0]) loom_power_meter_stop(pw, use);
    // The forward alone, after the steps: between two steps it would take in the parameters'
    // all-gather (ZeRO 1/2), which a step overlaps with its own forward.
    for (int i = 0; i < steps; i++) {
        double t0 = loom_now();
        loom_gpt2_loss(t->model, t->inputs, t->targets, c->batch, c->seq);
        t->be->synchronize(t->be);
        tf[i] = loom_now() - t0;
    }
    *fwd = median(tf, steps), *fb = median(tfb, steps), *opt = median(to, steps), *wait = median(tw, steps);
    free(tokens.inputs);
    free(tokens.targets);
    free(tf);
    free(tfb);
    free(to);
    free(tw);
}

// With several data- or context-parallel ranks: each rank's median wait for the slowest (gathered
// over the world), printed by rank 0 as the largest and the smallest, a measure of the ranks' skew.
static loom_status report_wait(loom_comm *world, const loom_trainer *t, double wait) {
    if (t->dp_size * t->cfg.cp == 1) return LOOM_OK; // the same on every rank: nobody waits
    int W = loom_comm_size(world);
    double *each = loom_xmalloc((size_t)W * sizeof(double));
    loom_status s = loom_allgather(world, &wait, each, 1, LOOM_F64, NULL);
    int lo = 0, hi = 0;
    for (int r = 1; r < W && s == LOOM_OK; r++) {
        if (each[r] < each[lo]) lo = r;
        if (each[r] > each[hi]) hi = r;
    }
    if (s == LOOM_OK)
        loom_info("wait ms: %.2f on rank %d, %.2f on rank %d: the longest and the shortest median a rank's step waited "
                  "in the loss's all-reduce, its own micro-batches done, for the slowest rank's (the ranks' skew; "
                  "within bwd ms)\n", each[hi] * 1e3, hi, each[lo] * 1e3, lo);
    free(each);
    return s;
}

int loom_cmd_bench(int argc, char **argv) {
    loom_comm *world;
    if (loom_comm_world(&argc, &argv, &world) != LOOM_OK) {
        loom_print_error();
        return 1;
    }
    int rank = loom_comm_rank(world), W = loom_comm_size(world);
    loom_log_set_rank(rank, W);
    const char *model = "gpt2", *recompute = "auto", *offload = "";
    int steps = 3, warmup = 1, layers = 0, heads = 0, channels = 0;
    float peak_tflops = 0, bucket_mb = 25;
    loom_train_config c = {.batch = 4, .tp = 1, .pp = 1, .cp = 1, .dp_replicate = 1, .seed = 1337,
                           .adamw = {.lr = 6e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                                     .grad_clip = 1.0f},
                           .lr = {LOOM_LR_CONSTANT, 6e-4f, 6e-4f, 0, 1},
                           .device = "auto", .precision = "auto", .device_comm = "nccl", .zero = -1};
    const loom_flag flags[] = {
        {"model", FLAG_STR, &model, "named config"},
        {"layers", FLAG_INT, &layers, "layers L (0: the config's value)", CLI_LAYERS_RANGE},
        {"heads", FLAG_INT, &heads, "heads NH (0: the config's value)", CLI_HEADS_RANGE},
        {"channels", FLAG_INT, &channels, "channels C (0: the config's value)", CLI_CHANNELS_RANGE},
        {"batch", FLAG_INT, &c.batch, "micro-batch size B", CLI_BATCH_RANGE},
        {"seq", FLAG_INT, &c.seq, "sequence length T (0: the model's maximum)", CLI_SEQ_RANGE},
        {"global-batch", FLAG_INT, &c.global_batch, "sequences per step over all data-parallel ranks (0: dp x batch); accumulation = global-batch / (dp x batch)", 0, 1 << 20},
        {"steps", FLAG_INT, &steps, "timed steps", 1, 1000000},
        {"warmup", FLAG_INT, &warmup, "untimed steps first", 0, 1000000},
        {"peak-tflops", FLAG_FLOAT, &peak_tflops, CLI_PEAK_HELP, 0, FLT_MAX},
        {"recompute", FLAG_STR, &recompute, CLI_RECOMPUTE_HELP},
        {"cuda-graphs", FLAG_BOOL, &c.cuda_graphs, "replay each step as one recorded CUDA graph (one rank; bwd ms then includes the optimizer)"},
        {"gemm-autotune", FLAG_BOOL, &c.gemm_autotune, CLI_GEMM_AUTOTUNE_HELP},
        {"logits-chunk", FLAG_INT, &c.logits_chunk, CLI_LOGITS_CHUNK_HELP, CLI_LOGITS_CHUNK_RANGE},
        {"offload", FLAG_STR, &offload, "what lives in host memory (comma list): optimizer (AdamW on the CPU cores), params (with --zero 3 and optimizer), activations"},
        {"tp", FLAG_INT, &c.tp, "tensor-parallel ranks (under mpirun; the rest are data-parallel)", 1, 1024},
        {"sp", FLAG_BOOL, &c.sp, "sequence parallelism over the --tp ranks"},
        {"zero", FLAG_INT, &c.zero, CLI_ZERO_HELP, CLI_ZERO_RANGE},
        {"bucket-mb", FLAG_FLOAT, &bucket_mb, "gradient bucket size in MiB for the data-parallel reduction", 0, 65536, FLAG_ABOVE_MIN},
        {"device", FLAG_STR, &c.device, CLI_DEVICE_HELP},
        {"precision", FLAG_STR, &c.precision, CLI_PRECISION_HELP},
        {"fp8-recipe", FLAG_STR, &c.fp8_recipe, CLI_FP8_RECIPE_HELP},
        {"fp8-history", FLAG_INT, &c.fp8_history, CLI_FP8_HISTORY_HELP, CLI_FP8_HISTORY_RANGE},
        {"fp8-fast-dgrad", FLAG_BOOL, &c.fp8_fast_dgrad, CLI_FP8_FAST_DGRAD_HELP},
        {"device-comm", FLAG_STR, &c.device_comm, "collectives on GPU buffers: nccl or mpi (staged)"},
        {"threads", FLAG_INT, &c.threads, "CPU threads per rank (0: the cores shared among this host's ranks)", CLI_THREADS_RANGE},
    };
    const loom_cli cli = {"bench", "Time training steps of a named config on random tokens.",
                          "[mpirun -np N] loom bench [--model NAME --batch B --seq T --steps N --tp P]", flags,
                          (int)(sizeof flags / sizeof flags[0]), 0};
    bool help, report = rank == 0;
    char **pos;
    int npos;
    loom_trainer *t = NULL;
    loom_status s = loom_flags_parse(&cli, argc, argv, &help, &pos, &npos);
    c.bucket_mb = bucket_mb;
    if (s == LOOM_OK && !help && W % c.tp != 0)
        s = loom_fail(LOOM_EINVAL, "use a --tp that divides the ranks", "--tp %d does not divide the %d ranks", c.tp, W);
    if (s == LOOM_OK && !help) s = cli_model_config(model, layers, heads, channels, 0, 0, &c.model);
    if (s == LOOM_OK && !help) s = cli_recompute_parse(recompute, c.precision, &c.recompute);
    int dp = W / c.tp; // data-parallel ranks
    c.zero = cli_zero_stage(c.zero, dp);
    if (s == LOOM_OK && !help) s = train_offload_parse(offload, &c);
    int per_step = c.batch * dp; // one micro-batch on every data-parallel rank
    if (s == LOOM_OK && !help && c.global_batch % per_step != 0)
        s = loom_fail(LOOM_EINVAL, "make --global-batch a multiple of data-parallel ranks x --batch",
                      "--global-batch %d is not a multiple of %d (%d data-parallel ranks x --batch %d)", c.global_batch,
                      per_step, dp, c.batch);
    if (s == LOOM_OK && !help) {
        c.seq = c.seq ? c.seq : c.model.max_seq_len;
        c.global_batch = c.global_batch ? c.global_batch : per_step;
        s = loom_trainer_create(&t, world, &c, &report);
    }
    if (s != LOOM_OK || help) {
        if (s != LOOM_OK && report) loom_print_error();
        loom_comm_finalize(world);
        return s == LOOM_OK ? 0 : 1;
    }
    loom_backend *be = t->be;
    if (peak_tflops == 0 && be->stream) peak_tflops = CLI_GPU_PEAK_TFLOPS;
    loom_power *pw = NULL; // rank 0's GPU's energy meter, where NVML has one for it
    if (report && be->pci_bus_id && loom_power_open(&pw, be->pci_bus_id) != LOOM_OK)
        loom_info("power: not measured: %s\n", loom_error_message());
    double fwd, fb, op, wait;
    loom_power_use use;
    time_steps(t, warmup, steps, &fwd, &fb, &op, &wait, pw, &use);
    size_t n = (size_t)c.global_batch * (size_t)c.seq; // tokens of a step, all ranks
    double step = fb + op, flops = loom_gpt2_flops_per_token(&c.model, c.seq) * (double)n / W; // per rank
    char params[32], peak[32];
    cli_human_count(params, sizeof params, (double)loom_gpt2_num_params(&c.model));
    cli_human_bytes(peak, sizeof peak, (double)be->peak_bytes); // the training's, not matmul_rate's
    double mm = matmul_rate(be, 2048);
    char mesh[96];
    loom_mesh_describe(t->mesh, mesh, sizeof mesh);
    loom_info("bench %s (%s params) B=%d T=%d on %s, %d thread%s, %s, median of %d step%s\n", model, params, c.batch,
              c.seq, be->name, omp_get_max_threads(), loom_plural(omp_get_max_threads()), mesh, steps,
              loom_plural(steps));
    loom_info("| step ms | fwd ms | bwd ms | opt ms | tokens/s | GFLOP/s | matmul GFLOP/s | ratio |%s peak mem |\n",
              peak_tflops > 0 ? " MFU |" : "");
    loom_info("| %7.1f | %6.1f | %6.1f | %6.1f | %8.0f | %7.1f | %14.1f | %4.0f%% |", step * 1e3, fwd * 1e3,
              (fb - fwd) * 1e3, op * 1e3, (double)n / step, flops / step / 1e9, mm / 1e9, 100.0 * flops / step / mm);
    if (peak_tflops > 0) loom_info(" %4.1f%% |", 100.0 * flops / step / (peak_tflops * 1e12));
    loom_info(" %s |\n", peak);
    loom_info("GFLOP/s: the model's FLOPs of a step (6N + 6LTC per token) per rank / the step time\n"
              "ratio:   GFLOP/s / matmul GFLOP/s, this backend's own rate on one 2048 x 2048 x 2048 product measured\n"
              "         just before: how near the whole step comes to the device's matmul speed\n"
              "bwd ms:  the step's forward and backward passes with the gradients' reduction and norm, timed from\n"
              "         the previous step's end, less fwd ms (forwards timed apart, after the steps); step ms =\n"
              "         fwd + bwd + opt\n%s",
              peak_tflops > 0 ? "MFU:     GFLOP/s / the hardware peak (--peak-tflops)\n" : "");
    if (c.cuda_graphs)
        loom_info("--cuda-graphs: a step is one replay, so bwd ms includes the optimizer and opt ms is 0\n");
    if (report_wait(world, t, wait) != LOOM_OK) loom_print_error();
    if (use.lost[0]) {
        loom_info("power:   not measured: %s\n", use.lost);
    } else if (use.moves >= 2 && use.span_s >= 1.0) {
        double watts = use.joules / use.span_s, limit = loom_power_limit_w(pw);
        char lim[48] = "";
        if (limit > 0) snprintf(lim, sizeof lim, " (limit %.0f W)", limit);
        loom_info("power:   %.0f W%s on rank 0's GPU over %.1f s of the timed steps, SM clock %.0f MHz, at the power "
                  "limit in %d of %d reads (every 5 ms); %.2f J a step (W x step ms), %.0f tokens/J\n", watts, lim,
                  use.span_s, use.sm_mhz, use.capped, use.reads - 1, watts * step, (double)n / (watts * step));
    } else if (pw) {
        loom_info("power:   not measured: NVML's energy counter moved %d times over %.2f s of the timed steps, under "
                  "the 1 s a mean needs (it moves every ~100 ms); time more steps with --steps\n", use.moves,
                  use.span_s);
    }
    loom_power_close(pw);
    loom_train_memory mem;
    loom_trainer_memory(t, &mem);
    char planned[32], host_peak[32];
    cli_human_bytes(planned, sizeof planned, (double)(mem.params_grads + mem.activations + mem.optimizer));
    cli_human_bytes(host_peak, sizeof host_peak, (double)be->host_peak_bytes);
    loom_info("memory plan per rank: %s on the %s (%.0f MiB params+grads, %.0f MiB activations, %.0f MiB AdamW), "
              "%.0f MiB offloaded to host memory; measured peak %s, and %s of pinned host memory\n", planned, be->name,
              mem.params_grads / 1048576.0, mem.activations / 1048576.0, mem.optimizer / 1048576.0,
              mem.offloaded / 1048576.0, peak, host_peak);
    loom_trainer_free(t);
    loom_comm_finalize(world);
    return 0;
}
