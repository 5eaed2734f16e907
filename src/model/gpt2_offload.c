// Activation offloading for GPT-2 (gpt2.h, offload_activations): each slot keeps the per-block
// activations of GPT2_OFFLOAD_RESIDENT blocks on the backend (block i in resident copy i mod R)
// and every block's in host memory. For one slot, with R = 3:
//   forward of block i:   wait for the last copy out of resident copy i mod R (block i-R's), write
//                         block i there, copy it to host block i (side stream, overlapping block
//                         i+1's forward, which only reads it)
//   backward of block i:  blocks i and i-1 (the block's input is block i-1's output) must be
//                         resident: copied back if not, then waited for; block i-2 is copied into
//                         the copy of block i+1, whose backward is done, overlapping block i's
// After the forward the top R blocks are still resident, so the first backwards copy nothing.
#include "model/gpt2_internal.h"

#include <string.h>

struct gpt2_offload {
    char **host;       // (slots) nb blocks of `stride` bytes each, host memory
    size_t stride;     // bytes of one block's saved tensors at max_B x max_T
    int *resident;     // (slots x R) the block each resident copy of a slot holds, -1: none
    uint64_t *ticket;  // (slots x R) the last copy into or out of it
};

enum { R = GPT2_OFFLOAD_RESIDENT };

// The slot's per-block tensors that are offloaded (those kept for every block: R copies).
static int saved_tensors(const loom_gpt2_acts *a, const loom_tensor *out[]) {
    const loom_tensor *all[] = {&a->ln1, &a->ln1_mean, &a->ln1_rstd, &a->qkv, &a->atty, &a->att_lse, &a->residual2,
                                &a->ln2, &a->ln2_mean, &a->ln2_rstd, &a->fch, &a->fch_gelu, &a->residual3};
    int n = 0;
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
        if (all[k]->ndim > 0 && all[k]->shape[0] == R) out[n++] = all[k];
    return n;
}

static size_t block_bytes(const loom_tensor *t) { return loom_nbytes(t) / R; }

// Bytes of one block's saved tensors in a slot laid out as `slot`.
static size_t stride_of(const loom_gpt2_acts *slot) {
    const loom_tensor *t[16];
    int n = saved_tensors(slot, t);
    size_t bytes = 0;
    for (int k = 0; k < n; k++) bytes += block_bytes(t[k]);
    return bytes;
}

size_t gpt2_offload_plan(const loom_gpt2 *m, const loom_gpt2_acts *max_slot) {
    return m->chunk_blocks > R ? (size_t)m->slots * (size_t)m->chunk_blocks * stride_of(max_slot) : 0;
}

loom_status gpt2_offload_alloc(loom_gpt2 *m, const loom_gpt2_acts *max_slot) {
    gpt2_offload_free(m);
    if (!m->training || !m->offload_activations || m->chunk_blocks <= R) return LOOM_OK;
    gpt2_offload *o = loom_xcalloc(1, sizeof *o);
    m->offload = o;
    o->stride = stride_of(max_slot);
    o->host = loom_xcalloc((size_t)m->slots, sizeof(char *));
    o->resident = loom_xmalloc((size_t)m->slots * R * sizeof(int));
    o->ticket = loom_xcalloc((size_t)m->slots * R, sizeof(uint64_t));
    for (int i = 0; i < m->slots * R; i++) o->resident[i] = -1;
    size_t bytes = (size_t)m->chunk_blocks * o->stride;
    for (int s = 0; s < m->slots; s++)
        if (!(o->host[s] = m->be->host_alloc(m->be, bytes)))
            return loom_fail(LOOM_ENOMEM, "lower --batch or --seq, or drop --offload activations",
                             "cannot allocate %zu bytes of host memory for the offloaded activations of %d slots", bytes,
                             m->slots);
    return LOOM_OK;
}

void gpt2_offload_free(loom_gpt2 *m) {
    gpt2_offload *o = m->offload;
    if (!o) return;
    for (int s = 0; s < m->slots; s++) m->be->host_free(m->be, o->host[s]);
    free(o->host);
    free(o->resident);
    free(o->ticket);
    free(o);
    m->offload = NULL;
}

size_t gpt2_offload_bytes(const loom_gpt2 *m) {
    return m->offload ? (size_t)m->slots * (size_t)m->chunk_blocks * m->offload->stride : 0;
}

// Block i's saved tensors between resident copy i mod R and host memory, on the side stream.
static void move(loom_gpt2 *m, const gpt2_views *v, int i, bool to_host) {
    gpt2_offload *o = m->offload;
    const loom_tensor *t[16];
    int n = saved_tensors(&v->a, t);
    char *host = o->host[v->slot] + (size_t)i * o->stride;
    uint64_t ticket = 0;
    for (int k = 0; k < n; k++) {
        size_t bytes = block_bytes(t[k]);
        char *dev = (char *)t[k]->data + (size_t)(i % R) * bytes;
        ticket = to_host ? m->be->copy_async(m->be, host, dev, bytes, true)
                         : m->be->copy_async(m->be, dev, host, bytes, false);
        host += bytes;
    }
    o->resident[v->slot * R + i % R] = i;
    o->ticket[v->slot * R + i % R] = ticket;
}

void gpt2_offload_before_forward(loom_gpt2 *m, const gpt2_views *v, int i) {
    if (m->offload) m->be->copy_wait(m->be, m->offload->ticket[v->slot * R + i % R]);
}

void gpt2_offload_after_forward(loom_gpt2 *m, const gpt2_views *v, int i) {
    if (m->offload) move(m, v, i, true);
}

// Block j resident (copied back when another block holds its copy).
static void ensure(loom_gpt2 *m, const gpt2_views *v, int j) {
    if (j < 0 || j >= v->nblocks || m->offload->resident[v->slot * R + j % R] == j) return;
    move(m, v, j, false);
}

void gpt2_offload_before_backward(loom_gpt2 *m, const gpt2_views *v, int i) {
    if (!m->offload) return;
    for (int j = i; j >= i - 1; j--) {
        ensure(m, v, j);
        if (j >= 0 && j < v->nblocks) m->be->copy_wait(m->be, m->offload->ticket[v->slot * R + j % R]);
    }
    ensure(m, v, i - 2); // prefetch
}
