// FP8 delayed scaling's state (backend.h's fp8_history; Transformer Engine's DelayedScaling recipe
// with its "max" algorithm and margin 0; Micikevicius et al., "FP8 Formats for Deep Learning",
// 2022). Each linear layer (backend.h's fp8_site) has three slots, its input, weight and output
// gradient (slot = CUDA_FP8_ROLES site + role), each with a ring of the amaxes of its last H rolls:
//   s = FMAX / max(ring)   (E4M3 FMAX 448 for inputs and weights, E5M2 57344 for gradients)
// computed once a step for every slot by the roll kernel, which also pushes the amax the casts
// raised since the last roll (fp8.cu's quantize_kernel) into the ring. A slot cast before any roll
// has no history yet and scales by the current amax. The host keeps which slots have a history;
// the device, the scales, amaxes, rings and the ring position, so a CUDA graph replays the
// step's rolls.
#include "backend/cuda/cuda_ops.h"

#include <string.h>

#define FP8_ROLL_THREADS 256

enum { SLOT_NEW, SLOT_SEEN, SLOT_READY }; // host: never cast; cast, but never rolled; has a history

typedef struct { // a slot's scale (16 bytes: cuBLASLt's FP8 kernels take inv only 16-byte aligned)
    float inv, scale, pad[2];
} fp8_scale;

struct cuda_fp8_slots {
    int64_t n;        // slots: CUDA_FP8_ROLES a site
    int history;      // H: rolls a ring holds
    fp8_scale *scale; // device (n)
    float *amax;      // device (n): since the last roll (raised through its bits: >= 0, so they order as floats)
    float *ring;      // device (n, H): the last H rolls' amaxes, 0 where none yet
    int *pos;         // device: the ring column the next roll writes
    uint8_t *state;   // host (n)
};

// Zero-filled backend memory (the backend's alloc: counted in its bytes in use)
static void *device_alloc(loom_cuda *cu, size_t bytes) {
    void *p = cu->base.alloc(&cu->base, bytes);
    LOOM_CHECK(p); // a few KB a layer, at the first casts
    return p;
}

static void slots_release(loom_cuda *cu, cuda_fp8_slots *f) {
    void *arrays[] = {f->scale, f->amax, f->ring, f->pos};
    for (void *p : arrays) cu->base.free(&cu->base, p);
    free(f->state);
    free(f);
}

// Room for n slots at least (fresh ones zero, their rings empty). Moving them after a graph was
// recorded makes it record again, as the scratch does.
static cuda_fp8_slots *slots_reserve(loom_cuda *cu, int64_t n) {
    cuda_fp8_slots *old = cu->fp8;
    int H = cu->base.fp8_history;
    if (old) LOOM_CHECK(old->history == H); // fp8_history is set once, before the first cast
    if (old && old->n >= n) return old;
    cuda_fp8_slots *f = (cuda_fp8_slots *)loom_xcalloc(1, sizeof *f);
    f->n = old && 2 * old->n > n ? 2 * old->n : (n + 63) / 64 * 64, f->history = H;
    f->scale = (fp8_scale *)device_alloc(cu, sizeof(fp8_scale) * f->n);
    f->amax = (float *)device_alloc(cu, sizeof(float) * f->n);
    f->ring = (float *)device_alloc(cu, sizeof(float) * H * f->n);
    f->pos = (int *)device_alloc(cu, sizeof(int));
    f->state = (uint8_t *)loom_xcalloc((size_t)f->n, 1);
    if (old) {
        cudaStream_t st = cu->stream;
        CUDA_CHECK(cudaMemcpyAsync(f->scale, old->scale, sizeof(fp8_scale) * old->n, cudaMemcpyDeviceToDevice, st));
        CUDA_CHECK(cudaMemcpyAsync(f->amax, old->amax, sizeof(float) * old->n, cudaMemcpyDeviceToDevice, st));
        CUDA_CHECK(cudaMemcpyAsync(f->ring, old->ring, sizeof(float) * H * old->n, cudaMemcpyDeviceToDevice, st));
        CUDA_CHECK(cudaMemcpyAsync(f->pos, old->pos, sizeof(int), cudaMemcpyDeviceToDevice, st));
        memcpy(f->state, old->state, (size_t)old->n);
        CUDA_CHECK(cudaStreamSynchronize(st)); // ops issued before may still use the old ones
        slots_release(cu, old);
    }
    cu->fp8 = f;
    cu->scratch_moves++;
    return f;
}

void cuda_fp8_free(loom_cuda *cu) {
    if (cu->fp8) slots_release(cu, cu->fp8);
    cu->fp8 = NULL;
}

fp8_cast cuda_fp8_cast_of(loom_cuda *cu, cuda_fp8_role role, float *inv) {
    return cuda_fp8_cast_at(cu, cu->base.fp8_site, role, inv);
}

// Slot `role` of site `site`
static int64_t slot_index(int site, cuda_fp8_role role) { return (int64_t)site * CUDA_FP8_ROLES + role; }

fp8_cast cuda_fp8_cast_at(loom_cuda *cu, int site, cuda_fp8_role role, float *inv) {
    if (cu->base.fp8_history <= 0 || site < 0) return fp8_cast{NULL, inv, NULL};
    fp8_cast slot = cuda_fp8_slot_of(cu, site, role);
    uint8_t *state = &cu->fp8->state[slot_index(site, role)];
    if (*state == SLOT_READY) return slot;
    *state = SLOT_SEEN;
    return fp8_cast{NULL, inv, slot.record};
}

fp8_cast cuda_fp8_slot_of(loom_cuda *cu, int site, cuda_fp8_role role) {
    LOOM_CHECK(cu->base.fp8_history > 0 && site >= 0);
    // the site's three slots at once: a product's two casts never move each other's
    cuda_fp8_slots *f = slots_reserve(cu, ((int64_t)site + 1) * CUDA_FP8_ROLES);
    int64_t i = slot_index(site, role);
    return fp8_cast{&f->scale[i].scale, &f->scale[i].inv, (unsigned *)(f->amax + i)};
}

bool cuda_fp8_ready(const loom_cuda *cu, int site, cuda_fp8_role role) {
    const cuda_fp8_slots *f = cu->fp8;
    int64_t i = slot_index(site, role);
    return cu->base.fp8_history > 0 && site >= 0 && f && i < f->n && f->state[i] == SLOT_READY;
}

// One block: with push, slot s's amax into column *pos of its ring (a non-finite amax as 0) and
// zeroed, then *pos moves on; its scale from the ring's max (E5M2 for output gradients).
__global__ void roll_kernel(fp8_scale *scale, float *amax, float *ring, int *pos, int64_t n, int H, bool push) {
    cuda_pdl_begin();
    int p = *pos;
    for (int64_t s = threadIdx.x; s < n; s += blockDim.x) {
        float a = amax[s], m = 0.0f, *r = ring + s * H;
        if (push) r[p] = isfinite(a) ? a : 0.0f, amax[s] = 0.0f;
        for (int j = 0; j < H; j++) m = fmaxf(m, r[j]);
        float sc = (s % CUDA_FP8_ROLES == CUDA_FP8_GRAD ? CUDA_FP8_E5M2_MAX : CUDA_FP8_E4M3_MAX) / fmaxf(m, 1e-12f);
        scale[s].scale = sc, scale[s].inv = 1.0f / sc;
    }
    __syncthreads(); // every thread has read *pos
    if (push && threadIdx.x == 0) *pos = (p + 1) % H;
}

extern "C" void cuda_fp8_begin(loom_backend *be) {
    loom_cuda *cu = cuda_of(be);
    cuda_fp8_kept_collect(cu);
    cuda_fp8_slots *f = cu->fp8;
    if (!f) return;
    CUDA_CHECK(cudaMemsetAsync(f->amax, 0, sizeof(float) * f->n, cu->stream));
}

extern "C" void cuda_fp8_roll(loom_backend *be) {
    loom_cuda *cu = cuda_of(be);
    cuda_fp8_weights_end(cu); // the weights may change from here on
    cuda_fp8_slots *f = cu->fp8;
    if (!f) return;
    cuda_launch(cu->stream, roll_kernel, 1, FP8_ROLL_THREADS, 0, f->scale, f->amax, f->ring, f->pos, f->n, f->history,
                true);
    for (int64_t i = 0; i < f->n; i++)
        if (f->state[i] == SLOT_SEEN) f->state[i] = SLOT_READY;
}

extern "C" float *cuda_fp8_amax(loom_backend *be, size_t *n) {
    cuda_fp8_slots *f = cuda_of(be)->fp8;
    *n = f ? (size_t)f->n : 0;
    return f ? f->amax : NULL;
}

// The saved state: H, n, pos, then for each slot whether it has a history (1) or not (0), then
// the rings (n, H): 3 + n (1 + H) fp32
extern "C" size_t cuda_fp8_save(loom_backend *be, float *out) {
    loom_cuda *cu = cuda_of(be);
    cuda_fp8_slots *f = cu->fp8;
    if (!f) return 0;
    size_t total = 3 + (size_t)f->n * (1 + f->history);
    if (!out) return total;
    int pos;
    CUDA_CHECK(cudaMemcpyAsync(&pos, f->pos, sizeof pos, cudaMemcpyDeviceToHost, cu->stream));
    CUDA_CHECK(cudaMemcpyAsync(out + 3 + f->n, f->ring, sizeof(float) * f->history * f->n, cudaMemcpyDeviceToHost,
                               cu->stream));
    CUDA_CHECK(cudaStreamSynchronize(cu->stream));
    out[0] = (float)f->history, out[1] = (float)f->n, out[2] = (float)pos;
    for (int64_t i = 0; i < f->n; i++) out[3 + i] = f->state[i] == SLOT_READY;
    return total;
}

extern "C" loom_status cuda_fp8_load(loom_backend *be, const float *in, size_t count) {
    loom_cuda *cu = cuda_of(be);
    int H = be->fp8_history;
    LOOM_CHECK(H > 0 && !cu->fp8); // a fresh run's delayed scaling, before its first cast
    const char *hint = "resume with the --fp8-history the run was saved with, or from another checkpoint";
    if (count < 3 || in[0] != (float)H)
        return loom_fail(LOOM_EFORMAT, hint, "FP8 scaling state: a history of %g steps, this run's is %d",
                         count ? (double)in[0] : 0.0, H);
    double n = in[1];
    if (!(n >= 0 && n <= 1e9 && n == (double)(int64_t)n && (double)count == 3 + n * (1 + H)))
        return loom_fail(LOOM_EFORMAT, hint, "FP8 scaling state: %g slots do not fill its %zu values", n, count);
    if (!(in[2] >= 0 && in[2] < H && in[2] == (float)(int)in[2]))
        return loom_fail(LOOM_EFORMAT, hint, "FP8 scaling state: ring position %g is outside [0, %d)", (double)in[2],
                         H);
    for (int64_t i = 0; i < (int64_t)n; i++)
        if (in[3 + i] != 0 && in[3 + i] != 1)
            return loom_fail(LOOM_EFORMAT, hint, "FP8 scaling state: slot %lld's flag is %g, not 0 or 1", (long long)i,
                             (double)in[3 + i]);
    for (size_t i = 3 + (size_t)n; i < count; i++)
        if (!(in[i] >= 0 && isfinite(in[i])))
            return loom_fail(LOOM_EFORMAT, hint, "FP8 scaling state: amax %zu is %g", i - 3 - (size_t)n, (double)in[i]);
    if (n == 0) return LOOM_OK;
    cuda_fp8_slots *f = slots_reserve(cu, (int64_t)n);
    int pos = (int)in[2];
    CUDA_CHECK(cudaMemcpyAsync(f->ring, in + 3 + (size_t)n, sizeof(float) * H * (size_t)n, cudaMemcpyHostToDevice,
                               cu->stream));
    CUDA_CHECK(cudaMemcpyAsync(f->pos, &pos, sizeof pos, cudaMemcpyHostToDevice, cu->stream));
    for (int64_t i = 0; i < (int64_t)n; i++) f->state[i] = in[3 + i] == 1 ? SLOT_READY : SLOT_NEW;
    cuda_launch(cu->stream, roll_kernel, 1, FP8_ROLL_THREADS, 0, f->scale, f->amax, f->ring, f->pos, f->n, H, false);
    CUDA_CHECK(cudaStreamSynchronize(cu->stream)); // the host values are the caller's
    return LOOM_OK;
}
