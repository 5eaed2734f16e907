// Training pieces on fresh random inputs: GPT-2 initialisation statistics and thread-count
// independence, gradient accumulation (2 micro-batches of B at scale 1/2 == one batch of 2B),
// activation recomputation (bit-identical gradients, less memory), the output layer by chunks of
// rows, the learning-rate schedules, and clipping.
#include "harness.h"

#include "backend/backend.h"
#include "model/gpt2.h"
#include "model/gpt2_internal.h"
#include "optim/adamw.h"
#include "optim/schedule.h"

#include <omp.h>
#include <string.h>

static loom_gpt2_config tiny(void) {
    return (loom_gpt2_config){.max_seq_len = 24, .vocab_size = 97, .padded_vocab_size = 128,
                              .num_layers = 2, .num_heads = 2, .channels = 16};
}

static void test_init(loom_backend *be, uint64_t seed) {
    loom_gpt2_config cfg = tiny();
    cfg.channels = 64;
    cfg.num_layers = 3;
    cfg.vocab_size = 1000;
    cfg.padded_vocab_size = 1024;
    loom_gpt2 *m;
    T_ASSERT(loom_gpt2_create(&m, be, &cfg) == LOOM_OK, "create");
    float *a = malloc((size_t)m->num_elements * sizeof(float)), *b = malloc((size_t)m->num_elements * sizeof(float));
    omp_set_num_threads(1);
    loom_gpt2_init(m, seed);
    loom_gpt2_get_params(m, a);
    omp_set_num_threads(2);
    loom_gpt2_init(m, seed);
    loom_gpt2_get_params(m, b);
    T_ASSERT(memcmp(a, b, (size_t)m->num_elements * sizeof(float)) == 0, "init independent of threads");
    float expect_std[LOOM_GPT2_NUM_TENSORS] = {0.02f, 0.02f, 0, 0, 0.02f, 0, 0.02f / sqrtf(6.0f), 0,
                                               0, 0, 0.02f, 0, 0.02f / sqrtf(6.0f), 0, 0, 0};
    loom_gpt2_tensor specs[LOOM_GPT2_NUM_TENSORS];
    T_ASSERT(loom_gpt2_file_layout(&cfg, specs) == m->num_elements && m->num_elements == loom_gpt2_file_elements(&cfg),
             "file layout of %lld elements", (long long)m->num_elements);
    for (int t = 0; t < LOOM_GPT2_NUM_TENSORS; t++) {
        const loom_gpt2_tensor *s = &specs[t];
        int64_t n = t == P_WTE ? (int64_t)cfg.vocab_size * cfg.channels : s->numel;
        double sum = 0, sq = 0;
        for (int64_t i = 0; i < n; i++) {
            sum += a[s->offset + i];
            sq += (double)a[s->offset + i] * a[s->offset + i];
        }
        double mean = sum / n, std = sqrt(sq / n - mean * mean);
        if (s->init == LOOM_INIT_NORMAL) {
            // Five standard errors: the sample mean's is std/sqrt(n), the sample std's std/sqrt(2n)
            // (wpe has only 24 x 64 draws, so a fixed 5% bound failed about one seed in 300).
            T_ASSERT(fabs(mean) < 5 * expect_std[t] / sqrt((double)n) + 1e-7, "%s mean %g", s->name, mean);
            T_ASSERT(fabs(std / expect_std[t] - 1) < 5 / sqrt(2.0 * n), "%s std %g vs %g (n %lld)", s->name, std,
                     (double)expect_std[t], (long long)n);
        } else {
            double v = s->init == LOOM_INIT_ONE ? 1.0 : 0.0;
            T_ASSERT(mean == v && std == 0, "%s constant %g", s->name, v);
        }
    }
    const loom_gpt2_tensor *wte = &specs[P_WTE];
    int padded_nonzero = 0;
    for (int64_t i = (int64_t)cfg.vocab_size * cfg.channels; i < wte->numel; i++) padded_nonzero += a[i] != 0;
    T_ASSERT(padded_nonzero == 0, "padded vocabulary rows are zero");
    free(a);
    free(b);
    loom_gpt2_free(m);
}

// The tiny model, initialised from seed, and n random input and target tokens.
static loom_gpt2 *tiny_model(loom_backend *be, uint64_t seed, int32_t *x, int32_t *y, int n) {
    loom_gpt2_config cfg = tiny();
    loom_gpt2 *m;
    T_ASSERT(loom_gpt2_create(&m, be, &cfg) == LOOM_OK, "create");
    loom_gpt2_init(m, seed);
    for (int i = 0; i < n; i++) x[i] = t_randint(0, cfg.vocab_size - 1), y[i] = t_randint(0, cfg.vocab_size - 1);
    return m;
}

// Every byte of the gradient buffer 0xFF: NaN in fp32 and in bf16
static void poison_grads(loom_gpt2 *m) {
    size_t bytes = (size_t)m->num_elements * loom_dtype_size(m->be->dtype);
    void *h = malloc(bytes);
    memset(h, 0xFF, bytes);
    m->be->upload(m->be, m->grads, h, bytes);
    free(h);
}

// Also: zero_grads leaves most tensors to be written by the next backward (grads_fresh, backend.h's
// grads_write) instead of zeroing them, so a buffer of NaN before it must give what a zeroed one
// gives (equal values: a written zero may be -0 where an added one is +0), and a second micro-batch
// must add.
static void test_accumulation(loom_backend *be, uint64_t seed) {
    int B = 2, T = 19;
    int32_t x[2 * 2 * 19], y[2 * 2 * 19];
    loom_gpt2 *m = tiny_model(be, seed, x, y, 2 * B * T);
    size_t bytes = (size_t)m->num_elements * sizeof(float);
    float *whole = malloc(bytes), *accum = malloc(bytes);
    T_ASSERT(loom_gpt2_alloc(m, 2 * B, T, true) == LOOM_OK, "alloc");
    loom_gpt2_zero_grads(m);
    double l_whole = loom_gpt2_forward_backward(m, x, y, 2 * B, T, 1.0f);
    loom_gpt2_get_grads(m, whole);
    poison_grads(m);
    loom_gpt2_zero_grads(m);
    loom_gpt2_forward_backward(m, x, y, 2 * B, T, 1.0f);
    loom_gpt2_get_grads(m, accum);
    int64_t differ = 0;
    for (int64_t i = 0; i < m->num_elements; i++) differ += !(accum[i] == whole[i]);
    T_ASSERT(differ == 0, "%lld gradients differ after zero_grads over NaN", (long long)differ);
    poison_grads(m);
    loom_gpt2_zero_grads(m);
    double l1 = loom_gpt2_forward_backward(m, x, y, B, T, 0.5f);
    double l2 = loom_gpt2_forward_backward(m, x + B * T, y + B * T, B, T, 0.5f);
    loom_gpt2_get_grads(m, accum);
    T_ASSERT(fabs((l1 + l2) / 2 - l_whole) < 1e-5 * l_whole, "loss %g vs %g", (l1 + l2) / 2, l_whole);
    double e = t_max_rel_err(accum, whole, (size_t)m->num_elements);
    T_ASSERT(e < 1e-5, "accumulated gradients vs one batch: %g", e);
    free(whole);
    free(accum);
    loom_gpt2_free(m);
}

// Recomputing activations in backward gives bit-identical gradients with less memory: none >
// gelu > selective (the LayerNorm outputs too: by 2 (nb-1) N C values and the views' shifts) > full.
static void test_recompute(loom_backend *be, uint64_t seed) {
    int B = 3, T = 17;
    int32_t x[3 * 17], y[3 * 17];
    loom_gpt2 *m = tiny_model(be, seed, x, y, B * T);
    size_t bytes = (size_t)m->num_elements * sizeof(float);
    float *ref = malloc(bytes), *got = malloc(bytes);
    size_t mem[4];
    double loss[4];
    for (int mode = LOOM_RECOMPUTE_NONE; mode <= LOOM_RECOMPUTE_FULL; mode++) {
        m->recompute = (loom_recompute)mode;
        T_ASSERT(loom_gpt2_alloc(m, B, T, true) == LOOM_OK, "alloc");
        mem[mode] = loom_gpt2_memory_bytes(m, NULL);
        loom_gpt2_zero_grads(m);
        loss[mode] = loom_gpt2_forward_backward(m, x, y, B, T, 1.0f);
        loom_gpt2_get_grads(m, mode == 0 ? ref : got);
        if (mode > 0)
            T_ASSERT(memcmp(ref, got, bytes) == 0 && loss[mode] == loss[0], "recompute mode %d: gradients differ", mode);
    }
    T_ASSERT(mem[3] < mem[2] && mem[2] < mem[1] && mem[1] < mem[0], "memory none %zu > gelu %zu > selective %zu > full %zu",
             mem[0], mem[1], mem[2], mem[3]);
    int64_t L = m->cfg.num_layers, N = (int64_t)B * T, C = m->cfg.channels;
    size_t norms = (size_t)(2 * (L - 1) * N * C) * loom_dtype_size(be->dtype);
    T_ASSERT(L > 1 && mem[1] - mem[2] + 2 * (L - 1) * GPT2_NORM_SHIFT + 128 >= norms && mem[1] - mem[2] <= norms,
             "selective saves %zu bytes against gelu, the LayerNorm outputs of %lld blocks %zu", mem[1] - mem[2],
             (long long)(L - 1), norms);
    loom_recompute r;
    T_ASSERT(loom_recompute_parse("some", &r) == LOOM_EINVAL && strstr(loom_error_message(), "'some'"), "bad mode");
    free(ref);
    free(got);
    loom_gpt2_free(m);
}

// The output layer by chunks of rows (logits_chunk: 7 chunks of at most 8 of the 51 rows,
// against the one chunk the CPU's 32 MiB holds here): the same loss and gradients, the chunks'
// sums of the output weight's gradient added in order (to 1e-5), with a logits buffer of 8 rows.
static void test_logits_chunk(loom_backend *be, uint64_t seed) {
    int B = 3, T = 17;
    int32_t x[3 * 17], y[3 * 17];
    loom_gpt2 *m = tiny_model(be, seed, x, y, B * T);
    size_t bytes = (size_t)m->num_elements * sizeof(float);
    float *grads[2] = {malloc(bytes), malloc(bytes)};
    size_t mem[2];
    double loss[2];
    int chunk = m->logits_chunk;
    T_ASSERT(chunk >= B * T, "the default chunk holds the %d rows: %d", B * T, chunk);
    for (int i = 0; i < 2; i++) {
        m->logits_chunk = i ? 8 : chunk;
        T_ASSERT(loom_gpt2_alloc(m, B, T, true) == LOOM_OK, "alloc");
        mem[i] = loom_gpt2_memory_bytes(m, NULL);
        loom_gpt2_zero_grads(m);
        loss[i] = loom_gpt2_forward_backward(m, x, y, B, T, 1.0f);
        loom_gpt2_get_grads(m, grads[i]);
    }
    T_ASSERT(fabs(loss[1] - loss[0]) <= 1e-6 * loss[0], "loss by chunks of 8 rows %.9g, in one %.9g", loss[1], loss[0]);
    double e = t_max_rel_err(grads[1], grads[0], (size_t)m->num_elements);
    T_ASSERT(e < 1e-5, "gradients by chunks of 8 rows against one chunk: %g", e);
    size_t saved = (size_t)(B * T - 8) * m->cfg.padded_vocab_size * loom_dtype_size(be->dtype);
    T_ASSERT(mem[0] - mem[1] >= saved, "memory %zu -> %zu bytes, the logits of %d rows fewer: %zu", mem[0], mem[1],
             B * T - 8, saved);
    free(grads[0]);
    free(grads[1]);
    loom_gpt2_free(m);
}

// Offloaded activations (7 blocks, 3 resident): gradients bit-identical to keeping every block's,
// with and without full recomputation and over two micro-batches of different sizes; the
// backend holds 3 blocks' saved tensors and host memory the 7.
static void test_offload_activations(loom_backend *be, uint64_t seed) {
    int B = 2, T = 13, L = 7;
    int32_t x[2 * 13], y[2 * 13];
    loom_gpt2_config cfg = tiny();
    cfg.num_layers = L;
    loom_gpt2 *m;
    T_ASSERT(loom_gpt2_create(&m, be, &cfg) == LOOM_OK, "create");
    loom_gpt2_init(m, seed);
    for (int i = 0; i < B * T; i++) x[i] = t_randint(0, cfg.vocab_size - 1), y[i] = t_randint(0, cfg.vocab_size - 1);
    size_t bytes = (size_t)m->num_elements * sizeof(float);
    float *ref = malloc(bytes), *got = malloc(bytes);
    for (int full = 0; full <= 1; full++) {
        m->recompute = full ? LOOM_RECOMPUTE_FULL : LOOM_RECOMPUTE_NONE;
        size_t mem[2], host[2];
        for (int off = 0; off <= 1; off++) {
            m->offload_activations = off;
            T_ASSERT(loom_gpt2_alloc(m, B, T, true) == LOOM_OK, "alloc");
            mem[off] = loom_gpt2_memory_bytes(m, &host[off]);
            loom_gpt2_zero_grads(m);
            double l1 = loom_gpt2_forward_backward(m, x, y, B, T, 0.5f);
            double l2 = loom_gpt2_forward_backward(m, x, y, 1, T - 4, 0.5f);
            loom_gpt2_get_grads(m, off ? got : ref);
            T_ASSERT(l1 > 0 && l2 > 0, "losses");
        }
        T_ASSERT(memcmp(ref, got, bytes) == 0, "recompute %d: offloaded activations change the gradients", full);
        // per block: (N,C) residual3 always; without recomputation also ln1, qkv, atty, residual2, ln2,
        // fch, fch_gelu, the fp32 statistics and the (B,NH,T) log-sum-exp: the host holds L blocks, the backend L - 3 fewer
        int64_t N = (int64_t)B * T, C = cfg.channels;
        int64_t per = full ? N * C : N * (C + 3 * C + C + C + C + 4 * C + 4 * C + C) + 4 * N + N * cfg.num_heads;
        size_t want_host = 0;
        for (int64_t b = 0; b < L; b++) want_host += (size_t)per * sizeof(float);
        T_ASSERT(host[0] == 0 && host[1] == want_host, "recompute %d: host bytes %zu, want %zu", full, host[1], want_host);
        T_ASSERT(mem[0] - mem[1] >= (size_t)(L - 3) * (size_t)per * sizeof(float), "recompute %d: backend bytes %zu -> %zu",
                 full, mem[0], mem[1]);
    }
    free(ref);
    free(got);
    loom_gpt2_free(m);
}

static void test_schedule(void) {
    loom_lr_schedule s = {LOOM_LR_COSINE, 1e-3f, 1e-4f, 10, 110};
    T_ASSERT(fabsf(loom_lr_at(&s, 0) - 1e-4f) < 1e-9f, "warmup start %g", (double)loom_lr_at(&s, 0));
    T_ASSERT(fabsf(loom_lr_at(&s, 9) - 1e-3f) < 1e-9f, "warmup end");
    T_ASSERT(fabsf(loom_lr_at(&s, 10) - 1e-3f) < 1e-9f, "decay start");
    T_ASSERT(fabsf(loom_lr_at(&s, 60) - 5.5e-4f) < 1e-8f, "cosine midpoint %g", (double)loom_lr_at(&s, 60));
    T_ASSERT(fabsf(loom_lr_at(&s, 110) - 1e-4f) < 1e-9f, "floor");
    T_ASSERT(fabsf(loom_lr_at(&s, 500) - 1e-4f) < 1e-9f, "stays at floor");
    s.kind = LOOM_LR_CONSTANT;
    T_ASSERT(loom_lr_at(&s, 60) == 1e-3f && loom_lr_at(&s, 4) == 5e-4f, "constant after warmup");
    loom_lr_kind k;
    T_ASSERT(loom_lr_kind_parse("linear", &k) == LOOM_EINVAL && strstr(loom_error_message(), "linear"),
             "unknown schedule named");
}

static void test_clip(void) {
    T_ASSERT(loom_clip_scale(0.5, 1.0f) == 1.0f, "no clip under the limit");
    T_ASSERT(fabsf(loom_clip_scale(4.0, 1.0f) - 0.25f) < 1e-6f, "clip to 1/4");
    T_ASSERT(loom_clip_scale(4.0, 0.0f) == 1.0f, "clipping off");
}

int main(void) {
    uint64_t seed = t_seed();
    loom_backend *be;
    if (loom_backend_create(&be, "cpu", LOOM_F32) != LOOM_OK) return 1;
    test_init(be, seed);
    test_accumulation(be, seed);
    test_recompute(be, seed);
    test_offload_activations(be, seed);
    test_logits_chunk(be, seed);
    test_schedule();
    test_clip();
    loom_backend_destroy(be);
    return t_done("gpt2_train");
}
