// AdamW with its per-step values in backend memory (loom_adamw_step_scalars: what the step
// recorded by --cuda-graphs runs, train/step_graph.c) against the same steps with the values
// passed (loom_adamw_step), on the CPU backend, whose backend memory is host memory:
//   - parameters, moments and the step count bit-identical over steps at several learning rates,
//     clipped and not, over a tiny GPT-2's ranges (weight decay on some, off others);
//   - the sum of squares that sumsq_add adds up over several runs equal, to the bit, to the host's
//     fp64 sum of sumsq's results, and step_scalars' clipping factor to loom_clip_scale's;
//   - a step whose losses or norm are not finite (NaN or infinite) is skipped: parameters and
//     moments untouched;
//   - where the master weights are held split (bf16 on the device, rounded to nearest) and the
//     state's bytes a parameter: moments 8, master weights 2 split, 4 whole, none in fp32.
#include "harness.h"

#include "model/gpt2.h"
#include "optim/adamw.h"

#include <string.h>

static loom_backend *be;

// n floats: the same bits?
static bool same(const void *a, const void *b, int64_t n) { return memcmp(a, b, (size_t)n * sizeof(float)) == 0; }

// The sum of squares of grads (n) in three uneven runs: on the host as the data-parallel code
// sums them, and added into sc->sumsq by sumsq_add; the two must be the same bits.
static double sum_runs(const float *grads, int64_t n, loom_step_scalars *sc) {
    int64_t edge[4] = {0, n / 7, n / 2 + 3, n};
    double host = 0;
    for (int r = 0; r < 3; r++) {
        int64_t len = edge[r + 1] - edge[r];
        loom_tensor run = loom_view_dims((void *)(grads + edge[r]), LOOM_F32, &len, 1);
        host += be->sumsq(be, run);
        be->sumsq_add(be, &sc->sumsq, run);
    }
    T_ASSERT(memcmp(&host, &sc->sumsq, sizeof host) == 0, "sumsq_add %.17g vs the host's sum %.17g", sc->sumsq, host);
    return host;
}

// Steps of two optimizers over the same parameters and gradients: a by the values, b by the
// scalars; after each, both the same to the bit.
static void test_steps(loom_gpt2 *model) {
    int64_t n = model->num_elements;
    loom_param_slice all = {0, 0, n};
    loom_adamw *a, *b;
    T_ASSERT(loom_adamw_create(&a, be, &model->table, &all, 1, n, false, LOOM_ADAMW_ON_DEVICE, false) == LOOM_OK, "a");
    T_ASSERT(loom_adamw_create(&b, be, &model->table, &all, 1, n, false, LOOM_ADAMW_ON_DEVICE, false) == LOOM_OK, "b");
    T_ASSERT(a->nranges > 1, "a tiny GPT-2 has ranges with and without weight decay: %d", a->nranges);
    loom_adamw_config cfg = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1.0f};
    float *pa = malloc((size_t)n * sizeof(float)), *pb = malloc((size_t)n * sizeof(float));
    float *g = malloc((size_t)n * sizeof(float)), losses[37];
    t_fill_normal(pa, (size_t)n, 0.02f);
    memcpy(pb, pa, (size_t)n * sizeof(float));
    t_fill_normal(losses, 37, 3);
    for (int s = 0; s < 6; s++) {
        float lr = 1e-3f * (float)(s + 1), scale = s % 2 ? 1e-4f : 1.0f; // clipped at even steps
        if (s == 5) cfg.grad_clip = 0;                                   // and clipping off
        t_fill_normal(g, (size_t)n, scale);
        loom_step_scalars sc;
        loom_adamw_scalars(b, &cfg, lr, &sc);
        T_ASSERT(sc.lr == lr && sc.t == b->t + 1 && sc.bc1 == loom_adamw_bias(cfg.beta1, sc.t) &&
                     sc.bc2 == loom_adamw_bias(cfg.beta2, sc.t) && sc.sumsq == 0 && sc.grad_scale == 0 && !sc.skip,
                 "step %d: the host's scalars", s);
        double norm = sqrt(sum_runs(g, n, &sc));
        float clip = loom_clip_scale(norm, cfg.grad_clip);
        be->step_scalars(be, &sc, LOOM_VIEW(losses, LOOM_F32, 37), cfg.grad_clip);
        T_ASSERT(memcmp(&sc.grad_scale, &clip, sizeof clip) == 0 && !sc.skip,
                 "step %d: step_scalars' factor %.9g vs loom_clip_scale %.9g (skip %d)", s, sc.grad_scale, clip, sc.skip);
        T_ASSERT((clip < 1) == (s % 2 == 0 && s < 5), "step %d: clipped %g", s, clip);
        loom_adamw_step(a, pa, g, lr, &cfg, clip);
        loom_adamw_step_scalars(b, pb, g, &cfg, &sc);
        b->t++; // the caller counts the step
        T_ASSERT(same(pa, pb, n) && same(a->m, b->m, n) && same(a->v, b->v, n) && a->t == b->t,
                 "step %d: the scalars' update differs from the values' (t %lld vs %lld)", s, (long long)a->t,
                 (long long)b->t);
    }
    free(pa), free(pb), free(g);
    loom_adamw_free(a);
    loom_adamw_free(b);
}

// A step with a loss or the norm not finite: step_scalars sets skip, and the update then changes
// nothing (the clipping factor is still loom_clip_scale's).
static void test_skip(loom_gpt2 *model) {
    int64_t n = model->num_elements;
    loom_param_slice all = {0, 0, n};
    loom_adamw *o;
    T_ASSERT(loom_adamw_create(&o, be, &model->table, &all, 1, n, false, LOOM_ADAMW_ON_DEVICE, false) == LOOM_OK, "o");
    loom_adamw_config cfg = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1.0f};
    float *p = malloc((size_t)n * sizeof(float)), *g = malloc((size_t)n * sizeof(float));
    float *p0 = malloc((size_t)n * sizeof(float)), *m0 = malloc((size_t)n * sizeof(float));
    float *v0 = malloc((size_t)n * sizeof(float)), losses[9];
    t_fill_normal(p, (size_t)n, 0.02f);
    t_fill_normal(g, (size_t)n, 1e-3f);
    loom_adamw_step(o, p, g, 1e-3f, &cfg, 1.0f); // moments that are not zero
    struct {
        float loss, grad; // losses[4] and g[3] of the case
        bool skip;
    } cases[] = {{NAN, 0.5f, true},      {INFINITY, 0.5f, true},  {-INFINITY, 0.5f, true}, {1e30f, 0.5f, false},
                 {2.0f, INFINITY, true}, {2.0f, NAN, true},       {2.0f, 1e30f, false}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        t_fill_normal(losses, 9, 1);
        losses[4] = cases[k].loss;
        t_fill_normal(g, (size_t)n, 1e-3f);
        g[3] = cases[k].grad;
        memcpy(p0, p, (size_t)n * sizeof(float));
        memcpy(m0, o->m, (size_t)n * sizeof(float));
        memcpy(v0, o->v, (size_t)n * sizeof(float));
        loom_step_scalars sc;
        loom_adamw_scalars(o, &cfg, 1e-3f, &sc);
        double norm = sqrt(sum_runs(g, n, &sc));
        be->step_scalars(be, &sc, LOOM_VIEW(losses, LOOM_F32, 9), cfg.grad_clip);
        float clip = loom_clip_scale(norm, cfg.grad_clip);
        T_ASSERT((sc.skip != 0) == cases[k].skip && memcmp(&sc.grad_scale, &clip, sizeof clip) == 0,
                 "case %zu (loss %g, gradient %g): skip %d, factor %g vs %g", k, cases[k].loss, cases[k].grad, sc.skip,
                 sc.grad_scale, clip);
        loom_adamw_step_scalars(o, p, g, &cfg, &sc);
        o->t++;
        bool untouched = same(p, p0, n) && same(o->m, m0, n) && same(o->v, v0, n);
        T_ASSERT(untouched == cases[k].skip, "case %zu: the parameters and moments %s", k,
                 untouched ? "did not change" : "changed");
    }
    free(p), free(g), free(p0), free(m0), free(v0);
    loom_adamw_free(o);
}

static void test_state_bytes(void) {
    T_ASSERT(loom_adamw_splits(LOOM_BF16, LOOM_ADAMW_ON_DEVICE, false), "bf16 on the device: split");
    T_ASSERT(!loom_adamw_splits(LOOM_BF16, LOOM_ADAMW_ON_DEVICE, true), "stochastic rounding: whole");
    T_ASSERT(!loom_adamw_splits(LOOM_BF16, LOOM_ADAMW_OFFLOAD_STATE, false), "offloaded: whole");
    T_ASSERT(!loom_adamw_splits(LOOM_F32, LOOM_ADAMW_ON_DEVICE, false), "fp32: none");
    T_ASSERT(loom_adamw_state_bytes(1000, LOOM_BF16, LOOM_ADAMW_ON_DEVICE, false) == 10000, "bf16 split: 10 B");
    T_ASSERT(loom_adamw_state_bytes(1000, LOOM_BF16, LOOM_ADAMW_ON_DEVICE, true) == 12000, "bf16 whole: 12 B");
    T_ASSERT(loom_adamw_state_bytes(1000, LOOM_BF16, LOOM_ADAMW_OFFLOAD_PARAMS, false) == 12000, "offloaded: 12 B");
    T_ASSERT(loom_adamw_state_bytes(1000, LOOM_F32, LOOM_ADAMW_ON_DEVICE, false) == 8000, "fp32: 8 B");
    T_ASSERT(loom_adamw_state_bytes(1000, LOOM_F32, LOOM_ADAMW_OFFLOAD_STATE, false) == 12000, "fp32 offloaded: 12 B");
}

int main(void) {
    t_seed();
    test_state_bytes();
    LOOM_CHECK(loom_backend_create(&be, "cpu", LOOM_F32) == LOOM_OK);
    loom_gpt2_config cfg = {.max_seq_len = 24, .vocab_size = 97, .padded_vocab_size = 128,
                            .num_layers = 2, .num_heads = 2, .channels = 16};
    loom_gpt2 *model;
    LOOM_CHECK(loom_gpt2_create(&model, be, &cfg) == LOOM_OK);
    test_steps(model);
    test_skip(model);
    loom_gpt2_free(model);
    loom_backend_destroy(be);
    return t_done("adamw_scalars");
}
