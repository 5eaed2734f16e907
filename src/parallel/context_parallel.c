// Context parallelism: the object, its checks and buffers, the model's points and the zigzag
// layout of the tokens; the attention of each style is in cp_ring.c and cp_ulysses.c. See
// context_parallel.h.
#include "parallel/cp_internal.h"

#include <stdlib.h>
#include <string.h>

static const char *const STYLES[] = {"ring", "ulysses"};

loom_status loom_cp_style_parse(const char *name, loom_cp_style *style) {
    for (int i = 0; i < 2; i++)
        if (strcmp(name, STYLES[i]) == 0) {
            *style = (loom_cp_style)i;
            return LOOM_OK;
        }
    return loom_fail(LOOM_EINVAL, "styles are: ring, ulysses", "unknown --cp-style '%s'", name);
}

const char *loom_cp_style_name(loom_cp_style style) { return STYLES[style]; }

void cp_keep(loom_cp *cp, loom_status s) {
    if (s != LOOM_OK && cp->error == LOOM_OK) cp->error = s;
}

// A zeroed buffer of n elements of be->dtype (fp32 when f32), counted in cp->bytes; NULL is left
// for the caller to report. Planning (no backend: loom_cp_plan_bytes) only counts.
static void *take(loom_cp *cp, int64_t n, bool f32) {
    size_t bytes = (size_t)n * (f32 ? sizeof(float) : cp->es);
    cp->bytes += bytes;
    return cp->be ? cp->be->alloc(cp->be, bytes) : (void *)cp;
}

static bool alloc_buffers(loom_cp *cp) {
    int64_t rows = (int64_t)cp->B * cp->Tl; // this rank's rows of a micro-batch
    if (cp->style == LOOM_CP_RING) {
        for (int i = 0; i < 2; i++) cp->kv[i] = take(cp, rows * 2 * cp->C, false);
        for (int i = 0; i < 3; i++) cp->dkv[i] = take(cp, rows * 2 * cp->C, false);
        cp->part_out = take(cp, (int64_t)cp->B * cp->Tc * cp->C, false);
        cp->part_lse = take(cp, (int64_t)cp->B * cp->NH * cp->Tc, true);
        return cp->kv[0] && cp->kv[1] && cp->dkv[0] && cp->dkv[1] && cp->dkv[2] && cp->part_out && cp->part_lse;
    }
    cp->send = take(cp, rows * 3 * cp->C, false);
    cp->recv = take(cp, rows * 3 * cp->C, false);
    cp->qkv_h = take(cp, rows * 3 * cp->C, false);
    cp->dqkv_h = take(cp, rows * 3 * cp->C, false);
    cp->out_h = take(cp, rows * cp->C, false);
    cp->dout_h = take(cp, rows * cp->C, false);
    return cp->send && cp->recv && cp->qkv_h && cp->dqkv_h && cp->out_h && cp->dout_h;
}

loom_status loom_cp_create(loom_cp **out, loom_comm *dev, loom_backend *be, loom_cp_style style, int B, int T, int C,
                           int NH) {
    *out = NULL;
    int P = loom_comm_size(dev);
    if (T % (2 * P) != 0)
        return loom_fail(LOOM_EINVAL, "use a --seq divisible by 2 x --cp (each rank holds two equal chunks of every sequence)",
                         "sequence length %d does not split into 2 x --cp %d = %d equal chunks", T, P, 2 * P);
    if (style == LOOM_CP_ULYSSES && NH % P != 0)
        return loom_fail(LOOM_EINVAL, "use a --cp that divides the heads / --tp, or --cp-style ring",
                         "--cp-style ulysses splits a rank's attention heads over the cp ranks, but its %d heads (heads / "
                         "tp) do not divide by --cp %d", NH, P);
    loom_cp *cp = loom_xcalloc(1, sizeof *cp);
    *cp = (loom_cp){.comm = dev, .be = be, .style = style, .rank = loom_comm_rank(dev), .size = P, .B = B, .T = T,
                    .Tl = T / P, .Tc = T / (2 * P), .C = C, .NH = NH, .es = loom_dtype_size(be->dtype)};
    cp->tokens = loom_xmalloc((size_t)B * T * sizeof(int32_t));
    if (!alloc_buffers(cp)) {
        size_t bytes = cp->bytes;
        loom_cp_free(cp);
        return loom_fail(LOOM_ENOMEM, "lower --batch or --seq",
                         "cannot allocate %zu bytes for context parallelism's %s buffers", bytes, STYLES[style]);
    }
    *out = cp;
    return LOOM_OK;
}

size_t loom_cp_plan_bytes(loom_cp_style style, int P, int B, int T, int C, int NH, loom_dtype dtype) {
    loom_cp plan = {.style = style, .size = P, .B = B, .T = T, .Tl = T / P, .Tc = T / (2 * P), .C = C, .NH = NH,
                    .es = loom_dtype_size(dtype)};
    alloc_buffers(&plan);
    return plan.bytes;
}

void loom_cp_free(loom_cp *cp) {
    if (!cp) return;
    void *bufs[] = {cp->kv[0], cp->kv[1], cp->dkv[0], cp->dkv[1], cp->dkv[2], cp->part_out, cp->part_lse,
                    cp->send, cp->recv, cp->qkv_h, cp->dqkv_h, cp->out_h, cp->dout_h};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) cp->be->free(cp->be, bufs[i]);
    free(cp->tokens);
    free(cp);
}

void loom_cp_attach(loom_cp *cp, loom_cp_points *points) {
    bool ring = cp->style == LOOM_CP_RING;
    *points = (loom_cp_points){.ctx = cp, .parts = 2, .chunks = 2 * cp->size,
                               .chunk = {cp_chunk(cp, cp->rank, 0), cp_chunk(cp, cp->rank, 1)},
                               .attention_forward = ring ? cp_ring_forward : cp_ulysses_forward,
                               .attention_backward = ring ? cp_ring_backward : cp_ulysses_backward};
}

void loom_cp_take_chunks(loom_cp *cp, int32_t *tokens) {
    memcpy(cp->tokens, tokens, (size_t)cp->B * cp->T * sizeof(int32_t));
    for (int h = 0; h < 2; h++)
        for (int b = 0; b < cp->B; b++)
            memcpy(tokens + ((size_t)h * cp->B + b) * cp->Tc, cp->tokens + (size_t)b * cp->T + (size_t)cp_chunk(cp, cp->rank, h) * cp->Tc,
                   (size_t)cp->Tc * sizeof(int32_t));
}

size_t loom_cp_memory_bytes(const loom_cp *cp) { return cp->bytes; }

loom_status loom_cp_error(loom_cp *cp) {
    loom_status s = cp->error;
    cp->error = LOOM_OK;
    return s;
}
