// `loom bench`: timed training steps on random tokens for a named config. Prints tokens/s,
// achieved FLOP rate (6N + 6LTC FLOPs per token) against the backend's own measured matmul
// rate, the step split into forward / backward / optimizer, and peak memory (the backend's
// allocations: device memory on a GPU).
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/flags.h"
#include "core/log.h"
#include "core/rng.h"
#include "core/timer.h"
#include "optim/adamw.h"

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

int loom_cmd_bench(int argc, char **argv) {
    const char *model = "gpt2", *device = "auto", *precision = "auto", *recompute = "none";
    int B = 4, T = 0, steps = 3, warmup = 1, threads = 0;
    float peak_tflops = 0;
    const loom_flag flags[] = {
        {"model", FLAG_STR, &model, "named config"},
        {"batch", FLAG_INT, &B, "micro-batch size B"},
        {"seq", FLAG_INT, &T, "sequence length T (0: the model's maximum)"},
        {"steps", FLAG_INT, &steps, "timed steps"},
        {"warmup", FLAG_INT, &warmup, "untimed steps first"},
        {"peak-tflops", FLAG_FLOAT, &peak_tflops, "hardware peak for MFU (0: 989 dense bf16 on a GPU, none on the cpu)"},
        {"recompute", FLAG_STR, &recompute, "none, gelu or full"},
        {"device", FLAG_STR, &device, CLI_DEVICE_HELP},
        {"precision", FLAG_STR, &precision, CLI_PRECISION_HELP},
        {"threads", FLAG_INT, &threads, "CPU threads (0: all cores)"},
    };
    const loom_cli cli = {"bench", "Time training steps of a named config on random tokens.",
                          "loom bench [--model NAME --batch B --seq T --steps N]", flags,
                          (int)(sizeof flags / sizeof flags[0]), 0};
    bool help;
    char **pos;
    int npos;
    loom_backend *be = NULL;
    loom_gpt2 *m = NULL;
    loom_adamw *opt = NULL;
    loom_gpt2_config cfg;
    loom_status s = loom_flags_parse(&cli, argc, argv, &help, &pos, &npos);
    if (s == LOOM_OK && help) return 0;
    if (s == LOOM_OK && (steps < 1 || warmup < 0))
        s = loom_fail(LOOM_EINVAL, "use --steps >= 1 and --warmup >= 0", "bad --steps %d / --warmup %d", steps, warmup);
    if (s == LOOM_OK) s = cli_model_config(model, 0, 0, 0, 0, &cfg);
    if (s == LOOM_OK) s = cli_open_backend(device, precision, threads, 0, &be);
    if (s == LOOM_OK && peak_tflops == 0 && strcmp(be->name, "cuda") == 0) peak_tflops = 989; // H100/H200 dense bf16
    if (s == LOOM_OK) s = loom_gpt2_create(&m, be, &cfg);
    if (s == LOOM_OK) {
        T = T ? T : cfg.max_seq_len;
        loom_gpt2_init(m, 1337);
        s = loom_recompute_parse(recompute, &m->recompute);
        if (s == LOOM_OK) s = loom_gpt2_alloc(m, B, T, true);
    }
    if (s == LOOM_OK) {
        loom_param_range all = {0, 0, m->num_elements, true};
        s = loom_adamw_create(&opt, be, m->num_elements, &all, 1);
    }
    if (s != LOOM_OK) {
        loom_print_error();
        loom_gpt2_free(m);
        loom_backend_destroy(be);
        return 1;
    }
    size_t n = (size_t)B * T;
    int32_t *x = loom_xmalloc(n * sizeof(int32_t)), *y = loom_xmalloc(n * sizeof(int32_t));
    for (size_t i = 0; i < n; i++) {
        x[i] = (int32_t)loom_rng_below(7, 1, i, (uint64_t)cfg.vocab_size);
        y[i] = (int32_t)loom_rng_below(7, 2, i, (uint64_t)cfg.vocab_size);
    }
    loom_adamw_config ac = {.lr = 6e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                            .grad_clip = 1.0f};
    double *t_fwd = loom_xmalloc((size_t)steps * sizeof(double)), *t_fb = loom_xmalloc((size_t)steps * sizeof(double));
    double *t_opt = loom_xmalloc((size_t)steps * sizeof(double));
    for (int i = -warmup; i < steps; i++) {
        double t0 = loom_now();
        loom_gpt2_loss(m, x, y, B, T);
        be->synchronize(be);
        double t1 = loom_now();
        loom_gpt2_zero_grads(m);
        loom_gpt2_forward_backward(m, x, y, B, T, 1.0f);
        be->synchronize(be);
        double t2 = loom_now();
        double norm = loom_grad_norm(be, m->grads, m->num_elements);
        loom_adamw_step(opt, m->params, m->grads, ac.lr, &ac, loom_clip_scale(norm, ac.grad_clip));
        be->synchronize(be);
        double t3 = loom_now();
        if (i >= 0) t_fwd[i] = t1 - t0, t_fb[i] = t2 - t1, t_opt[i] = t3 - t2;
    }
    double fwd = median(t_fwd, steps), fb = median(t_fb, steps), op = median(t_opt, steps);
    double step = fb + op, flops = loom_gpt2_flops_per_token(&cfg, T) * (double)n;
    char params[32], peak[32];
    cli_human_count(params, sizeof params, (double)loom_gpt2_num_params(&cfg));
    cli_human_bytes(peak, sizeof peak, (double)be->peak_bytes); // the training's, not matmul_rate's
    double mm = matmul_rate(be, 2048);
    printf("bench %s (%s params) B=%d T=%d on %s, %d threads, median of %d steps\n", model, params, B,
           T, be->name, omp_get_max_threads(), steps);
    printf("| step ms | fwd ms | bwd ms | opt ms | tokens/s | GFLOP/s | matmul GFLOP/s | ratio |%s peak mem |\n",
           peak_tflops > 0 ? " MFU |" : "");
    printf("| %7.1f | %6.1f | %6.1f | %6.1f | %8.0f | %7.1f | %14.1f | %4.0f%% |", step * 1e3, fwd * 1e3,
           (fb - fwd) * 1e3, op * 1e3, (double)n / step, flops / step / 1e9, mm / 1e9,
           100.0 * flops / step / mm);
    if (peak_tflops > 0) printf(" %4.1f%% |", 100.0 * flops / step / (peak_tflops * 1e12));
    printf(" %s |\n", peak);
    free(x);
    free(y);
    free(t_fwd);
    free(t_fb);
    free(t_opt);
    loom_adamw_free(opt);
    loom_gpt2_free(m);
    loom_backend_destroy(be);
    return 0;
}
