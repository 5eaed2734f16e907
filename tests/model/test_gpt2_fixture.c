// GPT-2 against PyTorch (tests/fixtures/make_gpt2_fixtures.py, float64 reference): logits at
// every position, loss, every parameter gradient, 5 AdamW steps with clipping (losses,
// gradient norms, final parameters), and the bf16 (version 5) model file.
//   test_gpt2_fixture DIR [DEVICE PRECISION]
// On the CPU (the default) and on a GPU in fp32 every value is within 1e-5 relative; a GPU in
// bf16 within 5e-2 (bf16 keeps 8 bits). Without the device the program exits 77 (skipped).
#include "harness.h"

#include "backend/backend.h"
#include "ckpt/llmc_model.h"
#include "model/gpt2.h"
#include "optim/adamw.h"

#include <string.h>

typedef struct {
    int32_t h[256];
    int B, T, V, Vp, steps;
    int64_t n;
    int32_t *x, *y;
    float *logits, loss, *grads, *step_losses, *step_norms, *final, loss_bf16;
    float lr, beta1, beta2, eps, wd, clip;
} fixture;

static void read_exact(FILE *f, void *p, size_t bytes) {
    if (fread(p, 1, bytes, f) != bytes) {
        fprintf(stderr, "fixture truncated\n");
        exit(1);
    }
}

static float *read_floats(FILE *f, size_t n) {
    float *p = malloc(n * sizeof(float));
    read_exact(f, p, n * sizeof(float));
    return p;
}

static fixture load_fixture(const char *dir) {
    char path[1024];
    snprintf(path, sizeof path, "%s/gpt2_tiny_debug.bin", dir);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        exit(1);
    }
    fixture fx;
    read_exact(f, fx.h, sizeof fx.h);
    if (fx.h[0] != 20241123) exit(1);
    fx.B = fx.h[2], fx.T = fx.h[3], fx.V = fx.h[4], fx.Vp = fx.h[5], fx.steps = fx.h[6], fx.n = fx.h[10];
    float hp[6];
    memcpy(hp, &fx.h[16], sizeof hp);
    fx.lr = hp[0], fx.beta1 = hp[1], fx.beta2 = hp[2], fx.eps = hp[3], fx.wd = hp[4], fx.clip = hp[5];
    size_t BT = (size_t)fx.B * fx.T;
    fx.x = malloc(BT * sizeof(int32_t));
    fx.y = malloc(BT * sizeof(int32_t));
    read_exact(f, fx.x, BT * sizeof(int32_t));
    read_exact(f, fx.y, BT * sizeof(int32_t));
    fx.logits = read_floats(f, BT * (size_t)fx.V);
    read_exact(f, &fx.loss, sizeof(float));
    fx.grads = read_floats(f, (size_t)fx.n);
    fx.step_losses = read_floats(f, (size_t)fx.steps);
    fx.step_norms = read_floats(f, (size_t)fx.steps);
    fx.final = read_floats(f, (size_t)fx.n);
    read_exact(f, &fx.loss_bf16, sizeof(float));
    fclose(f);
    return fx;
}

static loom_gpt2 *load_model(loom_backend *be, const char *dir, const char *file) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    loom_gpt2_config cfg;
    float *params;
    int64_t n;
    loom_gpt2 *m;
    if (loom_llmc_read(path, &cfg, &params, &n) != LOOM_OK || loom_gpt2_create(&m, be, &cfg) != LOOM_OK) {
        fprintf(stderr, "cannot load %s: %s\n", path, loom_error_message());
        exit(1);
    }
    loom_gpt2_set_params(m, params);
    free(params);
    return m;
}

static double rel(double a, double b) { return fabs(a - b) / fabs(b); }

static double tol = 1e-5;

// logits at every (b, t) through next_logits on the prefix, against PyTorch's
static void check_logits(loom_gpt2 *m, const fixture *fx) {
    float *row = malloc((size_t)fx->Vp * sizeof(float));
    double worst = 0;
    for (int b = 0; b < fx->B; b++)
        for (int t = 0; t < fx->T; t++) {
            loom_gpt2_next_logits(m, fx->x + b * fx->T, t + 1, row);
            double e = t_max_rel_err(row, fx->logits + ((size_t)b * fx->T + t) * fx->V, (size_t)fx->V);
            if (e > worst) worst = e;
        }
    T_ASSERT(worst < tol, "logits max rel err %g", worst);
    free(row);
}

static void check_grads(loom_gpt2 *m, const fixture *fx) {
    float *g = malloc((size_t)m->num_elements * sizeof(float));
    loom_gpt2_get_grads(m, g);
    loom_gpt2_tensor specs[LOOM_GPT2_NUM_TENSORS];
    loom_gpt2_file_layout(&m->cfg, specs);
    for (int t = 0; t < LOOM_GPT2_NUM_TENSORS; t++) {
        const loom_gpt2_tensor *s = &specs[t];
        double e = t_max_rel_err(g + s->offset, fx->grads + s->offset, (size_t)s->numel);
        T_ASSERT(e < tol, "gradient of %s: max rel err %g", s->name, e);
    }
    free(g);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "tests/fixtures", *device = argc > 2 ? argv[2] : "cpu";
    bool bf16 = argc > 3 && strcmp(argv[3], "bf16") == 0;
    if (bf16) tol = 5e-2;
    fixture fx = load_fixture(dir);
    loom_backend *be;
    loom_status st = loom_backend_create(&be, device, bf16 ? LOOM_BF16 : LOOM_F32);
    if (st == LOOM_EUNSUPPORTED && strcmp(device, "cpu") != 0) {
        printf("skipped: %s\n", loom_error_message());
        return 77;
    }
    if (st != LOOM_OK) return 1;
    printf("device %s, %s, tolerance %g\n", device, loom_dtype_name(be->dtype), tol);
    loom_gpt2 *m = load_model(be, dir, "gpt2_tiny.bin");
    T_ASSERT(m->num_elements == fx.n && m->cfg.vocab_size == fx.V, "config matches fixture");

    // forward (every position), loss, gradients
    T_ASSERT(loom_gpt2_alloc(m, 1, fx.T, false) == LOOM_OK, "alloc inference");
    check_logits(m, &fx);
    T_ASSERT(loom_gpt2_alloc(m, fx.B, fx.T, true) == LOOM_OK, "alloc training");
    double loss = loom_gpt2_loss(m, fx.x, fx.y, fx.B, fx.T);
    T_ASSERT(rel(loss, fx.loss) < tol, "loss %.7f vs %.7f", loss, (double)fx.loss);
    loom_gpt2_zero_grads(m);
    loss = loom_gpt2_forward_backward(m, fx.x, fx.y, fx.B, fx.T, 1.0f);
    T_ASSERT(rel(loss, fx.loss) < tol, "train loss %.7f vs %.7f", loss, (double)fx.loss);
    check_grads(m, &fx);

    // 5 AdamW steps with clipping on the same batch
    loom_param_slice all = {0, 0, m->num_elements};
    loom_adamw *opt;
    T_ASSERT(loom_adamw_create(&opt, be, &m->table, &all, 1, m->num_elements, false, LOOM_ADAMW_ON_DEVICE, false) == LOOM_OK, "opt");
    loom_adamw_init_master(opt, m->params, m->num_elements);
    loom_adamw_config cfg = {.lr = fx.lr, .beta1 = fx.beta1, .beta2 = fx.beta2, .eps = fx.eps, .weight_decay = fx.wd,
                             .grad_clip = fx.clip};
    for (int s = 0; s < fx.steps; s++) {
        loom_gpt2_zero_grads(m);
        double l = loom_gpt2_forward_backward(m, fx.x, fx.y, fx.B, fx.T, 1.0f);
        double norm = sqrt(be->sumsq(be, loom_view_dims(m->grads, be->dtype, &m->num_elements, 1)));
        loom_adamw_step(opt, m->params, m->grads, fx.lr, &cfg, loom_clip_scale(norm, fx.clip));
        T_ASSERT(rel(l, fx.step_losses[s]) < tol, "step %d loss %.7f vs %.7f", s, l, (double)fx.step_losses[s]);
        T_ASSERT(rel(norm, fx.step_norms[s]) < tol, "step %d norm %.7f vs %.7f", s, norm, (double)fx.step_norms[s]);
    }
    float *p = malloc((size_t)m->num_elements * sizeof(float));
    loom_gpt2_get_params(m, p);
    double e = t_max_rel_err(p, fx.final, (size_t)m->num_elements);
    T_ASSERT(e < tol, "parameters after %d steps: max rel err %g", fx.steps, e);
    free(p);
    loom_adamw_free(opt);
    loom_gpt2_free(m);

    // the bf16 (version 5) file of the same weights
    m = load_model(be, dir, "gpt2_tiny_bf16.bin");
    T_ASSERT(loom_gpt2_alloc(m, fx.B, fx.T, false) == LOOM_OK, "alloc bf16");
    loss = loom_gpt2_loss(m, fx.x, fx.y, fx.B, fx.T);
    T_ASSERT(rel(loss, fx.loss_bf16) < tol, "bf16 model loss %.7f vs %.7f", loss, (double)fx.loss_bf16);
    loom_gpt2_free(m);
    loom_backend_destroy(be);
    return t_done("gpt2_fixture");
}
