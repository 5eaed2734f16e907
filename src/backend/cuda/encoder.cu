// Token + position embedding (GPT-2's wte and wpe), as llm.c's encoder_forward/backward, over
// one range of the vocabulary: wte holds rows [vocab_start, vocab_start + Vl) (backend.h).
//   forward:  out[b,t,:] = wte[tok - vocab_start,:] + wpe[t,:] for a token of this shard, else 0
//   backward: dwte[v,:] += sum of dout[b,t,:] over (b,t) with tokens[b,t] = vocab_start + v;
//             dwpe[t,:] += sum_b dout[b,t,:] (over every token)
// The dwte scatter is deterministic without atomics, as llm.c does it: the tokens come to the
// host, a counting sort groups the positions of this shard's tokens by token (positions in
// order within a group), and one block per distinct token sums its group's rows in that order.
// This costs one wait for the stream per call (the token download). dwpe sums over b in order
// per (t, c).
// A negative token (which the data loader rules out) yields NaN rows in the forward and aborts
// the backward, rather than reading out of bounds; a token past this shard's range is another
// shard's.
#include "backend/cuda/cuda_ops.h"

#include <math.h>
#include <string.h>

#define ENC_THREADS 256


__global__ void encoder_forward_kernel(void *out, const int32_t *tokens, const void *wte,
                                       const void *wpe, int64_t BT, int T, int C, int vocab_start,
                                       int Vl, bool bf) {
    GRID_STRIDE(i, BT * C) {
        int64_t bt = i / C;
        int c = (int)(i % C), t = (int)(bt % T), tok = tokens[bt], v = cuda_shard_index(tok, vocab_start, Vl);
        float x = v >= 0 ? ldx(wte, (int64_t)v * C + c, bf) + ldx(wpe, (int64_t)t * C + c, bf)
                         : tok < 0 ? NAN : 0.0f;
        stx(out, i, x, bf);
    }
}

// block u: dwte[uniq[u], :] += sum over k in [offsets[u], offsets[u+1]) of dout[pos[k], :]
__global__ void encoder_backward_wte_kernel(void *dwte, const void *dout, const int32_t *pos,
                                            const int32_t *offsets, const int32_t *uniq, int C,
                                            bool bf) {
    int u = blockIdx.x, k0 = offsets[u], k1 = offsets[u + 1];
    int64_t row = (int64_t)uniq[u] * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float s = 0.0f;
        for (int k = k0; k < k1; k++) s += ldx(dout, (int64_t)pos[k] * C + c, bf);
        stx(dwte, row + c, ldx(dwte, row + c, bf) + s, bf);
    }
}

// dwpe[t, c] += sum over b in order of dout[b, t, c]
__global__ void encoder_backward_wpe_kernel(void *dwpe, const void *dout, int B, int T, int C,
                                            bool bf) {
    GRID_STRIDE(i, (int64_t)T * C) {
        float s = 0.0f;
        for (int b = 0; b < B; b++) s += ldx(dout, (int64_t)b * T * C + i, bf);
        stx(dwpe, i, ldx(dwpe, i, bf) + s, bf);
    }
}

extern "C" void cuda_encoder_forward(loom_backend *be, loom_tensor out, loom_tensor tokens,
                                     loom_tensor wte, loom_tensor wpe, int vocab_start) {
    bool bf = cuda_act(be, wte);
    LOOM_CHECK(tokens.ndim == 2 && cuda_act(be, out) == bf && cuda_act(be, wpe) == bf && vocab_start >= 0);
    int64_t B = tokens.shape[0], T = tokens.shape[1], C = loom_cols(&wte);
    LOOM_CHECK(loom_numel(&out) == B * T * C && loom_cols(&wpe) == C && T <= loom_rows(&wpe));
    if (B * T * C == 0) return;
    encoder_forward_kernel<<<cuda_blocks(B * T * C, ENC_THREADS), ENC_THREADS, 0,
                             cuda_of(be)->stream>>>(out.data, cuda_i32(tokens), wte.data, wpe.data,
                                                    B * T, (int)T, (int)C, vocab_start,
                                                    (int)loom_rows(&wte), bf);
    CUDA_LAUNCH_CHECK();
}

// Groups the positions [0, n) of this shard's tokens by token (counting sort, stable): pos (np)
// those positions ordered by token, uniq (nu) the distinct tokens' rows in the shard in
// increasing order, offsets (nu+1) where each group starts in pos (offsets[nu] = np). idx
// (room for 3n+1) is laid out as [pos (np) | offsets (nu+1) | uniq (nu)]; returns nu, sets *np.
static int group_by_token(int32_t *idx, int *np, const int32_t *tok, int n, int vocab_start, int Vl) {
    int32_t *count = (int32_t *)loom_xcalloc((size_t)Vl + 1, sizeof(int32_t));
    for (int i = 0; i < n; i++) {
        LOOM_CHECK(tok[i] >= 0);
        int v = cuda_shard_index(tok[i], vocab_start, Vl);
        if (v >= 0) count[v + 1]++;
    }
    int nu = 0;
    for (int v = 0; v < Vl; v++) nu += count[v + 1] > 0;
    for (int v = 0; v < Vl; v++) count[v + 1] += count[v]; // count[v]: where row v's group starts
    int total = count[Vl];
    int32_t *offsets = idx + total, *uniq = offsets + nu + 1;
    for (int v = 0, u = 0; v < Vl; v++)
        if (count[v + 1] > count[v]) {
            offsets[u] = count[v];
            uniq[u++] = v;
        }
    offsets[nu] = total;
    for (int i = 0; i < n; i++) {
        int v = cuda_shard_index(tok[i], vocab_start, Vl);
        if (v >= 0) idx[count[v]++] = i;
    }
    free(count);
    *np = total;
    return nu;
}

extern "C" void cuda_encoder_backward(loom_backend *be, loom_tensor dwte, loom_tensor dwpe,
                                      loom_tensor dout, loom_tensor tokens, int vocab_start) {
    loom_cuda *cu = cuda_of(be);
    bool bf = cuda_act(be, dwte);
    LOOM_CHECK(tokens.ndim == 2 && cuda_act(be, dwpe) == bf && cuda_act(be, dout) == bf && vocab_start >= 0);
    int64_t B = tokens.shape[0], T = tokens.shape[1], C = loom_cols(&dwte), Vl = loom_rows(&dwte);
    LOOM_CHECK(loom_numel(&dout) == B * T * C && loom_cols(&dwpe) == C && T <= loom_rows(&dwpe));
    int n = (int)(B * T), np;
    if (!n || !C) return;
    int32_t *tok = (int32_t *)loom_xmalloc((size_t)n * sizeof(int32_t));
    int32_t *idx = (int32_t *)loom_xmalloc((size_t)(3 * n + 1) * sizeof(int32_t));
    be->download(be, tok, tokens.data, (size_t)n * sizeof(int32_t));
    int nu = group_by_token(idx, &np, tok, n, vocab_start, (int)Vl);
    if (nu > 0) { // else no token of this shard: dwte is unchanged
        size_t bytes = (size_t)(np + 2 * nu + 1) * sizeof(int32_t);
        int32_t *didx = (int32_t *)cuda_scratch(cu, bytes);
        be->upload(be, didx, idx, bytes);
        encoder_backward_wte_kernel<<<(unsigned)nu, ENC_THREADS, 0, cu->stream>>>(
            dwte.data, dout.data, didx, didx + np, didx + np + nu + 1, (int)C, bf);
        CUDA_LAUNCH_CHECK();
    }
    free(tok);
    free(idx);
    encoder_backward_wpe_kernel<<<cuda_blocks(T * C, ENC_THREADS), ENC_THREADS, 0, cu->stream>>>(
        dwpe.data, dout.data, (int)B, (int)T, (int)C, bf);
    CUDA_LAUNCH_CHECK();
}
