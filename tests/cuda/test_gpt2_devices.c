// The whole model on a GPU against the CPU reference: the same initial parameters (the
// layout-invariant RNG of gpt2_params.c), the same random batch, one forward and backward;
// the loss and every parameter tensor's gradient are compared, in fp32 mode and in bf16 mode,
// for a tiny config and for gpt2 (124M) at B=2, T=256. The gradient buffers hold NaN before
// zero_grads, so a tensor the backward neither writes nor adds to a zeroed one fails.
//   test_gpt2_devices [DEVICE]          (default cuda; exit 77 when there is none)
// Bounds: fp32 loss within 1e-5 and each gradient tensor within 1e-4 (norm-relative); bf16
// loss within 1e-2 and each gradient tensor within 5e-2 (bf16 activations and gradients keep
// 8 bits through every layer).
#include "harness.h"

#include "backend/backend.h"
#include "model/gpt2.h"

#include <string.h>

// loss and gradients (host fp32) of one forward/backward of cfg on be
static double run(loom_backend *be, const loom_gpt2_config *cfg, const int32_t *x, const int32_t *y,
                  int B, int T, float **grads, int64_t *n) {
    loom_gpt2 *m = NULL;
    LOOM_CHECK(loom_gpt2_create(&m, be, cfg) == LOOM_OK);
    loom_gpt2_init(m, 4242);
    LOOM_CHECK(loom_gpt2_alloc(m, B, T, true) == LOOM_OK);
    size_t bytes = (size_t)m->num_elements * loom_dtype_size(be->dtype);
    void *nan = loom_xmalloc(bytes); // every byte 0xFF, NaN in fp32 and bf16: zero_grads must leave no
    memset(nan, 0xFF, bytes);        // tensor that the backward neither writes nor adds to a zero
    be->upload(be, m->grads, nan, bytes);
    free(nan);
    loom_gpt2_zero_grads(m);
    double loss = loom_gpt2_forward_backward(m, x, y, B, T, 1.0f);
    *n = m->num_elements;
    *grads = loom_xmalloc((size_t)*n * sizeof(float));
    loom_gpt2_get_grads(m, *grads);
    loom_gpt2_free(m);
    return loss;
}

static void compare(const char *name, const loom_gpt2_config *cfg, loom_backend *cpu,
                    loom_backend *gpu, int B, int T) {
    bool bf = gpu->dtype == LOOM_BF16;
    double tol_loss = bf ? 1e-2 : 1e-5, tol_grad = bf ? 5e-2 : 1e-4;
    size_t BT = (size_t)B * T;
    int32_t *x = loom_xmalloc(BT * sizeof(int32_t)), *y = loom_xmalloc(BT * sizeof(int32_t));
    for (size_t i = 0; i < BT; i++) {
        x[i] = t_randint(0, cfg->vocab_size - 1);
        y[i] = t_randint(0, cfg->vocab_size - 1);
    }
    float *gc, *gg;
    int64_t nc, ng;
    double lc = run(cpu, cfg, x, y, B, T, &gc, &nc), lg = run(gpu, cfg, x, y, B, T, &gg, &ng);
    LOOM_CHECK(nc == ng);
    double el = fabs(lg - lc) / fabs(lc);
    T_ASSERT(el < tol_loss, "%s %s: loss %.7f vs cpu %.7f (rel %.3g)", name, bf ? "bf16" : "fp32", lg, lc, el);
    loom_gpt2_tensor specs[LOOM_GPT2_NUM_TENSORS];
    loom_gpt2_file_layout(cfg, specs);
    double worst = 0;
    int worst_t = 0;
    for (int t = 0; t < LOOM_GPT2_NUM_TENSORS; t++) {
        double e = t_max_rel_err(gg + specs[t].offset, gc + specs[t].offset, (size_t)specs[t].numel);
        T_ASSERT(e < tol_grad, "%s %s: gradient of %s: rel err %.3g", name, bf ? "bf16" : "fp32", specs[t].name, e);
        if (e > worst || e != e) worst = e, worst_t = t;
    }
    printf("%-6s %s  loss %.6f vs cpu %.6f (rel %.2g)  worst gradient %s rel %.2g\n", name,
           bf ? "bf16" : "fp32", lg, lc, el, specs[worst_t].name, worst);
    free(x), free(y), free(gc), free(gg);
}

int main(int argc, char **argv) {
    const char *device = argc > 1 ? argv[1] : "cuda";
    t_seed();
    loom_backend *cpu = NULL, *gpu = NULL;
    if (loom_backend_create(&gpu, device, LOOM_F32) != LOOM_OK) {
        printf("skipped: %s\n", loom_error_message());
        return 77;
    }
    loom_backend_destroy(gpu);
    LOOM_CHECK(loom_backend_create(&cpu, "cpu", LOOM_F32) == LOOM_OK);
    loom_gpt2_config tiny = {.max_seq_len = 64, .vocab_size = 1000, .padded_vocab_size = 1024,
                             .num_layers = 2, .num_heads = 4, .channels = 256}, gpt2;
    LOOM_CHECK(loom_gpt2_config_named("gpt2", &gpt2) == LOOM_OK);
    for (int bf = 0; bf < 2; bf++) {
        LOOM_CHECK(loom_backend_create(&gpu, device, bf ? LOOM_BF16 : LOOM_F32) == LOOM_OK);
        compare("tiny", &tiny, cpu, gpu, 3, 61);
        compare("gpt2", &gpt2, cpu, gpu, 2, 256);
        loom_backend_destroy(gpu);
    }
    loom_backend_destroy(cpu);
    return t_done("gpt2_devices");
}
