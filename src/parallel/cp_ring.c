// Ring attention over the zigzag layout (context_parallel.h; Liu et al. 2023; the load-balanced
// causal form of Megatron-LM's and torchtitan's context parallelism). On rank r of P, with its
// blocks h = 0, 1 holding chunks c(r, 0) = r and c(r, 1) = 2P-1-r of every sequence:
//
//   forward, step k = 0..P-1: the keys/values of rank s = r - k (mod P), kv (2,B,Tc,2C), are here
//     (step 0: r's own, packed from qkv); the transfer of the next (send to r+1, receive from r-1)
//     is started first, so it runs under this step's attention; then for each of r's query blocks
//     i and s's key blocks j with c(s, j) <= c(r, i) (later chunks are wholly masked: skipped),
//     attention at positions (c(r, i) Tc, c(s, j) Tc), merged by lse into block i's result:
//       step 0:  (r, r) diagonal, (2P-1-r, r) full, (2P-1-r, 2P-1-r) diagonal
//       s < r:   (r, s) full, (2P-1-r, s) full
//       s > r:   (2P-1-r, s) full, (2P-1-r, 2P-1-s) full
//     so every rank does the same work at every step.
//   backward, step k: the same keys/values travel again (the next transfer under this step's
//     work); the pairs' dq add into dqkv, their dk/dv into a local buffer; the dk/dv of block s
//     accumulated by the ranks before arrives from r-1 (sent at the end of their step k-1, so that
//     transfer ran under this step's work), this rank's share is added, and the sum goes on to
//     r+1. After P steps each rank has received its own blocks' complete dk/dv.
// Sends and receives of one exchange are posted in an order by rank parity (even: send first), so
// that blocking transports (NCCL without a group) cannot wait in a cycle.
#include "parallel/cp_internal.h"

enum { TAG_KV = 41, TAG_DKV = 42 };

typedef struct { // the shapes of one call
    int64_t B, Tc, C;
} ring_dims;

// Block h (B,Tc,W) of a (2,B,Tc,W) tensor of dtype dt
static loom_tensor block(const void *base, int h, ring_dims d, int64_t W, loom_dtype dt) {
    return LOOM_VIEW((char *)base + (size_t)(h * d.B * d.Tc * W) * loom_dtype_size(dt), dt, d.B, d.Tc, W);
}
// Block h (B,NH,Tc) of an lse, whose (B,NH,2Tc) fp32 storage this module uses as (2,B,NH,Tc)
static loom_tensor lse_block(const void *base, int h, ring_dims d, int NH) {
    return LOOM_VIEW((float *)base + h * d.B * NH * d.Tc, LOOM_F32, d.B, NH, d.Tc);
}

static ring_dims dims_of(const loom_cp *cp, loom_tensor qkv) {
    LOOM_CHECK(qkv.ndim == 3 && qkv.shape[1] % 2 == 0 && qkv.shape[2] == 3 * cp->C);
    ring_dims d = {qkv.shape[0], qkv.shape[1] / 2, cp->C};
    LOOM_CHECK(d.B <= cp->B && d.Tc == cp->Tc);
    return d;
}

// Sends send to r+1 and receives recv from r-1 (n elements of be->dtype), asynchronously.
static void exchange(loom_cp *cp, const void *send, void *recv, size_t n, int tag, loom_comm_req **reqs) {
    int next = (cp->rank + 1) % cp->size, prev = (cp->rank + cp->size - 1) % cp->size;
    loom_dtype dt = cp->be->dtype;
    reqs[0] = reqs[1] = NULL;
    for (int i = 0; i < 2; i++) {
        bool sending = (i == 0) == (cp->rank % 2 == 0);
        loom_status s = sending ? loom_send(cp->comm, send, n, dt, next, tag, &reqs[i])
                                : loom_recv(cp->comm, recv, n, dt, prev, tag, &reqs[i]);
        if (s != LOOM_OK) reqs[i] = NULL;
        cp_keep(cp, s);
    }
}

static void finish(loom_cp *cp, loom_comm_req **reqs) {
    for (int i = 0; i < 2; i++)
        if (reqs[i]) cp_keep(cp, loom_comm_wait(reqs[i]));
    reqs[0] = reqs[1] = NULL;
}

// Lets transfers in flight progress between two pieces of compute (MPI moves data inside its calls).
static void progress(loom_cp *cp, loom_comm_req **reqs, int n) {
    bool done;
    for (int i = 0; i < n; i++)
        if (reqs[i]) cp_keep(cp, loom_comm_test(reqs[i], &done));
}

// kv (2,B,Tc,2C) = the keys and values of qkv (2,B,Tc,3C)
static void pack_kv(loom_cp *cp, void *kv, loom_tensor qkv, ring_dims d) {
    size_t es = cp->es;
    cp->be->copy_2d(cp->be, kv, (size_t)(2 * d.C) * es, cp_at(cp, qkv.data, d.C), (size_t)(3 * d.C) * es,
                    (size_t)(2 * d.C) * es, (size_t)(2 * d.B * d.Tc));
}

// Whether rank r's query block i sees anything of rank s's key block j, and where the two sit.
static bool visible(const loom_cp *cp, int s, int i, int j, ring_dims d, loom_attn_span *span) {
    int qc = cp_chunk(cp, cp->rank, i), kc = cp_chunk(cp, s, j);
    *span = (loom_attn_span){(int64_t)qc * d.Tc, (int64_t)kc * d.Tc, true, true};
    return kc <= qc;
}

void cp_ring_forward(void *ctx, loom_tensor out, loom_tensor lse, loom_tensor qkv, int NH) {
    loom_cp *cp = ctx;
    loom_backend *be = cp->be;
    ring_dims d = dims_of(cp, qkv);
    loom_dtype dt = be->dtype;
    size_t n = (size_t)(2 * d.B * d.Tc * 2 * d.C);
    loom_comm_req *reqs[2] = {NULL, NULL};
    bool have[2] = {false, false};
    loom_tensor po = LOOM_VIEW(cp->part_out, dt, d.B, d.Tc, d.C), pl = LOOM_VIEW(cp->part_lse, LOOM_F32, d.B, NH, d.Tc);
    pack_kv(cp, cp->kv[0], qkv, d);
    for (int k = 0; k < cp->size; k++) {
        int s = (cp->rank - k + cp->size) % cp->size;
        void *kv = cp->kv[k % 2];
        if (k + 1 < cp->size) exchange(cp, kv, cp->kv[(k + 1) % 2], n, TAG_KV, reqs);
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 2; j++) {
                loom_attn_span span;
                if (!visible(cp, s, i, j, d, &span)) continue; // wholly in the future
                loom_tensor o = block(out.data, i, d, d.C, dt), l = lse_block(lse.data, i, d, NH);
                be->attention_forward(be, have[i] ? po : o, have[i] ? pl : l, block(qkv.data, i, d, 3 * d.C, dt),
                                      block(kv, j, d, 2 * d.C, dt), NH, span);
                if (have[i]) be->attention_merge(be, o, l, po, pl, NH);
                have[i] = true;
                progress(cp, reqs, 2);
            }
        finish(cp, reqs);
    }
}

void cp_ring_backward(void *ctx, loom_tensor dqkv, loom_tensor dout, loom_tensor qkv, loom_tensor out, loom_tensor lse,
                      int NH) {
    loom_cp *cp = ctx;
    loom_backend *be = cp->be;
    ring_dims d = dims_of(cp, qkv);
    loom_dtype dt = be->dtype;
    size_t n = (size_t)(2 * d.B * d.Tc * 2 * d.C), bytes = n * cp->es;
    loom_comm_req *reqs[4] = {NULL, NULL, NULL, NULL}; // keys/values, their gradients
    void *dsend = cp->dkv[0], *drecv = cp->dkv[1], *dmine = cp->dkv[2];
    be->zero(be, dqkv.data, loom_nbytes(&dqkv)); // dq adds into it; dk, dv are copied in at the end
    pack_kv(cp, cp->kv[0], qkv, d);
    for (int k = 0; k < cp->size; k++) {
        int s = (cp->rank - k + cp->size) % cp->size;
        void *kv = cp->kv[k % 2], *acc = k == 0 ? dsend : dmine;
        if (k + 1 < cp->size) exchange(cp, kv, cp->kv[(k + 1) % 2], n, TAG_KV, reqs);
        be->zero(be, acc, bytes);
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 2; j++) {
                loom_attn_span span;
                if (!visible(cp, s, i, j, d, &span)) continue;
                be->attention_backward(be, block(dqkv.data, i, d, 3 * d.C, dt), block(acc, j, d, 2 * d.C, dt),
                                       (loom_tensor){0}, block(dout.data, i, d, d.C, dt), block(qkv.data, i, d, 3 * d.C, dt),
                                       block(kv, j, d, 2 * d.C, dt), block(out.data, i, d, d.C, dt),
                                       lse_block(lse.data, i, d, NH), NH, span);
                progress(cp, reqs, 4);
            }
        if (k > 0) { // block s's gradients from the ranks before, plus this rank's share
            finish(cp, reqs + 2);
            loom_tensor sum = LOOM_VIEW(drecv, dt, (int64_t)n);
            be->residual_forward(be, sum, sum, LOOM_VIEW(dmine, dt, (int64_t)n));
            void *t = dsend;
            dsend = drecv, drecv = t;
        }
        exchange(cp, dsend, drecv, n, TAG_DKV, reqs + 2);
        finish(cp, reqs);
    }
    finish(cp, reqs + 2); // this rank's own blocks' dk, dv, complete
    be->copy_2d(be, cp_at(cp, dqkv.data, d.C), (size_t)(3 * d.C) * cp->es, drecv, (size_t)(2 * d.C) * cp->es,
                (size_t)(2 * d.C) * cp->es, (size_t)(2 * d.B * d.Tc));
}
