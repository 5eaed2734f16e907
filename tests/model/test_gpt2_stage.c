// The stage API a pipeline schedule drives, on fresh random inputs (CPU, fp32):
// - two micro-batches in flight in two slots (forward 0, forward 1, backward 1, backward 0)
//   give the losses of the one-slot path bit for bit and its accumulated gradients within 1e-6;
// - the model cut into two stages in one process (embedding + block 0 | blocks 1..L-1 + head,
//   the head stage with its own copy of the tied wte), the activation and its gradient handed
//   across, gives the whole model's loss and every gradient bit for bit (wte: the two copies'
//   gradients summed, within 1e-6);
// - a stage of two non-adjacent chunks (the V-shaped schedules' first rank: embedding + block 0
//   and block 2 + head) with the middle block in another object, the backward split into its
//   input and weight halves (zero bubble) on both, gives the whole model's loss and every
//   gradient bit for bit;
// - the hooks run before each layer's forward and backward and when its gradients are final,
//   in the order a backward pass makes them final (L, L-1, ..., 0, -1).
#include "harness.h"

#include "model/gpt2.h"

#include <string.h>

enum { B = 2, T = 13 };

static loom_gpt2_config tiny(void) {
    return (loom_gpt2_config){.max_seq_len = 24, .vocab_size = 97, .padded_vocab_size = 128, .num_layers = 3,
                              .num_heads = 2, .channels = 16};
}

static loom_gpt2 *model_split(loom_backend *be, const loom_stage *stage, int slots, bool split) {
    loom_gpt2_config cfg = tiny();
    loom_gpt2_layout layout = {*stage, 0, 1, false, false};
    loom_gpt2 *m;
    LOOM_CHECK(loom_gpt2_create_layout(&m, be, &cfg, &layout) == LOOM_OK);
    loom_gpt2_init(m, 5);
    m->slots = slots;
    m->split_backward = split;
    LOOM_CHECK(loom_gpt2_alloc(m, B, T, true) == LOOM_OK);
    loom_gpt2_zero_grads(m);
    return m;
}

static loom_gpt2 *model(loom_backend *be, const loom_stage *stage, int slots) {
    return model_split(be, stage, slots, false);
}

// Every gradient of `got` (file order) equals `want`'s bit for bit; wte within 1e-6 when
// loose_wte (its accumulation order differs).
static void same_grads(const loom_gpt2_config *cfg, const float *got, const float *want, bool loose_wte,
                       const char *what) {
    loom_gpt2_tensor f[LOOM_GPT2_NUM_TENSORS];
    loom_gpt2_file_layout(cfg, f);
    for (int t = 0; t < LOOM_GPT2_NUM_TENSORS; t++) {
        const loom_gpt2_tensor *s = &f[t];
        int64_t differ = 0;
        double worst = 0;
        for (int64_t i = s->offset; i < s->offset + s->numel; i++) {
            differ += memcmp(&got[i], &want[i], sizeof(float)) != 0;
            worst = fmax(worst, fabs((double)got[i] - want[i]));
        }
        if (t == P_WTE && loose_wte)
            T_ASSERT(worst < 1e-6 * t_max_abs(want + s->offset, (size_t)s->numel), "%s: wte gradient %g", what, worst);
        else T_ASSERT(differ == 0, "%s: gradient of %s: %lld values differ", what, s->name, (long long)differ);
    }
}

static float *file_grads(loom_gpt2 *m) {
    float *g = calloc((size_t)loom_gpt2_file_elements(&m->cfg), sizeof(float));
    loom_gpt2_get_grads(m, g);
    return g;
}

// The gradients of the model split into a and b (disjoint but for the tied wte's two copies,
// summed) against the whole model w's, as same_grads; frees the three.
static void same_split_grads(loom_gpt2 *w, loom_gpt2 *a, loom_gpt2 *b, bool loose_wte, const char *what) {
    float *gw = file_grads(w), *ga = file_grads(a), *gb = file_grads(b);
    for (int64_t i = 0; i < loom_gpt2_file_elements(&w->cfg); i++) ga[i] += gb[i];
    same_grads(&w->cfg, ga, gw, loose_wte, what);
    free(gw);
    free(ga);
    free(gb);
    loom_gpt2_free(w);
    loom_gpt2_free(a);
    loom_gpt2_free(b);
}

static void test_slots(loom_backend *be, const int32_t *x, const int32_t *y) {
    loom_gpt2_config cfg = tiny();
    loom_stage whole = loom_gpt2_whole(&cfg);
    loom_gpt2 *one = model(be, &whole, 1), *two = model(be, &whole, 2);
    double l0 = loom_gpt2_forward_backward(one, x, y, B, T, 0.5f);
    double l1 = loom_gpt2_forward_backward(one, x + B * T, y + B * T, B, T, 0.5f);
    double s0, s1;
    loom_gpt2_set_batch(two, 0, x, y, B, T);
    loom_gpt2_set_batch(two, 1, x + B * T, y + B * T, B, T);
    loom_gpt2_stage_forward(two, 0, 0, (loom_tensor){0}, true, 0.5f, &s0);
    loom_gpt2_stage_forward(two, 1, 0, (loom_tensor){0}, true, 0.5f, &s1);
    loom_gpt2_stage_backward(two, 1, 0, (loom_tensor){0}, LOOM_GRAD_ALL);
    loom_gpt2_stage_backward(two, 0, 0, (loom_tensor){0}, LOOM_GRAD_ALL);
    T_ASSERT(s0 == l0 && s1 == l1, "slot losses %.9f %.9f vs %.9f %.9f", s0, s1, l0, l1);
    float *ga = file_grads(one), *gb = file_grads(two);
    double e = t_max_rel_err(gb, ga, (size_t)one->num_elements);
    T_ASSERT(e < 1e-6, "two slots' gradients vs one slot: %g", e);
    T_ASSERT(loom_gpt2_memory_bytes(two, NULL) > loom_gpt2_memory_bytes(one, NULL), "a second slot takes memory");
    free(ga);
    free(gb);
    loom_gpt2_free(one);
    loom_gpt2_free(two);
}

static void test_two_stages(loom_backend *be, const int32_t *x, const int32_t *y) {
    loom_gpt2_config cfg = tiny();
    loom_stage whole = loom_gpt2_whole(&cfg), first = {1, {{0, 1}}, true, false},
               last = {1, {{1, cfg.num_layers - 1}}, false, true};
    loom_gpt2 *w = model(be, &whole, 1), *a = model(be, &first, 1), *b = model(be, &last, 1);
    double lw = loom_gpt2_forward_backward(w, x, y, B, T, 1.0f), la = 0, lb;
    loom_gpt2_set_batch(a, 0, x, NULL, B, T);
    loom_gpt2_set_batch(b, 0, NULL, y, B, T);
    loom_tensor act = loom_gpt2_stage_forward(a, 0, 0, (loom_tensor){0}, true, 1.0f, &la);
    loom_gpt2_stage_forward(b, 0, 0, act, true, 1.0f, &lb);
    loom_tensor dact = loom_gpt2_stage_backward(b, 0, 0, (loom_tensor){0}, LOOM_GRAD_ALL);
    loom_tensor none = loom_gpt2_stage_backward(a, 0, 0, dact, LOOM_GRAD_ALL);
    T_ASSERT(lb == lw && none.data == NULL, "two stages' loss %.9f vs %.9f", lb, lw);
    same_split_grads(w, a, b, true, "two stages");
}

// Two micro-batches through a V: object a holds chunks {block 0} (with the embedding) and
// {block 2} (with the head), b holds block 1, each (micro-batch, chunk) in a slot of its own;
// the backward split (F0 I0 F1 I1 W0 W1: the whole model's accumulation order).
static void test_v_split(loom_backend *be, const int32_t *x, const int32_t *y) {
    loom_gpt2_config cfg = tiny();
    loom_stage whole = loom_gpt2_whole(&cfg), ends = {2, {{0, 1}, {2, 1}}, true, true}, mid = {1, {{1, 1}}, false, false};
    loom_gpt2 *w = model(be, &whole, 1), *a = model_split(be, &ends, 4, true), *b = model_split(be, &mid, 2, true);
    double lw[2], la[2], unused;
    for (int mb = 0; mb < 2; mb++) {
        const int32_t *xm = x + mb * B * T, *ym = y + mb * B * T;
        lw[mb] = loom_gpt2_forward_backward(w, xm, ym, B, T, 0.5f);
        int s0 = 2 * mb, s1 = 2 * mb + 1; // a's slots of (mb, chunk 0) and (mb, chunk 1)
        loom_gpt2_set_batch(a, s0, xm, NULL, B, T);
        loom_gpt2_set_batch(a, s1, NULL, ym, B, T);
        loom_gpt2_set_batch(b, mb, NULL, NULL, B, T);
        loom_tensor h = loom_gpt2_stage_forward(a, s0, 0, (loom_tensor){0}, true, 0.5f, &unused);
        h = loom_gpt2_stage_forward(b, mb, 0, h, true, 0.5f, &unused);
        loom_gpt2_stage_forward(a, s1, 1, h, true, 0.5f, &la[mb]);
        loom_tensor d = loom_gpt2_stage_backward(a, s1, 1, (loom_tensor){0}, LOOM_GRAD_INPUT);
        d = loom_gpt2_stage_backward(b, mb, 0, d, LOOM_GRAD_INPUT);
        d = loom_gpt2_stage_backward(a, s0, 0, d, LOOM_GRAD_INPUT);
        T_ASSERT(d.data == NULL, "the embedding's chunk returns no input gradient");
    }
    for (int mb = 0; mb < 2; mb++) {
        loom_gpt2_stage_backward(b, mb, 0, (loom_tensor){0}, LOOM_GRAD_WEIGHT);
        loom_gpt2_stage_backward(a, 2 * mb + 1, 1, (loom_tensor){0}, LOOM_GRAD_WEIGHT);
        loom_gpt2_stage_backward(a, 2 * mb, 0, (loom_tensor){0}, LOOM_GRAD_WEIGHT);
    }
    T_ASSERT(la[0] == lw[0] && la[1] == lw[1], "V losses %.9f %.9f vs %.9f %.9f", la[0], la[1], lw[0], lw[1]);
    T_ASSERT(a->table.params[a->table.count - 1].counted, "a stage with both ends counts its one wte");
    same_split_grads(w, a, b, false, "V split");
}

typedef struct {
    char seen[64];
    int n;
} trace;

static void record(trace *tr, char kind, int layer) {
    if (tr->n + 2 < (int)sizeof tr->seen) tr->seen[tr->n++] = kind, tr->seen[tr->n++] = (char)('1' + layer);
}
static void on_forward(void *ctx, int layer) { record(ctx, 'f', layer); }
static void on_backward(void *ctx, int layer) { record(ctx, 'b', layer); }
static void on_grads(void *ctx, int layer) { record(ctx, 'g', layer); }

static void test_hooks(loom_backend *be, const int32_t *x, const int32_t *y) {
    loom_gpt2_config cfg = tiny();
    loom_stage whole = loom_gpt2_whole(&cfg);
    loom_gpt2 *m = model(be, &whole, 1);
    trace tr = {{0}, 0};
    loom_hooks_add(&m->hooks, LOOM_HOOK_FORWARD, on_forward, &tr);
    loom_hooks_add(&m->hooks, LOOM_HOOK_BACKWARD, on_backward, &tr);
    loom_hooks_add(&m->hooks, LOOM_HOOK_GRADS, on_grads, &tr);
    loom_gpt2_forward_backward(m, x, y, B, T, 1.0f);
    // layers as '1' + layer: -1 -> '0', 0..2 -> '1'..'3', L = 3 -> '4'
    T_ASSERT(strcmp(tr.seen, "f0f1f2f3f4b4g4b3g3b2g2b1g1b0g0") == 0, "hook order %s", tr.seen);
    loom_gpt2_free(m);
}

int main(void) {
    t_seed();
    loom_backend *be;
    if (loom_backend_create(&be, "cpu", LOOM_F32) != LOOM_OK) return 1;
    int32_t x[2 * B * T], y[2 * B * T];
    for (int i = 0; i < 2 * B * T; i++) x[i] = t_randint(0, 96), y[i] = t_randint(0, 96);
    test_slots(be, x, y);
    test_two_stages(be, x, y);
    test_v_split(be, x, y);
    test_hooks(be, x, y);
    loom_backend_destroy(be);
    return t_done("gpt2_stage");
}
