// FP8 copies made ahead of the products that take them, where a copy's scale is known before its
// product runs (delayed scaling's slot histories; under the tensorwise recipe a weight's, and a
// forward cast's for the backward), with the bytes and the amax the products' own casts would
// make:
// - a linear layer's input that a LayerNorm writes (backend.h's fp8_site_ln): the LayerNorm
//   converts its output as it writes it, the rows copy (N,C) for the layer's forward product,
//   which saves that cast's read of 2 bytes an element and its launch. The copy answers for a
//   tensor only while the tensor holds what the LayerNorm wrote: it is told by the address and
//   size written and the layer, and every LayerNorm op forgets it first. One buffer serves every
//   layer: the product comes right after its LayerNorm. With fp8_ln_copy_only the LayerNorm
//   writes the copy alone, and a product that would read the bf16 output instead stops
//   (cuda_fp8_ln_unwritten).
// - a step's weights (backend.h's fp8_weights): both copies of every weight in one launch after
//   the step's fp8_begin, kept until its roll, so the forward's and the backward's casts of each
//   weight (one each a micro-batch) become one read a step, and 8 small launches a layer none.
//   By the current amax (the tensorwise recipe) too: a weight does not change within a step, so
//   one grouped amax pass first gives every weight its scale, the one its casts would take.
// - a linear layer's input transposed, (C,N), for its weight-gradient product in the backward, as
//   Transformer Engine's Linear keeps its input's FP8 transpose from the forward: transposed from
//   the LayerNorm's copy while that is in L2, or written by a forward product's own cast of its
//   input in the same read, so the backward's cast of the input (2 bytes an element read, a launch
//   a layer) goes. The fcproj layer's input under --recompute gelu is kept by pre: the forward's
//   one cast of gelu(pre) writes it beside the fcproj product's rows (fp8.cu's
//   cuda_fp8_mlp_forward). A copy answers for a tensor while that holds what the copy was made
//   from, told by its address, size and layer; a new copy of the same tensor, or a LayerNorm op
//   writing it, forgets the old one. Its buffer belongs to the tensor's address, so the copies
//   take what the tensors they stand for take at 1 byte an element (gpt2 at B=16: 0.98 GiB; under
//   --recompute full, whose blocks share one slot for each activation, one block's); a buffer no
//   forward asked for during a step is freed at the next step's fp8_begin.
#include "backend/cuda/cuda_ops.h"

#include <string.h>

// a transposed input copy (cuda_fp8_keep_cols): its buffer belongs to the tensor's address, so
// that tensors the blocks share (--recompute full's one slot) share their copies' buffer too
struct kept_cols {
    const void *x; // the tensor
    uint8_t *buf;  // 1/s by the current amax (fp32, CUDA_FP8_COLS_AT bytes kept for it), then the copy
    size_t bytes;
    int site;      // the layer the copy was made for (-1: none held)
    int64_t numel;
    bool gelu;     // of gelu(x)
    bool used;     // asked for since the last fp8_begin (cuda_fp8_kept_collect)
    int promised;  // the layer input_kept answered true to for it (x need not hold its values; -1: none)
};

struct cuda_fp8_kept {
    // the LayerNorm's copy
    uint8_t *rows;
    size_t rows_bytes;
    int site;       // the layer whose input it is
    const void *x;  // the bf16 tensor it is a copy of (NULL: none)
    int64_t numel;
    bool unwritten; // x was left unwritten: the copy alone holds the output (fp8_ln_copy_only)
    // the step's weights
    int n;                    // weights
    int *sites;               // (n) their layers
    cuda_fp8_group *groups;   // (n) their casts, as uploaded
    cuda_fp8_group *dev;      // the same in backend memory
    int blocks;               // the grouped cast's
    uint8_t *copies;          // each weight's rows, then its cols (256-byte aligned)
    size_t copies_bytes;
    bool valid;               // made since the last roll
    // the layers' transposed inputs, by tensor
    kept_cols *inputs;
    int ninputs, cap;
};

static cuda_fp8_kept *kept_of(loom_cuda *cu) {
    if (!cu->fp8_kept) cu->fp8_kept = (cuda_fp8_kept *)loom_xcalloc(1, sizeof(cuda_fp8_kept));
    return cu->fp8_kept;
}

// Room for `bytes` at *p (backend memory, counted in its bytes in use; NULL with *have 0 when the
// device has none to spare: then nothing is kept and the products cast). A buffer that moves
// makes a recorded graph record again, as the scratch does.
static bool reserve(loom_cuda *cu, void **p, size_t *have, size_t bytes) {
    if (*have >= bytes) return true;
    cu->base.free(&cu->base, *p); // after the ops issued before it (the backend's free waits)
    *p = cu->base.alloc(&cu->base, bytes);
    *have = *p ? bytes : 0;
    cu->scratch_moves++;
    return *p != NULL;
}

#define CUDA_FP8_COLS_AT 256 // the copy's offset in its buffer, after its 1/s (16-byte aligned for cuBLASLt)

// Whether site's input casts scale by a known scale: delayed scaling's history, or the current
// amax (tensorwise: a copy made in the forward has the scale the backward's cast would take)
static bool scaled(const loom_cuda *cu, int site) {
    return cu->base.fp8_history <= 0 || cuda_fp8_ready(cu, site, CUDA_FP8_INPUT);
}

// The entry of tensor x's transposed copies (NULL: none)
static kept_cols *cols_of(const cuda_fp8_kept *k, const void *x) {
    for (int i = 0; k && i < k->ninputs; i++)
        if (k->inputs[i].x == x) return &k->inputs[i];
    return NULL;
}

// Forgets the transposed copy of x
static void forget_cols(cuda_fp8_kept *k, const void *x) {
    kept_cols *e = cols_of(k, x);
    if (e) e->site = e->promised = -1;
}

cuda_fp8_ln_out cuda_fp8_kept_begin(loom_cuda *cu, const void *out, int64_t N, int64_t C, bool fits) {
    if (cu->fp8_kept) cu->fp8_kept->x = NULL, forget_cols(cu->fp8_kept, out);
    int site = cu->base.fp8_site_ln;
    if (site < 0 || !cu->base.fp8 || cu->base.fp8_history <= 0 || !fits) return cuda_fp8_ln_out{};
    cuda_fp8_kept *k = kept_of(cu);
    // sized at the first step (no history yet), so that a recording does not allocate
    if (!reserve(cu, (void **)&k->rows, &k->rows_bytes, (size_t)(N * C))) return cuda_fp8_ln_out{};
    uint8_t *cols = cuda_fp8_keep_cols(cu, site, out, N, C, false, NULL);
    if (!cuda_fp8_ready(cu, site, CUDA_FP8_INPUT)) return cuda_fp8_ln_out{};
    fp8_cast c = cuda_fp8_cast_at(cu, site, CUDA_FP8_INPUT, NULL);
    k->site = site, k->x = out, k->numel = N * C, k->unwritten = cu->base.fp8_ln_copy_only;
    return cuda_fp8_ln_out{k->rows, cols, c.scale, c.record, k->unwritten};
}

// Stops the program: the `what` of layer `site` would read `tensor`, which was not `done` (only
// its FP8 copy holds its values: fp8_ln_copy_only's output, or an input promised by input_kept)
static void stop_copy_only(const char *what, int site, const char *tensor, const char *done) {
    fprintf(stderr, "loom: cuda: the %s of layer %d would read %s, which was not %s (its FP8 copy was, and no FP8 "
                    "product could be run from it)\n", what, site, tensor, done);
    abort();
}

void cuda_fp8_ln_unwritten(const loom_cuda *cu, const void *x, const char *what) {
    const cuda_fp8_kept *k = cu->fp8_kept;
    if (k && x && k->x == x && k->unwritten) stop_copy_only(what, k->site, "the LayerNorm output", "written");
}

uint8_t *cuda_fp8_keep_cols(loom_cuda *cu, int site, const void *x, int64_t N, int64_t C, bool gelu, float **inv) {
    kept_cols *e = cols_of(cu->fp8_kept, x);
    if (e) e->site = e->promised = -1; // x is written anew: its old copy goes (and reserve may move the buffer)
    if (site < 0 || !cu->base.fp8 || x == cu->fp8_unread || N % 16 || C % 16) return NULL;
    cuda_fp8_kept *k = kept_of(cu);
    if (!e) {
        if (k->ninputs == k->cap) {
            k->cap = k->cap ? 2 * k->cap : 64;
            kept_cols *grown = (kept_cols *)loom_xcalloc((size_t)k->cap, sizeof *grown);
            if (k->ninputs) memcpy(grown, k->inputs, (size_t)k->ninputs * sizeof *grown);
            free(k->inputs);
            k->inputs = grown;
        }
        e = &k->inputs[k->ninputs++];
        *e = kept_cols{x, NULL, 0, -1, 0, false, false, -1};
    }
    e->used = true;
    // sized at the first step (no history yet), so that a recording does not allocate
    if (!reserve(cu, (void **)&e->buf, &e->bytes, CUDA_FP8_COLS_AT + (size_t)(N * C)) || !scaled(cu, site))
        return NULL;
    e->site = site, e->numel = N * C, e->gelu = gelu;
    if (inv) *inv = (float *)e->buf;
    return e->buf + CUDA_FP8_COLS_AT;
}

void cuda_fp8_kept_collect(loom_cuda *cu) {
    cuda_fp8_kept *k = cu->fp8_kept;
    cudaStreamCaptureStatus capturing;
    CUDA_CHECK(cudaStreamIsCapturing(cu->stream, &capturing));
    if (!k || capturing != cudaStreamCaptureStatusNone) return;
    int n = 0;
    for (int i = 0; i < k->ninputs; i++) {
        kept_cols e = k->inputs[i];
        if (e.used) {
            e.used = false, k->inputs[n++] = e;
        } else {
            cu->base.free(&cu->base, e.buf);
            cu->scratch_moves++; // a recorded graph that held it records again
        }
    }
    k->ninputs = n;
}

void cuda_fp8_forget_cols(loom_cuda *cu, const void *x) {
    if (cu->fp8_kept) forget_cols(cu->fp8_kept, x);
}

void cuda_fp8_kept_freed(loom_cuda *cu, const void *p, size_t bytes) {
    cuda_fp8_kept *k = cu->fp8_kept;
    if (!k) return;
    const char *lo = (const char *)p, *hi = lo + bytes;
    auto in = [&](const void *x) { return (const char *)x >= lo && (const char *)x < hi; };
    for (int i = 0; i < k->ninputs; i++)
        if (in(k->inputs[i].x)) k->inputs[i].site = k->inputs[i].promised = -1;
    if (in(k->x)) k->x = NULL;
    for (int i = 0; i < k->n && k->valid; i++)
        if (in(k->groups[i].src)) k->valid = false;
}

const uint8_t *cuda_fp8_kept_cols(const loom_cuda *cu, int site, const void *x, int64_t numel, bool gelu,
                                  float **inv) {
    const kept_cols *e = x ? cols_of(cu->fp8_kept, x) : NULL;
    if (!e || site < 0 || !scaled(cu, site) || e->site != site || e->numel != numel || e->gelu != gelu) return NULL;
    *inv = cu->base.fp8_history <= 0 ? (float *)e->buf : NULL;
    return e->buf + CUDA_FP8_COLS_AT;
}

extern "C" bool cuda_input_kept(loom_backend *be, loom_tensor x, int site) {
    loom_cuda *cu = cuda_of(be);
    float *inv;
    kept_cols *e = cols_of(cu->fp8_kept, x.data);
    bool kept = be->fp8 && cuda_fp8_kept_cols(cu, site, x.data, loom_numel(&x), false, &inv);
    if (e) e->promised = kept ? site : -1;
    return kept;
}

void cuda_fp8_unpromised(const loom_cuda *cu, const void *x, int site, const char *what) {
    const kept_cols *e = cols_of(cu->fp8_kept, x);
    if (e && e->promised >= 0 && e->promised == site) stop_copy_only(what, site, "its input", "kept");
}

const uint8_t *cuda_fp8_kept_input(const loom_cuda *cu, int site, const void *x, int64_t numel) {
    const cuda_fp8_kept *k = cu->fp8_kept;
    return k && x && k->x == x && k->site == site && k->numel == numel ? k->rows : NULL;
}

extern "C" void cuda_fp8_weights(loom_backend *be, const loom_tensor *w, const int *sites, int n) {
    loom_cuda *cu = cuda_of(be);
    if (!be->fp8 || n <= 0) return;
    bool delayed = be->fp8_history > 0; // else each weight scaled by its current amax
    cuda_fp8_kept *k = kept_of(cu);
    k->valid = false;
    int top = 0;
    size_t bytes = 0;
    for (int i = 0; i < n; i++) {
        int64_t R = loom_rows(&w[i]), K = loom_cols(&w[i]);
        bool fits = cuda_act(be, w[i]) && R % 16 == 0 && K % 16 == 0 && (uintptr_t)w[i].data % 16 == 0;
        if (!fits || sites[i] < 0) return; // all or none: the matmul ops cast each weight as before
        top = sites[i] > top ? sites[i] : top;
        bytes += 2 * cuda_align256((size_t)(R * K));
    }
    if (delayed) cuda_fp8_slot_of(cu, top, CUDA_FP8_WEIGHT); // the slots' room first: those below move none
    // sized at the first step (no history yet), so that a recording neither allocates nor uploads;
    // by the current amax, the weights' amaxes after the copies, then each one's 1/s 16-byte
    // aligned (cuBLASLt's FP8 products refuse other scales at run time)
    size_t amax_bytes = cuda_align256(sizeof(unsigned) * (size_t)n);
    size_t current = delayed ? 0 : amax_bytes + 16 * (size_t)n;
    if (!reserve(cu, (void **)&k->copies, &k->copies_bytes, bytes + current)) return;
    unsigned *amax = delayed ? NULL : (unsigned *)(k->copies + bytes);
    float *inv = delayed ? NULL : (float *)(k->copies + bytes + amax_bytes);
    cuda_fp8_group *g = (cuda_fp8_group *)loom_xcalloc((size_t)n, sizeof *g);
    size_t at = 0;
    int blocks = 0;
    for (int i = 0; i < n; i++) {
        int R = (int)loom_rows(&w[i]), K = (int)loom_cols(&w[i]), tiles_k;
        fp8_cast slot = delayed ? cuda_fp8_slot_of(cu, sites[i], CUDA_FP8_WEIGHT) : fp8_cast{};
        size_t one = cuda_align256((size_t)R * K);
        g[i] = cuda_fp8_group{w[i].data, k->copies + at, k->copies + at + one, R, K, slot.scale, slot.record,
                              amax ? amax + i : NULL, inv ? inv + 4 * i : NULL, blocks, 0};
        blocks += cuda_fp8_group_tiles(R, K, &tiles_k);
        g[i].tiles_k = tiles_k;
        at += 2 * one;
    }
    if (n != k->n || memcmp(g, k->groups, sizeof *g * (size_t)n) || memcmp(sites, k->sites, sizeof *sites * (size_t)n)) {
        cu->base.free(&cu->base, k->dev);
        k->dev = (cuda_fp8_group *)cu->base.alloc(&cu->base, sizeof *g * (size_t)n);
        LOOM_CHECK(k->dev); // a few KB
        CUDA_CHECK(cudaMemcpyAsync(k->dev, g, sizeof *g * (size_t)n, cudaMemcpyHostToDevice, cu->stream));
        CUDA_CHECK(cudaStreamSynchronize(cu->stream)); // g is freed below
        free(k->groups), free(k->sites);
        k->groups = g, g = NULL;
        k->sites = (int *)loom_xcalloc((size_t)n, sizeof(int));
        memcpy(k->sites, sites, sizeof *sites * (size_t)n);
        k->n = n, k->blocks = blocks;
        cu->scratch_moves++; // a recorded graph holds the old descriptors
    }
    free(g);
    for (int i = 0; delayed && i < n; i++)
        if (!cuda_fp8_ready(cu, sites[i], CUDA_FP8_WEIGHT)) return;
    if (!delayed) CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof *amax * (size_t)n, cu->stream));
    cuda_fp8_cast_group(cu, k->dev, n, k->blocks, !delayed);
    k->valid = true;
}

const uint8_t *cuda_fp8_kept_weight(const loom_cuda *cu, int site, const void *w, int64_t numel, bool cols,
                                    float **inv) {
    const cuda_fp8_kept *k = cu->fp8_kept;
    if (!k || !k->valid || !w) return NULL;
    for (int i = 0; i < k->n; i++) {
        const cuda_fp8_group *g = &k->groups[i];
        if (k->sites[i] == site && g->src == w && (int64_t)g->R * g->K == numel) {
            *inv = g->inv;
            return cols ? g->cols : g->rows;
        }
    }
    return NULL;
}

void cuda_fp8_weights_end(loom_cuda *cu) {
    if (cu->fp8_kept) cu->fp8_kept->valid = false;
}

void cuda_fp8_kept_free(loom_cuda *cu) {
    cuda_fp8_kept *k = cu->fp8_kept;
    if (!k) return;
    cu->base.free(&cu->base, k->rows);
    cu->base.free(&cu->base, k->copies);
    cu->base.free(&cu->base, k->dev);
    for (int i = 0; i < k->ninputs; i++) cu->base.free(&cu->base, k->inputs[i].buf);
    free(k->inputs), free(k->groups), free(k->sites), free(k);
    cu->fp8_kept = NULL;
}
